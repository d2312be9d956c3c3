/* The registry of jobs and the jobs layer's entry points (see jobs.h). */
#include "jobs.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "heartbeat.h"
#include "trace.h"
#include "regroup.h"
#include "rendezvous.h"
#include "session.h"

/* After a call changed what waiting heartbeats wait for, they hear it. */
static void tell_news(gs_job_t *job)
{
  if (job && job->news != job->news_told)
    gs__heartbeat_tell_news(job);
}

void gs__jobs_init(gs_jobs_t *jobs, const gs_jobs_config_t *cfg, gs_responder_t *r)
{
  memset(jobs, 0, sizeof(*jobs));
  jobs->cfg = *cfg;
  if (!jobs->cfg.reregister_slack_ms)
    jobs->cfg.reregister_slack_ms = GS_REREGISTER_SLACK_MS;
  jobs->responder = r;
  gs_list_init(&jobs->resting);
  gs_list_init(&jobs->trace_orphans);
}

gs_job_t *gs__jobs_find(gs_jobs_t *jobs, const char *name)
{
  return gs__job_index_find(&jobs->index, name);
}

static bool job_resting(const gs_job_t *job);
static void forget(gs_jobs_t *jobs, gs_job_t *job);

/* At --max-jobs, the job at rest longest (finished, failed, or its
 * rendezvous gone, kept only for its status) is forgotten to make room:
 * short jobs must not shut new ones out for --job-retention. False when
 * every job held is at work. */
static bool make_room(gs_jobs_t *jobs, const gs_call_t *call, const char *name)
{
  gs_list_t *first;
  uint32_t held_back;

  while ((first = gs_list_first(&jobs->resting))) {
    gs_job_t *job = GS_CONTAINER_OF(first, gs_job_t, rest_node);

    if (!job_resting(job)) { /* at work again since the sweep saw it */
      gs_list_remove(&job->rest_node);
      job->resting = false;
      continue;
    }
    jobs->forgotten_for_room++;
    if (gs_ratelimit_allow(&jobs->job_cap_log, call->now_ms, &held_back))
      gs_log(jobs->cfg.log, GS_LOG_INFO, job->name, -1,
             "%s, at rest; forgotten to make room for job %s (--max-jobs %u; %llu jobs "
             "forgotten so; %u such lines held back)",
             gs__job_state_name(job->state), name, jobs->cfg.max_jobs,
             (unsigned long long)jobs->forgotten_for_room, held_back);
    forget(jobs, job);
    return true;
  }
  return false;
}

/* Whether a Join for a job not held yet is refused: the coordinator holds
 * --max-jobs already, every one of them at work. The jobs held go on;
 * each refusal is answered, and logged at a bounded rate (a flood of them
 * is what the cap is for). */
static bool refuse_new_job(gs_jobs_t *jobs, const gs_call_t *call, const char *name)
{
  uint32_t held_back;

  if (jobs->job_count < jobs->cfg.max_jobs || make_room(jobs, call, name))
    return false;
  if (gs_ratelimit_allow(&jobs->job_cap_log, call->now_ms, &held_back))
    gs_log(jobs->cfg.log, GS_LOG_WARN, name, -1,
           "join refused: the coordinator holds %u jobs, its limit (--max-jobs) "
           "(%u such lines held back)",
           jobs->job_count, held_back);
  gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, GS_ELIMIT,
                    "job %s not created: the coordinator holds %u jobs, its limit (--max-jobs), "
                    "and each is at work (one at rest would make room)",
                    name, jobs->job_count);
  return true;
}

/* The job a Join names, created when it is new; NULL (the call answered)
 * when it may not be or memory ran out. */
static gs_job_t *get_or_create(gs_jobs_t *jobs, const gs_call_t *call, const char *name)
{
  gs_job_t *job = gs__jobs_find(jobs, name);

  if (job || refuse_new_job(jobs, call, name))
    return job;
  job = gs__job_new(jobs, name);
  if (job && gs__job_index_insert(&jobs->index, job)) {
    gs__job_free(job);
    job = NULL;
  }
  if (!job) {
    gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, GS_ENOMEM,
                      "coordinator out of memory");
    return NULL;
  }
  job->serial = ++jobs->jobs_created;
  job->next = jobs->jobs;
  if (jobs->jobs)
    jobs->jobs->prev = job;
  jobs->jobs = job;
  jobs->job_count++;
  return job;
}

/* The job a request names: the connection's own job when it is that one
 * (every heartbeat of a joined agent: no search), else a lookup. */
static gs_job_t *job_of_call(gs_jobs_t *jobs, const gs_call_t *call, const char *name)
{
  const gs_member_t *m = call->peer->member;

  if (m && strcmp(m->job->name, name) == 0)
    return m->job;
  return gs__jobs_find(jobs, name);
}

#define CATCH_UP_MS 1000

#define RESTARTED_HINT " (if the coordinator restarted, re-register with rejoin_generation)"

static void reply_no_job(gs_jobs_t *jobs, const gs_call_t *call, const char *name, const char *hint)
{
  gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, GS_ENOTFOUND,
                    "no job named %s%s", name, hint);
}

/* The job of a request, checked to be running `generation`; answers with
 * the reason and returns NULL otherwise. */
static gs_job_t *running_job(gs_jobs_t *jobs, const gs_call_t *call, const char *name,
                             uint64_t generation)
{
  gs_job_t *job = gs__jobs_find(jobs, name);
  int err = GS_EPRECOND;
  char msg[400];

  if (!job) {
    reply_no_job(jobs, call, name, "");
    return NULL;
  }
  if (generation == job->aborted_generation && generation) {
    err = GS_EABORTED;
    snprintf(msg, sizeof(msg), "generation %llu of job %s was aborted: %s",
             (unsigned long long)generation, name, job->abort_reason);
  } else if (generation < job->generation) {
    err = GS_EABORTED;
    snprintf(msg, sizeof(msg), "generation %llu of job %s was superseded by %llu",
             (unsigned long long)generation, name, (unsigned long long)job->generation);
  } else if (generation != job->generation || job->state == GS_JOB_WAITING ||
             job->state == GS_JOB_FAILED) {
    snprintf(msg, sizeof(msg),
             "job %s is not running generation %llu (it is %s at generation %llu)", name,
             (unsigned long long)generation, gs__job_state_name(job->state),
             (unsigned long long)job->generation);
  } else {
    return job;
  }
  gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, err, "%s",
                    msg);
  return NULL;
}

void gs__jobs_join(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_job_t *job;

  jobs->version++;
  jobs->now_ms = call->now_ms;
  if (!gs__rendezvous_check(jobs, call, req))
    return;
  job = get_or_create(jobs, call, req->job);
  if (job)
    gs__rendezvous_join(job, call, req);
  tell_news(job);
}

void gs__jobs_publish(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_PublishRequest *req)
{
  gs_job_t *job = running_job(jobs, call, req->job, req->generation);

  jobs->version++;
  if (job && gs__session_check(job, call, req->generation, -1))
    gs__store_publish(&job->store, call, req);
}

void gs__jobs_fetch(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_FetchRequest *req)
{
  gs_job_t *job = running_job(jobs, call, req->job, req->generation);

  jobs->version++;
  if (job && gs__session_check(job, call, req->generation, -1))
    gs__store_fetch(&job->store, call, req);
}

void gs__jobs_publish_pack_list(gs_jobs_t *jobs, const gs_call_t *call, const char *name,
                                uint64_t generation, uint32_t rank, const gs_buf_t *body,
                                const gs_pack_summary_t *summary)
{
  gs_job_t *job = running_job(jobs, call, name, generation);
  const gs_member_t *r0;

  jobs->version++;
  if (!job)
    return;
  r0 = job->ranks[0];
  if (rank != 0) {
    gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, GS_EPERM,
                      "only rank 0 publishes the pack list (got rank %u)", rank);
    return;
  }
  if (!gs__session_check(job, call, generation, 0))
    return;
  if (r0 && r0->req.has_model_signature && r0->req.model_signature.param_count != summary->params) {
    gs__respond_error(jobs->responder, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "the pack list has %u params but rank 0 joined with a model of %u",
                      summary->params, r0->req.model_signature.param_count);
    return;
  }
  gs__store_publish_pack_list(&job->store, call, generation, body, summary);
}

void gs__jobs_fetch_pack_list(gs_jobs_t *jobs, const gs_call_t *call,
                              const gradsync_FetchPackListRequest *req)
{
  gs_job_t *job = running_job(jobs, call, req->job, req->generation);

  jobs->version++;
  if (job && gs__session_check(job, call, req->generation, -1))
    gs__store_fetch_pack_list(&job->store, call, req->generation);
}

void gs__jobs_heartbeat(gs_jobs_t *jobs, const gs_call_t *call,
                        const gradsync_HeartbeatRequest *req)
{
  gs_job_t *job = job_of_call(jobs, call, req->job);
  gs_beat_t beat = {
      .clock_sent_us = req->clock_sent_us,
      .clock_replied_us = req->clock_replied_us,
      .wait_ms = req->wait_ms,
  };

#define COPY(name, ctype, part, ...) beat.name = (ctype)GS_BEAT_IN_REQUEST(*req, part, name);
  GS_BEAT_FIELDS(COPY)
#undef COPY

  jobs->progress++;
  jobs->now_ms = call->now_ms;
  if (job) {
    gs__heartbeat(job, call, &beat);
    tell_news(job);
  } else
    reply_no_job(jobs, call, req->job, RESTARTED_HINT);
}

gs_beat_t gs__jobs_beat_of(const gs_node_beats_t *q, uint32_t i)
{
  gs_beat_t beat = {0}; /* no clock samples, no long poll */

#define COPY(name, ...) beat.name = q->name[i];
  GS_BEAT_FIELDS(COPY)
#undef COPY
  return beat;
}

void gs__jobs_node_heartbeat(gs_jobs_t *jobs, const char *name, const gs_node_beat_t *beats,
                             uint32_t n)
{
  gs_job_t *job = n ? job_of_call(jobs, &beats[0].call, name) : NULL;

  jobs->progress++;
  if (job)
    gs__heartbeat_node_beats(job, true);
  for (uint32_t i = 0; i < n; i++) {
    /* The next rank's member, on its way to the cache while this one's is
     * taken: 100,000 members are 100,000 cache misses a second. */
    if (i + 1 < n && beats[i + 1].call.peer->member)
      __builtin_prefetch(beats[i + 1].call.peer->member);
    jobs->now_ms = beats[i].call.now_ms;
    if (job)
      gs__heartbeat(job, &beats[i].call, &beats[i].beat);
    else
      reply_no_job(jobs, &beats[i].call, name, RESTARTED_HINT);
  }
  if (job) {
    gs__heartbeat_node_beats(job, false);
    tell_news(job);
  }
}

void gs__jobs_leave(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_LeaveRequest *req)
{
  gs_job_t *job = job_of_call(jobs, call, req->job);

  jobs->version++;
  jobs->now_ms = call->now_ms;
  if (!job) {
    reply_no_job(jobs, call, req->job, RESTARTED_HINT);
    return;
  }
  gs__job_leave(job, call, req);
  if (job->ranks && req->rank < job->world_size && job->ranks[req->rank] &&
      job->ranks[req->rank]->state == GS_MEMBER_LEFT)
    gs__heartbeat_release(job->ranks[req->rank]);
  /* Agents waiting to join an elastic job's next generation: there is none. */
  if (job->state == GS_JOB_FINISHED && gs__rendezvous_joined(job)) {
    char msg[200];

    snprintf(msg, sizeof(msg), "job %s finished while this agent waited to join it", job->name);
    gs__rendezvous_cancel(job, GS_EPRECOND, msg);
  }
  tell_news(job);
}

/* Whether the coordinator is catching up after its own loop stopped or
 * starved: the sweep, which runs every second, has not run for half the
 * heartbeat timeout (the events that waited meanwhile come first), or
 * found such a gap within the last CATCH_UP_MS (the events that waited
 * are all read within a few turns of the loop). */
static bool after_own_stall(gs_jobs_t *jobs, uint64_t now)
{
  if (jobs->swept_ms && now > jobs->swept_ms + jobs->cfg.heartbeat_timeout_ms / 2)
    jobs->stall_until_ms = now + CATCH_UP_MS;
  return now >= jobs->swept_ms && now < jobs->stall_until_ms;
}

void gs__jobs_peer_closed(gs_jobs_t *jobs, gs_peer_t *peer, uint64_t now)
{
  gs_member_t *m = peer->member;
  gs_job_t *job = m ? m->job : NULL;

  jobs->version++;
  if (!m)
    return;
  gs__member_unbind(m);
  if (m->state == GS_MEMBER_RUNNING && gs__member_active(m) && after_own_stall(jobs, now)) {
    /* Its agent redialled while we did not run (a heartbeat that timed
     * out closes its connection): its next heartbeat ties it to the new
     * one, its Leave may be on the way, and silence decides. A rank
     * finished while the coordinator was stopped was lost here, and its
     * job recorded failed. */
    gs__hb_touch(m, now);
    gs_log(jobs->cfg.log, GS_LOG_INFO, job->name, (long)m->rank,
           "connection closed while the coordinator caught up after its own stall: the rank "
           "has the heartbeat timeout to come back or leave");
    return;
  }
  if (m->state == GS_MEMBER_WAITING)
    gs__rendezvous_drop(m->job, m);
  else if (gs__member_active(m) || gs__member_pending(m))
    gs__member_lost(m,
                    peer->node_slot ? "its node agent's connection closed" : "connection closed");
  tell_news(job); /* m may be gone */
}

static void job_free(gs_job_t *job)
{
  gs__rendezvous_cancel(job, 0, NULL);
  gs__job_free(job);
}

/* Drops a job at rest from the registry and frees it. */
static void forget(gs_jobs_t *jobs, gs_job_t *job)
{
  if (job->prev)
    job->prev->next = job->next;
  else
    jobs->jobs = job->next;
  if (job->next)
    job->next->prev = job->prev;
  if (gs_list_linked(&job->rest_node))
    gs_list_remove(&job->rest_node);
  jobs->job_count--;
  jobs->version++;
  gs__job_index_remove(&jobs->index, job);
  job_free(job);
}

/* Whether a job has nothing in progress: no rendezvous gathering, no
 * parked call, no generation running. */
static bool job_resting(const gs_job_t *job)
{
  return gs__rendezvous_joined(job) == 0 && !job->store.waiters && job->state != GS_JOB_RUNNING;
}

/* A job at rest has nothing left but its status: after the retention
 * period it goes (a finished one counted from when it finished, one whose
 * generation failed from when the sweep first saw it at rest), so a
 * long-lived coordinator does not grow with every job it ever saw. One
 * that never started (its rendezvous timed out or its agents went) goes
 * at once: it has no generation to show, its agents were told why and the
 * log says who had joined, and one-shot Joins must cost nothing once
 * their connections close (they came 5,000 a second, 11 KB each). */
static bool job_expired(gs_job_t *job, uint64_t now)
{
  uint64_t since;

  if (!job_resting(job)) {
    job->resting = false;
    if (gs_list_linked(&job->rest_node))
      gs_list_remove(&job->rest_node);
    return false;
  }
  if (!job->resting) {
    job->resting = true;
    job->resting_since_ms = now;
    gs_list_insert_tail(&job->jobs->resting, &job->rest_node);
  }
  if (job->generation == 0)
    return true;
  since = job->state == GS_JOB_FINISHED ? job->finished_ms : job->resting_since_ms;
  return now - since >= job->jobs->cfg.job_retention_ms;
}

/* One line per job forgotten; one that never started says so only at
 * debug: its rendezvous' end was logged already, and a flood of one-shot
 * Joins must not become a flood of lines. */
static void log_forgotten(const gs_job_t *job, uint64_t now)
{
  const gs_log_t *log = job->jobs->cfg.log;

  if (job->generation == 0)
    gs_log(log, GS_LOG_DEBUG, job->name, -1, "never started and nothing waits in it; forgotten");
  else if (job->state == GS_JOB_FINISHED)
    gs_log(log, GS_LOG_INFO, job->name, -1, "finished %.0f s ago; forgotten",
           (now - job->finished_ms) / 1000.0);
  else
    gs_log(log, GS_LOG_INFO, job->name, -1, "%s with nothing in progress for %.0f s; forgotten",
           gs__job_state_name(job->state), (now - job->resting_since_ms) / 1000.0);
}

void gs__jobs_sweep(gs_jobs_t *jobs, uint64_t now)
{
  jobs->version++;
  jobs->now_ms = now;
  after_own_stall(jobs, now); /* a gap since the last sweep opens the window */
  if (now > jobs->swept_ms)
    jobs->swept_ms = now;
  for (gs_job_t *job = jobs->jobs, *next; job; job = next) {
    next = job->next;
    gs__rendezvous_sweep(job, now);
    gs__heartbeat_sweep(job, now);
    tell_news(job);
    gs__store_sweep(&job->store, now);
    gs__trace_sweep(job);
    gs__curve_sample(job, now);
    if (job_expired(job, now)) {
      log_forgotten(job, now);
      forget(jobs, job);
    }
  }
}

bool gs__jobs_checkpoints_off(const gs_job_t *job)
{
  return job->ranks && job->world_size > 0 && job->ranks[0] &&
         job->ranks[0]->req.checkpoints == gradsync_Checkpoints_CHECKPOINTS_OFF;
}

void gs__jobs_control(gs_job_t *job, const gs_job_control_t *c)
{
  const gs_log_t *log = job->jobs->cfg.log;

  job->jobs->version++;
  if (c->set_period) {
    job->bcast_period = c->period;
    job->bcast_period_overridden = true;
    gs_log(log, GS_LOG_INFO, job->name, -1, "control: bcast_period set to %d", c->period);
  }
  if (c->set_lr_scale) {
    job->lr_scale = c->lr_scale;
    gs_log(log, GS_LOG_INFO, job->name, -1, "control: lr_scale set to %g", (double)c->lr_scale);
  }
  if (c->action == GS_JOB_ACTION_BROADCAST)
    job->broadcast_seq++;
  else if (c->action == GS_JOB_ACTION_CHECKPOINT)
    job->checkpoint_seq++;
  else if (c->action == GS_JOB_ACTION_STOP)
    job->stop = true;
  job->news++;
  tell_news(job);
}

uint64_t gs__jobs_trace(gs_job_t *job, uint32_t steps)
{
  gs__trace_forget(job); /* the last request's document */
  job->trace_seq++;
  job->trace_steps = steps;
  job->trace_generation = job->generation;
  job->jobs->version++;
  job->news++;
  tell_news(job);
  gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
         "trace %" PRIu64 ": the ranks record their next %u step(s)", job->trace_seq, steps);
  return job->trace_seq;
}

void gs__jobs_free(gs_jobs_t *jobs)
{
  gs_job_t *job = jobs->jobs, *next;

  for (; job; job = next) {
    next = job->next;
    job_free(job);
  }
  jobs->jobs = NULL;
  jobs->job_count = 0;
  gs_list_init(&jobs->resting);
  gs__trace_detach_all(jobs);
  gs__job_index_free(&jobs->index);
}
