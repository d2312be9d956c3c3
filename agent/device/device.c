/* Compute devices: opening one by name, and the thin wrappers that
 * dispatch through its ops table (see device.h). */
#include "device.h"

#include <stdio.h>
#include <string.h>

#ifndef GS_HAVE_CUDA
/* A CPU-only build: the cuda device does not exist. */
gs_device_t *gs__device_cuda_new(int index, const gs_log_t *log, char *why, size_t why_len)
{
  (void)index;
  (void)log;
  snprintf(why, why_len, "this build has no CUDA support (rebuild where nvcc and NCCL are found)");
  return NULL;
}

int gs__device_cuda_count(void)
{
  return 0;
}
#endif

bool gs_device_cuda_built(void)
{
#ifdef GS_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int gs_device_cuda_count(void)
{
  return gs__device_cuda_count();
}

bool gs_device_cuda_usable(char *why, size_t why_len)
{
  char reason[200] = "";
  gs_device_t *d;

  if (!gs_device_cuda_built()) {
    snprintf(why, why_len, "built without CUDA");
    return false;
  }
  if (gs_device_cuda_count() > 0)
    return true;
  d = gs_device_open("cuda", 0, NULL, reason, sizeof(reason));
  gs_device_destroy(d); /* NULL: no device to open; `reason` says what is missing */
  snprintf(why, why_len, "no CUDA device visible (%s)", reason);
  return false;
}

gs_device_t *gs_device_open(const char *name, int index, const gs_log_t *log, char *why,
                            size_t why_len)
{
  if (!name || strcmp(name, "auto") == 0)
    name = gs_device_cuda_count() > 0 ? "cuda" : "cpu";
  if (strcmp(name, "cpu") == 0)
    return gs__device_cpu_new(log, why, why_len);
  if (strcmp(name, "cuda") == 0) {
    int count = gs_device_cuda_count();

    if (gs_device_cuda_built() && (index < 0 || index >= count)) {
      snprintf(why, why_len, "no CUDA device %d (%d visible%s)", index, count,
               count ? "" : "; is the NVIDIA driver loaded and CUDA_VISIBLE_DEVICES right?");
      return NULL;
    }
    return gs__device_cuda_new(index, log, why, why_len);
  }
  snprintf(why, why_len, "unknown device '%s' (cpu, cuda or auto)", name);
  return NULL;
}

void gs_device_destroy(gs_device_t *d)
{
  if (d)
    d->ops->destroy(d);
}

void *gs_device_alloc(gs_device_t *d, size_t bytes)
{
  return d->ops->alloc(d, bytes);
}

void gs_device_free(gs_device_t *d, void *p)
{
  if (p)
    d->ops->free(d, p);
}

void *gs_device_host_alloc(gs_device_t *d, size_t bytes)
{
  return d->ops->host_alloc(d, bytes);
}

void gs_device_host_free(gs_device_t *d, void *p)
{
  if (p)
    d->ops->host_free(d, p);
}

int gs_device_upload(gs_device_t *d, void *dst, const void *src, size_t bytes)
{
  return bytes ? d->ops->upload(d, dst, src, bytes) : 0;
}

int gs_device_download(gs_device_t *d, void *dst, const void *src, size_t bytes)
{
  d->waits.reads++;
  return bytes ? d->ops->download(d, dst, src, bytes) : d->ops->sync(d);
}

int gs_device_zero(gs_device_t *d, void *p, size_t bytes)
{
  return bytes ? d->ops->zero(d, p, bytes) : 0;
}

int gs_device_copy(gs_device_t *d, void *dst, const void *src, size_t bytes)
{
  return bytes && dst != src ? d->ops->copy(d, dst, src, bytes) : 0;
}

void gs_device_optim_pack(gs_device_t *d, const gs_optim_step_t *s, const gs_optim_segment_t *segs,
                          uint32_t nseg, float *param, const float *grad, float *const *state)
{
  d->ops->optim_pack(d, s, segs, nseg, param, grad, state);
}

void gs_device_check_finite(gs_device_t *d, const float *g, size_t n, float *flag)
{
  if (n)
    d->ops->check_finite(d, g, n, flag);
}

void gs_device_mark_nonfinite(gs_device_t *d, const float *x, float *v, uint32_t i, uint32_t j,
                              float w)
{
  d->ops->mark_nonfinite(d, x, v, i, j, w);
}

void gs_device_scale(gs_device_t *d, float *x, size_t n, float factor)
{
  if (n)
    d->ops->scale(d, x, n, factor);
}

void gs_device_narrow(gs_device_t *d, uint16_t *dst, const float *src, size_t n, gs_dtype_t to)
{
  if (n)
    d->ops->narrow(d, dst, src, n, to);
}

void gs_device_widen(gs_device_t *d, float *dst, const uint16_t *src, size_t n, gs_dtype_t from)
{
  if (n)
    d->ops->widen(d, dst, src, n, from);
}

void gs_device_fail(gs_device_t *d, int err)
{
  if (err)
    d->ops->fail(d, err);
}

int gs_device_sync(gs_device_t *d)
{
  d->waits.syncs++;
  return d->ops->sync(d);
}

int gs_device_fetch(gs_device_t *d, void *dst, const void *src, size_t bytes)
{
  return bytes ? d->ops->fetch(d, dst, src, bytes) : 0;
}

int gs_device_fence(gs_device_t *d, unsigned k)
{
  return k < GS_DEVICE_FENCES ? d->ops->fence(d, k) : GS_EINVAL;
}

int gs_device_fence_done(gs_device_t *d, unsigned k)
{
  return k < GS_DEVICE_FENCES ? d->ops->fence_done(d, k) : GS_EINVAL;
}

int gs_device_fence_wait(gs_device_t *d, unsigned k, bool drains)
{
  int done = gs_device_fence_done(d, k);

  if (done != 0)
    return done < 0 ? done : 0;
  if (drains)
    d->waits.syncs++;
  return d->ops->fence_wait(d, k);
}

int gs_device_fetched(gs_device_t *d)
{
  int err = gs_device_fence(d, GS_DEVICE_FENCES - 1);

  return err ? err : gs_device_fence_wait(d, GS_DEVICE_FENCES - 1, true);
}

int gs_device_use_stream(gs_device_t *d, void *stream)
{
  return d->ops->use_stream ? d->ops->use_stream(d, stream) : GS_EINVAL;
}
