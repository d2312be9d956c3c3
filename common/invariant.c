/* A broken invariant (invariant.h). */
#include "invariant.h"

#include <stdio.h>
#include <stdlib.h>

void gs__invariant_broken(const char *cond, const char *file, int line, const char *func)
{
  fprintf(stderr, "gradsync: invariant broken at %s:%d (%s): %s\n", file, line, func, cond);
  fflush(stderr);
  abort();
}
