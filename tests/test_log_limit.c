/* Lines about clients, limited per address and kind (coordinator/log_limit.c),
 * with an injected clock: what passes, what is counted, and that every line
 * held back is counted in exactly one summary. The real coordinator under
 * the same floods is tests/test_limits.py (log_flood_*). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log_limit.h"
#include "runner.h"

#define T0 1000000u
#define W GS_LOG_LIMIT_WINDOW_MS

struct fixture {
  char *text;
  size_t len;
  FILE *out;
  gs_log_t log;
  gs_log_limit_t *ll;
};

static void fixture_init(struct fixture *f, gs_log_level_t level)
{
  memset(f, 0, sizeof(*f));
  f->out = open_memstream(&f->text, &f->len);
  ck_assert_ptr_nonnull(f->out);
  f->log = (gs_log_t){.level = level, .out = f->out, .component = "test"};
  f->ll = malloc(sizeof(*f->ll));
  ck_assert_ptr_nonnull(f->ll);
  gs__log_limit_init(f->ll, &f->log);
}

static void fixture_free(struct fixture *f)
{
  fclose(f->out);
  free(f->text);
  free(f->ll);
}

/* What was written so far (gs_log flushes every line). */
static const char *text_of(struct fixture *f)
{
  fflush(f->out);
  return f->text ? f->text : "";
}

static unsigned count_of(const char *hay, const char *needle)
{
  unsigned n = 0;

  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* The lines that summaries say were suppressed: the sum of N over every
 * "N more ... suppressed". */
static unsigned long long suppressed_in(const char *text)
{
  unsigned long long sum = 0;

  for (const char *p = strstr(text, " more "); p; p = strstr(p + 1, " more ")) {
    const char *start = p;
    unsigned long long n;

    while (start > text && start[-1] != ' ')
      start--;
    ck_assert_int_eq(sscanf(start, "%llu", &n), 1);
    sum += n;
  }
  return sum;
}

/* One address, one kind, many lines on many connections (ports): a burst,
 * then nothing until the window ends, when one summary gives the count. */
START_TEST(burst_then_one_summary_when_the_window_ends)
{
  struct fixture f;
  char peer[32];

  fixture_init(&f, GS_LOG_INFO);
  for (unsigned i = 0; i < 3000; i++) {
    snprintf(peer, sizeof(peer), "127.0.0.1:%u", 10000 + i % 50000);
    gs__log_limit_line(f.ll, T0 + i, peer, GS_LOG_KIND_HTTP_TOKEN, "POST /x with a wrong token");
  }
  ck_assert_uint_eq(count_of(text_of(&f), "with a wrong token"), GS_LOG_LIMIT_BURST);
  ck_assert_ptr_nonnull(strstr(text_of(&f), "WARN test [-] http: 127.0.0.1:10000: POST /x"));
  gs__log_limit_sweep(f.ll, T0 + W - 1);
  ck_assert_uint_eq(count_of(text_of(&f), "suppressed"), 0);
  gs__log_limit_sweep(f.ll, T0 + W);
  ck_assert_ptr_nonnull(strstr(text_of(&f), "WARN test [-] http: 127.0.0.1: 2995 more 'refused "
                                            "token' lines suppressed in the last 10 s"));
  /* The next window starts with the next line. */
  gs__log_limit_line(f.ll, T0 + W + 1, "127.0.0.1:9", GS_LOG_KIND_HTTP_TOKEN, "with a wrong token");
  ck_assert_uint_eq(count_of(text_of(&f), "with a wrong token"), GS_LOG_LIMIT_BURST + 1);
  gs__log_limit_close(f.ll, T0 + W + 2);
  ck_assert_uint_eq(count_of(text_of(&f), "suppressed"), 1);
  fixture_free(&f);
}
END_TEST

/* Without a sweep, the summary comes before the next line allowed. */
START_TEST(summary_before_the_next_line_without_a_sweep)
{
  struct fixture f;
  const char *summary;

  fixture_init(&f, GS_LOG_INFO);
  for (unsigned i = 0; i < 8; i++)
    gs__log_limit_line(f.ll, T0, "[::1]:5", GS_LOG_KIND_RPC_FRAME, "bad %u", i);
  gs__log_limit_line(f.ll, T0 + W, "[::1]:6", GS_LOG_KIND_RPC_FRAME, "bad again");
  summary = strstr(text_of(&f), "rpc: [::1]: 3 more 'bad frame' lines suppressed");
  ck_assert_ptr_nonnull(summary);
  ck_assert_ptr_nonnull(strstr(summary, "rpc: [::1]:6: bad again"));
  fixture_free(&f);
}
END_TEST

/* Kinds and addresses are limited apart; a port is not an address. */
START_TEST(each_address_and_kind_has_its_own_burst)
{
  struct fixture f;
  const char *peers[] = {"10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1", NULL, "?"};

  fixture_init(&f, GS_LOG_INFO);
  for (unsigned i = 0; i < 20; i++) {
    for (size_t p = 0; p < sizeof(peers) / sizeof(peers[0]); p++) {
      gs__log_limit_line(f.ll, T0, peers[p], GS_LOG_KIND_RPC_TOKEN, "token");
      gs__log_limit_line(f.ll, T0, peers[p], GS_LOG_KIND_RPC_CALL, "call");
    }
  }
  /* 10.0.0.1 (two ports), 10.0.0.2, and "?" (NULL reads as "?"). */
  ck_assert_uint_eq(count_of(text_of(&f), ": token"), 3 * GS_LOG_LIMIT_BURST);
  ck_assert_uint_eq(count_of(text_of(&f), ": call"), 3 * GS_LOG_LIMIT_BURST);
  gs__log_limit_sweep(f.ll, T0 + W);
  ck_assert_ptr_nonnull(strstr(text_of(&f), "rpc: 10.0.0.1: 35 more 'refused token' lines"));
  ck_assert_ptr_nonnull(strstr(text_of(&f), "rpc: 10.0.0.1: 35 more 'bad call' lines"));
  ck_assert_ptr_nonnull(strstr(text_of(&f), "rpc: 10.0.0.2: 15 more 'refused token' lines"));
  ck_assert_ptr_nonnull(strstr(text_of(&f), "rpc: ?: 35 more 'bad call' lines"));
  fixture_free(&f);
}
END_TEST

/* A few addresses over their burst, then more addresses than slots: the
 * limit for all clients holds the lines to GS_LOG_LIMIT_ALL per window
 * (summaries included), the first addresses' slots are taken over (their
 * counts go to a summary first), and every line is written or counted in
 * exactly one summary. */
START_TEST(many_addresses_meet_the_limit_for_all)
{
  const unsigned addresses = 4 * GS_LOG_LIMIT_SLOTS, rounds = GS_LOG_LIMIT_BURST + 2;
  struct fixture f;
  char peer[32];

  fixture_init(&f, GS_LOG_INFO);
  for (unsigned a = 0; a < 8; a++) {
    snprintf(peer, sizeof(peer), "10.255.0.%u:80", a);
    for (unsigned i = 0; i < 20; i++)
      gs__log_limit_line(f.ll, T0, peer, GS_LOG_KIND_RPC_TOKEN, "with a wrong token");
  }
  for (unsigned r = 0; r < rounds; r++) {
    for (unsigned a = 0; a < addresses; a++) {
      snprintf(peer, sizeof(peer), "10.%u.%u.1:80", a / 256, a % 256);
      gs__log_limit_line(f.ll, T0 + r, peer, GS_LOG_KIND_RPC_TOKEN, "with a wrong token");
    }
  }
  ck_assert_uint_eq(count_of(text_of(&f), "\n"), GS_LOG_LIMIT_ALL);
  gs__log_limit_sweep(f.ll, T0 + W + rounds);
  gs__log_limit_close(f.ll, T0 + W + rounds);
  ck_assert_uint_eq(count_of(text_of(&f), "lines about clients suppressed"), 1);
  ck_assert_uint_eq(count_of(text_of(&f), "with a wrong token") + suppressed_in(text_of(&f)),
                    8 * 20 + addresses * rounds);
  fixture_free(&f);
}
END_TEST

/* Lines the log level hides take no share of any limit. */
START_TEST(hidden_lines_take_no_share)
{
  struct fixture f;
  char peer[32];

  fixture_init(&f, GS_LOG_WARN);
  for (unsigned a = 0; a < 1000; a++) {
    snprintf(peer, sizeof(peer), "10.1.%u.%u:80", a / 256, a % 256);
    gs__log_limit_line(f.ll, T0, peer, GS_LOG_KIND_RPC_IDLE, "idle");
  }
  for (unsigned a = 0; a < GS_LOG_LIMIT_ALL; a++) {
    snprintf(peer, sizeof(peer), "10.2.0.%u:80", a);
    gs__log_limit_line(f.ll, T0, peer, GS_LOG_KIND_RPC_TOKEN, "token");
  }
  gs__log_limit_close(f.ll, T0 + W);
  ck_assert_uint_eq(count_of(text_of(&f), "\n"), GS_LOG_LIMIT_ALL);
  ck_assert_uint_eq(count_of(text_of(&f), "idle"), 0);
  fixture_free(&f);
}
END_TEST

static Suite *log_limit_suite(void)
{
  const gs_test_case_t cases[] = {
      {"burst", burst_then_one_summary_when_the_window_ends},
      {"no_sweep", summary_before_the_next_line_without_a_sweep},
      {"apart", each_address_and_kind_has_its_own_burst},
      {"all_clients", many_addresses_meet_the_limit_for_all},
      {"hidden", hidden_lines_take_no_share},
  };

  return GS_TEST_SUITE_OF("log_limit", cases, 0, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {log_limit_suite}};
