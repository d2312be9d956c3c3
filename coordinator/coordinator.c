/* The service: wires the loop. It owns the listeners and the one
 * housekeeping timer that enforces every deadline, creates the layers
 * (transport, RPC, jobs, HTTP routes) and registers the callbacks through
 * which the lower ones report upward. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>

#include "conn.h"
#include "coordinator.h"
#include "fd_budget.h"
#include "frame.h"
#include "http_events.h"
#include "http_routes.h"
#include "jobs.h"
#include "list.h"
#include "net.h"
#include "rpc.h"

#define HOUSEKEEPING_MS 50
/* Connections from which on the loop is paced (see on_pace). */
#define PACE_MIN_CONNECTIONS 1000
/* How often at most freed memory is handed back to the system (see
 * release_memory), and how far below its peak since then what the budget
 * counts must fall for it to be worth a walk of the heap. */
#define RELEASE_MEMORY_MS 1000
#define RELEASE_MEMORY_BYTES (16u << 20)

struct gs_coord {
  uv_loop_t *loop;
  gs_coord_config_t cfg;
  uv_tcp_t listener;
  uv_timer_t housekeeping;
  uv_check_t pace;
  uint64_t paced_ns;   /* when the previous loop iteration's callbacks ended */
  gs_mem_budget_t mem; /* --max-memory: the connections' and the jobs' store's */
  gs_conns_t *conns;
  gs_rpc_t rpc;
  gs_jobs_t jobs;
  gs_http_routes_t routes;
  gs_log_limit_t lines; /* lines about clients, both ports' */
  uint64_t started_ms;
  gs_ratelimit_t accept_rl; /* failed accepts are logged, not each one */
  uint32_t handles_open;    /* listener, timer, pace; freed when 0 and closing */
  uint64_t released_ms;     /* when release_memory last ran */
  bool jobs_forgotten;      /* since then */
  bool closing;
};

/* Fills in the connection caps not set from the open-file limit (main
 * raised it to the hard limit), so that the two ports and the rest never
 * need more descriptors than it allows (fd_budget.h); warns when the caps
 * that were set do. */
static void budget_descriptors(gs_coord_config_t *cfg)
{
  struct rlimit rl;
  uint64_t nofile = UINT64_MAX;
  gs_fd_budget_t b;

  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    nofile = rl.rlim_cur;
  b = gs__fd_budget(nofile, cfg->max_connections, cfg->max_http_connections);
  cfg->max_connections = b.rpc;
  cfg->max_http_connections = b.http;
  if (!b.fits)
    gs_log(&cfg->log, GS_LOG_WARN, NULL, -1,
           "open-file limit %llu is below --max-connections %u, --max-http-connections %u and "
           "%d descriptors for the rest: connections past it are closed at once, unlogged; "
           "raise the limit or lower the caps",
           (unsigned long long)nofile, b.rpc, b.http, GS_FD_OTHERS);
  else
    gs_log(&cfg->log, GS_LOG_DEBUG, NULL, -1,
           "open-file limit %llu: at most %u RPC and %u HTTP connections",
           (unsigned long long)nofile, b.rpc, b.http);
}

/* The connection table must outlive the connections' close callbacks, so
 * the coordinator is freed by whichever close callback runs last. */
static void maybe_free(gs_coord_t *c)
{
  if (!c->closing || c->handles_open > 0 || !gs__conns_drained(c->conns))
    return;
  gs__http_routes_close(&c->routes);
  gs__rpc_free(&c->rpc);
  gs__conns_free(c->conns);
  free(c);
}

/* The transport's callbacks all get rpc.c's context; this one is the
 * service's own, so it finds the service around it. */
static void on_drained(void *ctx)
{
  maybe_free(GS_CONTAINER_OF(ctx, gs_coord_t, rpc));
}

/* What /status and /metrics show of the service itself. */
static void service_info(void *ctx, gs_service_info_t *out)
{
  gs_coord_t *c = ctx;

  *out = (gs_service_info_t){
      .uptime_ms = uv_now(c->loop) - c->started_ms,
      .connections = c->conns->open,
      .unauthenticated = c->conns->unauth_open,
      .memory_bytes = c->conns->conn_used,
      .stored_bytes = c->mem.stored,
      .unauth_memory_bytes = c->conns->unauth_used,
      .unauth_closed = c->conns->unauth_closed,
      .unauth_throttled = c->conns->throttles,
      .http_memory_bytes = c->mem.http,
      .member_bytes = c->mem.members,
      .requests = c->rpc.stats.requests,
      .errors = c->rpc.stats.errors,
      .bad_frames = c->rpc.stats.bad_frames,
  };
}

/* Creates the layers bottom-up and registers the callbacks that carry
 * events upward: connections report to rpc.c, which calls the jobs layer,
 * which answers through rpc.c's responder. */
static int wire_layers(gs_coord_t *c)
{
  gs_conn_callbacks_t cb = {
      .ctx = &c->rpc,
      .on_open = gs__rpc_on_open,
      .on_frame = gs__rpc_on_frame,
      .on_oversized = gs__rpc_on_oversized,
      .on_close = gs__rpc_on_close,
      .on_drained = on_drained,
      .is_vacant = gs__rpc_is_vacant,
  };
  gs_jobs_config_t jcfg = {
      .heartbeat_interval_ms = c->cfg.heartbeat_interval_ms,
      .heartbeat_timeout_ms = c->cfg.heartbeat_timeout_ms,
      .rendezvous_timeout_ms = c->cfg.rendezvous_timeout_ms,
      .job_retention_ms = c->cfg.job_retention_ms,
      .stall_timeout_ms = c->cfg.stall_timeout_ms,
      .reregister_slack_ms = c->cfg.reregister_slack_ms,
      .max_world_size = c->cfg.max_world_size,
      .max_job_world = c->cfg.max_connections / 2,
      .max_jobs = c->cfg.max_jobs,
      .mem = &c->mem,
      .log = &c->cfg.log,
  };

  if (getrandom(&jcfg.coordinator_id, sizeof(jcfg.coordinator_id), 0) !=
      sizeof(jcfg.coordinator_id))
    jcfg.coordinator_id = (uint64_t)uv_hrtime();
  gs_conn_limits_t lim = {
      .max_frame = c->cfg.max_frame,
      .idle_timeout_ms = c->cfg.idle_timeout_ms,
      .vacant_idle_ms = c->cfg.vacant_idle_ms,
      .mem = &c->mem,
      .max_connections = c->cfg.max_connections,
      .tls = c->cfg.tls,
      .lines = &c->lines,
  };

  gs_mem_budget_init(&c->mem, c->cfg.max_memory);
  gs__log_limit_init(&c->lines, &c->cfg.log);
  c->lines.window_ms = c->cfg.log_window_ms;
  c->conns = gs__conns_new(c->loop, &c->cfg.log, &lim, &cb);
  if (!c->conns)
    return GS_ENOMEM;
  gs__jobs_init(&c->jobs, &jcfg, &c->rpc.responder);
  gs__rpc_init(&c->rpc, c->loop, c->conns, &c->jobs, &c->cfg.log, c->cfg.token,
               c->cfg.default_wait_ms);
  c->rpc.max_params = c->cfg.max_params;
  c->routes = (gs_http_routes_t){
      .jobs = &c->jobs,
      .loop = c->loop,
      .log = &c->cfg.log,
      .lines = &c->lines,
      .token = c->cfg.token,
      .auth = (gs_http_auth_t)c->cfg.http_auth,
      .service_info = service_info,
      .ctx = c,
      .tls = c->cfg.tls,
      .max_connections = c->cfg.max_http_connections,
      .mem = &c->mem,
  };
  return 0;
}

gs_coord_t *gs_coord_new(uv_loop_t *loop, const gs_coord_config_t *cfg)
{
  gs_coord_t *c = calloc(1, sizeof(*c));

  if (!c) {
    gs_log(&cfg->log, GS_LOG_ERROR, NULL, -1, "out of memory creating the coordinator");
    return NULL;
  }
  c->loop = loop;
  c->cfg = *cfg;
  budget_descriptors(&c->cfg);
  if (wire_layers(c)) {
    gs_log(&cfg->log, GS_LOG_ERROR, NULL, -1, "out of memory creating the coordinator");
    free(c);
    return NULL;
  }
  c->started_ms = uv_now(loop);
  uv_tcp_init(loop, &c->listener);
  c->listener.data = c;
  uv_timer_init(loop, &c->housekeeping);
  c->housekeeping.data = c;
  uv_check_init(loop, &c->pace);
  c->pace.data = c;
  c->handles_open = 3;
  return c;
}

/* Forgotten jobs, and a burst of replies, blobs or parked Joins given
 * back, leave their memory in malloc's free lists, and glibc hands memory
 * back to the system only from the top of its heap: any block still used
 * above them kept every page (50,000 jobs forgotten left 315 MiB
 * resident; replies to clients that did not read, 3.2 GB). malloc_trim
 * gives back the free pages wherever they lie; it walks the whole heap,
 * so at most once a RELEASE_MEMORY_MS, and only once jobs were forgotten
 * or what the budget counts fell RELEASE_MEMORY_BYTES below its peak. */
static void release_memory(gs_coord_t *c, uint64_t now)
{
  bool burst_over = c->mem.peak > c->mem.used + RELEASE_MEMORY_BYTES;

  if ((!c->jobs_forgotten && !burst_over) || now - c->released_ms < RELEASE_MEMORY_MS)
    return;
  c->jobs_forgotten = false;
  c->released_ms = now;
  c->mem.peak = c->mem.used;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

static void on_housekeeping(uv_timer_t *t)
{
  gs_coord_t *c = t->data;
  uint64_t now = uv_now(c->loop);
  uint32_t jobs = c->jobs.job_count;

  gs__jobs_sweep(&c->jobs, now);
  gs__conns_sweep_idle(c->conns, now);
  gs__log_limit_sweep(&c->lines, now);   /* summaries, even of clients gone quiet */
  gs__http_events_tick(&c->routes, now); /* the dashboard's event streams */
  c->jobs_forgotten |= c->jobs.job_count < jobs;
  release_memory(c, now);
}

/* With many connections open, the loop takes its events in rounds: an
 * iteration that ends sooner than cfg.loop_pace_ms after the previous one
 * sleeps out the rest, and the frames that came meanwhile are read in one
 * wake-up. A wake-up (epoll_wait returning, the switch back to this
 * thread) costs more than reading a frame: 12,500 node agents'
 * heartbeats spread over each second woke the loop 5,000 times a second,
 * and that was half its CPU (docs/performance.md). Few connections: no
 * pacing, every call answered at once. */
static void on_pace(uv_check_t *h)
{
  gs_coord_t *c = h->data;
  uint64_t now = uv_hrtime(), pace = c->cfg.loop_pace_ms * 1000000;

  if (c->conns->open >= PACE_MIN_CONNECTIONS && now - c->paced_ns < pace) {
    struct timespec rest = {.tv_nsec = (long)(pace - (now - c->paced_ns))};

    nanosleep(&rest, NULL);
    now = uv_hrtime();
  }
  c->paced_ns = now;
}

static void on_connection(uv_stream_t *server, int status)
{
  gs_coord_t *c = server->data;

  if (status < 0) {
    uint32_t held_back;

    if (gs_ratelimit_allow(&c->accept_rl, uv_now(c->loop), &held_back))
      gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1,
             "rpc: accept failed: %s%s (%u such lines held back)", uv_strerror(status),
             status == UV_EMFILE || status == UV_ENFILE
                 ? " (out of file descriptors: raise the open-file limit or lower "
                   "--max-connections)"
                 : "",
             held_back);
    return;
  }
  gs__conns_accept(c->conns, server);
}

int gs_coord_start(gs_coord_t *c)
{
  int err = gs_tcp_listen(&c->listener, c->cfg.rpc_host, c->cfg.rpc_port, on_connection,
                          &c->cfg.log, "rpc");

  if (err)
    return err;
  err =
      gs__http_routes_start(&c->routes, c->cfg.http_host, c->cfg.http_port, c->cfg.idle_timeout_ms);
  if (err)
    return err;
  uv_timer_start(&c->housekeeping, on_housekeeping, HOUSEKEEPING_MS, HOUSEKEEPING_MS);
  if (c->cfg.loop_pace_ms)
    uv_check_start(&c->pace, on_pace);
  return 0;
}

uint16_t gs_coord_rpc_port(const gs_coord_t *c)
{
  return gs_tcp_local_port(&c->listener);
}

uint16_t gs_coord_http_port(const gs_coord_t *c)
{
  return c->routes.http ? gs_http_server_port(c->routes.http) : 0;
}

static void on_handle_closed(uv_handle_t *h)
{
  gs_coord_t *c = h->data;

  c->handles_open--;
  maybe_free(c);
}

void gs_coord_close(gs_coord_t *c)
{
  if (c->closing)
    return;
  c->closing = true;
  gs__jobs_free(&c->jobs);
  gs__conns_close_all(c->conns);
  if (c->routes.http)
    gs_http_server_close(c->routes.http);
  c->routes.http = NULL;
  gs__log_limit_close(&c->lines, uv_now(c->loop)); /* what was held back, counted */
  uv_close((uv_handle_t *)&c->listener, on_handle_closed);
  uv_close((uv_handle_t *)&c->housekeeping, on_handle_closed);
  uv_close((uv_handle_t *)&c->pace, on_handle_closed);
}
