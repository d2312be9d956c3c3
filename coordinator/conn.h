/* RPC connections, the transport: accept, buffer bytes, cut frames, send
 * frames, time idle connections out; over the connection base (stream.h),
 * which writes, speaks TLS and ends the write side for it. It knows
 * frames, not what they hold:
 * it reports upward only through the callbacks its owner registered
 * (coordinator.c), in the manner of libuv's connection_cb and read_cb. */
#ifndef GS_CONN_H
#define GS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "buf.h"
#include "error.h"
#include "list.h"
#include "log.h"
#include "log_limit.h"
#include "mem_budget.h"
#include "ratelimit.h"
#include "stream.h"
#include "tls.h"

typedef struct gs_conn gs_conn_t;

/* What the owner hears. Every callback runs on the loop thread. */
typedef struct gs_conn_callbacks {
  void *ctx;
  /* A connection was accepted; non-zero refuses (closes) it. */
  int (*on_open)(void *ctx, gs_conn_t *conn);
  /* One complete frame; `payload` is valid during the call only. */
  void (*on_frame)(void *ctx, gs_conn_t *conn, const uint8_t *payload, size_t len);
  /* A frame over the size limit arrived: the connection stops reading and
   * closes once the owner's last frame (gs__conn_send_last), if any, is
   * written. */
  void (*on_oversized)(void *ctx, gs_conn_t *conn, size_t limit);
  /* A connection on_open kept is closing: no more frames, and sends are
   * dropped. */
  void (*on_close)(void *ctx, gs_conn_t *conn);
  /* The last connection was freed after gs__conns_close_all. */
  void (*on_drained)(void *ctx);
  /* Whether an authenticated connection holds nothing of the owner's (no
   * rank's liveness), so that at --max-connections it may be closed, once
   * idle for vacant_idle_ms, to admit a new one. NULL: never. */
  bool (*is_vacant)(void *ctx, const gs_conn_t *conn);
} gs_conn_callbacks_t;

/* Reads land in the port's buffer (GS_STREAM_READ_CHUNK); only the bytes
 * of a frame not yet complete are copied into the connection's own rbuf.
 * Read buffers larger than this are freed once used. */
#define GS_CONN_KEEP_BUF_BYTES (64 * 1024)
/* Backpressure: a connection with this many bytes of replies queued is
 * not read (nor its buffered frames dispatched) until half of them are
 * written, so a client that pipelines requests and never reads its
 * replies costs this much, not all the replies it asked for. */
#define GS_CONN_WRITE_HIGH (256 * 1024)
/* A connection that has not authenticated (no call has passed the token
 * check yet) may queue this much; past it, it is closed. */
#define GS_CONN_UNAUTH_WRITE_MAX (64 * 1024)
/* The connections that have not authenticated share this part of
 * --max-memory (a quarter), and are at most that share over
 * GS_CONN_UNAUTH_EACH of them (GS_CONN_UNAUTH_MIN at least, and within
 * --max-connections): whatever clients without the token hold, the
 * members keep the rest. */
#define GS_CONN_UNAUTH_SHARE 4
#define GS_CONN_UNAUTH_EACH (64 * 1024)
#define GS_CONN_UNAUTH_MIN 64
/* What connections that have not authenticated may make the loop read:
 * each, GS_CONN_UNAUTH_BURST bytes at once (any honest first call, a node
 * agent's Batch of Joins included) and GS_CONN_UNAUTH_RATE a second after
 * that; all of them together, GS_CONN_UNAUTH_ALL_BURST at once (the first
 * calls of 100,000 ranks re-registering after a restart are about 30 MB)
 * and GS_CONN_UNAUTH_ALL_RATE a second. One past either is throttled: not
 * read until the housekeeping sweep (gs__conns_sweep_idle) finds both
 * refilled, the oldest first. A client streaming large frames without the
 * token kept the loop 94 % busy reading them. */
#define GS_CONN_UNAUTH_BURST (256 * 1024)
#define GS_CONN_UNAUTH_RATE (64 * 1024)
#define GS_CONN_UNAUTH_ALL_BURST (64u << 20)
#define GS_CONN_UNAUTH_ALL_RATE (16u << 20)
/* At their cap, the oldest idle unauthenticated connection makes room if
 * it has been idle this long (a new agent's first call is on its way);
 * else the new connection is refused (agents redial with backoff). */
#define GS_CONN_UNAUTH_EVICT_IDLE_MS 1000
/* At --max-connections with no unauthenticated connection to close, an
 * authenticated one that holds no rank (a client's spare connection, or
 * one left open after a refusal) and has been idle this long makes room
 * (agents redial a closed connection with backoff). The default of
 * --vacant-idle. */
#define GS_CONN_VACANT_EVICT_IDLE_MS 10000
/* After its last frame (gs__conn_send_last) a connection shuts down its
 * write side and reads, discarding, until the peer's EOF or this long:
 * closing a socket whose peer is still sending (pipelined frames we will
 * not read) makes the kernel reset it, and the reset throws away replies
 * not yet delivered, the last frame among them. */
#define GS_CONN_LINGER_MS 2000
/* Frames dispatched per read of a connection: the rest waits in its rbuf
 * for the loop's next turn (conns->next_turn), where as many more are
 * (twice that in one turn at most: what waited, then a new read), so a
 * client that pipelines many calls, and reads their replies as fast as
 * they come, cannot hold the loop while others wait. */
#define GS_CONN_TURN_FRAMES 16
/* What an open connection costs besides its buffers (struct, the owner's
 * state, the kernel's socket is not counted). */
#define GS_CONN_BOOKKEEPING 1024

/* The transport's own state; the owner reads `id` and `peer` and keeps
 * what it needs per connection in `data`. */
struct gs_conn {
  gs_stream_t s; /* first: its socket, peer, TLS session and writes (stream.h) */
  struct gs_conns *conns;
  uint64_t id;   /* slot and generation: never reused while the service runs, never 0 */
  void *data;    /* the owner's */
  gs_buf_t rbuf; /* an incomplete frame */
  uint64_t last_activity_ms;
  /* The idle list: connections that may time out (not closing, nothing
   * parked), least recently active first; or, while it lingers, the
   * linger list. */
  gs_list_t idle_node;
  gs_list_t throttle_node; /* on conns->throttled while `throttled` */
  int64_t read_tokens;     /* bytes it may still read before it authenticates */
  uint64_t read_tokens_ms; /* when they were last refilled */
  uint32_t waiting;        /* calls parked until an event or deadline */
  uint32_t turn_frames;    /* dispatched since this read or resumption (GS_CONN_TURN_FRAMES) */
  size_t rbuf_counted;     /* rbuf.cap as counted in conns->mem */
  size_t tls_counted;      /* gs_tls_memory as counted in conns->mem */
  bool authenticated;      /* a call passed its token check (gs__conn_authenticate) */
  bool read_paused;        /* backpressure: see GS_CONN_WRITE_HIGH; or deferred */
  bool throttled;          /* not read: it read its share before authenticating */
  bool opened;             /* on_open kept it: on_close will tell the owner */
  bool close_when_written; /* a stream we can no longer trust */
  bool lingering;          /* last frame written, FIN sent: reads are discarded */
};

/* Every RPC connection, by id. */
typedef struct gs_conns {
  gs_stream_port_t base; /* its read buffer and next-turn queue (stream.h) */
  uv_loop_t *loop;
  const gs_log_t *log;
  size_t max_frame;
  uint64_t idle_timeout_ms;
  uint64_t vacant_idle_ms; /* see GS_CONN_VACANT_EVICT_IDLE_MS */
  /* Borrowed: the budget (--max-memory) the connections' bookkeeping,
   * rbufs and queued replies count in, beside what the jobs store. */
  gs_mem_budget_t *mem;
  size_t conn_used;         /* the connections' part of mem->used */
  size_t unauth_used;       /* of it, what connections not authenticated hold */
  size_t unauth_max_memory; /* their share of mem->max (GS_CONN_UNAUTH_SHARE) */
  uint32_t unauth_open;     /* connections open and not authenticated */
  uint32_t unauth_max_connections;
  uint32_t max_connections; /* open connections at most */
  gs_ratelimit_t accept_rl; /* warnings about refused connections */
  gs_log_limit_t *lines;    /* borrowed: lines about one peer (gs__conn_log) */
  gs_tls_ctx_t *tls;        /* borrowed; NULL: plaintext */
  gs_conn_callbacks_t cb;
  gs_conn_t **slots;
  uint32_t *gens;
  uint32_t *free_slots;
  uint32_t cap;
  uint32_t free_count;
  uint32_t open;
  gs_list_t idle;             /* see gs_conn */
  gs_list_t linger;           /* lingering connections, oldest first (GS_CONN_LINGER_MS) */
  gs_list_t throttled;        /* unauthenticated ones not read for their rate, oldest first */
  int64_t unauth_read_tokens; /* bytes all unauthenticated ones may still read */
  uint64_t unauth_read_ms;    /* when they were last refilled */
  uint64_t throttles;         /* times an unauthenticated connection was throttled */
  bool closing;
  uint64_t accepted, idle_closed, refused, evicted;
  uint64_t unauth_closed; /* unauthenticated connections closed or refused for their share */
} gs_conns_t;

/* The transport's limits. */
typedef struct gs_conn_limits {
  size_t max_frame;
  uint64_t idle_timeout_ms;
  uint64_t vacant_idle_ms; /* 0: GS_CONN_VACANT_EVICT_IDLE_MS */
  /* Borrowed, outlives the table: the memory budget (--max-memory). */
  gs_mem_budget_t *mem;
  uint32_t max_connections;
  /* Borrowed, outlives the table; NULL: plaintext. With it every
   * connection speaks only TLS, and its session counts in its memory. */
  gs_tls_ctx_t *tls;
  /* Borrowed, outlives the table: limits the lines about each peer. */
  gs_log_limit_t *lines;
} gs_conn_limits_t;

/* A table with no connections; free with gs__conns_free once drained. */
gs_conns_t *gs__conns_new(uv_loop_t *loop, const gs_log_t *log, const gs_conn_limits_t *lim,
                          const gs_conn_callbacks_t *cb);
/* Whether the authenticated connections and the jobs' store together hold
 * more than three quarters of their part of the memory budget (all but
 * the unauthenticated share; the HTTP port's bytes do not count here): new
 * work is then refused
 * (RESOURCE_EXHAUSTED) until replies drain or stored data is dropped; at
 * the budget itself a connection that would grow is closed. What clients
 * without the token hold never counts here. */
bool gs__conns_over_budget(const gs_conns_t *t);
void gs__conns_free(gs_conns_t *t);
/* Accepts one connection from `server` (call from its connection_cb). */
void gs__conns_accept(gs_conns_t *t, uv_stream_t *server);
/* Closes every connection; on_drained follows the last close callback. */
void gs__conns_close_all(gs_conns_t *t);
/* Whether, after gs__conns_close_all, every handle of the table is closed
 * (it may be freed). */
bool gs__conns_drained(const gs_conns_t *t);
/* Closes the connections idle for the idle timeout at `now`, and those
 * that lingered GS_CONN_LINGER_MS (or the idle timeout, if shorter); reads
 * again the throttled ones whose rate allows (GS_CONN_UNAUTH_RATE). */
void gs__conns_sweep_idle(gs_conns_t *t, uint64_t now);

/* The open connection `id` names, or NULL (closed, closing or ending
 * after its last frame). */
gs_conn_t *gs__conn_get(gs_conns_t *t, uint64_t id);
/* An id is the connection's table slot (its low GS_CONN_SLOT_BITS bits)
 * and that slot's generation (the high 32 bits); the bits between are the
 * owner's to use (rpc.c: which of a node agent's ranks), and
 * gs__conn_get ignores them. */
#define GS_CONN_SLOT_BITS 24
#define GS_CONN_SLOT_MASK ((1u << GS_CONN_SLOT_BITS) - 1)
/* Closes a connection (on_close runs now). Idempotent. */
void gs__conn_close(gs_conn_t *conn, const char *why);
/* A call on `conn` passed its token check: from now on it counts against
 * the members' budget, not the unauthenticated share. Idempotent. */
void gs__conn_authenticate(gs_conn_t *conn);
/* Sends one encoded frame; the bytes are copied only if they must wait. */
void gs__conn_send(gs_conn_t *conn, const uint8_t *frame, size_t len);
/* For streams we cannot trust: stops reading (frames already received
 * are not dispatched) and sends a last frame. Once it is written the
 * owner's on_close runs, the write side is shut down (after a TLS
 * close_notify) and the connection lingers, discarding what the peer still
 * sends, until its EOF (see GS_CONN_LINGER_MS); then it closes. Later
 * sends are dropped. */
void gs__conn_send_last(gs_conn_t *conn, const uint8_t *frame, size_t len);
/* A call parked on this connection started / ended waiting: a connection
 * with a parked call is not idle. */
void gs__conn_park(gs_conn_t *conn);
/* Logs a line of `kind` about `conn`'s peer ("rpc: PEER: ..."), limited
 * per peer address and kind (log_limit.h); a NULL `conn` logs nothing. */
void gs__conn_log(gs_conn_t *conn, gs_log_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gs__conn_unpark(gs_conn_t *conn);

#endif
