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

/* Stamps *at_us (m's heartbeat's arrival or reply) with the responder's
 * fresh clock, or `now_ms` without one. */
void gs__trace_stamp(const gs_member_t *m, uint64_t *at_us, uint64_t now_ms);

/* A heartbeat's clock sample (its agent's send and reply times of the
 * previous heartbeat, the coordinator's of the same one): keeps the
 * offset of the sample with the shortest round trip. Called before the
 * member's heartbeat times are moved on to this heartbeat. */
void gs__trace_clock_sample(gs_member_t *m, uint64_t agent_sent_us, uint64_t agent_replied_us);

/* The latest request's trace: once every rank of the generation published
 * its part, the Chrome trace-event document in *doc (JSON text), rendered
 * at the first call and kept in the job until the next request or the job
 * is freed, counted in what jobs store (a 1,024-rank job's makes tens of
 * MB: rendered per request it held the loop for seconds); else what is
 * still missing in *pending (caller frees with cJSON_Delete). GS_ELIMIT
 * when the document would pass what jobs may store, GS_ENOMEM. */
int gs__trace_document(gs_job_t *job, const gs_buf_t **doc, cJSON **pending);
/* Frees the kept document (and gives it back to the budget). */
void gs__trace_forget(gs_job_t *job);

#endif
