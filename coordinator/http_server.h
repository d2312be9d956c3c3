/* A small HTTP/1.1 server on a libuv loop we own. Parsing is done by
 * http-parser (never by hand); routing is the caller's: every complete
 * request goes to one handler function, which fills in a response.
 * Keep-alive is supported; limits on header and body sizes are enforced
 * with 431/413 replies, and malformed requests get 400 and a closed
 * connection; open connections are capped (gs_http_limits_t). */
#ifndef GS_HTTP_SERVER_H
#define GS_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "error.h"
#include "log.h"
#include "log_limit.h"
#include "mem_budget.h"
#include "tls.h"

typedef struct gs_http_request {
  const char *method;        /* "GET", "POST", ... */
  const char *path;          /* URL path, without the query ("/jobs/a") */
  const char *query;         /* after '?', or "" */
  const char *authorization; /* value of the Authorization header, or NULL */
  const char *peer;          /* "1.2.3.4:5", for lines about it (log_limit.h) */
  const char *body;          /* NUL-terminated; body_len bytes */
  size_t body_len;
} gs_http_request_t;

/* A response that stays open (an event stream): the handler's owner
 * writes to it until it ends. The connection itself, opaque. */
typedef struct gs_http_stream gs_http_stream_t;

/* Told about a stream: `data` is the response's stream_data. */
typedef void (*gs_http_stream_fn)(void *data, gs_http_stream_t *s);

typedef struct gs_http_response {
  int status;               /* 200, 404, ... */
  const char *content_type; /* static string, e.g. "application/json" */
  char *body;               /* malloc'd by the handler; the server frees it */
  size_t body_len;
  /* When set, how the server lets go of `body` once written, instead of
   * free(): a body several replies share (the step trace's, kept by its
   * job), which `body_release(body_arg)` releases once per reply. Its
   * owner counts it in the memory budget, once; a reply waiting with it
   * counts its head and bookkeeping. */
  void (*body_release)(void *body_arg);
  void *body_arg;
  const char *allow; /* for 405: the Allow header value, or NULL */
  /* More header lines, each "Name: value\r\n" (a static string), or NULL. */
  const char *headers;
  /* An event stream, when on_stream_close is set: the head goes out with
   * no Content-Length and `Connection: close`, the body as the first
   * bytes, and the connection stays open for gs_http_stream_write; it
   * reads no further request and is not idle while open. Exactly one of
   * these follows: on_stream_open(stream_data, s) and later, once,
   * on_stream_close(stream_data, s) when the client goes away, a write
   * fails or falls too far behind, or the server closes; or
   * on_stream_close(stream_data, NULL) when the stream never opened (a
   * HEAD, a status other than 200, a connection already ending). */
  gs_http_stream_fn on_stream_open, on_stream_close;
  void *stream_data;
} gs_http_response_t;

/* Called once per complete request, on the loop thread. Must not block. */
typedef void (*gs_http_handler_fn)(void *ctx, const gs_http_request_t *req,
                                   gs_http_response_t *res);

typedef struct gs_http_limits {
  size_t max_header_bytes;  /* request line + headers; 431 beyond */
  size_t max_body_bytes;    /* 413 beyond */
  uint64_t idle_timeout_ms; /* a connection with no complete request for this long is closed */
  /* Open connections at most (0: no cap). At the cap the one idle longest
   * (no request in progress, no reply being written) is closed to admit a
   * new one; if none is idle, the one whose request began first (a client
   * trickling its requests cannot hold the port); if every one has a reply
   * being written, the new one is closed at once. Logged, a few lines per
   * 10 s. */
  size_t max_connections;
  /* Limits the lines about each client (log_limit.h); borrowed, outlives
   * the server. NULL: the server limits them with a table of its own. */
  gs_log_limit_t *lines;
  /* The memory budget (--max-memory; borrowed until gs_http_server_close;
   * NULL: none) that the replies waiting to be written and the requests
   * held unparsed count in: a reply that would pass it closes its connection. A connection
   * whose waiting replies pass its share (a quarter of the budget over
   * max_connections, from 64 KiB to 1 MiB) is not read until they drain
   * to half of it, and is closed at the idle timeout if they do not. */
  gs_mem_budget_t *mem;
} gs_http_limits_t;

typedef struct gs_http_server gs_http_server_t;

/* Creates a server on `loop`. `log` and `ctx` must outlive it. Returns NULL
 * (reason logged) on failure; free with gs_http_server_close. */
gs_http_server_t *gs_http_server_new(uv_loop_t *loop, const gs_log_t *log,
                                     const gs_http_limits_t *limits, gs_http_handler_fn handler,
                                     void *ctx);

/* Makes every connection speak only TLS with `tls` (borrowed: it must
 * outlive the server); call before listening. A plain HTTP request is
 * answered 400 in plain text, saying to use https. */
void gs_http_server_use_tls(gs_http_server_t *srv, gs_tls_ctx_t *tls);

/* Binds and listens on host:port (port 0: any free port). */
int gs_http_server_listen(gs_http_server_t *srv, const char *host, uint16_t port) GS_WARN_UNUSED;

/* The bound port, after a successful listen. */
uint16_t gs_http_server_port(const gs_http_server_t *srv);

/* Number of open client connections (for metrics). */
size_t gs_http_server_connections(const gs_http_server_t *srv);

/* Sends `len` bytes on an open stream: at once when the socket takes
 * them, else from a copy queued behind the bytes before them. A client
 * with GS_HTTP_STREAM_BACKLOG bytes still queued is not reading: its
 * stream is closed. May call the stream's on_stream_close before it
 * returns (then it returns an error, and `s` is gone). */
#define GS_HTTP_STREAM_BACKLOG (256u * 1024)
int gs_http_stream_write(gs_http_stream_t *s, const char *data, size_t len) GS_WARN_UNUSED;

/* Number of open streams (for metrics). */
size_t gs_http_server_streams(const gs_http_server_t *srv);

/* Closes the listener and every connection; the memory is freed in the
 * last close callback, so run the loop until it has no active handles. */
void gs_http_server_close(gs_http_server_t *srv);

#endif
