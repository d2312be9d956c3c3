/* Error table lookups and conversion of foreign error codes. */
#include "error.h"

#include <errno.h>
#include <stddef.h>

struct gs__err_info {
  const char *name;
  const char *message;
  int grpc_code;
};

static const struct gs__err_info gs__errors[] = {
#define GS__ERR_ROW(name, status, msg) {"GS_E" #name, msg, GS_GRPC_##status},
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
  return info ? info->grpc_code : GS_GRPC_UNKNOWN;
}

int gs_err_from_grpc(int code)
{
  if (code == GS_GRPC_OK)
    return GS_OK;
  for (int e = GS__ERRNO_FIRST + 1; e < GS__ERRNO_LAST; e++)
    if (err_info(e)->grpc_code == code)
      return e;
  return GS_EPROTO;
}

const char *gs_grpc_code_name(int code)
{
  switch (code) {
#define GS__GRPC_CASE(name, value)                                                                 \
  case value:                                                                                      \
    return #name;
    GS_GRPC_STATUS_MAP(GS__GRPC_CASE)
#undef GS__GRPC_CASE
  default:
    return "UNKNOWN";
  }
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
