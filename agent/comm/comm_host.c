/* Host collective backend: ring reduce-scatter + allgather, and a chain
 * broadcast, over TCP between agents (docs/design.md, "Data plane"),
 * with shared-memory pipes between ranks of one machine. This file is the
 * backend object (create, abort, destroy); host_internal.h says
 * what the other files do. */
#include "host_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

/* Safe from any thread: sets the flag, wakes poll() through the eventfd and
 * shuts the sockets down (the fds stay open until destroy). */
static void host_abort(gs_comm_t *base)
{
  host_comm_t *c = (host_comm_t *)base;
  uint64_t one = 1;

  atomic_store(&c->aborted, true);
  if (write(c->wake_fd, &one, sizeof(one)) < 0) {
    /* EAGAIN: the counter is already far from zero, which is all we need. */
  }
  gs__host_shutdown_ring(c);
}

static void host_destroy(gs_comm_t *base)
{
  host_comm_t *c = (host_comm_t *)base;
  int fd;

  fd = atomic_load(&c->next_fd);
  gs__host_close_fd(&fd);
  fd = atomic_load(&c->prev_fd);
  gs__host_close_fd(&fd);
  gs__host_close_fd(&c->listen_fd);
  gs__host_close_fd(&c->wake_fd);
  gs__shm_close(c->out_pipe);
  gs__shm_close(c->in_pipe);
  free(c->scratch);
  free(c->gather);
  free(c);
}

static const gs_comm_ops_t host_ops = {
    .name = "host",
    .listen = gs__host_listen,
    .init = gs__host_init,
    .allreduce = gs__host_allreduce,
    .broadcast = gs__host_broadcast,
    .shard = gs__host_shard,
    .shard_room = gs__host_shard_room,
    .reduce_scatter = gs__host_reduce_scatter,
    .allgather = gs__host_allgather,
    .shard_pass = gs__host_shard_pass,
    .abort = host_abort,
    .destroy = host_destroy,
};

gs_comm_t *gs__comm_host_new(const gs_log_t *log)
{
  host_comm_t *c = calloc(1, sizeof(*c));

  if (!c) {
    GS_LOG_ERR(log, "host comm: out of memory");
    return NULL;
  }
  c->base.ops = &host_ops;
  c->base.log = log;
  atomic_init(&c->aborted, false);
  atomic_init(&c->next_fd, -1);
  atomic_init(&c->prev_fd, -1);
  c->listen_fd = -1;
  c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->wake_fd < 0) {
    GS_LOG_ERR(log, "host comm: eventfd: %s", strerror(errno));
    free(c);
    return NULL;
  }
  return &c->base;
}
