/* RPC messages on the wire: frames holding an Envelope whose body is the
 * request or response message (proto/gradsync.proto, proto/README.md). */
#ifndef GS_WIRE_H
#define GS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "error.h"
#include "gradsync.pb.h"

#define GS_METHOD_PREFIX "/gradsync.Coordinator/"

/* The RPC methods, in proto order: XX(ID, Name), path GS_METHOD_PREFIX Name.
 * Both sides use this one table (the agent to call, the coordinator to
 * dispatch and count). */
#define GS_METHOD_MAP(XX)                                                                          \
  XX(JOIN, Join)                                                                                   \
  XX(PUBLISH, Publish)                                                                             \
  XX(FETCH, Fetch)                                                                                 \
  XX(PUBLISH_PACK_LIST, PublishPackList)                                                           \
  XX(FETCH_PACK_LIST, FetchPackList)                                                               \
  XX(HEARTBEAT, Heartbeat)                                                                         \
  XX(LEAVE, Leave)                                                                                 \
  XX(BATCH, Batch)                                                                                 \
  XX(NODE_HEARTBEAT, NodeHeartbeat)

typedef enum gs_method {
#define GS__METHOD_ENUM(id, name) GS_METHOD_##id,
  GS_METHOD_MAP(GS__METHOD_ENUM)
#undef GS__METHOD_ENUM
      GS_METHOD_COUNT
} gs_method_t;

/* "Join" ("?" for an unknown method). */
const char *gs_method_name(gs_method_t m);
/* "/gradsync.Coordinator/Join" ("" for an unknown method). */
const char *gs_method_path(gs_method_t m);
/* The method a path names; false for anything not in the table. */
bool gs_method_from_path(const char *path, gs_method_t *m);

/* Appends one frame to `out`: the header, then `env` with its body set to
 * `body` encoded as `body_fields` (body may be NULL for an empty body).
 * GS_ETOOBIG past max_payload, GS_EPROTO if nanopb refuses, GS_ENOMEM. */
int gs_wire_encode_frame(gs_buf_t *out, const gradsync_Envelope *env,
                         const pb_msgdesc_t *body_fields, const void *body,
                         size_t max_payload) GS_WARN_UNUSED;

/* Same, with a body that is already encoded (e.g. cached for many replies). */
int gs_wire_encode_frame_bytes(gs_buf_t *out, const gradsync_Envelope *env, const uint8_t *body,
                               size_t body_len, size_t max_payload) GS_WARN_UNUSED;

/* Batches (BatchRequest.calls, BatchResponse.replies: field 1, repeated
 * Envelope). Appends `env` with its body as one entry of a batch's body;
 * the same errors as gs_wire_encode_frame_bytes. */
int gs_wire_encode_batch_entry(gs_buf_t *out, const gradsync_Envelope *env, const uint8_t *body,
                               size_t body_len, size_t max_payload) GS_WARN_UNUSED;
/* The next entry of a batch's body data[*off .. len): true with the
 * encoded Envelope in [*entry, *entry + *entry_len) and *off past it; false
 * at the end or on bytes that are not a batch (*bad set then). */
bool gs_wire_batch_next(const uint8_t *data, size_t len, size_t *off, const uint8_t **entry,
                        size_t *entry_len, bool *bad);

/* Decodes an Envelope payload. Its body is copied into `body` (which the
 * caller frees with gs_buf_free, also on error). On failure `why` gets
 * nanopb's reason. */
int gs_wire_decode_envelope(const uint8_t *payload, size_t len, gradsync_Envelope *env,
                            gs_buf_t *body, char *why, size_t why_len) GS_WARN_UNUSED;

/* Decodes `len` bytes as a message of type `fields` into `msg`, whose
 * callback fields the caller has bound beforehand. */
int gs_wire_decode(const uint8_t *data, size_t len, const pb_msgdesc_t *fields, void *msg,
                   char *why, size_t why_len) GS_WARN_UNUSED;
/* The same for a `msg` whose every field already holds its default (the
 * caller zeroed what the message may hold: proto3's defaults are zeros),
 * without nanopb's pass that sets them, which walks every field of the
 * type: on the hot path (each frame's Envelope, a NodeHeartbeat) that
 * pass was a measurable part of the decoding. */
int gs_wire_decode_into_defaults(const uint8_t *data, size_t len, const pb_msgdesc_t *fields,
                                 void *msg, char *why, size_t why_len) GS_WARN_UNUSED;

/* Encodes a message into `out` (appended, without any frame header). */
int gs_wire_encode(gs_buf_t *out, const pb_msgdesc_t *fields, const void *msg) GS_WARN_UNUSED;

#endif
