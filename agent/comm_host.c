/* Host collective backend: ring reduce-scatter + allgather, and a chain
 * broadcast, over TCP between agents (DESIGN.md "Collective backends").
 * Large allreduces pipeline the ring's steps into one transfer (ring_t);
 * small ones gather every rank's buffer around the ring and add in rank
 * order. Waits retry briefly before they sleep in poll() (SPIN_NS). The
 * measurements behind the constants: docs/performance.md, "Host allreduce".
 *
 * Each rank holds two connections: the one it dialed to the next rank in the
 * ring (data only ever goes out on it) and the one it accepted from the
 * previous rank (data only ever comes in on it). Sockets are non-blocking and
 * driven by poll(), which also watches an eventfd that gs_comm_abort writes,
 * so an abort from another thread wakes every wait. Every step's byte counts
 * are known to both sides in advance, so the stream needs no framing. */
#include "comm.h"
#include "comm_shm.h"
#include "vectorize.h"
#include "clock.h"
#include "byteorder.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HELLO_MAGIC 0x47534843u /* "GSHC" */
#define HELLO_VERSION 1u
#define HELLO_ACCEPTED 1u /* flag in the acceptor's reply */
#define HELLO_LEN 24
/* Unit of receive-then-reduce; a multiple of every element size. */
#define CHUNK_BYTES (256u * 1024u)
#define SOCK_BUF_BYTES (4 * 1024 * 1024)
/* Rings of three or more shrink the buffers to this once connected: more
 * ranks than cores keep more bytes in flight than the caches hold, and
 * smaller buffers measured faster there (docs/performance.md, "Host allreduce"). */
#define SOCK_BUF_MANY_BYTES (1024 * 1024)
#define RETRY_MS 25
#define MAX_PENDING 8 /* accepted connections that have not sent their hello yet */
#define ADDR_MAX 160
#define MAX_WAIT_MS 60000 /* longest single poll(); waits are re-armed after */
/* A step with nothing to do keeps retrying (yielding the CPU between tries)
 * this long before it sleeps in poll(): on loopback a wake-up from poll()
 * costs tens of microseconds, a retry about one. */
#define SPIN_NS 50000u
/* Allreduces of at most this many bytes gather every rank's whole buffer
 * around the ring (W-1 steps) instead of reduce-scatter + allgather
 * (2(W-1) steps of 1/W of it): fewer steps win while latency dominates.
 * Two ranks move the same bytes either way, and the pipelined ring won
 * from 64 KiB there; larger rings pay more per step. */
#define SMALL_BYTES_TWO (32u * 1024u)
#define SMALL_BYTES_MANY (64u * 1024u)

typedef struct host_comm {
  gs_comm_t base;
  atomic_bool aborted;
  atomic_int next_fd; /* dialed to rank+1: published after the handshake, closed by destroy */
  atomic_int prev_fd; /* accepted from rank-1: likewise */
  int wake_fd;        /* eventfd, readable once aborted */
  int listen_fd;
  int err; /* sticky error of a failed init or operation */
  bool init_called, ready;
  uint32_t rank, world, next, prev;
  uint64_t generation, timeout_ms;
  char next_addr[ADDR_MAX], prev_addr[ADDR_MAX];
  uint8_t *scratch; /* CHUNK_BYTES: one received chunk before it is reduced */
  uint8_t *gather;  /* small allreduces: every rank's buffer, rank order */
  size_t gather_cap;
  /* Same-host links carry their bytes through shared memory (comm_shm.h);
   * the sockets then carry only wake-up bytes. NULL: the link is TCP. */
  gs_shm_pipe_t *out_pipe; /* to next */
  gs_shm_pipe_t *in_pipe;  /* from prev */
  /* A pipe link's peer closed its socket: a writer that is done may exit
   * while its last bytes still wait in the pipe, so this is an error only
   * once more bytes are needed than the pipe holds (or must be written). */
  bool next_gone, prev_gone;
} host_comm_t;

/* The handshake, both ways: the dialer's hello, then the acceptor's reply
 * (the same layout, with HELLO_ACCEPTED set if it keeps the connection). */
typedef struct hello {
  uint32_t magic;
  uint16_t version, flags;
  uint32_t rank, world;
  uint64_t generation;
} hello_t;

typedef enum dial_state {
  DIAL_WAIT,       /* no socket; connect at retry_at */
  DIAL_CONNECTING, /* connect() in progress */
  DIAL_HELLO,      /* sending our hello */
  DIAL_REPLY,      /* reading the acceptor's reply */
  DIAL_DONE,       /* fd published as next_fd */
} dial_state_t;

typedef struct dial {
  struct sockaddr_storage sa;
  socklen_t salen;
  int fd;
  dial_state_t state;
  uint64_t retry_at;
  size_t off;
  int last_errno;
  uint8_t out[HELLO_LEN], in[HELLO_LEN];
} dial_t;

typedef struct pending {
  int fd;
  size_t got;
  uint8_t in[HELLO_LEN];
  char name[ADDR_MAX];
} pending_t;

typedef struct rendezvous {
  dial_t dial;
  pending_t pending[MAX_PENDING];
  int npending;
} rendezvous_t;

/* One step of an operation: send to next and receive from prev at once. */
typedef struct xfer {
  const uint8_t *send;
  size_t send_len, sent;
  uint8_t *recv;
  size_t recv_len, recvd;
  size_t fill;  /* bytes of the current chunk waiting in scratch (ring) */
  bool forward; /* send only what has been received (broadcast chain) */
  gs_dtype_t dtype;
  const char *what;  /* "allreduce" or "broadcast", for logs */
  struct ring *ring; /* the pipelined ring allreduce; NULL: send/recv above */
} xfer_t;

/* The ring allreduce as one transfer: the send stream is the 2(W-1)
 * segments that the reduce-scatter and allgather steps send, one after the
 * other, the receive stream the 2(W-1) they receive. Send item k is the
 * segment that receive item k-1 fills, so it goes out as soon as that part
 * has arrived and been reduced: the steps overlap instead of each waiting
 * for the last byte of the one before. */
typedef struct ring {
  uint8_t *buf;
  size_t count, esz;
  uint32_t w, r;
  bool mean;               /* scale the own segment as its sum completes */
  size_t lead;             /* bytes of send item 0 (ours, sent at once) */
  size_t done;             /* receive-stream bytes reduced or stored */
  uint32_t s_item, r_item; /* items the cursors are in */
  size_t s_start, r_start; /* stream offsets where those items begin */
} ring_t;

/* Milliseconds left of `timeout` since `since`, as a poll() timeout. */
static int wait_ms(uint64_t since, uint64_t timeout, uint64_t now)
{
  uint64_t spent = now - since;

  if (spent >= timeout)
    return 0;
  return timeout - spent > MAX_WAIT_MS ? MAX_WAIT_MS : (int)(timeout - spent);
}

static bool is_aborted(host_comm_t *c)
{
  return atomic_load(&c->aborted);
}

static void hello_encode(const hello_t *h, uint8_t *out)
{
  gs_store_be32(out, h->magic);
  gs_store_be16(out + 4, h->version);
  gs_store_be16(out + 6, h->flags);
  gs_store_be32(out + 8, h->rank);
  gs_store_be32(out + 12, h->world);
  gs_store_be64(out + 16, h->generation);
}

static void hello_decode(const uint8_t *in, hello_t *h)
{
  h->magic = gs_load_be32(in);
  h->version = gs_load_be16(in + 4);
  h->flags = gs_load_be16(in + 6);
  h->rank = gs_load_be32(in + 8);
  h->world = gs_load_be32(in + 12);
  h->generation = gs_load_be64(in + 16);
}

static void our_hello(const host_comm_t *c, uint16_t flags, uint8_t *out)
{
  hello_t h = {HELLO_MAGIC, HELLO_VERSION, flags, c->rank, c->world, c->generation};

  hello_encode(&h, out);
}

/* Whether a peer's hello belongs to this ring (magic, version, generation,
 * world size) and comes from `want_rank`; if not, says why. */
static bool hello_ok(const host_comm_t *c, const hello_t *h, uint32_t want_rank, char *why,
                     size_t len)
{
  if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION)
    snprintf(why, len, "not a gradsync host comm peer (magic 0x%08" PRIx32 ", version %u)",
             h->magic, h->version);
  else if (h->generation != c->generation)
    snprintf(why, len, "generation %" PRIu64 ", expected %" PRIu64, h->generation, c->generation);
  else if (h->world != c->world)
    snprintf(why, len, "world size %" PRIu32 ", expected %" PRIu32, h->world, c->world);
  else if (h->rank != want_rank)
    snprintf(why, len, "rank %" PRIu32 ", expected %" PRIu32, h->rank, want_rank);
  else
    return true;
  return false;
}

/* Low latency and buffers large enough to keep a fast link busy; best
 * effort (the kernel may cap the sizes). */
static void tune_socket(int fd)
{
  int one = 1, size = SOCK_BUF_BYTES;

  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

/* The ring's two sockets get SOCK_BUF_MANY_BYTES buffers (best effort). */
static void shrink_buffers(host_comm_t *c)
{
  int size = SOCK_BUF_MANY_BYTES, fd;

  fd = atomic_load(&c->next_fd);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  fd = atomic_load(&c->prev_fd);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

static void close_fd(int *fd)
{
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/* Formats a socket address as "1.2.3.4:5" or "[::1]:5" (for logs). */
static void sockaddr_name(const struct sockaddr *sa, socklen_t len, char *out, size_t out_len)
{
  char host[64], port[16]; /* numeric forms only */

  if (getnameinfo(sa, len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    snprintf(out, out_len, "?");
  else if (sa->sa_family == AF_INET6)
    snprintf(out, out_len, "[%s]:%s", host, port);
  else
    snprintf(out, out_len, "%s:%s", host, port);
}

/* Copies `host` without the brackets of "[::1]" into out. */
static int strip_brackets(const char *host, size_t len, char *out, size_t out_len)
{
  if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
    host++;
    len -= 2;
  }
  if (len == 0 || len >= out_len)
    return GS_EINVAL;
  memcpy(out, host, len);
  out[len] = '\0';
  return 0;
}

/* Binds a listening socket on host, port 0, and writes "host:port". */
static int host_listen(gs_comm_t *base, const char *host, char *addr, size_t addr_len)
{
  host_comm_t *c = (host_comm_t *)base;
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res, *ai;
  struct sockaddr_storage sa;
  socklen_t salen = sizeof(sa);
  char name[ADDR_MAX], port[NI_MAXSERV];
  int fd = -1, err = 0, rc, n;

  if (c->listen_fd >= 0 || c->init_called) {
    GS_LOG_ERR(base->log, "host comm: listen called twice (already listening or initialized)");
    return GS_EINVAL;
  }
  if (!host || strip_brackets(host, strlen(host), name, sizeof(name))) {
    GS_LOG_ERR(base->log, "host comm: invalid listen host '%s'", host ? host : "(null)");
    return GS_EINVAL;
  }
  rc = getaddrinfo(name, "0", &hints, &res);
  if (rc) {
    GS_LOG_ERR(base->log, "host comm: cannot resolve listen host '%s': %s", name, gai_strerror(rc));
    return GS_ENOTFOUND;
  }
  for (ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    tune_socket(fd); /* accepted sockets inherit the buffer sizes */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
      err = errno;
      close_fd(&fd);
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    GS_LOG_ERR(base->log, "host comm: cannot listen on %s: %s", name, strerror(err));
    return gs_err_from_errno(err);
  }
  if (getsockname(fd, (struct sockaddr *)&sa, &salen) ||
      getnameinfo((struct sockaddr *)&sa, salen, NULL, 0, port, sizeof(port), NI_NUMERICSERV)) {
    GS_LOG_ERR(base->log, "host comm: cannot read the port bound on %s", name);
    close(fd);
    return GS_EIO;
  }
  n = snprintf(addr, addr_len, strchr(name, ':') ? "[%s]:%s" : "%s:%s", name, port);
  if (n < 0 || (size_t)n >= addr_len) {
    GS_LOG_ERR(base->log, "host comm: address %s:%s does not fit in %zu bytes", name, port,
               addr_len);
    close(fd);
    return GS_ERANGE;
  }
  c->listen_fd = fd;
  return 0;
}

/* Resolves a peer's "host:port" (or "[v6]:port") into the dial target. */
static int resolve_peer(host_comm_t *c, const char *addr, dial_t *d)
{
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  const char *colon = strrchr(addr, ':');
  struct addrinfo *res;
  char host[ADDR_MAX];
  int rc;

  if (!colon || !colon[1] || strip_brackets(addr, (size_t)(colon - addr), host, sizeof(host))) {
    GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": bad address '%s' for rank %" PRIu32,
               c->rank, addr, c->next);
    return GS_EINVAL;
  }
  rc = getaddrinfo(host, colon + 1, &hints, &res);
  if (rc) {
    GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": cannot resolve %s (rank %" PRIu32 "): %s",
               c->rank, addr, c->next, gai_strerror(rc));
    return GS_ENOTFOUND;
  }
  memcpy(&d->sa, res->ai_addr, res->ai_addrlen);
  d->salen = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

/* Drops the dial attempt in progress; the next one starts RETRY_MS later. */
static void dial_retry(dial_t *d, int errnum, uint64_t now)
{
  close_fd(&d->fd);
  d->state = DIAL_WAIT;
  d->retry_at = now + RETRY_MS;
  d->last_errno = errnum;
}

static void dial_start(dial_t *d, uint64_t now)
{
  d->fd = socket(d->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (d->fd < 0) {
    dial_retry(d, errno, now);
    return;
  }
  tune_socket(d->fd);
  d->off = 0;
  if (connect(d->fd, (struct sockaddr *)&d->sa, d->salen) == 0)
    d->state = DIAL_HELLO;
  else if (errno == EINPROGRESS)
    d->state = DIAL_CONNECTING;
  else
    dial_retry(d, errno, now);
}

static void dial_connected(dial_t *d, uint64_t now)
{
  int soerr = 0;
  socklen_t len = sizeof(soerr);

  if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &soerr, &len))
    soerr = errno;
  if (soerr)
    dial_retry(d, soerr, now);
  else
    d->state = DIAL_HELLO;
}

static void dial_send_hello(dial_t *d, uint64_t now)
{
  ssize_t n = send(d->fd, d->out + d->off, HELLO_LEN - d->off, MSG_NOSIGNAL);

  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      dial_retry(d, errno, now);
    return;
  }
  d->off += (size_t)n;
  if (d->off == HELLO_LEN) {
    d->off = 0;
    d->state = DIAL_REPLY;
  }
}

/* Reads the acceptor's reply; a reply that refuses us or comes from the
 * wrong ring is fatal (one of us is stale), a bare close is retried. */
static int dial_read_reply(host_comm_t *c, dial_t *d, uint64_t now)
{
  ssize_t n = recv(d->fd, d->in + d->off, HELLO_LEN - d->off, 0);
  char why[160];
  hello_t h;

  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    dial_retry(d, n == 0 ? ECONNRESET : errno, now);
    return 0;
  }
  if (n < 0)
    return 0;
  d->off += (size_t)n;
  if (d->off < HELLO_LEN)
    return 0;
  hello_decode(d->in, &h);
  if (!hello_ok(c, &h, c->next, why, sizeof(why))) {
    GS_LOG_ERR(c->base.log,
               "host comm: rank %" PRIu32 ": peer at %s (rank %" PRIu32 ") answered with %s",
               c->rank, c->next_addr, c->next, why);
    return GS_EPROTO;
  }
  if (!(h.flags & HELLO_ACCEPTED)) {
    GS_LOG_ERR(c->base.log,
               "host comm: rank %" PRIu32 ": rank %" PRIu32
               " at %s refused our connection (generation %" PRIu64 ")",
               c->rank, c->next, c->next_addr, c->generation);
    return GS_EPROTO;
  }
  atomic_store(&c->next_fd, d->fd);
  d->fd = -1;
  d->state = DIAL_DONE;
  return 0;
}

/* Moves the connection to the next rank along as far as it can go now;
 * `revents` are poll's events for d->fd (0 if it was not polled). */
static int dial_advance(host_comm_t *c, dial_t *d, short revents, uint64_t now)
{
  if (d->state == DIAL_WAIT && now >= d->retry_at)
    dial_start(d, now);
  else if (d->state == DIAL_CONNECTING && (revents & (POLLOUT | POLLERR | POLLHUP)))
    dial_connected(d, now);
  if (d->state == DIAL_HELLO)
    dial_send_hello(d, now);
  if (d->state == DIAL_REPLY)
    return dial_read_reply(c, d, now);
  return 0;
}

static void pending_remove(rendezvous_t *rv, int i, bool close_it)
{
  if (close_it)
    close_fd(&rv->pending[i].fd);
  rv->pending[i] = rv->pending[--rv->npending];
}

/* Accepts every waiting connection; they stay pending until their hello
 * arrives. With too many pending, the oldest is dropped. */
static void accept_new(host_comm_t *c, rendezvous_t *rv)
{
  struct sockaddr_storage sa;
  socklen_t len;
  pending_t *p;
  int fd;

  for (;;) {
    len = sizeof(sa);
    fd = accept4(c->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        GS_LOG_WARNING(c->base.log, "host comm: rank %" PRIu32 ": accept: %s", c->rank,
                       strerror(errno));
      return;
    }
    if (rv->npending == MAX_PENDING) {
      GS_LOG_WARNING(c->base.log, "host comm: rank %" PRIu32 ": dropping %s (no hello yet)",
                     c->rank, rv->pending[0].name);
      pending_remove(rv, 0, true);
    }
    p = &rv->pending[rv->npending++];
    p->fd = fd;
    p->got = 0;
    sockaddr_name((struct sockaddr *)&sa, len, p->name, sizeof(p->name));
  }
}

/* Reads a pending connection's hello; answers it, and keeps the connection
 * as prev_fd if it is the previous rank of this generation. */
static void pending_read(host_comm_t *c, rendezvous_t *rv, int i)
{
  pending_t *p = &rv->pending[i];
  ssize_t n = recv(p->fd, p->in + p->got, HELLO_LEN - p->got, 0);
  uint8_t reply[HELLO_LEN];
  char why[160];
  hello_t h;
  bool ok;

  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    GS_LOG_DBG(c->base.log, "host comm: rank %" PRIu32 ": %s left before its hello", c->rank,
               p->name);
    pending_remove(rv, i, true);
    return;
  }
  if (n < 0 || (p->got += (size_t)n) < HELLO_LEN)
    return;
  hello_decode(p->in, &h);
  ok = hello_ok(c, &h, c->prev, why, sizeof(why));
  if (ok && atomic_load(&c->prev_fd) >= 0) {
    snprintf(why, sizeof(why), "rank %" PRIu32 " is already connected", c->prev);
    ok = false;
  }
  our_hello(c, ok ? HELLO_ACCEPTED : 0, reply);
  if (send(p->fd, reply, HELLO_LEN, MSG_NOSIGNAL) != HELLO_LEN && ok) {
    snprintf(why, sizeof(why), "cannot answer its hello: %s", strerror(errno));
    ok = false;
  }
  if (!ok) {
    GS_LOG_WARNING(c->base.log, "host comm: rank %" PRIu32 ": refused connection from %s: %s",
                   c->rank, p->name, why);
    pending_remove(rv, i, true);
    return;
  }
  tune_socket(p->fd);
  atomic_store(&c->prev_fd, p->fd);
  pending_remove(rv, i, false);
}

static void rendezvous_close(rendezvous_t *rv)
{
  close_fd(&rv->dial.fd);
  while (rv->npending > 0)
    pending_remove(rv, rv->npending - 1, true);
}

static int rendezvous_timeout(host_comm_t *c, const rendezvous_t *rv)
{
  if (rv->dial.state != DIAL_DONE)
    GS_LOG_ERR(c->base.log,
               "host comm: rank %" PRIu32 ": timed out after %" PRIu64
               " ms connecting to rank %" PRIu32 " at %s (last error: %s)",
               c->rank, c->timeout_ms, c->next, c->next_addr,
               rv->dial.last_errno ? strerror(rv->dial.last_errno) : "no answer to our hello");
  if (atomic_load(&c->prev_fd) < 0)
    GS_LOG_ERR(c->base.log,
               "host comm: rank %" PRIu32 ": timed out after %" PRIu64
               " ms waiting for rank %" PRIu32 " (%s) to connect",
               c->rank, c->timeout_ms, c->prev, c->prev_addr);
  return GS_ETIMEDOUT;
}

/* Dials the next rank and accepts the previous one, both at once, until
 * both handshakes are done, the deadline passes, or the comm is aborted. */
static int rendezvous_run(host_comm_t *c, rendezvous_t *rv)
{
  struct pollfd pfd[3 + MAX_PENDING];
  uint64_t start = gs_now_ms(), now = start;
  short dial_revents = 0;
  int nfd, listen_idx, dial_idx, pend_idx, err, i;

  for (;;) {
    if (is_aborted(c))
      return GS_EABORTED;
    err = dial_advance(c, &rv->dial, dial_revents, now);
    if (err)
      return err;
    if (rv->dial.state == DIAL_DONE && atomic_load(&c->prev_fd) >= 0)
      return 0;
    now = gs_now_ms();
    if (now - start >= c->timeout_ms)
      return rendezvous_timeout(c, rv);
    nfd = 0;
    pfd[nfd++] = (struct pollfd){c->wake_fd, POLLIN, 0};
    listen_idx = -1;
    if (atomic_load(&c->prev_fd) < 0) {
      listen_idx = nfd;
      pfd[nfd++] = (struct pollfd){c->listen_fd, POLLIN, 0};
    }
    dial_idx = -1;
    if (rv->dial.state == DIAL_CONNECTING || rv->dial.state == DIAL_HELLO ||
        rv->dial.state == DIAL_REPLY) {
      dial_idx = nfd;
      pfd[nfd++] = (struct pollfd){rv->dial.fd, rv->dial.state == DIAL_REPLY ? POLLIN : POLLOUT, 0};
    }
    pend_idx = nfd;
    for (i = 0; i < rv->npending; i++)
      pfd[nfd++] = (struct pollfd){rv->pending[i].fd, POLLIN, 0};
    i = wait_ms(start, c->timeout_ms, now);
    if (rv->dial.state == DIAL_WAIT && rv->dial.retry_at < now + (uint64_t)i)
      i = rv->dial.retry_at > now ? (int)(rv->dial.retry_at - now) : 0;
    if (poll(pfd, (nfds_t)nfd, i) < 0 && errno != EINTR) {
      GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": poll: %s", c->rank, strerror(errno));
      return GS_EIO;
    }
    now = gs_now_ms();
    dial_revents = dial_idx >= 0 ? pfd[dial_idx].revents : 0;
    /* Backwards: removing pending i moves the last one, already seen, into i. */
    for (i = rv->npending - 1; i >= 0; i--)
      if (pfd[pend_idx + i].revents)
        pending_read(c, rv, i);
    if (listen_idx >= 0 && atomic_load(&c->prev_fd) < 0 && pfd[listen_idx].revents)
      accept_new(c, rv);
  }
}

/* Shuts both ring sockets down (the fds stay open until destroy), which
 * unblocks this rank's poll() and makes the neighbours fail promptly. */
static void shutdown_ring(host_comm_t *c)
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
static int comm_fail(host_comm_t *c, int err)
{

  if (is_aborted(c))
    err = GS_EABORTED;
  c->err = err;
  shutdown_ring(c);
  return err;
}

static int check_setup(host_comm_t *c, const gs_comm_setup_t *s)
{
  const gs_log_t *log = c->base.log;
  uint32_t next;

  if (c->init_called) {
    GS_LOG_ERR(log, "host comm: init called twice");
    return GS_EINVAL;
  }
  if (s->world_size == 0 || s->rank >= s->world_size || s->timeout_ms == 0) {
    GS_LOG_ERR(log,
               "host comm: bad setup: rank %" PRIu32 ", world size %" PRIu32 ", timeout %" PRIu64
               " ms",
               s->rank, s->world_size, s->timeout_ms);
    return GS_EINVAL;
  }
  if (s->world_size == 1)
    return 0;
  if (c->listen_fd < 0) {
    GS_LOG_ERR(log, "host comm: rank %" PRIu32 ": init before gs_comm_listen", s->rank);
    return GS_EINVAL;
  }
  next = (s->rank + 1) % s->world_size;
  if (!s->peer_addrs || !s->peer_addrs[next] || !s->peer_addrs[next][0]) {
    GS_LOG_ERR(log, "host comm: rank %" PRIu32 ": no address for rank %" PRIu32, s->rank, next);
    return GS_EINVAL;
  }
  return 0;
}

static int io_error(host_comm_t *c, int errnum, uint32_t peer, const char *addr, const char *what);

/* Sends (out) or receives all len bytes on fd within the timeout,
 * watching for an abort: the small exchanges after the handshake. */
static int io_all(host_comm_t *c, int fd, uint8_t *buf, size_t len, bool out, const char *what)
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
      return io_error(c, n == 0 ? 0 : errno, out ? c->next : c->prev,
                      out ? c->next_addr : c->prev_addr, what);
    if (is_aborted(c))
      return GS_EABORTED;
    now = gs_now_ms();
    if (now - start >= c->timeout_ms) {
      GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": no answer for %" PRIu64 " ms in %s",
                 c->rank, c->timeout_ms, what);
      return GS_ETIMEDOUT;
    }
    (void)poll(pfd, 2, wait_ms(start, c->timeout_ms, now));
  }
  return 0;
}

/* Offers the link to next a shared-memory pipe and answers prev's offer
 * (comm_shm.h): each link whose two ends can map the same segment moves
 * its bytes through it. A link that cannot stays on TCP; only a failing
 * socket fails. GRADSYNC_HOST_SHM=0 keeps every link on TCP. */
static int connect_pipes(host_comm_t *c)
{
  const char *env = getenv("GRADSYNC_HOST_SHM");
  bool want = !(env && strcmp(env, "0") == 0);
  int next = atomic_load(&c->next_fd), prev = atomic_load(&c->prev_fd), err;
  uint8_t offer[GS_SHM_OFFER_LEN] = {0}, theirs[GS_SHM_OFFER_LEN], yes, answer = 0;

  c->out_pipe = want ? gs__shm_create(offer) : NULL;
  err = io_all(c, next, offer, sizeof(offer), true, "shared-memory offer");
  if (!err)
    err = io_all(c, prev, theirs, sizeof(theirs), false, "shared-memory offer");
  if (!err) {
    c->in_pipe = want && theirs[0] ? gs__shm_open(theirs) : NULL;
    yes = c->in_pipe != NULL;
    err = io_all(c, prev, &yes, 1, true, "shared-memory answer");
  }
  if (!err)
    err = io_all(c, next, &answer, 1, false, "shared-memory answer");
  gs__shm_unlink(c->out_pipe); /* both sides have it mapped, or never will */
  if (err || !answer) {
    gs__shm_close(c->out_pipe);
    c->out_pipe = NULL;
  }
  if (!err)
    GS_LOG_DBG(c->base.log,
               "host comm: rank %" PRIu32 ": to rank %" PRIu32 " over %s, from rank %" PRIu32
               " over %s",
               c->rank, c->next, c->out_pipe ? "shared memory" : "TCP", c->prev,
               c->in_pipe ? "shared memory" : "TCP");
  return err;
}

static int host_init(gs_comm_t *base, const gs_comm_setup_t *s)
{
  host_comm_t *c = (host_comm_t *)base;
  rendezvous_t rv = {.dial = {.fd = -1, .state = DIAL_WAIT}};
  int err = check_setup(c, s);

  if (err)
    return err;
  c->init_called = true;
  c->rank = s->rank;
  c->world = s->world_size;
  c->next = (s->rank + 1) % s->world_size;
  c->prev = (s->rank + s->world_size - 1) % s->world_size;
  c->generation = s->generation;
  c->timeout_ms = s->timeout_ms;
  if (c->world == 1)
    goto out_close_listen; /* a ring of one: no sockets, every operation a no-op */
  snprintf(c->next_addr, sizeof(c->next_addr), "%s", s->peer_addrs[c->next]);
  snprintf(c->prev_addr, sizeof(c->prev_addr), "%s",
           s->peer_addrs[c->prev] ? s->peer_addrs[c->prev] : "?");
  c->scratch = malloc(CHUNK_BYTES);
  if (!c->scratch) {
    err = GS_ENOMEM;
    goto out_close_listen;
  }
  our_hello(c, 0, rv.dial.out);
  err = resolve_peer(c, c->next_addr, &rv.dial);
  if (!err)
    err = rendezvous_run(c, &rv);
  rendezvous_close(&rv);
  if (!err)
    err = connect_pipes(c);
out_close_listen:
  close_fd(&c->listen_fd); /* the ring is formed (or failed): nobody else may join */
  if (err)
    return comm_fail(c, err);
  if (c->world >= 3)
    shrink_buffers(c);
  c->ready = true;
  return 0;
}

/* Whether the operation may start: not aborted, not broken, initialized. */
static int op_begin(host_comm_t *c, const char *what)
{
  if (is_aborted(c))
    return GS_EABORTED;
  if (c->err)
    return c->err;
  if (!c->ready) {
    GS_LOG_ERR(c->base.log, "host comm: %s before a successful init", what);
    return GS_EINVAL;
  }
  return 0;
}

/* Converts a send/recv errno on the connection to `peer` into an error. */
static int io_error(host_comm_t *c, int errnum, uint32_t peer, const char *addr, const char *what)
{
  bool closed = errnum == 0 || errnum == ECONNRESET || errnum == EPIPE || errnum == ENOTCONN ||
                errnum == ESHUTDOWN || errnum == ECONNABORTED;

  if (is_aborted(c))
    return GS_EABORTED;
  GS_LOG_ERR(c->base.log,
             "host comm: rank %" PRIu32 ": connection to rank %" PRIu32 " (%s) %s during %s",
             c->rank, peer, addr, errnum ? strerror(errnum) : "closed by the peer", what);
  return closed ? GS_ECLOSED : gs_err_from_errno(errnum);
}

/* Element offset of ring segment i of `count` split W ways: the first
 * count % W segments hold one element more. */
static size_t seg_off(size_t count, uint32_t w, uint32_t i)
{
  return i * (count / w) + (i < count % w ? i : count % w);
}

static size_t seg_len(size_t count, uint32_t w, uint32_t i)
{
  return count / w + (i < count % w ? 1 : 0);
}

static void scale(uint8_t *p, size_t n, gs_dtype_t dtype, uint32_t w)
{
  if (dtype == GS_DTYPE_FLOAT64) {
    double k = 1.0 / w, *d = (double *)p;
    for (size_t i = 0; i < n; i++)
      d[i] *= k;
  } else {
    float k = 1.0f / (float)w, *f = (float *)p;
    for (size_t i = 0; i < n; i++)
      f[i] *= k;
  }
}

/* dst += src, elementwise. The body works in blocks of REDUCE_BLOCK
 * elements, a trip count -O2's cheap vectorizer takes (it leaves loops of
 * unknown length scalar), compiled for AVX-512 and AVX2 too (GS_WIDE). */
#define REDUCE_BLOCK 32
GS_WIDE static void reduce_f32(float *restrict dst, const float *restrict src, size_t n)
{
  size_t i = 0;

  for (; i + REDUCE_BLOCK <= n; i += REDUCE_BLOCK)
    for (size_t j = 0; j < REDUCE_BLOCK; j++)
      dst[i + j] += src[i + j];
  for (; i < n; i++)
    dst[i] += src[i];
}

GS_WIDE static void reduce_f64(double *restrict dst, const double *restrict src, size_t n)
{
  size_t i = 0;

  for (; i + REDUCE_BLOCK <= n; i += REDUCE_BLOCK)
    for (size_t j = 0; j < REDUCE_BLOCK; j++)
      dst[i + j] += src[i + j];
  for (; i < n; i++)
    dst[i] += src[i];
}

static void reduce_into(uint8_t *dst, const uint8_t *src, size_t bytes, gs_dtype_t dtype)
{
  if (dtype == GS_DTYPE_FLOAT64)
    reduce_f64((double *)dst, (const double *)src, bytes / sizeof(double));
  else
    reduce_f32((float *)dst, (const float *)src, bytes / sizeof(float));
}

/* One byte on a link's socket wakes the side sleeping in poll(); when the
 * socket is full a byte is already pending, which wakes it as well. */
static void send_wake(int fd)
{
  static const uint8_t one = 1;

  (void)!send(fd, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Receives up to len bytes from prev into dst: the count, 0 if it would
 * block, or a negative error (the link closed or failed). */
static ssize_t recv_into(host_comm_t *c, xfer_t *x, uint8_t *dst, size_t len)
{
  ssize_t n;

  if (c->in_pipe) {
    bool wake;
    size_t got = gs__shm_read(c->in_pipe, dst, len, &wake);

    if (wake)
      send_wake(atomic_load(&c->prev_fd));
    return (ssize_t)got;
  }
  n = recv(atomic_load(&c->prev_fd), dst, len, MSG_DONTWAIT);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return 0;
    return io_error(c, n == 0 ? 0 : errno, c->prev, c->prev_addr, x->what);
  }
  return n;
}

/* Sends up to len bytes from p to next, counting them in x->sent; 1 on
 * progress, 0 if it would block. */
static int send_from(host_comm_t *c, xfer_t *x, const uint8_t *p, size_t len)
{
  ssize_t n;

  if (c->out_pipe) {
    bool wake;
    size_t put = gs__shm_write(c->out_pipe, p, len, &wake);

    if (wake)
      send_wake(atomic_load(&c->next_fd));
    x->sent += put;
    return put > 0;
  }
  n = send(atomic_load(&c->next_fd), p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
      return 0;
    return io_error(c, errno, c->next, c->next_addr, x->what);
  }
  x->sent += (size_t)n;
  return 1;
}

/* Sends what it can to next; 1 on progress, 0 if it would block. */
static int send_some(host_comm_t *c, xfer_t *x)
{
  size_t limit = x->forward ? x->recvd : x->send_len;

  if (x->sent >= limit)
    return 0;
  return send_from(c, x, x->send + x->sent, limit - x->sent);
}

/* Receives up to one chunk from prev into place; 1 on progress, 0 if it
 * would block. */
static int recv_some(host_comm_t *c, xfer_t *x)
{
  size_t left = x->recv_len - x->recvd;
  ssize_t n;

  if (left == 0)
    return 0;
  n = recv_into(c, x, x->recv + x->recvd, CHUNK_BYTES < left ? CHUNK_BYTES : left);
  if (n <= 0)
    return (int)n;
  x->recvd += (size_t)n;
  return 1;
}

/* Segment of send item k (recv: of receive item k): rank r's ring sends
 * segment r-k in step k and receives segment r-k-1. */
static uint32_t ring_seg(const ring_t *g, uint32_t item, bool recv)
{
  return (g->r + 2 * g->w - item - (recv ? 1u : 0u)) % g->w;
}

static size_t ring_item_len(const ring_t *g, uint32_t item, bool recv)
{
  return seg_len(g->count, g->w, ring_seg(g, item, recv)) * g->esz;
}

static uint8_t *ring_item_ptr(const ring_t *g, uint32_t item, bool recv)
{
  return g->buf + seg_off(g->count, g->w, ring_seg(g, item, recv)) * g->esz;
}

/* Bytes of the send stream that may go out now. */
static size_t send_limit(const xfer_t *x)
{
  size_t lim;

  if (x->ring) {
    lim = x->ring->lead + x->ring->done;
    return lim < x->send_len ? lim : x->send_len;
  }
  return x->forward ? x->recvd : x->send_len;
}

/* send_some for the ring: what may go out of the current send item. */
static int ring_send_some(host_comm_t *c, xfer_t *x)
{
  ring_t *g = x->ring;
  size_t limit = send_limit(x), len, end;

  if (x->sent >= limit)
    return 0;
  while (x->sent >= g->s_start + (len = ring_item_len(g, g->s_item, false))) {
    g->s_start += len;
    g->s_item++;
  }
  end = g->s_start + len < limit ? g->s_start + len : limit;
  return send_from(c, x, ring_item_ptr(g, g->s_item, false) + (x->sent - g->s_start),
                   end - x->sent);
}

/* recv_some for the ring: the first W-1 receive items are added into
 * place one chunk at a time (the last of them completes this rank's own
 * segment, scaled there for the mean), the others are stored. */
static int ring_recv_some(host_comm_t *c, xfer_t *x)
{
  ring_t *g = x->ring;
  size_t len, left, want;
  uint8_t *item, *dst;
  bool reduce;
  ssize_t n;

  if (x->recvd == x->recv_len)
    return 0;
  while (x->recvd >= g->r_start + (len = ring_item_len(g, g->r_item, true))) {
    g->r_start += len;
    g->r_item++;
  }
  item = ring_item_ptr(g, g->r_item, true);
  reduce = g->r_item < g->w - 1;
  left = g->r_start + len - x->recvd;
  dst = reduce ? c->scratch + x->fill : item + (x->recvd - g->r_start);
  want = reduce ? CHUNK_BYTES - x->fill : left;
  n = recv_into(c, x, dst, want < left ? want : left);
  if (n <= 0)
    return (int)n;
  x->recvd += (size_t)n;
  if (!reduce) {
    g->done += (size_t)n;
    return 1;
  }
  x->fill += (size_t)n;
  if (x->fill == CHUNK_BYTES || (size_t)n == left) {
    dst = item + (x->recvd - g->r_start) - x->fill;
    reduce_into(dst, c->scratch, x->fill, x->dtype);
    if (g->mean && g->r_item == g->w - 2)
      scale(dst, x->fill / g->esz, x->dtype, g->w);
    g->done += x->fill;
    x->fill = 0;
  }
  return 1;
}

static int xfer_timeout(host_comm_t *c, const xfer_t *x)
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
  return io_error(c, errno, peer, addr, what);
}

/* Shared-memory links: sleeps in poll() until a wake-up byte, the abort
 * eventfd, a peer's hang-up or the timeout, after telling each pipe this
 * side waits on that it sleeps (and not at all when data or space came
 * meanwhile). Both sockets are watched whether or not they carry a pipe:
 * a peer that dies closes them, which poll() reports as a hang-up. */
static int sleep_on_pipes(host_comm_t *c, xfer_t *x, int timeout_ms)
{
  bool want_in = x->recvd < x->recv_len, want_out = x->sent < send_limit(x), stay_awake = false;
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
    return io_error(c, 0, c->prev, c->prev_addr, x->what);
  }
  if (want_out && c->out_pipe && c->next_gone) /* the reader is gone, not done with us */
    err = io_error(c, 0, c->next, c->next_addr, x->what);
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
      err = want_out ? io_error(c, 0, c->next, c->next_addr, x->what) : 0;
  }
  if (!err && c->in_pipe && prev >= 0 && (pfd[2].revents & (POLLIN | POLLHUP | POLLERR))) {
    err = drain_wakes(c, prev, c->prev, c->prev_addr, x->what);
    c->prev_gone = err == 1;
    if (err == 1)
      err = 0; /* what it wrote may still be in the pipe: see prev_gone */
  }
  return err;
}

/* Runs one step to completion: sends and receives at once, so two ranks
 * never wait on each other's full buffers. `last` is the time of the last
 * progress, carried across the steps of one operation. */
static int xfer_run(host_comm_t *c, xfer_t *x, uint64_t *last)
{
  struct pollfd pfd[3];
  uint64_t now, spin_since = gs_now_ns();
  int sent, got, nfd;

  for (;;) {
    if (is_aborted(c))
      return GS_EABORTED;
    sent = x->ring ? ring_send_some(c, x) : send_some(c, x);
    if (sent < 0)
      return sent;
    got = x->ring ? ring_recv_some(c, x) : recv_some(c, x);
    if (got < 0)
      return got;
    if (x->sent == x->send_len && x->recvd == x->recv_len)
      return 0;
    if (sent || got) {
      *last = gs_now_ms();
      spin_since = gs_now_ns();
      continue;
    }
    if (gs_now_ns() - spin_since < SPIN_NS) {
      sched_yield(); /* lets a peer sharing this core run */
      continue;
    }
    now = gs_now_ms();
    if (now - *last >= c->timeout_ms)
      return xfer_timeout(c, x);
    if (c->out_pipe || c->in_pipe) {
      int err = sleep_on_pipes(c, x, wait_ms(*last, c->timeout_ms, now));

      if (err)
        return err;
      continue;
    }
    nfd = 0;
    pfd[nfd++] = (struct pollfd){c->wake_fd, POLLIN, 0};
    if (x->sent < send_limit(x))
      pfd[nfd++] = (struct pollfd){atomic_load(&c->next_fd), POLLOUT, 0};
    if (x->recvd < x->recv_len)
      pfd[nfd++] = (struct pollfd){atomic_load(&c->prev_fd), POLLIN, 0};
    if (poll(pfd, (nfds_t)nfd, wait_ms(*last, c->timeout_ms, now)) < 0 && errno != EINTR) {
      GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": poll: %s", c->rank, strerror(errno));
      return GS_EIO;
    }
  }
}

/* Grows the gather buffer to `bytes` (it keeps the largest size asked). */
static int gather_reserve(host_comm_t *c, size_t bytes)
{
  uint8_t *p;

  if (bytes <= c->gather_cap)
    return 0;
  p = realloc(c->gather, bytes);
  if (!p) {
    GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": out of memory for %zu gather bytes",
               c->rank, bytes);
    return GS_ENOMEM;
  }
  c->gather = p;
  c->gather_cap = bytes;
  return 0;
}

/* Small allreduce: every rank's whole buffer travels around the ring (W-1
 * steps: step s forwards the block of rank r-s, receives that of rank
 * r-s-1) into the gather buffer, then each rank adds the W blocks in rank
 * order, so every rank computes the same sum bit for bit. */
static int small_allreduce(host_comm_t *c, uint8_t *buf, size_t bytes, gs_dtype_t dtype,
                           uint64_t *last)
{
  uint32_t w = c->world, r = c->rank, s;
  uint8_t *g;
  int err = gather_reserve(c, bytes * w);

  if (err)
    return err;
  g = c->gather;
  memcpy(g + r * bytes, buf, bytes);
  for (s = 0; s < w - 1; s++) {
    xfer_t x = {
        .send = g + (size_t)((r + w - s) % w) * bytes,
        .send_len = bytes,
        .recv = g + (size_t)((r + 2 * w - s - 1) % w) * bytes,
        .recv_len = bytes,
        .dtype = dtype,
        .what = "allreduce",
    };

    err = xfer_run(c, &x, last);
    if (err)
      return err;
  }
  memcpy(buf, g, bytes);
  for (s = 1; s < w; s++)
    reduce_into(buf, g + (size_t)s * bytes, bytes, dtype);
  return 0;
}

/* Reduce-scatter (W-1 steps: rank r ends up owning the full sum of segment
 * r+1), the mean's scaling of that segment, then allgather (W-1 steps), all
 * pipelined in one transfer (ring_t). Small buffers take small_allreduce. */
static int host_allreduce(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                          gs_reduce_op_t op)
{
  host_comm_t *c = (host_comm_t *)base;
  uint32_t w = c->world, s;
  uint64_t last = gs_now_ms();
  ring_t ring = {0};
  xfer_t x = {.dtype = dtype, .what = "allreduce", .ring = &ring};
  int err = op_begin(c, "allreduce");

  if (err)
    return err;
  if ((dtype != GS_DTYPE_FLOAT32 && dtype != GS_DTYPE_FLOAT64) ||
      (op != GS_REDUCE_SUM && op != GS_REDUCE_MEAN) || (count && !buf) ||
      count > SIZE_MAX / gs_dtype_size(dtype)) {
    GS_LOG_ERR(base->log, "host comm: allreduce of %zu %s (op %s): unsupported arguments", count,
               gs_dtype_name(dtype), gs_reduce_op_name(op));
    return GS_EINVAL;
  }
  if (w == 1 || count == 0)
    return 0;
  if (count * gs_dtype_size(dtype) <= (w == 2 ? SMALL_BYTES_TWO : SMALL_BYTES_MANY)) {
    err = small_allreduce(c, buf, count * gs_dtype_size(dtype), dtype, &last);
    if (err)
      return comm_fail(c, err);
    if (op == GS_REDUCE_MEAN)
      scale(buf, count, dtype, w);
    return 0;
  }
  ring.buf = buf;
  ring.count = count;
  ring.esz = gs_dtype_size(dtype);
  ring.w = w;
  ring.r = c->rank;
  ring.mean = op == GS_REDUCE_MEAN;
  ring.lead = ring_item_len(&ring, 0, false);
  for (s = 0; s < 2 * (w - 1); s++) {
    x.send_len += ring_item_len(&ring, s, false);
    x.recv_len += ring_item_len(&ring, s, true);
  }
  err = xfer_run(c, &x, &last);
  return err ? comm_fail(c, err) : 0;
}

/* Chain from root along the ring, forwarding each piece as it arrives. */
static int host_broadcast(gs_comm_t *base, void *buf, size_t bytes, uint32_t root)
{
  host_comm_t *c = (host_comm_t *)base;
  uint64_t last = gs_now_ms();
  int err = op_begin(c, "broadcast");
  xfer_t x = {.send = buf, .recv = buf, .what = "broadcast"};

  if (err)
    return err;
  if (root >= c->world || (bytes && !buf)) {
    GS_LOG_ERR(base->log,
               "host comm: broadcast of %zu bytes from root %" PRIu32 " in a world of %" PRIu32
               ": invalid arguments",
               bytes, root, c->world);
    return GS_EINVAL;
  }
  if (c->world == 1 || bytes == 0)
    return 0;
  if (c->rank == root) {
    x.send_len = bytes;
  } else {
    x.recv_len = bytes;
    x.forward = c->next != root;
    x.send_len = x.forward ? bytes : 0;
  }
  err = xfer_run(c, &x, &last);
  return err ? comm_fail(c, err) : 0;
}

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
  shutdown_ring(c);
}

static void host_destroy(gs_comm_t *base)
{
  host_comm_t *c = (host_comm_t *)base;
  int fd;

  fd = atomic_load(&c->next_fd);
  close_fd(&fd);
  fd = atomic_load(&c->prev_fd);
  close_fd(&fd);
  close_fd(&c->listen_fd);
  close_fd(&c->wake_fd);
  gs__shm_close(c->out_pipe);
  gs__shm_close(c->in_pipe);
  free(c->scratch);
  free(c->gather);
  free(c);
}

static const gs_comm_ops_t host_ops = {
    .name = "host",
    .listen = host_listen,
    .init = host_init,
    .allreduce = host_allreduce,
    .broadcast = host_broadcast,
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
