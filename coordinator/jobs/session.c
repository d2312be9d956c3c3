/* Session credentials (session.h). */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "invariant.h"
#include "rng.h"
#include "wire.h"

#define SESSION_BYTES 16

void gs__session_issue(gs_member_t *m)
{
  uint8_t r[SESSION_BYTES];
  int n = snprintf(m->session, sizeof(m->session), "%u.", m->rank);

  /* getrandom does not fail for 16 bytes once the pool is ready; should
   * it, a mix of the clock and the address is no worse than a guess. */
  if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
    uint64_t a = gs_mix64(gs_now_ns() ^ (uintptr_t)m), b = gs_mix64(a ^ m->rank);

    memcpy(r, &a, 8);
    memcpy(r + 8, &b, 8);
  }
  for (int i = 0; i < SESSION_BYTES && n > 0; i++)
    n += snprintf(m->session + n, sizeof(m->session) - (size_t)n, "%02x", r[i]);
  /* Every check of a call reads the rank back out of the session. */
  GS_ASSERT(gs__session_rank(m->session) == (long)m->rank);
}

long gs__session_rank(const char *session)
{
  char *end;
  long r;

  if (!session || session[0] < '0' || session[0] > '9')
    return -1;
  r = strtol(session, &end, 10);
  return *end == '.' && strlen(end + 1) == 2 * SESSION_BYTES && r >= 0 ? r : -1;
}

/* Equality of two sessions in time that does not depend on where they
 * differ. */
static bool same(const char *a, const char *b)
{
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = la != lb;

  for (size_t i = 0; i < la; i++)
    d |= (unsigned char)a[i] ^ (unsigned char)(i < lb ? b[i] : 0);
  return d == 0;
}

gs_member_t *gs__session_member(gs_job_t *job, const char *session, uint64_t generation)
{
  long r = gs__session_rank(session);
  gs_member_t *m = r >= 0 && (uint64_t)r < job->world_size && job->ranks ? job->ranks[r] : NULL;

  if (!m || m->generation != generation || !same(m->session, session))
    return NULL;
  /* The rank table and the session agree: a session is issued to its rank. */
  GS_ASSERT(m->rank == (uint32_t)r && m->job == job);
  return m;
}

gs_member_t *gs__session_check(gs_job_t *job, const gs_call_t *call, uint64_t generation,
                               long want_rank)
{
  long r = gs__session_rank(call->session);
  gs_member_t *m = r >= 0 && (uint64_t)r < job->world_size && job->ranks ? job->ranks[r] : NULL;

  if (gs__session_member(job, call->session, generation) && (want_rank < 0 || r == want_rank))
    return m;
  gs__respond_error(job->jobs->responder, call->peer->id, call->method, call->request_id, GS_EPERM,
                    "%s for job %s generation %llu: %s", gs_method_name(call->method), job->name,
                    (unsigned long long)generation,
                    !call->session || !call->session[0]     ? "no session (Join first)"
                    : m && want_rank >= 0 && r != want_rank ? "only rank 0's session may do this"
                                                            : "not a session of this generation");
  return NULL;
}

bool gs__session_owns(const gs_member_t *m, const gs_call_t *call)
{
  bool none = !call->session || !call->session[0];

  if (!none && same(m->session, call->session))
    return true;
  /* A node agent's slot that carries the rank's heartbeats already (its
   * first beat showed the session) speaks for it without. */
  if (none && call->news_only && m->peer == call->peer && m->heartbeats_seen)
    return true;
  gs__respond_error(m->job->jobs->responder, call->peer->id, call->method, call->request_id,
                    GS_EPERM, "%s for rank %u of job %s: %s", gs_method_name(call->method), m->rank,
                    m->job->name, none ? "no session (Join first)" : "not that rank's session");
  return false;
}
