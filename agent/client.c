/* The agent's coordinator client: one blocking TCP connection driven by
 * poll() deadlines, carrying framed Envelopes (proto/README.md), redialled
 * with exponential backoff and jitter when it breaks. */
#include "client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "frame.h"
#include "pb_array.h"
#include "wire.h"
#include "clock.h"
#include "rng.h"

#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u
#define READ_CHUNK (64 * 1024)
#define WAIT_MARGIN_MS 250u   /* a parked RPC ends on the server this much before our deadline */
#define MAX_PARAMS (1u << 20) /* as the coordinator accepts */

struct gs_client {
  char host[256];
  uint16_t port;
  char addr[300]; /* "host:port" or "[v6]:port", for messages */
  char *token;
  char *job;
  const gs_log_t *log;
  gs_log_t default_log; /* used when the config names no log */
  int fd;               /* -1 while disconnected */
  uint64_t next_id;
  uint64_t rng;          /* splitmix64 state for the backoff jitter */
  uint32_t backoff_ms;   /* delay before the next redial after a failure */
  uint64_t next_dial_ms; /* no dial before this time */
  gs_buf_t rbuf;         /* bytes received and not yet parsed */
  gs_buf_t wbuf;         /* the encoded request frame */
  char err[768];
};

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
  bool failed_once; /* a dial or connection failed: cl->err says how */
  bool timed_out;   /* our own deadline passed (not the coordinator's) */
  unsigned sends;   /* how often the request was sent */
} call_t;

static void set_err(gs_client_t *cl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(gs_client_t *cl, const char *fmt, ...)
{
  char text[sizeof(cl->err)];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap); /* fmt's arguments may point into cl->err */
  va_end(ap);
  memcpy(cl->err, text, sizeof(cl->err));
}

/* Schedules the next redial after a failure: the backoff +-25%, then
 * doubles the backoff up to its cap. */
static void note_failure(gs_client_t *cl)
{
  uint32_t ms = cl->backoff_ms, span = ms / 2;

  cl->next_dial_ms = gs_now_ms() + ms - ms / 4 + gs_splitmix64(&cl->rng) % (span + 1);
  cl->backoff_ms = ms * 2 < BACKOFF_MAX_MS ? ms * 2 : BACKOFF_MAX_MS;
}

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
  clock_gettime(CLOCK_REALTIME, &ts);
  cl->rng = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 20 ^ (uint64_t)getpid() << 40 ^
            (uint64_t)(uintptr_t)cl;
  cl->backoff_ms = BACKOFF_MIN_MS;
  return cl;
}

static void close_conn(gs_client_t *cl)
{
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

/* Waits until `fd` is ready for `events` or the deadline passes: 0,
 * GS_ETIMEDOUT, or the poll error. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = events};
    uint64_t now = gs_now_ms();
    int n;

    if (now >= deadline)
      return GS_ETIMEDOUT;
    n = poll(&pfd, 1, deadline - now > 60000 ? 60000 : (int)(deadline - now));
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return gs_err_from_errno(errno);
  }
}

/* Sleeps until the next redial may start; GS_ETIMEDOUT when that is past
 * the deadline (after sleeping until the deadline). */
static int wait_backoff(gs_client_t *cl, uint64_t deadline)
{
  uint64_t until = cl->next_dial_ms < deadline ? cl->next_dial_ms : deadline;

  for (uint64_t now = gs_now_ms(); now < until; now = gs_now_ms()) {
    struct timespec ts = {.tv_sec = (until - now) / 1000,
                          .tv_nsec = (long)((until - now) % 1000) * 1000000};

    nanosleep(&ts, NULL);
  }
  return cl->next_dial_ms < deadline ? 0 : GS_ETIMEDOUT;
}

/* Connects one resolved address without blocking past the deadline. */
static int dial_one(gs_client_t *cl, const struct addrinfo *ai, uint64_t deadline)
{
  int fd, one = 1, soerr = 0, err;
  socklen_t len = sizeof(soerr);

  fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    set_err(cl, "socket for %s: %s", cl->addr, strerror(errno));
    return gs_err_from_errno(errno);
  }
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      soerr = errno;
      goto out_close_socket;
    }
    err = wait_fd(fd, POLLOUT, deadline);
    if (err) {
      set_err(cl, "connect %s: %s", cl->addr, err == GS_ETIMEDOUT ? "timed out" : gs_strerror(err));
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
  set_err(cl, "connect %s: %s", cl->addr, strerror(soerr));
  return gs_err_from_errno(soerr);
}

/* Resolves the coordinator's address and connects to the first address
 * that answers. Name resolution itself is not bounded by the deadline. */
static int dial(gs_client_t *cl, uint64_t deadline)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
  char port[8];
  int rc, err = GS_EUNAVAIL;

  snprintf(port, sizeof(port), "%u", cl->port);
  rc = getaddrinfo(cl->host[0] ? cl->host : NULL, port, &hints, &res);
  if (rc) {
    set_err(cl, "resolve %s: %s", cl->addr, gai_strerror(rc));
    return GS_EUNAVAIL;
  }
  for (ai = res; ai; ai = ai->ai_next) {
    err = dial_one(cl, ai, deadline);
    if (!err || err == GS_ETIMEDOUT)
      break;
  }
  freeaddrinfo(res);
  if (!err)
    gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "connected to coordinator %s", cl->addr);
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

/* Writes the whole request frame: 0, GS_ETIMEDOUT or GS_ECLOSED. */
static int send_all(gs_client_t *cl, uint64_t deadline)
{
  const uint8_t *p = cl->wbuf.data;
  size_t left = cl->wbuf.len;
  int err;

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
      set_err(cl, "send to %s: %s", cl->addr, strerror(errno));
      return GS_ECLOSED;
    }
    err = wait_fd(cl->fd, POLLOUT, deadline);
    if (err)
      return err == GS_ETIMEDOUT ? err : GS_ECLOSED;
  }
  return 0;
}

/* Reads what the socket has into rbuf, waiting for it until the deadline:
 * 0, GS_ETIMEDOUT, GS_ECLOSED, or GS_ENOMEM. */
static int fill(gs_client_t *cl, uint64_t deadline)
{
  int err = gs_buf_reserve(&cl->rbuf, READ_CHUNK);

  if (err) {
    set_err(cl, "no memory for a reply from %s", cl->addr);
    return err;
  }
  for (;;) {
    ssize_t n = recv(cl->fd, cl->rbuf.data + cl->rbuf.len, READ_CHUNK, 0);

    if (n > 0) {
      cl->rbuf.len += (size_t)n;
      return 0;
    }
    if (n == 0) {
      set_err(cl, "coordinator %s closed the connection", cl->addr);
      return GS_ECLOSED;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      set_err(cl, "recv from %s: %s", cl->addr, strerror(errno));
      return GS_ECLOSED;
    }
    err = wait_fd(cl->fd, POLLIN, deadline);
    if (err)
      return err == GS_ETIMEDOUT ? err : GS_ECLOSED;
  }
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
    if (n < 0) {
      set_err(cl, "coordinator %s sent a frame over the %u-byte limit", cl->addr,
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
      set_err(cl, "%s", env->message);
    else
      set_err(cl, "%s: %s from coordinator %s", c->name, gs_grpc_code_name(env->status), cl->addr);
    return gs_err_from_grpc(env->status);
  }
  if (!c->resp_fields || !c->resp)
    return 0;
  if (gs_wire_decode(body->data, body->len, c->resp_fields, c->resp, why, sizeof(why))) {
    set_err(cl, "cannot decode the %s reply from coordinator %s: %s", c->name, cl->addr, why);
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
      close_conn(cl); /* an oversized frame: the stream cannot be resynchronised */
      return err;
    }
    err = gs_wire_decode_envelope(payload, len, &env, &body, why, sizeof(why));
    gs_buf_consume(&cl->rbuf, used);
    if (err) {
      set_err(cl, "undecodable Envelope from coordinator %s: %s", cl->addr, why);
    } else if (env.request_id == 0 && env.status) {
      /* The coordinator refused the connection itself and closes it. */
      set_err(cl, "coordinator %s closed the connection: %s", cl->addr, env.message);
      err = gs_err_from_grpc(env.status);
    } else if (env.request_id != c->id) {
      gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "skipping a stale reply (request %llu) to %s",
             (unsigned long long)env.request_id, env.method);
      gs_buf_free(&body);
      continue;
    } else {
      cl->backoff_ms = BACKOFF_MIN_MS;
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
static uint32_t wait_for(uint64_t timeout_ms)
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
  uint32_t wait = c->sends++ ? wait_for(left) : c->wait_ms;
  int err;

  snprintf(env.method, sizeof(env.method), "%s", c->method);
  env.request_id = c->id;
  if (c->wait_ms)
    env.timeout_ms = wait < c->wait_ms ? wait : c->wait_ms;
  if (cl->token)
    snprintf(env.token, sizeof(env.token), "%s", cl->token);
  cl->wbuf.len = 0;
  err = gs_wire_encode_frame(&cl->wbuf, &env, c->req_fields, c->req, GS_FRAME_DEFAULT_MAX);
  if (err)
    set_err(cl, "cannot encode the %s request: %s%s", c->name, gs_strerror(err),
            err == GS_ETOOBIG ? " (over the 4 MiB frame limit)" : "");
  return err;
}

/* The connection broke or could not be made: schedule a redial. */
static int conn_failed(gs_client_t *cl, call_t *c)
{
  close_conn(cl);
  note_failure(cl);
  c->failed_once = true;
  gs_log(cl->log, GS_LOG_DEBUG, cl->job, -1, "%s: %s; redialling", c->name, cl->err);
  return GS_ECLOSED;
}

/* One try of a call on the current connection (dialled first if needed).
 * GS_ECLOSED: try again on a new connection. */
static int attempt(gs_client_t *cl, call_t *c)
{
  int err;

  if (cl->fd >= 0 && !conn_alive(cl))
    close_conn(cl);
  if (cl->fd < 0) {
    err = wait_backoff(cl, c->deadline);
    if (!err)
      err = dial(cl, c->deadline);
    if (err == GS_ETIMEDOUT) {
      c->failed_once = c->timed_out = true; /* cl->err has the last failure */
      return err;
    }
    if (err)
      return conn_failed(cl, c);
  }
  err = encode_request(cl, c);
  if (err)
    return err;
  err = send_all(cl, c->deadline);
  if (err == GS_ETIMEDOUT) {
    close_conn(cl); /* part of a frame may have gone out: the stream is unusable */
    c->timed_out = true;
    return err;
  }
  if (err)
    return conn_failed(cl, c);
  err = await_reply(cl, c);
  return err == GS_ECLOSED ? conn_failed(cl, c) : err;
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
  };
  char cause[sizeof(cl->err)];
  int err;

  c.deadline = gs_now_ms();
  c.deadline = timeout_ms > UINT64_MAX - c.deadline ? UINT64_MAX : c.deadline + timeout_ms;
  if (method >= GS_METHOD_COUNT ||
      (cl->token && strlen(cl->token) >= sizeof(((gradsync_Envelope *)0)->token))) {
    set_err(cl, "%s: unknown method, or the token is too long", c.name);
    return GS_EINVAL;
  }
  do {
    err = attempt(cl, &c);
  } while (err == GS_ECLOSED);
  if (!c.timed_out)
    return err; /* a DEADLINE_EXCEEDED from the coordinator keeps its message */
  memcpy(cause, cl->err, sizeof(cause));
  if (c.failed_once)
    set_err(cl, "%s: no reply within %llu ms: %s", c.name, (unsigned long long)timeout_ms, cause);
  else
    set_err(cl, "%s: no reply from coordinator %s within %llu ms", c.name, cl->addr,
            (unsigned long long)timeout_ms);
  return GS_ETIMEDOUT;
}

/* Copies the client's job name into a request (kept when the client has none). */
static int put_job(gs_client_t *cl, char *dst, size_t cap)
{
  if (!cl->job[0])
    return 0;
  if (strlen(cl->job) >= cap) {
    set_err(cl, "job name '%s' is longer than %zu bytes", cl->job, cap - 1);
    return GS_EINVAL;
  }
  memcpy(dst, cl->job, strlen(cl->job) + 1);
  return 0;
}

/* Checks a string for a bounded request field. */
static int check_len(gs_client_t *cl, const char *what, const char *s, size_t cap)
{
  if (strlen(s) < cap)
    return 0;
  set_err(cl, "%s '%.40s...' is longer than %zu bytes", what, s, cap - 1);
  return GS_EINVAL;
}

/* Fills a join result from the reply: peers land at their rank's index. */
static int join_result(gs_client_t *cl, const gradsync_JoinResponse *resp,
                       const gs_pb_array_t *peers, gs_join_result_t *out)
{
  const gradsync_Peer *p = peers->items;

  if (resp->world_size == 0 || resp->rank >= resp->world_size) {
    set_err(cl, "coordinator %s answered Join with rank %u of world size %u", cl->addr, resp->rank,
            resp->world_size);
    return GS_EPROTO;
  }
  out->peers = calloc(resp->world_size, sizeof(*out->peers));
  if (!out->peers) {
    set_err(cl, "no memory for %u peers", resp->world_size);
    return GS_ENOMEM;
  }
  for (uint32_t r = 0; r < resp->world_size; r++)
    out->peers[r].rank = r;
  for (size_t i = 0; i < peers->count; i++) {
    gs_peer_t *dst;

    if (p[i].rank >= resp->world_size) {
      set_err(cl, "coordinator %s listed peer rank %u in a world of %u", cl->addr, p[i].rank,
              resp->world_size);
      gs_join_result_free(out);
      return GS_EPROTO;
    }
    dst = &out->peers[p[i].rank];
    snprintf(dst->node, sizeof(dst->node), "%s", p[i].node);
    dst->local_rank = p[i].local_rank;
    snprintf(dst->device, sizeof(dst->device), "%s", p[i].device);
    snprintf(dst->comm_addr, sizeof(dst->comm_addr), "%s", p[i].comm_addr);
  }
  out->rank = resp->rank;
  out->world_size = resp->world_size;
  out->generation = resp->generation;
  out->bcast_period = resp->bcast_period;
  out->heartbeat_interval_ms = resp->heartbeat_interval_ms;
  out->heartbeat_timeout_ms = resp->heartbeat_timeout_ms;
  return 0;
}

int gs_client_join(gs_client_t *cl, gradsync_JoinRequest *req, uint64_t timeout_ms,
                   gs_join_result_t *out)
{
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gs_pb_array_t peers;
  int err;

  memset(out, 0, sizeof(*out));
  err = put_job(cl, req->job, sizeof(req->job));
  if (err)
    return err;
  gs_pb_array_init(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer),
                   req->world_size ? req->world_size : 1);
  gs_pb_array_bind_decode(&resp.peers, &peers);
  err = gs_client_call(cl, GS_METHOD_JOIN, gradsync_JoinRequest_fields, req,
                       gradsync_JoinResponse_fields, &resp, wait_for(timeout_ms), timeout_ms);
  if (!err)
    err = join_result(cl, &resp, &peers, out);
  gs_pb_array_free(&peers);
  return err;
}

void gs_join_result_free(gs_join_result_t *r)
{
  if (!r)
    return;
  free(r->peers);
  memset(r, 0, sizeof(*r));
}

int gs_client_publish(gs_client_t *cl, uint64_t generation, const char *key, const void *value,
                      size_t len, uint64_t timeout_ms)
{
  gradsync_PublishRequest *req = calloc(1, sizeof(*req));
  gradsync_PublishResponse resp = gradsync_PublishResponse_init_zero;
  int err;

  if (!req) {
    set_err(cl, "no memory to publish '%s'", key);
    return GS_ENOMEM;
  }
  err = put_job(cl, req->job, sizeof(req->job));
  if (!err)
    err = check_len(cl, "blob key", key, sizeof(req->key));
  if (!err && len > sizeof(req->value.bytes)) {
    set_err(cl, "blob '%s' is %zu bytes; the limit is %zu", key, len, sizeof(req->value.bytes));
    err = GS_EINVAL;
  }
  if (err)
    goto out_free_req;
  req->generation = generation;
  snprintf(req->key, sizeof(req->key), "%s", key);
  if (len)
    memcpy(req->value.bytes, value, len);
  req->value.size = (pb_size_t)len;
  err = gs_client_call(cl, GS_METHOD_PUBLISH, gradsync_PublishRequest_fields, req,
                       gradsync_PublishResponse_fields, &resp, 0, timeout_ms);
out_free_req:
  free(req);
  return err;
}

int gs_client_fetch(gs_client_t *cl, uint64_t generation, const char *key, void *value, size_t cap,
                    size_t *len, uint64_t timeout_ms)
{
  gradsync_FetchRequest req = gradsync_FetchRequest_init_zero;
  gradsync_FetchResponse *resp = calloc(1, sizeof(*resp));
  int err;

  if (!resp) {
    set_err(cl, "no memory to fetch '%s'", key);
    return GS_ENOMEM;
  }
  err = put_job(cl, req.job, sizeof(req.job));
  if (!err)
    err = check_len(cl, "blob key", key, sizeof(req.key));
  if (err)
    goto out_free_resp;
  req.generation = generation;
  snprintf(req.key, sizeof(req.key), "%s", key);
  err = gs_client_call(cl, GS_METHOD_FETCH, gradsync_FetchRequest_fields, &req,
                       gradsync_FetchResponse_fields, resp, wait_for(timeout_ms), timeout_ms);
  if (err)
    goto out_free_resp;
  *len = resp->value.size;
  if (resp->value.size > cap) {
    set_err(cl, "blob '%s' is %u bytes; the buffer holds %zu", key, (unsigned)resp->value.size,
            cap);
    err = GS_ERANGE;
    goto out_free_resp;
  }
  if (resp->value.size)
    memcpy(value, resp->value.bytes, resp->value.size);
out_free_resp:
  free(resp);
  return err;
}

/* The wire form of the params: ParamInfo structs (caller frees). */
static int param_infos(gs_client_t *cl, const gs_param_desc_t *params, uint32_t n,
                       gradsync_ParamInfo **out)
{
  gradsync_ParamInfo *info = calloc(n ? n : 1, sizeof(*info));

  if (!info) {
    set_err(cl, "no memory for %u params", n);
    return GS_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (check_len(cl, "param name", params[i].name, sizeof(info[i].name))) {
      free(info);
      return GS_EINVAL;
    }
    snprintf(info[i].name, sizeof(info[i].name), "%s", params[i].name);
    info[i].elements = params[i].elements;
    info[i].dtype = (gradsync_DType)params[i].dtype;
  }
  *out = info;
  return 0;
}

int gs_client_publish_packlist(gs_client_t *cl, uint64_t generation, uint32_t rank,
                               const gs_packlist_t *list, const gs_param_desc_t *params, uint32_t n,
                               uint64_t timeout_ms)
{
  gradsync_PublishPackListRequest req = gradsync_PublishPackListRequest_init_zero;
  gradsync_PublishPackListResponse resp = gradsync_PublishPackListResponse_init_zero;
  gs_pb_array_t infos, sizes, order;
  gradsync_ParamInfo *info;
  char why[256];
  int err;

  err = put_job(cl, req.job, sizeof(req.job));
  if (err)
    return err;
  if (gs_packlist_validate(list, params, n, why, sizeof(why))) {
    set_err(cl, "refusing to publish an invalid pack list: %s", why);
    return GS_EINVAL;
  }
  err = param_infos(cl, params, n, &info);
  if (err)
    return err;
  req.generation = generation;
  req.rank = rank;
  req.has_pack_list = true;
  req.pack_list.threshold_bytes = list->threshold_bytes;
  gs_pb_array_view(&infos, gradsync_ParamInfo_fields, sizeof(*info), info, n);
  gs_pb_array_view(&sizes, NULL, sizeof(uint32_t), list->pack_sizes, list->pack_count);
  gs_pb_array_view(&order, NULL, sizeof(uint32_t), list->order, list->param_count);
  gs_pb_array_bind_encode(&req.pack_list.params, &infos);
  gs_pb_array_bind_encode(&req.pack_list.pack_sizes, &sizes);
  gs_pb_array_bind_encode(&req.pack_list.pack_params, &order);
  err =
      gs_client_call(cl, GS_METHOD_PUBLISH_PACK_LIST, gradsync_PublishPackListRequest_fields,
                     &req, gradsync_PublishPackListResponse_fields, &resp, 0, timeout_ms);
  free(info);
  return err;
}

void gs_client_params_free(gs_param_desc_t *params, uint32_t n)
{
  if (!params)
    return;
  for (uint32_t i = 0; i < n; i++)
    free((char *)params[i].name);
  free(params);
}

/* Turns the decoded wire arrays into a checked pack list and params; the
 * list takes over the index arrays. */
static int unpack_list(gs_client_t *cl, uint64_t threshold, gs_pb_array_t *infos,
                       gs_pb_array_t *sizes, gs_pb_array_t *order, gs_packlist_t *list,
                       gs_param_desc_t **params, uint32_t *n)
{
  const gradsync_ParamInfo *info = infos->items;
  uint32_t count = (uint32_t)infos->count;
  gs_param_desc_t *descs = calloc(count ? count : 1, sizeof(*descs));
  gs_packlist_t l = {
      .threshold_bytes = threshold,
      .param_count = (uint32_t)order->count,
      .pack_count = (uint32_t)sizes->count,
      .pack_sizes = sizes->items,
      .order = order->items,
  };
  char why[256];

  if (!descs)
    goto out_nomem;
  for (uint32_t i = 0; i < count; i++) {
    descs[i] = (gs_param_desc_t){strdup(info[i].name), info[i].elements, (gs_dtype_t)info[i].dtype};
    if (!descs[i].name) {
      gs_client_params_free(descs, i);
      goto out_nomem;
    }
  }
  if (gs_packlist_validate(&l, descs, count, why, sizeof(why))) {
    set_err(cl, "coordinator %s sent an invalid pack list: %s", cl->addr, why);
    gs_client_params_free(descs, count);
    return GS_EPROTO;
  }
  *list = l;
  sizes->items = order->items = NULL;
  *params = descs;
  *n = count;
  return 0;

out_nomem:
  set_err(cl, "no memory for a pack list of %u params", count);
  return GS_ENOMEM;
}

int gs_client_fetch_packlist(gs_client_t *cl, uint64_t generation, gs_packlist_t *list,
                             gs_param_desc_t **params, uint32_t *n, uint64_t timeout_ms)
{
  gradsync_FetchPackListRequest req = gradsync_FetchPackListRequest_init_zero;
  gradsync_FetchPackListResponse resp = gradsync_FetchPackListResponse_init_zero;
  gs_pb_array_t infos, sizes, order;
  int err;

  err = put_job(cl, req.job, sizeof(req.job));
  if (err)
    return err;
  req.generation = generation;
  gs_pb_array_init(&infos, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), MAX_PARAMS);
  gs_pb_array_init(&sizes, NULL, sizeof(uint32_t), MAX_PARAMS);
  gs_pb_array_init(&order, NULL, sizeof(uint32_t), MAX_PARAMS);
  gs_pb_array_bind_decode(&resp.pack_list.params, &infos);
  gs_pb_array_bind_decode(&resp.pack_list.pack_sizes, &sizes);
  gs_pb_array_bind_decode(&resp.pack_list.pack_params, &order);
  err = gs_client_call(cl, GS_METHOD_FETCH_PACK_LIST, gradsync_FetchPackListRequest_fields,
                       &req, gradsync_FetchPackListResponse_fields, &resp, wait_for(timeout_ms),
                       timeout_ms);
  if (!err && !resp.has_pack_list) {
    set_err(cl, "coordinator %s answered FetchPackList without a pack list", cl->addr);
    err = GS_EPROTO;
  }
  if (!err)
    err = unpack_list(cl, resp.pack_list.threshold_bytes, &infos, &sizes, &order, list, params, n);
  gs_pb_array_free(&infos);
  gs_pb_array_free(&sizes);
  gs_pb_array_free(&order);
  return err;
}

int gs_client_heartbeat(gs_client_t *cl, const gradsync_HeartbeatRequest *req,
                        gradsync_HeartbeatResponse *resp, uint64_t timeout_ms)
{
  gradsync_HeartbeatRequest r = *req;
  int err = put_job(cl, r.job, sizeof(r.job));

  if (err)
    return err;
  *resp = (gradsync_HeartbeatResponse)gradsync_HeartbeatResponse_init_zero;
  return gs_client_call(cl, GS_METHOD_HEARTBEAT, gradsync_HeartbeatRequest_fields, &r,
                        gradsync_HeartbeatResponse_fields, resp, 0, timeout_ms);
}

int gs_client_leave(gs_client_t *cl, uint64_t generation, uint32_t rank, bool finished,
                    const char *reason, uint64_t timeout_ms)
{
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;
  gradsync_LeaveResponse resp = gradsync_LeaveResponse_init_zero;
  int err = put_job(cl, req.job, sizeof(req.job));

  if (err)
    return err;
  req.generation = generation;
  req.rank = rank;
  req.finished = finished;
  snprintf(req.reason, sizeof(req.reason), "%s", reason ? reason : ""); /* truncation is fine */
  return gs_client_call(cl, GS_METHOD_LEAVE, gradsync_LeaveRequest_fields, &req,
                        gradsync_LeaveResponse_fields, &resp, 0, timeout_ms);
}
