/* Conversion of CUDA and NCCL status codes (see cuda_check.h). */
#include "cuda_check.h"

#include <cuda_runtime.h>
#include <nccl.h>

int gs__cuda_status(const gs_log_t *log, const char *file, int line, const char *call, int code)
{
  cudaError_t e = (cudaError_t)code;

  if (e == cudaSuccess)
    return 0;
  GS_LOG_ERR(log, "%s:%d: %s failed: %s: %s", file, line, call, cudaGetErrorName(e),
             cudaGetErrorString(e));
  switch (e) {
  case cudaErrorMemoryAllocation:
    return GS_ENOMEM;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidDevice:
  case cudaErrorInvalidDevicePointer:
    return GS_EINVAL;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
    return GS_EUNAVAIL;
  default:
    return GS_EINTERNAL;
  }
}

int gs__nccl_status(const gs_log_t *log, const char *file, int line, const char *call, int code)
{
  ncclResult_t r = (ncclResult_t)code;

  if (r == ncclSuccess)
    return 0;
  GS_LOG_ERR(log, "%s:%d: %s failed: NCCL error %d: %s", file, line, call, code,
             ncclGetErrorString(r));
  switch (r) {
  case ncclInvalidArgument:
  case ncclInvalidUsage:
    return GS_EINVAL;
  case ncclSystemError:
  case ncclRemoteError:
    return GS_EUNAVAIL;
  default:
    return GS_EINTERNAL;
  }
}
