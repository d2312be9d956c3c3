/* Status JSON (cJSON) and Prometheus metrics, built from the live state. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "phase.h"
#include "status.h"
#include "why.h"

/* A rank is a straggler when its compute time per step is over 1.2x the
 * median (the others then wait on it in every allreduce) or its step is two
 * or more behind the leading rank. */
#define STRAGGLER_COMPUTE_RATIO 1.2
#define STRAGGLER_STEP_LAG 2
/* ...and waiting_on names one, as what slows every step, over 1.5x: the
 * steps of ranks alike differ by more than 1.2x on a busy machine. */
#define STRAGGLER_NAMED_RATIO 1.5
#define SUMMARY_STRAGGLERS 32 /* rank numbers listed by the summary view */

static void swap_float(float *a, uint32_t i, uint32_t j)
{
  float t = a[i];

  a[i] = a[j];
  a[j] = t;
}

/* The k-th smallest of a[0..n) (0-based, k < n), reordering a: quickselect
 * with a three-way partition, O(n) on average where sorting is O(n log n),
 * and still linear when many values are equal. */
static float kth_smallest(float *a, uint32_t n, uint32_t k)
{
  uint32_t lo = 0, hi = n - 1;

  while (lo < hi) {
    float pivot = a[lo + (hi - lo) / 2];
    uint32_t lt = lo, i = lo, gt = hi + 1; /* [lo,lt) < pivot, [lt,i) ==, [gt,hi] > */

    while (i < gt) {
      if (a[i] < pivot)
        swap_float(a, lt++, i++);
      else if (a[i] > pivot)
        swap_float(a, i, --gt);
      else
        i++;
    }
    if (k < lt)
      hi = lt - 1;
    else if (k >= gt)
      lo = gt;
    else
      return pivot;
  }
  return a[k];
}

/* What one pass over a job's ranks yields for both views. */
typedef struct rank_stats {
  uint32_t by_state[GS_MEMBER_LOST + 1];
  uint32_t unregistered;
  uint32_t running;
  uint64_t step_min, step_max;
  uint64_t oldest_heartbeat_ms;
  double samples;
  float median_compute;
} rank_stats_t;

static void rank_stats(const gs_job_t *job, rank_stats_t *st)
{
  float *compute = malloc((job->world_size ? job->world_size : 1) * sizeof(float));

  memset(st, 0, sizeof(*st));
  st->step_min = UINT64_MAX;
  st->oldest_heartbeat_ms = UINT64_MAX;
  for (uint32_t r = 0; r < job->world_size; r++) {
    const gs_member_t *m = job->ranks[r];

    if (!m) {
      st->unregistered++;
      continue;
    }
    st->by_state[m->state]++;
    if (m->state != GS_MEMBER_RUNNING)
      continue;
    if (compute)
      compute[st->running] = m->compute_ms;
    st->running++;
    st->samples += m->samples_per_sec;
    if (m->step > st->step_max)
      st->step_max = m->step;
    if (m->step < st->step_min)
      st->step_min = m->step;
    if (m->last_heartbeat_ms < st->oldest_heartbeat_ms)
      st->oldest_heartbeat_ms = m->last_heartbeat_ms;
  }
  if (compute && st->running)
    st->median_compute = kth_smallest(compute, st->running, st->running / 2);
  free(compute);
}

/* Ranks whose compute time or step lag make the others wait; the first
 * `max_listed` go into the array, *count gets them all. */
static cJSON *stragglers_json(const gs_job_t *job, const rank_stats_t *st, uint32_t max_listed,
                              uint32_t *count)
{
  cJSON *arr = cJSON_CreateArray();
  float median = st->median_compute;

  *count = 0;
  for (uint32_t r = 0; arr && r < job->world_size; r++) {
    const gs_member_t *m = job->ranks[r];

    if (!m || m->state != GS_MEMBER_RUNNING)
      continue;
    if ((median > 0 && m->compute_ms > STRAGGLER_COMPUTE_RATIO * median) ||
        m->step + STRAGGLER_STEP_LAG <= st->step_max) {
      if ((*count)++ < max_listed)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(r));
    }
  }
  return arr;
}

/* The ranks at the lowest step while the job is stalled: the ones the
 * others wait for. The first `max_listed` go into the array. */
static cJSON *lagging_json(const gs_job_t *job, const rank_stats_t *st, uint32_t max_listed)
{
  cJSON *arr = cJSON_CreateArray();
  uint32_t listed = 0;

  for (uint32_t r = 0; arr && r < job->world_size && listed < max_listed; r++) {
    const gs_member_t *m = job->ranks[r];

    if (m && m->state == GS_MEMBER_RUNNING && m->step == st->step_min) {
      cJSON_AddItemToArray(arr, cJSON_CreateNumber(r));
      listed++;
    }
  }
  return arr;
}

/* Whether the job shows as stalled: ranks held up in a collective
 * (waiting.c), or its step still for --stall-timeout (heartbeat.c). */
static bool job_stalled(const gs_job_t *job)
{
  return (job->stalled || job->held.on.kind != GS_WAIT_NONE) && job->state == GS_JOB_RUNNING;
}

/* The job's state as shown: a running job whose ranks are held is
 * "stalled", with the reason. */
static const char *shown_state(const gs_job_t *job, char *reason, size_t len, uint64_t now)
{
  reason[0] = '\0';
  if (job->state == GS_JOB_FAILED)
    gs_set_why(reason, len, "%s", job->abort_reason);
  if (!job_stalled(job))
    return gs__job_state_name(job->state);
  if (job->held.on.kind != GS_WAIT_NONE)
    gs_set_why(reason, len, "%s", job->held.on.reason);
  else
    gs_set_why(reason, len,
               "step %" PRIu64 " has not advanced for %.0f s while heartbeats are fresh",
               job->step_max, (now - job->step_advanced_ms) / 1000.0);
  return "stalled";
}

/* "pack": the pack an allreduce waits for; null in any other phase. */
static void add_pack(cJSON *o, uint32_t phase, uint32_t pack)
{
  if (phase == gradsync_Phase_PHASE_ALLREDUCE)
    cJSON_AddNumberToObject(o, "pack", pack);
  else
    cJSON_AddNullToObject(o, "pack");
}

/* waiting_on: what holds the job up, or else slows every step (waiting.h). */
static cJSON *waiting_json(const gs_job_t *job, const rank_stats_t *st, uint64_t now)
{
  gs_waiting_on_t slow;
  const gs_waiting_on_t *w = &job->held.on;
  cJSON *o, *ranks;

  if (job->state != GS_JOB_RUNNING)
    return cJSON_CreateNull();
  if (w->kind == GS_WAIT_NONE) {
    if (!gs__waiting_slow(job, st->median_compute, STRAGGLER_NAMED_RATIO, &slow))
      return cJSON_CreateNull();
    w = &slow;
  }
  o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", gs__wait_kind_name(w->kind));
  ranks = cJSON_AddArrayToObject(o, "ranks");
  for (uint32_t i = 0; ranks && i < w->rank_count && i < GS_WAITING_MAX_RANKS; i++)
    cJSON_AddItemToArray(ranks, cJSON_CreateNumber(w->ranks[i]));
  cJSON_AddNumberToObject(o, "rank_count", w->rank_count);
  cJSON_AddStringToObject(o, "phase", gs_phase_name(w->phase));
  add_pack(o, w->phase, w->pack);
  cJSON_AddNumberToObject(o, "for_s", w == &slow ? 0 : (now - w->since_ms) / 1000.0);
  cJSON_AddNumberToObject(o, "named_after_s",
                          w == &slow ? 0 : (w->named_ms - w->since_ms) / 1000.0);
  cJSON_AddBoolToObject(o, "hang", w != &slow);
  cJSON_AddNumberToObject(o, "waiters", w->waiters);
  cJSON_AddStringToObject(o, "reason", w->reason);
  return o;
}

static void stall_json(cJSON *o, const gs_job_t *job, const rank_stats_t *st, uint64_t now,
                       uint32_t max_listed)
{
  bool stalled = job_stalled(job);

  cJSON_AddBoolToObject(o, "stalled", stalled);
  cJSON_AddNumberToObject(o, "stalled_since_s",
                          stalled ? (now - job->step_advanced_ms) / 1000.0 : 0);
  cJSON_AddItemToObject(o, "stalled_ranks",
                        stalled ? lagging_json(job, st, max_listed) : cJSON_CreateArray());
}

static cJSON *rank_summary_json(const gs_job_t *job, const rank_stats_t *st, uint64_t now)
{
  cJSON *o = cJSON_CreateObject();

  if (!o)
    return NULL;
  for (int s = GS_MEMBER_RUNNING; s <= GS_MEMBER_LOST; s++)
    cJSON_AddNumberToObject(o, gs__member_state_name((gs_member_state_t)s), st->by_state[s]);
  cJSON_AddNumberToObject(o, "unregistered", st->unregistered);
  cJSON_AddNumberToObject(o, "step_min", st->running ? (double)st->step_min : 0);
  cJSON_AddNumberToObject(o, "step_max", (double)st->step_max);
  cJSON_AddNumberToObject(o, "median_compute_ms", st->median_compute);
  cJSON_AddNumberToObject(
      o, "oldest_heartbeat_s",
      st->running && job->state == GS_JOB_RUNNING ? (now - st->oldest_heartbeat_ms) / 1000.0 : 0);
  return o;
}

/* The fields of `part` the member keeps as sent (beat_fields.h), as
 * numbers under their names. */
static void add_kept(cJSON *o, const gs_member_t *m, gs_beat_part_t part)
{
#define ADD(name, ctype, in, member, ...) ADD_##member(in, name)
#define ADD_NONE(in, name)
#define ADD_OWN(in, name)
#define ADD_COPY(in, name)                                                                         \
  if (GS_BEAT_##in == part)                                                                        \
    cJSON_AddNumberToObject(o, #name, (double)m->name);
  GS_BEAT_FIELDS(ADD)
#undef ADD
#undef ADD_NONE
#undef ADD_OWN
#undef ADD_COPY
}

static cJSON *rank_json(const gs_member_t *m, uint32_t r, uint64_t now)
{
  cJSON *o = cJSON_CreateObject();

  cJSON_AddNumberToObject(o, "rank", r);
  if (!m) {
    cJSON_AddStringToObject(o, "state", "unregistered");
    return o;
  }
  cJSON_AddStringToObject(o, "state", gs__member_state_name(m->state));
  cJSON_AddStringToObject(o, "node", m->req.node);
  cJSON_AddNumberToObject(o, "local_rank", m->req.local_rank);
  cJSON_AddStringToObject(o, "device", m->req.device);
  cJSON_AddStringToObject(o, "comm_addr", m->req.comm_addr);
  add_kept(o, m, GS_BEAT_REPORT);
  cJSON_AddNumberToObject(o, "last_heartbeat_s", (now - m->last_heartbeat_ms) / 1000.0);
  if (!m->has_progress)
    return o;
  cJSON_AddStringToObject(o, "phase", gs_phase_name(m->phase));
  add_pack(o, m->phase, m->pack);
  cJSON_AddNumberToObject(o, "phase_s", (now - m->phase_start_ms) / 1000.0);
  cJSON_AddNumberToObject(o, "send_wait", m->send_wait);
  add_kept(o, m, GS_BEAT_WHERE);
  if (m->clock.synced) { /* its clock against the coordinator's (traces) */
    cJSON_AddNumberToObject(o, "clock_offset_ms", (double)m->clock.offset_us / 1000.0);
    cJSON_AddNumberToObject(o, "clock_rtt_ms", (double)m->clock.rtt_us / 1000.0);
  }
  return o;
}

static cJSON *pack_list_json(const gs_pack_summary_t *s)
{
  cJSON *o;

  if (!s->published)
    return cJSON_CreateNull();
  o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "packs", s->packs);
  cJSON_AddNumberToObject(o, "params", s->params);
  cJSON_AddNumberToObject(o, "bytes", (double)s->bytes);
  cJSON_AddNumberToObject(o, "threshold_bytes", (double)s->threshold_bytes);
  cJSON_AddNumberToObject(o, "largest_pack_bytes", (double)s->largest_pack_bytes);
  return o;
}

/* Elastic jobs: the world-size range, the regroup counters and the
 * latest generations (oldest first), each with its start, world, the step
 * it continued from, the time lost before it and why it ended. */
static void elastic_json(cJSON *o, const gs_job_t *job, uint64_t now, bool with_history)
{
  uint32_t n = job->history_count < GS_JOB_HISTORY ? job->history_count : GS_JOB_HISTORY;
  cJSON *arr;

  cJSON_AddNumberToObject(o, "world_min", job->world_min);
  cJSON_AddNumberToObject(o, "world_max", job->world_max);
  cJSON_AddNumberToObject(o, "regroups", (double)job->regroups);
  cJSON_AddNumberToObject(o, "regroup_seconds", job->regroup_ms_total / 1000.0);
  if (!with_history)
    return;
  arr = cJSON_AddArrayToObject(o, "generations");
  for (uint32_t i = job->history_count - n; arr && i < job->history_count; i++) {
    const gs_generation_record_t *g = &job->history[i % GS_JOB_HISTORY];
    cJSON *e = cJSON_CreateObject();

    cJSON_AddNumberToObject(e, "generation", (double)g->generation);
    cJSON_AddNumberToObject(e, "world_size", g->world_size);
    cJSON_AddNumberToObject(e, "started_s_ago", (now - g->started_ms) / 1000.0);
    cJSON_AddNumberToObject(e, "duration_s",
                            ((g->ended ? g->ended_ms : now) - g->started_ms) / 1000.0);
    cJSON_AddNumberToObject(e, "start_step", (double)g->start_step);
    cJSON_AddNumberToObject(e, "lost_s", g->lost_ms / 1000.0);
    cJSON_AddStringToObject(e, "end", g->ended ? g->end_reason : "");
    cJSON_AddStringToObject(e, "lost", g->lost);
    cJSON_AddItemToArray(arr, e);
  }
}

/* The page of ranks (gs_rank_page_t), and where the next one starts. */
static void ranks_json(cJSON *o, const gs_job_t *job, const gs_rank_page_t *page, uint64_t now)
{
  cJSON *ranks = cJSON_AddArrayToObject(o, "ranks"), *p = cJSON_AddObjectToObject(o, "ranks_page");
  uint32_t end = page->from < job->world_size ? page->from : job->world_size;
  char next[192];

  end = job->world_size - end > page->limit ? end + page->limit : job->world_size;
  for (uint32_t r = page->from; ranks && r < end; r++)
    cJSON_AddItemToArray(ranks, rank_json(job->ranks[r], r, now));
  if (!p)
    return;
  cJSON_AddNumberToObject(p, "from", page->from);
  cJSON_AddNumberToObject(p, "limit", page->limit);
  cJSON_AddNumberToObject(p, "listed", end > page->from ? end - page->from : 0);
  snprintf(next, sizeof(next), "/jobs/%s?ranks_from=%u&ranks_limit=%u", job->name, end,
           page->limit);
  /* A limit of 0 lists nothing: a next page like it would be this one. */
  cJSON_AddItemToObject(p, "next",
                        end < job->world_size && page->limit ? cJSON_CreateString(next)
                                                             : cJSON_CreateNull());
}

/* Rank 0's Join settings, name to value (every rank's agree): what the
 * job trains with (its optimizer, sharding, the gradients' dtype, ...). */
static cJSON *settings_json(const gs_job_t *job)
{
  const gs_member_t *m = job->world_size && job->ranks ? job->ranks[0] : NULL;
  cJSON *o = cJSON_CreateObject();
  size_t at = 0;

  while (o && m && m->settings && at < m->settings_len) {
    const char *name = m->settings + at, *value = name + strlen(name) + 1;

    cJSON_AddStringToObject(o, name, value);
    at = (size_t)(value + strlen(value) + 1 - m->settings);
  }
  return o;
}

cJSON *gs__job_json(const gs_job_t *job, uint64_t now, const gs_rank_page_t *ranks)
{
  uint32_t max_listed = ranks ? GS_RANKS_PAGE_MAX : SUMMARY_STRAGGLERS;
  bool with_ranks = ranks != NULL;
  cJSON *o = cJSON_CreateObject(), *waiting;
  char reason[300];
  uint32_t stragglers;
  rank_stats_t st;

  if (!o)
    return NULL;
  rank_stats(job, &st);
  cJSON_AddStringToObject(o, "name", job->name);
  cJSON_AddStringToObject(o, "state", shown_state(job, reason, sizeof(reason), now));
  cJSON_AddStringToObject(o, "reason", reason);
  cJSON_AddNumberToObject(o, "generation", (double)job->generation);
  cJSON_AddNumberToObject(o, "world_size", job->world_size);
  cJSON_AddNumberToObject(o, "bcast_period", job->bcast_period);
  cJSON_AddNumberToObject(o, "lr_scale", job->lr_scale);
  elastic_json(o, job, now, with_ranks);
  waiting = cJSON_AddObjectToObject(o, "rendezvous");
  cJSON_AddNumberToObject(waiting, "joined", gs__rendezvous_joined(job));
  cJSON_AddNumberToObject(waiting, "world_size",
                          gs__rendezvous_joined(job) ? gs__rendezvous_world(job) : 0);
  cJSON_AddNumberToObject(o, "aborted_generation", (double)job->aborted_generation);
  cJSON_AddStringToObject(o, "abort_reason", job->abort_reason);
  cJSON_AddItemToObject(o, "pack_list", pack_list_json(&job->store.pack_summary));
  cJSON_AddNumberToObject(o, "broadcast_seq", (double)job->broadcast_seq);
  cJSON_AddNumberToObject(o, "checkpoint_seq", (double)job->checkpoint_seq);
  cJSON_AddBoolToObject(o, "stop", job->stop);
  cJSON_AddNumberToObject(o, "samples_per_sec", st.samples);
  cJSON_AddItemToObject(o, "stragglers", stragglers_json(job, &st, max_listed, &stragglers));
  cJSON_AddNumberToObject(o, "straggler_count", stragglers);
  stall_json(o, job, &st, now, max_listed);
  cJSON_AddItemToObject(o, "waiting_on", waiting_json(job, &st, now));
  cJSON_AddItemToObject(o, "rank_summary", rank_summary_json(job, &st, now));
  if (ranks) {
    cJSON_AddItemToObject(o, "settings", settings_json(job));
    ranks_json(o, job, ranks, now);
  }
  return o;
}

/* The first job a page shows (see gs_status_page_t): the list is newest
 * first, so serials fall along it. */
static const gs_job_t *first_on_page(const gs_jobs_t *jobs, uint64_t after)
{
  const gs_job_t *j = jobs->jobs;

  while (j && after && j->serial >= after)
    j = j->next;
  return j;
}

/* How many jobs there are, how many a page holds, and the path of the
 * next page, after `last` (null when this page was the last). */
static void page_json(cJSON *o, const gs_jobs_t *jobs, const gs_status_page_t *page,
                      bool with_ranks, const gs_job_t *last)
{
  cJSON *p = cJSON_AddObjectToObject(o, "page");
  char next[96];

  cJSON_AddNumberToObject(p, "total", jobs->job_count);
  cJSON_AddNumberToObject(p, "limit", page->limit);
  if (!last) {
    cJSON_AddNullToObject(p, "next");
    return;
  }
  snprintf(next, sizeof(next), "/status?%slimit=%u&after=%" PRIu64, with_ranks ? "ranks=1&" : "",
           page->limit, last->serial);
  cJSON_AddStringToObject(p, "next", next);
}

cJSON *gs__status_json(const gs_jobs_t *jobs, const gs_service_info_t *svc, uint64_t now,
                       bool with_ranks, const gs_status_page_t *page)
{
  cJSON *o = cJSON_CreateObject(), *svc_o, *arr;
  const gs_job_t *j = first_on_page(jobs, page->after), *last = NULL;
  gs_rank_page_t first_ranks;
  char id[17];

  if (!o)
    return NULL;
  snprintf(id, sizeof(id), "%016" PRIx64, jobs->cfg.coordinator_id);
  svc_o = cJSON_AddObjectToObject(o, "coordinator");
  cJSON_AddStringToObject(svc_o, "version", GS_VERSION);
  cJSON_AddStringToObject(svc_o, "id", id);
  cJSON_AddNumberToObject(svc_o, "uptime_s", svc->uptime_ms / 1000.0);
  cJSON_AddNumberToObject(svc_o, "connections", svc->connections);
  cJSON_AddNumberToObject(svc_o, "jobs", jobs->job_count);
  arr = cJSON_AddArrayToObject(o, "jobs");
  first_ranks = (gs_rank_page_t){.from = 0, .limit = GS_RANKS_PAGE_DEFAULT};
  for (uint32_t shown = 0; j && shown < page->limit; j = j->next, shown++) {
    cJSON_AddItemToArray(arr, gs__job_json(j, now, with_ranks ? &first_ranks : NULL));
    last = j;
  }
  page_json(o, jobs, page, with_ranks, j ? last : NULL);
  return o;
}

static int emit(gs_buf_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int emit(gs_buf_t *out, const char *fmt, ...)
{
  va_list ap;
  int n;

  for (;;) {
    size_t room = out->cap - out->len;

    va_start(ap, fmt);
    n = vsnprintf(room ? (char *)out->data + out->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0)
      return GS_EINVAL;
    if ((size_t)n < room) {
      out->len += n;
      return 0;
    }
    if (gs_buf_reserve(out, (size_t)n + 1))
      return GS_ENOMEM;
  }
}

static int family(gs_buf_t *out, const char *name, const char *type, const char *help)
{
  return emit(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static int emit_label(gs_buf_t *out, const char *v)
{
  int err = 0;

  for (; *v && !err; v++) {
    if (*v == '\\' || *v == '"')
      err = emit(out, "\\%c", *v);
    else if (*v == '\n')
      err = emit(out, "\\n");
    else
      err = emit(out, "%c", *v);
  }
  return err;
}

/* One line per job and state, 1 for the job's own: a job's state is one
 * series per state, as Prometheus spells an enum; and the reason of each
 * failed job as a label. */
static int state_metrics(const gs_jobs_t *jobs, gs_buf_t *out)
{
  int err = 0;

  err |= family(out, "gradsync_job_state", "gauge",
                "1 for the job's state (waiting, running, finished, failed), else 0.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next) {
    for (int s = GS_JOB_WAITING; s <= GS_JOB_FAILED; s++)
      err |= emit(out, "gradsync_job_state{job=\"%s\",state=\"%s\"} %d\n", j->name,
                  gs__job_state_name((gs_job_state_t)s), j->state == (gs_job_state_t)s);
  }
  err |= family(out, "gradsync_job_failed", "gauge",
                "1 for each failed job, with the reason its generation was aborted.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next) {
    if (j->state != GS_JOB_FAILED)
      continue;
    err |= emit(out, "gradsync_job_failed{job=\"%s\",reason=\"", j->name);
    err |= emit_label(out, j->abort_reason);
    err |= emit(out, "\"} 1\n");
  }
  return err;
}

static int service_metrics(const gs_jobs_t *jobs, const gs_service_info_t *svc, gs_buf_t *out)
{
  int err = 0;

  err |= family(out, "gradsync_jobs", "gauge", "Jobs the coordinator knows.");
  err |= emit(out, "gradsync_jobs %u\n", jobs->job_count);
  err |= family(out, "gradsync_rpc_connections", "gauge", "Open RPC connections.");
  err |= emit(out, "gradsync_rpc_connections %u\n", svc->connections);
  err |= family(out, "gradsync_rpc_unauthenticated_connections", "gauge",
                "Open RPC connections no call of which has passed the token check yet.");
  err |= emit(out, "gradsync_rpc_unauthenticated_connections %u\n", svc->unauthenticated);
  err |= family(out, "gradsync_rpc_memory_bytes", "gauge",
                "What the RPC connections hold (--max-memory), by whether they authenticated.");
  err |= emit(out, "gradsync_rpc_memory_bytes{clients=\"authenticated\"} %" PRIu64 "\n",
              svc->memory_bytes - svc->unauth_memory_bytes);
  err |= emit(out, "gradsync_rpc_memory_bytes{clients=\"unauthenticated\"} %" PRIu64 "\n",
              svc->unauth_memory_bytes);
  err |= family(out, "gradsync_job_store_bytes", "gauge",
                "What the jobs' blobs and pack lists hold (--max-memory, a quarter of it at "
                "most).");
  err |= emit(out, "gradsync_job_store_bytes %" PRIu64 "\n", svc->stored_bytes);
  err |= family(out, "gradsync_job_member_bytes", "gauge",
                "What the jobs' ranks and parked Joins hold (--max-memory, a quarter of it at "
                "most).");
  err |= emit(out, "gradsync_job_member_bytes %" PRIu64 "\n", svc->member_bytes);
  err |= family(out, "gradsync_http_memory_bytes", "gauge",
                "What the HTTP port holds (--max-memory): replies waiting to be written, "
                "requests held unparsed.");
  err |= emit(out, "gradsync_http_memory_bytes %" PRIu64 "\n", svc->http_memory_bytes);
  err |= family(out, "gradsync_rpc_unauthenticated_closed_total", "counter",
                "Unauthenticated RPC connections closed or refused for their share of the "
                "memory budget.");
  err |= emit(out, "gradsync_rpc_unauthenticated_closed_total %" PRIu64 "\n", svc->unauth_closed);
  err |= family(out, "gradsync_rpc_unauthenticated_throttled_total", "counter",
                "Times an RPC connection that had not authenticated was not read for a while: it "
                "read 256 KiB, or all such connections 64 MiB, faster than their rate.");
  err |= emit(out, "gradsync_rpc_unauthenticated_throttled_total %" PRIu64 "\n",
              svc->unauth_throttled);
  err |= family(out, "gradsync_rpc_requests_total", "counter", "RPC requests by method.");
  for (int m = 0; m < GS_METHOD_COUNT; m++)
    err |= emit(out, "gradsync_rpc_requests_total{method=\"%s\"} %" PRIu64 "\n", gs_method_name(m),
                svc->requests[m]);
  err |= family(out, "gradsync_rpc_errors_total", "counter", "RPC error replies by method.");
  for (int m = 0; m < GS_METHOD_COUNT; m++)
    err |= emit(out, "gradsync_rpc_errors_total{method=\"%s\"} %" PRIu64 "\n", gs_method_name(m),
                svc->errors[m]);
  err |= family(out, "gradsync_bad_frames_total", "counter",
                "Frames refused: oversized, undecodable or unknown method.");
  err |= emit(out, "gradsync_bad_frames_total %" PRIu64 "\n", svc->bad_frames);
  err |= family(out, "gradsync_ranks_lost_total", "counter", "Ranks declared lost.");
  err |= emit(out, "gradsync_ranks_lost_total %" PRIu64 "\n", jobs->stats.ranks_lost);
  err |= family(out, "gradsync_generations_aborted_total", "counter", "Generations aborted.");
  err |= emit(out, "gradsync_generations_aborted_total %" PRIu64 "\n",
              jobs->stats.generations_aborted);
  err |= family(out, "gradsync_regroups_total", "counter",
                "Elastic generations that continued from their survivors' state.");
  err |= emit(out, "gradsync_regroups_total %" PRIu64 "\n", jobs->stats.regroups);
  err |= family(out, "gradsync_regroup_seconds_total", "counter",
                "Seconds from an elastic generation's end to the next one's start.");
  err |= emit(out, "gradsync_regroup_seconds_total %.3f\n", jobs->stats.regroup_ms_total / 1000.0);
  return err ? GS_ENOMEM : 0;
}

/* What holds each job up: how long, and the ranks named (waiting.h). */
static int held_metrics(const gs_jobs_t *jobs, uint64_t now, gs_buf_t *out)
{
  int err = 0;

  err |= family(out, "gradsync_job_held_seconds", "gauge",
                "Seconds the job's ranks have waited in a collective on others (0: none).");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_held_seconds{job=\"%s\"} %.3f\n", j->name,
                j->held.on.kind ? (now - j->held.on.since_ms) / 1000.0 : 0.0);
  err |= family(out, "gradsync_job_waiting_on", "gauge",
                "1 for each rank a held-up job waits on, with why (kind) and its phase.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next) {
    const gs_waiting_on_t *w = &j->held.on;

    for (uint32_t i = 0; w->kind && i < w->rank_count && i < GS_WAITING_MAX_RANKS; i++)
      err |=
          emit(out, "gradsync_job_waiting_on{job=\"%s\",rank=\"%u\",kind=\"%s\",phase=\"%s\"} 1\n",
               j->name, w->ranks[i], gs__wait_kind_name(w->kind), gs_phase_name(w->phase));
  }
  err |= family(out, "gradsync_rank_phase_seconds", "gauge",
                "Seconds the rank has been in its current phase (label phase).");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next) {
    for (uint32_t r = 0; r < j->world_size; r++) {
      const gs_member_t *m = j->ranks[r];

      if (m && m->state == GS_MEMBER_RUNNING && m->has_progress)
        err |= emit(out, "gradsync_rank_phase_seconds{job=\"%s\",rank=\"%u\",phase=\"%s\"} %.3f\n",
                    j->name, r, gs_phase_name(m->phase), (now - m->phase_start_ms) / 1000.0);
    }
  }
  return err;
}

static int job_metrics(const gs_jobs_t *jobs, uint64_t now, gs_buf_t *out)
{
  static const struct {
    const char *name, *help;
  } per_rank[] = {
      {"gradsync_rank_step", "Last reported training step."},
      {"gradsync_rank_loss", "Last reported training loss."},
      {"gradsync_rank_samples_per_second", "Training samples per second of the rank."},
      {"gradsync_rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat."},
  };
  int err = 0;

  err |= family(out, "gradsync_job_generation", "gauge", "Current generation of the job.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_generation{job=\"%s\"} %" PRIu64 "\n", j->name, j->generation);
  err |= family(out, "gradsync_job_world_size", "gauge", "Ranks in the current generation.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_world_size{job=\"%s\"} %u\n", j->name, j->world_size);
  err |= family(out, "gradsync_job_regroups_total", "counter",
                "Elastic regroups of the job (a generation continued from survivors' state).");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_regroups_total{job=\"%s\"} %" PRIu64 "\n", j->name, j->regroups);
  err |= family(out, "gradsync_job_running", "gauge", "1 while the job is running.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_running{job=\"%s\"} %d\n", j->name, j->state == GS_JOB_RUNNING);
  err |= state_metrics(jobs, out);
  err |= family(out, "gradsync_job_stalled", "gauge",
                "1 while ranks are held up in a collective, or the step has not advanced for "
                "--stall-timeout.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_stalled{job=\"%s\"} %d\n", j->name, job_stalled(j));
  err |= held_metrics(jobs, now, out);
  err |= family(out, "gradsync_job_bcast_period", "gauge", "Parameter broadcast period.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_bcast_period{job=\"%s\"} %d\n", j->name, j->bcast_period);
  err |= family(out, "gradsync_job_lr_scale", "gauge",
                "The operator's learning-rate scale (POST /jobs/NAME/control), 1 unless set.");
  for (const gs_job_t *j = jobs->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_lr_scale{job=\"%s\"} %g\n", j->name, (double)j->lr_scale);
  for (size_t k = 0; k < sizeof(per_rank) / sizeof(per_rank[0]); k++) {
    err |= family(out, per_rank[k].name, "gauge", per_rank[k].help);
    for (const gs_job_t *j = jobs->jobs; j; j = j->next) {
      for (uint32_t r = 0; r < j->world_size; r++) {
        const gs_member_t *m = j->ranks[r];
        double v[] = {m ? (double)m->step : 0, m ? m->loss : 0, m ? m->samples_per_sec : 0,
                      m ? (now - m->last_heartbeat_ms) / 1000.0 : 0};

        if (!m || m->state != GS_MEMBER_RUNNING)
          continue;
        /* Prometheus spells a missing value NaN; printf would write "nan". */
        if (isnan(v[k]))
          err |= emit(out, "%s{job=\"%s\",rank=\"%u\"} NaN\n", per_rank[k].name, j->name, r);
        else
          err |=
              emit(out, "%s{job=\"%s\",rank=\"%u\"} %.17g\n", per_rank[k].name, j->name, r, v[k]);
      }
    }
  }
  return err ? GS_ENOMEM : 0;
}

int gs__metrics_text(const gs_jobs_t *jobs, const gs_service_info_t *svc, uint64_t now,
                     gs_buf_t *out)
{
  int err = service_metrics(jobs, svc, out);

  return err ? err : job_metrics(jobs, now, out);
}
