/* A backend's failure in words (gs__comm_fail, comm.h), and the argument
 * check every reduction makes first: below the backends, which call them,
 * and above nothing but the log. */
#include <stdarg.h>

#include "comm.h"
#include "why.h"

int gs__comm_check_reduction(gs_comm_t *comm, const char *what, const void *buf, size_t count,
                             gs_dtype_t dtype, gs_reduce_op_t op)
{
  if (gs_dtype_size(dtype) == 0 || (op != GS_REDUCE_SUM && op != GS_REDUCE_MEAN) ||
      (count && !buf) || count > SIZE_MAX / gs_dtype_size(dtype)) {
    GS_LOG_ERR(comm->log, "%s comm: %s of %zu %s (op %d): unsupported arguments", comm->ops->name,
               what, count, gs_dtype_name(dtype), (int)op);
    return GS_EINVAL;
  }
  return 0;
}

int gs__comm_fail(gs_comm_t *comm, int err, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs_set_whyv(comm->why, sizeof(comm->why), fmt, ap);
  va_end(ap);
  GS_LOG_ERR(comm->log, "%s comm: %s", comm->ops->name, comm->why);
  return err;
}
