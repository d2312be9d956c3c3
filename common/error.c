/* Error table lookups and conversion of foreign error codes. */
#include "error.h"

#include <errno.h>
#include <uv.h>

struct gs__err_info {
  const char *name;
  const char *message;
  int grpc_code;
};

static const struct gs__err_info gs__errors[] = {
#define GS__ERR_ROW(name, code, msg) {"GS_E" #name, msg, code},
    GS_ERRNO_MAP(GS__ERR_ROW)
#undef GS__ERR_ROW
};

static const struct gs__err_info *err_info(int err)
{
  if (err <= GS__ERRNO_FIRST || err >= GS__ERRNO_LAST)
    return NULL;
  return &gs__errors[err - GS__ERRNO_FIRST - 1];
}

const char *gs_strerror(int err)
{
  const struct gs__err_info *info = err_info(err);

  if (err == GS_OK)
    return "ok";
  return info ? info->message : "unknown error";
}

const char *gs_err_name(int err)
{
  const struct gs__err_info *info = err_info(err);

  if (err == GS_OK)
    return "GS_OK";
  return info ? info->name : "GS_EUNKNOWN";
}

int gs_err_grpc_code(int err)
{
  const struct gs__err_info *info = err_info(err);

  if (err == GS_OK)
    return 0;
  return info ? info->grpc_code : 2; /* UNKNOWN */
}

const char *gs_grpc_code_name(int code)
{
  static const char *const names[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };

  if (code < 0 || code >= (int)(sizeof(names) / sizeof(names[0])))
    return "UNKNOWN";
  return names[code];
}

int gs_err_from_errno(int errnum)
{
  switch (errnum) {
  case 0:
    return GS_OK;
  case EINVAL:
    return GS_EINVAL;
  case ENOMEM:
    return GS_ENOMEM;
  case ENOENT:
    return GS_ENOTFOUND;
  case EEXIST:
    return GS_EEXIST;
  case EACCES:
  case EPERM:
    return GS_EPERM;
  case ETIMEDOUT:
    return GS_ETIMEDOUT;
  case ERANGE:
  case EOVERFLOW:
    return GS_ERANGE;
  case EPIPE:
  case ECONNRESET:
  case ECONNABORTED:
    return GS_ECLOSED;
  case ECONNREFUSED:
  case EHOSTUNREACH:
  case ENETUNREACH:
  case EADDRINUSE:
  case EADDRNOTAVAIL:
    return GS_EUNAVAIL;
  default:
    return GS_EIO;
  }
}

int gs_err_from_uv(int uverr)
{
  if (uverr == UV_EOF)
    return GS_ECLOSED;
  if (uverr == UV_ETIMEDOUT)
    return GS_ETIMEDOUT;
  /* libuv codes on Unix are negated errno values. */
  return uverr < 0 ? gs_err_from_errno(-uverr) : GS_OK;
}
