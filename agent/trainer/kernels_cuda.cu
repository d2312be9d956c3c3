/* The MLP's kernels on the cuda device: cuBLAS GEMMs (FP32, no TF32, as
 * PyTorch's default) and a few CUDA C kernels, queued in order on the
 * device's compute stream with the device's memory. They return nothing:
 * a failure is logged with file:line and handed to the device
 * (gs_device_fail), whose next sync or download returns it. Kernels use
 * grid-stride loops of 256 threads and 64-bit indices, so any shape >= 1
 * works. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Our headers are C. */
extern "C" {
#include "kernels.h"
}

#include "cublas_check.h"
#include "cuda_check.h"

#define THREADS 256
#define MAX_BLOCKS 4096 /* grid-stride loops cover the rest */
#define WARP 32

typedef struct cuda_kernels {
  gs_kernels_t base;
  cublasHandle_t blas; /* bound to the device's stream */
} cuda_kernels_t;

static cuda_kernels_t *ck(gs_kernels_t *k)
{
  return reinterpret_cast<cuda_kernels_t *>(k);
}

static cudaStream_t stream_of(cuda_kernels_t *d)
{
  return (cudaStream_t)d->base.dev->stream;
}

/* Hands a failure to the device (the first one sticks there); returns it. */
static int note(cuda_kernels_t *d, int err)
{
  gs_device_fail(d->base.dev, err);
  return err;
}

/* Makes the device current for the calling thread (cuBLAS and launches on
 * its stream need it, and the caller's thread may be a new one). */
static int enter(cuda_kernels_t *d)
{
  return GS_CUDA_STATUS(d->base.dev->log, cudaSetDevice(d->base.dev->ordinal));
}

/* Records a failed kernel launch with the caller's file:line. */
#define LAUNCHED(d) note((d), GS_CUDA_STATUS((d)->base.dev->log, cudaGetLastError()))

static unsigned blocks_for(size_t threads)
{
  size_t b = (threads + THREADS - 1) / THREADS;

  return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* cuBLAS takes int dimensions. */
static bool dims_ok(cuda_kernels_t *d, uint32_t m, uint32_t n, uint32_t k)
{
  if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && m && n && k)
    return true;
  GS_LOG_ERR(d->base.dev->log, "%s: GEMM shape %u x %u x %u is outside 1..%d", d->base.dev->label,
             m, n, k, INT_MAX);
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

/* dst = src / 255, rounded as the cpu device rounds (no fast-math division). */
static __global__ void pixels_kernel(const uint8_t *src, float *dst, size_t n)
{
  size_t stride = (size_t)gridDim.x * blockDim.x;

  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __fdiv_rn((float)src[i], 255.0f);
}

/* ---- layers ----------------------------------------------------------- */

/* Row-major y = x W^T is column-major y^T = W x^T: cuBLAS sees W^T [k x n]
 * (transposed back) and x^T [k x m]. */
static void cuda_linear_forward(gs_kernels_t *base, const float *x, const float *w, const float *b,
                                float *y, uint32_t m, uint32_t n, uint32_t k, bool relu)
{
  cuda_kernels_t *d = ck(base);
  const float one = 1.0f, zero = 0.0f;
  size_t total = (size_t)m * n;

  if (!dims_ok(d, m, n, k) || note(d, enter(d)))
    return;
  if (note(d, GS_CUBLAS_STATUS(base->dev->log,
                               cublasSgemm(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m,
                                           (int)k, &one, w, (int)k, x, (int)k, &zero, y, (int)n))))
    return;
  bias_act_kernel<<<blocks_for(total), THREADS, 0, stream_of(d)>>>(y, b, total, n, relu);
  LAUNCHED(d);
}

/* Column-major, gw^T [k x n] = x^T dy and dx^T [k x m] = W^T dy^T, where
 * the row-major buffers already are x^T, dy^T and W^T. */
static void cuda_linear_backward(gs_kernels_t *base, const float *x, const float *w,
                                 const float *dy, float *gw, float *gb, float *dx, uint32_t m,
                                 uint32_t n, uint32_t k)
{
  cuda_kernels_t *d = ck(base);
  const float one = 1.0f, zero = 0.0f;
  size_t total = (size_t)m * k, tiles = ((size_t)n + WARP - 1) / WARP;

  if (!dims_ok(d, m, n, k) || note(d, enter(d)))
    return;
  if (note(d, GS_CUBLAS_STATUS(base->dev->log, cublasSgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_T,
                                                           (int)k, (int)n, (int)m, &one, x, (int)k,
                                                           dy, (int)n, &zero, gw, (int)k))))
    return;
  column_sum_kernel<<<(unsigned)(tiles < MAX_BLOCKS ? tiles : MAX_BLOCKS),
                      dim3(WARP, THREADS / WARP), 0, stream_of(d)>>>(dy, gb, m, n);
  if (LAUNCHED(d) || !dx)
    return;
  if (note(d, GS_CUBLAS_STATUS(base->dev->log, cublasSgemm(d->blas, CUBLAS_OP_N, CUBLAS_OP_N,
                                                           (int)k, (int)m, (int)n, &one, w, (int)k,
                                                           dy, (int)n, &zero, dx, (int)k))))
    return;
  relu_mask_kernel<<<blocks_for(total), THREADS, 0, stream_of(d)>>>(dx, x, total);
  LAUNCHED(d);
}

static void cuda_softmax_xent(gs_kernels_t *base, const float *z, const uint8_t *y, float *dz,
                              uint32_t m, uint32_t c, float *stats)
{
  cuda_kernels_t *d = ck(base);

  if (m == 0 || c == 0 || note(d, enter(d)))
    return;
  softmax_xent_kernel<<<blocks_for((size_t)m * WARP), THREADS, 0, stream_of(d)>>>(
      z, y, dz, m, c, 1.0f / (float)m, stats);
  LAUNCHED(d);
}

static void cuda_pixels(gs_kernels_t *base, const uint8_t *src, float *dst, size_t n)
{
  cuda_kernels_t *d = ck(base);

  if (n == 0 || note(d, enter(d)))
    return;
  pixels_kernel<<<blocks_for(n), THREADS, 0, stream_of(d)>>>(src, dst, n);
  LAUNCHED(d);
}

static void cuda_destroy(gs_kernels_t *base)
{
  cuda_kernels_t *d = ck(base);

  if (!enter(d))
    GS_CUBLAS_STATUS(base->dev->log, cublasDestroy(d->blas));
  free(d);
}

static const gs_kernels_ops_t cuda_kernels = {
    .device = "cuda",
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .softmax_xent = cuda_softmax_xent,
    .pixels = cuda_pixels,
    .destroy = cuda_destroy,
};

/* A cuBLAS handle on the device's stream, with the default (FP32) math. */
extern "C" gs_kernels_t *gs__kernels_cuda_new(gs_device_t *dev, char *why, size_t why_len)
{
  cuda_kernels_t *d = (cuda_kernels_t *)calloc(1, sizeof(*d));
  const char *what;
  int err;

  if (!d) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  d->base.ops = &cuda_kernels;
  d->base.dev = dev;
  what = "cudaSetDevice";
  err = enter(d);
  if (err)
    goto out_free;
  what = "cublasCreate";
  err = GS_CUBLAS_STATUS(dev->log, cublasCreate(&d->blas));
  if (err)
    goto out_free;
  what = "cublasSetStream";
  err = GS_CUBLAS_STATUS(dev->log, cublasSetStream(d->blas, stream_of(d)));
  if (!err) {
    what = "cublasSetMathMode";
    err = GS_CUBLAS_STATUS(dev->log, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH));
  }
  if (err)
    goto out_destroy_blas;
  return &d->base;

out_destroy_blas:
  GS_CUBLAS_STATUS(dev->log, cublasDestroy(d->blas));
out_free:
  snprintf(why, why_len, "%s: %s failed: %s (the log has the library's message)", dev->label, what,
           gs_strerror(err));
  free(d);
  return NULL;
}
