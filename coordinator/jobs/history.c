/* The history of a job's generations (see history.h). */
#include "history.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gs_generation_record_t *latest(gs_job_t *job)
{
  return job->history_count ? &job->history[(job->history_count - 1) % GS_JOB_HISTORY] : NULL;
}

_Static_assert((GS_JOB_HISTORY & (GS_JOB_HISTORY - 1)) == 0,
               "the ring doubles from 1 to GS_JOB_HISTORY");

/* Room for the next record: the ring doubles until it holds
 * GS_JOB_HISTORY, and wraps only then, so a record's place is its count
 * modulo GS_JOB_HISTORY at every size. False when out of memory. */
static bool reserve(gs_job_t *job)
{
  uint32_t cap = job->history_cap ? job->history_cap * 2 : 1;
  gs_generation_record_t *h;

  if (job->history_count < job->history_cap || job->history_cap == GS_JOB_HISTORY)
    return true;
  h = realloc(job->history, cap * sizeof(*h));
  if (!h)
    return false;
  job->history = h;
  job->history_cap = cap;
  return true;
}

void gs__generation_started(gs_job_t *job, uint64_t now)
{
  gs_generation_record_t *prev = latest(job), *rec;
  uint64_t lost = prev && prev->ended && now >= prev->ended_ms ? now - prev->ended_ms : 0;

  if (job->resume_state && prev && prev->ended) {
    job->regroups++;
    job->regroup_ms_total += lost;
    job->jobs->stats.regroups++;
    job->jobs->stats.regroup_ms_total += lost;
  }
  if (!reserve(job)) {
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1,
           "out of memory: generation %llu is not in the job's history",
           (unsigned long long)job->generation);
    return;
  }
  rec = &job->history[job->history_count++ % GS_JOB_HISTORY];
  *rec = (gs_generation_record_t){
      .generation = job->generation,
      .world_size = job->world_size,
      .started_ms = now,
      .start_step = job->resume_state ? job->state_step : 0,
      .lost_ms = job->resume_state ? lost : 0,
  };
}

void gs__generation_ended(gs_job_t *job, uint64_t now, const char *reason)
{
  gs_generation_record_t *rec = latest(job);

  if (!rec || rec->generation != job->generation || rec->ended)
    return;
  rec->ended = true;
  rec->ended_ms = now;
  snprintf(rec->end_reason, sizeof(rec->end_reason), "%s", reason);
}

void gs__generation_note(gs_job_t *job, const char *fmt, ...)
{
  gs_generation_record_t *rec = latest(job);
  size_t used;
  va_list ap;

  if (!rec || rec->generation != job->generation)
    return;
  used = strlen(rec->lost);
  if (used + 3 >= sizeof(rec->lost))
    return;
  if (used) {
    memcpy(rec->lost + used, "; ", 3);
    used += 2;
  }
  va_start(ap, fmt);
  vsnprintf(rec->lost + used, sizeof(rec->lost) - used, fmt, ap);
  va_end(ap);
}

const char *gs__generation_previous_end(const gs_job_t *job)
{
  const gs_generation_record_t *prev;

  if (job->history_count < 2)
    return "";
  prev = &job->history[(job->history_count - 2) % GS_JOB_HISTORY];
  return prev->lost[0] ? prev->lost : prev->end_reason;
}
