/* Step timelines (see trace.h). Each rank publishes what it recorded as a
 * Trace blob of its generation ("trace.SEQ.RANK", engine/trace.c); this
 * file merges them into one Chrome trace-event document: a process per
 * rank, a thread for its training thread's phases and one for its comm
 * thread's collectives, every span an "X" (complete) event on the
 * coordinator's clock, which the heartbeats' round trips align each
 * agent's to (NTP's estimate, from the sample with the shortest trip). */
#include "trace.h"

#include <inttypes.h>
#include <stdarg.h>
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

/* The rank's part as the document shows it: one that does not decode (an
 * agent of another version) shows as a rank with no spans. */
static void rank_part(const gs_job_t *job, uint32_t rank, gradsync_Trace *t)
{
  if (!rank_trace(job, rank, t))
    *t = (gradsync_Trace)gradsync_Trace_init_zero;
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

/* What one span's event takes at most as text (20-digit numbers). */
#define SPAN_TEXT_MAX 224
/* A rank's tracks' names, its node's name aside, and its clock_rtt_us
 * and truncated entries. */
#define RANK_TEXT_MAX 448
/* The document's head and tail, the job's name aside. */
#define DOC_TEXT_MAX 512

/* Appends printf output to the document, whose room was reserved. */
static void put(gs_buf_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(gs_buf_t *out, const char *fmt, ...)
{
  size_t room = out->cap - out->len;
  va_list ap;
  int n;

  if (room <= 1)
    return; /* full: render() finds it measured short */
  va_start(ap, fmt);
  n = vsnprintf((char *)out->data + out->len, room, fmt, ap);
  va_end(ap);
  if (n > 0)
    out->len += (size_t)n < room ? (size_t)n : room - 1;
}

/* Rank r's process and its two threads, named; `node` is the node's name
 * as a JSON string (quotes included). */
static void put_tracks(gs_buf_t *out, uint32_t r, const char *node)
{
  put(out,
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"args\":{\"name\":\"rank %u (%.*s)\"}},"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
      "\"args\":{\"name\":\"training thread\"}},"
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":1,"
      "\"args\":{\"name\":\"comm thread\"}}",
      r, r, (int)strlen(node) - 2, node + 1, r, r);
}

/* One span as an "X" event at `ts` µs after the trace's first span. */
static void put_span(gs_buf_t *out, uint32_t r, const gradsync_TraceEvent *ev, int64_t ts)
{
  char name[48];

  if (ev->phase == gradsync_Phase_PHASE_ALLREDUCE)
    snprintf(name, sizeof(name), "allreduce pack %u", ev->pack);
  else
    snprintf(name, sizeof(name), "%s", gs_phase_name(ev->phase));
  put(out,
      ",{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%d,\"ts\":%" PRId64
      ",\"dur\":%" PRIu64 ",\"args\":{\"step\":%" PRIu64 "}}",
      name, ev->comm ? "collective" : "phase", r, ev->comm ? 1 : 0, ts, (uint64_t)ev->dur_us,
      (uint64_t)ev->step);
}

/* The first pass: where each rank's spans start on the coordinator's
 * clock, the earliest span of all (the document's time 0), and how much
 * text the document can take, so that it is written in one allocation. */
static void measure(const gs_job_t *job, gradsync_Trace *t, int64_t *origin, size_t *text_max)
{
  bool any = false;

  *text_max = DOC_TEXT_MAX + strlen(job->name);
  for (uint32_t r = 0; r < job->world_size; r++) {
    int64_t base;

    rank_part(job, r, t);
    base = (int64_t)t->origin_us + job->ranks[r]->clock_offset_us;
    for (pb_size_t i = 0; i < t->events_count; i++) {
      int64_t at = base + (int64_t)t->events[i].start_us;

      if (!any || at < *origin)
        *origin = at;
      any = true;
    }
    *text_max += RANK_TEXT_MAX + 6 * strlen(job->ranks[r]->req.node) +
                 (size_t)t->events_count * SPAN_TEXT_MAX;
  }
  if (!any)
    *origin = 0;
}

/* The merged document, written in `out` (room for text_max bytes): the
 * spans on the shared clock, moved so that the earliest is at time 0. */
static int render(const gs_job_t *job, gradsync_Trace *t, int64_t origin, gs_buf_t *out)
{
  uint32_t w = job->world_size;

  put(out, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  for (uint32_t r = 0; r < w; r++) {
    const gs_member_t *m = job->ranks[r];
    cJSON *name = cJSON_CreateStringReference(m->req.node);
    char *node = name ? cJSON_PrintUnformatted(name) : NULL; /* escaped */
    int64_t base;

    cJSON_Delete(name);
    if (!node)
      return GS_ENOMEM;
    rank_part(job, r, t);
    if (r)
      put(out, ",");
    put_tracks(out, r, node);
    free(node);
    base = (int64_t)t->origin_us + m->clock_offset_us - origin;
    for (pb_size_t i = 0; i < t->events_count; i++)
      put_span(out, r, &t->events[i], base + (int64_t)t->events[i].start_us);
  }
  put(out,
      "],\"otherData\":{\"job\":\"%s\",\"trace_seq\":%" PRIu64 ",\"generation\":%" PRIu64
      ",\"steps\":%u,\"truncated\":[",
      job->name, job->trace_seq, job->generation, job->trace_steps);
  /* The ranks whose last spans are left out. */
  for (uint32_t r = 0, n = 0; r < w; r++) {
    rank_part(job, r, t);
    if (t->truncated)
      put(out, "%s%u", n++ ? "," : "", r);
  }
  /* Per rank, the round trip of the heartbeat its clock was aligned by:
   * its track is placed within half of it of the coordinator's clock. */
  put(out, "],\"clock_rtt_us\":[");
  for (uint32_t r = 0; r < w; r++)
    put(out, "%s%" PRIu64, r ? "," : "", job->ranks[r]->clock_rtt_us);
  put(out, "]}}");
  return out->len + 1 < out->cap ? 0 : GS_EINTERNAL; /* the room was measured short */
}

void gs__trace_forget(gs_job_t *job)
{
  if (job->store.mem)
    gs_mem_budget_store(job->store.mem, 0, job->trace_doc.cap);
  gs_buf_free(&job->trace_doc);
  job->trace_doc_seq = 0;
}

/* Renders the latest request's document once every rank published, and
 * keeps it, counted in what jobs store. */
static int keep_document(gs_job_t *job, gradsync_Trace *t)
{
  gs_mem_budget_t *mem = job->store.mem;
  gs_buf_t doc = {0};
  int64_t origin = 0;
  size_t text_max;
  uint8_t *fit;
  int err;

  measure(job, t, &origin, &text_max);
  if (mem && !gs_mem_budget_store_fits(mem, text_max))
    return GS_ELIMIT;
  doc.data = malloc(text_max);
  doc.cap = text_max;
  if (!doc.data)
    return GS_ENOMEM;
  err = render(job, t, origin, &doc);
  if (err) {
    free(doc.data);
    return err;
  }
  fit = realloc(doc.data, doc.len + 1); /* what was measured is an upper bound */
  if (fit) {
    doc.data = fit;
    doc.cap = doc.len + 1;
  }
  doc.data[doc.len] = '\0';
  gs__trace_forget(job);
  job->trace_doc = doc;
  job->trace_doc_seq = job->trace_seq;
  if (mem)
    gs_mem_budget_store(mem, doc.cap, 0);
  return 0;
}

int gs__trace_document(gs_job_t *job, const gs_buf_t **doc, cJSON **pending)
{
  uint32_t w = job->world_size, count = 0;
  gradsync_Trace *t;
  bool *have;
  char key[64];
  int err = GS_ENOMEM;

  *doc = NULL;
  *pending = NULL;
  if (job->trace_doc_seq && job->trace_doc_seq == job->trace_seq) {
    *doc = &job->trace_doc;
    return 0;
  }
  t = malloc(sizeof(*t));
  have = calloc(w ? w : 1, sizeof(*have));
  if (!t || !have)
    goto out;
  for (uint32_t r = 0; job->trace_seq && job->trace_generation == job->generation && r < w; r++) {
    trace_key(job, r, key, sizeof(key));
    have[r] = job->ranks[r] && gs__store_find(&job->store, key);
    count += have[r];
  }
  if (!w || count < w) {
    *pending = pending_json(job, have, count);
    err = *pending ? 0 : GS_ENOMEM;
    goto out;
  }
  err = keep_document(job, t);
  if (!err)
    *doc = &job->trace_doc;
out:
  free(t);
  free(have);
  return err;
}
