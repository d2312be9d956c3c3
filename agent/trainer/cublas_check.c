/* Conversion of cuBLAS status codes (see cublas_check.h). */
#include "cublas_check.h"

#include <cublas_v2.h>

int gs__cublas_status(const gs_log_t *log, const char *file, int line, const char *call, int code)
{
  cublasStatus_t s = (cublasStatus_t)code;

  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  GS_LOG_ERR(log, "%s:%d: %s failed: cuBLAS status %d: %s", file, line, call, code,
             cublasGetStatusString(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return GS_ENOMEM;
  return s == CUBLAS_STATUS_INVALID_VALUE ? GS_EINVAL : GS_EINTERNAL;
}
