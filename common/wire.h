/* RPC messages on the wire: frames holding an Envelope whose body is the
 * request or response message (proto/gradsync.proto, proto/README.md). */
#ifndef GS_WIRE_H
#define GS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "gradsync.pb.h"

#define GS_METHOD_PREFIX "/gradsync.Coordinator/"

/* gRPC status codes used on the wire. */
enum {
  GS_GRPC_OK = 0,
  GS_GRPC_INVALID_ARGUMENT = 3,
  GS_GRPC_DEADLINE_EXCEEDED = 4,
  GS_GRPC_NOT_FOUND = 5,
  GS_GRPC_ALREADY_EXISTS = 6,
  GS_GRPC_PERMISSION_DENIED = 7,
  GS_GRPC_RESOURCE_EXHAUSTED = 8,
  GS_GRPC_FAILED_PRECONDITION = 9,
  GS_GRPC_ABORTED = 10,
  GS_GRPC_UNIMPLEMENTED = 12,
  GS_GRPC_INTERNAL = 13,
  GS_GRPC_UNAVAILABLE = 14,
  GS_GRPC_UNAUTHENTICATED = 16,
};

/* Appends one frame to `out`: the header, then `env` with its body set to
 * `body` encoded as `body_fields` (body may be NULL for an empty body).
 * GS_ETOOBIG past max_payload, GS_EPROTO if nanopb refuses, GS_ENOMEM. */
int gs_wire_encode_frame(gs_buf_t *out, const gradsync_Envelope *env,
                         const pb_msgdesc_t *body_fields, const void *body,
                         size_t max_payload) GS_WARN_UNUSED;

/* Same, with a body that is already encoded (e.g. cached for many replies). */
int gs_wire_encode_frame_bytes(gs_buf_t *out, const gradsync_Envelope *env, const uint8_t *body,
                               size_t body_len, size_t max_payload) GS_WARN_UNUSED;

/* Decodes an Envelope payload. Its body is copied into `body` (which the
 * caller frees with gs_buf_free, also on error). On failure `why` gets
 * nanopb's reason. */
int gs_wire_decode_envelope(const uint8_t *payload, size_t len, gradsync_Envelope *env,
                            gs_buf_t *body, char *why, size_t why_len) GS_WARN_UNUSED;

/* Decodes `len` bytes as a message of type `fields` into `msg`, whose
 * callback fields the caller has bound beforehand. */
int gs_wire_decode(const uint8_t *data, size_t len, const pb_msgdesc_t *fields, void *msg,
                   char *why, size_t why_len) GS_WARN_UNUSED;

/* Encodes a message into `out` (appended, without any frame header). */
int gs_wire_encode(gs_buf_t *out, const pb_msgdesc_t *fields, const void *msg) GS_WARN_UNUSED;

#endif
