/* Elastic membership (see regroup.h). */
#include "regroup.h"

#include <stdio.h>
#include <string.h>

#include "session.h"
#include "why.h"

#define REPLY_ERR(job, call, err, ...)                                                             \
  gs__respond_error((job)->jobs->responder, (call)->peer->id, (call)->method, (call)->request_id,  \
                    (err), __VA_ARGS__)

bool gs__regroup_survivor(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_member_t *m = gs__session_member(job, call->session, job->generation);

  /* Its job went on without it and is over: nothing to join (a fresh Join
   * would open a new rendezvous of the same job). */
  if (!m && job->state == GS_JOB_FINISHED) {
    REPLY_ERR(job, call, GS_EPRECOND,
              "job %s finished (generation %llu) while this agent was away from it; nothing left "
              "to train",
              job->name, (unsigned long long)job->generation);
    return false;
  }
  if (!m || m->regrouped || m->state != GS_MEMBER_RUNNING) {
    REPLY_ERR(job, call, GS_EABORTED,
              "this agent is no member of generation %llu of job %s (%s); join again as a new "
              "agent",
              (unsigned long long)job->generation, job->name,
              m && m->state == GS_MEMBER_LOST ? "it was declared lost"
              : m && m->regrouped             ? "it came back already"
                                              : "its generation is over");
    return false;
  }
  if (job->state == GS_JOB_RUNNING && job->aborted_generation != job->generation) {
    if (!strcmp(req->reason, "regroup"))
      gs__job_end(job, false, "regroup after step %llu to admit %u waiting agent(s)",
                  (unsigned long long)req->state_step, gs__rendezvous_joined(job));
    else
      gs__job_end(job, true, "rank %u (node '%s', local_rank %u) left: %s", m->rank, m->req.node,
                  m->req.local_rank, req->reason[0] ? req->reason : "its collectives failed");
  }
  if (gs__member_pending(m))
    job->regroup_pending--;
  m->regrouped = true;
  gs__member_unbind(m); /* its old connections may close now: it is back */
  gs__hb_unlink(m);
  return true;
}

bool gs__regroup_has_room(const gs_job_t *job)
{
  return gs__job_elastic(job) && job->world_size + gs__rendezvous_joined(job) < job->world_max;
}

void gs__regroup_request(gs_job_t *job)
{
  job->regroup_seq++;
  job->news++;
}

bool gs__regroup_ready(const gs_job_t *job, uint64_t now)
{
  uint32_t n = gs__rendezvous_joined(job);

  if (!gs__job_elastic(job))
    return n == gs__rendezvous_world(job);
  if (n >= job->world_max)
    return true;
  if (n < job->world_min ||
      (job->state == GS_JOB_RUNNING && job->aborted_generation != job->generation))
    return false; /* too few, or newcomers waiting for the ranks to regroup */
  if (job->regrouping)
    return job->regroup_pending == 0;
  return now - job->last_join_ms >= GS_REGROUP_SETTLE_MS;
}

void gs__regroup_sweep(gs_job_t *job, uint64_t now)
{
  char how[96];

  if (!job->regrouping)
    return;
  if (job->regroup_pending && now >= job->regroup_deadline) {
    uint64_t timeout = job->jobs->cfg.heartbeat_timeout_ms, next = UINT64_MAX;

    /* O(world), once per deadline: the survivors not back a heartbeat
     * timeout after their last heartbeat are lost; the next deadline is
     * the earliest of the others'. */
    for (uint32_t r = 0; job->ranks && r < job->world_size; r++) {
      gs_member_t *m = job->ranks[r];

      if (!m || !gs__member_pending(m))
        continue;
      if (m->last_heartbeat_ms + timeout > now) {
        next = m->last_heartbeat_ms + timeout < next ? m->last_heartbeat_ms + timeout : next;
        continue;
      }
      snprintf(how, sizeof(how), "no heartbeat for %.1fs, and not back",
               (now - m->last_heartbeat_ms) / 1000.0);
      gs__member_lost(m, how);
    }
    job->regroup_deadline = next;
  }
  if (gs__rendezvous_joined(job) == 0 && job->regroup_pending == 0) {
    /* Nobody came back, or those who did gave up waiting for the rest. */
    job->regrouping = false;
    job->state = gs__job_resting_state(job);
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1,
           "elastic job %s failed: fewer than %u rank(s) came back after generation %llu ended "
           "(%s)",
           job->name, job->world_min, (unsigned long long)job->generation, job->abort_reason);
  }
}

void gs__regroup_choose_state(gs_job_t *job, gs_member_t *const *ranks, uint32_t n)
{
  job->resume_state = false;
  job->state_rank = 0;
  job->state_step = 0;
  for (uint32_t i = 0; i < n; i++) {
    const gradsync_JoinRequest *q = &ranks[i]->req;

    if (q->has_state && (!job->resume_state || q->state_step > job->state_step)) {
      job->resume_state = true;
      job->state_rank = i;
      job->state_step = q->state_step;
    }
  }
}
