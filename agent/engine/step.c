/* One training step of the engine: begin_step writes this rank's part of
 * the control vector; each pack's allreduce is launched once its last
 * gradient is reported and every pack before it in the pack list is
 * launched (the same collectives in the same order on every rank, whatever
 * order backward reports in); end_step completes them in that order, runs
 * each pack's fused optimizer step once its gradients are in, checks that the
 * ranks ran the step alike, and acts on the summed control vector,
 * identically on every rank. */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "why.h"

/* Fills this rank's part of the control vector: rank 0 passes on the
 * coordinator's requests it has not passed on yet. */
static void write_control(gs_engine_t *e, float loss)
{
  gs_control_local_t in = {
      .rank = gs__membership_rank(&e->member),
      .term = e->cfg.term_flag && *e->cfg.term_flag,
      .nonfinite = !isfinite(loss),
      .step = e->steps_begun,
      /* Every collective of the previous steps is complete here (end_step
       * waited for them), so the count is final and no thread writes it. */
      .collectives = gs_comm_ticket(e->comm),
  };

  if (in.rank == 0) {
    gs_directives_t d;

    gs_heartbeat_directives(e->hb, &d);
    if (d.valid && d.coordinator_id != e->coordinator_id) {
      /* A restarted coordinator counts its requests from zero again. */
      e->coordinator_id = d.coordinator_id;
      e->seen_broadcast_seq = e->seen_checkpoint_seq = e->seen_regroup_seq = 0;
    }
    if (d.valid) {
      in.stop = d.stop;
      in.set_period = d.bcast_period != e->period;
      in.period = d.bcast_period;
      in.set_lr_scale = d.lr_scale != e->operator_lr_scale;
      in.lr_scale = d.lr_scale;
      if (d.broadcast_seq > e->seen_broadcast_seq) {
        in.broadcast = true;
        e->seen_broadcast_seq = d.broadcast_seq;
      }
      if (d.checkpoint_seq > e->seen_checkpoint_seq) {
        in.checkpoint = true;
        e->seen_checkpoint_seq = d.checkpoint_seq;
      }
      if (d.regroup_seq > e->seen_regroup_seq && gs__engine_elastic(e)) {
        in.regroup = true;
        e->seen_regroup_seq = d.regroup_seq;
      }
    }
  }
  gs_control_encode(&in, e->ctl, e->nctl);
  e->ctl_mine = in;
}

void gs_engine_begin_step(gs_engine_t *e, float loss, const gs_position_t *after)
{
  e->after = *after;
  if (e->failed)
    return; /* end_step says why; grad_ready launches nothing outside a step */
  memset(e->ready, 0, e->packs.nparams * sizeof(*e->ready));
  for (uint32_t k = 0; k < e->packs.list.pack_count; k++)
    e->packs.packs[k].pending = e->packs.packs[k].nparams;
  e->nissued = 0;
  e->repeated_param = -1;
  e->loss = loss;
  e->launch_err = 0;
  e->drive.loss_at = e->drive.veto_at = e->drive.factor_at = NULL;
  e->ctl = e->ctl_up[e->steps_begun % 2];
  write_control(e, loss);
  e->steps_begun++;
  e->step_start_ms = gs_now_ms_f();
  gs__engine_enter(e, GS_PHASE_COMPUTE, 0);
  /* Queued before backward, so it is in place before the last pack's allreduce. */
  e->launch_err = gs_device_upload(e->cfg.dev, e->ctl_dev, e->ctl, e->nctl * sizeof(float));
  if (!e->launch_err)
    e->launch_err = gs_device_zero(e->cfg.dev, e->skip_dev, sizeof(float));
  e->in_step = true;
}

void gs_engine_set_loss(gs_engine_t *e, float loss)
{
  if (!e->in_step || e->failed)
    return;
  e->loss = loss;
  e->ctl_mine.nonfinite = !isfinite(loss);
  gs_control_encode(&e->ctl_mine, e->ctl, e->nctl);
  if (!e->launch_err)
    e->launch_err = gs_device_upload(e->cfg.dev, e->ctl_dev, e->ctl, e->nctl * sizeof(float));
}

/* A driven step (cfg.driven, drive.c) is begun by its first gradient,
 * with the position after it made here. */
void gs__engine_drive_begin(gs_engine_t *e)
{
  gs_position_t after = e->committed;
  uint64_t sample = after.sample == GS_POSITION_SAMPLE_UNKNOWN ? 0 : after.sample;

  after.step++;
  after.sample = sample + e->drive.batch * gs__membership_world(&e->member);
  e->drive.loss_given = false;
  gs_engine_begin_step(e, 0.0f, &after);
}

/* Starts pack k's allreduce (sharded: its reduce-scatter): queued on the
 * comm thread for a blocking backend, on the comm stream (after the
 * gradients queued so far) for a stream-ordered one. */
static void launch(gs_engine_t *e, uint32_t k)
{
  gs_pack_t *pk = &e->packs.packs[k];
  bool sharded = gs__engine_sharded(e);
  /* The last pack's room holds the vector of the largest world (elastic). */
  size_t count = pk->elements + (pk->extra ? e->nctl : 0);
  int err;

  if (!gs_comm_stream_ordered(e->comm)) {
    comm_job_t *job = gs__comm_thread_job(&e->ct, k);

    *job = (comm_job_t){.op = sharded ? OP_REDUCE_SCATTER : OP_ALLREDUCE,
                        .buf = pk->grads,
                        .count = count,
                        .wire = pk->wire,
                        .elements = pk->elements,
                        .pack = pk};
    /* The training thread waits for the last pack right after backward;
     * handing it to the comm thread and back would only add two wake-ups
     * to the step's critical path. end_step runs it after the others. */
    if (e->nissued == e->packs.list.pack_count && gs__membership_world(&e->member) > 1) {
      job->state = JOB_DEFERRED;
      return;
    }
    gs__engine_enqueue(e, job);
    return;
  }
  /* Queued on the comm stream; complete() widens a 16-bit wire's sums. */
  err = sharded ? gs__engine_scatter_grads(e, pk->grads, count, pk->wire)
                : gs__engine_allreduce_grads(e, pk->grads, count, pk->wire, pk->elements);
  e->ticket[k] = gs_comm_ticket(e->comm) - 1; /* the pack's last collective */
  if (err && !e->launch_err)
    e->launch_err = err;
}

/* Makes pack k's reduced gradients available to what comes next: waits
 * for the comm thread, or orders the device's later work after it. */
static int complete(gs_engine_t *e, uint32_t k)
{
  comm_job_t *job = gs__comm_thread_job(&e->ct, k);
  gs_pack_t *pk = &e->packs.packs[k];
  int err;

  if (job->state == JOB_DEFERRED) { /* every earlier pack is complete: the comm thread is idle */
    job->state = JOB_IDLE;
    return gs__engine_run_job(e, job);
  }
  if (!gs_comm_stream_ordered(e->comm))
    return gs__engine_wait_job(e, job);
  err = gs_comm_order_after(e->comm, e->ticket[k]);
  if (!err) /* the sums this rank uses: its windows' */
    gs__engine_widen_windows(e, pk);
  return err;
}

/* Launches the packs whose gradients are all in, strictly in pack-list
 * order: a pack completed early waits for the packs before it, as DDP's
 * buckets do. Every rank so issues the same collectives in the same order
 * whatever order its backward reports gradients in (collectives matched
 * in another order would hang, or silently sum two packs of one size).
 * Backward usually finishes pack 0 first (it holds the last parameters),
 * so in the usual order each pack still starts as soon as it is complete.
 * Each pack is launched once per step: O(1) per grad_ready amortised. */
void gs__engine_issue_ready(gs_engine_t *e)
{
  uint32_t packs = e->packs.list.pack_count;

  while (e->nissued < packs && e->packs.packs[e->nissued].pending == 0) {
    uint32_t k = e->nissued++;

    /* A driven step's last pack carries the loss's verdict: it waits for it. */
    if (k == packs - 1 && e->cfg.driven && !e->drive.loss_given) {
      e->nissued--;
      return;
    }
    launch(e, k);
  }
}

void gs_engine_grad_ready(void *engine, uint32_t i)
{
  gs_engine_t *e = engine;

  if (!e->in_step && e->cfg.driven && !e->failed)
    gs__engine_drive_begin(e);
  if (!e->in_step || i >= e->packs.nparams || e->ready[i]) {
    e->repeated_param = i;
    return;
  }
  e->ready[i] = true;
  if (--e->packs.packs[e->packs.pack_of[i]].pending == 0)
    gs__engine_issue_ready(e);
}

/* Every gradient of a driven step reported: the missing ones as zeros
 * (cfg.zero_missing_grads), and the held last pack let go if the loss
 * never came. */
void gs__engine_drive_release(gs_engine_t *e)
{
  if (!e->cfg.driven || e->failed)
    return;
  if (!e->in_step)
    gs__engine_drive_begin(e); /* a step with no gradient at all */
  for (uint32_t i = 0; e->cfg.zero_missing_grads && i < e->packs.nparams; i++) {
    if (e->ready[i])
      continue;
    if (!e->launch_err)
      e->launch_err = gs_device_zero(e->cfg.dev, gs_engine_grad(e, i),
                                     e->packs.params[i].elements * sizeof(float));
    gs_engine_grad_ready(e, i);
  }
  if (!e->drive.loss_given) {
    e->drive.loss_given = true;
    gs__engine_issue_ready(e);
  }
}

/* The first parameter of a pack that never got its gradient. */
static int missing_gradient(gs_engine_t *e, uint64_t step)
{
  char names[300];
  size_t used = 0;
  uint32_t missing = 0;

  names[0] = '\0';
  for (uint32_t i = 0; i < e->packs.nparams; i++) {
    if (e->ready[i])
      continue;
    if (++missing <= 5 && used < sizeof(names))
      used += (size_t)snprintf(names + used, sizeof(names) - used, "%s'%s'", used ? ", " : "",
                               e->packs.params[i].name);
  }
  if (!missing)
    return 0;
  gs_set_why(e->error, sizeof(e->error),
             "step %" PRIu64 ": %u parameter(s) received no gradient (%s%s): every registered "
             "parameter must get one each step, or count as a zero gradient (the engine's "
             "zero_missing_grads; gradsync.torch: find_unused_parameters=True)",
             step, missing, names, missing > 5 ? ", ..." : "");
  return gs__engine_fail(e, GS_EPRECOND);
}

/* Queues pack k's fused optimizer step (skipped on the device when the
 * step's gradients were found not finite, or the front end's flag says
 * so; see gs_optim_gate_t); the milliseconds it took. */
static double apply_optim(gs_engine_t *e, uint32_t k, const gs_optim_step_t *st)
{
  double t0 = gs_now_ms_f();
  gs_optim_step_t gated = *st;

  gated.gate = (gs_optim_gate_t){
      .skip = e->cfg.nonfinite == GS_NONFINITE_OFF ? NULL : e->skip_dev,
      .veto = e->drive.veto_at,
      .factor = e->drive.factor_at,
  };
  gs__engine_update_windows(e, k, &gated);
  return gs_now_ms_f() - t0;
}

/* A collective of the step failed: an elastic job regroups without this
 * step (its update was not applied here, see apply_optim); any other stops. */
static int step_failed(gs_engine_t *e, int err, const char *what, double start_ms,
                       gs_step_result_t *out)
{
  char why[400];

  if (!gs__engine_elastic(e) || err == GS_EINTR)
    return gs__engine_comm_failed(e, err, what);
  snprintf(why, sizeof(why), "%s failed: %s", what,
           gs_comm_why(e->comm)[0] ? gs_comm_why(e->comm) : gs_strerror(err));
  return gs__engine_regroup(e, why, false, start_ms, out);
}

/* The step's one wait for its collectives (a stream-ordered backend's
 * sync waits for the device, counted as such). */
static int step_sync(gs_engine_t *e)
{
  int err = gs_comm_sync(e->comm);

  e->queued_between_steps = 0;
  if (gs_comm_stream_ordered(e->comm))
    e->cfg.dev->waits.syncs++;
  return err;
}

/* A sharded step's control vector, with the shards' verdict on their
 * sums after it (skip_dev), in an allreduce of its own once every pack's
 * reduce-scatter is complete: each rank checked only its shard. */
static int reduce_control(gs_engine_t *e)
{
  comm_job_t job = {.op = OP_ALLREDUCE, .buf = e->ctl_dev, .count = e->nctl_cap + 1};

  return gs__engine_step_collective(e, &job);
}

/* A sharded step's updated params (unless the update was skipped), every
 * rank's shard, allgathered into every pack; then the step's one sync
 * (not for late decisions: the next step's end waits, normally for
 * nothing). */
static int gather_params(gs_engine_t *e, bool updated)
{
  int err = 0;

  for (uint32_t k = 0; updated && !err && k < e->packs.list.pack_count; k++) {
    comm_job_t job = {
        .op = OP_ALLGATHER, .buf = e->packs.packs[k].params, .count = e->packs.packs[k].elements};

    /* Waiting on the other ranks, as in an allreduce: the coordinator
     * names the rank that holds them up (not this one, "in its update"). */
    gs__engine_enter(e, GS_PHASE_ALLREDUCE, k);
    err = gs__engine_step_collective(e, &job);
  }
  if (!err && !e->late)
    err = step_sync(e);
  gs__engine_enter(e, GS_PHASE_OPTIMIZER, 0);
  return err;
}

/* The step's reductions: waits for the allreduces pack by pack, checks
 * each pack's sums, and (unless `defer`) queues each pack's update as its
 * gradients arrive. Fills e->reduced (the wait, the update time so far)
 * and returns the step's failure, with `out` filled by a regroup. */
static int reduce(gs_engine_t *e, bool defer, const gs_optim_step_t *st, gs_step_result_t *out)
{
  uint64_t step = e->after.step;
  bool check = e->cfg.nonfinite != GS_NONFINITE_OFF;
  double t0, start_ms = e->step_start_ms;
  char what[64];
  int err;

  gs__engine_drive_release(e);
  e->in_step = false;
  e->reduced = (reduced_t){.done = true};
  if (e->failed) {
    snprintf(what, sizeof(what), "step %" PRIu64, step);
    return gs__engine_refuse(e, what);
  }
  if (e->repeated_param >= 0) {
    gs_set_why(e->error, sizeof(e->error),
               "step %" PRIu64 ": gradient of parameter %" PRId64 " reported twice", step,
               e->repeated_param);
    return gs__engine_fail(e, GS_EPRECOND);
  }
  if (e->nissued < e->packs.list.pack_count)
    return missing_gradient(e, step);
  snprintf(what, sizeof(what), "step %" PRIu64 ": allreduce of the gradients", step);
  if (e->launch_err)
    return step_failed(e, e->launch_err, what, start_ms, out);
  for (uint32_t k = 0; k < e->nissued; k++) {
    t0 = gs_now_ms_f();
    gs__engine_enter(e, GS_PHASE_ALLREDUCE, k);
    err = complete(e, k);
    e->reduced.waited_ms += gs_now_ms_f() - t0;
    if (err) {
      snprintf(what, sizeof(what), "step %" PRIu64 ": allreduce of pack %u", step, k);
      return step_failed(e, err, what, start_ms, out);
    }
    if (check) /* sharded: the shard's verdict, summed with the control vector */
      gs_device_check_finite(e->cfg.dev, e->packs.packs[k].grads + e->packs.packs[k].win[0].off,
                             e->packs.packs[k].win[0].len, e->skip_dev);
    if (!defer) {
      gs__engine_enter(e, GS_PHASE_OPTIMIZER, 0);
      e->reduced.optimizer_ms += apply_optim(e, k, st);
    }
  }
  t0 = gs_now_ms_f();
  if (gs__engine_sharded(e)) {
    gs__engine_shard_reduced(e, step); /* a regroup may apply them */
    err = reduce_control(e);
    e->reduced.waited_ms += gs_now_ms_f() - t0;
    if (err)
      return step_failed(e, err, what, start_ms, out);
    gs__engine_enter(e, GS_PHASE_OPTIMIZER, 0);
    return 0; /* the step's sync follows the allgather (gather_params) */
  }
  /* Deferred: updates are queued only after every allreduce succeeded. A
   * stream-ordered backend's sync waits for the device. */
  if (!e->late) /* late: the next step's end waits, normally for nothing */
    err = step_sync(e);
  e->reduced.waited_ms += gs_now_ms_f() - t0;
  if (err)
    return step_failed(e, err, what, start_ms, out);
  gs__engine_enter(e, GS_PHASE_OPTIMIZER, 0); /* the engine's, or the front end's own */
  return 0;
}

/* Makes the summed gradients the ones the update uses (times 1/world for
 * a mean), in place: what DDP leaves in `.grad`. */
static void scale_grads(gs_engine_t *e, float factor)
{
  for (uint32_t k = 0; factor != 1.0f && k < e->packs.list.pack_count; k++)
    for (uint32_t w = 0; w < GS_PACK_WINDOWS; w++)
      gs_device_scale(e->cfg.dev, e->packs.packs[k].grads + e->packs.packs[k].win[w].off,
                      e->packs.packs[k].win[w].len, factor);
}

int gs_engine_synchronize(gs_engine_t *e, bool scale, gs_sync_result_t *out)
{
  gs_optim_step_t st;

  if (out)
    *out = (gs_sync_result_t){0};
  if (!e->reduced.done && e->in_step) {
    memset(&e->reduced_out, 0, sizeof(e->reduced_out));
    gs__engine_resolve_groups(e, e->after.step, &st);
    e->reduced.err = reduce(e, true, &st, &e->reduced_out);
    /* Sharded, reduce leaves the step's sync to the allgather: the sums
     * read below must not wait on a device whose collective may hang. */
    if (!e->reduced.err && gs__engine_sharded(e) && !e->late) {
      e->reduced.err = step_sync(e);
      if (e->reduced.err)
        e->reduced.err = gs__engine_comm_failed(e, e->reduced.err, "the step's reductions");
    }
    if (!e->reduced.err && !e->reduced_out.regrouped && scale) {
      scale_grads(e, (float)e->grad_scale);
      e->reduced.scaled = true;
    }
  }
  if (!e->reduced.done)
    return 0;
  if (out && !e->reduced.err && e->cfg.nonfinite != GS_NONFINITE_OFF && !e->reduced_out.regrouped &&
      gs_device_fetch(e->cfg.dev, &e->drive.fetched[FETCHED_SKIP], e->skip_dev, sizeof(float)) ==
          0 &&
      gs_device_fetched(e->cfg.dev) == 0)
    out->nonfinite = e->drive.fetched[FETCHED_SKIP] != 0.0f;
  if (out)
    out->regrouped = e->reduced_out.regrouped;
  return e->reduced.err;
}

bool gs_engine_step_regrouped(const gs_engine_t *e)
{
  return e->reduced.done && e->reduced_out.regrouped;
}

void gs_engine_scale_step(gs_engine_t *e, float factor)
{
  e->step_factor = factor;
}

void gs_engine_skip_step(gs_engine_t *e)
{
  e->skip_requested = true;
}

/* Whether step `step` acts whatever its control vector says: a periodic
 * broadcast or checkpoint. */
static bool due(const gs_engine_t *e, uint64_t step)
{
  return (e->period > 0 && step % (uint64_t)e->period == 0) ||
         (e->cfg.checkpoint_every && step % e->cfg.checkpoint_every == 0);
}

/* The step's readback queued into its flight, behind its update. */
static int queue_flight(gs_engine_t *e, bool check, bool skip_asked)
{
  uint32_t k = (uint32_t)(e->after.step % 2);
  step_flight_t *f = &e->flight[k];

  f->before = e->committed;
  f->after = e->after;
  f->until = gs_comm_ticket(e->comm);
  f->mine = e->ctl_mine;
  f->check = check;
  f->veto = e->drive.veto_at != NULL;
  f->loss = e->drive.loss_at != NULL;
  f->skip_asked = skip_asked;
  return gs__engine_flight_queue(e, f, k);
}

/* Waits for the allreduces (unless gs_engine_synchronize did), queues
 * the updates and the readback, then decides: on this step now, or (late)
 * on the step before, whose readback is normally done by then, and on this
 * one too when either must act. An elastic job, and one that checks its
 * gradients (cfg.nonfinite), applies the optimizer only once every
 * allreduce of the step is complete and checked on the device, so a rank
 * holds either the last step's state or this one's in full, never a mix,
 * whatever a lost rank interrupted or a NaN spoilt: a regroup can go on
 * from it, and a non-finite step is never applied (it costs the overlap
 * of the optimizer with the last allreduces). */
static int end_step(gs_engine_t *e, gs_step_result_t *out)
{
  uint64_t step = e->after.step;
  bool check = e->cfg.nonfinite != GS_NONFINITE_OFF;
  bool skip_asked = e->skip_requested;
  bool synced = e->reduced.done, defer = synced || gs__engine_elastic(e) || check || skip_asked ||
                                         e->drive.veto_at || e->drive.factor_at;
  float factor = e->step_factor;
  step_flight_t *prev = &e->flight[(step + 1) % 2], *cur = &e->flight[step % 2];
  gs_control_t c = {0}, mine;
  gs_optim_step_t st;
  double t0, optimizer;
  int err;

  e->step_factor = 1.0f;
  e->skip_requested = false;
  memset(out, 0, sizeof(*out));
  gs__engine_resolve_groups(e, step, &st);
  if (!synced)
    err = reduce(e, defer, &st, out);
  else
    err = e->reduced.err, *out = e->reduced_out;
  e->reduced.done = false;
  if (err || out->regrouped) /* a regroup dropped the step (elastic) */
    return err;
  t0 = gs_now_ms_f();
  /* Late: the step before, before this step's update is queued (a stop at
   * a non-finite step queues none). */
  if (prev->valid) {
    err = gs__engine_flight_take(e, prev, false, &c, out);
    if (err)
      return err;
    gs__engine_resolve_groups(e, step, &st); /* the update count it corrected */
  }
  /* Grads already scaled in place, and a clipping factor, in the update. */
  st.grad_scale = (e->reduced.scaled ? 1.0f : st.grad_scale) * factor;
  for (uint32_t k = 0; defer && !skip_asked && k < e->nissued; k++)
    apply_optim(e, k, &st);
  if (!skip_asked)
    e->optim_steps++; /* taken back when the step turns out skipped */
  if (gs__engine_sharded(e)) {
    double g0 = gs_now_ms_f();
    char what[64];

    if (gs__engine_shard_copies(e))
      gs__engine_shard_keep_update(e, skip_asked);
    err = gather_params(e, !skip_asked);
    e->reduced.waited_ms += gs_now_ms_f() - g0;
    t0 += gs_now_ms_f() - g0; /* not the optimizer's time */
    if (err) {
      snprintf(what, sizeof(what), "step %" PRIu64 ": allgather of the updated params", step);
      return step_failed(e, err, what, e->step_start_ms, out);
    }
  }
  err = queue_flight(e, check, skip_asked);
  if (!err)
    e->committed = e->after; /* this step is done (applied, or skipped on the device) */
  if (!err && (!e->late || due(e, step) || gs__engine_controls_act(&c))) {
    err = gs__engine_flight_take(e, cur, true, &mine, out);
    gs__engine_controls_merge(&c, &mine);
    if (!err)
      gs__engine_shard_taken(e);
  }
  optimizer = e->reduced.optimizer_ms + (gs_now_ms_f() - t0);
  out->comm_wait_ms = e->reduced.waited_ms;
  out->optimizer_ms = optimizer;
  out->state_bytes = atomic_load_explicit(&e->board.state_bytes, memory_order_relaxed);
  if (err == GS_ERANGE || e->failed)
    return err ? err : e->failed; /* a stop at a non-finite step, or a failure said already */
  if (err) {
    gs_set_why(e->error, sizeof(e->error),
               "step %" PRIu64 ": the %s device failed: %s (see the log above)", step,
               e->cfg.dev->label, gs_strerror(err));
    return gs__engine_fail(e, err);
  }
  return gs__engine_act(e, &c, step, e->step_start_ms, out);
}

/* The step's blocking waits since the last end_step (gs_step_result_t),
 * also where the heartbeat reads them. */
static void count_waits(gs_engine_t *e, gs_step_result_t *out)
{
  const gs_device_waits_t *now = &e->cfg.dev->waits, *mark = &e->waits.device_mark;

  out->device_syncs = (uint32_t)(now->syncs - mark->syncs);
  out->device_reads = (uint32_t)(now->reads - mark->reads);
  out->comm_waits = (uint32_t)(e->waits.comm - e->waits.comm_mark);
  e->waits.device_mark = *now;
  e->waits.comm_mark = e->waits.comm;
  atomic_store_explicit(&e->board.device_waits, out->device_syncs + out->device_reads,
                        memory_order_relaxed);
  atomic_store_explicit(&e->board.comm_waits, out->comm_waits, memory_order_relaxed);
}

/* Between steps the rank is in its data phase until the front end says
 * otherwise (begin_step, or gs_engine_phase before its forward). */
int gs_engine_end_step(gs_engine_t *e, gs_step_result_t *out)
{
  int err = end_step(e, out);

  if (e->cfg.dev) /* NULL before start: end_step refused the step */
    count_waits(e, out);
  if (!err)
    gs__engine_drive_report(e, out);
  gs__engine_enter(e, GS_PHASE_DATA, 0);
  if (!err)
    gs__trace_step_end(e);
  return err;
}
