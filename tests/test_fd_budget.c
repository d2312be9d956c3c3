/* How the open-file limit is shared between the two ports and the rest
 * (coordinator/fd_budget.c): the defaults fit every limit, the HTTP port's
 * share is bounded, and caps that were set are kept, and said not to fit
 * when they do not. The real coordinator under more HTTP connections than
 * descriptors is tests/test_limits.py (http_connections). */
#include <check.h>
#include <stdint.h>

#include "fd_budget.h"
#include "runner.h"

START_TEST(defaults_fit_every_limit)
{
  for (uint64_t nofile = 64; nofile <= (1u << 22); nofile += nofile < 4096 ? 1 : nofile / 7) {
    gs_fd_budget_t b = gs__fd_budget(nofile, 0, 0);

    ck_assert_msg(b.fits, "nofile %llu", (unsigned long long)nofile);
    ck_assert_uint_le((uint64_t)b.rpc + b.http + GS_FD_OTHERS, nofile);
    ck_assert_uint_ge(b.http, 1);
    ck_assert_uint_le(b.http, GS_FD_HTTP_MAX);
    ck_assert_uint_le(b.http, nofile / GS_FD_HTTP_SHARE);
    ck_assert_uint_ge(b.rpc, b.http); /* agents get most of them */
    ck_assert_uint_le(b.rpc, GS_FD_CONN_MAX);
  }
}
END_TEST

START_TEST(known_limits)
{
  gs_fd_budget_t b = gs__fd_budget(1024, 0, 0);

  /* The limit of the report: 1,024 descriptors. */
  ck_assert_uint_eq(b.http, 1024 / GS_FD_HTTP_SHARE);
  ck_assert_uint_eq(b.rpc, 1024 - GS_FD_OTHERS - b.http);
  b = gs__fd_budget(256, 0, 0);
  ck_assert_uint_eq(b.http, 32);
  ck_assert_uint_eq(b.rpc, 192);
  /* A large limit: HTTP keeps its 256, RPC is capped. */
  b = gs__fd_budget(1u << 21, 0, 0);
  ck_assert_uint_eq(b.http, GS_FD_HTTP_MAX);
  ck_assert_uint_eq(b.rpc, GS_FD_CONN_MAX);
  ck_assert(b.fits);
  b = gs__fd_budget(UINT64_MAX, 0, 0);
  ck_assert_uint_eq(b.http, GS_FD_HTTP_MAX);
  ck_assert_uint_eq(b.rpc, GS_FD_CONN_MAX);
  ck_assert(b.fits);
}
END_TEST

START_TEST(caps_set_are_kept)
{
  gs_fd_budget_t b = gs__fd_budget(1024, 0, 100);

  /* RPC takes what a smaller or larger HTTP cap leaves. */
  ck_assert_uint_eq(b.http, 100);
  ck_assert_uint_eq(b.rpc, 1024 - GS_FD_OTHERS - 100);
  ck_assert(b.fits);
  b = gs__fd_budget(1024, 500, 0);
  ck_assert_uint_eq(b.rpc, 500);
  ck_assert(b.fits);
  /* Too many for the limit: kept, and said not to fit. */
  b = gs__fd_budget(1024, 1000, 0);
  ck_assert_uint_eq(b.rpc, 1000);
  ck_assert(!b.fits);
  /* An HTTP cap past half the limit leaves RPC half, not nothing. */
  b = gs__fd_budget(1024, 0, 5000);
  ck_assert_uint_eq(b.http, 5000);
  ck_assert_uint_eq(b.rpc, (1024 - GS_FD_OTHERS) / 2);
  ck_assert(!b.fits);
}
END_TEST

START_TEST(tiny_limits_still_give_each_port_one)
{
  for (uint64_t nofile = 0; nofile < 64; nofile++) {
    gs_fd_budget_t b = gs__fd_budget(nofile, 0, 0);

    ck_assert_uint_ge(b.http, 1);
    ck_assert_uint_ge(b.rpc, 1);
    ck_assert(!b.fits || b.rpc + b.http + GS_FD_OTHERS <= nofile);
  }
}
END_TEST

static Suite *fd_budget_suite(void)
{
  const gs_test_case_t cases[] = {
      {"defaults_fit", defaults_fit_every_limit},
      {"known_limits", known_limits},
      {"caps_set", caps_set_are_kept},
      {"tiny_limits", tiny_limits_still_give_each_port_one},
  };

  return GS_TEST_SUITE_OF("fd_budget", cases, 0, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {fd_budget_suite}};
