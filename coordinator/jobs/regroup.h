/* Elastic membership: a job of world_min..world_max ranks. When a rank of
 * a running generation is lost, the generation ends and its survivors come
 * back with their state (a Join with has_state, carrying the session of the
 * ended generation); the next generation starts as soon as every survivor
 * is back or gone, with at least world_min ranks, and takes its state from
 * the rank at the newest step. An agent joining a running generation below
 * world_max waits in the rendezvous while the regroup directive asks rank 0
 * to have every rank regroup after the same step. */
#ifndef GS_REGROUP_H
#define GS_REGROUP_H

#include <stdbool.h>

#include "job.h"

/* How long a first elastic rendezvous with at least world_min agents waits
 * for more after the latest Join (later ones still join by a regroup). */
#define GS_REGROUP_SETTLE_MS 2000

static inline bool gs__job_elastic(const gs_job_t *job)
{
  return job->world_min > 0;
}

/* A Join with state: the call's session names a member of the job's
 * current generation, which ends now if it still runs (for the reason the
 * member gives), and the member counts as back. False after answering the
 * call when the session names no such member (it joins afresh). */
bool gs__regroup_survivor(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req);

/* A new agent asks to join while a generation runs: whether it may wait
 * for the next (the job is elastic and below world_max, counting those
 * already waiting). */
bool gs__regroup_has_room(const gs_job_t *job);
/* A new agent waits for the running generation: the regroup directive
 * asks its ranks to regroup after one step. */
void gs__regroup_request(gs_job_t *job);

/* Whether the rendezvous gathered enough: a fixed world all world_size; an
 * elastic one world_max, or at least world_min once every survivor is
 * back or gone (a first rendezvous: once no Join came for
 * GS_REGROUP_SETTLE_MS). */
bool gs__regroup_ready(const gs_job_t *job, uint64_t now);

/* Survivors not back by the deadline are lost. */
void gs__regroup_sweep(gs_job_t *job, uint64_t now);

/* Before the rendezvous completes: which member's state every rank takes
 * (the lowest rank at the newest step; none when no member has state).
 * `ranks` are sorted, n of them. */
void gs__regroup_choose_state(gs_job_t *job, gs_member_t *const *ranks, uint32_t n);

#endif
