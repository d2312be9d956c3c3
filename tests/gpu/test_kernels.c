/* Tests for the cuda device and the MLP's cuda kernels
 * (agent/device/device_cuda.cu, agent/trainer/kernels_cuda.cu) against the
 * cpu ones (device_cpu.c, kernels_cpu.c): every operation runs on both
 * devices with the same fresh random inputs (the
 * seed is printed on failure), outputs are filled with NaN beforehand so an
 * element a kernel never writes is caught, and results must agree to a
 * relative error ||gpu - cpu|| / ||cpu|| below 1e-5.
 *
 * Exits 77 (ctest's "skipped") without CUDA or without a visible GPU. The
 * runner does not fork: CUDA is initialized by main's device count and
 * cannot be used again in a forked child. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "gpu_check.h"
#include "kernels.h"
#include "rng.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define TOLERANCE 1e-5
#define CPU 0
#define GPU 1

typedef struct shape {
  uint32_t m, n, k;
} shape_t;

/* Both devices, the log they share and the test's random stream. */
typedef struct pair {
  gs_device_t *dev[2];
  gs_kernels_t *kn[2]; /* the MLP's kernels on each */
  gs_log_t log;
  unsigned long long seed;
  uint64_t rng;
} pair_t;

/* One buffer of the same size on both devices. */
typedef struct twin {
  void *at[2];
  size_t bytes;
} twin_t;

/* Uniform in [lo, hi). */
static float uniform(pair_t *p, float lo, float hi)
{
  return lo + (hi - lo) * (float)((double)(gs_splitmix64(&p->rng) >> 40) * 0x1p-24);
}

static float *random_floats(pair_t *p, size_t n, float lo, float hi)
{
  float *a = malloc((n ? n : 1) * sizeof(float));

  ck_assert_ptr_nonnull(a);
  for (size_t i = 0; i < n; i++)
    a[i] = uniform(p, lo, hi);
  return a;
}

/* Opens cpu and cuda:0 with a seed that differs on every run. */
static void pair_open(pair_t *p)
{
  struct timespec ts;
  char why[256] = "";

  clock_gettime(CLOCK_REALTIME, &ts);
  memset(p, 0, sizeof(*p));
  p->seed = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
  p->seed ^= (unsigned long long)getpid() << 40;
  p->rng = p->seed;
  p->log = (gs_log_t){.level = GS_LOG_WARN, .out = NULL, .component = "test_kernels"};
  p->dev[CPU] = gs_device_open("cpu", 0, &p->log, why, sizeof(why));
  ck_assert_msg(p->dev[CPU], "cpu device: %s", why);
  p->dev[GPU] = gs_device_open("cuda", 0, &p->log, why, sizeof(why));
  ck_assert_msg(p->dev[GPU], "cuda device: %s", why);
  for (int i = 0; i < 2; i++) {
    p->kn[i] = gs_kernels_new(p->dev[i], why, sizeof(why));
    ck_assert_msg(p->kn[i], "%s kernels: %s", p->dev[i]->label, why);
  }
}

static void pair_close(pair_t *p)
{
  for (int i = 0; i < 2; i++) {
    ck_assert_int_eq(gs_device_sync(p->dev[i]), 0);
    gs_kernels_free(p->kn[i]);
    gs_device_destroy(p->dev[i]);
  }
}

/* Allocates `bytes` on both devices and uploads `host` there. */
static twin_t twin_in(pair_t *p, const void *host, size_t bytes)
{
  twin_t t = {.bytes = bytes};

  for (int i = 0; i < 2; i++) {
    t.at[i] = gs_device_alloc(p->dev[i], bytes);
    ck_assert_ptr_nonnull(t.at[i]);
    ck_assert_int_eq(gs_device_upload(p->dev[i], t.at[i], host, bytes), 0);
    ck_assert_int_eq(gs_device_sync(p->dev[i]), 0); /* host may change next */
  }
  return t;
}

/* An output of n floats, all NaN on both devices. */
static twin_t twin_poisoned(pair_t *p, size_t n)
{
  float *nan = malloc((n ? n : 1) * sizeof(float));
  twin_t t;

  ck_assert_ptr_nonnull(nan);
  for (size_t i = 0; i < n; i++)
    nan[i] = NAN;
  t = twin_in(p, nan, n * sizeof(float));
  free(nan);
  return t;
}

/* Downloads both copies into out[CPU] and out[GPU] (malloc'd; the caller
 * frees them). */
static void twin_out(pair_t *p, const twin_t *t, float *out[2])
{
  for (int i = 0; i < 2; i++) {
    out[i] = malloc(t->bytes ? t->bytes : 1);
    ck_assert_ptr_nonnull(out[i]);
    ck_assert_msg(gs_device_download(p->dev[i], out[i], t->at[i], t->bytes) == 0,
                  "%s: download failed (seed %llu)", p->dev[i]->label, p->seed);
  }
}

static void twin_free(pair_t *p, twin_t *t)
{
  for (int i = 0; i < 2; i++)
    gs_device_free(p->dev[i], t->at[i]);
}

/* Both devices must have written every element (no NaN) and agree. */
static void expect_close(pair_t *p, const char *what, const float *ref, const float *out, size_t n)
{
  double diff = 0.0, norm = 0.0;

  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(!isnan(ref[i]) && !isnan(out[i]),
                  "%s: element %zu is NaN (cpu %g, cuda %g): never written? (seed %llu)", what, i,
                  ref[i], out[i], p->seed);
    diff += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    norm += (double)ref[i] * ref[i];
  }
  diff = sqrt(diff);
  norm = sqrt(norm);
  ck_assert_msg(diff <= TOLERANCE * norm,
                "%s: relative error %.3g (|diff| %.3g, |ref| %.3g) (seed %llu)", what,
                norm > 0 ? diff / norm : diff, diff, norm, p->seed);
}

/* Downloads a twin and compares the cuda copy with the cpu one. */
static void expect_twin(pair_t *p, const char *what, const twin_t *t)
{
  float *out[2];

  twin_out(p, t, out);
  expect_close(p, what, out[CPU], out[GPU], t->bytes / sizeof(float));
  free(out[CPU]);
  free(out[GPU]);
}

static const shape_t shapes[] = {
    {67, 129, 785}, {1, 1, 1}, {1, 300, 7}, {256, 10, 128}, {1000, 64, 100}, {33, 1000, 17},
};

START_TEST(linear_forward)
{
  pair_t p;

  pair_open(&p);
  for (size_t s = 0; s < COUNT(shapes); s++) {
    shape_t sh = shapes[s];
    float *x = random_floats(&p, (size_t)sh.m * sh.k, -1, 1);
    float *w = random_floats(&p, (size_t)sh.n * sh.k, -1, 1);
    float *b = random_floats(&p, sh.n, -1, 1);
    twin_t tx = twin_in(&p, x, (size_t)sh.m * sh.k * sizeof(float));
    twin_t tw = twin_in(&p, w, (size_t)sh.n * sh.k * sizeof(float));
    twin_t tb = twin_in(&p, b, sh.n * sizeof(float));

    for (int relu = 0; relu < 2; relu++) {
      twin_t ty = twin_poisoned(&p, (size_t)sh.m * sh.n);
      char what[96];

      for (int i = 0; i < 2; i++)
        gs_kernels_linear_forward(p.kn[i], tx.at[i], tw.at[i], tb.at[i], ty.at[i], sh.m, sh.n, sh.k,
                                  relu);
      snprintf(what, sizeof(what), "forward m=%u n=%u k=%u relu=%d: y", sh.m, sh.n, sh.k, relu);
      expect_twin(&p, what, &ty);
      twin_free(&p, &ty);
    }
    twin_free(&p, &tx);
    twin_free(&p, &tw);
    twin_free(&p, &tb);
    free(x);
    free(w);
    free(b);
  }
  pair_close(&p);
}
END_TEST

/* One backward at `sh`; without dx, the poisoned dx must stay untouched. */
static void run_backward(pair_t *p, shape_t sh, bool with_dx)
{
  size_t nx = (size_t)sh.m * sh.k;
  float *x = random_floats(p, nx, -1, 1);
  float *w = random_floats(p, (size_t)sh.n * sh.k, -1, 1);
  float *dy = random_floats(p, (size_t)sh.m * sh.n, -1, 1);
  twin_t tx, tw, tdy, tgw, tgb, tdx;
  char what[96];
  float *out[2];

  for (size_t e = 0; e < nx; e += 4)
    x[e] = 0.0f; /* the mask's edge: x == 0 is masked */
  tx = twin_in(p, x, nx * sizeof(float));
  tw = twin_in(p, w, (size_t)sh.n * sh.k * sizeof(float));
  tdy = twin_in(p, dy, (size_t)sh.m * sh.n * sizeof(float));
  tgw = twin_poisoned(p, (size_t)sh.n * sh.k);
  tgb = twin_poisoned(p, sh.n);
  tdx = twin_poisoned(p, nx);
  for (int i = 0; i < 2; i++)
    gs_kernels_linear_backward(p->kn[i], tx.at[i], tw.at[i], tdy.at[i], tgw.at[i], tgb.at[i],
                               with_dx ? tdx.at[i] : NULL, sh.m, sh.n, sh.k);
  snprintf(what, sizeof(what), "backward m=%u n=%u k=%u: gw", sh.m, sh.n, sh.k);
  expect_twin(p, what, &tgw);
  snprintf(what, sizeof(what), "backward m=%u n=%u k=%u: gb", sh.m, sh.n, sh.k);
  expect_twin(p, what, &tgb);
  if (with_dx) {
    snprintf(what, sizeof(what), "backward m=%u n=%u k=%u: dx", sh.m, sh.n, sh.k);
    expect_twin(p, what, &tdx);
  } else {
    twin_out(p, &tdx, out);
    for (size_t e = 0; e < nx; e++)
      ck_assert_msg(isnan(out[GPU][e]), "backward without dx wrote dx[%zu] (seed %llu)", e,
                    p->seed);
    free(out[CPU]);
    free(out[GPU]);
  }
  twin_free(p, &tx);
  twin_free(p, &tw);
  twin_free(p, &tdy);
  twin_free(p, &tgw);
  twin_free(p, &tgb);
  twin_free(p, &tdx);
  free(x);
  free(w);
  free(dy);
}

START_TEST(linear_backward)
{
  pair_t p;

  pair_open(&p);
  for (size_t s = 0; s < COUNT(shapes); s++) {
    run_backward(&p, shapes[s], true);
    run_backward(&p, shapes[s], false);
  }
  pair_close(&p);
}
END_TEST

/* Logits [m x c] and labels with two tied maxima (the first one counts),
 * and, when `nan_label`, a label equal to c in the last row. */
static void run_xent(pair_t *p, uint32_t m, uint32_t c, bool nan_label)
{
  float *z = random_floats(p, (size_t)m * c, -4, 4);
  uint8_t *y = malloc(m);
  float stats0[2] = {0.5f, 3.0f}, *out[2];
  uint32_t labels = c < 256 ? c : 256;
  twin_t tz, ty, tdz, ts;
  char what[96];

  ck_assert_ptr_nonnull(y);
  for (uint32_t i = 0; i < m; i++)
    y[i] = (uint8_t)(gs_splitmix64(&p->rng) % labels);
  if (c >= 3 && labels == c) {
    z[1] = z[c - 1] = 10.0f;
    y[0] = 1; /* a hit: index 1 comes first */
    if (m >= 2) {
      z[c] = z[2 * c - 1] = 10.0f;
      y[1] = (uint8_t)(c - 1); /* a miss: index 0 comes first */
    }
  }
  if (nan_label)
    y[m - 1] = (uint8_t)c;
  tz = twin_in(p, z, (size_t)m * c * sizeof(float));
  ty = twin_in(p, y, m);
  tdz = twin_poisoned(p, (size_t)m * c);
  ts = twin_in(p, stats0, sizeof(stats0));
  for (int i = 0; i < 2; i++)
    gs_kernels_softmax_xent(p->kn[i], tz.at[i], ty.at[i], tdz.at[i], m, c, ts.at[i]);
  snprintf(what, sizeof(what), "softmax_xent m=%u c=%u: dz", m, c);
  expect_twin(p, what, &tdz);
  twin_out(p, &ts, out);
  if (nan_label) {
    ck_assert_msg(isnan(out[CPU][0]) && isnan(out[GPU][0]),
                  "%s: loss with a label == c: cpu %g, cuda %g, want NaN (seed %llu)", what,
                  out[CPU][0], out[GPU][0], p->seed);
  } else {
    snprintf(what, sizeof(what), "softmax_xent m=%u c=%u: loss", m, c);
    out[CPU][0] -= stats0[0];
    out[GPU][0] -= stats0[0];
    expect_close(p, what, out[CPU], out[GPU], 1);
  }
  ck_assert_msg(out[CPU][1] == out[GPU][1] && out[CPU][1] >= stats0[1],
                "softmax_xent m=%u c=%u: correct count: cpu %g, cuda %g (seed %llu)", m, c,
                out[CPU][1], out[GPU][1], p->seed);
  free(out[CPU]);
  free(out[GPU]);
  twin_free(p, &tz);
  twin_free(p, &ty);
  twin_free(p, &tdz);
  twin_free(p, &ts);
  free(z);
  free(y);
}

START_TEST(softmax_xent)
{
  static const uint32_t cases[][2] = {{67, 10}, {1, 1}, {1, 10}, {300, 37}, {33, 1000}, {1024, 10}};
  pair_t p;

  pair_open(&p);
  for (size_t i = 0; i < COUNT(cases); i++) {
    run_xent(&p, cases[i][0], cases[i][1], false);
    if (cases[i][1] < 256)
      run_xent(&p, cases[i][0], cases[i][1], true);
  }
  pair_close(&p);
}
END_TEST

/* Three steps of optimizer `kind` over a pack with gaps (never touched),
 * an empty segment and two segments in groups of different lr and decay;
 * after each step the params, their change and every state buffer must
 * agree between the CPU loops and the CUDA kernel. */
static void run_optim(pair_t *p, gs_optim_kind_t kind, float momentum, bool nesterov, bool amsgrad,
                      bool maximize, float grad_scale)
{
  enum { LEN = 1050 };
  static const gs_optim_segment_t segs[] = {{3, 700, 0}, {703, 0, 2}, {710, 337, 1}};
  static const float lrs[3] = {0.5f, 0.4f, 0.3f};
  float *p0 = random_floats(p, LEN, -1, 1), *zeros = calloc(LEN, sizeof(float)), *out[2];
  twin_t tp = twin_in(p, p0, LEN * sizeof(float)), tb[GS_OPTIM_MAX_STATE];
  gs_optim_group_t groups[3];
  uint32_t nstate;
  char what[160];

  for (int g = 0; g < 3; g++) {
    gs_optim_group_default(kind, &groups[g]);
    groups[g].momentum = momentum;
    groups[g].nesterov = nesterov;
    groups[g].amsgrad = amsgrad;
    groups[g].maximize = maximize;
    groups[g].weight_decay = g == 0 ? 5e-4f : g == 1 ? 0.0f : 9.0f;
  }
  nstate = gs_optim_state_count(kind, groups, 3);
  for (uint32_t k = 0; k < nstate; k++)
    tb[k] = twin_in(p, zeros, LEN * sizeof(float));
  for (int step = 0; step < 3; step++) {
    float *g = random_floats(p, LEN, -1, 1);
    twin_t tg = twin_in(p, g, LEN * sizeof(float));

    for (int k = 0; k < 3; k++)
      groups[k].lr = lrs[step] * (k == 1 ? 2.0f : 1.0f);
    for (int i = 0; i < 2; i++) {
      gs_optim_step_t st = {.kind = kind,
                            .groups = groups,
                            .ngroups = 3,
                            .t = (uint64_t)step + 1,
                            .grad_scale = grad_scale};
      float *state[GS_OPTIM_MAX_STATE] = {NULL, NULL, NULL};

      for (uint32_t k = 0; k < nstate; k++)
        state[k] = tb[k].at[i];
      gs_device_optim_pack(p->dev[i], &st, segs, COUNT(segs), tp.at[i], tg.at[i], state);
    }
    snprintf(what, sizeof(what),
             "%s momentum=%g nesterov=%d amsgrad=%d maximize=%d grad_scale=%g step %d",
             gs_optim_kind_name(kind), momentum, nesterov, amsgrad, maximize, grad_scale, step + 1);
    twin_out(p, &tp, out);
    for (size_t e = 0; e < LEN; e++) {
      bool inside = (e >= 3 && e < 703) || (e >= 710 && e < 1047);

      ck_assert_msg(inside || (out[CPU][e] == p0[e] && out[GPU][e] == p0[e]),
                    "%s: element %zu outside the segments changed (seed %llu)", what, e, p->seed);
    }
    expect_close(p, what, out[CPU], out[GPU], LEN);
    for (size_t e = 0; e < LEN; e++) {
      out[CPU][e] -= p0[e];
      out[GPU][e] -= p0[e];
    }
    expect_close(p, what, out[CPU], out[GPU], LEN);
    free(out[CPU]);
    free(out[GPU]);
    for (uint32_t k = 0; k < nstate; k++)
      expect_twin(p, what, &tb[k]);
    twin_free(p, &tg);
    free(g);
  }
  twin_free(p, &tp);
  for (uint32_t k = 0; k < nstate; k++)
    twin_free(p, &tb[k]);
  free(p0);
  free(zeros);
}

START_TEST(optim_pack)
{
  pair_t p;

  pair_open(&p);
  run_optim(&p, GS_OPTIM_SGD, 0.9f, false, false, false, 1.0f);
  run_optim(&p, GS_OPTIM_SGD, 0.9f, true, false, false, 1.0f);
  run_optim(&p, GS_OPTIM_SGD, 0.0f, false, false, false, 1.0f);
  run_optim(&p, GS_OPTIM_SGD, 0.9f, false, false, true, 0.5f);
  run_optim(&p, GS_OPTIM_SGD, 0.0f, false, false, false, 0.25f);
  run_optim(&p, GS_OPTIM_ADAM, 0.0f, false, false, false, 1.0f);
  run_optim(&p, GS_OPTIM_ADAM, 0.0f, false, true, true, 0.5f);
  run_optim(&p, GS_OPTIM_ADAMW, 0.0f, false, false, false, 0.5f);
  run_optim(&p, GS_OPTIM_ADAMW, 0.0f, false, true, false, 1.0f);
  pair_close(&p);
}
END_TEST

/* Fresh memory reads as zeros; bytes come back as they went, also through
 * pinned host memory. */
START_TEST(round_trip)
{
  static const size_t sizes[] = {1, 4097, (1u << 20) + 3};
  pair_t p;

  pair_open(&p);
  for (size_t s = 0; s < COUNT(sizes); s++) {
    for (int i = 0; i < 2; i++) {
      gs_device_t *d = p.dev[i];
      uint8_t *host = gs_device_host_alloc(d, sizes[s]), *back = malloc(sizes[s]);
      void *mem = gs_device_alloc(d, sizes[s]);

      ck_assert_ptr_nonnull(host);
      ck_assert_ptr_nonnull(back);
      ck_assert_ptr_nonnull(mem);
      for (size_t b = 0; b < sizes[s]; b++)
        ck_assert_msg(host[b] == 0, "%s: host_alloc byte %zu not zero", d->label, b);
      memset(back, 0xa5, sizes[s]);
      ck_assert_int_eq(gs_device_download(d, back, mem, sizes[s]), 0);
      for (size_t b = 0; b < sizes[s]; b++)
        ck_assert_msg(back[b] == 0, "%s: alloc byte %zu of %zu not zero", d->label, b, sizes[s]);
      for (size_t b = 0; b < sizes[s]; b++)
        host[b] = (uint8_t)gs_splitmix64(&p.rng);
      ck_assert_int_eq(gs_device_upload(d, mem, host, sizes[s]), 0);
      ck_assert_int_eq(gs_device_download(d, back, mem, sizes[s]), 0);
      ck_assert_msg(memcmp(host, back, sizes[s]) == 0,
                    "%s: %zu bytes changed on the way (seed %llu)", d->label, sizes[s], p.seed);
      memset(host, 0, sizes[s]);
      ck_assert_int_eq(gs_device_download(d, host, mem, sizes[s]), 0);
      ck_assert_msg(memcmp(host, back, sizes[s]) == 0, "%s: download into pinned memory differs",
                    d->label);
      gs_device_free(d, mem);
      gs_device_host_free(d, host);
      free(back);
    }
  }
  pair_close(&p);
}
END_TEST

/* Rounding to bfloat16 and float16 and back: the same bits on both
 * devices (both round to nearest even; NaN stays NaN), over values that hit ties,
 * float16's subnormals and overflow, NaN and the infinities. */
START_TEST(narrow_widen)
{
  enum { N = 100003 };
  static const gs_dtype_t types[] = {GS_DTYPE_BFLOAT16, GS_DTYPE_FLOAT16};
  pair_t p;
  float *a;

  pair_open(&p);
  a = random_floats(&p, N, -1, 1);
  for (size_t i = 0; i < N; i++)
    a[i] = ldexpf(a[i], (int)(i % 48) - 30); /* 2^-30 .. 2^17 */
  a[0] = NAN, a[1] = INFINITY, a[2] = -INFINITY, a[3] = 65520.0f, a[4] = 1.0f + 0x1p-11f;
  a[5] = 1.0f + 0x1p-8f, a[6] = 0x1p-25f, a[7] = -0.0f;
  for (size_t t = 0; t < COUNT(types); t++) {
    twin_t f = twin_in(&p, a, N * sizeof(float)), h = twin_in(&p, a, N * sizeof(uint16_t));
    uint16_t *bits[2];
    float *out[2];

    for (int i = 0; i < 2; i++) {
      gs_device_narrow(p.dev[i], h.at[i], f.at[i], N, types[t]);
      gs_device_widen(p.dev[i], f.at[i], h.at[i], N, types[t]);
    }
    twin_out(&p, &h, (float **)bits);
    twin_out(&p, &f, out);
    for (size_t e = 0; e < N; e++) /* a NaN's payload is each library's own */
      ck_assert_msg(isnan(a[e]) ? isnan(out[CPU][e]) && isnan(out[GPU][e])
                                : bits[CPU][e] == bits[GPU][e] &&
                                      memcmp(&out[CPU][e], &out[GPU][e], sizeof(float)) == 0,
                    "%s: element %zu (%.9g) rounds to %#x on the cpu, %#x on the gpu (seed %llu)",
                    gs_dtype_name(types[t]), e, a[e], bits[CPU][e], bits[GPU][e], p.seed);
    for (int i = 0; i < 2; i++)
      free(out[i]), free(bits[i]);
    twin_free(&p, &f);
    twin_free(&p, &h);
  }
  free(a);
  pair_close(&p);
}
END_TEST

/* Zeroing a range inside a buffer clears it and nothing else. */
START_TEST(zero)
{
  enum { N = 1000, FROM = 3, LEN = 333 };
  pair_t p;
  float *a, *out[2];
  twin_t t;

  pair_open(&p);
  a = random_floats(&p, N, 1, 2);
  t = twin_in(&p, a, N * sizeof(float));
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(gs_device_zero(p.dev[i], (float *)t.at[i] + FROM, LEN * sizeof(float)), 0);
  twin_out(&p, &t, out);
  for (int i = 0; i < 2; i++)
    for (size_t e = 0; e < N; e++)
      ck_assert_msg(out[i][e] == (e >= FROM && e < FROM + LEN ? 0.0f : a[e]),
                    "%s: element %zu is %g after zeroing [%d, %d)", p.dev[i]->label, e, out[i][e],
                    FROM, FROM + LEN);
  free(out[CPU]);
  free(out[GPU]);
  twin_free(&p, &t);
  free(a);
  pair_close(&p);
}
END_TEST

/* Every byte value, in a random order and at an odd length: both devices
 * give exactly v / 255 (the inputs must not depend on the device). */
START_TEST(pixels)
{
  enum { N = 256 * 37 + 5 };
  pair_t p;
  uint8_t *px = malloc(N);
  float *out[2];
  twin_t in, x;

  ck_assert_ptr_nonnull(px);
  pair_open(&p);
  for (size_t i = 0; i < N; i++)
    px[i] = (uint8_t)(i * 167 + (gs_splitmix64(&p.rng) & 0xff00 ? 0 : 1));
  in = twin_in(&p, px, N);
  x = twin_poisoned(&p, N);
  for (int i = 0; i < 2; i++)
    gs_kernels_pixels(p.kn[i], in.at[i], x.at[i], N);
  twin_out(&p, &x, out);
  for (size_t e = 0; e < N; e++)
    ck_assert_msg(out[CPU][e] == (float)px[e] / 255.0f && out[GPU][e] == out[CPU][e],
                  "pixel %zu (%u): cpu %.9g, cuda %.9g, want %.9g (seed %llu)", e, px[e],
                  out[CPU][e], out[GPU][e], (float)px[e] / 255.0f, p.seed);
  free(out[CPU]);
  free(out[GPU]);
  twin_free(&p, &in);
  twin_free(&p, &x);
  free(px);
  pair_close(&p);
}
END_TEST

static Suite *kernels_suite(void)
{
  Suite *s = suite_create("kernels");

  suite_add_tcase(s, gs_gpu_tcase("round_trip", round_trip));
  suite_add_tcase(s, gs_gpu_tcase("zero", zero));
  suite_add_tcase(s, gs_gpu_tcase("narrow_widen", narrow_widen));
  suite_add_tcase(s, gs_gpu_tcase("linear_forward", linear_forward));
  suite_add_tcase(s, gs_gpu_tcase("linear_backward", linear_backward));
  suite_add_tcase(s, gs_gpu_tcase("softmax_xent", softmax_xent));
  suite_add_tcase(s, gs_gpu_tcase("optim_pack", optim_pack));
  suite_add_tcase(s, gs_gpu_tcase("pixels", pixels));
  return s;
}

int main(void)
{
  int skip = gs_gpu_skip();

  if (skip)
    return skip;
  return gs_gpu_run_suite(kernels_suite()) ? EXIT_FAILURE : EXIT_SUCCESS;
}
