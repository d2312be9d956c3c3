/* Tests for SGD (agent/device/optim.c's SGD loops, sgd.c's settings):
 * three update steps against values worked out by hand (exact rational
 * arithmetic, written here as literals), for plain momentum, Nesterov, no
 * momentum, a bias segment in a group with its own lr and decay, and a
 * gradient scale; the learning-rate schedules; and the configuration
 * checks. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "sgd.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

/* One pack: four weight elements (lr_mult 1, decay 0.1) then two bias
 * elements (lr_mult 2, decay 0), with three steps of gradients. */
static const float p0[6] = {1.0f, -2.0f, 0.5f, 0.0f, 0.25f, -1.0f};
static const float grads[3][6] = {
    {0.5f, 1.0f, -1.0f, 0.25f, 1.0f, -0.5f},
    {0.5f, -0.5f, 0.0f, 0.25f, 0.5f, 0.5f},
    {0.5f, 0.25f, 2.0f, -1.0f, -1.0f, 0.0f},
};
static const gs_optim_segment_t segs[] = {{0, 4, 0}, {4, 2, 1}};

/* Step `t` (1-based) of SGD over a pack: group 0 at lr 0.5 with decay 0.1,
 * group 1 (the biases) at lr 1 without decay. `buf` may be NULL without
 * momentum. */
static void sgd_step(float momentum, bool nesterov, float grad_scale, uint64_t t,
                     const gs_optim_segment_t *s, uint32_t nseg, float *p, const float *g,
                     float *buf)
{
  const gs_optim_group_t groups[2] = {
      {.lr = 0.5f, .weight_decay = 0.1f, .momentum = momentum, .nesterov = nesterov},
      {.lr = 1.0f, .weight_decay = 0.0f, .momentum = momentum, .nesterov = nesterov},
  };
  const gs_optim_step_t st = {
      .kind = GS_OPTIM_SGD, .groups = groups, .ngroups = 2, .t = t, .grad_scale = grad_scale};
  float *const state[GS_OPTIM_MAX_STATE] = {buf, NULL, NULL};

  gs_optim_step_pack(&st, s, nseg, p, g, state);
}

/* Runs three steps and compares the params after each with want[step]. */
static void run_steps(float momentum, bool nesterov, float grad_scale, const double want[3][6])
{
  float p[6], buf[6] = {0};
  uint32_t s, i;

  memcpy(p, p0, sizeof(p));
  for (s = 0; s < 3; s++) {
    sgd_step(momentum, nesterov, grad_scale, s + 1, segs, COUNT(segs), p, grads[s],
             momentum == 0.0f ? NULL : buf);
    for (i = 0; i < 6; i++)
      ck_assert_msg(fabs(p[i] - want[s][i]) <= 1e-5 * fmax(1.0, fabs(want[s][i])),
                    "step %u element %u: %.9g, want %.9g", s + 1, i, p[i], want[s][i]);
  }
}

/* Element 0 by hand (p 1, g 0.5, decay 0.1, lr 0.5, momentum 0.9):
 * d = 0.6, buf = 0.6, p = 0.7; d = 0.57, buf = 1.11, p = 0.145;
 * d = 0.5145, buf = 1.5135, p = -0.61175. Element 4 (bias: lr 1, no
 * decay): buf 1, 1.4, 0.26; p -0.75, -2.15, -2.41. */
START_TEST(momentum_steps)
{
  static const double want[3][6] = {
      {0.7, -2.4, 0.975, -0.125, -0.75, -0.5},
      {0.145, -2.39, 1.35375, -0.35625, -2.15, -0.55},
      {-0.61175, -2.3865, 0.6269375, -0.0465625, -2.41, -0.595},
  };

  run_steps(0.9f, false, 1.0f, want);
}
END_TEST

/* Element 0: d = 0.6, buf = 0.6, step with 0.6 + 0.54 = 1.14: p = 0.43. */
START_TEST(nesterov_steps)
{
  static const double want[3][6] = {
      {0.43, -2.76, 1.4025, -0.2375, -1.65, -0.05},
      {-0.32885, -2.3468, 1.6540125, -0.5536875, -3.41, -0.595},
      {-1.21122425, -2.338674, -0.1136449375, 0.2661565625, -2.644, -0.6355},
  };

  run_steps(0.9f, true, 1.0f, want);
}
END_TEST

/* Element 0: p = 1 - 0.5 * 0.6 = 0.7; 0.7 - 0.5 * 0.57 = 0.415; ... */
START_TEST(plain_steps)
{
  static const double want[3][6] = {
      {0.7, -2.4, 0.975, -0.125, -0.75, -0.5},
      {0.415, -2.03, 0.92625, -0.24375, -1.25, -1.0},
      {0.14425, -2.0535, -0.1200625, 0.2684375, -0.25, -1.0},
  };

  run_steps(0.0f, false, 1.0f, want);
}
END_TEST

/* Gradients halved (the mean of a sum over two ranks); element 0:
 * d = 0.25 + 0.1 = 0.35, p = 1 - 0.175 = 0.825. */
START_TEST(grad_scale_steps)
{
  static const double want[3][6] = {
      {0.825, -2.15, 0.725, -0.0625, -0.25, -0.75},
      {0.50125, -2.0525, 0.89125, -0.178125, -0.95, -0.775},
      {0.0598125, -1.924625, 0.4963125, -0.02328125, -1.08, -0.7975},
  };

  run_steps(0.9f, false, 0.5f, want);
}
END_TEST

/* A long segment at an offset (vector blocks and a scalar tail) next to an
 * empty one: every element follows the hand-computed trajectory of
 * elements 0 (even) or 1 (odd) of the pack above, and the elements outside
 * the segments are untouched. */
static void run_long(float momentum, bool nesterov, float grad_scale, double even, double odd)
{
  enum { N = 1000 + 37, OFF = 3 };
  gs_optim_segment_t s[] = {{OFF, N, 0}, {OFF + N, 0, 1}};
  float *p = malloc((N + 2 * OFF) * sizeof(float)), *g = malloc((N + 2 * OFF) * sizeof(float));
  float *buf = calloc(N + 2 * OFF, sizeof(float));
  uint32_t i, step;

  for (i = 0; i < N + 2 * OFF; i++)
    p[i] = p0[(i + 1) % 2]; /* element OFF gets p0[0] */
  for (step = 0; step < 3; step++) {
    for (i = 0; i < N + 2 * OFF; i++)
      g[i] = grads[step][(i + 1) % 2];
    sgd_step(momentum, nesterov, grad_scale, step + 1, s, COUNT(s), p, g,
             momentum == 0.0f ? NULL : buf);
  }
  for (i = 0; i < N + 2 * OFF; i++) {
    double want = (i + 1) % 2 ? odd : even;

    if (i < OFF || i >= OFF + N)
      want = p0[(i + 1) % 2];
    ck_assert_msg(fabs(p[i] - want) <= 1e-5 * fmax(1.0, fabs(want)), "element %u: %.9g, want %.9g",
                  i, p[i], want);
  }
  free(p);
  free(g);
  free(buf);
}

START_TEST(long_segment)
{
  run_long(0.9f, false, 1.0f, -0.61175, -2.3865);
  run_long(0.9f, true, 1.0f, -1.21122425, -2.338674);
  run_long(0.0f, false, 1.0f, 0.14425, -2.0535);
  run_long(0.9f, false, 0.5f, 0.0598125, -1.924625);
  /* Halved gradients without momentum; element 0: p = 0.825, 0.65875,
   * 0.5008125. Then with Nesterov. */
  run_long(0.0f, false, 0.5f, 0.5008125, -1.884125);
  run_long(0.9f, true, 0.5f, -0.2898808125, -1.800799625);
}
END_TEST

START_TEST(defaults)
{
  gs_sgd_config_t c;
  char why[128] = "";

  memset(&c, 0x5a, sizeof(c));
  gs_sgd_config_default(&c);
  ck_assert_float_eq(c.lr, 0.05f);
  ck_assert_float_eq(c.momentum, 0.9f);
  ck_assert_float_eq(c.weight_decay, 5e-4f);
  ck_assert(!c.nesterov);
  ck_assert_float_eq(c.bias_lr_mult, 1.0f);
  ck_assert_float_eq(c.bias_wd, 5e-4f);
  ck_assert_uint_eq(c.warmup_steps, 0);
  ck_assert_float_eq_tol(c.warmup_factor, 1.0 / 3.0, 1e-7);
  ck_assert_int_eq(c.schedule, GS_LR_CONSTANT);
  ck_assert_float_eq(c.gamma, 0.1f);
  ck_assert_msg(gs_sgd_config_check(&c, why, sizeof(why)) == 0, "%s", why);
}
END_TEST

START_TEST(schedule_names)
{
  static const char *names[] = {"constant", "step", "cosine"};
  gs_lr_schedule_t s;
  uint32_t i;

  for (i = 0; i < COUNT(names); i++) {
    s = (gs_lr_schedule_t)99;
    ck_assert_int_eq(gs_lr_schedule_parse(names[i], &s), 0);
    ck_assert_int_eq(s, (int)i);
    ck_assert_str_eq(gs_lr_schedule_name(s), names[i]);
  }
  s = GS_LR_STEP;
  ck_assert_int_eq(gs_lr_schedule_parse("Cosine", &s), GS_EINVAL);
  ck_assert_int_eq(gs_lr_schedule_parse("", &s), GS_EINVAL);
  ck_assert_int_eq(gs_lr_schedule_parse("linear", &s), GS_EINVAL);
  ck_assert_int_eq(gs_lr_schedule_parse(NULL, &s), GS_EINVAL);
  ck_assert_int_eq(s, GS_LR_STEP);
  ck_assert_str_eq(gs_lr_schedule_name((gs_lr_schedule_t)3), "unknown");
}
END_TEST

/* (step, lr) pairs worked out by hand. */
typedef struct point {
  uint64_t step;
  double lr;
} point_t;

static void expect_lrs(const gs_sgd_config_t *c, const point_t *pts, uint32_t n, const char *what)
{
  uint32_t i;

  for (i = 0; i < n; i++) {
    float lr = gs_sgd_lr(c, pts[i].step);

    ck_assert_msg(fabs(lr - pts[i].lr) <= 1e-6 * fmax(pts[i].lr, 1e-3),
                  "%s: step %llu: %.9g, want %.9g", what, (unsigned long long)pts[i].step, lr,
                  pts[i].lr);
  }
}

START_TEST(schedules)
{
  static const point_t constant[] = {{0, 0.1}, {1, 0.1}, {1000000, 0.1}};
  static const point_t step[] = {{0, 0.1}, {9, 0.1}, {10, 0.01}, {19, 0.01}, {25, 0.001}};
  /* (1 + cos(pi/4)) / 2 = 0.853553..., (1 + cos(3pi/4)) / 2 = 0.146446... */
  static const point_t cosine[] = {{0, 0.1},   {25, 0.08535533905932738},
                                   {50, 0.05}, {75, 0.014644660940672627},
                                   {100, 0.0}, {150, 0.0}};
  /* 0.3 * (1/3 + 2/3 * step / 10) */
  static const point_t warm[] = {{0, 0.1}, {5, 0.2}, {9, 0.28}, {10, 0.3}, {500, 0.3}};
  /* 0.3 * (0.5 + 0.5 * step / 10) * 0.5^floor(step / 4) */
  static const point_t warm_step[] = {{0, 0.15}, {3, 0.195}, {6, 0.12}, {10, 0.075}, {12, 0.0375}};
  /* 1 * (0.25 + 0.75 * 2 / 4) * (1 + cos(pi/4)) / 2 */
  static const point_t warm_cos[] = {{0, 0.25}, {2, 0.5334708691207961}, {4, 0.5}, {8, 0.0}};
  gs_sgd_config_t c;

  gs_sgd_config_default(&c);
  c.lr = 0.1f;
  expect_lrs(&c, constant, COUNT(constant), "constant");
  c.schedule = GS_LR_STEP;
  c.step_size = 10;
  expect_lrs(&c, step, COUNT(step), "step");
  c.schedule = GS_LR_COSINE;
  c.total_steps = 100;
  expect_lrs(&c, cosine, COUNT(cosine), "cosine");

  gs_sgd_config_default(&c);
  c.lr = 0.3f;
  c.warmup_steps = 10;
  expect_lrs(&c, warm, COUNT(warm), "warmup");
  c.warmup_factor = 0.5f;
  c.schedule = GS_LR_STEP;
  c.step_size = 4;
  c.gamma = 0.5f;
  expect_lrs(&c, warm_step, COUNT(warm_step), "warmup + step");

  gs_sgd_config_default(&c);
  c.lr = 1.0f;
  c.warmup_steps = 4;
  c.warmup_factor = 0.25f;
  c.schedule = GS_LR_COSINE;
  c.total_steps = 8;
  expect_lrs(&c, warm_cos, COUNT(warm_cos), "warmup + cosine");
}
END_TEST

/* One bad setting per case, applied to the defaults. */
typedef struct bad {
  const char *want;
  void (*spoil)(gs_sgd_config_t *c);
} bad_t;

static void neg_lr(gs_sgd_config_t *c)
{
  c->lr = -0.1f;
}
static void nan_lr(gs_sgd_config_t *c)
{
  c->lr = NAN;
}
static void inf_lr(gs_sgd_config_t *c)
{
  c->lr = INFINITY;
}
static void neg_momentum(gs_sgd_config_t *c)
{
  c->momentum = -0.5f;
}
static void one_momentum(gs_sgd_config_t *c)
{
  c->momentum = 1.0f;
}
static void nan_momentum(gs_sgd_config_t *c)
{
  c->momentum = NAN;
}
static void neg_wd(gs_sgd_config_t *c)
{
  c->weight_decay = -1e-4f;
}
static void nesterov_no_momentum(gs_sgd_config_t *c)
{
  c->nesterov = true;
  c->momentum = 0.0f;
}
static void neg_bias_mult(gs_sgd_config_t *c)
{
  c->bias_lr_mult = -2.0f;
}
static void nan_bias_wd(gs_sgd_config_t *c)
{
  c->bias_wd = NAN;
}
static void big_warmup_factor(gs_sgd_config_t *c)
{
  c->warmup_steps = 10;
  c->warmup_factor = 1.5f;
}
static void step_no_size(gs_sgd_config_t *c)
{
  c->schedule = GS_LR_STEP;
}
static void step_zero_gamma(gs_sgd_config_t *c)
{
  c->schedule = GS_LR_STEP;
  c->step_size = 100;
  c->gamma = 0.0f;
}
static void step_big_gamma(gs_sgd_config_t *c)
{
  c->schedule = GS_LR_STEP;
  c->step_size = 100;
  c->gamma = 2.0f;
}
static void cosine_no_total(gs_sgd_config_t *c)
{
  c->schedule = GS_LR_COSINE;
}
static void bad_schedule(gs_sgd_config_t *c)
{
  c->schedule = (gs_lr_schedule_t)7;
}

START_TEST(config_rejects)
{
  static const bad_t cases[] = {
      {"--lr must be a finite number >= 0 (got -0.1)", neg_lr},
      {"--lr must be a finite number >= 0 (got nan)", nan_lr},
      {"--lr must be a finite number >= 0 (got inf)", inf_lr},
      {"--momentum must be in [0, 1) (got -0.5)", neg_momentum},
      {"--momentum must be in [0, 1) (got 1)", one_momentum},
      {"--momentum must be in [0, 1)", nan_momentum},
      {"--weight-decay must be a finite number >= 0", neg_wd},
      {"--nesterov needs --momentum > 0", nesterov_no_momentum},
      {"--bias-lr-mult must be a finite number >= 0 (got -2)", neg_bias_mult},
      {"--bias-wd must be a finite number >= 0", nan_bias_wd},
      {"--warmup-factor must be in [0, 1] (got 1.5)", big_warmup_factor},
      {"--schedule step needs --lr-step-size", step_no_size},
      {"--lr-gamma must be in (0, 1] (got 0)", step_zero_gamma},
      {"--lr-gamma must be in (0, 1] (got 2)", step_big_gamma},
      {"--schedule cosine needs the total step count", cosine_no_total},
      {"--schedule: unknown schedule 7", bad_schedule},
  };
  gs_sgd_config_t c;
  char why[256];
  uint32_t i;

  for (i = 0; i < COUNT(cases); i++) {
    gs_sgd_config_default(&c);
    cases[i].spoil(&c);
    why[0] = '\0';
    ck_assert_int_eq(gs_sgd_config_check(&c, why, sizeof(why)), GS_EINVAL);
    ck_assert_msg(strstr(why, cases[i].want), "case %u: why = \"%s\", want \"%s\"", i, why,
                  cases[i].want);
    ck_assert_int_eq(gs_sgd_config_check(&c, NULL, 0), GS_EINVAL);
  }
  /* The edges that are allowed. */
  gs_sgd_config_default(&c);
  c.lr = 0.0f;
  c.momentum = 0.0f;
  c.weight_decay = 0.0f;
  c.bias_wd = 0.0f;
  c.bias_lr_mult = 2.0f;
  c.warmup_factor = 0.0f;
  c.schedule = GS_LR_STEP;
  c.step_size = 1;
  c.gamma = 1.0f;
  ck_assert_msg(gs_sgd_config_check(&c, why, sizeof(why)) == 0, "%s", why);
  c.momentum = 0.99f;
  c.nesterov = true;
  c.schedule = GS_LR_COSINE;
  c.total_steps = 1;
  ck_assert_msg(gs_sgd_config_check(&c, why, sizeof(why)) == 0, "%s", why);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *sgd_suite(void)
{
  Suite *s = suite_create("sgd");

  suite_add_tcase(s, tcase("momentum_steps", momentum_steps));
  suite_add_tcase(s, tcase("nesterov_steps", nesterov_steps));
  suite_add_tcase(s, tcase("plain_steps", plain_steps));
  suite_add_tcase(s, tcase("grad_scale_steps", grad_scale_steps));
  suite_add_tcase(s, tcase("long_segment", long_segment));
  suite_add_tcase(s, tcase("defaults", defaults));
  suite_add_tcase(s, tcase("schedule_names", schedule_names));
  suite_add_tcase(s, tcase("schedules", schedules));
  suite_add_tcase(s, tcase("config_rejects", config_rejects));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {sgd_suite}};
