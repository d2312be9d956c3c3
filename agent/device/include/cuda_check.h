/* The one family of checks for CUDA and NCCL calls (CONVENTIONS.md
 * rule 4): a failed call is logged once with file:line, the call's text and
 * the library's own error name and message, and turned into a GS_E* code.
 *
 *   GS_CUDA_CHECK(log, cudaMalloc(&p, n));     returns the GS_E* code
 *   err = GS_CUDA_STATUS(log, cudaMemcpy(...)); 0 or the code, no return
 *
 * The _CHECK forms return from the enclosing function (which must return
 * int): the only macros in the project allowed to change control flow. CUDA
 * builds only (GS_HAVE_CUDA). cuBLAS, which only the trainer's kernels use,
 * has the same pair in trainer/cublas_check.h. */
#ifndef GS_CUDA_CHECK_H
#define GS_CUDA_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

#include "error.h"
#include "log.h"

/* 0 when `code` is the library's success value; otherwise logs
 * "file:line: call failed: NAME: message" and returns the GS_E* code. */
int gs__cuda_status(const gs_log_t *log, const char *file, int line, const char *call, int code);
int gs__nccl_status(const gs_log_t *log, const char *file, int line, const char *call, int code);

#ifdef __cplusplus
}
#endif

#define GS_CUDA_STATUS(log, call) gs__cuda_status((log), __FILE__, __LINE__, #call, (int)(call))
#define GS_NCCL_STATUS(log, call) gs__nccl_status((log), __FILE__, __LINE__, #call, (int)(call))

#define GS__RETURN_IF(status)                                                                      \
  do {                                                                                             \
    int gs_status_ = (status);                                                                     \
    if (gs_status_)                                                                                \
      return gs_status_;                                                                           \
  } while (0)

#define GS_CUDA_CHECK(log, call) GS__RETURN_IF(GS_CUDA_STATUS(log, call))
#define GS_NCCL_CHECK(log, call) GS__RETURN_IF(GS_NCCL_STATUS(log, call))

#endif
