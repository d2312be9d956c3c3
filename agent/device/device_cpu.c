/* The CPU device: host memory and the fused optimizer loops (optim.c). Work runs at
 * once on the calling thread, so sync has nothing to wait for and device
 * memory is host memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "half.h"
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

static void cpu_optim_pack(gs_device_t *d, const gs_optim_step_t *s, const gs_optim_segment_t *segs,
                           uint32_t nseg, float *param, const float *grad, float *const *state)
{
  gs_optim_step_t open;

  (void)d;
  if (gs_optim_gate_open(s, &open))
    gs_optim_step_pack(&open, segs, nseg, param, grad, state);
}

static void cpu_scale(gs_device_t *d, float *x, size_t n, float factor)
{
  (void)d;
  gs_optim_scale(x, n, factor);
}

GS_WIDE static void cpu_narrow(gs_device_t *d, uint16_t *restrict dst, const float *restrict src,
                               size_t n, gs_dtype_t to)
{
  (void)d;
  if (to == GS_DTYPE_BFLOAT16)
    for (size_t i = 0; i < n; i++)
      dst[i] = gs_f32_to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; i++)
      dst[i] = gs_f32_to_f16(src[i]);
}

GS_WIDE static void cpu_widen(gs_device_t *d, float *restrict dst, const uint16_t *restrict src,
                              size_t n, gs_dtype_t from)
{
  (void)d;
  if (from == GS_DTYPE_BFLOAT16)
    for (size_t i = 0; i < n; i++)
      dst[i] = gs_bf16_to_f32(src[i]);
  else
    for (size_t i = 0; i < n; i++)
      dst[i] = gs_f16_to_f32(src[i]);
}

static void cpu_check_finite(gs_device_t *d, const float *g, size_t n, float *flag)
{
  (void)d;
  if (gs_optim_first_nonfinite(g, n) < n)
    *flag = 1.0f;
}

static void cpu_mark_nonfinite(gs_device_t *d, const float *x, float *v, uint32_t i, uint32_t j,
                               float w)
{
  (void)d;
  if (!isfinite(*x)) {
    v[i] += 1.0f;
    v[j] += w;
  }
}

/* Work on the cpu runs at once, so a caller's failure was already seen by
 * that caller: nothing sticks. */
static void cpu_fail(gs_device_t *d, int err)
{
  (void)d;
  (void)err;
}

static int cpu_sync(gs_device_t *d)
{
  (void)d;
  return 0;
}

/* Work runs at once: a fence is always passed. */
static int cpu_fence(gs_device_t *d, unsigned k)
{
  (void)d;
  (void)k;
  return 0;
}

static int cpu_fence_done(gs_device_t *d, unsigned k)
{
  (void)d;
  (void)k;
  return 1;
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
    .copy = cpu_copy,
    .optim_pack = cpu_optim_pack,
    .check_finite = cpu_check_finite,
    .mark_nonfinite = cpu_mark_nonfinite,
    .scale = cpu_scale,
    .narrow = cpu_narrow,
    .widen = cpu_widen,
    .fail = cpu_fail,
    .sync = cpu_sync,
    .fetch = cpu_copy,
    .fence = cpu_fence,
    .fence_done = cpu_fence_done,
    .fence_wait = cpu_fence,
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
  d->ordinal = -1;
  snprintf(d->label, sizeof(d->label), "cpu");
  return d;
}
