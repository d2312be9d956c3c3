/* The RPC layer: turns frames into calls and replies into frames. It owns
 * the Envelope (decode, encode, the one conversion of GS_E* codes to gRPC
 * statuses), authentication, the method table and request checks, and
 * implements the responder the jobs layer answers through. coordinator.c
 * registers its gs__rpc_on_* functions as the transport's callbacks. */
#ifndef GS_RPC_H
#define GS_RPC_H

#include <stdint.h>
#include <uv.h>

#include "buf.h"
#include "conn.h"
#include "jobs.h"
#include "node_beats.h"
#include "responder.h"

typedef struct gs_rpc_stats {
  uint64_t requests[GS_METHOD_COUNT];
  uint64_t errors[GS_METHOD_COUNT];
  uint64_t bad_frames; /* oversized, undecodable or unknown */
} gs_rpc_stats_t;

/* A NodeHeartbeat being dispatched: its columns, and its beats as calls
 * (at most one per slot). Made at the first, about 70 KB. */
typedef struct gs_rpc_node_beats {
  gs_node_beats_t columns;
  gs_node_beat_t beats[GS_NODE_BEATS_MAX];
} gs_rpc_node_beats_t;

typedef struct gs_rpc {
  gs_responder_t responder; /* what gs_jobs_t answers through */
  uv_loop_t *loop;          /* its clock (uv_now) times the calls */
  gs_conns_t *conns;
  gs_jobs_t *jobs;
  const gs_log_t *log;
  const char *token; /* "" means no authentication */
  uint64_t default_wait_ms;
  uint32_t max_params; /* pack-list entries accepted (--max-params) */
  gs_buf_t wbuf;       /* encodes one reply at a time */
  gs_buf_t rbody;      /* the body of the request being dispatched */
  gs_buf_t ibody;      /* that of a call of a Batch being dispatched */
  gs_buf_t tmp;        /* a batched reply's body, encoded */
  gs_buf_t batch_out;  /* a Batch's replies, gathered */
  gs_rpc_node_beats_t *node_beats;
  gs_rpc_stats_t stats;
} gs_rpc_t;

/* Sets up `rpc` over `conns` and `jobs` (borrowed). */
void gs__rpc_init(gs_rpc_t *rpc, uv_loop_t *loop, gs_conns_t *conns, gs_jobs_t *jobs,
                  const gs_log_t *log, const char *token, uint64_t default_wait_ms);
void gs__rpc_free(gs_rpc_t *rpc);

/* The transport's callbacks (see gs_conn_callbacks_t); ctx is the gs_rpc_t. */
int gs__rpc_on_open(void *ctx, gs_conn_t *conn);
void gs__rpc_on_frame(void *ctx, gs_conn_t *conn, const uint8_t *payload, size_t len);
void gs__rpc_on_oversized(void *ctx, gs_conn_t *conn, size_t limit);
void gs__rpc_on_close(void *ctx, gs_conn_t *conn);
/* Whether the connection carries no rank (no Join waiting, no rank's
 * liveness): see gs_conn_callbacks_t.is_vacant. */
bool gs__rpc_is_vacant(void *ctx, const gs_conn_t *conn);

#endif
