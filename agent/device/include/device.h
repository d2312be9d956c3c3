/* Compute devices: what the sync engine needs from one (memory, copies,
 * the compute stream and its sync, the fused optimizer step), behind one table,
 * so neither the engine nor the trainer branches on the device. `cpu`
 * (device_cpu.c) and, in a CUDA build, `cuda` (device_cuda.cu). A model's
 * own kernels (the reference MLP's live in trainer/) queue their work on
 * the device's stream and report failures with gs_device_fail.
 *
 * Memory from gs_device_alloc lives on the device; the host touches it only
 * through upload/download. Work is queued in order on the device's compute
 * stream (the CPU device runs it at once); gs_device_sync waits for it and
 * returns the first error of anything queued, with file and line logged.
 * Matrices are row-major float32. */
#ifndef GS_DEVICE_H
#define GS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "log.h"
#include "optim.h"
#include "packlist.h" /* gs_dtype_t */

typedef struct gs_device gs_device_t;

typedef struct gs_device_ops {
  const char *name;
  void *(*alloc)(gs_device_t *d, size_t bytes); /* zeroed; NULL on failure */
  void (*free)(gs_device_t *d, void *p);
  void *(*host_alloc)(gs_device_t *d, size_t bytes); /* pinned where it matters */
  void (*host_free)(gs_device_t *d, void *p);
  int (*upload)(gs_device_t *d, void *dst, const void *src, size_t bytes);
  int (*download)(gs_device_t *d, void *dst, const void *src, size_t bytes);
  int (*zero)(gs_device_t *d, void *p, size_t bytes);
  int (*copy)(gs_device_t *d, void *dst, const void *src, size_t bytes); /* device to device */
  void (*optim_pack)(gs_device_t *d, const gs_optim_step_t *s, const gs_optim_segment_t *segs,
                     uint32_t nseg, float *param, const float *grad, float *const *state);
  void (*check_finite)(gs_device_t *d, const float *g, size_t n, float *flag);
  void (*mark_nonfinite)(gs_device_t *d, const float *x, float *v, uint32_t i, uint32_t j, float w);
  void (*scale)(gs_device_t *d, float *x, size_t n, float factor);
  void (*narrow)(gs_device_t *d, uint16_t *dst, const float *src, size_t n, gs_dtype_t to);
  void (*widen)(gs_device_t *d, float *dst, const uint16_t *src, size_t n, gs_dtype_t from);
  void (*fail)(gs_device_t *d, int err);
  int (*sync)(gs_device_t *d);
  /* Queues an asynchronous copy into host memory behind the queued work
   * (cpu: at once). */
  int (*fetch)(gs_device_t *d, void *dst, const void *src, size_t bytes);
  /* Fence k (< GS_DEVICE_FENCES) recorded behind the queued work;
   * `fence_done` 1 when what was queued before it is done, 0 when not
   * yet, or a negative code, never waiting; `fence_wait` waits for it. */
  int (*fence)(gs_device_t *d, unsigned k);
  int (*fence_done)(gs_device_t *d, unsigned k);
  int (*fence_wait)(gs_device_t *d, unsigned k);
  /* Orders the device's work on `stream` (borrowed) instead of its own;
   * NULL: the device cannot (cpu). */
  int (*use_stream)(gs_device_t *d, void *stream);
  void (*destroy)(gs_device_t *d);
} gs_device_ops_t;

/* How often the calling thread blocked on the device since it was opened
 * (the engine reports them per step: a steady step makes none): syncs are
 * stream synchronizations that left the device with nothing queued
 * (gs_device_sync, gs_device_fetched and gs_device_fence_wait that had to
 * wait; a wait for older work while newer is queued behind it keeps the
 * device busy, and is not one), reads device-to-host copies waited for
 * (gs_device_download).
 * Counted by the wrappers below for every device, the cpu too, whose calls
 * cost nothing but are counted alike, so that tests on the cpu see them.
 * The owning thread's only. */
typedef struct gs_device_waits {
  uint64_t syncs, reads;
} gs_device_waits_t;

/* Every device's state starts with this. */
struct gs_device {
  gs_device_waits_t waits;
  const gs_device_ops_t *ops;
  const gs_log_t *log;
  char label[32];   /* "cpu", "cuda:0" (shown in status) */
  bool host_memory; /* device pointers are host pointers (cpu) */
  void *stream;     /* the compute stream (cudaStream_t); NULL on cpu */
  int ordinal;      /* the GPU's index (cudaSetDevice); -1 on cpu */
};

/* Opens a device by name: "cpu", "cuda" (the GPU `index`), or "auto" (cuda
 * when a GPU is visible, else cpu). NULL with the reason in `why`. Close
 * with gs_device_destroy. */
gs_device_t *gs_device_open(const char *name, int index, const gs_log_t *log, char *why,
                            size_t why_len);
void gs_device_destroy(gs_device_t *d);

/* Whether this build has CUDA, and how many GPUs are visible (0 without). */
bool gs_device_cuda_built(void);
int gs_device_cuda_count(void);
/* Whether a GPU can be used here (the build has CUDA and one is visible);
 * false with the reason in `why` ("built without CUDA", "no CUDA device
 * visible (...)"), as the GPU tests and benchmarks print when they skip. */
bool gs_device_cuda_usable(char *why, size_t why_len);

/* Thin wrappers over the table (see gs_device_ops_t). */
void *gs_device_alloc(gs_device_t *d, size_t bytes);
void gs_device_free(gs_device_t *d, void *p);
void *gs_device_host_alloc(gs_device_t *d, size_t bytes);
void gs_device_host_free(gs_device_t *d, void *p);
/* Queues a copy of host `src` to device `dst`; src must stay unchanged until
 * the next sync (use host_alloc memory for it to be asynchronous). */
int gs_device_upload(gs_device_t *d, void *dst, const void *src, size_t bytes) GS_WARN_UNUSED;
/* Copies device `src` to host `dst` after everything queued; waits. */
int gs_device_download(gs_device_t *d, void *dst, const void *src, size_t bytes) GS_WARN_UNUSED;
int gs_device_zero(gs_device_t *d, void *p, size_t bytes) GS_WARN_UNUSED;
/* Queues a copy between two device buffers (they may not overlap). */
int gs_device_copy(gs_device_t *d, void *dst, const void *src, size_t bytes) GS_WARN_UNUSED;

/* Queues one fused optimizer step over a pack (optim.h; `state` holds
 * gs_optim_state_count buffers), which reads s->gate when it runs: a step
 * found to hold non-finite gradients is never applied, with no wait on
 * the host. */
void gs_device_optim_pack(gs_device_t *d, const gs_optim_step_t *s, const gs_optim_segment_t *segs,
                          uint32_t nseg, float *param, const float *grad, float *const *state);

/* Queues a check of g[0..n) (device memory) that sets the float at `flag`
 * (device memory) to 1 when it holds a NaN or an infinity, and leaves it
 * otherwise. */
void gs_device_check_finite(gs_device_t *d, const float *g, size_t n, float *flag);

/* Queues a look at *x (device memory) that, when it is NaN or infinite,
 * adds 1 to v[i] and w to v[j] (device memory): a loss's verdict written
 * into the control vector without the host reading the loss. */
void gs_device_mark_nonfinite(gs_device_t *d, const float *x, float *v, uint32_t i, uint32_t j,
                              float w);

/* Queues x[0..n) *= factor (device memory). */
void gs_device_scale(gs_device_t *d, float *x, size_t n, float factor);

/* Queues dst[0..n) = src[0..n) rounded to the 16-bit float `to`
 * (GS_DTYPE_BFLOAT16 or GS_DTYPE_FLOAT16; to nearest even), and back:
 * gradients that travel in half the bytes. Device memory. */
void gs_device_narrow(gs_device_t *d, uint16_t *dst, const float *src, size_t n, gs_dtype_t to);
void gs_device_widen(gs_device_t *d, float *dst, const uint16_t *src, size_t n, gs_dtype_t from);

/* Records `err` (a GS_E* code) as a failure of work the caller queued on
 * the device's stream itself (a model's kernels), so the next sync or
 * download returns it like a failure of the device's own queued work. The
 * first error sticks; a device whose work runs at once ignores it. */
void gs_device_fail(gs_device_t *d, int err);

/* Waits for the queued work; the first error since the last sync. */
int gs_device_sync(gs_device_t *d) GS_WARN_UNUSED;

/* Queues a copy of device `src` into host `dst` (gs_device_host_alloc
 * memory) behind the work queued so far, without waiting: what the host
 * must learn from the device (the control vector's sums, a verdict, the
 * loss for the status page) comes back this way. */
int gs_device_fetch(gs_device_t *d, void *dst, const void *src, size_t bytes) GS_WARN_UNUSED;
/* Makes the copies gs_device_fetch queued complete: returns at once when
 * the device has done them (the cpu always has), else waits, counted as a
 * sync; the first error of the queued work. */
int gs_device_fetched(gs_device_t *d) GS_WARN_UNUSED;

/* Fences for a readback the host takes later (the engine's late
 * decisions: one per step in flight): fence k marks the work queued so
 * far, the fetches among it; gs_device_fence_done says, without waiting,
 * whether it is done (1), not yet (0) or failed (< 0); gs_device_fence_wait
 * waits for it, counted as a sync only when `drains` (nothing newer is
 * queued behind it, so the device is left idle). The last fence is
 * gs_device_fetched's. */
#define GS_DEVICE_FENCES 3
int gs_device_fence(gs_device_t *d, unsigned k) GS_WARN_UNUSED;
int gs_device_fence_done(gs_device_t *d, unsigned k) GS_WARN_UNUSED;
int gs_device_fence_wait(gs_device_t *d, unsigned k, bool drains) GS_WARN_UNUSED;

/* CUDA: from now on the device queues its work (copies, SGD) on `stream`,
 * a cudaStream_t the caller owns and keeps alive (a framework's current
 * stream: its kernels and ours are then ordered with no events), and
 * gives up its own after waiting for it. GS_EINVAL on a device without
 * streams. */
int gs_device_use_stream(gs_device_t *d, void *stream) GS_WARN_UNUSED;

/* Constructors (gs_device_open picks). */
gs_device_t *gs__device_cpu_new(const gs_log_t *log, char *why, size_t why_len);
gs_device_t *gs__device_cuda_new(int index, const gs_log_t *log, char *why, size_t why_len);
int gs__device_cuda_count(void);

#endif
