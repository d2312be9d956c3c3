/* Restarting a failed rank (--max-restarts K): a local rank that exits
 * non-zero or is killed, while its slot has restarts left, is started
 * again in the same slot with the same argv and environment (spawn.c)
 * instead of stopping the others. The restart waits a backoff that
 * doubles with each restart of the slot, so that a crash loop does not
 * spin. With a fixed world size the lost rank aborts the generation, so
 * the others fail as well and are restarted within their own budgets; all
 * of them then join the new rendezvous the coordinator opens. */
#include <stdio.h>

#include "clock.h"
#include "launcher.h"

/* Says how rank c ended and, while its slot has restarts left, schedules
 * its restart: true then (the run goes on), false when the failure is to
 * stop the run. Called only while the ranks run. */
bool gs__run_restart_later(gs_run_t *r, gs_run_child_t *c, const char *how)
{
  uint64_t now = gs_now_ms(), ran = now - c->started;
  long max = r->cfg.max_restarts;

  if (max == 0) {
    gs__run_say("%s %s", c->name, how);
    return false;
  }
  if (c->restarts >= max) {
    gs__run_say("%s %s after %.1f s; no restarts left (%ld of %ld used)", c->name, how,
                (double)ran / 1000.0, c->restarts, max);
    return false;
  }
  /* A rank that ran longer than the longest wait was no crash loop. */
  if (c->backoff_ms == 0 || ran >= GS_RUN_BACKOFF_MAX_MS)
    c->backoff_ms = GS_RUN_BACKOFF_MS;
  c->restarts++;
  c->restart_at = now + c->backoff_ms;
  r->agents_pending++;
  gs__run_say("%s %s after %.1f s; restarting it in %llu s (restart %ld of %ld)", c->name, how,
              (double)ran / 1000.0, (unsigned long long)(c->backoff_ms / 1000), c->restarts, max);
  c->backoff_ms *= 2;
  if (c->backoff_ms > GS_RUN_BACKOFF_MAX_MS)
    c->backoff_ms = GS_RUN_BACKOFF_MAX_MS;
  return true;
}

/* Starts every rank whose restart is due. What the previous process left
 * in its pipes is forwarded first, so its lines come before the new
 * ones; a rank that cannot be started stops the run. */
void gs__run_start_due_restarts(gs_run_t *r)
{
  uint64_t now = gs_now_ms();

  for (long i = 0; i < r->cfg.nproc && r->phase == GS_RUN_RUNNING; i++) {
    gs_run_child_t *c = &r->agents[i];

    if (!c->restart_at || now < c->restart_at)
      continue;
    c->restart_at = 0;
    r->agents_pending--;
    gs__run_stream_close(&c->out);
    gs__run_stream_close(&c->err);
    if (gs__run_spawn_rank(r, c) != 0) {
      gs__run_fail(r, 1);
      gs__run_begin_stop(r);
      return;
    }
    r->restarts++;
  }
}
