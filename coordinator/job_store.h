/* What a generation of a job stores for its ranks: small blobs (Publish,
 * Fetch), the pack list, and the requests parked until these exist. */
#ifndef GS_JOB_STORE_H
#define GS_JOB_STORE_H

#include "job.h"

/* Drops the blobs, the pack list and any parked request (answered ABORTED)
 * when a generation ends. */
void gs__job_store_reset(gs_job_t *job);
/* Answers every parked request with `code` and `msg`. */
void gs__job_store_fail_waiters(gs_job_t *job, int code, const char *msg);
/* Answers parked requests whose deadline has passed. */
void gs__job_store_sweep(gs_job_t *job, uint64_t now);

#endif
