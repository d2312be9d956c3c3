/* The MLP's kernels on the cpu device: OpenBLAS GEMMs and plain loops the
 * compiler vectorizes (built with -O3, see vectorize.h). They run at once
 * on the calling thread and cannot fail. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vectorize.h"

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
static void cpu_linear_forward(gs_kernels_t *kn, const float *x, const float *w, const float *b,
                               float *y, uint32_t m, uint32_t n, uint32_t k, bool relu)
{
  (void)kn;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
              (int)k, 0.0f, y, (int)n);
  add_bias(y, b, m, n, relu);
}

/* gw = dy^T x, gb = column sums of dy, dx = (dy W) masked where x <= 0. */
static void cpu_linear_backward(gs_kernels_t *kn, const float *x, const float *w, const float *dy,
                                float *gw, float *gb, float *dx, uint32_t m, uint32_t n, uint32_t k)
{
  (void)kn;
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

static void cpu_softmax_xent(gs_kernels_t *kn, const float *z, const uint8_t *y, float *dz,
                             uint32_t m, uint32_t c, float *stats)
{
  double loss = 0.0;
  uint32_t hits = 0;

  (void)kn;
  for (uint32_t i = 0; i < m; i++) {
    uint32_t argmax;

    loss += row_xent(z + (size_t)i * c, dz + (size_t)i * c, c, y[i], 1.0f / (float)m, &argmax);
    hits += argmax == y[i];
  }
  stats[0] += (float)loss;
  stats[1] += (float)hits;
}

static void cpu_pixels(gs_kernels_t *kn, const uint8_t *restrict src, float *restrict dst, size_t n)
{
  (void)kn;
  for (size_t i = 0; i < n; i++)
    dst[i] = (float)src[i] / 255.0f;
}

static void cpu_destroy(gs_kernels_t *k)
{
  free(k);
}

static const gs_kernels_ops_t cpu_kernels = {
    .device = "cpu",
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .softmax_xent = cpu_softmax_xent,
    .pixels = cpu_pixels,
    .destroy = cpu_destroy,
};

gs_kernels_t *gs__kernels_cpu_new(gs_device_t *dev, char *why, size_t why_len)
{
  gs_kernels_t *k = calloc(1, sizeof(*k));

  if (!k) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  k->ops = &cpu_kernels;
  k->dev = dev;
  return k;
}
