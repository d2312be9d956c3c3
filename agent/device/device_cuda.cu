/* The cuda device: memory, copies and the fused optimizer kernel, all
 * queued in order on one non-blocking stream.
 *
 * Void operations cannot return an error, so the first one sticks to the
 * device (logged with file:line when it happens) and the next sync or
 * download returns and clears it; gs_device_fail adds a caller's failure
 * to the same. Kernels use grid-stride loops of 256 threads and 64-bit
 * indices, so any size works. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

/* A segment as the optimizer kernel reads it: `start` is the sum of the
 * counts before it, so element v of the pack's flattened segments is found
 * by a binary search on start. */
typedef struct dev_seg {
  size_t offset, count, start;
  uint32_t group;
} dev_seg_t;

/* One pack's segment table, uploaded on first use and kept (the caller's
 * table is stable for the life of the pack). `host` is what was uploaded,
 * so a table reused at the same address with other contents is noticed. */
typedef struct seg_cache {
  const gs_optim_segment_t *key;
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
  /* The groups' constants of the step, uploaded before each pack's kernel
   * (stream order keeps a kernel's from being overwritten early). */
  gs_optim_coef_t *coef_host, *coef_dev;
  uint32_t cap_coef;
  /* gs_device_fence's events (created on first use), and which are
   * recorded and not yet seen done. */
  cudaEvent_t fence[GS_DEVICE_FENCES];
  bool fence_pending[GS_DEVICE_FENCES];
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

/* The segment element v of a pack's flattened segments belongs to: the
 * last whose start is <= v (empty segments share their start with the
 * next, so they never match). */
static __device__ uint32_t segment_of(const dev_seg_t *segs, uint32_t nseg, size_t v)
{
  uint32_t lo = 0, hi = nseg - 1;

  while (lo < hi) {
    uint32_t mid = lo + (hi - lo + 1) / 2;

    if (segs[mid].start <= v)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* One optimizer step over every segment of a pack (optim.h's arithmetic,
 * element for element as optim.c), unless the gate says skip (the step's
 * gradients held a NaN or an infinity; a loss scaler's found_inf); the
 * gate's factor (clipping's) multiplies the gradients as gs_optim_gate_open
 * folds it into the scale. */
static __global__ void optim_kernel(const dev_seg_t *segs, uint32_t nseg, size_t total,
                                    const gs_optim_coef_t *coefs, bool adam, float *param,
                                    const float *grad, float *s0, float *s1, float *s2,
                                    gs_optim_gate_t gate)
{
  float factor = gate.factor ? *gate.factor : 1.0f;

  if ((gate.skip && *gate.skip != 0.0f) || (gate.veto && *gate.veto != 0.0f))
    return;
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < total;
       v += (size_t)gridDim.x * blockDim.x) {
    const dev_seg_t *sg = &segs[segment_of(segs, nseg, v)];
    const gs_optim_coef_t c = coefs[sg->group];
    size_t i = sg->offset + (v - sg->start);
    float p = param[i];
    float g = grad[i] * (c.scale * factor) + c.wd * p;

    if (adam) {
      float vi;

      p *= c.decay;
      s0[i] = s0[i] * c.b1 + c.c1 * g;
      vi = s1[i] * c.b2 + c.c2 * g * g;
      s1[i] = vi;
      if (c.amsgrad && s2) {
        vi = fmaxf(s2[i], vi);
        s2[i] = vi;
      }
      param[i] = p + c.neg_step * (s0[i] / (sqrtf(vi) / c.bc2_sqrt + c.eps));
    } else if (c.mom == 0.0f) {
      param[i] = p - c.lr * g;
    } else {
      float b = c.m * s0[i] + c.keep * g;

      s0[i] = b;
      param[i] = p - c.lr * (c.nesterov ? g + c.mom * b : b);
    }
  }
}

static __global__ void scale_kernel(float *x, size_t n, float factor)
{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= factor;
}

/* Gradients to and from a 16-bit float (to nearest even, as the CPU's). */
static __global__ void narrow_kernel(uint16_t *dst, const float *src, size_t n, bool bf16)
{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(src[i]))
                  : __half_as_ushort(__float2half_rn(src[i]));
}

static __global__ void widen_kernel(float *dst, const uint16_t *src, size_t n, bool bf16)
{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = bf16 ? __bfloat162float(__ushort_as_bfloat16(src[i]))
                  : __half2float(__ushort_as_half(src[i]));
}

/* Sets *flag when g[0..n) holds a NaN or an infinity. */
static __global__ void check_finite_kernel(const float *g, size_t n, float *flag)
{
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    if (!isfinite(g[i]))
      *flag = 1.0f;
}

/* A loss's verdict into the control vector (one thread). */
static __global__ void mark_nonfinite_kernel(const float *x, float *v, uint32_t i, uint32_t j,
                                             float w)
{
  if (!isfinite(*x)) {
    v[i] += 1.0f;
    v[j] += w;
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

static int cuda_copy(gs_device_t *base, void *dst, const void *src, size_t bytes)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (err)
    return err;
  GS_CUDA_CHECK(base->log, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream));
  return 0;
}

/* ---- the optimizer ---------------------------------------------------- */

/* Whether the cached table still holds what `segs` says. */
static bool table_matches(const seg_cache_t *t, const gs_optim_segment_t *segs, uint32_t nseg)
{
  if (t->nseg != nseg)
    return false;
  for (uint32_t s = 0; s < nseg; s++) {
    const dev_seg_t *h = &t->host[s];

    if (h->offset != segs[s].offset || h->count != segs[s].count || h->group != segs[s].group)
      return false;
  }
  return true;
}

/* Builds and uploads `t`'s table for segs (t->dev is free to reuse only
 * once queued kernels are done: the caller waits when it replaces one). */
static int table_fill(cuda_device_t *d, seg_cache_t *t, const gs_optim_segment_t *segs,
                      uint32_t nseg)
{
  size_t bytes = nseg * sizeof(dev_seg_t), start = 0;

  t->key = segs;
  t->nseg = nseg;
  t->host = (dev_seg_t *)malloc(bytes);
  if (!t->host)
    return GS_ENOMEM;
  for (uint32_t s = 0; s < nseg; s++) {
    t->host[s] = dev_seg_t{segs[s].offset, segs[s].count, start, segs[s].group};
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
static const seg_cache_t *table_for(cuda_device_t *d, const gs_optim_segment_t *segs, uint32_t nseg)
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

/* Uploads the groups' constants of this step (room grown after a wait,
 * since queued kernels may still read the old buffer). */
static int coefs_upload(cuda_device_t *d, const gs_optim_step_t *s)
{
  size_t bytes = s->ngroups * sizeof(gs_optim_coef_t);

  if (s->ngroups > d->cap_coef) {
    gs_optim_coef_t *host = (gs_optim_coef_t *)realloc(d->coef_host, bytes);

    if (!host)
      return GS_ENOMEM;
    d->coef_host = host;
    GS_CUDA_CHECK(d->base.log, cudaStreamSynchronize(d->stream));
    if (d->coef_dev)
      GS_CUDA_CHECK(d->base.log, cudaFree(d->coef_dev));
    d->coef_dev = NULL;
    GS_CUDA_CHECK(d->base.log, cudaMalloc(&d->coef_dev, bytes));
    d->cap_coef = s->ngroups;
  }
  for (uint32_t g = 0; g < s->ngroups; g++)
    gs_optim_coef(s, &s->groups[g], &d->coef_host[g]);
  /* From pageable memory: the call returns once the bytes are staged, so
   * the host array is free for the next pack's constants. */
  GS_CUDA_CHECK(d->base.log, cudaMemcpyAsync(d->coef_dev, d->coef_host, bytes,
                                             cudaMemcpyHostToDevice, d->stream));
  return 0;
}

static void cuda_optim_pack(gs_device_t *base, const gs_optim_step_t *s,
                            const gs_optim_segment_t *segs, uint32_t nseg, float *param,
                            const float *grad, float *const *state)
{
  cuda_device_t *d = cd(base);
  const seg_cache_t *t;
  bool adam = s->kind != GS_OPTIM_SGD;

  if (nseg == 0 || s->ngroups == 0 || s->kind == GS_OPTIM_NONE || note(d, enter(d)))
    return;
  if (!state[0] || (adam && !state[1])) {
    GS_LOG_ERR(base->log, "%s: %s needs its state buffers", base->label,
               gs_optim_kind_name(s->kind));
    note(d, GS_EINVAL);
    return;
  }
  t = table_for(d, segs, nseg);
  if (!t || t->total == 0 || note(d, coefs_upload(d, s)))
    return;
  optim_kernel<<<blocks_for(t->total), THREADS, 0, d->stream>>>(
      t->dev, nseg, t->total, d->coef_dev, adam, param, grad, state[0], adam ? state[1] : NULL,
      adam ? state[2] : NULL, s->gate);
  LAUNCHED(d);
}

static void cuda_scale(gs_device_t *base, float *x, size_t n, float factor)
{
  cuda_device_t *d = cd(base);

  if (note(d, enter(d)))
    return;
  scale_kernel<<<blocks_for(n), THREADS, 0, d->stream>>>(x, n, factor);
  LAUNCHED(d);
}

static void cuda_narrow(gs_device_t *base, uint16_t *dst, const float *src, size_t n, gs_dtype_t to)
{
  cuda_device_t *d = cd(base);

  if (note(d, enter(d)))
    return;
  narrow_kernel<<<blocks_for(n), THREADS, 0, d->stream>>>(dst, src, n, to == GS_DTYPE_BFLOAT16);
  LAUNCHED(d);
}

static void cuda_widen(gs_device_t *base, float *dst, const uint16_t *src, size_t n,
                       gs_dtype_t from)
{
  cuda_device_t *d = cd(base);

  if (note(d, enter(d)))
    return;
  widen_kernel<<<blocks_for(n), THREADS, 0, d->stream>>>(dst, src, n, from == GS_DTYPE_BFLOAT16);
  LAUNCHED(d);
}

static void cuda_check_finite(gs_device_t *base, const float *g, size_t n, float *flag)
{
  cuda_device_t *d = cd(base);

  if (note(d, enter(d)))
    return;
  check_finite_kernel<<<blocks_for(n), THREADS, 0, d->stream>>>(g, n, flag);
  LAUNCHED(d);
}

static void cuda_mark_nonfinite(gs_device_t *base, const float *x, float *v, uint32_t i, uint32_t j,
                                float w)
{
  cuda_device_t *d = cd(base);

  if (note(d, enter(d)))
    return;
  mark_nonfinite_kernel<<<1, 1, 0, d->stream>>>(x, v, i, j, w);
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

/* An asynchronous copy into pinned host memory; a fence says when it is
 * done. */
static int cuda_fetch(gs_device_t *base, void *dst, const void *src, size_t bytes)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (!err)
    err = GS_CUDA_STATUS(base->log,
                         cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream));
  return note(d, err);
}

static int cuda_fence(gs_device_t *base, unsigned k)
{
  cuda_device_t *d = cd(base);
  int err = enter(d);

  if (!err && !d->fence[k])
    err = GS_CUDA_STATUS(base->log, cudaEventCreateWithFlags(&d->fence[k], cudaEventDisableTiming));
  if (!err)
    err = GS_CUDA_STATUS(base->log, cudaEventRecord(d->fence[k], d->stream));
  d->fence_pending[k] = !err;
  return note(d, err);
}

static int cuda_fence_done(gs_device_t *base, unsigned k)
{
  cuda_device_t *d = cd(base);
  cudaError_t status;

  if (!d->fence_pending[k])
    return d->sticky ? d->sticky : 1;
  status = cudaEventQuery(d->fence[k]);
  if (status == cudaErrorNotReady) {
    cudaGetLastError(); /* not an error: clear it */
    return 0;
  }
  d->fence_pending[k] = false;
  note(d, GS_CUDA_STATUS(base->log, status));
  return d->sticky ? d->sticky : 1;
}

static int cuda_fence_wait(gs_device_t *base, unsigned k)
{
  cuda_device_t *d = cd(base);
  int err = 0;

  if (d->fence_pending[k])
    err = GS_CUDA_STATUS(base->log, cudaEventSynchronize(d->fence[k]));
  d->fence_pending[k] = false;
  note(d, err);
  return d->sticky;
}

static void cuda_destroy(gs_device_t *base)
{
  cuda_device_t *d = cd(base);

  if (!enter(d))
    GS_CUDA_STATUS(base->log, cudaStreamSynchronize(d->stream));
  for (unsigned k = 0; k < GS_DEVICE_FENCES; k++)
    if (d->fence[k])
      GS_CUDA_STATUS(base->log, cudaEventDestroy(d->fence[k]));
  for (uint32_t i = 0; i < d->ntables; i++)
    table_drop(d, &d->tables[i]);
  free(d->tables);
  if (d->coef_dev)
    GS_CUDA_STATUS(base->log, cudaFree(d->coef_dev));
  free(d->coef_host);
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
    .copy = cuda_copy,
    .optim_pack = cuda_optim_pack,
    .check_finite = cuda_check_finite,
    .mark_nonfinite = cuda_mark_nonfinite,
    .scale = cuda_scale,
    .narrow = cuda_narrow,
    .widen = cuda_widen,
    .fail = cuda_fail,
    .sync = cuda_sync,
    .fetch = cuda_fetch,
    .fence = cuda_fence,
    .fence_done = cuda_fence_done,
    .fence_wait = cuda_fence_wait,
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
