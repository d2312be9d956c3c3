/* The narrow interface through which the jobs layer answers requests: it
 * never sees a connection, only the peer a request came from and an id to
 * reply to, so it runs the same over sockets (rpc.c) and in unit tests (a
 * fake that records replies). Errors are GS_E* codes; whoever builds the
 * Envelope converts them to a gRPC status, once. */
#ifndef GS_RESPONDER_H
#define GS_RESPONDER_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "gradsync.pb.h"
#include "wire.h"

typedef struct gs_member gs_member_t;

/* The jobs layer's view of one client connection. The transport's owner
 * keeps one per connection, sets `id` and `name`, and tells the jobs layer
 * when the connection closes (gs_jobs_peer_closed). */
typedef struct gs_peer {
  uint64_t id;         /* what replies are addressed to; never 0 */
  const char *name;    /* "127.0.0.1:40000", for logs */
  gs_member_t *member; /* the rank whose liveness this connection carries */
  bool node_slot;      /* a slot of a node agent's connection: it ends with the node agent */
} gs_peer_t;

/* One request as the jobs layer sees it. */
typedef struct gs_call {
  gs_peer_t *peer; /* borrowed for the call */
  gs_method_t method;
  uint64_t request_id;
  uint64_t now_ms;      /* the caller's clock: tests inject their own */
  uint64_t deadline_ms; /* absolute, on the same clock */
  const char *session;  /* the envelope's session ("" or NULL: none); borrowed */
  /* A node agent's beat (NodeHeartbeat): answered only when its reply's
   * news differs from news_seen (0: it holds none), else held, without a
   * deadline, until there is news. */
  bool news_only;
  uint64_t news_seen;
} gs_call_t;

/* One answer: err 0 with a message (fields, msg) or an already encoded body
 * (body, body_len), or err < 0 (a GS_E* code) with a text. */
typedef struct gs_reply {
  uint64_t to; /* a gs_peer_t id; a reply to a closed peer is dropped */
  gs_method_t method;
  uint64_t request_id;
  int err;
  const char *message;
  const pb_msgdesc_t *fields;
  const void *msg;
  const uint8_t *body;
  size_t body_len;
} gs_reply_t;

typedef struct gs_responder gs_responder_t;

/* Implemented by the owner of the connections, which embeds it in its own
 * struct and gets back to that with GS_CONTAINER_OF (list.h). */
struct gs_responder {
  void (*reply)(gs_responder_t *r, const gs_reply_t *reply);
  /* A call from `peer` now waits (for an event or its deadline) / ended
   * waiting: a waiting connection is not idle. */
  void (*park)(gs_responder_t *r, uint64_t peer);
  void (*unpark)(gs_responder_t *r, uint64_t peer);
  /* The monotonic clock now, in microseconds, read fresh (the calls' and
   * sweeps' times are the loop's, cached and in milliseconds): what the
   * heartbeats' clock samples are stamped with (trace.c). NULL: those
   * times are used. */
  uint64_t (*clock_us)(gs_responder_t *r);
};

/* Conveniences over r->reply. */
void gs__respond(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id,
                 const pb_msgdesc_t *fields, const void *msg);
void gs__respond_bytes(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id,
                       const uint8_t *body, size_t len);
void gs__respond_error(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id, int err,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
