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
#include <time.h>

#include "phase.h"
#include "wire.h"

/* How long one slice of a trace's rendering may hold the loop. */
#define TRACE_SLICE_NS (5 * 1000 * 1000)

/* A merged trace being written, a slice at a time (TRACE_SLICE_NS): the
 * first pass decodes every rank's part for the earliest span (the
 * document's time 0) and the room the text needs, the second writes it
 * into one buffer of that room. A 1,024-rank trace of 800 spans a rank
 * (83 MB) takes 0.4 s in all: in one piece it held the loop that long. */
struct gs_trace_render {
  uint64_t seq;  /* the request it answers */
  bool writing;  /* the second pass */
  uint32_t next; /* the rank the pass is at */
  int64_t origin;
  bool any;
  bool *truncated; /* per rank: its last spans left out */
  gs_buf_t text;   /* room for text.cap bytes, counted in the budget while written */
  int err;         /* GS_ELIMIT, GS_ENOMEM: the request's answer until the next */
};

static uint64_t stamp(const gs_member_t *m, uint64_t now_ms)
{
  gs_responder_t *r = m->job->jobs->responder;

  return r->clock_us ? r->clock_us(r) : now_ms * 1000;
}

void gs__trace_arrived(gs_member_t *m, uint64_t now_ms)
{
  m->clock.arrived_us = stamp(m, now_ms);
}

void gs__trace_replied(gs_member_t *m, uint64_t now_ms)
{
  m->clock.replied_us = stamp(m, now_ms);
}

void gs__trace_replied_at_once(gs_member_t *m)
{
  m->clock.replied_us = m->clock.arrived_us;
}

void gs__trace_clock_sample(gs_member_t *m, uint64_t agent_sent_us, uint64_t agent_replied_us)
{
  int64_t t1 = (int64_t)agent_sent_us, t4 = (int64_t)agent_replied_us;
  int64_t t2 = (int64_t)m->clock.arrived_us, t3 = (int64_t)m->clock.replied_us;
  int64_t rtt = (t4 - t1) - (t3 - t2);

  if (!t1 || !t4 || !t2 || !t3 || t4 < t1 || rtt < 0)
    return; /* no sample yet, or the two sides speak of different heartbeats */
  m->clock.beat_rtt_ms = rtt / 1000 < UINT32_MAX ? (uint32_t)(rtt / 1000) : UINT32_MAX;
  /* The best sample ages, so that a clock that drifts is followed. */
  if (m->clock.rtt_us && (uint64_t)rtt > m->clock.rtt_us + m->clock.rtt_us / 16 + 1000) {
    m->clock.rtt_us += m->clock.rtt_us / 64 + 1;
    return;
  }
  m->clock.rtt_us = (uint64_t)rtt;
  m->clock.offset_us = ((t2 - t1) + (t3 - t4)) / 2;
  m->clock.synced = true;
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
  if (job->trace_render) { /* every part is in: the document is being written */
    cJSON *r = cJSON_AddObjectToObject(o, "rendering");

    cJSON_AddStringToObject(r, "pass", job->trace_render->writing ? "writing" : "reading");
    cJSON_AddNumberToObject(r, "ranks_done", job->trace_render->next);
  }
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

/* Appends a string, or a number in decimal, to the document (its room
 * was reserved: SPAN_TEXT_MAX bounds a span). The spans are nearly all of
 * a large trace, and vsnprintf took most of its rendering time. */
static void put_text(gs_buf_t *out, const char *s)
{
  size_t n = strlen(s);

  if (n >= out->cap - out->len) {
    out->len = out->cap - 1; /* render() finds it measured short */
    return;
  }
  memcpy(out->data + out->len, s, n);
  out->len += n;
}

static void put_u64(gs_buf_t *out, uint64_t v)
{
  char digits[24], *p = digits + sizeof(digits);

  *--p = '\0';
  do
    *--p = (char)('0' + v % 10);
  while (v /= 10);
  put_text(out, p);
}

/* One span as an "X" event at `ts` µs after the trace's first span
 * (never before it). */
static void put_span(gs_buf_t *out, uint32_t r, const gradsync_TraceEvent *ev, int64_t ts)
{
  bool comm = ev->comm;

  put_text(out, ",{\"name\":\"");
  if (ev->phase == gradsync_Phase_PHASE_ALLREDUCE) {
    put_text(out, "allreduce pack ");
    put_u64(out, ev->pack);
  } else {
    put_text(out, gs_phase_name(ev->phase));
  }
  put_text(out, comm ? "\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":"
                     : "\",\"cat\":\"phase\",\"ph\":\"X\",\"pid\":");
  put_u64(out, r);
  put_text(out, comm ? ",\"tid\":1,\"ts\":" : ",\"tid\":0,\"ts\":");
  put_u64(out, ts > 0 ? (uint64_t)ts : 0);
  put_text(out, ",\"dur\":");
  put_u64(out, ev->dur_us);
  put_text(out, ",\"args\":{\"step\":");
  put_u64(out, ev->step);
  put_text(out, "}}");
}

static uint64_t mono_ns(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void render_free(gs_job_t *job)
{
  gs_trace_render_t *r = job->trace_render;

  if (!r)
    return;
  if (job->store.mem && r->text.cap)
    gs_mem_budget_store(job->store.mem, 0, r->text.cap);
  free(r->text.data);
  free(r->truncated);
  free(r);
  job->trace_render = NULL;
}

gs_trace_doc_t *gs__trace_doc_hold(gs_trace_doc_t *doc)
{
  doc->refs++;
  return doc;
}

void gs__trace_doc_release(void *arg)
{
  gs_trace_doc_t *doc = arg;

  if (--doc->refs)
    return;
  if (doc->mem)
    gs_mem_budget_store(doc->mem, 0, doc->size);
  if (gs_list_linked(&doc->orphan_node))
    gs_list_remove(&doc->orphan_node);
  free(doc->text);
  free(doc);
}

/* A document its job let go of while replies still hold it stays counted
 * until the last goes (each trace request may leave one: uncounted, they
 * would be a way to grow without bound); the jobs layer keeps them on a
 * list, to detach them from the budget when it is freed. */
void gs__trace_forget(gs_job_t *job)
{
  gs_trace_doc_t *doc = job->trace_doc;

  render_free(job);
  if (!doc)
    return;
  job->trace_doc = NULL;
  if (doc->refs > 1)
    gs_list_insert_tail(&job->jobs->trace_orphans, &doc->orphan_node);
  gs__trace_doc_release(doc); /* replies being written keep theirs */
}

void gs__trace_detach_all(gs_jobs_t *jobs)
{
  gs_list_t *first;

  while ((first = gs_list_first(&jobs->trace_orphans))) {
    gs_trace_doc_t *doc = GS_CONTAINER_OF(first, gs_trace_doc_t, orphan_node);

    if (doc->mem)
      gs_mem_budget_store(doc->mem, 0, doc->size);
    doc->mem = NULL;
    gs_list_remove(&doc->orphan_node);
  }
}

/* The first pass, for rank `rank`: its earliest span and its room. */
static void measure_rank(const gs_job_t *job, gs_trace_render_t *r, gradsync_Trace *t,
                         uint32_t rank)
{
  int64_t base;

  rank_part(job, rank, t);
  r->truncated[rank] = t->truncated;
  base = (int64_t)t->origin_us + job->ranks[rank]->clock.offset_us;
  for (pb_size_t i = 0; i < t->events_count; i++) {
    int64_t at = base + (int64_t)t->events[i].start_us;

    if (!r->any || at < r->origin)
      r->origin = at;
    r->any = true;
  }
  r->text.cap += RANK_TEXT_MAX + 6 * strlen(job->ranks[rank]->req.node) +
                 (size_t)t->events_count * SPAN_TEXT_MAX;
}

/* Between the passes: the room, within what jobs may store. */
static int make_room(gs_job_t *job, gs_trace_render_t *r)
{
  gs_mem_budget_t *mem = job->store.mem;
  size_t room = r->text.cap;

  r->text.cap = 0;
  if (mem && !gs_mem_budget_store_fits(mem, room))
    return GS_ELIMIT;
  r->text.data = malloc(room);
  if (!r->text.data)
    return GS_ENOMEM;
  r->text.cap = room;
  if (mem)
    gs_mem_budget_store(mem, room, 0);
  r->writing = true;
  r->next = 0;
  put(&r->text, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  return 0;
}

/* The second pass, for rank `rank`: its tracks and its spans, on the
 * shared clock, moved so that the earliest span of all is at time 0. */
static int write_rank(const gs_job_t *job, gs_trace_render_t *r, gradsync_Trace *t, uint32_t rank)
{
  const gs_member_t *m = job->ranks[rank];
  cJSON *name = cJSON_CreateStringReference(m->req.node);
  char *node = name ? cJSON_PrintUnformatted(name) : NULL; /* escaped */
  int64_t base;

  cJSON_Delete(name);
  if (!node)
    return GS_ENOMEM;
  rank_part(job, rank, t);
  if (rank)
    put(&r->text, ",");
  put_tracks(&r->text, rank, node);
  free(node);
  base = (int64_t)t->origin_us + m->clock.offset_us - r->origin;
  for (pb_size_t i = 0; i < t->events_count; i++)
    put_span(&r->text, rank, &t->events[i], base + (int64_t)t->events[i].start_us);
  return 0;
}

/* The document's end, and the document kept in the job (its room given
 * back but for what it holds). */
static int finish(gs_job_t *job, gs_trace_render_t *r)
{
  gs_mem_budget_t *mem = job->store.mem;
  uint32_t w = job->world_size;
  gs_buf_t *out = &r->text;
  gs_trace_doc_t *doc;
  uint8_t *fit;

  put(out,
      "],\"otherData\":{\"job\":\"%s\",\"trace_seq\":%" PRIu64 ",\"generation\":%" PRIu64
      ",\"steps\":%u,\"truncated\":[",
      job->name, job->trace_seq, job->generation, job->trace_steps);
  for (uint32_t rank = 0, n = 0; rank < w; rank++) {
    if (r->truncated[rank])
      put(out, "%s%u", n++ ? "," : "", rank);
  }
  /* Per rank, the round trip of the heartbeat its clock was aligned by:
   * its track is placed within half of it of the coordinator's clock. */
  put(out, "],\"clock_rtt_us\":[");
  for (uint32_t rank = 0; rank < w; rank++)
    put(out, "%s%" PRIu64, rank ? "," : "", job->ranks[rank]->clock.rtt_us);
  put(out, "]}}");
  if (out->len + 1 >= out->cap)
    return GS_EINTERNAL; /* the room was measured short */
  doc = calloc(1, sizeof(*doc));
  if (!doc)
    return GS_ENOMEM;
  fit = realloc(out->data, out->len + 1); /* what was measured is an upper bound */
  if (fit)
    out->data = fit;
  out->data[out->len] = '\0';
  *doc = (gs_trace_doc_t){.refs = 1,
                          .mem = mem,
                          .seq = r->seq,
                          .text = (char *)out->data,
                          .len = out->len,
                          .size = (fit ? out->len + 1 : out->cap) + sizeof(*doc)};
  if (mem)
    gs_mem_budget_store(mem, doc->size, out->cap);
  *out = (gs_buf_t){0};
  gs_list_init(&doc->orphan_node);
  gs__trace_forget(job);
  job->trace_doc = doc;
  render_free(job);
  return 0;
}

/* Renders the latest request's document for up to TRACE_SLICE_NS, from
 * where it stopped (started if none is under way); nothing while the last
 * slice's pause lasts. */
static int render_slice(gs_job_t *job)
{
  gs_trace_render_t *r = job->trace_render;
  uint64_t start = mono_ns(), until = start + TRACE_SLICE_NS;
  uint32_t w = job->world_size;
  gradsync_Trace *t;
  int err = 0;

  if (r && r->err)
    return r->err;
  /* At most half of the loop, however many GETs a turn answers. */
  if (start < job->jobs->trace_next_slice_ns)
    return 0;
  if (!r) {
    r = job->trace_render = calloc(1, sizeof(*r));
    if (r && !(r->truncated = calloc(w ? w : 1, sizeof(*r->truncated)))) {
      free(r);
      r = job->trace_render = NULL;
    }
    if (!r)
      return GS_ENOMEM;
    r->seq = job->trace_seq;
    r->text.cap = DOC_TEXT_MAX + strlen(job->name);
  }
  t = malloc(sizeof(*t));
  if (!t)
    return GS_ENOMEM;
  while (!err && mono_ns() < until) {
    if (!r->writing && r->next < w)
      measure_rank(job, r, t, r->next++);
    else if (!r->writing)
      err = make_room(job, r);
    else if (r->next < w)
      err = write_rank(job, r, t, r->next++);
    else {
      err = finish(job, r); /* frees r */
      break;
    }
  }
  free(t);
  job->jobs->trace_next_slice_ns = 2 * mono_ns() - start;
  if (err && job->trace_render) {
    job->trace_render->err = err; /* kept: the answer until the next request */
    free(job->trace_render->text.data);
    if (job->store.mem && job->trace_render->text.cap)
      gs_mem_budget_store(job->store.mem, 0, job->trace_render->text.cap);
    job->trace_render->text = (gs_buf_t){0};
  }
  return err;
}

/* Whether every rank of the generation the latest request asked has
 * published its part (have[r] says whose is in; count how many). */
static bool all_published(const gs_job_t *job, bool *have, uint32_t *count)
{
  uint32_t w = job->world_size;
  char key[64];

  *count = 0;
  for (uint32_t r = 0; job->trace_seq && job->trace_generation == job->generation && r < w; r++) {
    trace_key(job, r, key, sizeof(key));
    have[r] = job->ranks[r] && gs__store_find(&job->store, key);
    *count += have[r];
  }
  return w && *count == w;
}

void gs__trace_sweep(gs_job_t *job)
{
  uint32_t count;
  bool *have;

  if (!job->trace_render || job->trace_render->err)
    return;
  have = calloc(job->world_size ? job->world_size : 1, sizeof(*have));
  if (have && all_published(job, have, &count)) /* the parts are still there */
    render_slice(job);
  else
    render_free(job);
  free(have);
}

int gs__trace_document(gs_job_t *job, gs_trace_doc_t **doc, cJSON **pending)
{
  uint32_t w = job->world_size, count = 0;
  bool *have;
  int err = 0;

  *doc = NULL;
  *pending = NULL;
  if (job->trace_doc && job->trace_doc->seq == job->trace_seq) {
    *doc = job->trace_doc;
    return 0;
  }
  have = calloc(w ? w : 1, sizeof(*have));
  if (!have)
    return GS_ENOMEM;
  if (all_published(job, have, &count))
    err = render_slice(job);
  else
    render_free(job);
  if (!err && job->trace_doc && job->trace_doc->seq == job->trace_seq)
    *doc = job->trace_doc;
  else if (!err && !(*pending = pending_json(job, have, count)))
    err = GS_ENOMEM;
  free(have);
  return err;
}
