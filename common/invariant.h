/* Invariants stated in the code, as libuv states its own with assert(),
 * but kept in release builds: GS_ASSERT(cond) ends the process with the
 * file, line, function and condition when a rule the code relies on is
 * broken, where going on would corrupt state silently (a pack offset past
 * its pack, a ring segment past the world, a budget handing back more
 * than it counted, a waiting member out of its list). Only where the check
 * is a comparison or two on a path that does far more. */
#ifndef GS_INVARIANT_H
#define GS_INVARIANT_H

#define GS_ASSERT(cond)                                                                            \
  ((cond) ? (void)0 : gs__invariant_broken(#cond, __FILE__, __LINE__, __func__))

/* Writes "gradsync: invariant broken at FILE:LINE (FUNC): COND" to stderr
 * and aborts. */
void gs__invariant_broken(const char *cond, const char *file, int line, const char *func)
    __attribute__((noreturn, cold));

#endif
