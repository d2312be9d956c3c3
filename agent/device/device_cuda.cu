/* The cuda device: cuBLAS GEMMs (FP32, no TF32, as PyTorch's default) and
 * a few CUDA C kernels, all queued in order on one non-blocking stream.
 *
 * Void operations cannot return an error, so the first one sticks to the
 * device (logged with file:line when it happens) and the next sync or
 * download returns and clears it. Kernels use grid-stride loops of 256
 * threads and 64-bit indices, so any shape >= 1 works. */
#include <cublas_v2.h>
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
#define WARP 32

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
  cublasHandle_t blas;
  int sticky; /* first error of a void operation since the last sync */
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

/* Makes this device current for the calling thread (cuBLAS and launches
 * on our stream need it, and the caller's thread may be a new one). */
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

/* cuBLAS takes int dimensions. */
static bool dims_ok(cuda_device_t *d, uint32_t m, uint32_t n, uint32_t k)
{
  if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && m && n && k)
    return true;
  GS_LOG_ERR(d->base.log, "%s: GEMM shape %u x %u x %u is outside 1..%d", d->base.label, m, n, k,
             INT_MAX);
  note(d, GS_EINVAL);
  return false;
}

/* ---- kernels ---------------------------------------------------------- */

/* y[i][j] += b[j], then ReLU (v < 0 ? 0 : v keeps NaN, as the cpu device). */
static __global__ void bias_act_kernel(float *y, const float *b, size_t total, uint32_t n,
                                       bool relu)
{
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    float v = y[e] + b[e % n];

    y[e] = relu && v < 0.0f ? 0.0f : v;
  }
}

/* gb[j] = sum over i of dy[i][j]: a block is 32 columns by 8 row groups,
 * each thread sums a strided run of rows, then the 8 partial sums meet in
 * shared memory. Launched with blockDim (32, 8). */
static __global__ void column_sum_kernel(const float *dy, float *gb, uint32_t m, uint32_t n)
{
  __shared__ float part[THREADS / WARP][WARP];
  unsigned tx = threadIdx.x, ty = threadIdx.y;

  for (size_t j0 = (size_t)blockIdx.x * WARP; j0 < n; j0 += (size_t)gridDim.x * WARP) {
    size_t j = j0 + tx;
    float acc = 0.0f;

    if (j < n)
      for (size_t i = ty; i < m; i += blockDim.y)
        acc += dy[i * n + j];
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < n) {
      for (unsigned r = 1; r < blockDim.y; r++)
        acc += part[r][tx];
      gb[j] = acc;
    }
    __syncthreads(); /* part is rewritten by the next tile */
  }
}

/* dx[e] = 0 where x[e] <= 0 (or NaN): the ReLU's derivative. */
static __global__ void relu_mask_kernel(float *dx, const float *x, size_t total)
{
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x)
    dx[e] = x[e] > 0.0f ? dx[e] : 0.0f;
}

/* Whether (v, j) beats (best, at) as "first maximal element": larger, or
 * equal at a smaller index; at == UINT_MAX is "nothing yet". */
static __device__ bool beats(float v, uint32_t j, float best, uint32_t at)
{
  if (j == UINT_MAX)
    return false;
  return at == UINT_MAX || v > best || (v == best && j < at);
}

/* One warp per row of z [m x c]: the first maximal logit, the sum of
 * exp(z - max) in double (as the cpu device), dz = (softmax - onehot) *
 * scale, and the row's loss and hit added to stats. All lanes walk the
 * same rows, so the full-mask shuffles are safe. */
static __global__ void softmax_xent_kernel(const float *z, const uint8_t *y, float *dz, uint32_t m,
                                           uint32_t c, float scale, float *stats)
{
  size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / WARP;
  size_t warps = (size_t)gridDim.x * blockDim.x / WARP;
  unsigned lane = threadIdx.x % WARP;

  for (size_t row = warp; row < m; row += warps) {
    const float *zr = z + row * c;
    float *dr = dz + row * c;
    uint32_t label = y[row], at = UINT_MAX;
    float best = 0.0f;
    double sum = 0.0;

    for (uint32_t j = lane; j < c; j += WARP)
      if (beats(zr[j], j, best, at)) {
        best = zr[j];
        at = j;
      }
    for (int off = WARP / 2; off > 0; off /= 2) {
      float ob = __shfl_xor_sync(0xffffffffu, best, off);
      uint32_t oa = __shfl_xor_sync(0xffffffffu, at, off);

      if (beats(ob, oa, best, at)) {
        best = ob;
        at = oa;
      }
    }
    for (uint32_t j = lane; j < c; j += WARP)
      sum += (double)expf(zr[j] - best);
    for (int off = WARP / 2; off > 0; off /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, off);
    for (uint32_t j = lane; j < c; j += WARP) {
      float v = __fmul_rn((float)((double)expf(zr[j] - best) / sum), scale);

      dr[j] = j == label ? __fsub_rn(v, scale) : v;
    }
    if (lane == 0) {
      float loss = label < c ? (float)(log(sum) - ((double)zr[label] - best)) : NAN;

      atomicAdd(&stats[0], loss);
      if (at == label)
        atomicAdd(&stats[1], 1.0f);
    }
  }
}

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

/* ---- layers ----------------------------------------------------------- */

/* Row-major y = x W^T is column-major y^T = W x^T: cuBLAS sees W^T [k x n]
 * (transposed back) and x^T [k x m]. */
static void cuda_linear_forward(gs_device_t *base, const float *x, const float *w, const float *b,
                                float *y, uint32_t m, uint32_t n, uint32_t k, bool relu)
{
  cuda_device_t *d = cd(base);
  const float one = 1.0f, zero = 0.0f;
  size_t total = (size_t)m * n;

  if (!dims_ok(d, m, n, k) || note(d, enter(d)))
    return;
  if (note(d, GS_CUBLAS_STATUS(base->log,
                               cublasSgemm(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m,
                                           (int)k, &one, w, (int)k, x, (int)k, &zero, y, (int)n))))
    return;
  bias_act_kernel<<<blocks_for(total), THREADS, 0, d->stream>>>(y, b, total, n, relu);
  LAUNCHED(d);
}

/* Column-major, gw^T [k x n] = x^T dy and dx^T [k x m] = W^T dy^T, where
 * the row-major buffers already are x^T, dy^T and W^T. */
static void cuda_linear_backward(gs_device_t *base, const float *x, const float *w, const float *dy,
                                 float *gw, float *gb, float *dx, uint32_t m, uint32_t n,
                                 uint32_t k)
{
  cuda_device_t *d = cd(base);
  const float one = 1.0f, zero = 0.0f;
  size_t total = (size_t)m * k, tiles = ((size_t)n + WARP - 1) / WARP;

  if (!dims_ok(d, m, n, k) || note(d, enter(d)))
    return;
  if (note(d, GS_CUBLAS_STATUS(base->log, cublasSgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)k,
                                                      (int)n, (int)m, &one, x, (int)k, dy, (int)n,
                                                      &zero, gw, (int)k))))
    return;
  column_sum_kernel<<<(unsigned)(tiles < MAX_BLOCKS ? tiles : MAX_BLOCKS),
                      dim3(WARP, THREADS / WARP), 0, d->stream>>>(dy, gb, m, n);
  if (LAUNCHED(d) || !dx)
    return;
  if (note(d, GS_CUBLAS_STATUS(base->log, cublasSgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)k,
                                                      (int)m, (int)n, &one, w, (int)k, dy, (int)n,
                                                      &zero, dx, (int)k))))
    return;
  relu_mask_kernel<<<blocks_for(total), THREADS, 0, d->stream>>>(dx, x, total);
  LAUNCHED(d);
}

static void cuda_softmax_xent(gs_device_t *base, const float *z, const uint8_t *y, float *dz,
                              uint32_t m, uint32_t c, float *stats)
{
  cuda_device_t *d = cd(base);

  if (m == 0 || c == 0 || note(d, enter(d)))
    return;
  softmax_xent_kernel<<<blocks_for((size_t)m * WARP), THREADS, 0, d->stream>>>(
      z, y, dz, m, c, 1.0f / (float)m, stats);
  LAUNCHED(d);
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
  GS_CUBLAS_STATUS(base->log, cublasDestroy(d->blas));
  GS_CUDA_STATUS(base->log, cudaStreamDestroy(d->stream));
  free(d);
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
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .softmax_xent = cuda_softmax_xent,
    .sgd_pack = cuda_sgd_pack,
    .sync = cuda_sync,
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

/* Opens GPU `index` with its own stream and cuBLAS handle; the caller
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
  what = "cublasCreate";
  err = GS_CUBLAS_STATUS(log, cublasCreate(&d->blas));
  if (err)
    goto out_destroy_stream;
  what = "cublasSetStream";
  err = GS_CUBLAS_STATUS(log, cublasSetStream(d->blas, d->stream));
  if (!err) {
    what = "cublasSetMathMode";
    err = GS_CUBLAS_STATUS(log, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH));
  }
  if (err)
    goto out_destroy_blas;
  d->base.stream = (void *)d->stream;
  return &d->base;

out_destroy_blas:
  GS_CUBLAS_STATUS(log, cublasDestroy(d->blas));
out_destroy_stream:
  GS_CUDA_STATUS(log, cudaStreamDestroy(d->stream));
out_free_device:
  snprintf(why, why_len, "cuda:%d: %s failed: %s (the log has the library's message)", index, what,
           gs_strerror(err));
  free(d);
  return NULL;
}
