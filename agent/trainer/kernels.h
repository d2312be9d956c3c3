/* The MLP's layer kernels: linear forward and backward, softmax
 * cross-entropy. They belong to the model, not to the sync engine, so they
 * live with the trainer and run on a compute device (device.h) through its
 * memory and stream: OpenBLAS and loops on `cpu` (kernels_cpu.c), cuBLAS
 * and CUDA C kernels queued on the device's compute stream on `cuda`
 * (kernels_cuda.cu). One table per device kind, picked once by
 * gs_kernels_new, so the model never branches on the device.
 *
 * The operations return nothing: a failure (a bad shape, a failed launch
 * or GEMM) is logged with file:line and handed to the device with
 * gs_device_fail, so the next gs_device_sync or download returns it, as
 * for the device's own queued work. Matrices are row-major float32 in
 * device memory. */
#ifndef GS_KERNELS_H
#define GS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

typedef struct gs_kernels gs_kernels_t;

typedef struct gs_kernels_ops {
  const char *device; /* the device kind (gs_device_ops_t.name) they run on */
  void (*linear_forward)(gs_kernels_t *k, const float *x, const float *w, const float *b, float *y,
                         uint32_t m, uint32_t n, uint32_t k_in, bool relu);
  void (*linear_backward)(gs_kernels_t *k, const float *x, const float *w, const float *dy,
                          float *gw, float *gb, float *dx, uint32_t m, uint32_t n, uint32_t k_in);
  void (*softmax_xent)(gs_kernels_t *k, const float *z, const uint8_t *y, float *dz, uint32_t m,
                       uint32_t c, float *stats);
  void (*pixels)(gs_kernels_t *k, const uint8_t *src, float *dst, size_t n);
  void (*destroy)(gs_kernels_t *k);
} gs_kernels_ops_t;

/* Every table's state starts with this. */
struct gs_kernels {
  const gs_kernels_ops_t *ops;
  gs_device_t *dev; /* borrowed: outlives the kernels */
};

/* The kernels for `dev`'s kind (cpu or cuda). NULL with the reason in
 * `why`. Free with gs_kernels_free before the device is destroyed. */
gs_kernels_t *gs_kernels_new(gs_device_t *dev, char *why, size_t why_len);
void gs_kernels_free(gs_kernels_t *k);

/* y[m x n] = x[m x k] * w[n x k]^T + b[n], then ReLU when `relu`. */
void gs_kernels_linear_forward(gs_kernels_t *kn, const float *x, const float *w, const float *b,
                               float *y, uint32_t m, uint32_t n, uint32_t k, bool relu);

/* For y = x w^T + b with upstream gradient dy [m x n]: gw[n x k] = dy^T x,
 * gb[n] = column sums of dy, and, when dx is not NULL, dx[m x k] = dy w
 * masked where x <= 0 (x is the previous layer's ReLU output). */
void gs_kernels_linear_backward(gs_kernels_t *kn, const float *x, const float *w, const float *dy,
                                float *gw, float *gb, float *dx, uint32_t m, uint32_t n,
                                uint32_t k);

/* Softmax cross-entropy of each row of logits z [m x c] against labels y
 * (device memory): dz = (softmax - onehot) / m, and stats[0] += the summed
 * loss, stats[1] += the number of rows whose argmax is the label (stats is
 * two device floats the caller zeroes). A label >= c makes the loss NaN. */
void gs_kernels_softmax_xent(gs_kernels_t *kn, const float *z, const uint8_t *y, float *dz,
                             uint32_t m, uint32_t c, float *stats);

/* dst[i] = src[i] / 255 (IEEE float division on every device, so the
 * devices agree to the bit): images travel to the device as bytes, a
 * quarter of the floats' bytes, and become the model's inputs there. */
void gs_kernels_pixels(gs_kernels_t *kn, const uint8_t *src, float *dst, size_t n);

/* Constructors (gs_kernels_new picks by the device's kind). */
gs_kernels_t *gs__kernels_cpu_new(gs_device_t *dev, char *why, size_t why_len);
gs_kernels_t *gs__kernels_cuda_new(gs_device_t *dev, char *why, size_t why_len);

#endif
