/* The service: owns the listeners, the connection table, the jobs and the
 * one housekeeping timer that enforces every deadline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "coord.h"
#include "frame.h"
#include "job.h"
#include "net.h"

#define HOUSEKEEPING_MS 50

void gs_coord_config_defaults(gs_coord_config_t *cfg)
{
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->rpc_host, sizeof(cfg->rpc_host), "0.0.0.0");
  cfg->rpc_port = 7070;
  snprintf(cfg->http_host, sizeof(cfg->http_host), "0.0.0.0");
  cfg->http_port = 8080;
  cfg->heartbeat_interval_ms = 1000;
  cfg->heartbeat_timeout_ms = 10000;
  cfg->rendezvous_timeout_ms = 300000;
  cfg->idle_timeout_ms = 60000;
  cfg->default_wait_ms = 60000;
  cfg->job_retention_ms = 3600000;
  cfg->max_frame = GS_FRAME_DEFAULT_MAX;
  cfg->max_world_size = 65536;
  cfg->log.level = GS_LOG_INFO;
  cfg->log.component = "coordinator";
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
  if (getrandom(&c->coordinator_id, sizeof(c->coordinator_id), 0) != sizeof(c->coordinator_id))
    c->coordinator_id = (uint64_t)uv_hrtime();
  c->started_ms = uv_now(loop);
  uv_tcp_init(loop, &c->listener);
  c->listener.data = c;
  uv_timer_init(loop, &c->housekeeping);
  c->housekeeping.data = c;
  c->handles_open = 2;
  return c;
}

static void on_housekeeping(uv_timer_t *t)
{
  gs_coord_t *c = t->data;
  uint64_t now = gs__now_ms(c);

  gs__state_changed(c);
  gs__jobs_sweep(c, now);
  gs__conn_sweep_idle(c, now);
}

int gs_coord_start(gs_coord_t *c)
{
  int err = gs__conn_listen(c);

  if (err)
    return err;
  err = gs__http_start(c);
  if (err)
    return err;
  uv_timer_start(&c->housekeeping, on_housekeeping, HOUSEKEEPING_MS, HOUSEKEEPING_MS);
  return 0;
}

uint16_t gs_coord_rpc_port(const gs_coord_t *c)
{
  return gs_tcp_local_port(&c->listener);
}

uint16_t gs_coord_http_port(const gs_coord_t *c)
{
  return c->http ? gs_http_server_port(c->http) : 0;
}

static void free_coord(gs_coord_t *c)
{
  free(c->conns.slots);
  free(c->conns.gens);
  free(c->conns.free_slots);
  gs_buf_free(&c->wbuf);
  gs_buf_free(&c->rbody);
  gs_buf_free(&c->status_body);
  free(c);
}

/* The connection table must outlive the connections' close callbacks, so
 * the coordinator is freed by whichever close callback runs last. */
void gs__coord_maybe_free(gs_coord_t *c)
{
  if (c->closing && c->handles_open == 0 && c->conns.open == 0)
    free_coord(c);
}

static void on_handle_closed(uv_handle_t *h)
{
  gs_coord_t *c = h->data;

  c->handles_open--;
  gs__coord_maybe_free(c);
}

void gs_coord_close(gs_coord_t *c)
{
  if (c->closing)
    return;
  c->closing = true;
  gs__jobs_free(c);
  gs__conn_close_all(c);
  if (c->http)
    gs_http_server_close(c->http);
  uv_close((uv_handle_t *)&c->listener, on_handle_closed);
  uv_close((uv_handle_t *)&c->housekeeping, on_handle_closed);
}
