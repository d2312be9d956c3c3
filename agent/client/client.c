/* The agent's coordinator client, its connection: one blocking TCP
 * connection driven by poll() deadlines, carrying framed Envelopes
 * (proto/README.md), redialled with backoff (backoff.c) when it breaks, and
 * gs_client_call, one request and its reply on it. The RPC methods are in
 * rpc.c. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "client_internal.h"
#include "client_tls.h"
#include "frame.h"
#include "parse.h"
#include "why.h"
#include "wire.h"

#define READ_CHUNK (64 * 1024)
#define WAIT_MARGIN_MS 250u /* a parked RPC ends on the server this much before our deadline */

void gs__client_set_err(gs_client_t *cl, const char *fmt, ...)
{
  char text[sizeof(cl->err)];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap); /* fmt's arguments may point into cl->err */
  va_end(ap);
  memcpy(cl->err, text, sizeof(cl->err));
}

void gs__client_waiting(gs_client_t *cl, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(cl->waiting, sizeof(cl->waiting), fmt, ap);
  va_end(ap);
}

void gs_client_set_session(gs_client_t *cl, const char *session)
{
  snprintf(cl->session, sizeof(cl->session), "%s", session ? session : "");
}

const char *gs_client_session(const gs_client_t *cl)
{
  return cl->session;
}

void gs_client_set_progress_interval(gs_client_t *cl, uint32_t ms)
{
  cl->progress_ms = ms ? ms : GS_CLIENT_PROGRESS_MS;
}

/* One gs_client_call in progress. */
typedef struct call {
  const char *method;
  const char *name; /* the method without its prefix, for messages */
  uint64_t id;
  const pb_msgdesc_t *req_fields;
  const void *req;
  const pb_msgdesc_t *resp_fields;
  void *resp;
  uint32_t wait_ms;
  uint64_t timeout_ms;
  uint64_t deadline;
  bool failed_once;   /* a dial or connection failed: cl->err says how */
  bool timed_out;     /* our own deadline passed (not the coordinator's) */
  bool interruptible; /* the owner's signal ends it (not Heartbeat, Leave) */
  unsigned sends;     /* how often the request was sent */
  uint64_t start_ms;
  uint64_t progress_at; /* when to say next that we still wait */
} call_t;

gs_client_t *gs_client_new(const gs_client_config_t *cfg)
{
  gs_client_t *cl = calloc(1, sizeof(*cl));
  struct timespec ts;

  if (!cl)
    return NULL;
  snprintf(cl->host, sizeof(cl->host), "%s", cfg->host);
  cl->port = cfg->port;
  snprintf(cl->addr, sizeof(cl->addr), strchr(cl->host, ':') ? "[%s]:%u" : "%s:%u", cl->host,
           cl->port);
  cl->token = cfg->token ? strdup(cfg->token) : NULL;
  cl->job = strdup(cfg->job ? cfg->job : "");
  if ((cfg->token && !cl->token) || !cl->job) {
    gs_client_free(cl);
    return NULL;
  }
  cl->default_log = (gs_log_t){.level = GS_LOG_WARN, .component = "agent"};
  cl->log = cfg->log ? cfg->log : &cl->default_log;
  cl->fd = -1;
  cl->next_id = 1;
  cl->interrupt = cfg->interrupt;
  cl->tls = cfg->tls;
  cl->progress_ms = GS_CLIENT_PROGRESS_MS;
  clock_gettime(CLOCK_REALTIME, &ts);
  gs__backoff_init(&cl->backoff, (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 20 ^
                                     (uint64_t)getpid() << 40 ^ (uint64_t)(uintptr_t)cl);
  return cl;
}

static void close_conn(gs_client_t *cl)
{
  gs__client_tls_end(cl->ssl);
  cl->ssl = NULL;
  if (cl->fd >= 0)
    close(cl->fd);
  cl->fd = -1;
  cl->rbuf.len = 0;
}

void gs_client_free(gs_client_t *cl)
{
  if (!cl)
    return;
  close_conn(cl);
  gs_buf_free(&cl->rbuf);
  gs_buf_free(&cl->wbuf);
  free(cl->token);
  free(cl->job);
  free(cl);
}

const char *gs_client_error(const gs_client_t *cl)
{
  return cl->err;
}

/* Called between the slices of every wait of a call: GS_EINTR once the
 * owner's signal came (for a call it may end), and every progress
 * interval one info line saying what the call still waits for. */
static int tick(gs_client_t *cl)
{
  call_t *c = cl->cur;
  uint64_t now;

  if (!c)
    return 0;
  if (c->interruptible && cl->interrupt && *cl->interrupt)
    return GS_EINTR;
  now = gs_now_ms();
  if (now < c->progress_at)
    return 0;
  c->progress_at = now + cl->progress_ms;
  if (cl->fd < 0 && c->failed_once)
    gs_log(cl->log, GS_LOG_INFO, cl->job, -1, "coordinator unreachable at %s (%s), retrying",
           cl->addr, cl->err);
  else if (cl->waiting[0])
    gs_log(cl->log, GS_LOG_INFO, cl->job, -1, "still waiting for %s after %llu s", cl->waiting,
           (unsigned long long)((now - c->start_ms + 500) / 1000));
  else
    gs_log(cl->log, GS_LOG_INFO, cl->job, -1, "still waiting for the %s reply from %s after %llu s",
           c->name, cl->addr, (unsigned long long)((now - c->start_ms + 500) / 1000));
  return 0;
}

/* How long the next slice of a wait may be: short while a call is in
 * progress, so that tick runs often enough. */
static int slice_ms(const gs_client_t *cl, uint64_t now, uint64_t until)
{
  uint64_t cap = cl->cur ? GS_CLIENT_SLICE_MS : 60000;

  return until - now > cap ? (int)cap : (int)(until - now);
}

/* Waits until `fd` is ready for `events` or the deadline passes: 0,
 * GS_ETIMEDOUT, GS_EINTR, or the poll error. */
static int wait_fd(gs_client_t *cl, int fd, short events, uint64_t deadline)
{
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = events};
    uint64_t now = gs_now_ms();
    int n = tick(cl);

    if (n)
      return n;
    if (now >= deadline)
      return GS_ETIMEDOUT;
    n = poll(&pfd, 1, slice_ms(cl, now, deadline));
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return gs_err_from_errno(errno);
  }
}

/* Connects one resolved address without blocking past the deadline. */
static int dial_one(gs_client_t *cl, const struct addrinfo *ai, uint64_t deadline)
{
  int fd, one = 1, soerr = 0, err;
  socklen_t len = sizeof(soerr);

  fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    gs__client_set_err(cl, "socket for %s: %s", cl->addr, strerror(errno));
    return gs_err_from_errno(errno);
  }
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      soerr = errno;
      goto out_close_socket;
    }
    err = wait_fd(cl, fd, POLLOUT, deadline);
    if (err) {
      if (err != GS_EINTR) /* keep the last failure: the interruption has its own words */
        gs__client_set_err(cl, "connect %s: %s", cl->addr,
                           err == GS_ETIMEDOUT ? "timed out" : gs_strerror(err));
      close(fd);
      return err;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
      soerr = errno;
    if (soerr)
      goto out_close_socket;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  cl->fd = fd;
  return 0;

out_close_socket:
  close(fd);
  gs__client_set_err(cl, "connect %s: %s", cl->addr, strerror(soerr));
  return gs_err_from_errno(soerr);
}

/* The TLS handshake on the new connection, within the call's deadline
 * and GS_CLIENT_HANDSHAKE_MS: 0; GS_EPROTO, final (a certificate, a
 * coordinator without TLS); GS_ECLOSED to redial; GS_ETIMEDOUT, GS_EINTR. */
static int handshake(gs_client_t *cl, uint64_t deadline)
{
  uint64_t now = gs_now_ms(), until = now + GS_CLIENT_HANDSHAKE_MS;
  char why[400];
  int err = gs__client_tls_start(cl->tls, cl->fd, cl->host, &cl->ssl);

  if (err)
    snprintf(why, sizeof(why), "cannot start a session: %s", gs_strerror(err));
  while (!err) {
    short wait;

    err = gs__client_tls_handshake(cl->ssl, &wait, why, sizeof(why));
    if (err || !wait)
      break;
    err = wait_fd(cl, cl->fd, wait, until < deadline ? until : deadline);
    if (err == GS_ETIMEDOUT && until < deadline) {
      snprintf(why, sizeof(why),
               "handshake not done within %u ms (does the coordinator run without --tls-cert?)",
               GS_CLIENT_HANDSHAKE_MS);
      err = GS_ECLOSED;
    } else if (err == GS_ETIMEDOUT) {
      snprintf(why, sizeof(why), "handshake timed out");
    } else if (err && err != GS_EINTR) {
      snprintf(why, sizeof(why), "%s", gs_strerror(err));
      err = GS_ECLOSED;
    }
  }
  if (err && err != GS_EINTR)
    gs__client_set_err(cl, "coordinator %s: TLS %s", cl->addr, why);
  if (err)
    close_conn(cl);
  return err;
}

/* Resolves the coordinator's address and connects to the first address
 * that answers, in TLS when configured. Name resolution itself is not
 * bounded by the deadline. */
static int dial(gs_client_t *cl, uint64_t deadline)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
  char port[8];
  int rc, err = GS_EUNAVAIL;

  /* A node agent's socket on this host (unix:PATH): no name, no TLS. */
  if (!strncmp(cl->host, GS_UNIX_PREFIX, strlen(GS_UNIX_PREFIX))) {
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    struct addrinfo local = {.ai_family = AF_UNIX,
                             .ai_socktype = SOCK_STREAM,
                             .ai_addr = (struct sockaddr *)&sun,
                             .ai_addrlen = sizeof(sun)};

    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", cl->host + strlen(GS_UNIX_PREFIX));
    return dial_one(cl, &local, deadline);
  }
  snprintf(port, sizeof(port), "%u", cl->port);
  rc = getaddrinfo(cl->host[0] ? cl->host : NULL, port, &hints, &res);
  if (rc) {
    gs__client_set_err(cl, "resolve %s: %s", cl->addr, gai_strerror(rc));
    return GS_EUNAVAIL;
  }
  for (ai = res; ai; ai = ai->ai_next) {
    err = dial_one(cl, ai, deadline);
    if (!err || err == GS_ETIMEDOUT || err == GS_EINTR)
      break;
  }
  freeaddrinfo(res);
  if (!err && cl->tls)
    err = handshake(cl, deadline);
  if (!err)
    gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "connected to coordinator %s%s", cl->addr,
           cl->tls ? " (TLS)" : "");
  return err;
}

/* Whether the open connection still looks usable: the server may have
 * closed it while we were idle (its --idle-timeout), which is no failure
 * and needs no backoff. Replies already queued are left for the reader. */
static bool conn_alive(gs_client_t *cl)
{
  struct pollfd pfd = {.fd = cl->fd, .events = POLLIN | POLLRDHUP};

  if (poll(&pfd, 1, 0) <= 0)
    return true;
  return !(pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* The TLS side of send_all and fill: one SSL step, then its wait. */
static int tls_io(gs_client_t *cl, bool writing, uint8_t *p, size_t len, size_t *done,
                  uint64_t deadline)
{
  char why[400];
  short wait;
  int err = gs__client_tls_io(cl->ssl, writing, p, len, done, &wait, why, sizeof(why));

  if (err) {
    gs__client_set_err(cl, "coordinator %s: TLS %s", cl->addr, why);
    return err;
  }
  if (!wait)
    return 0;
  err = wait_fd(cl, cl->fd, wait, deadline);
  return err == GS_ETIMEDOUT || err == GS_EINTR || !err ? err : GS_ECLOSED;
}

/* Writes the whole request frame through TLS. */
static int tls_send_all(gs_client_t *cl, uint64_t deadline)
{
  uint8_t *p = cl->wbuf.data;
  size_t left = cl->wbuf.len;

  while (left) {
    size_t done;
    int err = tls_io(cl, true, p, left, &done, deadline);

    if (err)
      return err;
    p += done;
    left -= done;
  }
  return 0;
}

/* Writes the whole request frame: 0, GS_ETIMEDOUT, GS_ECLOSED, or
 * GS_EPROTO (TLS failed). */
static int send_all(gs_client_t *cl, uint64_t deadline)
{
  const uint8_t *p = cl->wbuf.data;
  size_t left = cl->wbuf.len;
  int err;

  if (cl->ssl)
    return tls_send_all(cl, deadline);
  while (left) {
    ssize_t n = send(cl->fd, p, left, MSG_NOSIGNAL);

    if (n > 0) {
      p += n;
      left -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      gs__client_set_err(cl, "send to %s: %s", cl->addr, strerror(errno));
      return GS_ECLOSED;
    }
    err = wait_fd(cl, cl->fd, POLLOUT, deadline);
    if (err)
      return err == GS_ETIMEDOUT || err == GS_EINTR ? err : GS_ECLOSED;
  }
  return 0;
}

/* Reads what the socket has into rbuf, waiting for it until the deadline:
 * 0, GS_ETIMEDOUT, GS_ECLOSED, GS_ENOMEM, or GS_EPROTO (TLS failed). */
static int fill(gs_client_t *cl, uint64_t deadline)
{
  int err = gs_buf_reserve(&cl->rbuf, READ_CHUNK);

  if (err) {
    gs__client_set_err(cl, "no memory for a reply from %s", cl->addr);
    return err;
  }
  while (cl->ssl) {
    size_t got;

    err = tls_io(cl, false, cl->rbuf.data + cl->rbuf.len, READ_CHUNK, &got, deadline);
    cl->rbuf.len += got;
    if (err || got)
      return err;
  }
  for (;;) {
    ssize_t n = recv(cl->fd, cl->rbuf.data + cl->rbuf.len, READ_CHUNK, 0);

    if (n > 0) {
      cl->rbuf.len += (size_t)n;
      return 0;
    }
    if (n == 0) {
      gs__client_set_err(cl, "coordinator %s closed the connection", cl->addr);
      return GS_ECLOSED;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      gs__client_set_err(cl, "recv from %s: %s", cl->addr, strerror(errno));
      return GS_ECLOSED;
    }
    err = wait_fd(cl, cl->fd, POLLIN, deadline);
    if (err)
      return err == GS_ETIMEDOUT || err == GS_EINTR ? err : GS_ECLOSED;
  }
}

/* Whether the bytes received start like an HTTP response: an agent
 * pointed at the coordinator's HTTP port reads one where a frame's length
 * should be. */
static bool looks_like_http(const gs_buf_t *b)
{
  return b->len >= 5 && memcmp(b->data, "HTTP/", 5) == 0;
}

/* Whether the bytes received start like a TLS alert record: a coordinator
 * with TLS answers a client without it with one where a frame's length
 * should be. */
static bool looks_like_tls_alert(const gs_buf_t *b)
{
  return b->len >= 3 && b->data[0] == 0x15 && b->data[1] == 0x03 && b->data[2] <= 0x04;
}

/* Waits for one whole frame in rbuf; *used is what it occupies. */
static int read_frame(gs_client_t *cl, uint64_t deadline, const uint8_t **payload, size_t *len,
                      size_t *used)
{
  for (;;) {
    long n = gs_frame_parse(cl->rbuf.data, cl->rbuf.len, GS_FRAME_DEFAULT_MAX, payload, len);
    int err;

    if (n > 0) {
      *used = (size_t)n;
      return 0;
    }
    if (n < 0 && looks_like_tls_alert(&cl->rbuf)) {
      gs__client_set_err(cl,
                         "coordinator %s answered in TLS: it runs with --tls-cert; give the "
                         "agent --tls-ca (the CA that signed the coordinator's certificate)",
                         cl->addr);
      return GS_EPROTO;
    }
    if (n < 0 && looks_like_http(&cl->rbuf)) {
      gs__client_set_err(cl,
                         "%s answered like an HTTP server, not the coordinator's RPC port: is "
                         "that the coordinator's --http address? --coordinator takes the "
                         "address of its --listen",
                         cl->addr);
      return GS_EPROTO;
    }
    if (n < 0) {
      gs__client_set_err(cl, "coordinator %s sent a frame over the %u-byte limit", cl->addr,
                         GS_FRAME_DEFAULT_MAX);
      return GS_ETOOBIG;
    }
    err = fill(cl, deadline);
    if (err)
      return err;
  }
}

/* Handles the reply to our request: the coordinator's error, or the body
 * decoded into the caller's response. */
static int take_reply(gs_client_t *cl, call_t *c, const gradsync_Envelope *env,
                      const gs_buf_t *body)
{
  char why[128];

  if (env->status) {
    if (env->message[0])
      gs__client_set_err(cl, "%s", env->message);
    else
      gs__client_set_err(cl, "%s: %s from coordinator %s", c->name, gs_grpc_code_name(env->status),
                         cl->addr);
    return gs_err_from_grpc(env->status);
  }
  if (!c->resp_fields || !c->resp)
    return 0;
  if (gs_wire_decode(body->data, body->len, c->resp_fields, c->resp, why, sizeof(why))) {
    gs__client_set_err(cl, "cannot decode the %s reply from coordinator %s: %s", c->name, cl->addr,
                       why);
    return GS_EPROTO;
  }
  return 0;
}

/* Reads frames until the reply to this call: replies to earlier calls that
 * timed out are skipped. GS_ECLOSED asks the caller to redial and resend. */
static int await_reply(gs_client_t *cl, call_t *c)
{
  for (;;) {
    gradsync_Envelope env;
    gs_buf_t body = {0};
    const uint8_t *payload;
    size_t len, used;
    char why[128];
    int err = read_frame(cl, c->deadline, &payload, &len, &used);

    if (err == GS_ETIMEDOUT)
      c->timed_out = true;
    if (err == GS_ETIMEDOUT || err == GS_ECLOSED)
      return err;
    if (err) {
      /* An oversized frame: the stream cannot be resynchronised; an
       * interruption: the coordinator may drop the parked call. */
      close_conn(cl);
      return err;
    }
    err = gs_wire_decode_envelope(payload, len, &env, &body, why, sizeof(why));
    gs_buf_consume(&cl->rbuf, used);
    if (err) {
      gs__client_set_err(cl, "undecodable Envelope from coordinator %s: %s", cl->addr, why);
    } else if (env.request_id == 0 && env.status) {
      /* The coordinator refused the connection itself and closes it. */
      gs__client_set_err(cl, "coordinator %s closed the connection: %s", cl->addr, env.message);
      err = gs_err_from_grpc(env.status);
    } else if (env.request_id != c->id) {
      gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "skipping a stale reply (request %llu) to %s",
             (unsigned long long)env.request_id, env.method);
      gs_buf_free(&body);
      continue;
    } else {
      gs__backoff_reset(&cl->backoff);
      err = take_reply(cl, c, &env, &body);
      gs_buf_free(&body);
      return err;
    }
    gs_buf_free(&body);
    close_conn(cl);
    return err;
  }
}

/* How long a parking RPC asks the coordinator to wait: a little less than
 * our own deadline, so that its explanation arrives before we give up. */
uint32_t gs__client_wait_for(uint64_t timeout_ms)
{
  uint64_t margin = timeout_ms / 4 < WAIT_MARGIN_MS ? timeout_ms / 4 : WAIT_MARGIN_MS;
  uint64_t wait = timeout_ms - margin;

  if (wait == 0)
    return 1;
  return wait > UINT32_MAX ? UINT32_MAX : (uint32_t)wait;
}

/* Encodes this call's request frame into wbuf. A resent request asks the
 * coordinator to wait no longer than the time we have left. */
static int encode_request(gs_client_t *cl, call_t *c)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  uint64_t now = gs_now_ms(), left = c->deadline > now ? c->deadline - now : 1;
  uint32_t wait = c->sends++ ? gs__client_wait_for(left) : c->wait_ms;
  int err;

  snprintf(env.method, sizeof(env.method), "%s", c->method);
  env.request_id = c->id;
  if (c->wait_ms)
    env.timeout_ms = wait < c->wait_ms ? wait : c->wait_ms;
  if (cl->token)
    snprintf(env.token, sizeof(env.token), "%s", cl->token);
  snprintf(env.session, sizeof(env.session), "%s", cl->session);
  cl->wbuf.len = 0;
  err = gs_wire_encode_frame(&cl->wbuf, &env, c->req_fields, c->req, GS_FRAME_DEFAULT_MAX);
  if (err)
    gs__client_set_err(cl, "cannot encode the %s request: %s%s", c->name, gs_strerror(err),
                       err == GS_ETOOBIG ? " (over the 4 MiB frame limit)" : "");
  return err;
}

/* The connection broke or could not be made: schedule a redial. */
static int conn_failed(gs_client_t *cl, call_t *c)
{
  close_conn(cl);
  gs__backoff_failed(&cl->backoff, gs_now_ms());
  c->failed_once = true;
  gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "%s: %s; redialling", c->name, cl->err);
  return GS_ECLOSED;
}

/* Sleeps in slices until the next redial may start: 0, GS_EINTR, or
 * GS_ETIMEDOUT (after sleeping until `deadline`) when that is past it. */
static int backoff_wait(gs_client_t *cl, uint64_t deadline)
{
  uint64_t until = cl->backoff.next_ms < deadline ? cl->backoff.next_ms : deadline;

  for (uint64_t now = gs_now_ms(); now < until; now = gs_now_ms()) {
    int err = tick(cl);

    if (err)
      return err;
    poll(NULL, 0, slice_ms(cl, now, until));
  }
  return cl->backoff.next_ms < deadline ? 0 : GS_ETIMEDOUT;
}

/* One try of a call on the current connection (dialled first if needed).
 * GS_ECLOSED: try again on a new connection. */
static int attempt(gs_client_t *cl, call_t *c)
{
  int err;

  if (cl->fd >= 0 && !conn_alive(cl))
    close_conn(cl);
  if (cl->fd < 0) {
    err = backoff_wait(cl, c->deadline);
    if (!err)
      err = dial(cl, c->deadline);
    if (err == GS_ETIMEDOUT) {
      c->failed_once = c->timed_out = true; /* cl->err has the last failure */
      return err;
    }
    if (err == GS_EINTR || err == GS_EPROTO)
      return err; /* GS_EPROTO: TLS refused; redialling would be refused again */
    if (err)
      return conn_failed(cl, c);
  }
  err = encode_request(cl, c);
  if (err)
    return err;
  err = send_all(cl, c->deadline);
  if (err == GS_ETIMEDOUT || err == GS_EINTR) {
    close_conn(cl); /* part of a frame may have gone out: the stream is unusable */
    c->timed_out = err == GS_ETIMEDOUT;
    return err;
  }
  if (err == GS_EPROTO) {
    close_conn(cl);
    return err;
  }
  if (err)
    return conn_failed(cl, c);
  err = await_reply(cl, c);
  return err == GS_ECLOSED ? conn_failed(cl, c) : err;
}

/* The error of a call the owner's signal ended. */
static void interrupted(gs_client_t *cl, const call_t *c)
{
  const char *name = gs_signal_name(*cl->interrupt);

  if (cl->waiting[0])
    gs__client_set_err(cl, "interrupted by %s while waiting for %s", name, cl->waiting);
  else
    gs__client_set_err(cl, "%s: interrupted by %s while waiting for coordinator %s", c->name, name,
                       cl->addr);
}

int gs_client_call(gs_client_t *cl, gs_method_t method, const pb_msgdesc_t *req_fields,
                   const void *req, const pb_msgdesc_t *resp_fields, void *resp, uint32_t wait_ms,
                   uint64_t timeout_ms)
{
  call_t c = {
      .method = gs_method_path(method),
      .name = gs_method_name(method),
      .id = cl->next_id++,
      .req_fields = req_fields,
      .req = req,
      .resp_fields = resp_fields,
      .resp = resp,
      .wait_ms = wait_ms,
      .timeout_ms = timeout_ms,
      .interruptible = method != GS_METHOD_HEARTBEAT && method != GS_METHOD_LEAVE,
  };
  char cause[sizeof(cl->err)];
  int err;

  c.start_ms = gs_now_ms();
  c.progress_at = c.start_ms + cl->progress_ms;
  c.deadline = timeout_ms > UINT64_MAX - c.start_ms ? UINT64_MAX : c.start_ms + timeout_ms;
  if (method >= GS_METHOD_COUNT ||
      (cl->token && strlen(cl->token) >= sizeof(((gradsync_Envelope *)0)->token))) {
    gs__client_set_err(cl, "%s: unknown method, or the token is too long", c.name);
    cl->waiting[0] = '\0';
    return GS_EINVAL;
  }
  cl->cur = &c;
  do {
    err = attempt(cl, &c);
  } while (err == GS_ECLOSED);
  cl->cur = NULL;
  if (err == GS_EINTR)
    interrupted(cl, &c);
  cl->waiting[0] = '\0';
  if (!c.timed_out)
    return err; /* a DEADLINE_EXCEEDED from the coordinator keeps its message */
  memcpy(cause, cl->err, sizeof(cause));
  if (c.failed_once)
    gs__client_set_err(cl, "%s: no reply within %llu ms: %s", c.name,
                       (unsigned long long)timeout_ms, cause);
  else
    gs__client_set_err(cl, "%s: no reply from coordinator %s within %llu ms", c.name, cl->addr,
                       (unsigned long long)timeout_ms);
  return GS_ETIMEDOUT;
}
