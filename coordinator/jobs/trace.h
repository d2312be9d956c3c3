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

/* The latest request's trace (caller frees with cJSON_Delete): the Chrome
 * trace-event document once every rank of the generation published its
 * part (*complete true), else what is still missing. NULL when out of
 * memory. */
cJSON *gs__trace_json(const gs_job_t *job, bool *complete);

#endif
