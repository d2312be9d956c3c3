/* Tests for agent/device/optim.c's Adam and AdamW (SGD has test_sgd.c):
 * every element of a pack, over several steps, against the formulas of
 * torch.optim computed in double here (amsgrad, maximize, weight decay of
 * both kinds, a gradient scale, groups of their own lr); the scan for
 * non-finite gradients; names, defaults and the checks of a group; the
 * gate the update reads on the device, and the device's count of the
 * waits its callers make. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "optim.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define LEN 1037 /* vector blocks and a scalar tail */
#define STEPS 6

/* A deterministic value in [-1, 1). */
static float noise(uint32_t *x)
{
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return (float)((double)(*x % 2000001u) / 1000000.0 - 1.0);
}

/* torch's single-tensor Adam/AdamW on one element, in double. */
static void reference(gs_optim_kind_t kind, const gs_optim_group_t *g, double scale, uint64_t t,
                      double grad, double *p, double *m, double *v, double *vmax)
{
  double gr = grad * scale, denom, vv;

  if (g->maximize)
    gr = -gr;
  if (kind == GS_OPTIM_ADAMW)
    *p *= 1.0 - (double)g->lr * g->weight_decay;
  else
    gr += (double)g->weight_decay * *p;
  *m = *m * g->beta1 + (1.0 - g->beta1) * gr;
  *v = *v * g->beta2 + (1.0 - g->beta2) * gr * gr;
  vv = *v;
  if (g->amsgrad) {
    *vmax = fmax(*vmax, *v);
    vv = *vmax;
  }
  denom = sqrt(vv) / sqrt(1.0 - pow(g->beta2, (double)t)) + g->eps;
  *p -= (double)g->lr / (1.0 - pow(g->beta1, (double)t)) * *m / denom;
}

/* Runs STEPS steps of `kind` over two groups (the second at twice the lr
 * and without decay) and compares every element and state with the
 * reference. */
static void run(gs_optim_kind_t kind, bool amsgrad, bool maximize, float wd, float scale)
{
  static const gs_optim_segment_t segs[] = {{0, 600, 0}, {600, 0, 1}, {600, LEN - 600, 1}};
  gs_optim_group_t groups[2];
  float p[LEN], g[LEN], s0[LEN] = {0}, s1[LEN] = {0}, s2[LEN] = {0};
  double rp[LEN], rm[LEN] = {0}, rv[LEN] = {0}, rx[LEN] = {0};
  float *const state[GS_OPTIM_MAX_STATE] = {s0, s1, amsgrad ? s2 : NULL};
  uint32_t x = 12345;

  for (int k = 0; k < 2; k++) {
    gs_optim_group_default(kind, &groups[k]);
    groups[k].amsgrad = amsgrad;
    groups[k].maximize = maximize;
    groups[k].lr = k ? 2e-3f : 1e-3f;
    groups[k].weight_decay = k ? 0.0f : wd;
  }
  ck_assert_uint_eq(gs_optim_state_count(kind, groups, 2), amsgrad ? 3 : 2);
  for (int i = 0; i < LEN; i++)
    rp[i] = p[i] = noise(&x);
  for (uint64_t t = 1; t <= STEPS; t++) {
    gs_optim_step_t st = {
        .kind = kind, .groups = groups, .ngroups = 2, .t = t, .grad_scale = scale};

    for (int i = 0; i < LEN; i++)
      g[i] = noise(&x) * (t == 3 ? 1e-6f : 1.0f); /* tiny gradients: eps matters */
    gs_optim_step_pack(&st, segs, COUNT(segs), p, g, state);
    for (int i = 0; i < LEN; i++) {
      const gs_optim_group_t *gr = &groups[i < 600 ? 0 : 1];

      reference(kind, gr, scale, t, g[i], &rp[i], &rm[i], &rv[i], &rx[i]);
      ck_assert_msg(fabs(p[i] - rp[i]) <= 1e-6 * fmax(1.0, fabs(rp[i])),
                    "%s step %llu element %d: param %.9g, want %.9g", gs_optim_kind_name(kind),
                    (unsigned long long)t, i, p[i], rp[i]);
      ck_assert_msg(fabs(s0[i] - rm[i]) <= 1e-6 + 1e-5 * fabs(rm[i]),
                    "step %llu element %d: exp_avg %.9g, want %.9g", (unsigned long long)t, i,
                    s0[i], rm[i]);
      ck_assert_msg(fabs(s1[i] - rv[i]) <= 1e-6 + 1e-5 * fabs(rv[i]),
                    "step %llu element %d: exp_avg_sq %.9g, want %.9g", (unsigned long long)t, i,
                    s1[i], rv[i]);
      if (amsgrad)
        ck_assert_msg(fabs(s2[i] - rx[i]) <= 1e-6 + 1e-5 * fabs(rx[i]),
                      "step %llu element %d: max_exp_avg_sq %.9g, want %.9g", (unsigned long long)t,
                      i, s2[i], rx[i]);
    }
  }
}

START_TEST(adam)
{
  run(GS_OPTIM_ADAM, false, false, 0.0f, 1.0f);
  run(GS_OPTIM_ADAM, false, false, 0.1f, 0.5f);
  run(GS_OPTIM_ADAM, true, false, 0.01f, 1.0f);
  run(GS_OPTIM_ADAM, false, true, 0.0f, 0.25f);
}
END_TEST

START_TEST(adamw)
{
  run(GS_OPTIM_ADAMW, false, false, 0.1f, 1.0f);
  run(GS_OPTIM_ADAMW, true, true, 0.01f, 0.5f);
  run(GS_OPTIM_ADAMW, false, false, 0.0f, 1.0f);
}
END_TEST

/* SGD's dampening leaves the first step's buffer alone (torch clones d). */
START_TEST(sgd_dampening)
{
  static const gs_optim_segment_t seg[] = {{0, 1, 0}};
  gs_optim_group_t grp = {.lr = 0.5f, .momentum = 0.9f, .dampening = 0.5f};
  float p = 1.0f, g = 1.0f, buf = 0.0f;
  float *const state[GS_OPTIM_MAX_STATE] = {&buf, NULL, NULL};
  gs_optim_step_t st = {
      .kind = GS_OPTIM_SGD, .groups = &grp, .ngroups = 1, .t = 1, .grad_scale = 1.0f};

  gs_optim_step_pack(&st, seg, 1, &p, &g, state);
  ck_assert_float_eq(buf, 1.0f); /* d itself */
  ck_assert_float_eq(p, 0.5f);
  st.t = 2;
  gs_optim_step_pack(&st, seg, 1, &p, &g, state);
  ck_assert_float_eq_tol(buf, 0.9f * 1.0f + 0.5f * 1.0f, 1e-6f);
  ck_assert_float_eq_tol(p, 0.5f - 0.5f * 1.4f, 1e-6f);
}
END_TEST

/* The first non-finite value is found wherever it lies (in a block's
 * vector part, its tail, a later block), and n when there is none. */
START_TEST(first_nonfinite)
{
  enum { N = 3 * 4096 + 77 };
  static const float bad[] = {NAN, INFINITY, -INFINITY};
  static const size_t where[] = {0, 15, 16, 4095, 4096, 8200, N - 1};
  float *g = malloc(N * sizeof(float));

  for (size_t i = 0; i < N; i++)
    g[i] = (float)i * 1e30f; /* huge but finite */
  ck_assert_uint_eq(gs_optim_first_nonfinite(g, N), N);
  ck_assert_uint_eq(gs_optim_first_nonfinite(g, 0), 0);
  for (uint32_t b = 0; b < COUNT(bad); b++) {
    for (uint32_t w = 0; w < COUNT(where); w++) {
      float keep = g[where[w]];

      g[where[w]] = bad[b];
      ck_assert_uint_eq(gs_optim_first_nonfinite(g, N), where[w]);
      g[N - 1 - (where[w] == N - 1)] = NAN; /* a later one changes nothing */
      ck_assert_uint_eq(gs_optim_first_nonfinite(g, N), where[w] < N - 2 ? where[w] : N - 2);
      g[N - 1 - (where[w] == N - 1)] = 1.0f;
      g[where[w]] = keep;
    }
  }
  free(g);
}
END_TEST

START_TEST(names_and_checks)
{
  gs_optim_kind_t k;
  gs_nonfinite_t nf;
  gs_optim_group_t g;
  char why[200];

  ck_assert_int_eq(gs_optim_kind_parse("adamw", &k), 0);
  ck_assert_int_eq(k, GS_OPTIM_ADAMW);
  ck_assert_str_eq(gs_optim_kind_name(GS_OPTIM_ADAM), "adam");
  ck_assert_int_lt(gs_optim_kind_parse("rmsprop", &k), 0);
  ck_assert_int_eq(gs_nonfinite_parse("skip", &nf), 0);
  ck_assert_int_eq(nf, GS_NONFINITE_SKIP);
  ck_assert_int_lt(gs_nonfinite_parse("", &nf), 0);

  gs_optim_group_default(GS_OPTIM_ADAMW, &g);
  ck_assert_float_eq(g.weight_decay, 1e-2f);
  ck_assert_float_eq(g.beta2, 0.999f);
  ck_assert_int_eq(gs_optim_group_check(GS_OPTIM_ADAMW, &g, why, sizeof(why)), 0);
  g.beta1 = 1.0f;
  ck_assert_int_lt(gs_optim_group_check(GS_OPTIM_ADAMW, &g, why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, "betas[0]") != NULL, "%s", why);
  gs_optim_group_default(GS_OPTIM_SGD, &g);
  g.nesterov = true;
  ck_assert_int_lt(gs_optim_group_check(GS_OPTIM_SGD, &g, why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, "nesterov") != NULL, "%s", why);
  g.momentum = 0.9f;
  ck_assert_int_eq(gs_optim_group_check(GS_OPTIM_SGD, &g, why, sizeof(why)), 0);
  g.lr = -1.0f;
  ck_assert_int_lt(gs_optim_group_check(GS_OPTIM_SGD, &g, why, sizeof(why)), 0);
  g.lr = NAN;
  ck_assert_int_lt(gs_optim_group_check(GS_OPTIM_SGD, &g, why, sizeof(why)), 0);
}
END_TEST

/* The gate, read when the update runs: a set skip or veto flag leaves
 * the pack as it was; a factor multiplies the gradients as grad_scale
 * does. Through the cpu device, as the engine queues it. */
START_TEST(gate)
{
  static const gs_optim_segment_t seg[] = {{0, 4, 0}};
  gs_optim_group_t grp = {.lr = 0.5f};
  float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, zero = 0.0f, one = 1.0f, half = 0.5f;
  float *const state[GS_OPTIM_MAX_STATE] = {NULL, NULL, NULL};
  gs_optim_step_t st = {
      .kind = GS_OPTIM_SGD, .groups = &grp, .ngroups = 1, .t = 1, .grad_scale = 1.0f};
  char why[100];
  gs_device_t *d = gs_device_open("cpu", 0, NULL, why, sizeof(why));

  ck_assert_ptr_nonnull(d);
  st.gate = (gs_optim_gate_t){.skip = &one};
  gs_device_optim_pack(d, &st, seg, 1, p, g, state);
  ck_assert_float_eq(p[0], 1.0f);
  st.gate = (gs_optim_gate_t){.skip = &zero, .veto = &one};
  gs_device_optim_pack(d, &st, seg, 1, p, g, state);
  ck_assert_float_eq(p[3], 4.0f);
  st.gate = (gs_optim_gate_t){.skip = &zero, .veto = &zero, .factor = &half};
  gs_device_optim_pack(d, &st, seg, 1, p, g, state);
  ck_assert_float_eq(p[0], 1.0f - 0.5f * 0.5f);
  ck_assert_float_eq(p[3], 4.0f - 0.5f * 0.5f);
  gs_device_destroy(d);
}
END_TEST

/* The device counts the waits its callers make: a sync and a download
 * each (the cpu's cost nothing but count alike), never a fetch the
 * device has done (the cpu's always has); a loss's verdict lands in the
 * vector only when it is not finite. */
START_TEST(device_waits)
{
  float v[4] = {0}, x = 2.0f, host = 0.0f, inf = INFINITY;
  char why[100];
  gs_device_t *d = gs_device_open("cpu", 0, NULL, why, sizeof(why));

  ck_assert_ptr_nonnull(d);
  ck_assert_int_eq(gs_device_sync(d), 0);
  ck_assert_int_eq(gs_device_download(d, &host, &x, sizeof(x)), 0);
  ck_assert_uint_eq(d->waits.syncs, 1);
  ck_assert_uint_eq(d->waits.reads, 1);
  x = 3.0f;
  ck_assert_int_eq(gs_device_fetch(d, &host, &x, sizeof(x)), 0);
  ck_assert_int_eq(gs_device_fetched(d), 0);
  ck_assert_float_eq(host, 3.0f);
  ck_assert_uint_eq(d->waits.syncs, 1);
  ck_assert_uint_eq(d->waits.reads, 1);
  gs_device_mark_nonfinite(d, &x, v, 1, 3, 4.0f);
  ck_assert_float_eq(v[1] + v[3], 0.0f);
  gs_device_mark_nonfinite(d, &inf, v, 1, 3, 4.0f);
  ck_assert_float_eq(v[1], 1.0f);
  ck_assert_float_eq(v[3], 4.0f);
  gs_device_destroy(d);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *optim_suite(void)
{
  Suite *s = suite_create("optim");

  suite_add_tcase(s, tcase("adam", adam));
  suite_add_tcase(s, tcase("adamw", adamw));
  suite_add_tcase(s, tcase("sgd_dampening", sgd_dampening));
  suite_add_tcase(s, tcase("first_nonfinite", first_nonfinite));
  suite_add_tcase(s, tcase("names_and_checks", names_and_checks));
  suite_add_tcase(s, tcase("gate", gate));
  suite_add_tcase(s, tcase("device_waits", device_waits));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {optim_suite}};
