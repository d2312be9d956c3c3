/* Tests for common/parse.c. Every input is copied so that its NUL is the
 * last byte before an unreadable page (as picohttpparser's tests do), so a
 * parser that reads past the end of its string crashes the test. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "parse.h"
#include "runner.h"

/* A string placed right before a PROT_NONE page; release with guard_free. */
struct guard {
  char *base;
  size_t len;
  char *str;
};

static const char *guard_str(struct guard *g, const char *s)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = strlen(s) + 1;

  ck_assert_uint_lt(n, page);
  g->len = 2 * page;
  g->base = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(g->base, MAP_FAILED);
  ck_assert_int_eq(mprotect(g->base + page, page, PROT_NONE), 0);
  g->str = g->base + page - n;
  memcpy(g->str, s, n);
  return g->str;
}

static void guard_free(struct guard *g)
{
  munmap(g->base, g->len);
}

static int size_of(const char *s, uint64_t *out)
{
  struct guard g;
  int err = gs_parse_size(guard_str(&g, s), out);

  guard_free(&g);
  return err;
}

static int duration_of(const char *s, uint64_t *out)
{
  struct guard g;
  int err = gs_parse_duration_ms(guard_str(&g, s), out);

  guard_free(&g);
  return err;
}

static int addr_of(const char *s, char *host, size_t host_len, uint16_t *port)
{
  struct guard g;
  int err = gs_parse_addr(guard_str(&g, s), host, host_len, port);

  guard_free(&g);
  return err;
}

static int long_of(const char *s, long min, long max, long *out)
{
  struct guard g;
  int err = gs_parse_long(guard_str(&g, s), min, max, out);

  guard_free(&g);
  return err;
}

struct u64_case {
  const char *in;
  int err;
  uint64_t want;
};

#define SENTINEL 0x5a5a5a5a5a5a5a5aULL

/* Runs a table through a uint64 parser; on failure the output must be
 * left as it was. */
static void run_u64_cases(int (*parse)(const char *, uint64_t *), const struct u64_case *c,
                          size_t n)
{
  size_t i;

  for (i = 0; i < n; i++) {
    uint64_t v = SENTINEL;
    int err = parse(c[i].in, &v);

    ck_assert_msg(err == c[i].err, "\"%s\": got %s, want %s", c[i].in, gs_err_name(err),
                  gs_err_name(c[i].err));
    if (c[i].err == 0)
      ck_assert_msg(v == c[i].want, "\"%s\": got %llu, want %llu", c[i].in, (unsigned long long)v,
                    (unsigned long long)c[i].want);
    else
      ck_assert_msg(v == SENTINEL, "\"%s\": output written on error", c[i].in);
  }
}

#define RUN_U64(parse, cases) run_u64_cases(parse, cases, sizeof(cases) / sizeof(cases[0]))

START_TEST(size_suffixes)
{
  static const struct u64_case cases[] = {
      {"0", 0, 0},
      {"4096", 0, 4096},
      {"4096B", 0, 4096},
      {"007", 0, 7},
      {"2kB", 0, 2000},
      {"2KB", 0, 2000},
      {"10MB", 0, 10000000},
      {"3GB", 0, 3000000000ULL},
      {"64KiB", 0, 65536},
      {"10MiB", 0, 10485760},
      {"1GiB", 0, 1073741824},
      {"0GiB", 0, 0},
  };

  RUN_U64(size_of, cases);
}
END_TEST

START_TEST(size_overflow)
{
  static const struct u64_case cases[] = {
      {"18446744073709551615", 0, UINT64_MAX},
      {"18446744073709551615B", 0, UINT64_MAX},
      {"18446744073709551616", GS_ERANGE, 0},
      {"99999999999999999999999999999999", GS_ERANGE, 0},
      {"17179869183GiB", 0, 17179869183ULL << 30},
      {"17179869184GiB", GS_ERANGE, 0},
      {"18446744073709551kB", 0, 18446744073709551000ULL},
      {"18446744073709552kB", GS_ERANGE, 0},
      {"18446744073709551616MiB", GS_ERANGE, 0},
  };

  RUN_U64(size_of, cases);
}
END_TEST

START_TEST(size_junk)
{
  static const struct u64_case cases[] = {
      {"", GS_EINVAL, 0},       {"B", GS_EINVAL, 0},      {"MiB", GS_EINVAL, 0},
      {"-1", GS_EINVAL, 0},     {"+1", GS_EINVAL, 0},     {" 1", GS_EINVAL, 0},
      {"1 ", GS_EINVAL, 0},     {"10 MiB", GS_EINVAL, 0}, {"10mib", GS_EINVAL, 0},
      {"10MiBx", GS_EINVAL, 0}, {"10MiB ", GS_EINVAL, 0}, {"1.5MiB", GS_EINVAL, 0},
      {"0x10", GS_EINVAL, 0},   {"10TiB", GS_EINVAL, 0},  {"10Mi", GS_EINVAL, 0},
      {"10BB", GS_EINVAL, 0},   {"1e3", GS_EINVAL, 0},    {"99999999999999999999x", GS_EINVAL, 0},
  };

  RUN_U64(size_of, cases);
}
END_TEST

START_TEST(duration_units)
{
  static const struct u64_case cases[] = {
      {"250ms", 0, 250},
      {"0ms", 0, 0},
      {"5s", 0, 5000},
      {"0s", 0, 0},
      {"2m", 0, 120000},
      {"1h", 0, 3600000},
      {"1.5s", 0, 1500},
      {"0.25s", 0, 250},
      {"0.001s", 0, 1},
      {"1.5m", 0, 90000},
      {"0.5h", 0, 1800000},
      {"1.0ms", 0, 1},
      {"1.500000000000000000000s", 0, 1500},
  };

  RUN_U64(duration_of, cases);
}
END_TEST

START_TEST(duration_junk)
{
  static const struct u64_case cases[] = {
      {"10", GS_EINVAL, 0},
      {"", GS_EINVAL, 0},
      {"s", GS_EINVAL, 0},
      {"ms", GS_EINVAL, 0},
      {"5 s", GS_EINVAL, 0},
      {"5S", GS_EINVAL, 0},
      {"5sec", GS_EINVAL, 0},
      {"5s ", GS_EINVAL, 0},
      {" 5s", GS_EINVAL, 0},
      {"-5s", GS_EINVAL, 0},
      {"+5s", GS_EINVAL, 0},
      {".5s", GS_EINVAL, 0},
      {"5.s", GS_EINVAL, 0},
      {"1.2.3s", GS_EINVAL, 0},
      {"1.5ms", GS_EINVAL, 0},
      {"0.0001s", GS_EINVAL, 0},
      {"1d", GS_EINVAL, 0},
      {"5us", GS_EINVAL, 0},
      {"1.0000000001s", GS_EINVAL, 0},
      {"0.0000001h", GS_EINVAL, 0},
      {"99999999999999999999x", GS_EINVAL, 0},
  };

  RUN_U64(duration_of, cases);
}
END_TEST

START_TEST(duration_overflow)
{
  static const struct u64_case cases[] = {
      {"18446744073709551615ms", 0, UINT64_MAX},
      {"18446744073709551616ms", GS_ERANGE, 0},
      {"18446744073709551s", 0, 18446744073709551000ULL},
      {"18446744073709552s", GS_ERANGE, 0},
      {"18446744073709551.615s", 0, UINT64_MAX},
      {"18446744073709551.616s", GS_ERANGE, 0},
      {"5124095576030431h", GS_ERANGE, 0},
      {"99999999999999999999999.5s", GS_ERANGE, 0},
  };

  RUN_U64(duration_of, cases);
}
END_TEST

struct addr_case {
  const char *in;
  int err;
  const char *host;
  uint16_t port;
};

static void run_addr_cases(const struct addr_case *c, size_t n)
{
  size_t i;

  for (i = 0; i < n; i++) {
    char host[64] = "untouched";
    uint16_t port = 4242;
    int err = addr_of(c[i].in, host, sizeof(host), &port);

    ck_assert_msg(err == c[i].err, "\"%s\": got %s, want %s", c[i].in, gs_err_name(err),
                  gs_err_name(c[i].err));
    if (c[i].err == 0) {
      ck_assert_str_eq(host, c[i].host);
      ck_assert_uint_eq(port, c[i].port);
    } else {
      ck_assert_str_eq(host, "untouched");
      ck_assert_uint_eq(port, 4242);
    }
  }
}

#define RUN_ADDR(cases) run_addr_cases(cases, sizeof(cases) / sizeof(cases[0]))

START_TEST(addr_host_port)
{
  static const struct addr_case cases[] = {
      {"localhost:8080", 0, "localhost", 8080},
      {"10.0.0.1:0", 0, "10.0.0.1", 0},
      {"example.com:65535", 0, "example.com", 65535},
      {"h:00080", 0, "h", 80},
  };

  RUN_ADDR(cases);
}
END_TEST

START_TEST(addr_any_host)
{
  static const struct addr_case cases[] = {
      {":9000", 0, "0.0.0.0", 9000},
      {":0", 0, "0.0.0.0", 0},
  };

  RUN_ADDR(cases);
}
END_TEST

START_TEST(addr_ipv6)
{
  static const struct addr_case cases[] = {
      {"[::1]:80", 0, "::1", 80},
      {"[::]:0", 0, "::", 0},
      {"[fe80::1%eth0]:65535", 0, "fe80::1%eth0", 65535},
      {"[2001:db8::7]:443", 0, "2001:db8::7", 443},
  };

  RUN_ADDR(cases);
}
END_TEST

START_TEST(addr_errors)
{
  static const struct addr_case cases[] = {
      {"", GS_EINVAL, NULL, 0},           {"localhost", GS_EINVAL, NULL, 0},
      {"localhost:", GS_EINVAL, NULL, 0}, {":", GS_EINVAL, NULL, 0},
      {"host:65536", GS_ERANGE, NULL, 0}, {"host:99999999999999999999999", GS_ERANGE, NULL, 0},
      {"host:-1", GS_EINVAL, NULL, 0},    {"host:+1", GS_EINVAL, NULL, 0},
      {"host: 80", GS_EINVAL, NULL, 0},   {"host:80 ", GS_EINVAL, NULL, 0},
      {"host:80x", GS_EINVAL, NULL, 0},   {"host:80:90", GS_EINVAL, NULL, 0},
      {"::1:80", GS_EINVAL, NULL, 0},     {"::1", GS_EINVAL, NULL, 0},
      {"[::1]", GS_EINVAL, NULL, 0},      {"[::1]:", GS_EINVAL, NULL, 0},
      {"[::1]80", GS_EINVAL, NULL, 0},    {"[::1:80", GS_EINVAL, NULL, 0},
      {"[", GS_EINVAL, NULL, 0},          {"[]:80", GS_EINVAL, NULL, 0},
      {"a]b:80", GS_EINVAL, NULL, 0},     {"a[b:80", GS_EINVAL, NULL, 0},
  };

  RUN_ADDR(cases);
}
END_TEST

START_TEST(addr_host_len)
{
  char host[16];
  uint16_t port = 7;

  memset(host, 'z', sizeof(host));
  ck_assert_int_eq(addr_of("abc:1", host, 4, &port), 0);
  ck_assert_str_eq(host, "abc");
  ck_assert_uint_eq(port, 1);
  ck_assert_int_eq(addr_of("abcd:2", host, 4, &port), GS_EINVAL);
  ck_assert_str_eq(host, "abc");
  ck_assert_uint_eq(port, 1);
  ck_assert_int_eq(addr_of(":3", host, 7, &port), GS_EINVAL);
  ck_assert_int_eq(addr_of(":3", host, 8, &port), 0);
  ck_assert_str_eq(host, "0.0.0.0");
  ck_assert_int_eq(addr_of("[::1]:4", host, 3, &port), GS_EINVAL);
  ck_assert_int_eq(addr_of("[::1]:4", host, 4, &port), 0);
  ck_assert_str_eq(host, "::1");
  ck_assert_int_eq(addr_of("a:5", host, 0, &port), GS_EINVAL);
}
END_TEST

struct long_case {
  const char *in;
  long min, max;
  int err;
  long want;
};

START_TEST(long_values)
{
  char max_s[32], min_s[32];
  const struct long_case cases[] = {
      {"0", 0, 10, 0, 0},
      {"42", 0, 100, 0, 42},
      {"-42", -100, 100, 0, -42},
      {"-0", 0, 0, 0, 0},
      {"10", 0, 10, 0, 10},
      {"-5", -5, 5, 0, -5},
      {max_s, LONG_MIN, LONG_MAX, 0, LONG_MAX},
      {min_s, LONG_MIN, LONG_MAX, 0, LONG_MIN},
  };
  size_t i;

  snprintf(max_s, sizeof(max_s), "%ld", LONG_MAX);
  snprintf(min_s, sizeof(min_s), "%ld", LONG_MIN);
  for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    long v = 12345;

    ck_assert_msg(long_of(cases[i].in, cases[i].min, cases[i].max, &v) == 0, "\"%s\"", cases[i].in);
    ck_assert_int_eq(v, cases[i].want);
  }
}
END_TEST

START_TEST(long_errors)
{
  static const struct long_case cases[] = {
      {"11", 0, 10, GS_ERANGE, 0},
      {"-1", 0, 10, GS_ERANGE, 0},
      {"-6", -5, 5, GS_ERANGE, 0},
      {"9223372036854775808", LONG_MIN, LONG_MAX, GS_ERANGE, 0},
      {"-9223372036854775809", LONG_MIN, LONG_MAX, GS_ERANGE, 0},
      {"18446744073709551616", LONG_MIN, LONG_MAX, GS_ERANGE, 0},
      {"-99999999999999999999999", LONG_MIN, LONG_MAX, GS_ERANGE, 0},
      {"", 0, 10, GS_EINVAL, 0},
      {"-", -10, 10, GS_EINVAL, 0},
      {"--1", -10, 10, GS_EINVAL, 0},
      {"+1", 0, 10, GS_EINVAL, 0},
      {" 1", 0, 10, GS_EINVAL, 0},
      {"1 ", 0, 10, GS_EINVAL, 0},
      {"0x1", 0, 10, GS_EINVAL, 0},
      {"1e1", 0, 100, GS_EINVAL, 0},
      {"1.0", 0, 10, GS_EINVAL, 0},
      {"99999999999999999999x", LONG_MIN, LONG_MAX, GS_EINVAL, 0},
  };
  size_t i;

  for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    long v = 12345;
    int err = long_of(cases[i].in, cases[i].min, cases[i].max, &v);

    ck_assert_msg(err == cases[i].err, "\"%s\": got %s, want %s", cases[i].in, gs_err_name(err),
                  gs_err_name(cases[i].err));
    ck_assert_int_eq(v, 12345);
  }
}
END_TEST

START_TEST(port_ranges)
{
  static const struct {
    const char *in;
    int err;
    uint16_t first, last;
  } cases[] = {
      {"29500", 0, 29500, 29500}, {"29500-29510", 0, 29500, 29510},
      {"1-65535", 0, 1, 65535},   {"0", GS_ERANGE, 0, 0},
      {"65536", GS_ERANGE, 0, 0}, {"10-9", GS_ERANGE, 0, 0},
      {"", GS_EINVAL, 0, 0},      {"-5", GS_EINVAL, 0, 0},
      {"5-", GS_EINVAL, 0, 0},    {"5-6-7", GS_EINVAL, 0, 0},
      {"a-b", GS_EINVAL, 0, 0},   {"123456789-2", GS_EINVAL, 0, 0},
  };

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint16_t first = 7, last = 7;
    int err = gs_parse_port_range(cases[i].in, &first, &last);

    ck_assert_msg(err == cases[i].err, "\"%s\": got %s, want %s", cases[i].in, gs_err_name(err),
                  gs_err_name(cases[i].err));
    ck_assert_uint_eq(first, err ? 7 : cases[i].first);
    ck_assert_uint_eq(last, err ? 7 : cases[i].last);
  }
}
END_TEST

START_TEST(loopback_addresses)
{
  static const char *const yes[] = {"127.0.0.1:9000",       "127.1.2.3",      "[::1]:80", "::1",
                                    "[::ffff:127.0.0.1]:5", "localhost:7070", "LOCALHOST"};
  static const char *const no[] = {"10.0.0.2:9000", "[fe80::1]:80", "2001:db8::1",
                                   "128.0.0.1:1",   "node-a:9000",  "",
                                   "[::1",          "127.example:5"};

  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
    ck_assert_msg(gs_addr_is_loopback(yes[i]), "%s", yes[i]);
  for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
    ck_assert_msg(!gs_addr_is_loopback(no[i]), "%s", no[i]);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *parse_suite(void)
{
  Suite *s = suite_create("parse");

  suite_add_tcase(s, tcase("size_suffixes", size_suffixes));
  suite_add_tcase(s, tcase("size_overflow", size_overflow));
  suite_add_tcase(s, tcase("size_junk", size_junk));
  suite_add_tcase(s, tcase("duration_units", duration_units));
  suite_add_tcase(s, tcase("duration_junk", duration_junk));
  suite_add_tcase(s, tcase("duration_overflow", duration_overflow));
  suite_add_tcase(s, tcase("addr_host_port", addr_host_port));
  suite_add_tcase(s, tcase("addr_any_host", addr_any_host));
  suite_add_tcase(s, tcase("addr_ipv6", addr_ipv6));
  suite_add_tcase(s, tcase("addr_errors", addr_errors));
  suite_add_tcase(s, tcase("addr_host_len", addr_host_len));
  suite_add_tcase(s, tcase("long_values", long_values));
  suite_add_tcase(s, tcase("long_errors", long_errors));
  suite_add_tcase(s, tcase("port_ranges", port_ranges));
  suite_add_tcase(s, tcase("loopback_addresses", loopback_addresses));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {parse_suite}};
