/* What the node agent's files share (relay.c the loop and connections,
 * beats.c the heartbeats, pack_list.c the pack list): its state and the
 * few helpers they call. Not for outside agent/relay/. */
#ifndef GS_RELAY_INTERNAL_H
#define GS_RELAY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "buf.h"
#include "node_beats.h"
#include "relay.h"
#include "tls_session.h"
#include "wire.h"

#define MAX_SLOT 255                      /* the coordinator's slots: 1..255 */
#define GOOD_TOKENS 8                     /* tokens the coordinator took, kept */
#define UP_FRAME_MAX (64u << 20)          /* a Batch reply holds a node's replies */
#define BATCH_ID_BASE (UINT64_C(1) << 62) /* the relay's own request ids upstream */
#define PACK_LIST_PATH GS_METHOD_PREFIX "FetchPackList"
#define HEARTBEAT_PATH GS_METHOD_PREFIX "Heartbeat"

typedef struct local {
  uv_pipe_t pipe;
  gs_relay_t *r;
  uint32_t slot;
  gs_buf_t rbuf;
  /* Its rank's heartbeats (proto/README.md, "NodeHeartbeat"): the latest,
   * due to go up in the node's next NodeHeartbeat; the last reply the
   * coordinator sent for the slot (held_seq counts them here, news is
   * the coordinator's number); what the rank was last given; its long
   * poll, parked here until the node's next tick or news. */
  gradsync_HeartbeatRequest beat;
  char session[48];
  /* The token its beat goes up under (grouped with other slots' of the
   * same token), and the call whose reply will say whether the
   * coordinator takes a token (its latest Join, or heartbeat sent alone). */
  char token[256];
  char check_token[256];
  uint64_t check_id;
  bool checking;
  bool beat_due, bound; /* bound: a reply without an abort came: no session needed */
  gradsync_Envelope held;
  gs_buf_t held_body;
  uint64_t held_seq, given_seq, news;
  bool parked;
  uint64_t parked_id;
} local_t;

/* Calls held to go up together: encoded Batch entries, all of one token. */
typedef struct pending {
  gs_buf_t entries;
  uint32_t count;
  char token[256]; /* the callers' (a call with another goes in the next batch) */
} pending_t;

/* The pack list of one generation, fetched once for the node. */
typedef struct pack_list {
  char job[128];
  uint64_t generation;
  bool asked, have; /* a fetch is on its way up / its reply is kept below */
  uint32_t asker_slot;
  uint64_t asker_id;
  gradsync_Envelope reply; /* its reply, and the reply's body */
  gs_buf_t body;
  struct waiter {
    uint32_t slot;
    uint64_t request_id;
  } waiters[MAX_SLOT];
  uint32_t nwaiters;
} pack_list_t;

struct gs_relay {
  gs_relay_config_t cfg;
  uv_loop_t *loop;
  uv_pipe_t server;
  uv_tcp_t up;
  uv_connect_t up_req;
  uv_getaddrinfo_t resolve;
  bool up_open, up_ready, stopping;
  bool up_heard, up_bad_frame; /* TLS: plaintext came on this connection; a bad frame in it */
  gs_buf_t up_rbuf;
  gs_tls_t *up_tls;        /* with cfg.tls: the upstream session */
  uint8_t up_plain[16384]; /* what it decrypts, a piece at a time */
  uv_timer_t flush, redial;
  uv_timer_cb on_flush; /* the batching window's end (relay.c's, for relay_send.c) */
  local_t *slots[MAX_SLOT + 1];
  pending_t joins;
  uint32_t beats_due; /* slots whose beat waits for the next NodeHeartbeat */
  /* Tokens the coordinator took from a rank's call (its reply was not
   * UNAUTHENTICATED), latest first: a heartbeat goes in the node's
   * NodeHeartbeat (the connection's own call, where a wrong token would
   * end the node's connection) only under one of them; with another it
   * goes up alone, on its slot, where a wrong token is refused alone. */
  char good_tokens[GOOD_TOKENS][256];
  uint32_t good_count;
  uv_timer_t tick;            /* ends the parked heartbeats' waits, all together */
  gs_node_beats_t node_beats; /* the NodeHeartbeat being built */
  pack_list_t pl;
  uint64_t batch_seq;
  gs_buf_t body, frame_body, out; /* scratch: decoded bodies, a frame being built */
  uint32_t open_handles;
};

/* relay_send.c: queues `len` bytes on a stream (false when it cannot: out
 * of memory, or the stream is closing); sends `env` with the body bytes as
 * one frame; starts the batching window if it is not running. */
bool gs__relay_write(uv_stream_t *s, const uint8_t *data, size_t len);
bool gs__relay_send_frame(gs_relay_t *r, uv_stream_t *s, const gradsync_Envelope *env,
                          const uint8_t *body, size_t len);
/* Sends `len` bytes (a frame, or a node's frames) to the coordinator, in
 * TLS when the relay speaks it; false when it cannot. */
bool gs__relay_send_up(gs_relay_t *r, const uint8_t *data, size_t len);
void gs__relay_flush_soon(gs_relay_t *r);
/* Whether the coordinator took `token` from some rank (good_tokens); the
 * reply to `l`'s call `env`, going up alone, will tell whether it takes
 * `env`'s. */
bool gs__relay_token_good(const gs_relay_t *r, const char *token);
void gs__relay_token_check(local_t *l, const gradsync_Envelope *env);

/* beats.c: a rank's Heartbeat (false when it does not decode: it goes up
 * alone), the coordinator's reply for a slot's beat, and the node's beats
 * due sent up. */
bool gs__relay_beat(gs_relay_t *r, local_t *l, const gradsync_Envelope *env, const gs_buf_t *body);
void gs__relay_beat_news(local_t *l, const gradsync_Envelope *env, const gs_buf_t *body);
void gs__relay_beats_flush(gs_relay_t *r);

/* pack_list.c: a rank's FetchPackList (false: it goes up as it is), and
 * the reply to the node's fetch. */
bool gs__relay_pack_list_fetch(gs_relay_t *r, local_t *l, const gradsync_Envelope *env,
                               const gs_buf_t *body);
void gs__relay_pack_list_reply(gs_relay_t *r, const gradsync_Envelope *env, const gs_buf_t *body);

#endif
