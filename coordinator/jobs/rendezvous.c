/* Rendezvous and re-registration (see rendezvous.h). */
#include "rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agreement.h"
#include "invariant.h"
#include "history.h"
#include "lr_scale.h"
#include "parse.h"
#include "regroup.h"
#include "session.h"

/* While a rendezvous waits, the sweep says every this often who joined,
 * so an operator sees a world that will not fill before it times out. */
#define PROGRESS_LOG_MS 10000
/* Members a progress line names; the rest are counted. */
#define PROGRESS_LOG_MEMBERS 8

#define REPLY_ERR(job, call, err, ...)                                                             \
  gs__respond_error((job)->jobs->responder, (call)->peer->id, (call)->method, (call)->request_id,  \
                    (err), __VA_ARGS__)

/* An emptied rendezvous gives back its list and claims: those of a large
 * world that timed out would otherwise stay as long as the job. */
static void release_waiting(gs_job_t *job)
{
  free(job->rdv.waiting);
  job->rdv.waiting = NULL;
  job->rdv.cap = 0;
  gs__claims_free(&job->rdv.claims);
}

/* Takes member `i` out of the rendezvous, answering its Join with `err`
 * (0: no answer). The last member takes its place: the order of the
 * waiting list does not matter (ranks are assigned by sorting), and
 * removal stays O(1). */
static void remove_waiting(gs_job_t *job, uint32_t i, int err, const char *msg)
{
  gs_member_t *m = job->rdv.waiting[i];
  gs_responder_t *r = job->jobs->responder;

  GS_ASSERT(i < job->rdv.count && m->waiting_index == i);
  if (m->peer) {
    r->unpark(r, m->peer->id);
    if (err)
      gs__respond_error(r, m->peer->id, GS_METHOD_JOIN, m->join_request_id, err, "%s", msg);
  }
  gs__claims_remove(&job->rdv.claims, m);
  job->rdv.waiting[i] = job->rdv.waiting[--job->rdv.count];
  job->rdv.waiting[i]->waiting_index = i;
  gs__member_free(m);
  if (job->rdv.count)
    return;
  release_waiting(job);
  if (job->state == GS_JOB_WAITING)
    job->state = gs__job_resting_state(job);
  gs__regroup_sweep(job, job->jobs->now_ms); /* an elastic regroup nobody waits in ends */
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

/* A waiting member already claiming (node, local_rank), or NULL. Two
 * agents on one (node, local_rank) would get ranks that both believe
 * they own the same device, so the later claimant is refused at its Join,
 * at once: it never takes a place in the world, and every later claimant
 * is refused alike. O(1) per Join (claims.h). */
static const gs_member_t *claimant(const gs_job_t *job, const gradsync_JoinRequest *req)
{
  return gs__claims_find(&job->rdv.claims, req->node, req->local_rank);
}

static bool refuse_duplicate(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  char msg[512];

  if (!claimant(job, req))
    return false;
  snprintf(msg, sizeof(msg), "node '%s' local_rank %u already joined job %s", req->node,
           req->local_rank, job->name);
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "join refused: %s (from %s)", msg,
         call->peer->name);
  REPLY_ERR(job, call, GS_EEXIST, "%s", msg);
  return true;
}

/* Fails the whole rendezvous when a member differs from the others in its
 * model, device kind or settings (agreement.h): a misconfigured job must
 * not start, and every agent learns why. As proto/README.md says, the
 * members that differ get INVALID_ARGUMENT; the others, whose rendezvous
 * failed through no fault of theirs, FAILED_PRECONDITION (they may Join
 * again). */
static bool refuse_disagreement(gs_job_t *job)
{
  gs_disagreement_t d;

  if (!gs__agreement_find(job->rdv.waiting, job->rdv.count, job->name, &d))
    return false;
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "%s", d.message);
  /* From the last: the reference is freed only after every member that
   * sorts after it was compared with it. */
  while (job->rdv.count) {
    uint32_t i = job->rdv.count - 1;
    bool differs = gs__agreement_differs(&d, job->rdv.waiting, i);

    remove_waiting(job, i, differs ? GS_EINVAL : GS_EPRECOND, d.message);
  }
  return true;
}

/* Whether the waiting members are on more than one node. */
static bool spans_nodes(const gs_job_t *job)
{
  for (uint32_t i = 1; i < job->rdv.count; i++)
    if (strcmp(job->rdv.waiting[0]->req.node, job->rdv.waiting[i]->req.node) != 0)
      return true;
  return false;
}

/* Refuses a world that spans several nodes while a member advertises a
 * loopback address for its peers (it reached the coordinator through
 * 127.0.0.1, a tunnel or port-forward, and nothing said otherwise): the
 * ranks on other nodes would dial themselves and fail minutes later with
 * an error that does not name the cause. Those at fault get
 * INVALID_ARGUMENT, the others FAILED_PRECONDITION. */
static bool refuse_loopback(gs_job_t *job)
{
  uint32_t n = job->rdv.count, bad = n, count = 0;
  const gs_member_t *m;
  char msg[1024];

  if (!spans_nodes(job))
    return false;
  for (uint32_t i = 0; i < n; i++) {
    if (job->rdv.waiting[i]->req.comm_addr[0] &&
        gs_addr_is_loopback(job->rdv.waiting[i]->req.comm_addr)) {
      bad = bad < n ? bad : i;
      count++;
    }
  }
  if (!count)
    return false;
  m = job->rdv.waiting[bad];
  snprintf(msg, sizeof(msg),
           "rank %u (node %s, local_rank %u) gave its peers the loopback address %s, but "
           "job %s spans several nodes%s: set --comm-iface (or $GRADSYNC_COMM_IFACE), "
           "--comm-bind or --comm-advertise on that node to an address the other nodes reach",
           bad, m->req.node, m->req.local_rank, m->req.comm_addr, job->name,
           count > 1 ? " (and other ranks did the same)" : "");
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "%s", msg);
  while (job->rdv.count) {
    uint32_t i = job->rdv.count - 1;
    const char *addr = job->rdv.waiting[i]->req.comm_addr;

    remove_waiting(job, i, addr[0] && gs_addr_is_loopback(addr) ? GS_EINVAL : GS_EPRECOND, msg);
  }
  return true;
}

/* Puts the members that asked for a rank (JoinRequest.rank: their
 * launcher numbered them) at it, the others in the free places in their
 * (node, local_rank) order; true when done. Two members asking for one
 * rank fail the rendezvous: both get INVALID_ARGUMENT, the others
 * FAILED_PRECONDITION. Each asked rank is below the world (checked at the
 * Join). */
/* Each waiting member knows its place in the list again, after a sort. */
static void index_waiting(gs_job_t *job)
{
  for (uint32_t i = 0; i < job->rdv.count; i++)
    job->rdv.waiting[i]->waiting_index = i;
}

static bool asks_rank(const gs_member_t *m, uint32_t world)
{
  return m->req.has_rank && m->req.rank < world;
}

static bool place_asked_ranks(gs_job_t *job)
{
  uint32_t n = job->rdv.count, free_at = 0, dup;
  gs_member_t **placed;
  const gs_member_t *a = NULL, *b = NULL;
  bool asked = false;
  char msg[768];

  for (uint32_t i = 0; i < n && !asked; i++)
    asked = asks_rank(job->rdv.waiting[i], n);
  if (!asked)
    return true;
  placed = calloc(n, sizeof(*placed));
  if (!placed) {
    gs_log(job->jobs->cfg.log, GS_LOG_ERROR, job->name, -1, "out of memory placing ranks");
    while (job->rdv.count)
      remove_waiting(job, 0, GS_ENOMEM, "coordinator out of memory");
    return false;
  }
  for (uint32_t i = 0; i < n && !a; i++) {
    gs_member_t *m = job->rdv.waiting[i];

    if (!asks_rank(m, n))
      continue;
    if (placed[m->req.rank]) {
      a = placed[m->req.rank];
      b = m;
    }
    placed[m->req.rank] = m;
  }
  if (a) {
    snprintf(msg, sizeof(msg),
             "node '%s' local_rank %u and node '%s' local_rank %u were both started as rank %u "
             "of job %s: give each node its own --node-rank (or $RANK)",
             a->req.node, a->req.local_rank, b->req.node, b->req.local_rank, a->req.rank,
             job->name);
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "%s", msg);
    free(placed);
    dup = a->req.rank;
    while (job->rdv.count) {
      uint32_t i = job->rdv.count - 1;
      const gs_member_t *m = job->rdv.waiting[i];

      remove_waiting(job, i, asks_rank(m, n) && m->req.rank == dup ? GS_EINVAL : GS_EPRECOND, msg);
    }
    return false;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (asks_rank(job->rdv.waiting[i], n))
      continue;
    while (placed[free_at])
      free_at++;
    placed[free_at] = job->rdv.waiting[i];
  }
  for (uint32_t i = 0; i < n; i++)
    GS_ASSERT(placed[i]); /* n members, n places, no two in one */
  memcpy(job->rdv.waiting, placed, n * sizeof(*placed));
  free(placed);
  return true;
}

/* The world is complete: assign ranks, start the next generation, answer
 * every parked Join. */
static void complete_rendezvous(gs_job_t *job, uint64_t now)
{
  gs_responder_t *r = job->jobs->responder;
  uint32_t n = job->rdv.count;
  gradsync_Peer *peers;

  qsort(job->rdv.waiting, n, sizeof(job->rdv.waiting[0]), member_order);
  index_waiting(job);
  if (!place_asked_ranks(job))
    return;
  index_waiting(job);
  if (refuse_disagreement(job) || refuse_loopback(job))
    return;
  peers = calloc(n, sizeof(*peers));
  if (!peers) {
    gs_log(job->jobs->cfg.log, GS_LOG_ERROR, job->name, -1, "out of memory starting a generation");
    while (job->rdv.count)
      remove_waiting(job, 0, GS_ENOMEM, "coordinator out of memory");
    return;
  }
  gs__regroup_choose_state(job, job->rdv.waiting, n);
  gs__store_reset(&job->store);
  gs__job_free_ranks(job);
  job->regrouping = false;
  job->regroup_pending = 0;
  job->generation =
      (job->generation > job->aborted_generation ? job->generation : job->aborted_generation) + 1;
  job->ranks = job->rdv.waiting;
  job->peers = peers;
  job->world_size = n;
  job->rdv.waiting = NULL;
  job->rdv.count = job->rdv.cap = 0;
  gs__claims_free(&job->rdv.claims);
  job->state = GS_JOB_RUNNING;
  job->started_ms = now;
  job->stop = false;
  gs__job_stall_reset(job, now);
  if (!job->bcast_period_overridden)
    job->bcast_period = job->ranks[0]->req.bcast_period;
  for (uint32_t i = 0; i < n; i++) {
    gs_member_t *m = job->ranks[i];

    m->rank = i;
    m->generation = job->generation;
    m->state = GS_MEMBER_RUNNING;
    gs__session_issue(m);
    gs__hb_touch(m, now);
    gs__job_fill_peer(job, i);
  }
  gs__generation_started(job, now);
  if (job->resume_state)
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
           "generation %llu started with %u ranks, from rank %u's state at step %llu",
           (unsigned long long)job->generation, n, job->state_rank,
           (unsigned long long)job->state_step);
  else
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1, "generation %llu started with %u ranks",
           (unsigned long long)job->generation, n);
  for (uint32_t i = 0; i < n; i++) {
    if (job->ranks[i]->peer)
      r->unpark(r, job->ranks[i]->peer->id);
    gs__job_reply_join(job, job->ranks[i], job->ranks[i]->join_request_id);
  }
}

/* The world of the generation a re-registration names: an elastic one may
 * have shrunk below the job's largest (an older agent does not say). */
static uint32_t rejoin_world(const gradsync_JoinRequest *req)
{
  return req->rejoin_world_size ? req->rejoin_world_size : req->world_size;
}

/* Starts generation `g` from what re-registering agents say, after a
 * coordinator restart; false when out of memory. Its ranks that do not
 * re-register within the heartbeat timeout are lost (gs__heartbeat_sweep). */
static bool adopt_generation(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  uint32_t world = rejoin_world(req);

  gs__store_reset(&job->store);
  gs__job_free_ranks(job);
  job->ranks = calloc(world, sizeof(*job->ranks));
  job->peers = calloc(world, sizeof(*job->peers));
  if (!job->ranks || !job->peers) {
    gs__job_free_ranks(job);
    return false;
  }
  job->generation = req->rejoin_generation;
  job->world_size = world;
  job->world_min = req->world_min;
  job->world_max = req->world_size;
  job->state = GS_JOB_RUNNING;
  job->started_ms = call->now_ms;
  /* A live rank re-registers at its next heartbeat, which after an outage
   * may wait out its redial backoff (up to about 6 s): the heartbeat
   * timeout and some slack (--reregister-slack). */
  job->reregister_deadline_ms =
      call->now_ms + job->jobs->cfg.heartbeat_timeout_ms + job->jobs->cfg.reregister_slack_ms;
  job->bcast_period = req->bcast_period;
  job->lr_scale = gs_lr_scale_or_one(req->lr_scale);
  gs__job_stall_reset(job, call->now_ms);
  gs__generation_started(job, call->now_ms);
  return true;
}

/* An agent that already has a rank registers again, typically after a
 * coordinator restart: the job is rebuilt from what the agents know. */
static void rejoin(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  uint64_t g = req->rejoin_generation;
  uint32_t r = req->rejoin_rank;
  gs_member_t *m, *old;

  if (rejoin_world(req) > req->world_size || r >= rejoin_world(req)) {
    REPLY_ERR(job, call, GS_EINVAL,
              "rejoin_rank %u must be below rejoin_world_size %u, at most world_size %u", r,
              rejoin_world(req), req->world_size);
    return;
  }
  /* The session it had: a re-registration acts for its own rank only. */
  if (gs__session_rank(call->session) != (long)r) {
    REPLY_ERR(job, call, GS_EPERM,
              "re-registration for rank %u needs that rank's session (the envelope's session)", r);
    return;
  }
  if (g < job->generation || g <= job->aborted_generation) {
    REPLY_ERR(job, call, GS_EABORTED, "generation %llu of job %s is over%s%s; join again",
              (unsigned long long)g, job->name, job->abort_reason[0] ? ": " : "",
              job->abort_reason);
    return;
  }
  /* Only a coordinator that does not know the generation running adopts
   * one: a claim of a later generation never replaces it. */
  if (job->state == GS_JOB_RUNNING && g != job->generation) {
    REPLY_ERR(job, call, GS_EPRECOND,
              "job %s is running generation %llu; a re-registration for generation %llu cannot "
              "replace it",
              job->name, (unsigned long long)job->generation, (unsigned long long)g);
    return;
  }
  if (job->state != GS_JOB_RUNNING && !adopt_generation(job, call, req)) {
    REPLY_ERR(job, call, GS_ENOMEM, "coordinator out of memory");
    return;
  }
  if (rejoin_world(req) != job->world_size) {
    REPLY_ERR(job, call, GS_EINVAL, "world size %u disagrees with generation %llu's %u",
              rejoin_world(req), (unsigned long long)g, job->world_size);
    return;
  }
  old = job->ranks[r];
  if (old && old->generation == g && strcmp(old->session, call->session) != 0) {
    REPLY_ERR(job, call, GS_EPERM,
              "rank %u of generation %llu re-registered with another session: the first claim "
              "holds",
              r, (unsigned long long)g);
    return;
  }
  if (old && old->state == GS_MEMBER_RUNNING && old->peer) {
    REPLY_ERR(job, call, GS_EEXIST, "rank %u of generation %llu is already registered", r,
              (unsigned long long)g);
    return;
  }
  m = gs__member_new(job, call, req);
  if (!m) {
    REPLY_ERR(job, call, GS_ENOMEM, "coordinator out of memory");
    return;
  }
  if (old && old->state == GS_MEMBER_LEFT)
    job->ranks_left--;
  gs__member_free(old);
  m->rank = r;
  m->generation = g;
  m->state = GS_MEMBER_RUNNING;
  snprintf(m->session, sizeof(m->session), "%s", call->session); /* the first claim's */
  gs__hb_touch(m, call->now_ms);
  job->ranks[r] = m;
  gs__job_fill_peer(job, r);
  gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, r, "re-registered for generation %llu from %s",
         (unsigned long long)g, call->peer->name);
  gs__job_reply_join(job, m, call->request_id);
}

/* Whether the call's session names a member of the job's generation, in
 * an elastic job: one that comes back for the next generation even
 * without state. (A fixed job's ranks join every generation afresh.) */
static bool elastic_member(gs_job_t *job, const gs_call_t *call)
{
  return gs__job_elastic(job) && gs__session_member(job, call->session, job->generation);
}

/* Whether a Join is a running member of an elastic generation coming
 * back for the next one: with its state, or with its session when it has
 * none yet (the world broke before it trained). */
static bool comes_back(const gs_member_t *m, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_job_t *job = m->job;

  return m->state == GS_MEMBER_RUNNING && !strcmp(job->name, req->job) &&
         (req->has_state || elastic_member(job, call));
}

bool gs__rendezvous_check(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_responder_t *r = jobs->responder;
  const gs_member_t *bound = call->peer->member;
  char why[256];

  if (req->world_size == 0 || req->world_size > jobs->cfg.max_world_size) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "world_size %u is out of range 1..%u", req->world_size,
                      jobs->cfg.max_world_size);
    return false;
  }
  if (req->world_min > req->world_size) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "world_min %u is above world_size %u", req->world_min, req->world_size);
    return false;
  }
  /* A rank behind a node agent holds no connection of its own. */
  if (jobs->cfg.max_job_world && req->world_size > jobs->cfg.max_job_world &&
      !call->peer->node_slot) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_ELIMIT,
                      "world_size %u is more than one job may gather on this coordinator: %u, "
                      "half of --max-connections (each rank holds two connections)",
                      req->world_size, jobs->cfg.max_job_world);
    return false;
  }
  if (!req->node[0]) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "node must not be empty");
    return false;
  }
  if (req->has_rank && req->world_min) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "rank %u: an elastic job numbers its ranks at each regroup; send no rank",
                      req->rank);
    return false;
  }
  if (req->has_rank && req->rank >= req->world_size) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL,
                      "rank %u is not below world_size %u", req->rank, req->world_size);
    return false;
  }
  if (!gs__settings_valid(req, why, sizeof(why))) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EINVAL, "%s", why);
    return false;
  }
  /* A running member regrouping comes on the connection it joined on
   * (gs__regroup_survivor checks its session). */
  if (bound && gs__member_active(bound) && !comes_back(bound, call, req)) {
    gs__respond_error(r, call->peer->id, call->method, call->request_id, GS_EPRECOND,
                      "this connection already joined job %s; use one connection per agent",
                      bound->job->name);
    return false;
  }
  return true;
}

/* Room for one more waiting member and its claim; false when out of
 * memory. */
static bool reserve_waiting(gs_job_t *job)
{
  uint32_t cap = job->rdv.cap ? job->rdv.cap * 2 : 8;
  gs_member_t **w;

  if (!gs__claims_reserve(&job->rdv.claims, job->rdv.count + 1))
    return false;
  if (job->rdv.count < job->rdv.cap)
    return true;
  w = realloc(job->rdv.waiting, cap * sizeof(*w));
  if (!w)
    return false;
  job->rdv.waiting = w;
  job->rdv.cap = cap;
  return true;
}

/* "3" or "2:3", for messages. */
static const char *world_words(uint32_t min, uint32_t max, char *buf, size_t len)
{
  if (min)
    snprintf(buf, len, "%u:%u", min, max);
  else
    snprintf(buf, len, "%u", max);
  return buf;
}

/* Whether the job already has a world-size range that a Join must match:
 * a rendezvous gathers, a generation runs, or survivors are coming back. */
static bool range_disagrees(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  char mine[32], theirs[32];

  if (!job->rdv.count && !job->regrouping &&
      !(job->state == GS_JOB_RUNNING && job->aborted_generation != job->generation))
    return false;
  if (req->world_size == job->world_max && req->world_min == job->world_min)
    return false;
  REPLY_ERR(job, call, GS_EINVAL, "world size %s disagrees with %s, the world size of job %s",
            world_words(req->world_min, req->world_size, theirs, sizeof(theirs)),
            world_words(job->world_min, job->world_max, mine, sizeof(mine)), job->name);
  return true;
}

/* Whether the job's generation runs (not ended, not aborted). */
static bool generation_runs(const gs_job_t *job)
{
  return job->state == GS_JOB_RUNNING && job->aborted_generation != job->generation;
}

/* A Join that may not wait: a fixed job's generation runs, or an elastic
 * one's runs with its largest world. */
static bool refuse_running(gs_job_t *job, const gs_call_t *call)
{
  if (!generation_runs(job) || gs__regroup_has_room(job))
    return false;
  if (gs__job_elastic(job))
    REPLY_ERR(job, call, GS_EPRECOND,
              "elastic job %s is running generation %llu with its largest world (%u ranks, "
              "%u waiting)",
              job->name, (unsigned long long)job->generation, job->world_size, job->rdv.count);
  else
    REPLY_ERR(job, call, GS_EPRECOND,
              "job %s is running generation %llu with all %u ranks; a new rendezvous "
              "opens when it ends or is aborted",
              job->name, (unsigned long long)job->generation, job->world_size);
  return true;
}

/* A Join whose member would pass the budget's members part: Joins parked
 * on a node agent's slots (255 a connection, 2,000 connections) took a
 * coordinator to 846 MB under --max-memory 64MiB. */
static bool refuse_over_budget(gs_job_t *job, const gs_call_t *call)
{
  const gs_mem_budget_t *mem = job->jobs->cfg.mem;

  if (!mem || gs_mem_budget_members_fit(mem, GS_MEMBER_COST))
    return false;
  REPLY_ERR(job, call, GS_ELIMIT,
            "a Join of job %s would pass what ranks and parked Joins may hold (%zu of %zu bytes, "
            "a quarter of --max-memory, about %zu bytes each)",
            job->name, mem->members, mem->members_max, GS_MEMBER_COST);
  return true;
}

/* A member of the elastic generation that runs or regroups, which a new
 * agent must agree with: the one of lowest rank left (after a coordinator
 * restart, until the ranks re-registered, there may be none). */
static const gs_member_t *running_reference(const gs_job_t *job)
{
  if (!gs__job_elastic(job) || !(generation_runs(job) || job->regrouping))
    return NULL;
  for (uint32_t r = 0; job->ranks && r < job->world_size; r++)
    if (job->ranks[r])
      return job->ranks[r];
  return NULL;
}

/* Refuses a new agent that differs from the generation it would join (its
 * settings, model or device kind): it alone gets INVALID_ARGUMENT, before
 * any regroup is asked for, so the ranks training go on untouched. */
static bool refuse_unlike(gs_job_t *job, const gs_call_t *call, const gs_member_t *m)
{
  const gs_member_t *ref = running_reference(job);
  char msg[1200];

  if (!ref || !gs__agreement_newcomer(m, ref, job->name, msg, sizeof(msg)))
    return false;
  gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "join refused: %s (from %s)", msg,
         call->peer->name);
  REPLY_ERR(job, call, GS_EINVAL, "%s", msg);
  return true;
}

void gs__rendezvous_join(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req)
{
  gs_responder_t *r = job->jobs->responder;
  gs_member_t *m;
  bool back;

  if (req->rejoin_generation) {
    rejoin(job, call, req);
    return;
  }
  if (range_disagrees(job, call, req))
    return;
  /* A survivor of an elastic generation, with its state or (it joined as
   * the world broke) without: a coordinator that knows no generation (it
   * restarted) takes its word for its state. */
  back = job->generation && (req->has_state || elastic_member(job, call));
  if (back && !gs__regroup_survivor(job, call, req))
    return;
  if (refuse_running(job, call) || refuse_duplicate(job, call, req) ||
      refuse_over_budget(job, call))
    return;
  if (!reserve_waiting(job) || !(m = gs__member_new(job, call, req))) {
    REPLY_ERR(job, call, GS_ENOMEM, "coordinator out of memory");
    return;
  }
  if (!gs__settings_take(m, req)) {
    gs__member_free(m);
    REPLY_ERR(job, call, GS_ENOMEM, "coordinator out of memory");
    return;
  }
  if (!back && refuse_unlike(job, call, m)) {
    gs__member_free(m);
    return;
  }
  if (generation_runs(job))
    gs__regroup_request(job); /* a newcomer: the ranks make room for it */
  if (job->rdv.count == 0 || m->join_deadline_ms < job->rdv.next_join_deadline_ms)
    job->rdv.next_join_deadline_ms = m->join_deadline_ms;
  if (job->rdv.count == 0) {
    job->rdv.world_size = req->world_size;
    job->world_min = req->world_min;
    job->world_max = req->world_size;
    job->rdv.deadline_ms = call->now_ms + job->jobs->cfg.rendezvous_timeout_ms;
    job->rdv.next_progress_log_ms = call->now_ms + PROGRESS_LOG_MS;
    if (job->state == GS_JOB_FINISHED || job->state == GS_JOB_FAILED)
      job->state = GS_JOB_WAITING;
  }
  job->last_join_ms = call->now_ms;
  m->join_seq = ++job->rdv.join_seq;
  m->waiting_index = job->rdv.count;
  job->rdv.waiting[job->rdv.count++] = m;
  gs__claims_add(&job->rdv.claims, m);
  r->park(r, call->peer->id);
  gs_log(job->jobs->cfg.log, GS_LOG_DEBUG, job->name, -1,
         "%s (node '%s', local_rank %u) joined: %u of %u", call->peer->name, req->node,
         req->local_rank, job->rdv.count, req->world_size);
  if (gs__regroup_ready(job, call->now_ms))
    complete_rendezvous(job, call->now_ms);
}

void gs__rendezvous_drop(gs_job_t *job, gs_member_t *m)
{
  if (m->waiting_index >= job->rdv.count || job->rdv.waiting[m->waiting_index] != m)
    return;
  /* A job that never started says it at debug level: a client creating
   * jobs and leaving them would write a line each (the soak bench's job
   * flood: 600-940 a second). Its progress lines count who waits. */
  gs_log(job->jobs->cfg.log, job->generation ? GS_LOG_INFO : GS_LOG_DEBUG, job->name, -1,
         "node '%s' local_rank %u left the rendezvous (connection closed)", m->req.node,
         m->req.local_rank);
  remove_waiting(job, m->waiting_index, 0, NULL);
}

/* "node a/0, node b/1 and 3 more": the first few members waiting. */
static void format_joined(const gs_job_t *job, char *buf, size_t len)
{
  size_t at = 0;
  uint32_t shown = job->rdv.count < PROGRESS_LOG_MEMBERS ? job->rdv.count : PROGRESS_LOG_MEMBERS;

  buf[0] = 0;
  for (uint32_t i = 0; i < shown && at < len; i++) {
    const gs_member_t *m = job->rdv.waiting[i];
    int n =
        snprintf(buf + at, len - at, "%snode %s/%u", i ? ", " : "", m->req.node, m->req.local_rank);

    at = n < 0 ? len : at + (size_t)n;
  }
  if (shown < job->rdv.count && at < len)
    snprintf(buf + at, len - at, " and %u more", job->rdv.count - shown);
}

/* One info line every PROGRESS_LOG_MS while a rendezvous waits. */
static void log_progress(gs_job_t *job, uint64_t now)
{
  char joined[400];

  if (!job->rdv.count || now < job->rdv.next_progress_log_ms)
    return;
  job->rdv.next_progress_log_ms = now + PROGRESS_LOG_MS;
  format_joined(job, joined, sizeof(joined));
  if (!gs__job_elastic(job))
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
           "job %s: waiting for %u more rank(s) of %u (joined: %s)", job->name,
           job->rdv.world_size - job->rdv.count, job->rdv.world_size, joined);
  else if (job->regrouping && job->regroup_pending)
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
           "elastic job %s: waiting for %u surviving rank(s) of generation %llu to come back "
           "(%u..%u ranks; joined: %s)",
           job->name, job->regroup_pending, (unsigned long long)job->generation, job->world_min,
           job->world_max, joined);
  else if (job->rdv.count < job->world_min)
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
           "elastic job %s: waiting for %u more rank(s) to reach its minimum (%u..%u ranks; "
           "joined: %s)",
           job->name, job->world_min - job->rdv.count, job->world_min, job->world_max, joined);
  else
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
           "elastic job %s: %u rank(s) wait for the running generation to make room (joined: %s)",
           job->name, job->rdv.count, joined);
}

void gs__rendezvous_sweep(gs_job_t *job, uint64_t now)
{
  uint64_t next = UINT64_MAX;
  char msg[256], joined[400];

  if (job->rdv.count && now >= job->rdv.deadline_ms) {
    snprintf(msg, sizeof(msg), "rendezvous of job %s timed out: %u of %u agents joined", job->name,
             job->rdv.count, job->rdv.world_size);
    format_joined(job, joined, sizeof(joined));
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "%s (joined: %s)", msg, joined);
    while (job->rdv.count)
      remove_waiting(job, 0, GS_ETIMEDOUT, msg);
    return;
  }
  gs__regroup_sweep(job, now);
  if (job->rdv.count && gs__regroup_ready(job, now)) {
    complete_rendezvous(job, now);
    return;
  }
  log_progress(job, now);
  /* Only scan when the earliest Join deadline has come. */
  if (now < job->rdv.next_join_deadline_ms)
    return;
  for (uint32_t i = 0; i < job->rdv.count;) {
    if (now < job->rdv.waiting[i]->join_deadline_ms) {
      if (job->rdv.waiting[i]->join_deadline_ms < next)
        next = job->rdv.waiting[i]->join_deadline_ms;
      i++;
      continue;
    }
    snprintf(msg, sizeof(msg), "join deadline passed with %u of %u agents in job %s",
             job->rdv.count, job->rdv.world_size, job->name);
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "node %s/%u: %s",
           job->rdv.waiting[i]->req.node, job->rdv.waiting[i]->req.local_rank, msg);
    remove_waiting(job, i, GS_ETIMEDOUT, msg);
  }
  job->rdv.next_join_deadline_ms = next;
}

void gs__rendezvous_cancel(gs_job_t *job, int err, const char *msg)
{
  while (job->rdv.count)
    remove_waiting(job, 0, err, msg);
}
