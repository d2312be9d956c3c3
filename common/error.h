/* Error codes: one table makes the enum, the names, the messages and the
 * gRPC status code each maps to on the wire; one more table holds the gRPC
 * status codes themselves. Actions return 0 or a negative
 * GS_E* value; errno codes are converted once, at the boundary (libuv's in
 * the coordinator's net.h, CUDA's and NCCL's in the agent's check macros). */
#ifndef GS_ERROR_H
#define GS_ERROR_H

#define GS_WARN_UNUSED __attribute__((warn_unused_result))

/* gRPC status codes, as they travel in Envelope.status: XX(NAME, code). */
#define GS_GRPC_STATUS_MAP(XX)                                                                     \
  XX(OK, 0)                                                                                        \
  XX(CANCELLED, 1)                                                                                 \
  XX(UNKNOWN, 2)                                                                                   \
  XX(INVALID_ARGUMENT, 3)                                                                          \
  XX(DEADLINE_EXCEEDED, 4)                                                                         \
  XX(NOT_FOUND, 5)                                                                                 \
  XX(ALREADY_EXISTS, 6)                                                                            \
  XX(PERMISSION_DENIED, 7)                                                                         \
  XX(RESOURCE_EXHAUSTED, 8)                                                                        \
  XX(FAILED_PRECONDITION, 9)                                                                       \
  XX(ABORTED, 10)                                                                                  \
  XX(OUT_OF_RANGE, 11)                                                                             \
  XX(UNIMPLEMENTED, 12)                                                                            \
  XX(INTERNAL, 13)                                                                                 \
  XX(UNAVAILABLE, 14)                                                                              \
  XX(DATA_LOSS, 15)                                                                                \
  XX(UNAUTHENTICATED, 16)

typedef enum gs_grpc_status {
#define GS__GRPC_ENUM(name, code) GS_GRPC_##name = code,
  GS_GRPC_STATUS_MAP(GS__GRPC_ENUM)
#undef GS__GRPC_ENUM
} gs_grpc_status_t;

/* XX(name, grpc status, message). Several errors may share a status; the
 * first row of a status is what that status decodes to on the receiving
 * side (gs_err_from_grpc), so it comes first. */
#define GS_ERRNO_MAP(XX)                                                                           \
  XX(INVAL, INVALID_ARGUMENT, "invalid argument")                                                  \
  XX(TIMEDOUT, DEADLINE_EXCEEDED, "deadline exceeded")                                             \
  XX(NOTFOUND, NOT_FOUND, "not found")                                                             \
  XX(EXIST, ALREADY_EXISTS, "already exists")                                                      \
  XX(PERM, PERMISSION_DENIED, "permission denied")                                                 \
  XX(LIMIT, RESOURCE_EXHAUSTED, "resource exhausted")                                              \
  XX(NOMEM, RESOURCE_EXHAUSTED, "out of memory")                                                   \
  XX(TOOBIG, RESOURCE_EXHAUSTED, "message too large")                                              \
  XX(PRECOND, FAILED_PRECONDITION, "failed precondition")                                          \
  XX(ABORTED, ABORTED, "aborted")                                                                  \
  XX(RANGE, OUT_OF_RANGE, "out of range")                                                          \
  XX(UNIMPL, UNIMPLEMENTED, "unimplemented")                                                       \
  XX(INTERNAL, INTERNAL, "internal error")                                                         \
  XX(PROTO, INTERNAL, "protocol error")                                                            \
  XX(UNAVAIL, UNAVAILABLE, "unavailable")                                                          \
  XX(IO, UNAVAILABLE, "input/output error")                                                        \
  XX(CLOSED, UNAVAILABLE, "connection closed")                                                     \
  XX(UNAUTH, UNAUTHENTICATED, "unauthenticated")                                                   \
  XX(INTR, CANCELLED, "interrupted by a signal")                                                   \
  XX(REGROUPED, ABORTED, "the world changed (elastic regroup)")

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
/* The error a gRPC status received from a peer stands for: the first row
 * of that status (GS_OK for OK, GS_EPROTO for a code not in the table). */
int gs_err_from_grpc(int code);
/* Name of a gRPC status code ("INVALID_ARGUMENT"; "UNKNOWN" if unknown). */
const char *gs_grpc_code_name(int code);
/* Converts a positive errno value. */
int gs_err_from_errno(int errnum);

#endif
