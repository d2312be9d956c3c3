/* Session credentials: each member of a generation gets one when the
 * generation starts ("RANK." and 128 random bits in hex), in its
 * JoinResponse; every later call acting for a rank carries it in the
 * envelope, and the coordinator acts for the rank the session names, not
 * for what the request claims. A re-registration after a coordinator
 * restart presents the session it had; the coordinator keeps soft state
 * only, so it takes the first consistent claim (see rendezvous.c). */
#ifndef GS_SESSION_H
#define GS_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "job.h"
#include "responder.h"

/* Gives m a new session for its rank. */
void gs__session_issue(gs_member_t *m);

/* The rank a session names, or -1 for one that is not "RANK.hex". */
long gs__session_rank(const char *session);

/* The member of job's generation `generation` whose session is `session`,
 * or NULL (nothing answered). */
gs_member_t *gs__session_member(gs_job_t *job, const char *session, uint64_t generation);

/* The member of job's generation `generation` whose session the call
 * carries (rank `want_rank`, or any rank when it is negative); NULL after
 * answering the call with PERMISSION_DENIED. */
gs_member_t *gs__session_check(gs_job_t *job, const gs_call_t *call, uint64_t generation,
                               long want_rank);

/* Whether the call carries m's session (or is a node agent's beat on the
 * slot that carries m's heartbeats); answers PERMISSION_DENIED when not. */
bool gs__session_owns(const gs_member_t *m, const gs_call_t *call);

#endif
