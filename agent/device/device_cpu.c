/* The CPU device: OpenBLAS GEMMs and plain loops the compiler vectorizes.
 * Work runs at once on the calling thread, so sync has nothing to wait for
 * and device memory is host memory. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "vectorize.h"

#define CPU_ALIGN 64 /* bytes: buffers start on cache lines */

static void *cpu_alloc(gs_device_t *d, size_t bytes)
{
  void *p = NULL;

  if (posix_memalign(&p, CPU_ALIGN, bytes ? bytes : CPU_ALIGN) != 0) {
    GS_LOG_ERR(d->log, "cpu device: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

static void cpu_free(gs_device_t *d, void *p)
{
  (void)d;
  free(p);
}

static int cpu_copy(gs_device_t *d, void *dst, const void *src, size_t bytes)
{
  (void)d;
  if (dst != src)
    memmove(dst, src, bytes);
  return 0;
}

static int cpu_zero(gs_device_t *d, void *p, size_t bytes)
{
  (void)d;
  memset(p, 0, bytes);
  return 0;
}

/* h[i][j] += b[j] over m rows of n, then ReLU when `relu`. */
GS_WIDE static void add_bias(float *restrict h, const float *restrict b, uint32_t m, uint32_t n,
                             bool relu)
{
  for (uint32_t i = 0; i < m; i++, h += n) {
    if (relu) {
      for (uint32_t j = 0; j < n; j++) {
        float v = h[j] + b[j];

        h[j] = v < 0.0f ? 0.0f : v; /* NaN stays NaN */
      }
    } else {
      for (uint32_t j = 0; j < n; j++)
        h[j] += b[j];
    }
  }
}

/* g[j] = sum over m rows of dy[i][j]. */
GS_WIDE static void column_sums(const float *restrict dy, float *restrict g, uint32_t m, uint32_t n)
{
  memset(g, 0, n * sizeof(float));
  for (uint32_t i = 0; i < m; i++, dy += n)
    for (uint32_t j = 0; j < n; j++)
      g[j] += dy[j];
}

/* dx[e] = 0 where x[e] <= 0 (ReLU's backward: x is the ReLU's output). */
GS_WIDE static void relu_mask(float *restrict dx, const float *restrict x, size_t total)
{
  for (size_t e = 0; e < total; e++)
    dx[e] = x[e] > 0.0f ? dx[e] : 0.0f;
}

/* y = x W^T, then one pass adding the bias and, when `relu`, clamping. */
static void cpu_linear_forward(gs_device_t *d, const float *x, const float *w, const float *b,
                               float *y, uint32_t m, uint32_t n, uint32_t k, bool relu)
{
  (void)d;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
              (int)k, 0.0f, y, (int)n);
  add_bias(y, b, m, n, relu);
}

/* gw = dy^T x, gb = column sums of dy, dx = (dy W) masked where x <= 0. */
static void cpu_linear_backward(gs_device_t *d, const float *x, const float *w, const float *dy,
                                float *gw, float *gb, float *dx, uint32_t m, uint32_t n,
                                uint32_t k)
{
  (void)d;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)k, (int)m, 1.0f, dy, (int)n, x,
              (int)k, 0.0f, gw, (int)k);
  column_sums(dy, gb, m, n);
  if (!dx)
    return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)k, (int)n, 1.0f, dy, (int)n,
              w, (int)k, 0.0f, dx, (int)k);
  relu_mask(dx, x, (size_t)m * k);
}

/* One row: writes (softmax - onehot) * scale into dz and returns the loss
 * (NaN for a label out of range); *argmax is the first maximal logit. */
static double row_xent(const float *z, float *dz, uint32_t c, uint32_t y, float scale,
                       uint32_t *argmax)
{
  float max = z[0];
  double sum = 0.0;
  uint32_t best = 0;

  for (uint32_t j = 1; j < c; j++) {
    if (z[j] > max) {
      max = z[j];
      best = j;
    }
  }
  for (uint32_t j = 0; j < c; j++) {
    float e = expf(z[j] - max);

    dz[j] = e;
    sum += e;
  }
  for (uint32_t j = 0; j < c; j++)
    dz[j] = (float)(dz[j] / sum) * scale;
  *argmax = best;
  if (y >= c)
    return NAN;
  dz[y] -= scale;
  return log(sum) - ((double)z[y] - max);
}

static void cpu_softmax_xent(gs_device_t *d, const float *z, const uint8_t *y, float *dz,
                             uint32_t m, uint32_t c, float *stats)
{
  double loss = 0.0;
  uint32_t hits = 0;

  (void)d;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t argmax;

    loss += row_xent(z + (size_t)i * c, dz + (size_t)i * c, c, y[i], 1.0f / (float)m, &argmax);
    hits += argmax == y[i];
  }
  stats[0] += (float)loss;
  stats[1] += (float)hits;
}

static void cpu_sgd_pack(gs_device_t *d, const gs_sgd_config_t *c, float lr, float grad_scale,
                         const gs_sgd_segment_t *segs, uint32_t nseg, float *param,
                         const float *grad, float *momentum)
{
  (void)d;
  gs_sgd_step_pack(c, lr, grad_scale, segs, nseg, param, grad, momentum);
}

static int cpu_sync(gs_device_t *d)
{
  (void)d;
  return 0;
}

static void cpu_destroy(gs_device_t *d)
{
  free(d);
}

static const gs_device_ops_t cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .softmax_xent = cpu_softmax_xent,
    .sgd_pack = cpu_sgd_pack,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

gs_device_t *gs__device_cpu_new(const gs_log_t *log, char *why, size_t why_len)
{
  gs_device_t *d = calloc(1, sizeof(*d));

  if (!d) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  d->ops = &cpu_ops;
  d->log = log;
  d->host_memory = true;
  snprintf(d->label, sizeof(d->label), "cpu");
  return d;
}
