/* Internals shared by the coordinator's modules: the service struct, the
 * connection table, jobs and their members. Not part of the public API. */
#ifndef GS_COORD_H
#define GS_COORD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "buf.h"
#include "coordinator.h"
#include "gradsync.pb.h"
#include "http_server.h"
#include "pb_array.h"
#include "wire.h"

/* A connection handle that survives the connection: replies to a closed
 * connection are dropped instead of touching freed memory. */
typedef struct gs_conn_ref {
  uint32_t slot;
  uint32_t gen;
} gs_conn_ref_t;

typedef struct gs_member gs_member_t;
typedef struct gs_job gs_job_t;

/* Reads land in one buffer shared by every connection (the loop is single
 * threaded and a read is parsed before on_read returns); only the bytes of
 * a frame not yet complete are copied into the connection's own rbuf. */
#define GS_COORD_READ_CHUNK (64 * 1024)
/* Scratch and read buffers larger than this are freed once used. */
#define GS_COORD_KEEP_BUF_BYTES (64 * 1024)

typedef struct gs_conn gs_conn_t;

struct gs_conn {
  uv_tcp_t tcp;
  struct gs_coord *coord;
  gs_conn_ref_t ref;
  gs_buf_t rbuf; /* an incomplete frame */
  uint64_t last_activity_ms;
  /* The idle list: connections that may time out (not closing, nothing
   * parked), least recently active first. */
  gs_conn_t *idle_prev, *idle_next;
  bool idle_linked;
  uint32_t waiting;    /* requests parked until an event or deadline */
  gs_member_t *member; /* the rank this connection joined as, if any */
  bool closing;
  bool close_when_written; /* a stream we can no longer trust */
  char peer[64];           /* "127.0.0.1:40000", for logs */
};

typedef struct gs_conn_table {
  gs_conn_t **slots;
  uint32_t *gens;
  uint32_t *free_slots;
  uint32_t cap;
  uint32_t free_count;
  uint32_t open;
} gs_conn_table_t;

typedef struct gs_coord_stats {
  uint64_t requests[GS_METHOD_COUNT];
  uint64_t errors[GS_METHOD_COUNT];
  uint64_t bad_frames; /* oversized, undecodable or unknown */
  uint64_t conns_accepted;
  uint64_t conns_idle_closed;
  uint64_t ranks_lost;
  uint64_t generations_aborted;
} gs_coord_stats_t;

struct gs_coord {
  uv_loop_t *loop;
  gs_coord_config_t cfg;
  uv_tcp_t listener;
  uv_timer_t housekeeping;
  gs_http_server_t *http;
  gs_conn_table_t conns;
  gs_conn_t *idle_oldest, *idle_newest; /* see gs_conn */
  gs_buf_t wbuf;                        /* encodes one reply at a time */
  gs_buf_t rbody;                       /* the body of the request being dispatched */
  gs_job_t *jobs;
  uint32_t job_count;
  uint64_t coordinator_id; /* random; lets agents notice a restart */
  uint64_t started_ms;
  gs_coord_stats_t stats;
  /* GET /status is cached: the rendered document is reused while nothing
   * that could change it happened (state_version, bumped on every RPC,
   * connection change, sweep and control request) within the same loop
   * millisecond (its times have millisecond resolution). */
  uint64_t state_version;
  gs_buf_t status_body;
  uint64_t status_version, status_ms;
  bool status_valid;
  uint32_t handles_open; /* listener + timer; freed when 0 and closing */
  bool closing;
  uint8_t rbuf[GS_COORD_READ_CHUNK]; /* see GS_COORD_READ_CHUNK */
};

/* Milliseconds on the loop's clock. */
static inline uint64_t gs__now_ms(const struct gs_coord *c)
{
  return uv_now(c->loop);
}

/* Something /status shows may have changed. */
static inline void gs__state_changed(struct gs_coord *c)
{
  c->state_version++;
}

/* Frees the service once it is closing and its last handle has closed. */
void gs__coord_maybe_free(struct gs_coord *c);

/* --- conn.c: RPC connections --- */
int gs__conn_listen(struct gs_coord *c) GS_WARN_UNUSED;
gs_conn_t *gs__conn_get(struct gs_coord *c, gs_conn_ref_t ref);
void gs__conn_close(gs_conn_t *conn, const char *why);
void gs__conn_close_all(struct gs_coord *c);
void gs__conn_sweep_idle(struct gs_coord *c, uint64_t now);
/* Replies to one request. A stale ref is ignored. */
void gs__reply(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
               const pb_msgdesc_t *fields, const void *msg);
void gs__reply_bytes(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
                     const uint8_t *body, size_t len);
void gs__reply_error(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
                     int grpc_status, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Sends a last error frame (request id 0), stops reading, and closes the
 * connection once the frame is written: for streams we cannot trust. */
void gs__conn_fail(gs_conn_t *conn, int grpc_status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A call parked on this connection started / ended waiting. */
void gs__conn_park(struct gs_coord *c, gs_conn_ref_t ref);
void gs__conn_unpark(struct gs_coord *c, gs_conn_ref_t ref);

/* --- rpc.c: method dispatch --- */
typedef struct gs_call {
  gs_conn_t *conn;
  gs_method_t method;
  uint64_t request_id;
  uint64_t deadline_ms; /* absolute, on the loop clock */
  const uint8_t *body;
  size_t body_len;
} gs_call_t;

void gs__rpc_dispatch(gs_conn_t *conn, const uint8_t *payload, size_t len);

/* --- auth.c --- */
/* Whether `given` matches the configured token, in constant time. */
bool gs__token_ok(const struct gs_coord *c, const char *given);

/* --- http_routes.c --- */
int gs__http_start(struct gs_coord *c) GS_WARN_UNUSED;

#endif
