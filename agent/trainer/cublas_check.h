/* The cuBLAS member of the check family of device/cuda_check.h (CONVENTIONS.md
 * rule 4), for the trainer's kernels, the only cuBLAS users: a failed call
 * is logged once with file:line, the call's text and cuBLAS's message, and
 * turned into a GS_E* code.
 *
 *   err = GS_CUBLAS_STATUS(log, cublasSgemm(...));  0 or the code
 *   GS_CUBLAS_CHECK(log, cublasCreate(&h));         returns the code */
#ifndef GS_CUBLAS_CHECK_H
#define GS_CUBLAS_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

#include "cuda_check.h" /* GS__RETURN_IF */
#include "error.h"
#include "log.h"

/* 0 for CUBLAS_STATUS_SUCCESS; otherwise logs "file:line: call failed:
 * cuBLAS status N: message" and returns the GS_E* code. */
int gs__cublas_status(const gs_log_t *log, const char *file, int line, const char *call, int code);

#ifdef __cplusplus
}
#endif

#define GS_CUBLAS_STATUS(log, call) gs__cublas_status((log), __FILE__, __LINE__, #call, (int)(call))
#define GS_CUBLAS_CHECK(log, call) GS__RETURN_IF(GS_CUBLAS_STATUS(log, call))

#endif
