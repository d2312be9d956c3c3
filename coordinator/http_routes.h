/* The HTTP API over the jobs layer: /healthz, /status, /jobs/NAME,
 * /metrics, POST /jobs/NAME/control, the dashboard (/, /ui and its files)
 * and its event streams (/events), served by http_server.c. */
#ifndef GS_HTTP_ROUTES_H
#define GS_HTTP_ROUTES_H

#include <uv.h>

#include "buf.h"
#include "config.h"
#include "http_server.h"
#include "jobs.h"
#include "list.h"
#include "status.h"

#define GS_STATUS_LARGE_RANKS 10000
#define GS_STATUS_LAG_MS 250

/* The first page of GET /status, cached (http_status.c owns it): it is
 * reused while nothing it shows changed (the jobs' version and progress,
 * the connection count) within the same loop millisecond (its times have
 * millisecond resolution). A page of GS_STATUS_LARGE_RANKS ranks or more,
 * which heartbeats change thousands of times a second and which takes
 * milliseconds to render, is reused for up to GS_STATUS_LAG_MS while only
 * heartbeats' progress changed. */
typedef struct gs_status_cache {
  gs_buf_t body;
  uint64_t version, progress, ms, ranks;
  uint32_t connections;
  bool valid;
} gs_status_cache_t;

/* The open event streams (gs_http_sub_t, http_events.c owns them), and
 * when they were last sent a snapshot. */
typedef struct gs_http_event_subs {
  gs_list_t list;
  uint64_t sent_ms;
} gs_http_event_subs_t;

typedef struct gs_http_routes {
  gs_jobs_t *jobs;
  uv_loop_t *loop; /* its clock dates the status */
  const gs_log_t *log;
  const char *token; /* "" means HTTP needs no token */
  gs_http_auth_t auth;
  /* Fills in the service's own numbers; set by the owner. */
  void (*service_info)(void *ctx, gs_service_info_t *out);
  void *ctx;
  gs_tls_ctx_t *tls;        /* borrowed; NULL: plain HTTP */
  uint32_t max_connections; /* open HTTP connections at most; 0: no cap */
  gs_mem_budget_t *mem;     /* borrowed: --max-memory, which replies count in */
  /* Borrowed: limits the lines about each client (log_limit.h). */
  gs_log_limit_t *lines;
  gs_http_server_t *http;
  gs_status_cache_t status;  /* http_status.c's */
  gs_http_event_subs_t subs; /* http_events.c's */
} gs_http_routes_t;

/* Creates the server and listens on host:port; the fields above the
 * cache must be set. */
int gs__http_routes_start(gs_http_routes_t *r, const char *host, uint16_t port,
                          uint64_t idle_timeout_ms) GS_WARN_UNUSED;
/* The router, the server's handler (`ctx` is the gs_http_routes_t): one
 * parsed request in, its response out. Public so the fuzz harness
 * (tests/fuzz/fuzz_http.c) can call it without a socket. */
void gs__http_routes_handle(void *ctx, const gs_http_request_t *req, gs_http_response_t *res);

/* Closes the server (its memory goes in its last close callback) and frees
 * the cache. */
void gs__http_routes_close(gs_http_routes_t *r);

#endif
