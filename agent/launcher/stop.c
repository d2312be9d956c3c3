/* Stopping in order: agents first (SIGTERM, SIGKILL after the grace
 * period), then the coordinator, and the deadlines that drive it. The first
 * failure sets the exit status. */
#include <signal.h>
#include <stdint.h>

#include "clock.h"
#include "launcher.h"

static void signal_agents(gs_run_t *r, int sig)
{
  for (long i = 0; i < r->cfg.nproc; i++)
    gs__run_signal_child(&r->agents[i], sig);
}

/* Records the run's exit status; the first failure wins. */
void gs__run_fail(gs_run_t *r, int code)
{
  if (r->exit_code == 0)
    r->exit_code = code;
}

/* Moves through the stop phases as children go: agents first (none
 * running and none waiting to be restarted), then the coordinator and the
 * node agent (SIGTERM, SIGKILL after the grace period), then done. */
void gs__run_advance(gs_run_t *r)
{
  if (r->phase == GS_RUN_RUNNING && r->agents_running == 0 && r->agents_pending == 0)
    r->phase = GS_RUN_STOP_AGENTS;
  if (r->phase == GS_RUN_STOP_AGENTS && r->agents_running == 0) {
    r->phase = GS_RUN_STOP_COORD;
    r->agents_deadline = 0;
    if (r->coord.running || r->relay.running) {
      gs__run_signal_child(&r->coord, SIGTERM);
      gs__run_signal_child(&r->relay, SIGTERM);
      r->coord_deadline = gs_now_ms() + r->cfg.grace_ms;
    }
  }
  if (r->phase == GS_RUN_STOP_COORD && !r->coord.running && !r->relay.running) {
    r->phase = GS_RUN_DONE;
    r->coord_deadline = 0;
  }
}

void gs__run_drop_restarts(gs_run_t *r, const char *why)
{
  for (long i = 0; i < r->cfg.nproc && r->agents_pending > 0; i++) {
    if (!r->agents[i].restart_at)
      continue;
    gs__run_say("not restarting %s: %s", r->agents[i].name, why);
    r->agents[i].restart_at = 0;
    r->agents_pending--;
  }
}

/* Starts stopping: SIGTERM to every running agent, SIGKILL after the grace
 * period (see gs__run_check_deadlines); no-op when already stopping. */
void gs__run_begin_stop(gs_run_t *r)
{
  if (r->phase == GS_RUN_STARTING || r->phase == GS_RUN_RUNNING) {
    r->phase = GS_RUN_STOP_AGENTS;
    gs__run_drop_restarts(r, "stopping");
    if (r->agents_running > 0) {
      signal_agents(r, SIGTERM);
      r->agents_deadline = gs_now_ms() + r->cfg.grace_ms;
    }
  }
  gs__run_advance(r);
}

void gs__run_kill_everything(gs_run_t *r)
{
  signal_agents(r, SIGKILL);
  gs__run_signal_child(&r->coord, SIGKILL);
  gs__run_signal_child(&r->relay, SIGKILL);
  r->agents_deadline = r->coord_deadline = 0;
}

/* SIGINT, SIGTERM or SIGHUP: the first stops the run in order; a SIGINT
 * while stopping kills everything now. */
void gs__run_on_stop_signal(gs_run_t *r, int sig)
{
  char name[32];

  gs__run_signal_name(sig, name, sizeof(name));
  if (r->phase == GS_RUN_STARTING || r->phase == GS_RUN_RUNNING) {
    if (r->phase == GS_RUN_STARTING)
      gs__run_say("received %s; stopping the coordinator", name);
    else if (r->agents_running == 0) /* only restarts waiting */
      gs__run_say("received %s; stopping", name);
    else
      gs__run_say("received %s; stopping %d rank%s (SIGINT again kills them now)", name,
                  r->agents_running, r->agents_running == 1 ? "" : "s");
    gs__run_fail(r, 128 + sig);
    gs__run_begin_stop(r);
  } else if (sig == SIGINT) {
    gs__run_say("received SIGINT while stopping; killing every process now");
    gs__run_kill_everything(r);
  }
}

/* A reaped child whose pipes are still open. */
static bool is_draining(const gs_run_child_t *c)
{
  return !c->running && (c->out.fd >= 0 || c->err.fd >= 0);
}

/* Sends SIGKILL once a grace period or the startup deadline has passed. */
void gs__run_check_deadlines(gs_run_t *r)
{
  uint64_t now = gs_now_ms();

  if (r->phase == GS_RUN_STARTING && r->ready_deadline && now >= r->ready_deadline) {
    if (r->relay.running)
      gs__run_say("node agent %s did not say it listens within %d s; stopping it", r->cfg.relay_bin,
                  GS_RUN_READY_MS / 1000);
    else
      gs__run_say("coordinator %s did not print its address within %d s; stopping it",
                  r->cfg.coord_bin, GS_RUN_READY_MS / 1000);
    gs__run_fail(r, 1);
    r->ready_deadline = 0;
    gs__run_begin_stop(r);
  }
  if (r->agents_deadline && now >= r->agents_deadline) {
    for (long i = 0; i < r->cfg.nproc; i++) {
      if (!r->agents[i].running)
        continue;
      gs__run_say("%s did not stop within %s of SIGTERM; sending SIGKILL", r->agents[i].name,
                  r->cfg.grace_text);
      gs__run_signal_child(&r->agents[i], SIGKILL);
    }
    r->agents_deadline = 0;
  }
  for (long i = -2; i < r->cfg.nproc; i++) {
    gs_run_child_t *c = i == -2 ? &r->relay : i == -1 ? &r->coord : &r->agents[i];

    if (is_draining(c) && now >= c->drain_deadline) {
      gs__run_stream_close(&c->out);
      gs__run_stream_close(&c->err);
    }
  }
  if (r->coord_deadline && now >= r->coord_deadline) {
    if (r->coord.running)
      gs__run_say("coordinator did not stop within %s of SIGTERM; sending SIGKILL",
                  r->cfg.grace_text);
    if (r->relay.running)
      gs__run_say("node agent did not stop within %s of SIGTERM; sending SIGKILL",
                  r->cfg.grace_text);
    gs__run_signal_child(&r->coord, SIGKILL);
    gs__run_signal_child(&r->relay, SIGKILL);
    r->coord_deadline = 0;
  }
}

/* Milliseconds until the next deadline, or -1 when there is none. */
int gs__run_next_timeout(const gs_run_t *r)
{
  uint64_t next = UINT64_MAX, now = gs_now_ms();

  if (r->phase == GS_RUN_STARTING && r->ready_deadline)
    next = r->ready_deadline;
  if (r->agents_deadline && r->agents_deadline < next)
    next = r->agents_deadline;
  if (r->coord_deadline && r->coord_deadline < next)
    next = r->coord_deadline;
  for (long i = -2; i < r->cfg.nproc; i++) {
    const gs_run_child_t *c = i == -2 ? &r->relay : i == -1 ? &r->coord : &r->agents[i];

    if (is_draining(c) && c->drain_deadline < next)
      next = c->drain_deadline;
    if (c->restart_at && c->restart_at < next)
      next = c->restart_at;
  }
  if (next == UINT64_MAX)
    return -1;
  return next <= now ? 0 : (int)(next - now);
}
