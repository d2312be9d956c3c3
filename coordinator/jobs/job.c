/* One job: members and their connections, the heartbeat list, Join
 * replies, aborting a generation, and leaving. */
#include "job.h"

#include "curve.h"
#include "history.h"
#include "invariant.h"
#include "session.h"
#include "trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb_array.h"
#include "why.h"

const char *gs__job_state_name(gs_job_state_t s)
{
  static const char *const names[] = {"waiting", "running", "finished", "failed"};
  return names[s];
}

const char *gs__member_state_name(gs_member_state_t s)
{
  static const char *const names[] = {"waiting", "running", "left", "lost"};
  return names[s];
}

gs_job_t *gs__job_new(gs_jobs_t *jobs, const char *name)
{
  gs_job_t *job = calloc(1, sizeof(*job));

  if (!job)
    return NULL;
  job->jobs = jobs;
  snprintf(job->name, sizeof(job->name), "%s", name);
  job->lr_scale = 1.0f;
  gs_list_init(&job->hb_list);
  gs_list_init(&job->rest_node);
  gs_list_init(&job->wait_list);
  gs_list_init(&job->node_waits);
  gs__store_init(&job->store, jobs->responder, jobs->cfg.log, job->name, jobs->cfg.mem);
  return job;
}

void gs__job_free(gs_job_t *job)
{
  free(job->rdv.waiting);
  gs__claims_free(&job->rdv.claims);
  gs__job_free_ranks(job);
  gs__store_reset(&job->store);
  gs__trace_forget(job);
  gs_buf_free(&job->hb_reply.body);
  free(job->history);
  gs__curve_free(job);
  free(job);
}

/* Detaches a member from its connection, if the connection still has it. */
void gs__member_unbind(gs_member_t *m)
{
  if (m->peer && m->peer->member == m)
    m->peer->member = NULL;
  m->peer = NULL;
}

void gs__member_bind(gs_member_t *m, gs_peer_t *peer)
{
  if (peer->member && peer->member != m)
    gs__member_unbind(peer->member);
  gs__member_unbind(m);
  m->peer = peer;
  peer->member = m;
}

/* The heartbeat list holds the running members, oldest heartbeat first: a
 * heartbeat moves its member to the end, so finding a silent rank reads the
 * head only. O(1) per heartbeat and per sweep, whatever the world size. */
void gs__hb_unlink(gs_member_t *m)
{
  if (gs_list_linked(&m->hb_node))
    gs_list_remove(&m->hb_node);
}

/* The caller's clock never goes back, so appending keeps the list in order. */
void gs__hb_touch(gs_member_t *m, uint64_t now)
{
  gs__hb_unlink(m);
  m->last_heartbeat_ms = now;
  gs_list_insert_tail(&m->job->hb_list, &m->hb_node);
}

gs_member_t *gs__member_new(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_member_t *m = calloc(1, sizeof(*m));

  if (!m)
    return NULL;
  m->job = job;
  gs__member_count(m, GS_MEMBER_COST);
  m->req = *req;
  m->req.settings = (pb_callback_t){0}; /* the caller's; rendezvous.c keeps a copy */
  m->join_request_id = call->request_id;
  m->join_deadline_ms = call->deadline_ms;
  m->last_heartbeat_ms = call->now_ms;
  gs__member_bind(m, call->peer);
  return m;
}

void gs__member_count(gs_member_t *m, size_t add)
{
  gs_mem_budget_t *mem = m->job->jobs->cfg.mem;

  m->counted += add;
  if (mem)
    gs_mem_budget_members(mem, add, 0);
}

void gs__member_free(gs_member_t *m)
{
  gs_mem_budget_t *mem;

  if (!m)
    return;
  mem = m->job->jobs->cfg.mem;
  if (mem)
    gs_mem_budget_members(mem, 0, m->counted);
  if (gs_list_linked(&m->poll.node)) { /* never answered: its connection waits no more */
    m->job->jobs->responder->unpark(m->job->jobs->responder, m->poll.peer);
    gs_list_remove(&m->poll.node);
  }
  gs__member_unbind(m);
  gs__hb_unlink(m);
  free(m->settings);
  free(m);
}

bool gs__member_active(const gs_member_t *m)
{
  const gs_job_t *job = m->job;

  if (m->state == GS_MEMBER_WAITING)
    return true;
  return m->state == GS_MEMBER_RUNNING && job->state == GS_JOB_RUNNING &&
         m->generation == job->generation && job->aborted_generation != job->generation;
}

void gs__member_lost(gs_member_t *m, const char *how)
{
  gs_job_t *job = m->job;
  bool pending = gs__member_pending(m);
  char what[320];

  m->state = GS_MEMBER_LOST;
  gs__hb_unlink(m);
  job->jobs->stats.ranks_lost++;
  snprintf(what, sizeof(what), "rank %u (node '%s', local_rank %u) lost: %s", m->rank, m->req.node,
           m->req.local_rank, how);
  if (job->world_min)
    gs__generation_note(job, "%s", what);
  if (!pending) {
    gs__job_abort(job, "%s", what);
    return;
  }
  /* A survivor of an elastic generation that ended already: one fewer to wait for. */
  job->regroup_pending--;
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "generation %llu: %s",
         (unsigned long long)m->generation, what);
}

void gs__job_free_ranks(gs_job_t *job)
{
  for (uint32_t r = 0; job->ranks && r < job->world_size; r++)
    gs__member_free(job->ranks[r]);
  free(job->ranks);
  free(job->peers);
  job->ranks = NULL;
  job->peers = NULL;
  job->world_size = 0;
  job->ranks_left = 0;
}

gs_job_state_t gs__job_resting_state(const gs_job_t *job)
{
  if (job->regrouping)
    return GS_JOB_WAITING;
  if (job->generation && job->aborted_generation == job->generation)
    return GS_JOB_FAILED;
  if (job->world_size && job->ranks_left == job->world_size)
    return GS_JOB_FINISHED;
  return GS_JOB_WAITING;
}

void gs__job_stall_reset(gs_job_t *job, uint64_t now)
{
  job->step_max = 0;
  job->step_advanced_ms = now;
  job->stalled = false;
  gs__waiting_clear(job);
}

void gs__job_fill_peer(gs_job_t *job, uint32_t r)
{
  const gs_member_t *m = job->ranks[r];
  gradsync_Peer *p = &job->peers[r];

  memset(p, 0, sizeof(*p));
  p->rank = r;
  if (!m)
    return;
  memcpy(p->node, m->req.node, sizeof(p->node));
  p->local_rank = m->req.local_rank;
  memcpy(p->device, m->req.device, sizeof(p->device));
  memcpy(p->comm_addr, m->req.comm_addr, sizeof(p->comm_addr));
}

gradsync_Directives gs__job_directives(const gs_job_t *job)
{
  return (gradsync_Directives){
      .bcast_period = job->bcast_period,
      .broadcast_seq = job->broadcast_seq,
      .checkpoint_seq = job->checkpoint_seq,
      .stop = job->stop,
      .regroup_seq = job->regroup_seq,
      .trace_seq = job->trace_seq,
      .trace_steps = job->trace_steps,
      .lr_scale = job->lr_scale,
  };
}

void gs__job_reply_join(gs_job_t *job, const gs_member_t *m, uint64_t request_id)
{
  const gs_jobs_config_t *cfg = &job->jobs->cfg;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Peer ring[2];
  gs_pb_array_t peers;
  uint32_t n = job->world_size;

  if (!m->peer)
    return; /* its connection closed: nobody to tell */
  resp.rank = m->rank;
  resp.world_size = n;
  resp.generation = job->generation;
  resp.bcast_period = job->bcast_period;
  resp.heartbeat_interval_ms = (uint32_t)cfg->heartbeat_interval_ms;
  resp.heartbeat_timeout_ms = (uint32_t)cfg->heartbeat_timeout_ms;
  snprintf(resp.session, sizeof(resp.session), "%s", m->session);
  resp.has_directives = true;
  resp.directives = gs__job_directives(job);
  resp.coordinator_id = cfg->coordinator_id;
  resp.resume_state = job->resume_state;
  resp.state_rank = job->state_rank;
  resp.state_step = job->state_step;
  snprintf(resp.regroup_reason, sizeof(resp.regroup_reason), "%s",
           gs__generation_previous_end(job));
  switch (m->req.peers) {
  case gradsync_PeerSet_PEERS_RING:
    ring[0] = job->peers[(m->rank + n - 1) % n];
    ring[1] = job->peers[(m->rank + 1) % n];
    gs_pb_array_view(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer), ring, n > 1 ? 2 : 1);
    break;
  case gradsync_PeerSet_PEERS_NONE:
    gs_pb_array_view(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer), NULL, 0);
    break;
  default:
    gs_pb_array_view(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer), job->peers, n);
  }
  gs_pb_array_bind_encode(&resp.peers, &peers);
  gs__respond(job->jobs->responder, m->peer->id, GS_METHOD_JOIN, request_id,
              gradsync_JoinResponse_fields, &resp);
}

bool gs__member_pending(const gs_member_t *m)
{
  const gs_job_t *job = m->job;

  return job->regrouping && m->generation == job->generation && m->state == GS_MEMBER_RUNNING &&
         !m->regrouped;
}

/* An elastic job's generation ended: its running members are the
 * survivors the next rendezvous waits for, each for up to the heartbeat
 * timeout. */
static void gather_survivors(gs_job_t *job)
{
  uint32_t pending = 0;

  job->regroup_deadline = UINT64_MAX;
  for (uint32_t r = 0; job->ranks && r < job->world_size; r++) {
    gs_member_t *m = job->ranks[r];

    if (!m || m->state != GS_MEMBER_RUNNING || m->regrouped)
      continue;
    pending++;
    /* Each has a heartbeat timeout from its last heartbeat: a node's other
     * ranks, silent as long as the one lost, are lost at once. */
    if (m->last_heartbeat_ms + job->jobs->cfg.heartbeat_timeout_ms < job->regroup_deadline)
      job->regroup_deadline = m->last_heartbeat_ms + job->jobs->cfg.heartbeat_timeout_ms;
  }
  job->regrouping = true;
  job->regroup_pending = pending;
  job->state = GS_JOB_WAITING; /* its survivors gather: a rendezvous */
  gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
         "elastic job %s: waiting for the %u surviving rank(s) of generation %llu to come back "
         "(%u..%u ranks)",
         job->name, pending, (unsigned long long)job->generation, job->world_min, job->world_max);
}

/* Ends the running generation. `urgent`: the waiting heartbeats hear it
 * at once (a rank was lost: the others may be blocked on it); else at the
 * end of their waits, as without a long poll (a rank that left failing:
 * the others may be finishing the step's last collective, which a
 * failure every rank decides alike, such as a non-finite loss, must not
 * cut short). */
static void end_generation(gs_job_t *job, bool failed, bool urgent, const char *fmt, va_list ap)
{
  if (job->state != GS_JOB_RUNNING || job->aborted_generation == job->generation)
    return;
  gs_set_whyv(job->abort_reason, sizeof(job->abort_reason), fmt, ap);
  job->aborted_generation = job->generation;
  job->state = GS_JOB_FAILED;
  if (urgent)
    job->news++;
  if (failed)
    job->jobs->stats.generations_aborted++;
  gs_log(job->jobs->cfg.log, failed ? GS_LOG_WARN : GS_LOG_INFO, job->name, -1,
         "generation %llu %s: %s", (unsigned long long)job->generation,
         failed ? "aborted" : "ended", job->abort_reason);
  gs__generation_ended(job, job->jobs->now_ms, job->abort_reason);
  gs__store_fail_waiters(&job->store, GS_EABORTED, job->abort_reason);
  gs__store_drop(&job->store); /* the generation's blobs are of no more use */
  if (job->world_min)
    gather_survivors(job);
}

void gs__job_abort(gs_job_t *job, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  end_generation(job, true, true, fmt, ap);
  va_end(ap);
}

void gs__job_end(gs_job_t *job, bool failed, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  end_generation(job, failed, true, fmt, ap);
  va_end(ap);
}

/* A rank left failing (see end_generation). */
__attribute__((format(printf, 2, 3))) static void abort_for_leave(gs_job_t *job, const char *fmt,
                                                                  ...)
{
  va_list ap;

  va_start(ap, fmt);
  end_generation(job, true, false, fmt, ap);
  va_end(ap);
}

gs_member_t *gs__job_find_member(gs_job_t *job, const gs_call_t *call, uint64_t g, uint32_t r)
{
  if (g > job->generation || r >= job->world_size || !job->ranks[r]) {
    gs__respond_error(job->jobs->responder, call->peer->id, call->method, call->request_id,
                      GS_ENOTFOUND,
                      "job %s has no rank %u in generation %llu "
                      "(re-register with rejoin_generation)",
                      job->name, r, (unsigned long long)g);
    return NULL;
  }
  /* The rank table and its members agree: a member knows its own place,
   * and no member is of a generation the job has not reached. */
  GS_ASSERT(job->ranks[r]->rank == r && job->ranks[r]->generation <= job->generation);
  return job->ranks[r];
}

void gs__job_leave(gs_job_t *job, const gs_call_t *call, const gradsync_LeaveRequest *req)
{
  gs_member_t *m = gs__job_find_member(job, call, req->generation, req->rank);

  if (!m || !gs__session_owns(m, call))
    return;
  if (req->generation == job->generation && m->state == GS_MEMBER_RUNNING) {
    if (gs__member_pending(m))
      job->regroup_pending--;
    m->state = GS_MEMBER_LEFT;
    job->ranks_left++;
    gs__member_unbind(m);
    gs__hb_unlink(m);
    if (!req->finished) {
      abort_for_leave(job, "rank %u left: %s", req->rank, req->reason[0] ? req->reason : "failed");
    } else {
      gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, req->rank, "left (finished): %u of %u",
             job->ranks_left, job->world_size);
      if (job->ranks_left == job->world_size && job->state == GS_JOB_RUNNING) {
        job->state = GS_JOB_FINISHED;
        job->finished_ms = call->now_ms;
        gs__generation_ended(job, call->now_ms, "finished");
        gs__store_drop(&job->store);
      }
    }
  }
  gs__respond(job->jobs->responder, call->peer->id, GS_METHOD_LEAVE, call->request_id,
              gradsync_LeaveResponse_fields,
              &(gradsync_LeaveResponse)gradsync_LeaveResponse_init_zero);
}
