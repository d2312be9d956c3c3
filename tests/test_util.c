/* The small utilities in common/ that both sides share: invariants, byte
 * order, the intrusive list, the `why` formatter, the clock, splitmix64,
 * log escaping, rate limiting and hex. */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "byteorder.h"
#include "clock.h"
#include "error.h"
#include "escape.h"
#include "hex.h"
#include "list.h"
#include "mem_budget.h"
#include "ratelimit.h"
#include "rng.h"
#include "why.h"
#include "runner.h"

/* A broken invariant ends the process at once, saying where and which
 * (release builds too: this test runs in one): a budget handed back
 * more than it counted. */
START_TEST(broken_invariant_aborts_saying_which)
{
  int fds[2], status;
  char out[512] = "";
  ssize_t n;
  pid_t pid;

  ck_assert_int_eq(pipe(fds), 0);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    gs_mem_budget_t b;

    dup2(fds[1], 2);
    gs_mem_budget_init(&b, 1024);
    gs_mem_budget_hold(&b, 10, 0);
    gs_mem_budget_hold(&b, 0, 11);
    _exit(0); /* not reached */
  }
  close(fds[1]);
  n = read(fds[0], out, sizeof(out) - 1);
  close(fds[0]);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d", status);
  ck_assert_int_gt(n, 0);
  ck_assert_msg(strstr(out, "gradsync: invariant broken at ") && strstr(out, "mem_budget.c:") &&
                    strstr(out, "(gs_mem_budget_hold): sub <= b->used + add"),
                "%s", out);
}
END_TEST

START_TEST(byte_order_is_stated_not_the_hosts)
{
  uint8_t b[8];

  gs_store_be32(b, 0x01020304u);
  ck_assert(memcmp(b, "\x01\x02\x03\x04", 4) == 0);
  ck_assert_uint_eq(gs_load_be32(b), 0x01020304u);
  gs_store_be16(b, 0xA1B2);
  ck_assert(memcmp(b, "\xA1\xB2", 2) == 0);
  ck_assert_uint_eq(gs_load_be16(b), 0xA1B2);
  gs_store_be64(b, 0x0102030405060708ull);
  ck_assert(memcmp(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8) == 0);
  ck_assert(gs_load_be64(b) == 0x0102030405060708ull);
  gs_store_le32(b, 0x01020304u);
  ck_assert(memcmp(b, "\x04\x03\x02\x01", 4) == 0);
  ck_assert_uint_eq(gs_load_le32(b), 0x01020304u);
  gs_store_le64(b, 0x0102030405060708ull);
  ck_assert(memcmp(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8) == 0);
  ck_assert(gs_load_le64(b) == 0x0102030405060708ull);
  /* High bits survive: no sign extension through int promotion. */
  gs_store_be32(b, 0xFFFFFFFEu);
  ck_assert_uint_eq(gs_load_be32(b), 0xFFFFFFFEu);
}
END_TEST

typedef struct item {
  int value;
  gs_list_t node;
} item_t;

START_TEST(list_insert_remove_in_order)
{
  gs_list_t head;
  item_t it[3] = {{1, {NULL, NULL}}, {2, {NULL, NULL}}, {3, {NULL, NULL}}};
  int seen[3], n = 0;

  gs_list_init(&head);
  ck_assert(gs_list_empty(&head));
  ck_assert_ptr_null(gs_list_first(&head));
  ck_assert(!gs_list_linked(&it[0].node)); /* zeroed: not on a list */
  for (int i = 0; i < 3; i++)
    gs_list_insert_tail(&head, &it[i].node);
  ck_assert(gs_list_linked(&it[1].node));
  gs_list_remove(&it[1].node);
  ck_assert(!gs_list_linked(&it[1].node));
  gs_list_remove(&it[1].node); /* twice is harmless */
  for (gs_list_t *p = head.next; p != &head; p = p->next)
    seen[n++] = GS_CONTAINER_OF(p, item_t, node)->value;
  ck_assert_int_eq(n, 2);
  ck_assert_int_eq(seen[0], 1);
  ck_assert_int_eq(seen[1], 3);
  ck_assert_int_eq(GS_CONTAINER_OF(gs_list_first(&head), item_t, node)->value, 1);
  gs_list_remove(&it[0].node);
  gs_list_remove(&it[2].node);
  ck_assert(gs_list_empty(&head));
}
END_TEST

/* Moving a whole list keeps its order behind what `to` held. */
START_TEST(list_move_all_keeps_order)
{
  gs_list_t from, to;
  item_t it[4] = {{1, {NULL, NULL}}, {2, {NULL, NULL}}, {3, {NULL, NULL}}, {4, {NULL, NULL}}};
  int n = 0;

  gs_list_init(&from);
  gs_list_init(&to);
  gs_list_move_all(&to, &from); /* empty into empty */
  ck_assert(gs_list_empty(&to));
  gs_list_insert_tail(&to, &it[0].node);
  for (int i = 1; i < 4; i++)
    gs_list_insert_tail(&from, &it[i].node);
  gs_list_move_all(&to, &from);
  ck_assert(gs_list_empty(&from));
  for (gs_list_t *p = to.next; p != &to; p = p->next) {
    ck_assert_int_eq(GS_CONTAINER_OF(p, item_t, node)->value, ++n);
    ck_assert_ptr_eq(p->next->prev, p);
  }
  ck_assert_int_eq(n, 4);
  ck_assert_ptr_eq(to.prev, &it[3].node);
}
END_TEST

START_TEST(why_formats_when_asked_and_returns_the_error)
{
  char why[16];

  ck_assert_int_eq(gs_why(GS_EINVAL, why, sizeof(why), "bad %d", 7), GS_EINVAL);
  ck_assert_str_eq(why, "bad 7");
  ck_assert_int_eq(gs_why(GS_ERANGE, NULL, 0, "ignored %s", "x"), GS_ERANGE);
  gs_set_why(why, sizeof(why), "%s", "a reason longer than the buffer");
  ck_assert_uint_eq(strlen(why), sizeof(why) - 1); /* truncated, terminated */
  gs_set_why(why, 0, "untouched");
  ck_assert_uint_eq(strlen(why), sizeof(why) - 1);
}
END_TEST

START_TEST(clock_is_monotonic_and_agrees_with_itself)
{
  uint64_t a = gs_now_ms(), ns = gs_now_ns();
  double f = gs_now_ms_f();
  uint64_t b = gs_now_ms();

  ck_assert(b >= a);
  ck_assert(f >= (double)a - 1.0 && f <= (double)b + 1.0);
  ck_assert(ns / 1000000 >= a - 1 && ns / 1000000 <= b + 1);
}
END_TEST

START_TEST(splitmix64_published_stream)
{
  /* splitmix64 from state 0, as published with the algorithm; the mixer
   * alone maps the first state to the same value. */
  uint64_t s = 0;

  ck_assert(gs_splitmix64(&s) == 0xE220A8397B1DCDAFull);
  ck_assert(s == GS_GOLDEN_GAMMA);
  ck_assert(gs_mix64(GS_GOLDEN_GAMMA) == 0xE220A8397B1DCDAFull);
}
END_TEST

/* Control bytes and backslashes come out as \xNN and \\; output is cut
 * at a whole escape and always terminated. */
START_TEST(escape_makes_one_printable_line)
{
  char out[64];

  ck_assert_str_eq(gs_escape("a\nb\r\x01\x7f\\c", out, sizeof(out)), "a\\x0ab\\x0d\\x01\\x7f\\\\c");
  ck_assert_str_eq(gs_escape("h\xc3\xa9", out, sizeof(out)), "h\xc3\xa9");
  ck_assert_str_eq(gs_escape("ab\ncd", out, 5), "ab");
  ck_assert_str_eq(gs_escape("abcdef", out, 4), "abc");
  ck_assert_str_eq(gs_escape("", out, sizeof(out)), "");
}
END_TEST

/* A burst passes, the rest of the window is held back and counted, and
 * the first line of the next window carries the count. */
START_TEST(ratelimit_passes_a_burst_then_counts)
{
  gs_ratelimit_t rl = {0};
  uint32_t held = 99, passed = 0;

  for (int i = 0; i < 100; i++)
    passed += gs_ratelimit_allow(&rl, 1000 + i, &held);
  ck_assert_uint_eq(passed, GS_RATELIMIT_BURST);
  ck_assert(!gs_ratelimit_allow(&rl, 1000 + GS_RATELIMIT_WINDOW_MS - 1, &held));
  ck_assert(gs_ratelimit_allow(&rl, 1000 + GS_RATELIMIT_WINDOW_MS, &held));
  ck_assert_uint_eq(held, 100 - GS_RATELIMIT_BURST + 1);
  ck_assert(gs_ratelimit_allow(&rl, 1000 + GS_RATELIMIT_WINDOW_MS + 1, &held));
  ck_assert_uint_eq(held, 0);
}
END_TEST

/* Every byte round-trips; what is not a whole string of hex pairs that
 * fits is refused. */
START_TEST(hex_round_trips_and_refuses_the_malformed)
{
  unsigned char bytes[256], back[256];
  char hex[2 * sizeof(bytes) + 1];
  size_t len = 0;

  for (int i = 0; i < 256; i++)
    bytes[i] = (unsigned char)(255 - i);
  gs_hex_encode(bytes, sizeof(bytes), hex);
  ck_assert_uint_eq(strlen(hex), 512);
  ck_assert(strncmp(hex, "fffefd", 6) == 0);
  ck_assert(gs_hex_decode(hex, back, sizeof(back), &len));
  ck_assert_uint_eq(len, 256);
  ck_assert_int_eq(memcmp(back, bytes, 256), 0);
  ck_assert(gs_hex_decode("0A1b", back, 2, &len) && len == 2 && back[0] == 0x0a && back[1] == 0x1b);
  ck_assert(!gs_hex_decode("", back, 2, &len));
  ck_assert(!gs_hex_decode("abc", back, 2, &len));    /* odd */
  ck_assert(!gs_hex_decode("0g", back, 2, &len));     /* not hex */
  ck_assert(!gs_hex_decode(" 1", back, 2, &len));     /* sscanf would take it */
  ck_assert(!gs_hex_decode("010203", back, 2, &len)); /* too long */
}
END_TEST

static Suite *util_suite(void)
{
  Suite *s = suite_create("util");
  TCase *tc = tcase_create("util");

  tcase_add_test(tc, broken_invariant_aborts_saying_which);
  tcase_add_test(tc, byte_order_is_stated_not_the_hosts);
  tcase_add_test(tc, list_insert_remove_in_order);
  tcase_add_test(tc, list_move_all_keeps_order);
  tcase_add_test(tc, why_formats_when_asked_and_returns_the_error);
  tcase_add_test(tc, clock_is_monotonic_and_agrees_with_itself);
  tcase_add_test(tc, splitmix64_published_stream);
  tcase_add_test(tc, escape_makes_one_printable_line);
  tcase_add_test(tc, ratelimit_passes_a_burst_then_counts);
  tcase_add_test(tc, hex_round_trips_and_refuses_the_malformed);
  suite_add_tcase(s, tc);
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {util_suite}};
