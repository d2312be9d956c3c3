/* Host backend, a link's slow path: exact small exchanges after the
 * handshake, the errors of a link and the comm's failure (sockets shut
 * down), and sleeping until a link can move (poll() on the sockets, the
 * abort eventfd and the shared-memory pipes' wake-up bytes). */
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

/* Milliseconds left of `timeout` since `since`, as a poll() timeout. */
int gs__host_wait_ms(uint64_t since, uint64_t timeout, uint64_t now)
{
  uint64_t spent = now - since;

  if (spent >= timeout)
    return 0;
  return timeout - spent > MAX_WAIT_MS ? MAX_WAIT_MS : (int)(timeout - spent);
}

/* Shuts both ring sockets down (the fds stay open until destroy), which
 * unblocks this rank's poll() and makes the neighbours fail promptly. */
void gs__host_shutdown_ring(host_comm_t *c)
{
  int fd = atomic_load(&c->next_fd);

  if (fd >= 0)
    shutdown(fd, SHUT_RDWR);
  fd = atomic_load(&c->prev_fd);
  if (fd >= 0)
    shutdown(fd, SHUT_RDWR);
}

/* Marks the comm broken by `err` (an abort wins) and shuts its sockets down
 * so that the neighbours fail promptly too. Returns the error to report. */
int gs__host_fail(host_comm_t *c, int err)
{
  if (gs__host_aborted(c))
    err = GS_EABORTED;
  c->err = err;
  gs__host_shutdown_ring(c);
  return err;
}

void gs__host_close_fd(int *fd)
{
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Converts a send/recv errno on the connection to `peer` into an error. */
int gs__host_io_error(host_comm_t *c, int errnum, uint32_t peer, const char *addr, const char *what)
{
  bool closed = errnum == 0 || errnum == ECONNRESET || errnum == EPIPE || errnum == ENOTCONN ||
                errnum == ESHUTDOWN || errnum == ECONNABORTED;

  if (gs__host_aborted(c))
    return GS_EABORTED;
  GS_LOG_ERR(c->base.log,
             "host comm: rank %" PRIu32 ": connection to rank %" PRIu32 " (%s) %s during %s",
             c->rank, peer, addr, errnum ? strerror(errnum) : "closed by the peer", what);
  return closed ? GS_ECLOSED : gs_err_from_errno(errnum);
}

/* Sends (out) or receives all len bytes on fd within the timeout,
 * watching for an abort: the small exchanges after the handshake. */
int gs__host_io_all(host_comm_t *c, int fd, uint8_t *buf, size_t len, bool out, const char *what)
{
  uint64_t start = gs_now_ms(), now;
  size_t done = 0;

  while (done < len) {
    ssize_t n = out ? send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, buf + done, len - done, MSG_DONTWAIT);
    struct pollfd pfd[2] = {{c->wake_fd, POLLIN, 0}, {fd, out ? POLLOUT : POLLIN, 0}};

    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return gs__host_io_error(c, n == 0 ? 0 : errno, out ? c->next : c->prev,
                               out ? c->next_addr : c->prev_addr, what);
    if (gs__host_aborted(c))
      return GS_EABORTED;
    now = gs_now_ms();
    if (now - start >= c->timeout_ms) {
      GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": no answer for %" PRIu64 " ms in %s",
                 c->rank, c->timeout_ms, what);
      return GS_ETIMEDOUT;
    }
    (void)poll(pfd, 2, gs__host_wait_ms(start, c->timeout_ms, now));
  }
  return 0;
}

int gs__host_xfer_timeout(host_comm_t *c, const xfer_t *x)
{
  GS_LOG_ERR(c->base.log,
             "host comm: rank %" PRIu32 ": no progress for %" PRIu64
             " ms in %s (sent %zu/%zu bytes to rank %" PRIu32
             " at %s, received %zu/%zu from rank %" PRIu32 " at %s)",
             c->rank, c->timeout_ms, x->what, x->sent, x->send_len, c->next, c->next_addr, x->recvd,
             x->recv_len, c->prev, c->prev_addr);
  return GS_ETIMEDOUT;
}

/* Reads and drops the wake-up bytes a link's socket holds: 0, 1 when the
 * peer has closed it, or a negative error. */
static int drain_wakes(host_comm_t *c, int fd, uint32_t peer, const char *addr, const char *what)
{
  uint8_t junk[64];
  ssize_t n;

  while ((n = recv(fd, junk, sizeof(junk), MSG_DONTWAIT)) > 0)
    ;
  if (n == 0)
    return 1;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    return 0;
  return gs__host_io_error(c, errno, peer, addr, what);
}

/* Shared-memory links: sleeps in poll() until a wake-up byte, the abort
 * eventfd, a peer's hang-up or the timeout, after telling each pipe this
 * side waits on that it sleeps (and not at all when data or space came
 * meanwhile). Both sockets are watched whether or not they carry a pipe:
 * a peer that dies closes them, which poll() reports as a hang-up. */
int gs__host_sleep_on_pipes(host_comm_t *c, xfer_t *x, int timeout_ms)
{
  bool want_in = x->recvd < x->recv_len, want_out = x->sent < gs__host_send_limit(x),
       stay_awake = false;
  int next = c->next_gone ? -1 : atomic_load(&c->next_fd); /* poll() skips -1 */
  int prev = c->prev_gone ? -1 : atomic_load(&c->prev_fd), err = 0;
  /* Hang-ups are reported whatever the events asked for. A TCP link's
   * socket is watched for its data only when that data is wanted. */
  struct pollfd pfd[3] = {
      {c->wake_fd, POLLIN, 0},
      {next, (short)((c->out_pipe ? POLLIN : 0) | (want_out && !c->out_pipe ? POLLOUT : 0)), 0},
      {prev, (short)(c->in_pipe || want_in ? POLLIN : 0), 0}};

  if (want_in && c->in_pipe && !gs__shm_reader_may_sleep(c->in_pipe))
    return 0;
  if (want_in && c->in_pipe && c->prev_gone) { /* empty, and nobody left to fill it */
    gs__shm_reader_awake(c->in_pipe);
    return gs__host_io_error(c, 0, c->prev, c->prev_addr, x->what);
  }
  if (want_out && c->out_pipe && c->next_gone) /* the reader is gone, not done with us */
    err = gs__host_io_error(c, 0, c->next, c->next_addr, x->what);
  else if (want_out && c->out_pipe)
    stay_awake = !gs__shm_writer_may_sleep(c->out_pipe);
  if (err || stay_awake) {
    if (c->in_pipe)
      gs__shm_reader_awake(c->in_pipe);
    return err;
  }
  if (poll(pfd, 3, timeout_ms) < 0 && errno != EINTR) {
    GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": poll: %s", c->rank, strerror(errno));
    err = GS_EIO;
  }
  if (c->in_pipe)
    gs__shm_reader_awake(c->in_pipe);
  if (c->out_pipe)
    gs__shm_writer_awake(c->out_pipe);
  /* Without a pipe, next carries nothing inbound and prev the data itself:
   * the loop's send and recv see what happened to them. */
  if (!err && c->out_pipe && next >= 0 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
    err = drain_wakes(c, next, c->next, c->next_addr, x->what);
    c->next_gone = err == 1;
    if (err == 1)
      err = want_out ? gs__host_io_error(c, 0, c->next, c->next_addr, x->what) : 0;
  }
  if (!err && c->in_pipe && prev >= 0 && (pfd[2].revents & (POLLIN | POLLHUP | POLLERR))) {
    err = drain_wakes(c, prev, c->prev, c->prev_addr, x->what);
    c->prev_gone = err == 1;
    if (err == 1)
      err = 0; /* what it wrote may still be in the pipe: see prev_gone */
  }
  return err;
}
