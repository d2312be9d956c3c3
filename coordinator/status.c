/* Status JSON (cJSON) and Prometheus metrics, built from the live state. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "status.h"

/* A rank is a straggler when its compute time per step is over 1.2x the
 * median (the others then wait on it in every allreduce) or its step is two
 * or more behind the leading rank. */
#define STRAGGLER_COMPUTE_RATIO 1.2
#define STRAGGLER_STEP_LAG 2

static int cmp_float(const void *a, const void *b)
{
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static cJSON *stragglers_json(const gs_job_t *job)
{
  cJSON *arr = cJSON_CreateArray();
  float *compute = calloc(job->world_size ? job->world_size : 1, sizeof(float));
  uint64_t max_step = 0;
  uint32_t n = 0;
  float median;

  if (!arr || !compute) {
    free(compute);
    return arr;
  }
  for (uint32_t r = 0; r < job->world_size; r++) {
    const gs_member_t *m = job->ranks[r];

    if (m && m->state == GS_MEMBER_RUNNING) {
      compute[n++] = m->compute_ms;
      if (m->step > max_step)
        max_step = m->step;
    }
  }
  qsort(compute, n, sizeof(float), cmp_float);
  median = n ? compute[n / 2] : 0;
  for (uint32_t r = 0; r < job->world_size; r++) {
    const gs_member_t *m = job->ranks[r];

    if (!m || m->state != GS_MEMBER_RUNNING)
      continue;
    if ((median > 0 && m->compute_ms > STRAGGLER_COMPUTE_RATIO * median) ||
        m->step + STRAGGLER_STEP_LAG <= max_step)
      cJSON_AddItemToArray(arr, cJSON_CreateNumber(r));
  }
  free(compute);
  return arr;
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
  cJSON_AddNumberToObject(o, "step", (double)m->step);
  cJSON_AddNumberToObject(o, "loss", m->loss);
  cJSON_AddNumberToObject(o, "samples_per_sec", m->samples_per_sec);
  cJSON_AddNumberToObject(o, "compute_ms", m->compute_ms);
  cJSON_AddNumberToObject(o, "comm_wait_ms", m->comm_wait_ms);
  cJSON_AddNumberToObject(o, "last_heartbeat_s", (now - m->last_heartbeat_ms) / 1000.0);
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

cJSON *gs__job_json(const gs_job_t *job, uint64_t now)
{
  cJSON *o = cJSON_CreateObject(), *ranks, *waiting;
  double samples = 0;

  if (!o)
    return NULL;
  cJSON_AddStringToObject(o, "name", job->name);
  cJSON_AddStringToObject(o, "state", gs__job_state_name(job->state));
  cJSON_AddNumberToObject(o, "generation", (double)job->generation);
  cJSON_AddNumberToObject(o, "world_size", job->world_size);
  cJSON_AddNumberToObject(o, "bcast_period", job->bcast_period);
  waiting = cJSON_AddObjectToObject(o, "rendezvous");
  cJSON_AddNumberToObject(waiting, "joined", job->waiting_count);
  cJSON_AddNumberToObject(waiting, "world_size", job->waiting_count ? job->waiting_world_size : 0);
  cJSON_AddNumberToObject(o, "aborted_generation", (double)job->aborted_generation);
  cJSON_AddStringToObject(o, "abort_reason", job->abort_reason);
  cJSON_AddItemToObject(o, "pack_list", pack_list_json(&job->pack_summary));
  cJSON_AddNumberToObject(o, "broadcast_seq", (double)job->broadcast_seq);
  cJSON_AddNumberToObject(o, "checkpoint_seq", (double)job->checkpoint_seq);
  cJSON_AddBoolToObject(o, "stop", job->stop);
  ranks = cJSON_AddArrayToObject(o, "ranks");
  for (uint32_t r = 0; r < job->world_size; r++) {
    cJSON_AddItemToArray(ranks, rank_json(job->ranks[r], r, now));
    if (job->ranks[r] && job->ranks[r]->state == GS_MEMBER_RUNNING)
      samples += job->ranks[r]->samples_per_sec;
  }
  cJSON_AddNumberToObject(o, "samples_per_sec", samples);
  cJSON_AddItemToObject(o, "stragglers", stragglers_json(job));
  return o;
}

cJSON *gs__status_json(const struct gs_coord *c)
{
  uint64_t now = uv_now(c->loop);
  cJSON *o = cJSON_CreateObject(), *svc, *jobs;
  char id[17];

  if (!o)
    return NULL;
  snprintf(id, sizeof(id), "%016" PRIx64, c->coordinator_id);
  svc = cJSON_AddObjectToObject(o, "coordinator");
  cJSON_AddStringToObject(svc, "version", GS_VERSION);
  cJSON_AddStringToObject(svc, "id", id);
  cJSON_AddNumberToObject(svc, "uptime_s", (now - c->started_ms) / 1000.0);
  cJSON_AddNumberToObject(svc, "connections", c->conns.open);
  cJSON_AddNumberToObject(svc, "jobs", c->job_count);
  jobs = cJSON_AddArrayToObject(o, "jobs");
  for (const gs_job_t *j = c->jobs; j; j = j->next)
    cJSON_AddItemToArray(jobs, gs__job_json(j, now));
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

static int service_metrics(const struct gs_coord *c, gs_buf_t *out)
{
  int err = 0;

  err |= family(out, "gradsync_jobs", "gauge", "Jobs the coordinator knows.");
  err |= emit(out, "gradsync_jobs %u\n", c->job_count);
  err |= family(out, "gradsync_rpc_connections", "gauge", "Open RPC connections.");
  err |= emit(out, "gradsync_rpc_connections %u\n", c->conns.open);
  err |= family(out, "gradsync_rpc_requests_total", "counter", "RPC requests by method.");
  for (int m = 0; m < GS_METHOD_COUNT; m++)
    err |= emit(out, "gradsync_rpc_requests_total{method=\"%s\"} %" PRIu64 "\n", gs__method_name(m),
                c->stats.requests[m]);
  err |= family(out, "gradsync_rpc_errors_total", "counter", "RPC error replies by method.");
  for (int m = 0; m < GS_METHOD_COUNT; m++)
    err |= emit(out, "gradsync_rpc_errors_total{method=\"%s\"} %" PRIu64 "\n", gs__method_name(m),
                c->stats.errors[m]);
  err |= family(out, "gradsync_bad_frames_total", "counter",
                "Frames refused: oversized, undecodable or unknown method.");
  err |= emit(out, "gradsync_bad_frames_total %" PRIu64 "\n", c->stats.bad_frames);
  err |= family(out, "gradsync_ranks_lost_total", "counter", "Ranks declared lost.");
  err |= emit(out, "gradsync_ranks_lost_total %" PRIu64 "\n", c->stats.ranks_lost);
  err |= family(out, "gradsync_generations_aborted_total", "counter", "Generations aborted.");
  err |=
      emit(out, "gradsync_generations_aborted_total %" PRIu64 "\n", c->stats.generations_aborted);
  return err ? GS_ENOMEM : 0;
}

static int job_metrics(const struct gs_coord *c, gs_buf_t *out)
{
  static const struct {
    const char *name, *help;
  } per_rank[] = {
      {"gradsync_rank_step", "Last reported training step."},
      {"gradsync_rank_loss", "Last reported training loss."},
      {"gradsync_rank_samples_per_second", "Training samples per second of the rank."},
      {"gradsync_rank_heartbeat_age_seconds", "Seconds since the rank's last heartbeat."},
  };
  uint64_t now = uv_now(c->loop);
  int err = 0;

  err |= family(out, "gradsync_job_generation", "gauge", "Current generation of the job.");
  for (const gs_job_t *j = c->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_generation{job=\"%s\"} %" PRIu64 "\n", j->name, j->generation);
  err |= family(out, "gradsync_job_world_size", "gauge", "Ranks in the current generation.");
  for (const gs_job_t *j = c->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_world_size{job=\"%s\"} %u\n", j->name, j->world_size);
  err |= family(out, "gradsync_job_running", "gauge", "1 while the job is running.");
  for (const gs_job_t *j = c->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_running{job=\"%s\"} %d\n", j->name, j->state == GS_JOB_RUNNING);
  err |= family(out, "gradsync_job_bcast_period", "gauge", "Parameter broadcast period.");
  for (const gs_job_t *j = c->jobs; j; j = j->next)
    err |= emit(out, "gradsync_job_bcast_period{job=\"%s\"} %d\n", j->name, j->bcast_period);
  for (size_t k = 0; k < sizeof(per_rank) / sizeof(per_rank[0]); k++) {
    err |= family(out, per_rank[k].name, "gauge", per_rank[k].help);
    for (const gs_job_t *j = c->jobs; j; j = j->next) {
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

int gs__metrics_text(const struct gs_coord *c, gs_buf_t *out)
{
  int err = service_metrics(c, out);

  return err ? err : job_metrics(c, out);
}
