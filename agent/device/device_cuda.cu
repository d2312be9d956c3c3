/* The cuda device: memory, copies and the fused SGD kernel, all queued in
 * order on one non-blocking stream.
 *
 * Void operations cannot return an error, so the first one sticks to the
 * device (logged with file:line when it happens) and the next sync or
 * download returns and clears it; gs_device_fail adds a caller's failure
 * to the same. Kernels use grid-stride loops of 256 threads and 64-bit
 * indices, so any size works. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Our headers are C. */
extern "C" {
#include "device.h"
}

#include "cuda_check.h"

#define THREADS 256
#define MAX_BLOCKS 4096 /* grid-stride loops cover the rest */

/* A segment as the SGD kernel reads it: `start` is the sum of the counts
 * before it, so element v of the pack's flattened segments is found by a
 * binary search on start. */
typedef struct dev_seg {
  size_t offset, count, start;
  float lr_mult, weight_decay;
} dev_seg_t;

/* One pack's segment table, uploaded on first use and kept (the caller's
 * table is stable for the life of the pack). `host` is what was uploaded,
 * so a table reused at the same address with other contents is noticed. */
typedef struct seg_cache {
  const gs_sgd_segment_t *key;
  uint32_t nseg;
  size_t total;    /* elements in all segments */
  dev_seg_t *host; /* malloc'd */
  dev_seg_t *dev;  /* cudaMalloc'd */
} seg_cache_t;

typedef struct cuda_device {
  gs_device_t base;
  int index;
  cudaStream_t stream;
  bool own_stream; /* created here (else the caller's: gs_device_use_stream) */
  int sticky;      /* first error of a void operation since the last sync */
  seg_cache_t *tables;
  uint32_t ntables, cap_tables;
} cuda_device_t;

static cuda_device_t *cd(gs_device_t *d)
{
  return reinterpret_cast<cuda_device_t *>(d);
}

/* Keeps the first error; returns `err`. */
static int note(cuda_device_t *d, int err)
{
  if (err && !d->sticky)
    d->sticky = err;
  return err;
}

/* Makes this device current for the calling thread (launches on our
 * stream need it, and the caller's thread may be a new one). */
static int enter(cuda_device_t *d)
{
  return GS_CUDA_STATUS(d->base.log, cudaSetDevice(d->index));
}

/* Records a failed kernel launch with the caller's file:line. */
#define LAUNCHED(d) note((d), GS_CUDA_STATUS((d)->base.log, cudaGetLastError()))

static unsigned blocks_for(size_t threads)
{
  size_t b = (threads + THREADS - 1) / THREADS;

  return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* ---- kernels ---------------------------------------------------------- */

/* One SGD step over every segment of a pack (sgd.h): element v of the
 * flattened segments belongs to the last segment whose start is <= v
 * (empty segments share their start with the next, so they never match). */
static __global__ void sgd_kernel(const dev_seg_t *segs, uint32_t nseg, size_t total, float lr,
                                  float grad_scale, float momentum, bool nesterov, float *param,
                                  const float *grad, float *buf)
{
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < total;
       v += (size_t)gridDim.x * blockDim.x) {
    uint32_t lo = 0, hi = nseg - 1;

    while (lo < hi) {
      uint32_t mid = lo + (hi - lo + 1) / 2;

      if (segs[mid].start <= v)
        lo = mid;
      else
        hi = mid - 1;
    }
    size_t i = segs[lo].offset + (v - segs[lo].start);
    float seg_lr = lr * segs[lo].lr_mult;
    float p = param[i];
    float d = grad[i] * grad_scale + segs[lo].weight_decay * p;

    if (momentum == 0.0f) {
      param[i] = p - seg_lr * d;
    } else {
      float b = momentum * buf[i] + d;

      buf[i] = b;
      param[i] = p - seg_lr * (nesterov ? d + momentum * b : b);
    }
  }
}

/* ---- memory ----------------------------------------------------------- */

/* Zeroed with a wait, so work on any stream sees the zeros. */
static void *cuda_alloc(gs_device_t *base, size_t bytes)
{
  cuda_device_t *d = cd(base);
  size_t size = bytes ? bytes : THREADS; /* cudaMalloc(0) gives NULL */
  void *p = NULL;

  if (enter(d) || GS_CUDA_STATUS(base->log, cudaMalloc(&p, size)))
    goto out_fail;
  if (note(d, GS_CUDA_STATUS(base->log, cudaMemsetAsync(p, 0, size, d->stream))) ||
      note(d, GS_CUDA_STATUS(base->log, cudaStreamSynchronize(d->stream))))
    goto out_free;
  return p;

out_free:
  GS_CUDA_STATUS(base->log, cudaFree(p));
out_fail:
  GS_LOG_ERR(base->log, "%s: cannot allocate %zu bytes of device memory", base->label, bytes);
  return NULL;
}

static void cuda_free(gs_device_t *base, void *p)
{
  cuda_device_t *d = cd(base);

  if (!enter(d))
    note(d, GS_CUDA_STATUS(base->log, cudaFree(p)));
}

static void *cuda_host_alloc(gs_device_t *base, size_t bytes)
{
  size_t size = bytes ? bytes : THREADS;
  void *p = NULL;

  if (enter(cd(base)) || GS_CUDA_STATUS(base->log, cudaHostAlloc(&p, size, cudaHostAllocDefault))) {
    GS_LOG_ERR(base->log, "%s: cannot allocate %zu bytes of pinned host memory", base->label,
               bytes);
    return NULL;
  }
  memset(p, 0, size);
  return p;
}

static void cuda_host_free(gs_device_t *base, void *p)
{
  cuda_device_t *d = cd(base);

  if (!enter(d))
    note(d, GS_CUDA_STATUS(base->log, cudaFreeHost(p)));
}

static int cuda_upload(gs_device_t *base, void *dst, const void *src, size_t bytes)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (err)
    return err;
  GS_CUDA_CHECK(base->log, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream));
  return 0;
}

/* Returns the first error of anything queued before, or of the copy. */
static int cuda_sync(gs_device_t *base);

static int cuda_download(gs_device_t *base, void *dst, const void *src, size_t bytes)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (!err)
    err = GS_CUDA_STATUS(base->log,
                         cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream));
  note(d, err);
  return cuda_sync(base); /* the copy is done when the stream is; reports sticky errors */
}

static int cuda_zero(gs_device_t *base, void *p, size_t bytes)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (err)
    return err;
  GS_CUDA_CHECK(base->log, cudaMemsetAsync(p, 0, bytes, d->stream));
  return 0;
}

/* ---- SGD -------------------------------------------------------------- */

/* Whether the cached table still holds what `segs` says. */
static bool table_matches(const seg_cache_t *t, const gs_sgd_segment_t *segs, uint32_t nseg)
{
  if (t->nseg != nseg)
    return false;
  for (uint32_t s = 0; s < nseg; s++) {
    const dev_seg_t *h = &t->host[s];

    if (h->offset != segs[s].offset || h->count != segs[s].count || h->lr_mult != segs[s].lr_mult ||
        h->weight_decay != segs[s].weight_decay)
      return false;
  }
  return true;
}

/* Builds and uploads `t`'s table for segs (t->dev is free to reuse only
 * once queued kernels are done: the caller waits when it replaces one). */
static int table_fill(cuda_device_t *d, seg_cache_t *t, const gs_sgd_segment_t *segs, uint32_t nseg)
{
  size_t bytes = nseg * sizeof(dev_seg_t), start = 0;

  t->key = segs;
  t->nseg = nseg;
  t->host = (dev_seg_t *)malloc(bytes);
  if (!t->host)
    return GS_ENOMEM;
  for (uint32_t s = 0; s < nseg; s++) {
    t->host[s] =
        dev_seg_t{segs[s].offset, segs[s].count, start, segs[s].lr_mult, segs[s].weight_decay};
    start += segs[s].count;
  }
  t->total = start;
  GS_CUDA_CHECK(d->base.log, cudaMalloc(&t->dev, bytes));
  GS_CUDA_CHECK(d->base.log,
                cudaMemcpyAsync(t->dev, t->host, bytes, cudaMemcpyHostToDevice, d->stream));
  return 0;
}

/* Frees one table's buffers (not the entry). */
static void table_drop(cuda_device_t *d, seg_cache_t *t)
{
  if (t->dev)
    GS_CUDA_STATUS(d->base.log, cudaFree(t->dev));
  free(t->host);
  t->dev = NULL;
  t->host = NULL;
  t->nseg = 0;
}

/* The device copy of a pack's segment table: found by the host pointer,
 * made on first use. NULL on failure (recorded). */
static const seg_cache_t *table_for(cuda_device_t *d, const gs_sgd_segment_t *segs, uint32_t nseg)
{
  seg_cache_t *t = NULL;

  for (uint32_t i = 0; i < d->ntables && !t; i++)
    if (d->tables[i].key == segs)
      t = &d->tables[i];
  if (t && table_matches(t, segs, nseg))
    return t;
  if (t) {
    /* The address was reused for another pack: wait out kernels that read
     * the old table, then replace it. */
    note(d, GS_CUDA_STATUS(d->base.log, cudaStreamSynchronize(d->stream)));
    table_drop(d, t);
  } else {
    if (d->ntables == d->cap_tables) {
      uint32_t cap = d->cap_tables ? 2 * d->cap_tables : 8;
      seg_cache_t *more = (seg_cache_t *)realloc(d->tables, cap * sizeof(*more));

      if (!more) {
        note(d, GS_ENOMEM);
        return NULL;
      }
      d->tables = more;
      d->cap_tables = cap;
    }
    t = &d->tables[d->ntables++];
    memset(t, 0, sizeof(*t));
  }
  if (note(d, table_fill(d, t, segs, nseg))) {
    table_drop(d, t);
    t->key = NULL;
    return NULL;
  }
  return t;
}

static void cuda_sgd_pack(gs_device_t *base, const gs_sgd_config_t *c, float lr, float grad_scale,
                          const gs_sgd_segment_t *segs, uint32_t nseg, float *param,
                          const float *grad, float *momentum)
{
  cuda_device_t *d = cd(base);
  const seg_cache_t *t;

  if (nseg == 0 || note(d, enter(d)))
    return;
  if (c->momentum != 0.0f && !momentum) {
    GS_LOG_ERR(base->log, "%s: SGD with momentum %g needs a momentum buffer", base->label,
               c->momentum);
    note(d, GS_EINVAL);
    return;
  }
  t = table_for(d, segs, nseg);
  if (!t || t->total == 0)
    return;
  sgd_kernel<<<blocks_for(t->total), THREADS, 0, d->stream>>>(
      t->dev, nseg, t->total, lr, grad_scale, c->momentum, c->nesterov, param, grad, momentum);
  LAUNCHED(d);
}

/* ---- the device ------------------------------------------------------- */

static void cuda_fail(gs_device_t *base, int err)
{
  note(cd(base), err);
}

static int cuda_sync(gs_device_t *base)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (!err)
    err = GS_CUDA_STATUS(base->log, cudaStreamSynchronize(d->stream));
  if (d->sticky)
    err = d->sticky;
  d->sticky = 0;
  return err;
}

static void cuda_destroy(gs_device_t *base)
{
  cuda_device_t *d = cd(base);

  if (!enter(d))
    GS_CUDA_STATUS(base->log, cudaStreamSynchronize(d->stream));
  for (uint32_t i = 0; i < d->ntables; i++)
    table_drop(d, &d->tables[i]);
  free(d->tables);
  if (d->own_stream)
    GS_CUDA_STATUS(base->log, cudaStreamDestroy(d->stream));
  free(d);
}

/* Moves to the caller's stream: ours is drained first, so nothing queued
 * on it is lost, then destroyed. */
static int cuda_use_stream(gs_device_t *base, void *stream)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (!err)
    err = GS_CUDA_STATUS(base->log, cudaStreamSynchronize(d->stream));
  if (err)
    return err;
  if (d->own_stream)
    GS_CUDA_STATUS(base->log, cudaStreamDestroy(d->stream));
  d->stream = (cudaStream_t)stream;
  d->own_stream = false;
  d->base.stream = stream;
  return 0;
}

static const gs_device_ops_t cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .zero = cuda_zero,
    .sgd_pack = cuda_sgd_pack,
    .fail = cuda_fail,
    .sync = cuda_sync,
    .use_stream = cuda_use_stream,
    .destroy = cuda_destroy,
};

/* Asks the runtime directly, not through the check macros: "no driver" is
 * an answer here (0), never a logged error. Clears the error it leaves. */
extern "C" int gs__device_cuda_count(void)
{
  int n = 0;

  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/* Opens GPU `index` with its own stream; the caller
 * destroys it with gs_device_destroy. */
extern "C" gs_device_t *gs__device_cuda_new(int index, const gs_log_t *log, char *why,
                                            size_t why_len)
{
  int count = gs__device_cuda_count(), err;
  const char *what;
  cuda_device_t *d;

  if (index < 0 || index >= count) {
    snprintf(why, why_len, "no CUDA device %d (%d visible)", index, count);
    return NULL;
  }
  d = (cuda_device_t *)calloc(1, sizeof(*d));
  if (!d) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  d->base.ops = &cuda_ops;
  d->base.log = log;
  d->base.host_memory = false;
  d->base.ordinal = index;
  d->index = index;
  snprintf(d->base.label, sizeof(d->base.label), "cuda:%d", index);
  what = "cudaSetDevice";
  err = GS_CUDA_STATUS(log, cudaSetDevice(index));
  if (!err) {
    what = "cudaStreamCreateWithFlags";
    err = GS_CUDA_STATUS(log, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
  }
  if (err)
    goto out_free_device;
  d->own_stream = true;
  d->base.stream = (void *)d->stream;
  return &d->base;

out_free_device:
  snprintf(why, why_len, "cuda:%d: %s failed: %s (the log has the library's message)", index, what,
           gs_strerror(err));
  free(d);
  return NULL;
}
