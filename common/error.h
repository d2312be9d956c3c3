/* Error codes: one table makes the enum, the names, the messages and the
 * gRPC status code each maps to on the wire. Actions return 0 or a negative
 * GS_E* value; errno and libuv codes are converted once, at the boundary. */
#ifndef GS_ERROR_H
#define GS_ERROR_H

#define GS_WARN_UNUSED __attribute__((warn_unused_result))

/* XX(name, grpc_code, message) */
#define GS_ERRNO_MAP(XX)                                                                           \
  XX(INVAL, 3, "invalid argument")                                                                 \
  XX(TIMEDOUT, 4, "deadline exceeded")                                                             \
  XX(NOTFOUND, 5, "not found")                                                                     \
  XX(EXIST, 6, "already exists")                                                                   \
  XX(PERM, 7, "permission denied")                                                                 \
  XX(NOMEM, 8, "out of memory")                                                                    \
  XX(TOOBIG, 8, "message too large")                                                               \
  XX(PRECOND, 9, "failed precondition")                                                            \
  XX(ABORTED, 10, "aborted")                                                                       \
  XX(RANGE, 11, "out of range")                                                                    \
  XX(UNIMPL, 12, "unimplemented")                                                                  \
  XX(PROTO, 13, "protocol error")                                                                  \
  XX(INTERNAL, 13, "internal error")                                                               \
  XX(IO, 14, "input/output error")                                                                 \
  XX(CLOSED, 14, "connection closed")                                                              \
  XX(UNAVAIL, 14, "unavailable")                                                                   \
  XX(UNAUTH, 16, "unauthenticated")

typedef enum gs_errno {
  GS_OK = 0,
  GS__ERRNO_FIRST = -4096,
#define GS__ERRNO_ENUM(name, code, msg) GS_E##name,
  GS_ERRNO_MAP(GS__ERRNO_ENUM)
#undef GS__ERRNO_ENUM
      GS__ERRNO_LAST
} gs_errno_t;

/* Human text of an error ("invalid argument"); never NULL. */
const char *gs_strerror(int err);
/* Symbolic name of an error ("GS_EINVAL"); never NULL. */
const char *gs_err_name(int err);
/* The gRPC status code an error travels as (0 for GS_OK). */
int gs_err_grpc_code(int err);
/* Name of a gRPC status code ("INVALID_ARGUMENT"). */
const char *gs_grpc_code_name(int code);
/* Converts a positive errno value. */
int gs_err_from_errno(int errnum);
/* Converts a (negative) libuv error code. */
int gs_err_from_uv(int uverr);

#endif
