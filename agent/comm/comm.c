/* Collective backends: creation by name, the reduce op names, and the thin
 * wrappers that dispatch through each backend's ops table. */
#include "comm.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

typedef struct backend {
  const char *name;
  gs_comm_t *(*create)(const gs_log_t *log);
} backend_t;

static const backend_t backends[] = {
    {"host", gs__comm_host_new},
#ifdef GS_HAVE_CUDA
    {"nccl", gs__comm_nccl_new},
#endif
};

#define BACKEND_COUNT (sizeof(backends) / sizeof(backends[0]))

static const char *const op_names[] = {"sum", "mean"};

int gs_reduce_op_parse(const char *s, gs_reduce_op_t *out)
{
  if (!s || !out)
    return GS_EINVAL;
  for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]); i++) {
    if (strcasecmp(s, op_names[i]) == 0) {
      *out = (gs_reduce_op_t)i;
      return 0;
    }
  }
  return GS_EINVAL;
}

const char *gs_reduce_op_name(gs_reduce_op_t op)
{
  if ((unsigned)op < sizeof(op_names) / sizeof(op_names[0]))
    return op_names[op];
  return "unknown";
}

/* Writes "a, b, c" (the known backend names) to out, for error messages. */
static void list_backends(char *out, size_t len)
{
  size_t n = 0;

  out[0] = '\0';
  for (size_t i = 0; i < BACKEND_COUNT && n < len; i++)
    n += snprintf(out + n, len - n, "%s%s", i ? ", " : "", backends[i].name);
}

gs_comm_t *gs_comm_new(const char *backend, const gs_log_t *log)
{
  char known[128];

  for (size_t i = 0; backend && i < BACKEND_COUNT; i++)
    if (strcmp(backend, backends[i].name) == 0)
      return backends[i].create(log);
  list_backends(known, sizeof(known));
  GS_LOG_ERR(log, "unknown collective backend '%s' (known: %s)", backend ? backend : "(null)",
             known);
  return NULL;
}

int gs_comm_listen(gs_comm_t *comm, const gs_comm_endpoint_t *ep, char *addr, size_t addr_len)
{
  if (!comm || !ep || !addr || addr_len == 0 || ep->port_min > ep->port_max)
    return GS_EINVAL;
  if (!comm->ops->listen) {
    addr[0] = '\0';
    return 0;
  }
  return comm->ops->listen(comm, ep, addr, addr_len);
}

const char *gs_comm_why(const gs_comm_t *comm)
{
  return comm ? comm->why : "";
}

int gs_comm_init(gs_comm_t *comm, const gs_comm_setup_t *setup)
{
  if (!comm || !setup)
    return GS_EINVAL;
  comm->gauge = setup->gauge;
  if (comm->gauge)
    atomic_store_explicit(&comm->gauge->done, 0, memory_order_relaxed);
  return comm->ops->init(comm, setup);
}

int gs_comm_make_id(gs_comm_t *comm, void *buf, size_t cap, size_t *len)
{
  if (!comm || !len)
    return GS_EINVAL;
  *len = 0;
  return comm->ops->make_id ? comm->ops->make_id(comm, buf, cap, len) : 0;
}

bool gs_comm_needs_id(const gs_comm_t *comm)
{
  return comm && comm->ops->make_id;
}

bool gs_comm_stream_ordered(const gs_comm_t *comm)
{
  return comm && comm->ops->stream_ordered;
}

uint64_t gs_comm_ticket(const gs_comm_t *comm)
{
  return comm ? comm->ticket : 0;
}

int gs_comm_order_after(gs_comm_t *comm, uint64_t ticket)
{
  if (!comm)
    return GS_EINVAL;
  return comm->ops->order_after ? comm->ops->order_after(comm, ticket) : 0;
}

int gs_comm_sync(gs_comm_t *comm)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->sync ? comm->ops->sync(comm) : 0;
  if (!err && comm->gauge)
    atomic_store_explicit(&comm->gauge->done, comm->ticket, memory_order_relaxed);
  return err;
}

int gs_comm_sync_until(gs_comm_t *comm, uint64_t until)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->sync_until ? comm->ops->sync_until(comm, until) : 0;
  if (!err && comm->gauge && comm->ops->stream_ordered)
    atomic_store_explicit(&comm->gauge->done, until < comm->ticket ? until : comm->ticket,
                          memory_order_relaxed);
  return err;
}

/* Gives the next collective its ticket; a blocking backend's collective is
 * complete when it returns, so it counts as done (a stream-ordered one's
 * at gs_comm_sync). Returns err. */
static int counted(gs_comm_t *comm, int err)
{
  comm->ticket++;
  if (!err && comm->gauge && !comm->ops->stream_ordered)
    atomic_store_explicit(&comm->gauge->done, comm->ticket, memory_order_relaxed);
  return err;
}

/* The backend sees the collective's ticket as comm->ticket during the call
 * (stream-ordered backends record its completion under that number). */
int gs_comm_allreduce(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype, gs_reduce_op_t op)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->allreduce(comm, buf, count, dtype, op);
  return counted(comm, err);
}

int gs_comm_broadcast(gs_comm_t *comm, void *buf, size_t bytes, uint32_t root)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->broadcast(comm, buf, bytes, root);
  return counted(comm, err);
}

gs_comm_shard_t gs_comm_shard(const gs_comm_t *comm, size_t count, uint32_t rank)
{
  return comm ? comm->ops->shard(comm, count, rank) : (gs_comm_shard_t){0, count};
}

size_t gs_comm_shard_room(const gs_comm_t *comm, size_t count)
{
  return comm ? comm->ops->shard_room(comm, count) : count;
}

int gs_comm_reduce_scatter(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype,
                           gs_reduce_op_t op)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->reduce_scatter(comm, buf, count, dtype, op);
  return counted(comm, err);
}

int gs_comm_allgather(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->allgather(comm, buf, count, dtype);
  return counted(comm, err);
}

int gs_comm_shard_pass(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype)
{
  int err;

  if (!comm)
    return GS_EINVAL;
  err = comm->ops->shard_pass(comm, buf, count, dtype);
  return counted(comm, err);
}

/* One ticket for the whole group. A backend without a group call
 * broadcasts the spans in turn, stopping at the first failure. */
int gs_comm_broadcast_group(gs_comm_t *comm, const gs_comm_span_t *spans, size_t n, uint32_t root)
{
  int err = 0;

  if (!comm || (n && !spans))
    return GS_EINVAL;
  if (comm->ops->broadcast_group)
    err = comm->ops->broadcast_group(comm, spans, n, root);
  else
    for (size_t i = 0; i < n && !err; i++)
      err = comm->ops->broadcast(comm, spans[i].buf, spans[i].bytes, root);
  return counted(comm, err);
}

void gs_comm_abort(gs_comm_t *comm)
{
  if (comm)
    comm->ops->abort(comm);
}

const char *gs_comm_name(const gs_comm_t *comm)
{
  return comm ? comm->ops->name : "none";
}

void gs_comm_destroy(gs_comm_t *comm)
{
  if (comm)
    comm->ops->destroy(comm);
}
