/* The step timeline (POST /jobs/NAME/trace): when the coordinator's
 * trace_seq directive grows, this rank records its next trace_steps steps,
 * the spans of its training thread's phases and of the collectives its
 * comm thread runs, and publishes them as a Trace blob of its generation
 * ("trace.SEQ.RANK") for the coordinator to merge (coordinator/jobs/
 * trace.c). Off, it costs one relaxed load per phase change and per
 * collective. Spans go into fixed arrays allocated when a recording
 * starts; what does not fit a blob is left out and said so. */
#include "engine_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "wire.h"

#define MAX_SPANS (sizeof(((gradsync_Trace *)0)->events) / sizeof(gradsync_TraceEvent))
#define BLOB_MAX 16384 /* PublishRequest.value */

uint64_t gs__trace_now(const gs_engine_t *e)
{
  return atomic_load_explicit(&e->trace.on, memory_order_relaxed) ? gs_now_ns() / 1000 : 0;
}

/* Adds a span to `list` (the training thread's or the comm's) if it has
 * room; a full list marks the trace truncated. */
static void add_span(trace_rec_t *t, gradsync_TraceEvent *list, _Atomic uint32_t *n,
                     const gradsync_TraceEvent *ev)
{
  uint32_t i = atomic_load_explicit(n, memory_order_relaxed);

  if (i >= MAX_SPANS / 2) {
    t->truncated = true;
    return;
  }
  list[i] = *ev;
  atomic_store_explicit(n, i + 1, memory_order_release);
}

void gs__trace_phase_end(gs_engine_t *e, uint32_t phase, uint32_t pack)
{
  trace_rec_t *t = &e->trace;
  uint64_t now = gs_now_ns() / 1000;
  gradsync_TraceEvent ev = {
      .phase = (gradsync_Phase)phase,
      .pack = pack,
      /* The data phase comes before the step it feeds. */
      .step = e->steps_begun + (phase == GS_PHASE_DATA ? 1 : 0),
      .start_us = t->since_us - t->origin_us,
      .dur_us = (uint32_t)(now - t->since_us),
  };

  if (phase != GS_PHASE_IDLE)
    add_span(t, t->main, &t->nmain, &ev);
  t->since_us = now;
}

void gs__trace_collective(gs_engine_t *e, const comm_job_t *job, uint64_t start_us)
{
  trace_rec_t *t = &e->trace;
  uint32_t pack = 0;
  bool of_pack = gs__comm_thread_pack_of(&e->ct, job, &pack);
  gradsync_TraceEvent ev = {
      .phase = of_pack ? gradsync_Phase_PHASE_ALLREDUCE : gradsync_Phase_PHASE_SYNC,
      .pack = pack,
      .step = e->steps_begun,
      .start_us = start_us - t->origin_us,
      .dur_us = (uint32_t)(gs_now_ns() / 1000 - start_us),
      .comm = true,
  };

  if (start_us >= t->origin_us)
    add_span(t, t->comm, &t->ncomm, &ev);
}

static void start(gs_engine_t *e, uint64_t seq, uint32_t steps)
{
  trace_rec_t *t = &e->trace;

  if (!t->main)
    t->main = calloc(MAX_SPANS, sizeof(*t->main)); /* both halves */
  if (!t->main) {
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "trace %" PRIu64 ": out of memory; not recorded", seq);
    return;
  }
  t->comm = t->main + MAX_SPANS / 2;
  t->seq = seq;
  t->steps_left = steps ? steps : 1;
  t->truncated = false;
  atomic_store(&t->nmain, 0);
  atomic_store(&t->ncomm, 0);
  t->origin_us = t->since_us = gs_now_ns() / 1000;
  atomic_store_explicit(&t->on, true, memory_order_release);
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
         "trace %" PRIu64 ": recording the next %u step(s)", seq, t->steps_left);
}

/* Encodes the spans into `out`, leaving the last ones out until it fits
 * one blob. */
static int encode(gs_engine_t *e, gradsync_Trace *msg, gs_buf_t *out)
{
  trace_rec_t *t = &e->trace;
  uint32_t nm = atomic_load(&t->nmain), nc = atomic_load(&t->ncomm);

  *msg = (gradsync_Trace){.seq = t->seq,
                          .rank = gs__membership_rank(&e->member),
                          .origin_us = t->origin_us,
                          .truncated = t->truncated};
  memcpy(msg->events, t->main, nm * sizeof(*t->main));
  memcpy(msg->events + nm, t->comm, nc * sizeof(*t->comm));
  msg->events_count = nm + nc;
  for (;;) {
    out->len = 0;
    if (gs_wire_encode(out, gradsync_Trace_fields, msg))
      return GS_ENOMEM;
    if (out->len <= BLOB_MAX)
      return 0;
    msg->events_count -= msg->events_count / 8 + 1;
    msg->truncated = true;
  }
}

static void publish(gs_engine_t *e)
{
  trace_rec_t *t = &e->trace;
  gradsync_Trace *msg = malloc(sizeof(*msg));
  gs_buf_t out = {0};
  char key[64];
  int err;

  atomic_store_explicit(&t->on, false, memory_order_relaxed);
  snprintf(key, sizeof(key), "trace.%" PRIu64 ".%u", t->seq, gs__membership_rank(&e->member));
  err = msg ? encode(e, msg, &out) : GS_ENOMEM;
  if (!err)
    err = gs_client_publish(e->client, gs__membership_generation(&e->member), key, out.data,
                            out.len, e->cfg.rpc_timeout_ms);
  if (err)
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "trace %" PRIu64 ": could not publish it: %s", t->seq,
           err == GS_ENOMEM ? "out of memory" : gs_client_error(e->client));
  else
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
           "trace %" PRIu64 ": %u span(s) published%s", t->seq, (unsigned)msg->events_count,
           msg->truncated ? " (the last left out: more than one blob holds)" : "");
  gs_buf_free(&out);
  free(msg);
}

void gs__trace_step_end(gs_engine_t *e)
{
  trace_rec_t *t = &e->trace;
  gs_directives_t d;

  if (atomic_load_explicit(&t->on, memory_order_relaxed)) {
    if (--t->steps_left == 0)
      publish(e);
    return;
  }
  if (!e->hb)
    return;
  gs_heartbeat_directives(e->hb, &d);
  if (!d.valid)
    return;
  /* A restarted coordinator counts from zero again: what its directives
   * ask for was asked before, of the ranks it knew. */
  if (d.coordinator_id != t->coordinator_id) {
    t->coordinator_id = d.coordinator_id;
    t->seen_seq = d.trace_seq;
    return;
  }
  if (d.trace_seq > t->seen_seq) {
    t->seen_seq = d.trace_seq;
    start(e, d.trace_seq, d.trace_steps);
  }
}

void gs__trace_joined(gs_engine_t *e)
{
  /* Requests made before this Join were for the ranks before it; one
   * made after it comes with a heartbeat's directives, however soon. */
  e->trace.coordinator_id = gs__membership_join(&e->member)->coordinator_id;
  e->trace.seen_seq = gs__membership_join(&e->member)->trace_seq;
}

void gs__trace_free(gs_engine_t *e)
{
  free(e->trace.main);
  e->trace.main = e->trace.comm = NULL;
}
