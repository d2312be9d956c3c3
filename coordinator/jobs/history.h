/* The history of a job's generations, for /jobs/NAME and the regroup
 * counters of /metrics: when each started, its world, the step it
 * continued from, the time lost before it and why it ended. A ring of the
 * latest GS_JOB_HISTORY (job.h). */
#ifndef GS_HISTORY_H
#define GS_HISTORY_H

#include "job.h"

/* A generation started or ended at `now` (the history /jobs/NAME shows,
 * and the regroup counters). */
void gs__generation_started(gs_job_t *job, uint64_t now);
void gs__generation_ended(gs_job_t *job, uint64_t now, const char *reason);
/* Adds a rank lost as the current generation ended to its list
 * ("rank 2 (node ...) lost: connection closed"). */
void gs__generation_note(gs_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Why the generation before the current one ended, for the Join replies:
 * the ranks it lost, else what ended it ("" for none). */
const char *gs__generation_previous_end(const gs_job_t *job);

#endif
