/* Host backend, connecting a generation's ring: the listening socket, the
 * rendezvous (dial rank+1 and accept rank-1 at once, each checked by a
 * hello), then the shared-memory offer on each link. */
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

#include "byteorder.h"
#include "clock.h"
#include "netif.h"
#include "why.h"

#define INTERRUPT_POLL_MS 100

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

/* A listening socket on numeric address `name`, `port`; -1 with errno in
 * *err when it cannot be had. */
static int listen_on(const char *name, uint16_t port, int *err)
{
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res, *ai;
  char service[8];
  int fd = -1;

  snprintf(service, sizeof(service), "%u", port);
  if (getaddrinfo(name, service, &hints, &res)) {
    *err = EINVAL; /* not a name of this host's */
    return -1;
  }
  for (ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    tune_socket(fd); /* accepted sockets inherit the buffer sizes */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
      *err = errno;
      gs__host_close_fd(&fd);
    }
  }
  freeaddrinfo(res);
  return fd;
}

/* "host:port" for the peers: the advertised host (with its own port, or
 * the bound one), else the bound address. */
static int advertised(host_comm_t *c, const gs_comm_endpoint_t *ep, const char *name,
                      const char *port, char *addr, size_t addr_len)
{
  const char *adv = ep->advertise && ep->advertise[0] ? ep->advertise : NULL;
  const char *host = adv ? adv : name, *colon = adv ? strrchr(adv, ':') : NULL;
  /* "[v6]:p" and "h:p" carry a port; "v6" (two colons or more) and "[v6]" do not. */
  bool has_port =
      colon && (adv[0] == '[' ? colon > adv && colon[-1] == ']' : strchr(adv, ':') == colon);
  bool bare_v6 = !has_port && strchr(host, ':') && host[0] != '[';
  int n;

  if (!adv && gs_netif_is_wildcard(name))
    return gs__comm_fail(&c->base, GS_EINVAL,
                         "listening on every interface (%s) needs an address for the peers to "
                         "dial (--comm-advertise)",
                         name);
  if (has_port)
    n = snprintf(addr, addr_len, "%s", adv);
  else
    n = snprintf(addr, addr_len, bare_v6 ? "[%s]:%s" : "%s:%s", host, port);
  if (n < 0 || (size_t)n >= addr_len)
    return gs__comm_fail(&c->base, GS_ERANGE, "address %s (port %s) does not fit in %zu bytes",
                         host, port, addr_len);
  return 0;
}

/* Binds the listening socket on ep->bind, at the first free port of ep's
 * range (any free port without one), and writes what the peers dial. */
int gs__host_listen(gs_comm_t *base, const gs_comm_endpoint_t *ep, char *addr, size_t addr_len)
{
  host_comm_t *c = (host_comm_t *)base;
  struct sockaddr_storage sa;
  socklen_t salen = sizeof(sa);
  char name[ADDR_MAX], port[NI_MAXSERV];
  uint32_t p = ep->port_min;
  int fd, err = 0;

  if (c->listen_fd >= 0 || c->init_called)
    return gs__comm_fail(base, GS_EINVAL, "listen called twice (already listening or initialized)");
  if (!ep->bind || strip_brackets(ep->bind, strlen(ep->bind), name, sizeof(name)))
    return gs__comm_fail(base, GS_EINVAL, "invalid listen address '%s'",
                         ep->bind ? ep->bind : "(null)");
  while ((fd = listen_on(name, (uint16_t)p, &err)) < 0 && err == EADDRINUSE && p < ep->port_max)
    p++;
  if (fd < 0) {
    char ports[40] = "";

    if (ep->port_max > ep->port_min)
      snprintf(ports, sizeof(ports), ", ports %u-%u", ep->port_min, ep->port_max);
    else if (ep->port_min)
      snprintf(ports, sizeof(ports), ", port %u", ep->port_min);
    return gs__comm_fail(base, gs_err_from_errno(err), "cannot listen on %s%s: %s", name, ports,
                         err == EADDRNOTAVAIL || err == EINVAL
                             ? "no interface of this host has that address"
                             : strerror(err));
  }
  if (getsockname(fd, (struct sockaddr *)&sa, &salen) ||
      getnameinfo((struct sockaddr *)&sa, salen, NULL, 0, port, sizeof(port), NI_NUMERICSERV)) {
    close(fd);
    return gs__comm_fail(base, GS_EIO, "cannot read the port bound on %s", name);
  }
  err = advertised(c, ep, name, port, addr, addr_len);
  if (err) {
    close(fd);
    return err;
  }
  snprintf(c->listen_addr, sizeof(c->listen_addr), "%s", addr);
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
  gs__host_close_fd(&d->fd);
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
    gs__host_close_fd(&rv->pending[i].fd);
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
  gs__host_close_fd(&rv->dial.fd);
  while (rv->npending > 0)
    pending_remove(rv, rv->npending - 1, true);
}

/* What a dial's last error most likely means, for the message that ends
 * the wait. */
static const char *dial_cause(const dial_t *d)
{
  switch (d->last_errno) {
  case ECONNREFUSED:
    return "connection refused: nothing listens at that address (a firewall rejecting the port, or "
           "an address of another host: check --comm-advertise and --comm-iface there)";
  case EHOSTUNREACH:
  case ENETUNREACH:
    return "no route to that address from this host (a wrong --comm-iface or --comm-advertise on "
           "that rank, or a network this host is not on)";
  case 0:
    return d->state == DIAL_REPLY ? "it accepted the connection but never answered our hello (not "
                                    "a gradsync agent, or a proxy in between)"
                                  : "no answer at all: a firewall dropping packets to that port "
                                    "(open the --comm-port range), or an address not reachable "
                                    "from this host";
  default:
    return strerror(d->last_errno);
  }
}

/* The ring did not form in time: says which half is missing, between
 * which ranks, and the likely cause. */
static int rendezvous_timeout(host_comm_t *c, const rendezvous_t *rv)
{
  double s = (double)c->connect_timeout_ms / 1000.0;

  if (rv->dial.state != DIAL_DONE)
    return gs__comm_fail(&c->base, GS_ETIMEDOUT,
                         "rank %" PRIu32 " could not connect to rank %" PRIu32
                         " at %s within %.3g s: %s",
                         c->rank, c->next, c->next_addr, s, dial_cause(&rv->dial));
  return gs__comm_fail(&c->base, GS_ETIMEDOUT,
                       "rank %" PRIu32 " (at %s) was never reached by rank %" PRIu32
                       " (at %s) within %.3g s: that rank cannot reach this one's address (see "
                       "its log; a firewall on this rank's port, or a wrong --comm-advertise)",
                       c->rank, c->listen_addr, c->prev, c->prev_addr, s);
}

/* Dials the next rank and accepts the previous one, both at once, until
 * both handshakes are done, the deadline passes, the comm is aborted or
 * the owner's signal comes (looked at every INTERRUPT_POLL_MS). */
static int rendezvous_run(host_comm_t *c, rendezvous_t *rv, volatile sig_atomic_t *interrupt)
{
  struct pollfd pfd[3 + MAX_PENDING];
  uint64_t start = gs_now_ms(), now = start;
  short dial_revents = 0;
  int nfd, listen_idx, dial_idx, pend_idx, err, i;

  for (;;) {
    if (gs__host_aborted(c))
      return GS_EABORTED;
    if (interrupt && *interrupt)
      return gs__comm_fail(&c->base, GS_EINTR,
                           "rank %" PRIu32 ": interrupted by %s while connecting to rank %" PRIu32
                           " and %" PRIu32,
                           c->rank, gs_signal_name(*interrupt), c->next, c->prev);
    err = dial_advance(c, &rv->dial, dial_revents, now);
    if (err)
      return err;
    if (rv->dial.state == DIAL_DONE && atomic_load(&c->prev_fd) >= 0)
      return 0;
    now = gs_now_ms();
    if (now - start >= c->connect_timeout_ms)
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
    i = gs__host_wait_ms(start, c->connect_timeout_ms, now);
    if (interrupt && i > INTERRUPT_POLL_MS)
      i = INTERRUPT_POLL_MS;
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

/* Offers the link to next a shared-memory pipe and answers prev's offer
 * (comm_shm.h): each link whose two ends can map the same segment moves
 * its bytes through it. A link that cannot stays on TCP; only a failing
 * socket fails. The setup's tcp_only keeps every link on TCP (the offer
 * then says none). */
static int connect_pipes(host_comm_t *c)
{
  bool want = !c->tcp_only;
  int next = atomic_load(&c->next_fd), prev = atomic_load(&c->prev_fd), err;
  uint8_t offer[GS_SHM_OFFER_LEN] = {0}, theirs[GS_SHM_OFFER_LEN], yes, answer = 0;

  c->out_pipe = want ? gs__shm_create(offer) : NULL;
  err = gs__host_io_all(c, next, offer, sizeof(offer), true, "shared-memory offer");
  if (!err)
    err = gs__host_io_all(c, prev, theirs, sizeof(theirs), false, "shared-memory offer");
  if (!err) {
    c->in_pipe = want && theirs[0] ? gs__shm_open(theirs) : NULL;
    yes = c->in_pipe != NULL;
    err = gs__host_io_all(c, prev, &yes, 1, true, "shared-memory answer");
  }
  if (!err)
    err = gs__host_io_all(c, next, &answer, 1, false, "shared-memory answer");
  gs__shm_close_offer(c->out_pipe); /* both sides have it mapped, or never will */
  if (err || !answer) {
    gs__shm_close(c->out_pipe);
    c->out_pipe = NULL;
  }
  if (!err)
    GS_LOG_INF(c->base.log,
               "host comm: rank %" PRIu32 ": to rank %" PRIu32 " (%s) over %s, from rank %" PRIu32
               " over %s",
               c->rank, c->next, c->next_addr, c->out_pipe ? "shared memory" : "TCP", c->prev,
               c->in_pipe ? "shared memory" : "TCP");
  return err;
}

int gs__host_init(gs_comm_t *base, const gs_comm_setup_t *s)
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
  c->connect_timeout_ms = s->connect_timeout_ms ? s->connect_timeout_ms : s->timeout_ms;
  c->tcp_only = s->tcp_only;
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
    err = rendezvous_run(c, &rv, s->interrupt);
  rendezvous_close(&rv);
  if (!err)
    err = connect_pipes(c);
out_close_listen:
  gs__host_close_fd(&c->listen_fd); /* the ring is formed (or failed): nobody else may join */
  if (err)
    return gs__host_fail(c, err);
  if (c->world >= 3)
    shrink_buffers(c);
  c->ready = true;
  return 0;
}
