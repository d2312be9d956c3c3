/* Jobs: rendezvous, generations, heartbeats, leaving, losing a rank. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "job_store.h"

#define REPLY_ERR(call, code, ...)                                                                 \
  gs__reply_error((call)->conn->coord, (call)->conn->ref, (call)->method, (call)->request_id,      \
                  (code), __VA_ARGS__)

const char *gs__job_state_name(gs_job_state_t s)
{
  static const char *const names[] = {"waiting", "running", "finished"};
  return names[s];
}

const char *gs__member_state_name(gs_member_state_t s)
{
  static const char *const names[] = {"waiting", "running", "left", "lost"};
  return names[s];
}

gs_job_t *gs__job_find(struct gs_coord *c, const char *name)
{
  for (gs_job_t *j = c->jobs; j; j = j->next) {
    if (strcmp(j->name, name) == 0)
      return j;
  }
  return NULL;
}

static gs_job_t *job_get_or_create(struct gs_coord *c, const char *name)
{
  gs_job_t *job = gs__job_find(c, name);

  if (job)
    return job;
  job = calloc(1, sizeof(*job));
  if (!job)
    return NULL;
  job->coord = c;
  snprintf(job->name, sizeof(job->name), "%s", name);
  job->next = c->jobs;
  c->jobs = job;
  c->job_count++;
  return job;
}

/* Detaches a member from its connection, if the connection still has it. */
static void member_unbind(gs_member_t *m)
{
  gs_conn_t *conn = gs__conn_get(m->job->coord, m->conn);

  if (conn && conn->member == m)
    conn->member = NULL;
  m->conn = (gs_conn_ref_t){UINT32_MAX, 0};
}

static void member_bind(gs_member_t *m, gs_conn_t *conn)
{
  if (conn->member && conn->member != m)
    member_unbind(conn->member);
  member_unbind(m);
  m->conn = conn->ref;
  conn->member = m;
}

/* The heartbeat list holds the running members, oldest heartbeat first: a
 * heartbeat moves its member to the end, so finding a silent rank reads the
 * head only. O(1) per heartbeat and per sweep, whatever the world size. */
static void hb_unlink(gs_member_t *m)
{
  gs_job_t *job = m->job;

  if (!m->hb_linked)
    return;
  if (m->hb_prev)
    m->hb_prev->hb_next = m->hb_next;
  else
    job->hb_oldest = m->hb_next;
  if (m->hb_next)
    m->hb_next->hb_prev = m->hb_prev;
  else
    job->hb_newest = m->hb_prev;
  m->hb_prev = m->hb_next = NULL;
  m->hb_linked = false;
}

/* Records a heartbeat at `now`; the loop clock never goes back, so
 * appending keeps the list in order. */
static void hb_touch(gs_member_t *m, uint64_t now)
{
  gs_job_t *job = m->job;

  hb_unlink(m);
  m->last_heartbeat_ms = now;
  m->hb_prev = job->hb_newest;
  if (job->hb_newest)
    job->hb_newest->hb_next = m;
  else
    job->hb_oldest = m;
  job->hb_newest = m;
  m->hb_linked = true;
}

static void member_free(gs_member_t *m)
{
  if (!m)
    return;
  member_unbind(m);
  hb_unlink(m);
  free(m);
}

/* Frees the members of the last generation. */
static void free_ranks(gs_job_t *job)
{
  for (uint32_t r = 0; job->ranks && r < job->world_size; r++)
    member_free(job->ranks[r]);
  free(job->ranks);
  free(job->peers);
  job->ranks = NULL;
  job->peers = NULL;
  job->world_size = 0;
  job->ranks_left = 0;
}

static void fill_peer(gs_job_t *job, uint32_t r)
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

static void reply_join(gs_job_t *job, gs_member_t *m, uint64_t request_id)
{
  struct gs_coord *c = job->coord;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Peer ring[2];
  gs_pb_array_t peers;
  uint32_t n = job->world_size;

  resp.rank = m->rank;
  resp.world_size = n;
  resp.generation = job->generation;
  resp.bcast_period = job->bcast_period;
  resp.heartbeat_interval_ms = (uint32_t)c->cfg.heartbeat_interval_ms;
  resp.heartbeat_timeout_ms = (uint32_t)c->cfg.heartbeat_timeout_ms;
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
  gs__reply(c, m->conn, GS_METHOD_JOIN, request_id, gradsync_JoinResponse_fields, &resp);
}

/* Takes member `i` out of the rendezvous, optionally answering its Join.
 * The last member takes its place: the order of the waiting list does not
 * matter (ranks are assigned by sorting), and removal stays O(1). */
static void remove_waiting(gs_job_t *job, uint32_t i, int code, const char *msg)
{
  gs_member_t *m = job->waiting[i];
  struct gs_coord *c = job->coord;

  gs__conn_unpark(c, m->conn);
  if (code)
    gs__reply_error(c, m->conn, GS_METHOD_JOIN, m->join_request_id, code, "%s", msg);
  job->waiting[i] = job->waiting[--job->waiting_count];
  job->waiting[i]->waiting_index = i;
  member_free(m);
}

static int member_order(const void *a, const void *b)
{
  const gs_member_t *x = *(gs_member_t *const *)a, *y = *(gs_member_t *const *)b;
  int d = strcmp(x->req.node, y->req.node);

  if (d)
    return d;
  if (x->req.local_rank != y->req.local_rank)
    return x->req.local_rank < y->req.local_rank ? -1 : 1;
  return x->join_seq < y->join_seq ? -1 : x->join_seq > y->join_seq;
}

/* Writes what differs between two signatures; false when they agree. */
static bool signature_diff(const gradsync_ModelSignature *a, const gradsync_ModelSignature *b,
                           char *out, size_t len)
{
  if (a->param_count != b->param_count)
    snprintf(out, len, "param_count %u vs %u", a->param_count, b->param_count);
  else if (a->total_elements != b->total_elements)
    snprintf(out, len, "total_elements %llu vs %llu", (unsigned long long)a->total_elements,
             (unsigned long long)b->total_elements);
  else if (a->shapes_hash != b->shapes_hash)
    snprintf(out, len, "parameter shapes differ (shapes_hash %016llx vs %016llx)",
             (unsigned long long)a->shapes_hash, (unsigned long long)b->shapes_hash);
  else if (a->dtypes_hash != b->dtypes_hash)
    snprintf(out, len, "parameter dtypes differ (dtypes_hash %016llx vs %016llx)",
             (unsigned long long)a->dtypes_hash, (unsigned long long)b->dtypes_hash);
  else
    return false;
  return true;
}

/* Refuses the later of two agents claiming the same (node, local_rank). */
static bool drop_duplicates(gs_job_t *job)
{
  char msg[512];

  for (uint32_t i = 1; i < job->waiting_count; i++) {
    const gs_member_t *a = job->waiting[i - 1], *b = job->waiting[i];

    if (strcmp(a->req.node, b->req.node) || a->req.local_rank != b->req.local_rank)
      continue;
    snprintf(msg, sizeof(msg), "node '%s' local_rank %u already joined job %s", b->req.node,
             b->req.local_rank, job->name);
    gs_log(&job->coord->cfg.log, GS_LOG_WARN, job->name, -1, "join refused: %s", msg);
    remove_waiting(job, i, GS_GRPC_ALREADY_EXISTS, msg);
    return true;
  }
  return false;
}

/* Fails the whole rendezvous when a member's model differs from rank 0's:
 * a misconfigured job must not start, and every agent learns why. */
static bool refuse_mismatched_models(gs_job_t *job)
{
  /* A copy: the loop below frees the members, rank 0 first. */
  gradsync_ModelSignature ref = job->waiting[0]->req.model_signature;
  const gs_member_t *r0 = job->waiting[0];
  char diff[256], msg[1024];
  uint32_t bad;

  for (bad = 1; bad < job->waiting_count; bad++) {
    if (signature_diff(&job->waiting[bad]->req.model_signature, &ref, diff, sizeof(diff)))
      break;
  }
  if (bad == job->waiting_count)
    return false;
  snprintf(msg, sizeof(msg),
           "rendezvous of job %s failed: rank %u (node '%s', local_rank %u) has a model unlike "
           "rank 0's (node '%s', local_rank %u): %s",
           job->name, bad, job->waiting[bad]->req.node, job->waiting[bad]->req.local_rank,
           r0->req.node, r0->req.local_rank, diff);
  gs_log(&job->coord->cfg.log, GS_LOG_WARN, job->name, -1, "%s", msg);
  while (job->waiting_count) {
    const gs_member_t *m = job->waiting[0];
    bool differs = signature_diff(&m->req.model_signature, &ref, diff, sizeof(diff));

    remove_waiting(job, 0, differs ? GS_GRPC_INVALID_ARGUMENT : GS_GRPC_FAILED_PRECONDITION, msg);
  }
  return true;
}

/* The world is complete: assign ranks, start the next generation, answer
 * every parked Join. */
static void complete_rendezvous(gs_job_t *job)
{
  struct gs_coord *c = job->coord;
  uint64_t now = gs__now_ms(c);
  uint32_t n = job->waiting_count;
  gradsync_Peer *peers;

  qsort(job->waiting, n, sizeof(job->waiting[0]), member_order);
  for (uint32_t i = 0; i < n; i++)
    job->waiting[i]->waiting_index = i;
  if (drop_duplicates(job) || refuse_mismatched_models(job))
    return;
  peers = calloc(n, sizeof(*peers));
  if (!peers) {
    gs_log(&c->cfg.log, GS_LOG_ERROR, job->name, -1, "out of memory starting a generation");
    while (job->waiting_count)
      remove_waiting(job, 0, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
    return;
  }
  gs__job_store_reset(job);
  free_ranks(job);
  job->generation =
      (job->generation > job->aborted_generation ? job->generation : job->aborted_generation) + 1;
  job->ranks = job->waiting;
  job->peers = peers;
  job->world_size = n;
  job->waiting = NULL;
  job->waiting_count = job->waiting_cap = 0;
  job->state = GS_JOB_RUNNING;
  job->started_ms = now;
  job->stop = false;
  if (!job->bcast_period_overridden)
    job->bcast_period = job->ranks[0]->req.bcast_period;
  for (uint32_t r = 0; r < n; r++) {
    gs_member_t *m = job->ranks[r];

    m->rank = r;
    m->generation = job->generation;
    m->state = GS_MEMBER_RUNNING;
    hb_touch(m, now);
    fill_peer(job, r);
  }
  gs_log(&c->cfg.log, GS_LOG_INFO, job->name, -1, "generation %llu started with %u ranks",
         (unsigned long long)job->generation, n);
  for (uint32_t r = 0; r < n; r++) {
    gs__conn_unpark(c, job->ranks[r]->conn);
    reply_join(job, job->ranks[r], job->ranks[r]->join_request_id);
  }
}

static gs_member_t *member_new(gs_job_t *job, const gs_call_t *call,
                               const gradsync_JoinRequest *req)
{
  gs_member_t *m = calloc(1, sizeof(*m));

  if (!m)
    return NULL;
  m->job = job;
  m->req = *req;
  m->join_request_id = call->request_id;
  m->join_deadline_ms = call->deadline_ms;
  m->last_heartbeat_ms = gs__now_ms(job->coord);
  m->conn = (gs_conn_ref_t){UINT32_MAX, 0};
  member_bind(m, call->conn);
  return m;
}

/* An agent that already has a rank registers again, typically after a
 * coordinator restart: the job is rebuilt from what the agents know. */
static void rejoin(const gs_call_t *call, gs_job_t *job, const gradsync_JoinRequest *req)
{
  uint64_t g = req->rejoin_generation;
  uint32_t r = req->rejoin_rank;
  gs_member_t *m, *old;

  if (r >= req->world_size) {
    REPLY_ERR(call, GS_GRPC_INVALID_ARGUMENT, "rejoin_rank %u is not below world_size %u", r,
              req->world_size);
    return;
  }
  if (g < job->generation || g <= job->aborted_generation) {
    REPLY_ERR(call, GS_GRPC_ABORTED, "generation %llu of job %s is over%s%s; join again",
              (unsigned long long)g, job->name, job->abort_reason[0] ? ": " : "",
              job->abort_reason);
    return;
  }
  if (g > job->generation || job->state != GS_JOB_RUNNING) {
    gs__job_store_reset(job);
    free_ranks(job);
    job->ranks = calloc(req->world_size, sizeof(*job->ranks));
    job->peers = calloc(req->world_size, sizeof(*job->peers));
    if (!job->ranks || !job->peers) {
      free_ranks(job);
      {
        REPLY_ERR(call, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
        return;
      }
    }
    job->generation = g;
    job->world_size = req->world_size;
    job->state = GS_JOB_RUNNING;
    job->started_ms = gs__now_ms(job->coord);
    job->bcast_period = req->bcast_period;
  }
  if (req->world_size != job->world_size) {
    REPLY_ERR(call, GS_GRPC_INVALID_ARGUMENT, "world size %u disagrees with generation %llu's %u",
              req->world_size, (unsigned long long)g, job->world_size);
    return;
  }
  old = job->ranks[r];
  if (old && old->state == GS_MEMBER_RUNNING && gs__conn_get(job->coord, old->conn)) {
    REPLY_ERR(call, GS_GRPC_ALREADY_EXISTS, "rank %u of generation %llu is already registered", r,
              (unsigned long long)g);
    return;
  }
  m = member_new(job, call, req);
  if (!m) {
    REPLY_ERR(call, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
    return;
  }
  if (old && old->state == GS_MEMBER_LEFT)
    job->ranks_left--;
  member_free(old);
  m->rank = r;
  m->generation = g;
  m->state = GS_MEMBER_RUNNING;
  hb_touch(m, gs__now_ms(job->coord));
  job->ranks[r] = m;
  fill_peer(job, r);
  gs_log(&job->coord->cfg.log, GS_LOG_INFO, job->name, r,
         "re-registered for generation %llu from %s", (unsigned long long)g, call->conn->peer);
  reply_join(job, m, call->request_id);
}

/* Whether a connection's member still takes part in its job. */
static bool member_active(const gs_member_t *m)
{
  const gs_job_t *job = m->job;

  if (m->state == GS_MEMBER_WAITING)
    return true;
  return m->state == GS_MEMBER_RUNNING && job->state == GS_JOB_RUNNING &&
         m->generation == job->generation && job->aborted_generation != job->generation;
}

static bool check_join(const gs_call_t *call, const gradsync_JoinRequest *req)
{
  struct gs_coord *c = call->conn->coord;

  if (req->world_size == 0 || req->world_size > c->cfg.max_world_size) {
    REPLY_ERR(call, GS_GRPC_INVALID_ARGUMENT, "world_size %u is out of range 1..%u",
              req->world_size, c->cfg.max_world_size);
    return false;
  }
  if (!req->node[0]) {
    REPLY_ERR(call, GS_GRPC_INVALID_ARGUMENT, "node must not be empty");
    return false;
  }
  if (call->conn->member && member_active(call->conn->member)) {
    REPLY_ERR(call, GS_GRPC_FAILED_PRECONDITION,
              "this connection already joined job %s; use one connection per agent",
              call->conn->member->job->name);
    return false;
  }
  return true;
}

void gs__job_join(const gs_call_t *call, const gradsync_JoinRequest *req)
{
  struct gs_coord *c = call->conn->coord;
  gs_job_t *job;
  gs_member_t *m;

  if (!check_join(call, req))
    return;
  job = job_get_or_create(c, req->job);
  if (!job) {
    REPLY_ERR(call, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
    return;
  }
  if (req->rejoin_generation) {
    rejoin(call, job, req);
    return;
  }
  if (job->state == GS_JOB_RUNNING && job->aborted_generation != job->generation) {
    REPLY_ERR(call, GS_GRPC_FAILED_PRECONDITION,
              "job %s is running generation %llu with all %u ranks; a new rendezvous "
              "opens when it ends or is aborted",
              job->name, (unsigned long long)job->generation, job->world_size);
    return;
  }
  if (job->waiting_count && req->world_size != job->waiting_world_size) {
    REPLY_ERR(call, GS_GRPC_INVALID_ARGUMENT,
              "world size %u disagrees with %u, the world size of the %u agent(s) "
              "already waiting in job %s",
              req->world_size, job->waiting_world_size, job->waiting_count, job->name);
    return;
  }
  if (job->waiting_count == job->waiting_cap) {
    uint32_t cap = job->waiting_cap ? job->waiting_cap * 2 : 8;
    gs_member_t **w = realloc(job->waiting, cap * sizeof(*w));

    if (!w) {
      REPLY_ERR(call, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
      return;
    }
    job->waiting = w;
    job->waiting_cap = cap;
  }
  m = member_new(job, call, req);
  if (!m) {
    REPLY_ERR(call, GS_GRPC_RESOURCE_EXHAUSTED, "coordinator out of memory");
    return;
  }
  if (job->waiting_count == 0 || m->join_deadline_ms < job->next_join_deadline_ms)
    job->next_join_deadline_ms = m->join_deadline_ms;
  if (job->waiting_count == 0) {
    job->waiting_world_size = req->world_size;
    job->rendezvous_deadline_ms = gs__now_ms(c) + c->cfg.rendezvous_timeout_ms;
    if (job->state == GS_JOB_FINISHED)
      job->state = GS_JOB_WAITING;
  }
  m->join_seq = ++job->join_seq;
  m->waiting_index = job->waiting_count;
  job->waiting[job->waiting_count++] = m;
  gs__conn_park(c, m->conn);
  gs_log(&c->cfg.log, GS_LOG_DEBUG, job->name, -1, "%s (node '%s', local_rank %u) joined: %u of %u",
         call->conn->peer, req->node, req->local_rank, job->waiting_count, req->world_size);
  if (job->waiting_count == job->waiting_world_size)
    complete_rendezvous(job);
}

void gs__job_abort(gs_job_t *job, const char *fmt, ...)
{
  struct gs_coord *c = job->coord;
  va_list ap;

  if (job->state != GS_JOB_RUNNING || job->aborted_generation == job->generation)
    return;
  va_start(ap, fmt);
  vsnprintf(job->abort_reason, sizeof(job->abort_reason), fmt, ap);
  va_end(ap);
  job->aborted_generation = job->generation;
  job->state = GS_JOB_WAITING;
  c->stats.generations_aborted++;
  gs_log(&c->cfg.log, GS_LOG_WARN, job->name, -1, "generation %llu aborted: %s",
         (unsigned long long)job->generation, job->abort_reason);
  gs__job_store_fail_waiters(job, GS_GRPC_ABORTED, job->abort_reason);
}

/* The job a request names: the connection's own job when it is that one
 * (every heartbeat of a joined agent: no search), else a lookup. */
static gs_job_t *job_of_call(const gs_call_t *call, const char *name)
{
  const gs_member_t *m = call->conn->member;

  if (m && strcmp(m->job->name, name) == 0)
    return m->job;
  return gs__job_find(call->conn->coord, name);
}

/* Looks up the member a heartbeat or leave speaks for; replies and returns
 * NULL when the job, generation or rank is unknown. */
static gs_member_t *find_member(const gs_call_t *call, const char *name, uint64_t g, uint32_t r,
                                gs_job_t **jobp)
{
  gs_job_t *job = job_of_call(call, name);

  *jobp = job;
  if (!job) {
    REPLY_ERR(call, GS_GRPC_NOT_FOUND,
              "no job named %s (if the coordinator restarted, "
              "re-register with rejoin_generation)",
              name);
    return NULL;
  }
  if (g > job->generation || r >= job->world_size || !job->ranks[r]) {
    REPLY_ERR(call, GS_GRPC_NOT_FOUND,
              "job %s has no rank %u in generation %llu "
              "(re-register with rejoin_generation)",
              name, r, (unsigned long long)g);
    return NULL;
  }
  return job->ranks[r];
}

/* The body of a heartbeat reply without an abort, encoded again only when
 * a directive changed since the last one. NULL if it cannot be encoded. */
static const gs_buf_t *ok_heartbeat_body(gs_job_t *job)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;
  const gradsync_Directives *d = &job->hb_reply_for;

  if (job->hb_reply_valid && d->bcast_period == job->bcast_period &&
      d->broadcast_seq == job->broadcast_seq && d->checkpoint_seq == job->checkpoint_seq &&
      d->stop == job->stop)
    return &job->hb_reply;
  resp.has_directives = true;
  resp.directives.bcast_period = job->bcast_period;
  resp.directives.broadcast_seq = job->broadcast_seq;
  resp.directives.checkpoint_seq = job->checkpoint_seq;
  resp.directives.stop = job->stop;
  resp.coordinator_id = job->coord->coordinator_id;
  job->hb_reply.len = 0;
  job->hb_reply_valid =
      gs_wire_encode(&job->hb_reply, gradsync_HeartbeatResponse_fields, &resp) == 0;
  job->hb_reply_for = resp.directives;
  return job->hb_reply_valid ? &job->hb_reply : NULL;
}

static void reply_heartbeat(const gs_call_t *call, gs_job_t *job, bool abort, const char *why)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;
  const gs_buf_t *body = abort ? NULL : ok_heartbeat_body(job);

  if (body) {
    gs__reply_bytes(job->coord, call->conn->ref, GS_METHOD_HEARTBEAT, call->request_id, body->data,
                    body->len);
    return;
  }

  resp.has_directives = true;
  resp.directives.bcast_period = job->bcast_period;
  resp.directives.broadcast_seq = job->broadcast_seq;
  resp.directives.checkpoint_seq = job->checkpoint_seq;
  resp.directives.stop = job->stop;
  resp.abort = abort;
  if (why)
    snprintf(resp.abort_reason, sizeof(resp.abort_reason), "%s", why);
  resp.coordinator_id = job->coord->coordinator_id;
  gs__reply(job->coord, call->conn->ref, GS_METHOD_HEARTBEAT, call->request_id,
            gradsync_HeartbeatResponse_fields, &resp);
}

void gs__job_heartbeat(const gs_call_t *call, const gradsync_HeartbeatRequest *req)
{
  gs_job_t *job;
  gs_member_t *m;
  char why[300];

  job = job_of_call(call, req->job);
  if (job && req->generation < job->generation) {
    snprintf(why, sizeof(why), "generation %llu was superseded by generation %llu",
             (unsigned long long)req->generation, (unsigned long long)job->generation);
    {
      reply_heartbeat(call, job, true, why);
      return;
    }
  }
  m = find_member(call, req->job, req->generation, req->rank, &job);
  if (!m)
    return;
  if (job->aborted_generation == job->generation) {
    reply_heartbeat(call, job, true, job->abort_reason);
    return;
  }
  if (m->state != GS_MEMBER_RUNNING) {
    reply_heartbeat(call, job, m->state == GS_MEMBER_LOST, "this rank was declared lost");
    return;
  }
  /* The latest connection to speak for a rank is the one whose loss counts. */
  if (m->conn.slot != call->conn->ref.slot || m->conn.gen != call->conn->ref.gen)
    member_bind(m, call->conn);
  hb_touch(m, gs__now_ms(job->coord));
  m->step = req->step;
  m->loss = req->loss;
  m->samples_per_sec = req->samples_per_sec;
  m->compute_ms = req->compute_ms;
  m->comm_wait_ms = req->comm_wait_ms;
  reply_heartbeat(call, job, false, NULL);
}

void gs__job_leave(const gs_call_t *call, const gradsync_LeaveRequest *req)
{
  struct gs_coord *c = call->conn->coord;
  gs_job_t *job;
  gs_member_t *m = find_member(call, req->job, req->generation, req->rank, &job);

  if (!m)
    return;
  if (req->generation == job->generation && m->state == GS_MEMBER_RUNNING) {
    m->state = GS_MEMBER_LEFT;
    job->ranks_left++;
    member_unbind(m);
    hb_unlink(m);
    if (!req->finished) {
      gs__job_abort(job, "rank %u left: %s", req->rank, req->reason[0] ? req->reason : "failed");
    } else {
      gs_log(&c->cfg.log, GS_LOG_INFO, job->name, req->rank, "left (finished): %u of %u",
             job->ranks_left, job->world_size);
      if (job->ranks_left == job->world_size && job->state == GS_JOB_RUNNING) {
        job->state = GS_JOB_FINISHED;
        job->finished_ms = gs__now_ms(c);
      }
    }
  }
  gs__reply(c, call->conn->ref, GS_METHOD_LEAVE, call->request_id, gradsync_LeaveResponse_fields,
            &(gradsync_LeaveResponse)gradsync_LeaveResponse_init_zero);
}

static void member_lost(gs_member_t *m, const char *how)
{
  gs_job_t *job = m->job;

  m->state = GS_MEMBER_LOST;
  hb_unlink(m);
  job->coord->stats.ranks_lost++;
  gs__job_abort(job, "rank %u (node '%s', local_rank %u) lost: %s", m->rank, m->req.node,
                m->req.local_rank, how);
}

void gs__job_conn_closed(gs_conn_t *conn)
{
  gs_member_t *m = conn->member;
  gs_job_t *job;

  if (!m)
    return;
  job = m->job;
  member_unbind(m);
  if (m->state == GS_MEMBER_WAITING) {
    if (m->waiting_index < job->waiting_count && job->waiting[m->waiting_index] == m) {
      gs_log(&job->coord->cfg.log, GS_LOG_INFO, job->name, -1,
             "node '%s' local_rank %u left the rendezvous (connection closed)", m->req.node,
             m->req.local_rank);
      remove_waiting(job, m->waiting_index, 0, NULL);
    }
  } else if (member_active(m)) {
    member_lost(m, "connection closed");
  }
}

static void sweep_rendezvous(gs_job_t *job, uint64_t now)
{
  uint64_t next = UINT64_MAX;
  char msg[256];

  if (job->waiting_count && now >= job->rendezvous_deadline_ms) {
    snprintf(msg, sizeof(msg), "rendezvous of job %s timed out: %u of %u agents joined", job->name,
             job->waiting_count, job->waiting_world_size);
    gs_log(&job->coord->cfg.log, GS_LOG_WARN, job->name, -1, "%s", msg);
    while (job->waiting_count)
      remove_waiting(job, 0, GS_GRPC_DEADLINE_EXCEEDED, msg);
    return;
  }
  /* Only scan when the earliest Join deadline has come. */
  if (now < job->next_join_deadline_ms)
    return;
  for (uint32_t i = 0; i < job->waiting_count;) {
    if (now < job->waiting[i]->join_deadline_ms) {
      if (job->waiting[i]->join_deadline_ms < next)
        next = job->waiting[i]->join_deadline_ms;
      i++;
      continue;
    }
    snprintf(msg, sizeof(msg), "join deadline passed with %u of %u agents in job %s",
             job->waiting_count, job->waiting_world_size, job->name);
    remove_waiting(job, i, GS_GRPC_DEADLINE_EXCEEDED, msg);
  }
  job->next_join_deadline_ms = next;
}

/* The rank silent for longest is the head of the heartbeat list; losing it
 * aborts the generation, so the others need no check. */
static void sweep_heartbeats(gs_job_t *job, uint64_t now)
{
  gs_member_t *m = job->hb_oldest;
  char how[64];

  if (job->state != GS_JOB_RUNNING || !m ||
      now - m->last_heartbeat_ms <= job->coord->cfg.heartbeat_timeout_ms)
    return;
  snprintf(how, sizeof(how), "no heartbeat for %.1fs", (now - m->last_heartbeat_ms) / 1000.0);
  member_lost(m, how);
}

static void job_free(gs_job_t *job)
{
  while (job->waiting_count)
    remove_waiting(job, 0, 0, NULL);
  free(job->waiting);
  free_ranks(job);
  gs__job_store_reset(job);
  gs_buf_free(&job->hb_reply);
  free(job);
}

/* A finished job nobody is joining again or waiting on has nothing left
 * but its status: after the retention period it goes, so a long-lived
 * coordinator does not grow with every job it ever ran. */
static bool job_expired(const gs_job_t *job, uint64_t now)
{
  return job->state == GS_JOB_FINISHED && job->waiting_count == 0 && !job->waiters &&
         now - job->finished_ms >= job->coord->cfg.job_retention_ms;
}

void gs__jobs_sweep(struct gs_coord *c, uint64_t now)
{
  for (gs_job_t **at = &c->jobs, *job; (job = *at);) {
    sweep_rendezvous(job, now);
    sweep_heartbeats(job, now);
    gs__job_store_sweep(job, now);
    if (!job_expired(job, now)) {
      at = &job->next;
      continue;
    }
    gs_log(&c->cfg.log, GS_LOG_INFO, job->name, -1, "finished %.0f s ago; forgotten",
           (now - job->finished_ms) / 1000.0);
    *at = job->next;
    c->job_count--;
    job_free(job);
    gs__state_changed(c);
  }
}

void gs__jobs_free(struct gs_coord *c)
{
  gs_job_t *job = c->jobs, *next;

  for (; job; job = next) {
    next = job->next;
    job_free(job);
  }
  c->jobs = NULL;
  c->job_count = 0;
}
