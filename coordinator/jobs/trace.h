/* Step timelines (POST /jobs/NAME/trace, asked with gs__jobs_trace): the
 * clock offsets that align what the ranks record, and the merged Chrome
 * trace-event JSON (docs/guide/stuck.md, "A step
 * timeline"). */
#ifndef GS_TRACE_H
#define GS_TRACE_H

#include <cJSON.h>

#include "job.h"

/* The most steps one request may ask for. */
#define GS_TRACE_MAX_STEPS 100

/* Stamps m's heartbeat's arrival, or its reply, with the responder's
 * fresh clock (`now_ms` without one); a reply made at once takes the
 * arrival's time. */
void gs__trace_arrived(gs_member_t *m, uint64_t now_ms);
void gs__trace_replied(gs_member_t *m, uint64_t now_ms);
void gs__trace_replied_at_once(gs_member_t *m);

/* A heartbeat's clock sample (its agent's send and reply times of the
 * previous heartbeat, the coordinator's of the same one): keeps the
 * offset of the sample with the shortest round trip. Called before the
 * member's heartbeat times are moved on to this heartbeat. */
void gs__trace_clock_sample(gs_member_t *m, uint64_t agent_sent_us, uint64_t agent_replied_us);

/* A merged trace: JSON text, shared by the job that keeps it and the
 * replies being written (each holds a reference). */
struct gs_trace_doc {
  uint32_t refs;
  gs_mem_budget_t *mem;  /* counted in, until freed (NULL: detached) */
  gs_list_t orphan_node; /* on gs_jobs.trace_orphans once its job let go of it */
  uint64_t seq;          /* the request it answers (gs_job.trace_seq) */
  char *text;            /* NUL-terminated */
  size_t len;
  size_t size; /* what it holds, as counted in the budget */
};

/* The latest request's trace: once every rank of the generation published
 * its part and it is rendered, the Chrome trace-event document in *doc,
 * rendered in slices of at most 5 ms of the loop from the first call on
 * (each call and each sweep renders one), kept in the job until the next
 * request or the job is freed,
 * counted in what jobs store (a 1,024-rank job's makes tens of MB:
 * rendered per request it held the loop for seconds, and copied per
 * request, 20 clients asking for a 10 MB one held it as much); a reply
 * takes a reference (gs__trace_doc_hold, released by
 * gs__trace_doc_release). Else what is still missing in *pending (caller
 * frees with cJSON_Delete). GS_ELIMIT when the document would pass what
 * jobs may store, GS_ENOMEM. */
int gs__trace_document(gs_job_t *job, gs_trace_doc_t **doc, cJSON **pending);
gs_trace_doc_t *gs__trace_doc_hold(gs_trace_doc_t *doc);
typedef struct gs_trace_render gs_trace_render_t;
void gs__trace_doc_release(void *doc);
/* The job lets go of its document, or of the one being rendered (and
 * gives it back to the budget). */
void gs__trace_forget(gs_job_t *job);
/* The sweep: the document under way is rendered a slice further. */
void gs__trace_sweep(gs_job_t *job);
/* The jobs layer is freed: documents replies still hold count no more. */
void gs__trace_detach_all(gs_jobs_t *jobs);

#endif
