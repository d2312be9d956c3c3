/* Heartbeats and the liveness sweep (see heartbeat.h). */
#include "heartbeat.h"

#include <stdio.h>
#include <string.h>

#include "history.h"
#include "session.h"
#include "trace.h"
#include "wire.h"

/* A reply's `news` (HeartbeatResponse.news): every abort is the same news
 * (the rank rejoins, and the node agent starts its slot afresh when its
 * beats name another generation); each body built for the replies without
 * one gets a number of its own, from 2, coordinator-wide. */
#define NEWS_ABORT 1
#define NEWS_FIRST_BODY 2

/* The body of a heartbeat reply without an abort, encoded again only when
 * a directive changed since the last one. NULL if it cannot be encoded. */
static const gs_buf_t *ok_heartbeat_body(gs_job_t *job)
{
  gradsync_Directives now = gs__job_directives(job);
  const gradsync_Directives *d = &job->hb_reply.directives;
  gradsync_HeartbeatResponse resp; /* 600 bytes: zeroed only when it is built */

  if (job->hb_reply.current)
    return &job->hb_reply.body;
  if (job->hb_reply.valid && d->bcast_period == now.bcast_period &&
      d->broadcast_seq == now.broadcast_seq && d->checkpoint_seq == now.checkpoint_seq &&
      d->stop == now.stop && d->regroup_seq == now.regroup_seq && d->trace_seq == now.trace_seq &&
      d->lr_scale == now.lr_scale && job->hb_reply.held_version == job->held.version)
    return &job->hb_reply.body;
  resp = (gradsync_HeartbeatResponse)gradsync_HeartbeatResponse_init_zero;
  resp.has_directives = true;
  resp.directives = now;
  resp.coordinator_id = job->jobs->cfg.coordinator_id;
  if (job->held.on.kind != GS_WAIT_NONE)
    snprintf(resp.waiting_on, sizeof(resp.waiting_on), "%s", job->held.on.reason);
  job->hb_reply.held_version = job->held.version;
  job->hb_reply.news = resp.news = NEWS_FIRST_BODY + job->jobs->hb_replies_built++;
  job->hb_reply.body.len = 0;
  job->hb_reply.valid =
      gs_wire_encode(&job->hb_reply.body, gradsync_HeartbeatResponse_fields, &resp) == 0;
  job->hb_reply.directives = resp.directives;
  return job->hb_reply.valid ? &job->hb_reply.body : NULL;
}

/* Answers a heartbeat, unless its node agent holds this reply already
 * (`seen`, its news; 0 for any other heartbeat). Returns whether it did. */
static bool reply_heartbeat_to(gs_job_t *job, uint64_t peer, uint64_t request_id, bool abort,
                               const char *why, uint64_t seen)
{
  const gs_buf_t *body = abort ? NULL : ok_heartbeat_body(job);
  gs_responder_t *r = job->jobs->responder;
  gradsync_HeartbeatResponse resp;

  if (body) {
    if (seen && seen == job->hb_reply.news)
      return false;
    gs__respond_bytes(r, peer, GS_METHOD_HEARTBEAT, request_id, body->data, body->len);
    return true;
  }
  if (abort && seen == NEWS_ABORT)
    return false;
  resp = (gradsync_HeartbeatResponse)gradsync_HeartbeatResponse_init_zero;
  resp.news = abort ? NEWS_ABORT : 0;
  resp.has_directives = true;
  resp.directives = gs__job_directives(job);
  resp.abort = abort;
  if (why)
    snprintf(resp.abort_reason, sizeof(resp.abort_reason), "%s", why);
  resp.coordinator_id = job->jobs->cfg.coordinator_id;
  gs__respond(r, peer, GS_METHOD_HEARTBEAT, request_id, gradsync_HeartbeatResponse_fields, &resp);
  return true;
}

static bool reply_heartbeat(const gs_call_t *call, gs_job_t *job, bool abort, const char *why)
{
  return reply_heartbeat_to(job, call->peer->id, call->request_id, abort, why, call->news_seen);
}

/* Answers m's waiting heartbeat with what is true now. */
static void answer_waiting(gs_member_t *m)
{
  gs_job_t *job = m->job;
  gs_responder_t *r = job->jobs->responder;
  /* A rank that left hears no abort: it asked for the end itself. */
  bool ended = m->state != GS_MEMBER_LEFT &&
               (m->generation == job->aborted_generation || m->generation < job->generation);

  gs_list_remove(&m->poll.node);
  r->unpark(r, m->poll.peer);
  gs__trace_replied(m, job->jobs->now_ms);
  reply_heartbeat_to(job, m->poll.peer, m->poll.request, ended,
                     m->generation == job->aborted_generation
                         ? job->abort_reason
                         : "this generation was superseded by a newer one",
                     m->poll.seen);
}

void gs__heartbeat_node_beats(gs_job_t *job, bool start)
{
  job->hb_reply.current = false;
  if (start)
    job->hb_reply.current = ok_heartbeat_body(job) != NULL;
}

void gs__heartbeat_release(gs_member_t *m)
{
  if (gs_list_linked(&m->poll.node))
    answer_waiting(m);
}

void gs__heartbeat_tell_news(gs_job_t *job)
{
  gs_list_t *n;

  job->news_told = job->news;
  while ((n = gs_list_first(&job->wait_list)) || (n = gs_list_first(&job->node_waits)))
    answer_waiting(GS_CONTAINER_OF(n, gs_member_t, poll.node));
}

/* Long poll: the reply waits for news or until the wait ends, at most
 * the heartbeat interval, so the rank's next heartbeat still comes in
 * time. Waits end in arrival order: the list stays sorted. A node agent's
 * beat waits for news alone (its node agent answers the rank meanwhile),
 * on a list of its own, and ends unanswered after the heartbeat timeout. */
static void wait_for_news(gs_member_t *m, const gs_call_t *call, uint32_t wait_ms)
{
  gs_job_t *job = m->job;
  uint64_t cap = job->jobs->cfg.heartbeat_interval_ms;

  if (gs_list_linked(&m->poll.node)) /* a new heartbeat while one waits: answer that one */
    answer_waiting(m);
  m->poll.peer = call->peer->id;
  m->poll.request = call->request_id;
  m->poll.seen = call->news_only ? call->news_seen : 0;
  /* A node agent's beat is replaced by its slot's next one long before
   * the heartbeat timeout; one that outlives it is a silent rank's. */
  m->poll.until_ms = call->now_ms + (call->news_only ? job->jobs->cfg.heartbeat_timeout_ms
                                     : wait_ms < cap ? wait_ms
                                                     : cap);
  job->jobs->responder->park(job->jobs->responder, call->peer->id);
  gs_list_insert_tail(call->news_only ? &job->node_waits : &job->wait_list, &m->poll.node);
}

/* Ends m's wait without an answer. */
static void drop_wait(gs_member_t *m)
{
  gs_responder_t *r = m->job->jobs->responder;

  gs_list_remove(&m->poll.node);
  r->unpark(r, m->poll.peer);
}

/* A node agent's beat: answered now when its reply is news to the node
 * agent, else held until there is news. It replaces the slot's earlier
 * beat, which had no news either: its wait is this one's now. */
static void answer_node_beat(gs_member_t *m, const gs_call_t *call)
{
  if (gs_list_linked(&m->poll.node) && !m->poll.seen)
    answer_waiting(m); /* a long poll of a direct heartbeat */
  if (reply_heartbeat(call, m->job, false, NULL)) {
    if (gs_list_linked(&m->poll.node))
      drop_wait(m);
  } else if (gs_list_linked(&m->poll.node) && m->poll.peer == call->peer->id) {
    m->poll.request = call->request_id; /* the same wait, for this beat, and as long */
    m->poll.seen = call->news_seen;
    m->poll.until_ms = call->now_ms + m->job->jobs->cfg.heartbeat_timeout_ms;
    gs_list_remove(&m->poll.node);
    gs_list_insert_tail(&m->job->node_waits, &m->poll.node);
  } else {
    if (gs_list_linked(&m->poll.node))
      drop_wait(m);
    wait_for_news(m, call, 0);
  }
}

/* Ties a rank to the connection of its heartbeats. An agent joins on one
 * connection and heartbeats on another, its heartbeat thread's own (after
 * a coordinator restart it re-registers on that one, so the new member is
 * born there). So the rank's first heartbeat moves its liveness from the
 * Join connection to its own; from then on the rank belongs to that
 * connection, and a heartbeat for it from any other is refused, as is one
 * from a connection that carries another running rank: nobody takes a
 * rank over in silence (nor one from the connection another running rank
 * joined on). Returns false when the call was refused (answered). */
static bool follow_heartbeats(gs_member_t *m, const gs_call_t *call)
{
  gs_peer_t *peer = call->peer;
  const gs_member_t *other = peer->member;
  gs_job_t *job = m->job;

  if (m->peer == peer)
    return true;
  if (m->heartbeats_seen && m->peer) {
    gs__respond_error(job->jobs->responder, peer->id, call->method, call->request_id, GS_EPRECOND,
                      "rank %u of job %s sends its heartbeats on another connection (%s); "
                      "a rank heartbeats on one connection",
                      m->rank, job->name, m->peer->name);
    return false;
  }
  /* Taking the rank would orphan the member whose Join waits on this
   * connection: never answered, and a ghost in its rendezvous once the
   * connection closes (found by tests/fuzz/fuzz_dispatch.c). */
  if (other && other->state == GS_MEMBER_WAITING) {
    gs__respond_error(job->jobs->responder, peer->id, call->method, call->request_id, GS_EPRECOND,
                      "this connection waits in the rendezvous of job %s; "
                      "use one connection per rank",
                      other->job->name);
    return false;
  }
  /* Whether the other rank joined here or heartbeats here, the
   * connection is its own. */
  if (other && gs__member_active(other)) {
    gs__respond_error(job->jobs->responder, peer->id, call->method, call->request_id, GS_EPRECOND,
                      "this connection belongs to rank %u of job %s; "
                      "use one connection per rank",
                      other->rank, other->job->name);
    return false;
  }
  gs_log(job->jobs->cfg.log, GS_LOG_DEBUG, job->name, (int)m->rank,
         "heartbeats come from %s: its liveness follows that connection", peer->name);
  gs__member_bind(m, peer);
  return true;
}

/* What the rank says: the fields the member keeps as sent (beat_fields.h;
 * where it is only with has_progress), then those it keeps its own way. */
static void note_beat(gs_member_t *m, uint64_t now, const gs_beat_t *b)
{
  uint64_t start = now - (b->phase_ms < now ? b->phase_ms : now);
  bool had = m->has_progress;
  /* A phase it is still in keeps its start, so the coordinator's clock,
   * not each heartbeat's rounding, times it. */
  bool same = had && m->phase == b->phase && m->pack == b->pack &&
              m->collectives_done == b->collectives_done;

#define KEEP(name, ctype, part, member, ...) KEEP_##member(part, name)
#define KEEP_NONE(part, name)
#define KEEP_OWN(part, name)
#define KEEP_COPY(part, name)                                                                      \
  if (GS_BEAT_##part != GS_BEAT_WHERE || b->has_progress)                                          \
    m->name = b->name;
  GS_BEAT_FIELDS(KEEP)
#undef KEEP
#undef KEEP_NONE
#undef KEEP_OWN
#undef KEEP_COPY
  m->has_progress = b->has_progress;
  if (!b->has_progress)
    return;
  /* The send wait is a share of the interval since the rank's last
   * heartbeat, weighted 0.7 against the past: a link that turns slow
   * (0.9 and more) is named from one heartbeat, not two (1.4 s after
   * it, not 3), while the jump of a rank whose sends only wait for
   * acknowledgements that cross the slow link (0.5-0.67 for a heartbeat,
   * measured with tc tbf) stays under the line. A front end may report
   * each step's own times: those are smoothed over a few. */
  m->send_wait = had ? 0.3f * m->send_wait + 0.7f * b->send_wait : b->send_wait;
  m->step_ms = had ? 0.75f * m->step_ms + 0.25f * (b->compute_ms + b->comm_wait_ms)
                   : b->compute_ms + b->comm_wait_ms;
  if (!same || start < m->phase_start_ms)
    m->phase_start_ms = start;
  m->phase = b->phase;
  m->pack = b->pack;
}

void gs__heartbeat(gs_job_t *job, const gs_call_t *call, const gs_beat_t *b)
{
  gs_member_t *m;
  char why[300];

  if (b->generation < job->generation) {
    snprintf(why, sizeof(why), "generation %llu was superseded by generation %llu",
             (unsigned long long)b->generation, (unsigned long long)job->generation);
    reply_heartbeat(call, job, true, why);
    return;
  }
  m = gs__job_find_member(job, call, b->generation, b->rank);
  if (!m || !gs__session_owns(m, call))
    return;
  if (job->aborted_generation == job->generation) {
    reply_heartbeat(call, job, true, job->abort_reason);
    return;
  }
  if (m->state != GS_MEMBER_RUNNING) {
    reply_heartbeat(call, job, m->state == GS_MEMBER_LOST, "this rank was declared lost");
    return;
  }
  if (!follow_heartbeats(m, call))
    return;
  m->heartbeats_seen = true;
  gs__hb_touch(m, call->now_ms);
  note_beat(m, call->now_ms, b);
  if (b->step > job->step_max) {
    job->step_max = b->step;
    job->step_advanced_ms = call->now_ms;
    if (job->stalled) {
      job->stalled = false;
      gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1, "no longer stalled: step %llu",
             (unsigned long long)b->step);
    }
  }
  gs__waiting_note_beat(m, call->now_ms);
  /* A node agent's beat has no clock samples: its rank's round trips end
   * at the node agent. */
  if (!call->news_only) {
    gs__trace_clock_sample(m, b->clock_sent_us, b->clock_replied_us);
    gs__trace_arrived(m, call->now_ms);
  }
  if (call->news_only)
    answer_node_beat(m, call);
  else if (b->wait_ms && job->news == job->news_told)
    wait_for_news(m, call, b->wait_ms);
  else {
    reply_heartbeat(call, job, false, NULL);
    gs__trace_replied_at_once(m);
  }
}

/* A running job whose highest step has not grown for the stall timeout
 * while every rank still heartbeats (a silent one is lost first, above) is
 * stalled: a hung collective, a rank stuck in I/O. O(1): the heartbeats
 * keep the step's high-water mark and its time. */
static void stall_sweep(gs_job_t *job, uint64_t now)
{
  uint64_t limit = job->jobs->cfg.stall_timeout_ms;

  if (!limit || job->stalled || job->state != GS_JOB_RUNNING || now - job->step_advanced_ms < limit)
    return;
  job->stalled = true;
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1,
         "stalled: step %llu has not advanced for %.0f s while heartbeats are fresh%s%s",
         (unsigned long long)job->step_max, (now - job->step_advanced_ms) / 1000.0,
         job->held.on.kind != GS_WAIT_NONE ? "; held up: " : "", job->held.on.reason);
}

/* The rank silent for longest is the head of the heartbeat list; losing it
 * aborts the generation, so the others need no check. Only a job whose
 * heartbeats are all fresh is checked for a stall. */
/* The coordinator's own loop did not run for `gap` ms (the process was
 * stopped, swapped out, or starved): the ranks' heartbeats waited unread,
 * so their silence is the coordinator's, and their clocks restart rather
 * than the sweep losing every rank at once. */
static void forgive_own_stall(gs_job_t *job, uint64_t now, uint64_t gap)
{
  for (uint32_t r = 0; r < job->world_size; r++) {
    gs_member_t *m = job->ranks ? job->ranks[r] : NULL;

    if (m && m->state == GS_MEMBER_RUNNING)
      gs__hb_touch(m, now);
  }
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1,
         "the coordinator did not run for %.1f s (stopped or starved): heartbeat clocks "
         "restarted instead of losing the ranks",
         gap / 1000.0);
}

/* Answers the heartbeats whose wait ended (the head of the wait list),
 * and ends, unanswered, the node agents' beats that outlived theirs. */
static void end_waits(gs_job_t *job, uint64_t now)
{
  gs_list_t *n;

  while ((n = gs_list_first(&job->wait_list))) {
    gs_member_t *m = GS_CONTAINER_OF(n, gs_member_t, poll.node);

    if (m->poll.until_ms > now)
      break;
    answer_waiting(m);
  }
  while ((n = gs_list_first(&job->node_waits))) {
    gs_member_t *m = GS_CONTAINER_OF(n, gs_member_t, poll.node);

    if (m->poll.until_ms > now)
      break;
    drop_wait(m);
  }
}

/* A generation adopted after a coordinator restart whose ranks did not
 * all re-register within a heartbeat timeout: the missing ones died
 * while the coordinator was away (a live rank re-registers at its next
 * heartbeat). Their places were never filled, so no heartbeat would
 * ever lose them: the generation ends here, as for a lost rank. */
static void lose_unregistered(gs_job_t *job, uint64_t now)
{
  char missing[160] = "";
  size_t used = 0;
  uint32_t count = 0;

  if (!job->reregister_deadline_ms || now < job->reregister_deadline_ms)
    return;
  job->reregister_deadline_ms = 0;
  if (job->state != GS_JOB_RUNNING)
    return;
  for (uint32_t r = 0; r < job->world_size; r++) {
    if (job->ranks[r])
      continue;
    if (count++ < 8 && used < sizeof(missing))
      used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%u",
                               count > 1 ? ", " : "", r);
  }
  if (!count)
    return;
  job->jobs->stats.ranks_lost += count;
  if (job->world_min)
    gs__generation_note(job, "rank(s) %s%s lost: not re-registered after the coordinator restarted",
                        missing, count > 8 ? ", ..." : "");
  gs__job_abort(
      job, "%u rank(s) did not re-register within %.0f s of the coordinator's restart (%s%s)",
      count, (job->jobs->cfg.heartbeat_timeout_ms + job->jobs->cfg.reregister_slack_ms) / 1000.0,
      missing, count > 8 ? ", ..." : "");
}

void gs__heartbeat_sweep(gs_job_t *job, uint64_t now)
{
  uint64_t gap = job->last_hb_sweep_ms ? now - job->last_hb_sweep_ms : 0;
  gs_list_t *oldest;
  gs_member_t *m;
  char how[64];

  job->last_hb_sweep_ms = now;
  end_waits(job, now);
  lose_unregistered(job, now);
  if (job->state == GS_JOB_RUNNING && gap > job->jobs->cfg.heartbeat_timeout_ms / 2)
    forgive_own_stall(job, now, gap);
  oldest = gs_list_first(&job->hb_list);
  m = oldest ? GS_CONTAINER_OF(oldest, gs_member_t, hb_node) : NULL;

  if (job->state != GS_JOB_RUNNING || !m ||
      now - m->last_heartbeat_ms <= job->jobs->cfg.heartbeat_timeout_ms) {
    stall_sweep(job, now);
    gs__waiting_sweep(job, now);
    return;
  }
  snprintf(how, sizeof(how), "no heartbeat for %.1fs", (now - m->last_heartbeat_ms) / 1000.0);
  gs__member_lost(m, how);
}
