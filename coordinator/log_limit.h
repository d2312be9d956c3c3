/* Lines about clients, limited per peer address and per kind. Every line
 * that what a client sent (or failed to send) makes the coordinator write
 * goes through here: a wrong token, a bad frame or request, a failed TLS
 * handshake, a client over a limit. A limit per connection was not one: a
 * host that opened a connection per mistake wrote 63,540 lines in 20 s.
 *
 * Per (address, kind): GS_LOG_LIMIT_BURST lines per window of
 * window_ms (GS_LOG_LIMIT_WINDOW_MS unless the owner sets another) from
 * its first line; the rest are counted, and
 * one summary line gives the count when the window ends, or when the pair
 * is forgotten to make room. The table is fixed (GS_LOG_LIMIT_SLOTS
 * pairs), so a client with many addresses costs no memory; for those, a
 * limit on every line about any client (GS_LOG_LIMIT_ALL per window, the
 * summaries included) with a summary of its own. Every line held back is
 * counted in exactly one summary.
 *
 * Pure: the caller passes the clock, and calls gs__log_limit_sweep often
 * (the coordinator's housekeeping timer) so that a summary is written
 * when its window ends even if the client has gone quiet. */
#ifndef GS_LOG_LIMIT_H
#define GS_LOG_LIMIT_H

#include <stdarg.h>
#include <stdint.h>

#include "list.h"
#include "log.h"

#define GS_LOG_LIMIT_BURST 5          /* lines per address and kind, per window */
#define GS_LOG_LIMIT_WINDOW_MS 10000u /* a window's length by default */
#define GS_LOG_LIMIT_ALL 50           /* lines about all clients together, per window */
#define GS_LOG_LIMIT_SLOTS 256        /* (address, kind) pairs remembered */
#define GS_LOG_LIMIT_WAYS 8           /* where a pair may sit: one set of this many */

/* The kinds of line, each with its transport, level and the name its
 * summary gives it. */
#define GS_LOG_KIND_MAP(XX)                                                                        \
  XX(RPC_TOKEN, "rpc", WARN, "refused token")                                                      \
  XX(RPC_FRAME, "rpc", WARN, "bad frame")    /* oversized, undecodable envelope */                 \
  XX(RPC_CALL, "rpc", WARN, "bad call")      /* unknown method, undecodable request */             \
  XX(RPC_LIMIT, "rpc", WARN, "over a limit") /* memory, replies not read */                        \
  XX(RPC_TLS, "rpc", WARN, "TLS failure")                                                          \
  XX(RPC_IDLE, "rpc", INFO, "idle timeout")                                                        \
  XX(HTTP_TOKEN, "http", WARN, "refused token")                                                    \
  XX(HTTP_REQUEST, "http", WARN, "bad request") /* 400, 413, 431 */                                \
  XX(HTTP_LIMIT, "http", WARN, "over a limit")                                                     \
  XX(HTTP_TLS, "http", WARN, "TLS failure")                                                        \
  XX(HTTP_IDLE, "http", INFO, "idle timeout")                                                      \
  XX(HTTP_IO, "http", INFO, "read or write failure")

typedef enum gs_log_kind {
#define XX(name, transport, level, what) GS_LOG_KIND_##name,
  GS_LOG_KIND_MAP(XX)
#undef XX
      GS_LOG_KIND_COUNT
} gs_log_kind_t;

/* One (address, kind) pair with a window open. */
typedef struct gs_log_limit_slot {
  gs_list_t node; /* on `windows`, oldest window first; unlinked: free */
  uint64_t window_start_ms;
  uint32_t written;    /* lines written in this window */
  uint32_t suppressed; /* lines held back in this window */
  uint8_t kind;
  char address[56]; /* the peer without its port: "1.2.3.4", "[::1]" */
} gs_log_limit_slot_t;

typedef struct gs_log_limit {
  const gs_log_t *log;
  uint64_t window_ms; /* a window's length; the owner may set it after init */
  gs_list_t windows;  /* the slots in use, by window start */
  uint64_t all_start_ms;
  uint32_t all_written;    /* lines about any client in this window */
  uint64_t all_suppressed; /* held back by GS_LOG_LIMIT_ALL */
  gs_log_limit_slot_t slots[GS_LOG_LIMIT_SLOTS];
} gs_log_limit_t;

/* Empty, writing to `log` (borrowed), windows of GS_LOG_LIMIT_WINDOW_MS.
 * Holds no resources; see gs__log_limit_close. */
void gs__log_limit_init(gs_log_limit_t *ll, const gs_log_t *log);
/* Writes "TRANSPORT: PEER: MESSAGE" at the kind's level, or counts it if
 * `peer`'s address ("1.2.3.4:5", "[::1]:5"; NULL reads as "?") is past its
 * limit for `kind`, or every client is past theirs. */
void gs__log_limit_line(gs_log_limit_t *ll, uint64_t now_ms, const char *peer, gs_log_kind_t kind,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same with a va_list: the message is formatted only if written. */
void gs__log_limit_vline(gs_log_limit_t *ll, uint64_t now_ms, const char *peer, gs_log_kind_t kind,
                         const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));
/* Ends the windows that have run their length at `now_ms`, writing the
 * summary of what each held back. O(windows ended). */
void gs__log_limit_sweep(gs_log_limit_t *ll, uint64_t now_ms);
/* Writes the summaries still pending (at shutdown) and forgets them. */
void gs__log_limit_close(gs_log_limit_t *ll, uint64_t now_ms);

#endif
