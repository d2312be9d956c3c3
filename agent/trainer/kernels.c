/* The MLP's kernels: picking the table for a device, and the thin wrappers
 * that dispatch through it (see kernels.h). */
#include "kernels.h"

#include <stdio.h>
#include <string.h>

#ifndef GS_HAVE_CUDA
/* A CPU-only build has no cuda device, so no cuda kernels either. */
gs_kernels_t *gs__kernels_cuda_new(gs_device_t *dev, char *why, size_t why_len)
{
  (void)dev;
  snprintf(why, why_len, "this build has no CUDA support");
  return NULL;
}
#endif

gs_kernels_t *gs_kernels_new(gs_device_t *dev, char *why, size_t why_len)
{
  const char *kind = dev->ops->name;

  if (strcmp(kind, "cpu") == 0)
    return gs__kernels_cpu_new(dev, why, why_len);
  if (strcmp(kind, "cuda") == 0)
    return gs__kernels_cuda_new(dev, why, why_len);
  snprintf(why, why_len, "no MLP kernels for device kind '%s'", kind);
  return NULL;
}

void gs_kernels_free(gs_kernels_t *k)
{
  if (k)
    k->ops->destroy(k);
}

void gs_kernels_linear_forward(gs_kernels_t *kn, const float *x, const float *w, const float *b,
                               float *y, uint32_t m, uint32_t n, uint32_t k, bool relu)
{
  kn->ops->linear_forward(kn, x, w, b, y, m, n, k, relu);
}

void gs_kernels_linear_backward(gs_kernels_t *kn, const float *x, const float *w, const float *dy,
                                float *gw, float *gb, float *dx, uint32_t m, uint32_t n, uint32_t k)
{
  kn->ops->linear_backward(kn, x, w, dy, gw, gb, dx, m, n, k);
}

void gs_kernels_softmax_xent(gs_kernels_t *kn, const float *z, const uint8_t *y, float *dz,
                             uint32_t m, uint32_t c, float *stats)
{
  kn->ops->softmax_xent(kn, z, y, dz, m, c, stats);
}

void gs_kernels_pixels(gs_kernels_t *kn, const uint8_t *src, float *dst, size_t n)
{
  kn->ops->pixels(kn, src, dst, n);
}
