/* What the host learns of a step, and when it acts on it (docs/design.md,
 * "Decisions, now or a step later"). A step's end queues its readback (the
 * control vector's sums, the sums' verdict, the front end's skip flag, the
 * loss) behind its update, with a device fence: a flight. Deciding on it
 * waits for that fence, checks that every rank ran the step alike, and
 * reads the verdicts: a step found not finite was skipped on the device
 * already (its update reads the flag), so the host only follows; then the
 * control vector's requests are acted on, identically on every rank.
 *
 * Decisions now (the default) take a step's flight at its own end: the
 * host waits for the device once a step. Late decisions (cfg.decide, a
 * fixed world) take it at the next step's end, before that step's update
 * is queued: the fence is then normally passed, the host never waits for
 * the device in a steady step, and the step's result says what became of
 * the step before it. A step that must act (a checkpoint, a broadcast, a
 * request of the coordinator's) takes its own flight at once too. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

int gs__engine_flight_queue(gs_engine_t *e, step_flight_t *f, uint32_t k)
{
  gs_device_t *d = e->cfg.dev;
  int err = gs_device_fetch(d, f->ctl, e->ctl_dev, e->nctl * sizeof(float));

  if (!err && f->check)
    err = gs_device_fetch(d, &f->fetched[FETCHED_SKIP], e->skip_dev, sizeof(float));
  if (!err && f->veto)
    err = gs_device_fetch(d, &f->fetched[FETCHED_VETO], e->drive.veto_at, sizeof(float));
  if (!err && f->loss)
    err = gs_device_fetch(d, &f->fetched[FETCHED_LOSS], e->drive.loss_at, sizeof(float));
  if (!err)
    err = gs_device_fence(d, k);
  f->fence = k;
  f->valid = !err;
  return err;
}

/* Names the ranks whose bit is set in the non-finite slots of `ctl`. */
static void nonfinite_ranks(const gs_engine_t *e, const float *ctl, char *out, size_t len)
{
  size_t used = 0;

  out[0] = '\0';
  for (uint32_t r = 0; r < gs__membership_world(&e->member) && used < len; r++)
    if (gs_control_rank_nonfinite(ctl, e->nctl, r))
      used += snprintf(out + used, len - used, "%s%u", used ? ", " : "", r);
}

/* The first parameter whose summed gradient is not finite (host copies of
 * the packs' gradients on a device without host memory), among this
 * rank's windows (sharded: only its shard holds sums); its name, "?"
 * when the copy fails, NULL when none of this rank's sums is. Only on the
 * rare step that has one. */
static const char *first_nonfinite_param(gs_engine_t *e)
{
  for (uint32_t k = 0; k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];
    const float *g = pk->grads + pk->win[0].off;
    float *host = NULL;
    size_t at;

    if (!e->cfg.dev->host_memory) {
      host = malloc(pk->win[0].len * sizeof(float) + 1);
      if (!host || gs_device_download(e->cfg.dev, host, g, pk->win[0].len * sizeof(float))) {
        free(host);
        return "?";
      }
      g = host;
    }
    at = pk->win[0].off + gs_optim_first_nonfinite(g, pk->win[0].len);
    free(host);
    for (uint32_t j = 0; at < pk->win[0].off + pk->win[0].len && j < pk->nparams; j++)
      if (at < pk->segs[j].offset + pk->segs[j].count)
        return e->packs.params[e->packs.list.order[pk->first + j]].name;
  }
  return NULL;
}

/* The step's summed gradients held a NaN or an infinity, so its update
 * was not applied (every rank saw the same sums): stop every rank, or
 * with GS_NONFINITE_SKIP go on without it. The words name the ranks whose
 * loss was not finite, when the control vector says so (the usual cause),
 * else the first parameter whose gradient is not (while the packs still
 * hold the step's gradients: not for a step decided late). */
static int nonfinite_gradients(gs_engine_t *e, const step_flight_t *f, const gs_control_t *c,
                               gs_step_result_t *out)
{
  uint64_t step = f->after.step;
  char what[300];

  if (c->nonfinite) {
    char ranks[256];

    nonfinite_ranks(e, f->ctl, ranks, sizeof(ranks));
    snprintf(what, sizeof(what), "the loss is NaN or infinite on rank(s) %s", ranks);
  } else if (f->after.step == e->after.step) {
    const char *name = first_nonfinite_param(e);

    if (name)
      snprintf(what, sizeof(what),
               "the summed gradients hold NaN or infinity (first: parameter '%s')", name);
    else
      snprintf(what, sizeof(what),
               "the summed gradients hold NaN or infinity (in another rank's shard)");
  } else {
    snprintf(what, sizeof(what), "the summed gradients hold NaN or infinity");
  }
  out->nonfinite = true;
  if (e->cfg.nonfinite == GS_NONFINITE_SKIP) {
    out->skipped = true;
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "step %" PRIu64 ": %s; the step is skipped on every rank", step, what);
    return 0;
  }
  gs_set_why(e->error, sizeof(e->error),
             "step %" PRIu64 ": %s; the step was not applied and every rank stops", step, what);
  out->stop = true;
  gs_set_why(out->stop_reason, sizeof(out->stop_reason), "%s", e->error); /* cut to fit */
  return GS_ERANGE;
}

/* A loss that is not finite while the sums are: applied, then skipped
 * over (GS_NONFINITE_SKIP) or a stop every rank takes. */
static int nonfinite_loss(gs_engine_t *e, const step_flight_t *f, gs_step_result_t *out)
{
  char ranks[256];

  nonfinite_ranks(e, f->ctl, ranks, sizeof(ranks));
  out->nonfinite = true;
  if (e->cfg.nonfinite == GS_NONFINITE_SKIP) {
    out->skipped = true;
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "step %" PRIu64 ": the loss is NaN or infinite on rank(s) %s; its gradients were "
           "finite and applied, and training goes on (nonfinite skip)",
           f->after.step, ranks);
    return 0;
  }
  gs_set_why(e->error, sizeof(e->error),
             "step %" PRIu64 ": the loss is NaN or infinite on rank(s) %s; every rank stops",
             f->after.step, ranks);
  out->stop = true;
  gs_set_why(out->stop_reason, sizeof(out->stop_reason), "%s", e->error); /* cut to fit */
  return GS_ERANGE;
}

/* Waits for flight f's fence: for its collectives first on a
 * stream-ordered backend (a wait that watches the abort flag and the
 * timeout, where a fence would hang with a lost peer), which also lets
 * them go; counted as a sync when `drains` and it was not passed yet. */
static int flight_wait(gs_engine_t *e, const step_flight_t *f, bool drains)
{
  int done = gs_device_fence_done(e->cfg.dev, f->fence), err;

  if (done < 0)
    return done;
  if (!done && drains)
    e->cfg.dev->waits.syncs++;
  err = gs_comm_sync_until(e->comm, f->until);
  return err ? err : gs_device_fence_wait(e->cfg.dev, f->fence, false);
}

int gs__engine_flight_take(gs_engine_t *e, step_flight_t *f, bool drains, gs_control_t *c,
                           gs_step_result_t *out)
{
  float skip, veto;
  bool applied = true;
  char why[512];
  int err;

  f->valid = false;
  err = flight_wait(e, f, drains);
  if (err) {
    gs_set_why(e->error, sizeof(e->error), "step %" PRIu64 ": %s", f->after.step,
               gs_comm_why(e->comm)[0] ? gs_comm_why(e->comm) : gs_strerror(err));
    return gs__engine_fail(e, err);
  }
  err = gs_control_check(f->ctl, e->nctl, &f->mine, gs__membership_world(&e->member), why,
                         sizeof(why));
  if (err) {
    gs_set_why(e->error, sizeof(e->error), "step %" PRIu64 ": %s", f->after.step, why);
    return gs__engine_fail(e, err);
  }
  gs_control_decode(f->ctl, e->nctl, c);
  if (f->loss)
    e->drive.loss_seen = f->fetched[FETCHED_LOSS];
  skip = f->check ? f->fetched[FETCHED_SKIP] : 0.0f;
  veto = f->veto ? f->fetched[FETCHED_VETO] : 0.0f;
  if (f->skip_asked || veto != 0.0f) {
    out->skipped = true; /* also what makes a NaN loss no stop */
    out->nonfinite |= skip != 0.0f;
    applied = false;
    gs_log(e->cfg.log, GS_LOG_DEBUG, e->cfg.coord.job, gs__membership_rank(&e->member),
           "step %" PRIu64 ": skipped by the front end (a loss scaler)", f->after.step);
  } else if (skip != 0.0f) {
    applied = false;
    err = nonfinite_gradients(e, f, c, out);
  } else if (c->nonfinite) {
    err = nonfinite_loss(e, f, out);
  }
  c->nonfinite = false; /* decided here */
  if (!applied && !f->skip_asked)
    e->optim_steps--; /* counted when its update was queued */
  if (err && !applied)
    e->committed = f->before; /* a stop at a step never applied: the state is the one before */
  return err;
}

/* The requests of two control vectors as one: any that either asks. */
void gs__engine_controls_merge(gs_control_t *into, const gs_control_t *c)
{
  into->stop |= c->stop;
  into->term |= c->term;
  into->broadcast |= c->broadcast;
  into->checkpoint |= c->checkpoint;
  into->regroup |= c->regroup;
  if (c->period_changed) {
    into->period_changed = true;
    into->period = c->period;
  }
  if (c->lr_scale_changed) {
    into->lr_scale_changed = true;
    into->lr_scale = c->lr_scale;
  }
}

bool gs__engine_controls_act(const gs_control_t *c)
{
  return c->stop || c->term || c->broadcast || c->checkpoint || c->regroup || c->period_changed ||
         c->lr_scale_changed;
}

/* Every rank acts on the same requests after the same step. */
int gs__engine_act(gs_engine_t *e, const gs_control_t *c, uint64_t step, double start_ms,
                   gs_step_result_t *out)
{
  bool bcast = c->broadcast;
  int err;

  if (c->period_changed) {
    e->period = c->period;
    out->period_changed = true;
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
           "step %" PRIu64 ": broadcast period set to %d by the coordinator", step, e->period);
  }
  if (c->lr_scale_changed) {
    /* This step's update is queued already: the next one takes it. */
    gs__engine_operator_lr_scale(e, c->lr_scale);
    out->lr_scale_changed = true;
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
           "step %" PRIu64 ": lr scale set to %g by the coordinator (from step %" PRIu64 ")", step,
           (double)c->lr_scale, step + 1);
  }
  if (c->period_changed || c->lr_scale_changed) /* what a re-registration reports */
    gs_heartbeat_set_in_effect(e->hb, e->period, e->operator_lr_scale);
  out->lr_scale = e->operator_lr_scale;
  out->bcast_period = e->period;
  if (e->period > 0 && step % (uint64_t)e->period == 0)
    bcast = true;
  if (bcast && gs__membership_world(&e->member) > 1) {
    err = gs__engine_broadcast_packs(e, false, 0);
    /* Every rank holds this step's state in full: an elastic job goes on from it. */
    if (err && gs__engine_elastic(e) && err != GS_EINTR)
      return gs__engine_regroup(e, e->error, false, start_ms, out);
    if (err)
      return err;
    out->broadcast = true;
  }
  if (c->stop || c->term) {
    out->stop = true;
    snprintf(out->stop_reason, sizeof(out->stop_reason), "%s",
             c->stop ? "the coordinator asked every rank to stop"
             : e->cfg.term_flag && *e->cfg.term_flag == SIGINT ? "SIGINT received; every rank stops"
             : e->cfg.term_flag && *e->cfg.term_flag == SIGTERM
                 ? "SIGTERM received; every rank stops"
                 : "a rank received SIGTERM or SIGINT; every rank stops");
  }
  if (c->checkpoint || (e->cfg.checkpoint_every && step % e->cfg.checkpoint_every == 0) ||
      (out->stop && e->cfg.checkpoint_dir)) {
    err = gs_engine_checkpoint(e, &e->after);
    /* Sharded, a checkpoint is a collective: a lost rank regroups (a
     * failed disk is no failure of the engine's). */
    if (err && e->failed && gs__engine_sharded(e) && gs__engine_elastic(e) && err != GS_EINTR)
      return gs__engine_regroup(e, e->error, false, start_ms, out);
    if (err)
      return err;
    out->checkpoint = true;
  }
  /* New agents wait to join: every rank regroups after this same step. */
  if (c->regroup && !out->stop && gs__engine_elastic(e))
    return gs__engine_regroup(e, "regroup", true, start_ms, out);
  return 0;
}

int gs_engine_drain(gs_engine_t *e, gs_step_result_t *out)
{
  gs_control_t c;

  memset(out, 0, sizeof(*out));
  for (uint32_t k = 0; k < 2; k++)
    if (e->flight[k].valid && !e->failed)
      return gs__engine_flight_take(e, &e->flight[k], true, &c, out);
  return 0;
}
