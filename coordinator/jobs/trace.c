/* Step timelines (see trace.h). Each rank publishes what it recorded as a
 * Trace blob of its generation ("trace.SEQ.RANK", engine/trace.c); this
 * file merges them into one Chrome trace-event document: a process per
 * rank, a thread for its training thread's phases and one for its comm
 * thread's collectives, every span an "X" (complete) event on the
 * coordinator's clock, which the heartbeats' round trips align each
 * agent's to (NTP's estimate, from the sample with the shortest trip). */
#include "trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "phase.h"
#include "wire.h"

void gs__trace_stamp(const gs_member_t *m, uint64_t *at_us, uint64_t now_ms)
{
  gs_responder_t *r = m->job->jobs->responder;

  *at_us = r->clock_us ? r->clock_us(r) : now_ms * 1000;
}

void gs__trace_clock_sample(gs_member_t *m, uint64_t agent_sent_us, uint64_t agent_replied_us)
{
  int64_t t1 = (int64_t)agent_sent_us, t4 = (int64_t)agent_replied_us;
  int64_t t2 = (int64_t)m->hb_arrived_us, t3 = (int64_t)m->hb_replied_us;
  int64_t rtt = (t4 - t1) - (t3 - t2);

  if (!t1 || !t4 || !t2 || !t3 || t4 < t1 || rtt < 0)
    return; /* no sample yet, or the two sides speak of different heartbeats */
  m->beat_rtt_ms = rtt / 1000 < UINT32_MAX ? (uint32_t)(rtt / 1000) : UINT32_MAX;
  /* The best sample ages, so that a clock that drifts is followed. */
  if (m->clock_rtt_us && (uint64_t)rtt > m->clock_rtt_us + m->clock_rtt_us / 16 + 1000) {
    m->clock_rtt_us += m->clock_rtt_us / 64 + 1;
    return;
  }
  m->clock_rtt_us = (uint64_t)rtt;
  m->clock_offset_us = ((t2 - t1) + (t3 - t4)) / 2;
  m->clock_synced = true;
}

/* A metadata event naming rank's process (tid < 0) or one of its threads. */
static void name_track(cJSON *events, uint32_t rank, int tid, const char *name)
{
  cJSON *e = cJSON_CreateObject(), *args;

  cJSON_AddStringToObject(e, "name", tid < 0 ? "process_name" : "thread_name");
  cJSON_AddStringToObject(e, "ph", "M");
  cJSON_AddNumberToObject(e, "pid", rank);
  if (tid >= 0)
    cJSON_AddNumberToObject(e, "tid", tid);
  args = cJSON_AddObjectToObject(e, "args");
  cJSON_AddStringToObject(args, "name", name);
  cJSON_AddItemToArray(events, e);
}

static void name_tracks(cJSON *events, const gs_member_t *m, uint32_t rank)
{
  char name[320];

  snprintf(name, sizeof(name), "rank %u (%s)", rank, m->req.node);
  name_track(events, rank, -1, name);
  name_track(events, rank, 0, "training thread");
  name_track(events, rank, 1, "comm thread");
}

/* One span as an "X" event at `ts` µs on the shared clock. */
static void add_span(cJSON *events, uint32_t rank, const gradsync_TraceEvent *ev, double ts)
{
  cJSON *e = cJSON_CreateObject(), *args;
  char name[48];

  if (ev->phase == gradsync_Phase_PHASE_ALLREDUCE)
    snprintf(name, sizeof(name), "allreduce pack %u", ev->pack);
  else
    snprintf(name, sizeof(name), "%s", gs_phase_name(ev->phase));
  cJSON_AddStringToObject(e, "name", name);
  cJSON_AddStringToObject(e, "cat", ev->comm ? "collective" : "phase");
  cJSON_AddStringToObject(e, "ph", "X");
  cJSON_AddNumberToObject(e, "pid", rank);
  cJSON_AddNumberToObject(e, "tid", ev->comm ? 1 : 0);
  cJSON_AddNumberToObject(e, "ts", ts);
  cJSON_AddNumberToObject(e, "dur", ev->dur_us);
  args = cJSON_AddObjectToObject(e, "args");
  cJSON_AddNumberToObject(args, "step", (double)ev->step);
  cJSON_AddItemToArray(events, e);
}

/* The key of rank's part of the latest trace. */
static void trace_key(const gs_job_t *job, uint32_t rank, char *key, size_t len)
{
  snprintf(key, len, "trace.%" PRIu64 ".%u", job->trace_seq, rank);
}

/* The rank's published trace, decoded into *t; false when none (yet). */
static bool rank_trace(const gs_job_t *job, uint32_t rank, gradsync_Trace *t)
{
  const gs_blob_t *b;
  char key[64], why[128];

  trace_key(job, rank, key, sizeof(key));
  b = gs__store_find(&job->store, key);
  return b && gs_wire_decode(b->value, b->len, gradsync_Trace_fields, t, why, sizeof(why)) == 0;
}

/* What is still missing: the ranks that have not published. */
static cJSON *pending_json(const gs_job_t *job, const bool *have, uint32_t count)
{
  cJSON *o = cJSON_CreateObject(), *missing;

  cJSON_AddNumberToObject(o, "trace_seq", (double)job->trace_seq);
  cJSON_AddNumberToObject(o, "steps", job->trace_steps);
  cJSON_AddNumberToObject(o, "ranks", job->world_size);
  cJSON_AddNumberToObject(o, "published", count);
  missing = cJSON_AddArrayToObject(o, "waiting_for");
  for (uint32_t r = 0; missing && r < job->world_size; r++) {
    if (!have[r])
      cJSON_AddItemToArray(missing, cJSON_CreateNumber(r));
  }
  if (job->trace_generation != job->generation)
    cJSON_AddStringToObject(o, "error", "the generation it was asked of has ended; ask again");
  return o;
}

/* The merged document from the ranks' traces, each decoded once into `t`
 * (a Trace is 44 KB); the spans are written on the shared clock, then
 * moved so that the earliest is at time 0. */
static cJSON *chrome_json(const gs_job_t *job, gradsync_Trace *t)
{
  cJSON *doc = cJSON_CreateObject(), *events = cJSON_AddArrayToObject(doc, "traceEvents");
  cJSON *other = cJSON_AddObjectToObject(doc, "otherData");
  cJSON *truncated =
      cJSON_AddArrayToObject(other, "truncated"); /* ranks whose last spans are left out */
  /* Per rank, the round trip of the heartbeat its clock was aligned by:
   * its track is placed within half of it of the coordinator's clock. */
  cJSON *rtts = cJSON_AddArrayToObject(other, "clock_rtt_us");
  cJSON *e, *ts;
  double origin = -1;

  cJSON_AddStringToObject(doc, "displayTimeUnit", "ms");
  cJSON_AddStringToObject(other, "job", job->name);
  cJSON_AddNumberToObject(other, "trace_seq", (double)job->trace_seq);
  cJSON_AddNumberToObject(other, "generation", (double)job->generation);
  cJSON_AddNumberToObject(other, "steps", job->trace_steps);
  for (uint32_t r = 0; events && r < job->world_size && rank_trace(job, r, t); r++) {
    double base = (double)t->origin_us + (double)job->ranks[r]->clock_offset_us;

    name_tracks(events, job->ranks[r], r);
    cJSON_AddItemToArray(rtts, cJSON_CreateNumber((double)job->ranks[r]->clock_rtt_us));
    for (pb_size_t i = 0; i < t->events_count; i++) {
      double at = base + (double)t->events[i].start_us;

      add_span(events, r, &t->events[i], at);
      if (origin < 0 || at < origin)
        origin = at;
    }
    if (t->truncated)
      cJSON_AddItemToArray(truncated, cJSON_CreateNumber(r));
  }
  cJSON_ArrayForEach(e, events)
  {
    if ((ts = cJSON_GetObjectItemCaseSensitive(e, "ts")))
      cJSON_SetNumberValue(ts, ts->valuedouble - origin);
  }
  return doc;
}

cJSON *gs__trace_json(const gs_job_t *job, bool *complete)
{
  uint32_t w = job->world_size, count = 0;
  gradsync_Trace *t = malloc(sizeof(*t));
  bool *have = calloc(w ? w : 1, sizeof(*have));
  cJSON *doc = NULL;
  char key[64];

  *complete = false;
  if (!t || !have)
    goto out;
  for (uint32_t r = 0; job->trace_seq && job->trace_generation == job->generation && r < w; r++) {
    trace_key(job, r, key, sizeof(key));
    have[r] = job->ranks[r] && gs__store_find(&job->store, key);
    count += have[r];
  }
  *complete = w && count == w;
  doc = *complete ? chrome_json(job, t) : pending_json(job, have, count);
out:
  free(t);
  free(have);
  return doc;
}
