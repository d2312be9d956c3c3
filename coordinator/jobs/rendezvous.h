/* Rendezvous: agents join a job until its world is complete, then get
 * ranks (sorted by node, then local rank) and the next generation starts.
 * Also re-registration: an agent that already has a rank registers again
 * after a coordinator restart, and the job is rebuilt from the agents. */
#ifndef GS_RENDEZVOUS_H
#define GS_RENDEZVOUS_H

#include <stdbool.h>

#include "job.h"

/* Checks what a Join must hold whatever its job; answers and returns false
 * when it does not. */
bool gs__rendezvous_check(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_JoinRequest *req);
/* A Join (or a rejoin) of `job`: answered at once, or parked until the
 * world is complete or a deadline passes. */
void gs__rendezvous_join(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req);
/* A waiting member's connection closed: it leaves the rendezvous. */
void gs__rendezvous_drop(gs_job_t *job, gs_member_t *m);
/* Ends the rendezvous and Join deadlines that have passed. */
void gs__rendezvous_sweep(gs_job_t *job, uint64_t now);
/* Ends the rendezvous: every waiting Join is answered with `err` and
 * `msg` (err 0: not answered, at shutdown). */
void gs__rendezvous_cancel(gs_job_t *job, int err, const char *msg);

#endif
