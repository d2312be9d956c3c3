/* Tests for agent/engine/control.c: the control vector's encoding is a pure
 * function, so each behaviour is checked by encoding ranks' contributions,
 * summing them as the allreduce would, and decoding. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "error.h"
#include "lr_scale.h"
#include "runner.h"

#define MAX_LEN 64

/* Sums the vectors of `world` ranks (what the allreduce hands back). */
static void sum_ranks(const gs_control_local_t *in, uint32_t world, float *sum, size_t n)
{
  float v[MAX_LEN];

  memset(sum, 0, n * sizeof(float));
  for (uint32_t r = 0; r < world; r++) {
    gs_control_encode(&in[r], v, n);
    for (size_t i = 0; i < n; i++)
      sum[i] += v[i];
  }
}

START_TEST(length)
{
  ck_assert_uint_eq(gs_control_len(1), GS_CTL_FIXED + 1);
  ck_assert_uint_eq(gs_control_len(16), GS_CTL_FIXED + 1);
  ck_assert_uint_eq(gs_control_len(17), GS_CTL_FIXED + 2);
  ck_assert_uint_eq(gs_control_len(65536), GS_CTL_FIXED + 4096);
}
END_TEST

/* A rank with nothing to say writes zeros everywhere, which decode to
 * "nothing happened". */
START_TEST(quiet_step)
{
  gs_control_local_t in = {.rank = 3};
  float v[MAX_LEN];
  size_t n = gs_control_len(8);
  gs_control_t c;

  memset(v, 0xff, sizeof(v));
  gs_control_encode(&in, v, n);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(v[i] == 0.0f, "slot %zu is %g", i, v[i]);
  ck_assert_msg(isnan(v[n]), "slot %zu past the end was written", n);
  gs_control_decode(v, n, &c);
  ck_assert(!c.stop && !c.term && !c.period_changed && !c.broadcast && !c.checkpoint &&
            !c.nonfinite && !c.lr_scale_changed);
}
END_TEST

/* Rank 0's requests come through the sum unchanged, whatever the world size. */
START_TEST(rank0_requests)
{
  gs_control_local_t in[5] = {{.rank = 0,
                               .stop = true,
                               .set_period = true,
                               .period = 7,
                               .broadcast = true,
                               .checkpoint = true},
                              {.rank = 1},
                              {.rank = 2},
                              {.rank = 3},
                              {.rank = 4}};
  float sum[MAX_LEN];
  size_t n = gs_control_len(5);
  gs_control_t c;

  sum_ranks(in, 5, sum, n);
  gs_control_decode(sum, n, &c);
  ck_assert(c.stop && c.broadcast && c.checkpoint && c.period_changed);
  ck_assert_int_eq(c.period, 7);
  ck_assert(!c.term && !c.nonfinite);
}
END_TEST

/* Periods -1 (never) and 0 (once) survive the +2 offset; one outside the
 * exact float range is not sent at all. */
START_TEST(period_range)
{
  const int32_t ok[] = {-1, 0, 1, GS_CTL_PERIOD_MAX - 1};
  gs_control_local_t in = {.rank = 0, .set_period = true};
  float v[MAX_LEN];
  size_t n = gs_control_len(1);
  gs_control_t c;

  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    in.period = ok[i];
    gs_control_encode(&in, v, n);
    gs_control_decode(v, n, &c);
    ck_assert(c.period_changed);
    ck_assert_int_eq(c.period, ok[i]);
  }
  in.period = GS_CTL_PERIOD_MAX;
  gs_control_encode(&in, v, n);
  gs_control_decode(v, n, &c);
  ck_assert(!c.period_changed);
  in.period = -2;
  gs_control_encode(&in, v, n);
  gs_control_decode(v, n, &c);
  ck_assert(!c.period_changed);
  in.set_period = false;
  in.period = 5;
  gs_control_encode(&in, v, n);
  gs_control_decode(v, n, &c);
  ck_assert(!c.period_changed);
}
END_TEST

/* Rank 0's new lr scale is summed with the others' zeros bit for bit,
 * at any world size; one outside (0, GS_LR_SCALE_MAX] is not sent. */
START_TEST(lr_scale_exact)
{
  const float ok[] = {0.1f, 1.0f / 3.0f, 1.0f, 7.25f, (float)GS_LR_SCALE_MAX, 1e-30f};
  const float bad[] = {0.0f, -1.0f, (float)GS_LR_SCALE_MAX * 2, INFINITY, NAN};
  gs_control_local_t in[40] = {{0}};
  float sum[MAX_LEN];
  size_t n = gs_control_len(40);
  gs_control_t c;

  for (uint32_t r = 0; r < 40; r++)
    in[r].rank = r;
  in[0].set_lr_scale = true;
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    in[0].lr_scale = ok[i];
    sum_ranks(in, 40, sum, n);
    gs_control_decode(sum, n, &c);
    ck_assert_msg(c.lr_scale_changed, "%g", ok[i]);
    ck_assert_msg(c.lr_scale == ok[i], "%g came out as %g", ok[i], c.lr_scale);
    ck_assert(!c.period_changed && !c.stop);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    in[0].lr_scale = bad[i];
    sum_ranks(in, 40, sum, n);
    gs_control_decode(sum, n, &c);
    ck_assert_msg(!c.lr_scale_changed, "%g was sent", bad[i]);
  }
  in[0].set_lr_scale = false;
  in[0].lr_scale = 2.0f;
  sum_ranks(in, 40, sum, n);
  gs_control_decode(sum, n, &c);
  ck_assert(!c.lr_scale_changed);
}
END_TEST

/* SIGTERM on any one rank reaches every rank. */
START_TEST(term_any_rank)
{
  gs_control_local_t in[4] = {{.rank = 0}, {.rank = 1}, {.rank = 2, .term = true}, {.rank = 3}};
  float sum[MAX_LEN];
  size_t n = gs_control_len(4);
  gs_control_t c;

  sum_ranks(in, 4, sum, n);
  gs_control_decode(sum, n, &c);
  ck_assert(c.term && !c.stop);
}
END_TEST

/* Each rank's non-finite bit is exact in the sum, across several slots. */
START_TEST(nonfinite_bits)
{
  enum { WORLD = 40 };
  gs_control_local_t in[WORLD];
  float sum[MAX_LEN];
  size_t n = gs_control_len(WORLD);
  gs_control_t c;

  for (uint32_t r = 0; r < WORLD; r++)
    in[r] = (gs_control_local_t){.rank = r, .nonfinite = r % 3 == 1 || r == 15 || r == 39};
  sum_ranks(in, WORLD, sum, n);
  gs_control_decode(sum, n, &c);
  ck_assert(c.nonfinite);
  for (uint32_t r = 0; r < WORLD; r++)
    ck_assert_msg(gs_control_rank_nonfinite(sum, n, r) == in[r].nonfinite, "rank %u", r);
  ck_assert(!gs_control_rank_nonfinite(sum, n, 1000)); /* past the vector */
}
END_TEST

/* A vector too short for the fixed slots decodes as nothing and is never
 * written past its end. */
START_TEST(short_vector)
{
  gs_control_local_t in = {.rank = 0, .stop = true, .nonfinite = true};
  float v[4] = {NAN, NAN, NAN, NAN};
  gs_control_t c;

  gs_control_encode(&in, v, 2);
  ck_assert(v[0] == 0.0f && v[1] == 0.0f && isnan(v[2]));
  v[0] = 1.0f;
  gs_control_decode(v, 2, &c);
  ck_assert(!c.stop);
}
END_TEST

/* Ranks that agree on their step and collective counts pass the check,
 * however large the counts. */
START_TEST(in_step_ranks_pass)
{
  gs_control_local_t in[5];
  float sum[MAX_LEN];
  size_t n = gs_control_len(5);
  char why[256] = "";

  for (uint32_t r = 0; r < 5; r++)
    in[r] = (gs_control_local_t){.rank = r, .step = 1000003, .collectives = 777777};
  sum_ranks(in, 5, sum, n);
  for (uint32_t r = 0; r < 5; r++)
    ck_assert_msg(gs_control_check(sum, n, &in[r], 5, why, sizeof(why)) == 0, "rank %u: %s", r,
                  why);
}
END_TEST

/* One rank a step ahead: every rank whose count differs from the mean
 * sees it, and the error names the problem. */
START_TEST(step_mismatch_is_named)
{
  gs_control_local_t in[4];
  float sum[MAX_LEN];
  size_t n = gs_control_len(4);
  char why[256] = "";

  for (uint32_t r = 0; r < 4; r++)
    in[r] = (gs_control_local_t){.rank = r, .step = 41, .collectives = 90};
  in[2].step = 42;
  sum_ranks(in, 4, sum, n);
  for (uint32_t r = 0; r < 4; r++) {
    ck_assert_int_eq(gs_control_check(sum, n, &in[r], 4, why, sizeof(why)), GS_EPROTO);
    ck_assert_msg(strstr(why, "not at the same step"), "%s", why);
  }
}
END_TEST

/* One rank ran an extra collective (a metric allreduce the others skipped). */
START_TEST(collective_count_mismatch_is_named)
{
  gs_control_local_t in[3];
  float sum[MAX_LEN];
  size_t n = gs_control_len(3);
  char why[256] = "";

  for (uint32_t r = 0; r < 3; r++)
    in[r] = (gs_control_local_t){.rank = r, .step = 7, .collectives = 14};
  in[0].collectives = 15;
  sum_ranks(in, 3, sum, n);
  ck_assert_int_eq(gs_control_check(sum, n, &in[1], 3, why, sizeof(why)), GS_EPROTO);
  ck_assert_msg(strstr(why, "different numbers of collectives"), "%s", why);
  /* A check slot summed with gradients instead of counts fails too. */
  sum_ranks(in, 3, sum, n);
  sum[GS_CTL_STEP] = NAN;
  ck_assert_int_eq(gs_control_check(sum, n, &in[1], 3, why, sizeof(why)), GS_EPROTO);
}
END_TEST

/* At the largest world the sums are still exact in float32, in whatever
 * order they are added: equal counts pass and a count one off fails. */
START_TEST(check_exact_at_max_world)
{
  const uint32_t world = GS_CTL_CHECK_MAX_WORLD;
  gs_control_local_t mine = {.step = GS_CTL_SEQ_MOD - 1, .collectives = 2 * GS_CTL_SEQ_MOD - 1};
  gs_control_local_t off = mine;
  size_t n = GS_CTL_FIXED;
  float v[GS_CTL_FIXED + 1], w[GS_CTL_FIXED + 1], fwd[GS_CTL_FIXED], back[GS_CTL_FIXED];
  char why[256] = "";

  off.step--;
  gs_control_encode(&mine, v, n);
  gs_control_encode(&off, w, n);
  memset(fwd, 0, sizeof(fwd));
  memset(back, 0, sizeof(back));
  for (uint32_t r = 0; r < world; r++)
    for (size_t i = 0; i < n; i++) {
      fwd[i] += v[i];
      back[i] += r == 0 ? w[i] : v[i]; /* rank 0 one step behind */
    }
  ck_assert_msg(gs_control_check(fwd, n, &mine, world, why, sizeof(why)) == 0, "%s", why);
  ck_assert_int_eq(gs_control_check(back, n, &mine, world, why, sizeof(why)), GS_EPROTO);
  /* Past the exact range the check gives up rather than cry wolf. */
  ck_assert_int_eq(gs_control_check(back, n, &mine, world + 1, why, sizeof(why)), 0);
}
END_TEST

static Suite *control_suite(void)
{
  const gs_test_case_t cases[] = {
      {"length", length},
      {"quiet_step", quiet_step},
      {"rank0_requests", rank0_requests},
      {"period_range", period_range},
      {"lr_scale_exact", lr_scale_exact},
      {"term_any_rank", term_any_rank},
      {"nonfinite_bits", nonfinite_bits},
      {"short_vector", short_vector},
      {"in_step_ranks_pass", in_step_ranks_pass},
      {"step_mismatch_is_named", step_mismatch_is_named},
      {"collective_count_mismatch_is_named", collective_count_mismatch_is_named},
      {"check_exact_at_max_world", check_exact_at_max_world},
  };

  return GS_TEST_SUITE_OF("control", cases, 0, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {control_suite}};
