/* Tests for agent/trainer/mlp.c: layer-list parsing, parameter descriptions and
 * init, forward and backward against a naive double-precision reference
 * written here (itself checked against central finite differences), the
 * order and timing of the gradient-ready callbacks, and a short training
 * run that must learn. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"
#include "rng.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define MAXW 16 /* widths per net */
#define MAXP (2 * (MAXW - 1))

/* Xorshift64: the tests' own generator, independent of the model's. */
static uint64_t xorshift(uint64_t *state)
{
  uint64_t x = *state;

  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return x;
}

/* Uniform in [-1, 1). */
static double uniform(uint64_t *state)
{
  return (double)(xorshift(state) >> 11) * 0x1p-52 - 1.0;
}

/* The CPU device every model here runs on (its memory is host memory). */
static gs_device_t *cpu(void)
{
  static gs_device_t *dev;
  static const gs_log_t log = {GS_LOG_WARN, NULL, "test_mlp"};
  char why[128];

  if (!dev)
    dev = gs_device_open("cpu", 0, &log, why, sizeof(why));
  ck_assert_msg(dev, "cpu device: %s", why);
  return dev;
}

/* A model with separately allocated parameters and gradients bound to it. */
typedef struct net {
  gs_mlp_t *m;
  uint32_t n, sizes[MAXW], np;
  float *p[MAXP], *g[MAXP];
} net_t;

static void net_new(net_t *t, const uint32_t *sizes, uint32_t n, uint32_t max_batch)
{
  char why[256] = "";
  uint32_t i;

  memset(t, 0, sizeof(*t));
  t->m = gs_mlp_new(cpu(), sizes, n, max_batch, why, sizeof(why));
  ck_assert_msg(t->m, "gs_mlp_new: %s", why);
  t->n = n;
  memcpy(t->sizes, sizes, n * sizeof(sizes[0]));
  t->np = gs_mlp_param_count(t->m);
  ck_assert_uint_eq(t->np, 2 * (n - 1));
  for (i = 0; i < t->np; i++) {
    uint64_t e = gs_mlp_param_desc(t->m, i).elements;

    t->p[i] = malloc(e * sizeof(float));
    t->g[i] = malloc(e * sizeof(float));
    ck_assert(t->p[i] && t->g[i]);
    gs_mlp_bind(t->m, i, t->p[i], t->g[i]);
  }
}

static void net_free(net_t *t)
{
  uint32_t i;

  for (i = 0; i < t->np; i++) {
    free(t->p[i]);
    free(t->g[i]);
  }
  gs_mlp_free(t->m);
}

/* Elements of parameter i: out x in for weights, out for biases. */
static uint64_t net_elements(const net_t *t, uint32_t i)
{
  uint64_t out = t->sizes[i / 2 + 1];

  return i % 2 ? out : out * t->sizes[i / 2];
}

/* Fills parameters with the tests' generator, uniform in
 * +-scale * 2 / sqrt(fan_in), so activations stay of order one. */
static void net_randomize(net_t *t, uint64_t *rng, double scale)
{
  uint32_t i;
  uint64_t k;

  for (i = 0; i < t->np; i++) {
    double bound = scale * 2 / sqrt(t->sizes[i / 2]);

    for (k = 0; k < net_elements(t, i); k++)
      t->p[i][k] = (float)(bound * uniform(rng));
  }
}

/* Sets every gradient element to NaN, so a gradient not overwritten shows. */
static void net_poison_grads(net_t *t)
{
  uint32_t i;
  uint64_t k;

  for (i = 0; i < t->np; i++)
    for (k = 0; k < net_elements(t, i); k++)
      t->g[i][k] = NAN;
}

static void random_batch(uint64_t *rng, float *x, uint8_t *y, uint32_t batch, uint32_t in,
                         uint32_t classes)
{
  uint32_t k;

  for (k = 0; k < batch * in; k++)
    x[k] = (float)uniform(rng);
  for (k = 0; k < batch; k++)
    y[k] = (uint8_t)(xorshift(rng) % classes);
}

/* The reference: the same network in double with naive loops. p[i] are the
 * parameters in forward order, a[l] the layer outputs (a[0] the input). */
typedef struct ref {
  uint32_t n, batch, np;
  const uint32_t *sizes;
  double *p[MAXP], *g[MAXP];
  double *a[MAXW];
  double *dz, *dprev; /* [batch x widest] */
} ref_t;

static void ref_new(ref_t *r, const net_t *t, const float *x, uint32_t batch)
{
  uint32_t i, l, widest = 0;
  uint64_t k;

  memset(r, 0, sizeof(*r));
  r->n = t->n;
  r->np = t->np;
  r->batch = batch;
  r->sizes = t->sizes;
  for (i = 0; i < t->np; i++) {
    r->p[i] = malloc(net_elements(t, i) * sizeof(double));
    r->g[i] = malloc(net_elements(t, i) * sizeof(double));
    for (k = 0; k < net_elements(t, i); k++)
      r->p[i][k] = t->p[i][k];
  }
  for (l = 0; l < t->n; l++) {
    r->a[l] = malloc((size_t)batch * t->sizes[l] * sizeof(double));
    widest = t->sizes[l] > widest ? t->sizes[l] : widest;
  }
  for (k = 0; k < (uint64_t)batch * t->sizes[0]; k++)
    r->a[0][k] = x[k];
  r->dz = malloc((size_t)batch * widest * sizeof(double));
  r->dprev = malloc((size_t)batch * widest * sizeof(double));
}

static void ref_free(ref_t *r)
{
  uint32_t i;

  for (i = 0; i < r->np; i++) {
    free(r->p[i]);
    free(r->g[i]);
  }
  for (i = 0; i < r->n; i++)
    free(r->a[i]);
  free(r->dz);
  free(r->dprev);
}

/* Forward in double: fills a[1..n-1] (logits last) and returns the mean
 * cross-entropy; *correct gets the argmax hits. */
static double ref_forward(ref_t *r, const uint8_t *y, uint32_t *correct)
{
  uint32_t l, i, o, k, L = r->n - 1, hits = 0;
  double loss = 0;

  for (l = 1; l <= L; l++) {
    uint32_t in = r->sizes[l - 1], out = r->sizes[l];
    const double *w = r->p[2 * (l - 1)], *b = r->p[2 * (l - 1) + 1];

    for (i = 0; i < r->batch; i++) {
      for (o = 0; o < out; o++) {
        double s = b[o];

        for (k = 0; k < in; k++)
          s += r->a[l - 1][i * in + k] * w[o * in + k];
        r->a[l][i * out + o] = l < L && s < 0 ? 0 : s;
      }
    }
  }
  for (i = 0; i < r->batch; i++) {
    uint32_t c = r->sizes[L], best = 0;
    const double *z = r->a[L] + i * c;
    double sum = 0;

    for (o = 0; o < c; o++) {
      sum += exp(z[o]);
      best = z[o] > z[best] ? o : best;
    }
    loss += log(sum) - z[y[i]];
    hits += best == y[i];
  }
  if (correct)
    *correct = hits;
  return loss / r->batch;
}

/* Backward in double after ref_forward: fills g[] with d(mean loss)/dp. */
static void ref_backward(ref_t *r, const uint8_t *y)
{
  uint32_t l, i, o, k, L = r->n - 1, c = r->sizes[L];
  double *tmp;

  for (i = 0; i < r->batch; i++) {
    const double *z = r->a[L] + i * c;
    double sum = 0;

    for (o = 0; o < c; o++)
      sum += exp(z[o]);
    for (o = 0; o < c; o++)
      r->dz[i * c + o] = (exp(z[o]) / sum - (o == y[i])) / r->batch;
  }
  for (l = L; l >= 1; l--) {
    uint32_t in = r->sizes[l - 1], out = r->sizes[l];
    double *gw = r->g[2 * (l - 1)], *gb = r->g[2 * (l - 1) + 1];
    const double *w = r->p[2 * (l - 1)];

    for (o = 0; o < out; o++) {
      gb[o] = 0;
      for (k = 0; k < in; k++)
        gw[o * in + k] = 0;
      for (i = 0; i < r->batch; i++) {
        gb[o] += r->dz[i * out + o];
        for (k = 0; k < in; k++)
          gw[o * in + k] += r->dz[i * out + o] * r->a[l - 1][i * in + k];
      }
    }
    if (l == 1)
      break;
    for (i = 0; i < r->batch; i++) {
      for (k = 0; k < in; k++) {
        double s = 0;

        for (o = 0; o < out; o++)
          s += r->dz[i * out + o] * w[o * in + k];
        r->dprev[i * in + k] = r->a[l - 1][i * in + k] > 0 ? s : 0;
      }
    }
    tmp = r->dz;
    r->dz = r->dprev;
    r->dprev = tmp;
  }
}

/* Checks the reference backward against central differences of the
 * reference forward (all in double), so the reference is trusted. */
static void ref_check_fd(ref_t *r, const uint8_t *y)
{
  const double eps = 1e-6;
  uint32_t i;
  uint64_t k;

  ref_forward(r, y, NULL);
  ref_backward(r, y);
  for (i = 0; i < r->np; i++) {
    uint64_t e = i % 2 ? r->sizes[i / 2 + 1] : (uint64_t)r->sizes[i / 2 + 1] * r->sizes[i / 2];

    for (k = 0; k < e; k++) {
      double keep = r->p[i][k], up, down, fd;

      r->p[i][k] = keep + eps;
      up = ref_forward(r, y, NULL);
      r->p[i][k] = keep - eps;
      down = ref_forward(r, y, NULL);
      r->p[i][k] = keep;
      fd = (up - down) / (2 * eps);
      ck_assert_msg(fabs(fd - r->g[i][k]) <= 1e-6 * fmax(1.0, fabs(fd)),
                    "reference backward: param %u[%llu] = %.9g, differences give %.9g", i,
                    (unsigned long long)k, r->g[i][k], fd);
    }
  }
  ref_forward(r, y, NULL); /* leave the activations of the unperturbed net */
}

/* Compares the model's float gradients with the reference's, to float
 * accuracy relative to each tensor's largest gradient. */
static void expect_grads(const net_t *t, const ref_t *r, const char *what)
{
  uint32_t i;
  uint64_t k;

  for (i = 0; i < t->np; i++) {
    double big = 0;

    for (k = 0; k < net_elements(t, i); k++)
      big = fmax(big, fabs(r->g[i][k]));
    for (k = 0; k < net_elements(t, i); k++)
      ck_assert_msg(fabs(t->g[i][k] - r->g[i][k]) <= 1e-5 * big + 1e-4 * fabs(r->g[i][k]) + 1e-9,
                    "%s: %s[%llu] = %.9g, reference %.9g", what, gs_mlp_param_desc(t->m, i).name,
                    (unsigned long long)k, t->g[i][k], r->g[i][k]);
  }
}

START_TEST(parse_layers_good)
{
  static const struct {
    const char *s;
    uint32_t n, sizes[MAXW];
  } cases[] = {
      {"784,256,128,10", 4, {784, 256, 128, 10}},
      {"1,1", 2, {1, 1}},
      {"1000000,2", 2, {1000000, 2}},
      {"007,3", 2, {7, 3}},
      {"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
       16,
       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
  };
  uint32_t sizes[MAXW + 4], n, c, i;
  char why[256];

  for (c = 0; c < COUNT(cases); c++) {
    why[0] = '\0';
    ck_assert_msg(gs_mlp_parse_layers(cases[c].s, sizes, COUNT(sizes), &n, why, sizeof(why)) == 0,
                  "\"%s\": %s", cases[c].s, why);
    ck_assert_uint_eq(n, cases[c].n);
    for (i = 0; i < n; i++)
      ck_assert_uint_eq(sizes[i], cases[c].sizes[i]);
  }
  /* Without a reason buffer. */
  ck_assert_int_eq(gs_mlp_parse_layers("3,2", sizes, 2, &n, NULL, 0), 0);
  ck_assert_uint_eq(n, 2);
}
END_TEST

START_TEST(parse_layers_bad)
{
  static const struct {
    const char *s, *want;
    uint32_t cap;
  } cases[] = {
      {"", "empty", 16},
      {NULL, "empty", 16},
      {"784", "at least 2 widths", 16},
      {"784,", "entry 2 is not a whole number", 16},
      {",10", "entry 1 is not a whole number", 16},
      {"784,,10", "entry 2 is not a whole number", 16},
      {"784,abc", "entry 2 is not a whole number", 16},
      {"784,10x", "entry 2 is not a whole number", 16},
      {"784, 10", "entry 2 is not a whole number", 16},
      {" 784,10", "entry 1 is not a whole number", 16},
      {"-5,10", "entry 1 is not a whole number", 16},
      {"+5,10", "entry 1 is not a whole number", 16},
      {"784;10", "entry 1 is not a whole number", 16},
      {"2.5,10", "entry 1 is not a whole number", 16},
      {"0,10", "entry 1 is outside 1..1000000", 16},
      {"10,1000001", "entry 2 is outside 1..1000000", 16},
      {"10,99999999999999999999999", "entry 2 is outside 1..1000000", 16},
      {"10,4294967297", "entry 2 is outside 1..1000000", 16},
      {"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "more than 16 widths", 20},
      {"3,4,5", "more than 2 widths", 2},
  };
  uint32_t sizes[MAXW + 4], n, c;
  char why[256];

  for (c = 0; c < COUNT(cases); c++) {
    memset(sizes, 0xab, sizeof(sizes));
    n = 12345;
    why[0] = '\0';
    ck_assert_msg(gs_mlp_parse_layers(cases[c].s, sizes, cases[c].cap, &n, why, sizeof(why)) ==
                      GS_EINVAL,
                  "\"%s\" accepted", cases[c].s ? cases[c].s : "(null)");
    ck_assert_msg(strstr(why, cases[c].want), "\"%s\": why = \"%s\", want \"%s\"",
                  cases[c].s ? cases[c].s : "(null)", why, cases[c].want);
    if (cases[c].s && *cases[c].s && strcmp(cases[c].want, "empty") != 0)
      ck_assert_msg(strstr(why, cases[c].s), "why = \"%s\" does not quote the list", why);
    /* Nothing written on failure. */
    ck_assert_uint_eq(n, 12345);
    ck_assert_uint_eq(sizes[0], 0xabababab);
    ck_assert_int_eq(gs_mlp_parse_layers(cases[c].s, sizes, cases[c].cap, &n, NULL, 0), GS_EINVAL);
  }
}
END_TEST

START_TEST(new_rejects)
{
  static const uint32_t ok[] = {4, 3, 2}, zero[] = {4, 0, 2}, wide[] = {4, 1000001, 2};
  static const uint32_t many[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  char why[256];

  why[0] = '\0';
  ck_assert_ptr_null(gs_mlp_new(cpu(), ok, 1, 8, why, sizeof(why)));
  ck_assert_msg(strstr(why, "2 to 16 layer widths"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), many, 17, 8, why, sizeof(why)));
  ck_assert_msg(strstr(why, "got 17"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), zero, 3, 8, why, sizeof(why)));
  ck_assert_msg(strstr(why, "layer width 0 (entry 2) is outside 1..1000000"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), wide, 3, 8, why, sizeof(why)));
  ck_assert_msg(strstr(why, "layer width 1000001 (entry 2)"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), ok, 3, 0, why, sizeof(why)));
  ck_assert_msg(strstr(why, "batch size 0"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), ok, 3, 0x80000000u, why, sizeof(why)));
  ck_assert_msg(strstr(why, "batch size 2147483648"), "%s", why);
  ck_assert_ptr_null(gs_mlp_new(cpu(), ok, 1, 8, NULL, 0));
  gs_mlp_free(NULL);
}
END_TEST

START_TEST(param_descs)
{
  static const uint32_t sizes[] = {784, 256, 128, 10};
  static const struct {
    const char *name;
    uint64_t elements;
  } want[] = {{"fc1.weight", 784 * 256}, {"fc1.bias", 256},    {"fc2.weight", 256 * 128},
              {"fc2.bias", 128},         {"fc3.weight", 1280}, {"fc3.bias", 10}};
  char why[256] = "";
  gs_mlp_t *m = gs_mlp_new(cpu(), sizes, COUNT(sizes), 64, why, sizeof(why));
  uint32_t i;

  ck_assert_msg(m, "%s", why);
  ck_assert_uint_eq(gs_mlp_param_count(m), COUNT(want));
  for (i = 0; i < COUNT(want); i++) {
    gs_param_desc_t d = gs_mlp_param_desc(m, i);

    ck_assert_str_eq(d.name, want[i].name);
    ck_assert_uint_eq(d.elements, want[i].elements);
    ck_assert_int_eq(d.dtype, GS_DTYPE_FLOAT32);
    ck_assert(gs_mlp_param_is_bias(m, i) == (i % 2 == 1));
  }
  ck_assert_ptr_null(gs_mlp_param_desc(m, COUNT(want)).name);
  ck_assert_uint_eq(gs_mlp_param_desc(m, COUNT(want)).elements, 0);
  ck_assert(!gs_mlp_param_is_bias(m, COUNT(want)));
  ck_assert(!gs_mlp_param_is_bias(m, COUNT(want) + 1));
  gs_mlp_free(m);
}
END_TEST

START_TEST(init_params)
{
  static const uint32_t sizes[] = {50, 20, 7};
  net_t a, b, c;
  uint64_t k, s = 0;
  uint32_t i;
  double seen_max = 0;

  net_new(&a, sizes, COUNT(sizes), 4);
  net_new(&b, sizes, COUNT(sizes), 4);
  net_new(&c, sizes, COUNT(sizes), 4);
  ck_assert_int_eq(gs_mlp_init_params(a.m, 7), 0);
  ck_assert_int_eq(gs_mlp_init_params(b.m, 7), 0);
  ck_assert_int_eq(gs_mlp_init_params(c.m, 8), 0);
  for (i = 0; i < a.np; i++) {
    double bound = 1.0 / sqrt(sizes[i / 2]); /* fan_in, for biases too */
    uint64_t same = 0;

    seen_max = 0;
    for (k = 0; k < net_elements(&a, i); k++) {
      ck_assert_msg(a.p[i][k] == b.p[i][k], "param %u[%llu] differs for one seed", i,
                    (unsigned long long)k);
      same += a.p[i][k] == c.p[i][k];
      ck_assert_msg(fabs(a.p[i][k]) <= bound * (1 + 1e-6), "param %u[%llu] = %g outside +-%g", i,
                    (unsigned long long)k, a.p[i][k], bound);
      seen_max = fmax(seen_max, fabs(a.p[i][k]));
    }
    ck_assert_msg(same == 0, "param %u: %llu values equal for seeds 7 and 8", i,
                  (unsigned long long)same);
    /* The values use the range: the largest is near the bound. */
    if (net_elements(&a, i) >= 20)
      ck_assert_msg(seen_max > 0.75 * bound, "param %u: max %g, bound %g", i, seen_max, bound);
  }
  /* The first draw of seed 0 is splitmix64's published first output. */
  ck_assert_int_eq(gs_mlp_init_params(a.m, 0), 0);
  ck_assert_float_eq(
      a.p[0][0],
      (float)((2.0 * (double)(0xE220A8397B1DCDAFull >> 40) * 0x1p-24 - 1.0) / sqrt(50.0)));
  /* And the stream runs through the tensors in forward order, each row-major. */
  for (i = 0; i < a.np; i++) {
    double bound = 1.0 / sqrt(sizes[i / 2]);

    for (k = 0; k < net_elements(&a, i); k++) {
      double u = (double)(gs_splitmix64(&s) >> 40) * 0x1p-24;

      ck_assert_float_eq(a.p[i][k], (float)(bound * (2.0 * u - 1.0)));
    }
  }
  net_free(&a);
  net_free(&b);
  net_free(&c);
}
END_TEST

/* Forward on random nets: loss and hits as the reference, then, one example
 * at a time, the softmax (read back as the top bias gradient, p - onehot
 * for a batch of one) as the reference's. */
static void check_forward(const uint32_t *sizes, uint32_t n, uint32_t batch, uint32_t max_batch,
                          uint64_t seed)
{
  uint32_t in = sizes[0], c = sizes[n - 1], i, o, hits, ref_hits;
  float *x = malloc((size_t)batch * in * sizeof(float)), loss;
  uint8_t *y = malloc(batch);
  uint64_t rng = seed;
  net_t t;
  ref_t r;
  double want;

  net_new(&t, sizes, n, max_batch);
  net_randomize(&t, &rng, 1.0);
  random_batch(&rng, x, y, batch, in, c);
  ref_new(&r, &t, x, batch);
  want = ref_forward(&r, y, &ref_hits);
  loss = gs_mlp_forward(t.m, x, y, batch, &hits);
  ck_assert_msg(fabs(loss - want) <= 1e-5 * fmax(1.0, want), "loss %.9g, reference %.9g", loss,
                want);
  ck_assert_uint_eq(hits, ref_hits);
  ck_assert_float_eq(gs_mlp_forward(t.m, x, y, batch, NULL), loss); /* repeatable */
  for (i = 0; i < batch; i++) {
    const double *z = r.a[n - 1] + (size_t)i * c;
    double sum = 0, li;
    uint32_t h1;

    for (o = 0; o < c; o++)
      sum += exp(z[o]);
    li = log(sum) - z[y[i]];
    loss = gs_mlp_forward(t.m, x + (size_t)i * in, y + i, 1, &h1);
    ck_assert_msg(fabs(loss - li) <= 1e-5 * fmax(1.0, li), "example %u: loss %.9g, ref %.9g", i,
                  loss, li);
    gs_mlp_backward(t.m, x + (size_t)i * in, NULL, NULL);
    for (o = 0; o < c; o++) {
      double p = exp(z[o]) / sum - (o == y[i]);

      ck_assert_msg(fabs(t.g[2 * n - 3][o] - p) <= 2e-6, "example %u: softmax %u %.9g, ref %.9g", i,
                    o, t.g[2 * n - 3][o], p);
    }
  }
  ref_free(&r);
  net_free(&t);
  free(x);
  free(y);
}

START_TEST(forward_matches_reference)
{
  static const uint32_t a[] = {6, 5, 4, 3}, b[] = {3, 7, 2}, one[] = {4, 3},
                        deep[] = {5, 9, 1, 8, 6};
  static const uint32_t mnist[] = {784, 64, 10};

  check_forward(a, COUNT(a), 4, 4, 1);
  check_forward(a, COUNT(a), 3, 8, 2); /* a batch under max_batch */
  check_forward(b, COUNT(b), 5, 5, 3);
  check_forward(one, COUNT(one), 3, 3, 4);
  check_forward(deep, COUNT(deep), 6, 7, 5);
  check_forward(mnist, COUNT(mnist), 16, 32, 6);
}
END_TEST

/* A softmax far into exp's overflow range stays finite. */
START_TEST(forward_stable)
{
  static const uint32_t sizes[] = {1, 3};
  float x[2] = {1, 1}, loss;
  uint8_t y[2] = {0, 2};
  uint32_t hits;
  net_t t;

  net_new(&t, sizes, COUNT(sizes), 2);
  t.p[0][0] = 1000, t.p[0][1] = 999, t.p[0][2] = -1000; /* logits 1000, 999, -1000 */
  t.p[1][0] = t.p[1][1] = t.p[1][2] = 0;
  loss = gs_mlp_forward(t.m, x, y, 2, &hits);
  /* Example 0: log(1 + e^-1); example 1: 2000 + log(1 + e^-1). */
  ck_assert_double_eq_tol(loss, (2 * log1p(exp(-1.0)) + 2000) / 2, 1e-3);
  ck_assert_uint_eq(hits, 1);
  gs_mlp_backward(t.m, x, NULL, NULL);
  for (uint32_t k = 0; k < 3; k++)
    ck_assert(isfinite(t.g[0][k]) && isfinite(t.g[1][k]));
  /* Equal logits: uniform softmax, and the argmax is the first class. */
  t.p[0][0] = t.p[0][1] = t.p[0][2] = 0;
  ck_assert_double_eq_tol(gs_mlp_forward(t.m, x, y, 2, &hits), log(3.0), 1e-6);
  ck_assert_uint_eq(hits, 1);
  net_free(&t);
}
END_TEST

static void count_ready(void *arg, uint32_t i)
{
  uint32_t *calls = arg;

  calls[i]++;
}

START_TEST(forward_bad_input)
{
  static const uint32_t sizes[] = {3, 4, 2};
  float x[4 * 3] = {0};
  uint8_t y[4] = {0, 1, 0, 1};
  uint32_t calls[4] = {0}, hits = 99, i;
  uint64_t rng = 11;
  net_t t;

  net_new(&t, sizes, COUNT(sizes), 4);
  net_randomize(&t, &rng, 1.0);
  ck_assert(isnan(gs_mlp_forward(t.m, x, y, 0, &hits)));
  ck_assert_uint_eq(hits, 0);
  ck_assert(isnan(gs_mlp_forward(t.m, x, y, 5, NULL)));
  ck_assert(!isnan(gs_mlp_forward(t.m, x, y, 4, NULL)));
  y[2] = 2; /* only classes 0 and 1 */
  ck_assert(isnan(gs_mlp_forward(t.m, x, y, 4, &hits)));
  y[2] = 0;
  /* Backward after a failed forward: zero gradients, each announced once. */
  ck_assert(isnan(gs_mlp_forward(t.m, x, y, 0, NULL)));
  net_poison_grads(&t);
  gs_mlp_backward(t.m, x, count_ready, calls);
  for (i = 0; i < t.np; i++) {
    ck_assert_uint_eq(calls[i], 1);
    for (uint64_t k = 0; k < net_elements(&t, i); k++)
      ck_assert(t.g[i][k] == 0.0f);
  }
  /* An unbound parameter fails the forward. */
  gs_mlp_bind(t.m, 2, NULL, t.g[2]);
  ck_assert(isnan(gs_mlp_forward(t.m, x, y, 4, NULL)));
  gs_mlp_bind(t.m, 99, t.p[0], t.g[0]); /* out of range: ignored */
  gs_mlp_bind(t.m, 2, t.p[2], t.g[2]);
  ck_assert(!isnan(gs_mlp_forward(t.m, x, y, 4, NULL)));
  net_free(&t);
}
END_TEST

/* Backward on a random net against the reference backward (itself checked
 * against finite differences); gradients start as NaN so each must be
 * overwritten. */
static void check_backward(const uint32_t *sizes, uint32_t n, uint32_t batch, uint64_t seed,
                           bool fd)
{
  uint32_t in = sizes[0];
  float *x = malloc((size_t)batch * in * sizeof(float));
  uint8_t *y = malloc(batch);
  uint64_t rng = seed;
  net_t t;
  ref_t r;

  net_new(&t, sizes, n, batch + 2);
  net_randomize(&t, &rng, 0.8);
  random_batch(&rng, x, y, batch, in, sizes[n - 1]);
  ref_new(&r, &t, x, batch);
  if (fd)
    ref_check_fd(&r, y);
  ref_forward(&r, y, NULL);
  ref_backward(&r, y);
  net_poison_grads(&t);
  ck_assert(isfinite(gs_mlp_forward(t.m, x, y, batch, NULL)));
  gs_mlp_backward(t.m, x, NULL, NULL);
  expect_grads(&t, &r, "backward");
  ref_free(&r);
  net_free(&t);
  free(x);
  free(y);
}

START_TEST(backward_matches_reference)
{
  static const uint32_t a[] = {6, 5, 4, 3}, b[] = {3, 7, 2}, one[] = {4, 3},
                        deep[] = {5, 9, 1, 8, 6};
  static const uint32_t mnist[] = {784, 64, 10};

  check_backward(a, COUNT(a), 4, 21, true);
  check_backward(a, COUNT(a), 1, 22, true);
  check_backward(b, COUNT(b), 5, 23, true);
  check_backward(one, COUNT(one), 3, 24, true);
  check_backward(deep, COUNT(deep), 6, 25, true);
  check_backward(mnist, COUNT(mnist), 16, 26, false);
}
END_TEST

/* What the ready callback saw: the order of the calls, a copy of each
 * gradient when announced; it then wrecks the parameter (NaN) and the
 * gradient (a marker), as an optimizer or in-place allreduce could. */
typedef struct watch {
  net_t *t;
  uint32_t order[MAXP], calls;
  float *snap[MAXP];
} watch_t;

static void on_ready(void *arg, uint32_t i)
{
  watch_t *w = arg;
  uint64_t k, e = net_elements(w->t, i);

  ck_assert_uint_lt(i, w->t->np);
  ck_assert_uint_lt(w->calls, MAXP);
  w->order[w->calls++] = i;
  w->snap[i] = malloc(e * sizeof(float));
  memcpy(w->snap[i], w->t->g[i], e * sizeof(float));
  for (k = 0; k < e; k++) {
    w->t->p[i][k] = NAN;
    w->t->g[i][k] = 12345.0f;
  }
}

/* Announced last layer first, weight before bias: W_L, b_L, ..., W_1, b_1.
 * Each gradient is final when announced, and backward touches neither it
 * nor its parameter afterwards. */
START_TEST(ready_order)
{
  static const uint32_t sizes[] = {6, 5, 4, 3};
  static const uint32_t want[] = {4, 5, 2, 3, 0, 1};
  float x[4 * 6];
  uint8_t y[4];
  uint64_t rng = 31, k;
  watch_t w = {0};
  net_t t;
  ref_t r;
  uint32_t i;

  net_new(&t, sizes, COUNT(sizes), 4);
  net_randomize(&t, &rng, 0.8);
  random_batch(&rng, x, y, 4, 6, 3);
  ref_new(&r, &t, x, 4);
  ref_forward(&r, y, NULL);
  ref_backward(&r, y);
  w.t = &t;
  ck_assert(isfinite(gs_mlp_forward(t.m, x, y, 4, NULL)));
  gs_mlp_backward(t.m, x, on_ready, &w);
  ck_assert_uint_eq(w.calls, COUNT(want));
  for (i = 0; i < COUNT(want); i++)
    ck_assert_uint_eq(w.order[i], want[i]);
  for (i = 0; i < t.np; i++) {
    for (k = 0; k < net_elements(&t, i); k++) {
      ck_assert_msg(t.g[i][k] == 12345.0f, "%s[%llu] written after it was announced",
                    gs_mlp_param_desc(t.m, i).name, (unsigned long long)k);
      t.g[i][k] = w.snap[i][k];
    }
    free(w.snap[i]);
  }
  expect_grads(&t, &r, "at announcement");
  ref_free(&r);
  net_free(&t);
}
END_TEST

/* Four Gaussian-ish clusters in 4-D, class = nearest centre: separable. */
START_TEST(training_learns)
{
  enum { N = 128, IN = 4, C = 4, STEPS = 300 };
  static const uint32_t sizes[] = {IN, 16, C};
  static const float centre[C][IN] = {{1, 1, 0, 0}, {-1, 1, 0, 0}, {0, -1, 1, 0}, {0, -1, -1, 1}};
  float x[N * IN], first = 0, loss = 0;
  uint8_t y[N];
  uint64_t rng = 41, k;
  uint32_t i, j, s, hits = 0;
  net_t t;

  for (i = 0; i < N; i++) {
    y[i] = (uint8_t)(i % C);
    for (j = 0; j < IN; j++)
      x[i * IN + j] = centre[y[i]][j] + 0.3f * (float)uniform(&rng);
  }
  net_new(&t, sizes, COUNT(sizes), N);
  ck_assert_int_eq(gs_mlp_init_params(t.m, 1), 0);
  for (s = 0; s < STEPS; s++) {
    loss = gs_mlp_forward(t.m, x, y, N, &hits);
    if (s == 0)
      first = loss;
    gs_mlp_backward(t.m, x, NULL, NULL);
    for (i = 0; i < t.np; i++)
      for (k = 0; k < net_elements(&t, i); k++)
        t.p[i][k] -= 0.1f * t.g[i][k];
  }
  loss = gs_mlp_forward(t.m, x, y, N, &hits);
  ck_assert_msg(first > 1.0f && loss < 0.1f * first, "loss %g -> %g", first, loss);
  ck_assert_msg(hits == N, "%u of %u right", hits, N);
  net_free(&t);
}
END_TEST

/* The inputs from pixel bytes: every value v becomes v / 255, in [0, 1]. */
START_TEST(inputs_from_pixels)
{
  static const uint32_t sizes[] = {256, 2};
  uint8_t px[256];
  float x[256];
  net_t t;

  for (int v = 0; v < 256; v++) {
    px[v] = (uint8_t)(255 - v);
    x[v] = NAN;
  }
  net_new(&t, sizes, COUNT(sizes), 1);
  gs_mlp_inputs_from_pixels(t.m, px, x, 256);
  ck_assert_int_eq(gs_device_sync(cpu()), 0);
  for (int v = 0; v < 256; v++)
    ck_assert_msg(x[v] == (float)px[v] / 255.0f && x[v] >= 0.0f && x[v] <= 1.0f,
                  "pixel %u became %.9g", px[v], x[v]);
  ck_assert_float_eq(x[0], 1.0f);
  ck_assert_float_eq(x[255], 0.0f);
  net_free(&t);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *mlp_suite(void)
{
  Suite *s = suite_create("mlp");

  suite_add_tcase(s, tcase("parse_layers_good", parse_layers_good));
  suite_add_tcase(s, tcase("parse_layers_bad", parse_layers_bad));
  suite_add_tcase(s, tcase("new_rejects", new_rejects));
  suite_add_tcase(s, tcase("param_descs", param_descs));
  suite_add_tcase(s, tcase("init_params", init_params));
  suite_add_tcase(s, tcase("forward_matches_reference", forward_matches_reference));
  suite_add_tcase(s, tcase("forward_stable", forward_stable));
  suite_add_tcase(s, tcase("forward_bad_input", forward_bad_input));
  suite_add_tcase(s, tcase("backward_matches_reference", backward_matches_reference));
  suite_add_tcase(s, tcase("ready_order", ready_order));
  suite_add_tcase(s, tcase("training_learns", training_learns));
  suite_add_tcase(s, tcase("inputs_from_pixels", inputs_from_pixels));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {mlp_suite}};
