/* Elastic membership, the engine's side (docs/design.md, "Elastic
 * membership"): when a step's collectives fail because a rank was lost,
 * or when every rank agreed to make room for new ones, the engine closes
 * its generation's collectives, joins the next generation with the state
 * it holds (the last step whose SGD it applied in full), connects the new
 * world and takes the state of the rank at the newest step, then the
 * front end goes on from there. The process, the model and its memory
 * stay; nothing is read from disk. A metric sum between steps that a lost
 * rank interrupts regroups the same way (gs_engine_allreduce_sum). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "why.h"

/* Ends this generation's collectives: the comm thread stops and the
 * backend's links close, so peers blocked on this rank notice at once. */
static void close_generation(gs_engine_t *e)
{
  gs_comm_t *comm;

  gs__engine_comm_stop(e, true);
  comm = gs__comm_thread_reset(&e->ct, &e->comm);
  gs_comm_destroy(comm);
}

/* Joins the next generation, with this rank's state if it holds one. The
 * Join carries this rank's session, so the coordinator counts it back as
 * a member of the generation that ended, state or not. A rank the
 * coordinator no longer counts as a member (evicted while it was
 * stopped) joins again as a new agent, without its session, and takes
 * the others' state. */
static int join_next(gs_engine_t *e, const char *why, const char *addr)
{
  gradsync_JoinRequest req = e->member.req;
  gs_join_result_t res;
  int err;

  req.has_state = e->has_state;
  req.state_step = e->has_state ? e->committed.step : 0;
  req.bcast_period = e->period;
  snprintf(req.reason, sizeof(req.reason), "%.250s", why); /* the rest stays in our log */
  snprintf(req.comm_addr, sizeof(req.comm_addr), "%s", addr);
  err = gs_client_join(e->client, &req, e->cfg.rejoin_timeout_ms, &res);
  if (err == GS_EABORTED) {
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member), "%s%s",
           gs_client_error(e->client),
           req.has_state ? " (its state is dropped: it takes the others')" : "");
    e->has_state = req.has_state = false;
    req.state_step = 0;
    gs_client_set_session(e->client, "");
    err = gs_client_join(e->client, &req, e->cfg.rejoin_timeout_ms, &res);
  }
  if (err) {
    gs_set_why(
        e->error, sizeof(e->error), "elastic job %s could not regroup%s: %s", e->cfg.coord.job,
        err == GS_ETIMEDOUT ? " (fewer ranks than its minimum came within --rejoin-timeout)" : "",
        gs_client_error(e->client));
    return err;
  }
  gs_join_result_free(&e->member.join);
  e->member.join = res;
  gs__engine_joined(e);
  return 0;
}

/* The new generation's heartbeat, in place of the old one (stopped only
 * now: the coordinator counts the rank back from its Join, so the old
 * connection closing loses nothing). */
static int restart_heartbeat(gs_engine_t *e)
{
  gs_heartbeat_stop(e->hb);
  e->hb = NULL;
  return gs__engine_start_heartbeat(e);
}

/* One attempt: the next generation, connected, and, when `sync`, holding
 * one state (else the front end's gs_engine_sync_initial follows). */
static int regroup_once(gs_engine_t *e, const char *why, bool sync, gs_position_t *pos)
{
  char addr[256];
  bool same_step;
  int err;

  /* The old heartbeat beats on until the Join, but must not bring this
   * generation back at a restarted coordinator: it would do so with the
   * comm address closed here (the ranks of that generation would dial
   * nothing for their whole connect timeout). */
  gs_heartbeat_forgo_rejoin(e->hb);
  close_generation(e);
  err = gs__engine_open_comm(e, addr, sizeof(addr));
  err = err ? err : join_next(e, why, addr);
  err = err ? err : restart_heartbeat(e);
  err = err ? err : gs__engine_agree_packlist(e);
  err = err ? err : gs__engine_go_live(e);
  if (err || !sync)
    return err;
  e->steps_begun = 0; /* every rank of the new world counts from here */
  same_step = e->member.join.state_step == e->committed.step;
  *pos = e->committed;
  err = gs__engine_sync_state(e, pos);
  /* A broadcast cut short leaves this rank's state a mix of two steps
   * unless it held the same step already. */
  if (err && !same_step && gs__membership_rank(&e->member) != e->member.join.state_rank)
    e->has_state = false;
  return err;
}

bool gs__engine_may_regroup(int err)
{
  /* A signal, or this rank's own setup (memory, a pack list or settings
   * that differ): the next generation would fail alike. */
  return err != GS_EINTR && err != GS_ENOMEM && err != GS_EINVAL;
}

/* Joins generations until one holds (`sync`: with one state) or the
 * rejoin timeout passes. The first attempt says `why` (a planned regroup
 * says "regroup"); a later one the failure that ended the attempt
 * before, so the coordinator logs a lost rank as such. */
static int regroup_until_held(gs_engine_t *e, const char *why, bool sync, gs_position_t *pos,
                              bool *retried)
{
  double deadline = gs_now_ms_f() + (double)e->cfg.rejoin_timeout_ms;
  char reason[sizeof(e->error)];
  int err;

  snprintf(reason, sizeof(reason), "%s", why);
  *retried = false;
  for (;;) {
    uint64_t before = gs__membership_generation(&e->member);

    e->failed = 0; /* a lost peer is not this rank's failure */
    err = regroup_once(e, reason, sync, pos);
    /* A refused Join (the job finished, or is full) has nothing to retry. */
    if (!err || !gs__engine_may_regroup(err) || gs__membership_generation(&e->member) == before ||
        gs_now_ms_f() > deadline)
      return err;
    /* Lost again while regrouping: try the next generation. */
    *retried = true;
    snprintf(reason, sizeof(reason), "%s", e->error);
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "regroup into generation %" PRIu64 " failed: %s; trying again",
           gs__membership_generation(&e->member), reason);
  }
}

int gs__engine_regroup(gs_engine_t *e, const char *why, bool planned, double step_start_ms,
                       gs_step_result_t *out)
{
  uint64_t old_gen = gs__membership_generation(&e->member);
  double noticed = gs_now_ms_f();
  gs_position_t pos;
  bool retried;
  int err;

  gs__engine_enter(e, GS_PHASE_IDLE, 0); /* rejoining: a new generation's heartbeat reports */
  if (e->has_state)
    gs_log(e->cfg.log, planned ? GS_LOG_INFO : GS_LOG_WARN, e->cfg.coord.job,
           gs__membership_rank(&e->member),
           "generation %" PRIu64 " %s; regrouping from step %" PRIu64, old_gen,
           planned ? "regroups to admit new ranks" : why, e->committed.step);
  else
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "generation %" PRIu64 " %s; regrouping (this rank holds no state yet)", old_gen, why);
  err = regroup_until_held(e, planned ? "regroup" : why, true, &pos, &retried);
  if (err)
    return gs__engine_fail(e, err);
  out->regrouped = true;
  out->resume = pos;
  out->detect_ms = planned ? 0 : noticed - step_start_ms;
  out->regroup_ms = gs_now_ms_f() - noticed;
  e->after = pos;
  if (planned && !retried)
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
           "generation %" PRIu64 ": new ranks joined; continuing with %u ranks from step %" PRIu64
           " (regroup %.2f s)",
           gs__membership_generation(&e->member), gs__membership_world(&e->member), pos.step,
           out->regroup_ms / 1000.0);
  else
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "generation %" PRIu64 ": %s; continuing with %u ranks from step %" PRIu64
           " (detect %.2f s, regroup %.2f s)",
           gs__membership_generation(&e->member),
           e->member.join.regroup_reason[0] ? e->member.join.regroup_reason : why,
           gs__membership_world(&e->member), pos.step, out->detect_ms / 1000.0,
           out->regroup_ms / 1000.0);
  return 0;
}

int gs__engine_regroup_before_training(gs_engine_t *e)
{
  uint64_t old_gen = gs__membership_generation(&e->member);
  char why[sizeof(e->error)];
  bool retried;
  int err;

  snprintf(why, sizeof(why), "%s", e->error);
  gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
         "generation %" PRIu64 " broke before this rank trained in it: %s; joining the next one",
         old_gen, why);
  err = regroup_until_held(e, why, false, NULL, &retried);
  if (err)
    return err;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
         "joined generation %" PRIu64 ": rank %u of %u, broadcast period %d",
         gs__membership_generation(&e->member), gs__membership_rank(&e->member),
         gs__membership_world(&e->member), e->period);
  return 0;
}

int gs_engine_sync_initial(gs_engine_t *e, gs_position_t *pos)
{
  gs_step_result_t out;
  int err;

  gs__engine_enter(e, GS_PHASE_DATA, 0); /* after the state's sync: the first batch */
  err = gs__engine_sync_state(e, pos);

  /* The world broke while the ranks agreed on where to start (a rank lost
   * as this one joined a running job): the next generation's state. */
  if (!err || !gs__engine_elastic(e) || !gs__engine_may_regroup(err))
    return err;
  err = gs__engine_regroup(e, e->error, false, gs_now_ms_f(), &out);
  if (!err)
    *pos = out.resume;
  return err;
}

/* A collective between steps on host memory; in an elastic job a lost
 * rank regroups and fails it with GS_EREGROUPED. */
static int between_steps(gs_engine_t *e, job_op_t op, void *buf, size_t count, bool on_device,
                         uint32_t root, const char *what)
{
  int err;

  if (gs__membership_world(&e->member) == 1)
    return 0;
  err = gs__engine_run_now(e, op, buf, count, on_device, root, what);
  if (err && err != GS_EINTR && gs__engine_elastic(e)) {
    gs_step_result_t out;

    /* Between steps every rank holds the last step's state: regroup, and
     * the caller sums again over the new world. */
    err = gs__engine_regroup(e, e->error, false, gs_now_ms_f(), &out);
    if (!err) {
      gs_set_why(e->error, sizeof(e->error),
                 "the world changed during the sum: now rank %u of %u; sum again",
                 gs__membership_rank(&e->member), gs__membership_world(&e->member));
      err = GS_EREGROUPED;
    }
  }
  return err;
}

int gs_engine_allreduce_sum(gs_engine_t *e, float *buf, size_t n)
{
  return between_steps(e, OP_ALLREDUCE, buf, n, false, 0, "allreduce of metrics");
}

int gs_engine_allreduce_sum_on_device(gs_engine_t *e, float *buf, size_t n)
{
  return between_steps(e, OP_ALLREDUCE, buf, n, true, 0, "allreduce on the device");
}

static int broadcast(gs_engine_t *e, void *buf, size_t bytes, bool on_device, uint32_t root)
{
  if (root >= gs__membership_world(&e->member)) {
    gs_set_why(e->error, sizeof(e->error), "broadcast from rank %u in a world of %u", root,
               gs__membership_world(&e->member));
    return GS_EINVAL;
  }
  return between_steps(e, OP_BROADCAST, buf, bytes, on_device, root, "broadcast");
}

int gs_engine_broadcast(gs_engine_t *e, void *buf, size_t bytes, uint32_t root)
{
  return broadcast(e, buf, bytes, false, root);
}

int gs_engine_broadcast_on_device(gs_engine_t *e, void *buf, size_t bytes, uint32_t root)
{
  return broadcast(e, buf, bytes, true, root);
}
