/* A backend's failure in words (gs__comm_fail, comm.h): below the
 * backends, which call it, and above nothing but the log. */
#include <stdarg.h>

#include "comm.h"
#include "why.h"

int gs__comm_fail(gs_comm_t *comm, int err, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs_set_whyv(comm->why, sizeof(comm->why), fmt, ap);
  va_end(ap);
  GS_LOG_ERR(comm->log, "%s comm: %s", comm->ops->name, comm->why);
  return err;
}
