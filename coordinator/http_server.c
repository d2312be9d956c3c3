/* HTTP/1.1 server: one libuv listener, one struct per connection embedding
 * its handles, and http-parser to cut requests out of the byte stream.
 * Handlers are synchronous, so each request is answered from
 * on_message_complete; uv_write keeps the replies to pipelined requests in
 * order without a queue of our own. A connection that must end (an error
 * reply, `Connection: close`, end of input) stops parsing, flushes its
 * replies, shuts down its write side and lingers briefly for the peer's EOF,
 * so that a reply is not lost to a reset caused by unread request bytes.
 * Open connections are capped (limits.max_connections): at the cap a new
 * one closes the one idle longest (else the one furthest behind on its
 * replies), so that idle or non-reading clients, which need no token,
 * cannot take every descriptor. A handler may turn its reply into
 * an event stream (gs_http_response_t.on_stream_close): the connection
 * then stays open, reads nothing more, and is written to by its owner
 * through gs_http_stream_write until one side ends it.
 *
 * A connection answers at most TURN_REQUESTS pipelined requests per read
 * (then the rest waits for the loop's next turn, so one client cannot hold
 * the loop), and is held, not read, while its unread replies pass its
 * share of the memory budget (gs_http_limits_t.mem); the bytes of a
 * request not parsed yet wait in the connection, counted too.
 *
 * The connection's socket, TLS session, writes and the end of its write
 * side are the connection base's (stream.h). */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <http_parser.h>

#include "http_server.h"

#include "buf.h"
#include "list.h"
#include "net.h"
#include "ratelimit.h"
#include "stream.h"

#define MAX_WRITE_QUEUE (16u << 20) /* a client this far behind on replies is dropped */
#define TURN_REQUESTS 8             /* pipelined requests answered per read, per connection */
#define HTTP_SHARE 4                /* the HTTP port holds at most this part of the budget */
#define HOLD_MIN (64u << 10)        /* a connection's share of the budget, at least */
#define HOLD_MAX (1u << 20)         /* and at most */
#define LINGER_MS 2000              /* wait for the peer's EOF after our last reply */
#define DEFAULT_TYPE "application/json"

/* A connection is also the handle of the stream it may carry. */
typedef struct gs_http_stream http_conn_t;

/* The connection of a stream of the base (its first member). */
#define HCONN_OF(stream) GS_CONTAINER_OF(stream, http_conn_t, s)

struct gs_http_server {
  gs_stream_port_t base; /* its read buffer and next-turn queue (stream.h) */
  uv_loop_t *loop;
  const gs_log_t *log;
  gs_http_limits_t limits;
  gs_http_handler_fn handler;
  void *ctx;
  uv_tcp_t listener;
  http_conn_t *conns; /* every connection not yet freed */
  size_t open;        /* connections not closing: each holds a descriptor */
  /* The connections that owe no reply, by when they last became idle or
   * began a request, oldest first: where the cap finds one to close. */
  gs_list_t quiet;
  gs_list_t streams; /* the open event streams, oldest first */
  size_t streams_open;
  uint64_t evicted, refused; /* at the cap */
  gs_ratelimit_t cap_rl;     /* lines about the cap, for the whole port */
  gs_ratelimit_t accept_rl;  /* failed accepts */
  uint16_t port;
  gs_tls_ctx_t *tls;     /* borrowed; NULL: plaintext */
  gs_log_limit_t *lines; /* limits.lines, or own_lines */
  gs_log_limit_t own_lines;
  size_t hold; /* replies waiting past this hold a connection (gs_http_limits_t.mem) */
  bool closing;
  bool listener_closed;
};

struct gs_http_stream {
  gs_stream_t s;    /* first: its socket, peer, TLS session and writes */
  uv_timer_t timer; /* idle timeout, then the linger deadline */
  http_parser parser;
  gs_http_server_t *srv;
  http_conn_t *prev, *next;
  gs_list_t quiet_node; /* on srv->quiet while no reply is being written */
  /* The request being parsed. */
  gs_buf_t url, field, auth, body; /* NUL-terminated */
  size_t header_bytes;
  int refuse_status; /* set by a callback that refuses the request */
  const char *refuse_why;
  bool in_value; /* the last header callback was on_header_value */
  bool is_auth;  /* the value arriving belongs to Authorization */
  bool has_auth;
  bool keep_alive;
  bool in_request; /* its first bytes came, its end has not */
  /* The connection. */
  unsigned handles; /* handles not yet closed */
  bool draining;    /* no more requests: flush, shut down, then close */
  bool eof;         /* the peer has shut down its side */
  /* An event stream (gs_http_response_t): open while `streaming`. */
  bool streaming;
  gs_list_t stream_node; /* on srv->streams while streaming */
  /* Held: not read until its replies drain (held() under half the
   * server's hold) and, when deferred, until the loop's next turn; the
   * input not parsed yet waits in `pending`. */
  bool held;
  unsigned turn_requests; /* answered since this read began */
  gs_buf_t pending;
  gs_http_stream_fn on_stream_close;
  void *stream_data;
};

/* What the connection holds: replies waiting to be written, and the input
 * not parsed yet, as counted in the budget. */
static size_t held(const http_conn_t *conn)
{
  return conn->s.write_bytes + conn->pending.cap;
}

/* Lets go of a response's body: the handler's malloc'd one, or its share
 * of one several replies share. */
static void body_free(char *body, void (*release)(void *arg), void *arg)
{
  if (release)
    release(arg);
  else
    free(body);
}

/* Logs a line of `kind` about the connection's client ("http: PEER: ..."),
 * limited per address and kind. */
static void conn_log(http_conn_t *conn, gs_log_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_log(http_conn_t *conn, gs_log_kind_t kind, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs__log_limit_vline(conn->srv->lines, uv_now(conn->srv->loop), conn->s.peer, kind, fmt, ap);
  va_end(ap);
}

/* Empties a buffer filled with gs_buf_append_str, keeping its storage. */
static void strbuf_clear(gs_buf_t *b)
{
  b->len = 0;
  if (b->data)
    b->data[0] = '\0';
}

/* Forgets the last request. The URL, header name and Authorization buffers
 * keep their (header-limited) storage; a body may be large, so it goes. */
static void request_reset(http_conn_t *conn)
{
  strbuf_clear(&conn->url);
  strbuf_clear(&conn->field);
  strbuf_clear(&conn->auth);
  gs_buf_free(&conn->body);
  conn->header_bytes = 0;
  conn->refuse_status = 0;
  conn->refuse_why = NULL;
  conn->in_value = conn->is_auth = conn->has_auth = false;
}

static void server_maybe_free(gs_http_server_t *srv)
{
  if (srv->closing && srv->listener_closed && srv->base.next_turn_closed && !srv->conns)
    free(srv);
}

/* What the connection holds changes by `add` and `sub` bytes: counted in
 * the memory budget, as the HTTP port's. */
static void mem_count(http_conn_t *conn, size_t add, size_t sub)
{
  gs_mem_budget_t *mem = conn->srv->limits.mem;

  if (mem) {
    gs_mem_budget_hold(mem, add, sub);
    mem->http = mem->http + add - sub;
  }
}

static void conn_close(http_conn_t *conn);

/* Whether `more` bytes may be held: within the budget, and within the
 * HTTP port's part of it (HTTP_SHARE): one reply may pass a connection's
 * share, and 20 unread 10 MB traces took the budget whole. If not, the
 * connection is closed, with a line saying so. */
static bool mem_allows(http_conn_t *conn, size_t more, const char *what)
{
  gs_mem_budget_t *mem = conn->srv->limits.mem;

  if (!mem || (mem->used + more <= mem->max && mem->http + more <= mem->max / HTTP_SHARE))
    return true;
  conn_log(conn, GS_LOG_KIND_HTTP_LIMIT,
           "%s of %zu bytes would pass the HTTP port's part of the memory budget (a quarter of "
           "--max-memory %zu bytes, %zu held); closing",
           what, more, mem->max, mem->http);
  conn_close(conn);
  return false;
}

static void conn_free(http_conn_t *conn)
{
  gs_http_server_t *srv = conn->srv;

  if (conn->prev)
    conn->prev->next = conn->next;
  else
    srv->conns = conn->next;
  if (conn->next)
    conn->next->prev = conn->prev;
  gs_buf_free(&conn->url);
  gs_buf_free(&conn->field);
  gs_buf_free(&conn->auth);
  gs_buf_free(&conn->body);
  mem_count(conn, 0, conn->pending.cap);
  gs_buf_free(&conn->pending);
  gs_tls_free(conn->s.tls);
  free(conn);
  server_maybe_free(srv);
}

static void on_conn_handle_close(uv_handle_t *h)
{
  http_conn_t *conn = HCONN_OF(h->data);

  if (--conn->handles == 0)
    conn_free(conn);
}

/* Puts the connection at the end of the quiet list, when it owes no
 * reply: it became idle or began a request just now. A stream is never
 * quiet: it has its own list. */
static void quiet_touch(http_conn_t *conn)
{
  gs_list_remove(&conn->quiet_node);
  if (!conn->s.closing && !conn->streaming && conn->s.writes == 0)
    gs_list_insert_tail(&conn->srv->quiet, &conn->quiet_node);
}

/* Ends the connection's stream, if it carries one: its owner hears it
 * once, and writes no more. The connection itself goes on to drain or
 * close. */
static void stream_end(http_conn_t *conn)
{
  gs_http_stream_fn on_close = conn->on_stream_close;

  if (!conn->streaming)
    return;
  conn->streaming = false;
  conn->on_stream_close = NULL;
  gs_list_remove(&conn->stream_node);
  conn->srv->streams_open--;
  on_close(conn->stream_data, conn);
}

/* Closes both handles; the memory goes in the last close callback, so the
 * caller may still touch `conn` until it returns to the loop. Idempotent. */
static void conn_close(http_conn_t *conn)
{
  if (conn->s.closing)
    return;
  conn->s.closing = true;
  conn->srv->open--;
  stream_end(conn);
  gs_list_remove(&conn->quiet_node);
  uv_close((uv_handle_t *)&conn->timer, on_conn_handle_close);
  gs__stream_close(&conn->s, on_conn_handle_close);
}

static void on_timer(uv_timer_t *t)
{
  http_conn_t *conn = HCONN_OF(t->data);

  if (!conn->draining)
    conn_log(conn, GS_LOG_KIND_HTTP_IDLE, "idle for %llu ms; closing",
             (unsigned long long)conn->srv->limits.idle_timeout_ms);
  conn_close(conn);
}

static void timer_restart(http_conn_t *conn, uint64_t ms)
{
  if (ms && !conn->s.closing)
    uv_timer_start(&conn->timer, on_timer, ms, 0);
}

/* Every reply is flushed: send our FIN and give the peer a short while to
 * send its own, unless it already has. */
static void conn_linger(http_conn_t *conn)
{
  uint64_t idle = conn->srv->limits.idle_timeout_ms;

  /* A TLS session ends with a close_notify first (unless the peer ended
   * it); once it is written, on_written comes back here. */
  if (!conn->eof && gs__stream_notify(&conn->s))
    return;
  if (conn->eof || gs__stream_shutdown(&conn->s)) {
    conn_close(conn);
    return;
  }
  timer_restart(conn, idle && idle < LINGER_MS ? idle : LINGER_MS);
}

/* Ends the connection once its queued replies are written. */
static void conn_drain(http_conn_t *conn)
{
  if (conn->s.closing || conn->draining)
    return;
  conn->draining = true;
  conn->in_request = false;
  quiet_touch(conn);
  if (conn->s.writes == 0)
    conn_linger(conn);
}

static void resume(http_conn_t *conn);

/* A queued write ended: a connection owing no more replies is quiet
 * again, and a draining one lingers. */
static void on_written(gs_stream_t *s, int status, bool last)
{
  http_conn_t *conn = HCONN_OF(s);

  (void)last;
  if (conn->s.writes == 0)
    quiet_touch(conn);
  if (status < 0) {
    /* Later writes fail the same way, or are cancelled: log only the first. */
    if (!conn->s.closing)
      conn_log(conn, GS_LOG_KIND_HTTP_IO, "write failed: %s", uv_strerror(status));
    conn_close(conn);
  } else if (conn->draining && conn->s.writes == 0 && !conn->s.closing) {
    conn_linger(conn);
  } else {
    resume(conn); /* its replies drained: what it asked for since is read */
  }
}

/* A write that had to wait: the connection owes a reply, so the cap does
 * not close it for room. */
static void note_queued(http_conn_t *conn, int written)
{
  if (written == GS_STREAM_QUEUED)
    gs_list_remove(&conn->quiet_node);
}

/* Writes bytes as they are (a TLS session's ciphertext, or a reply in
 * plain text to a client that spoke no TLS). False when the connection
 * had to close. */
static bool write_raw(http_conn_t *conn, const uint8_t *data, size_t len)
{
  int written = gs__stream_write_bytes(&conn->s, data, len, false);

  note_queued(conn, written);
  return written >= 0;
}

static bool tls_cipher(void *ctx, const uint8_t *data, size_t len, bool more)
{
  (void)more;
  return write_raw(ctx, data, len);
}

/* A response through the TLS session: head and body encrypted, the
 * ciphertext written as it comes. Takes res->body. */
static void send_response_tls(http_conn_t *conn, char *head, const gs_http_response_t *res,
                              bool with_body)
{
  int err = gs_tls_output(conn->s.tls, (const uint8_t *)head, strlen(head));

  if (!err && with_body && res->body_len)
    err = gs_tls_output(conn->s.tls, (const uint8_t *)res->body, res->body_len);
  free(head);
  body_free(res->body, res->body_release, res->body_arg);
  if (err)
    conn_close(conn);
}

/* Extra header lines: each "Name: value" ended by CRLF, with no other CR
 * or LF and no empty line (which would end the head early). */
static bool headers_are_valid(const char *h)
{
  for (const char *line = h; *line;) {
    const char *end = strpbrk(line, "\r\n");

    if (!end || end == line || !strchr(line, ':') || strchr(line, ':') > end || end[0] != '\r' ||
        end[1] != '\n')
      return false;
    line = end + 2;
  }
  return true;
}

/* Header values come from our own code, but a CR or LF in one would let a
 * handler split the response; such a response is replaced by a 500. */
static bool response_is_valid(const gs_http_response_t *res)
{
  if (res->status < 100 || res->status > 599 || (!res->body && res->body_len))
    return false;
  if (res->content_type && strpbrk(res->content_type, "\r\n"))
    return false;
  if (res->allow && strpbrk(res->allow, "\r\n"))
    return false;
  return !res->headers || headers_are_valid(res->headers);
}

/* Formats the status line and headers (the caller frees them). A
 * stream's head has no Content-Length: its body ends with the connection. */
static char *response_head(const gs_http_response_t *res, bool close)
{
  static const char fmt[] = "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s%s"
                            "Connection: %s\r\n%s%s%s%s\r\n";
  bool sized = !res->on_stream_close;
  char length[32];
  const char *type = res->content_type ? res->content_type : DEFAULT_TYPE;
  const char *extra = res->headers ? res->headers : "";
  const char *reason = http_status_str((enum http_status)res->status);
  const char *conn_hdr = close ? "close" : "keep-alive";
  const char *allow_name = res->allow ? "Allow: " : "";
  const char *allow = res->allow ? res->allow : "";
  const char *allow_end = res->allow ? "\r\n" : "";
  char *head;

  snprintf(length, sizeof(length), "%zu", res->body_len);
  if (asprintf(&head, fmt, res->status, reason, type, sized ? "Content-Length: " : "",
               sized ? length : "", sized ? "\r\n" : "", conn_hdr, allow_name, allow, allow_end,
               extra) < 0)
    return NULL;
  return head;
}

/* Lets go of a response's body once written (stream.h's release). */
static void release_body(void *body)
{
  free(body);
}

/* Queues one response and takes ownership of res->body. `with_body` is
 * false for HEAD, whose reply carries the headers of a GET but no body. */
static void send_response(http_conn_t *conn, const gs_http_response_t *res, bool with_body,
                          bool close)
{
  uv_buf_t bufs[2];
  char *head;
  int written;

  if (conn->s.closing)
    goto out_free_body;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&conn->s.tcp) > MAX_WRITE_QUEUE) {
    conn_log(conn, GS_LOG_KIND_HTTP_LIMIT, "is not reading its replies; closing");
    goto out_close;
  }
  head = response_head(res, close);
  if (!head) {
    gs_log(conn->srv->log, GS_LOG_ERROR, NULL, -1, "http: out of memory replying to %s",
           conn->s.peer);
    goto out_close;
  }
  if (conn->s.tls) {
    send_response_tls(conn, head, res, with_body);
    return;
  }
  if (!with_body || !res->body_len) {
    body_free(res->body, res->body_release, res->body_arg);
    bufs[0] = uv_buf_init(head, (unsigned)strlen(head));
    written = gs__stream_write(&conn->s, bufs, 1, NULL, NULL, 0, false);
  } else {
    /* The body is held, never copied, until written (a shared body is
     * counted once, by its owner). */
    bufs[0] = uv_buf_init(head, (unsigned)strlen(head));
    bufs[1] = uv_buf_init(res->body, (unsigned)res->body_len);
    written =
        gs__stream_write(&conn->s, bufs, 2, res->body_release ? res->body_release : release_body,
                         res->body_release ? res->body_arg : res->body,
                         res->body_release ? 0 : res->body_len, false);
  }
  free(head); /* what waits of it was copied */
  note_queued(conn, written);
  return;

out_close:
  conn_close(conn);
out_free_body:
  body_free(res->body, res->body_release, res->body_arg);
}

/* Replies with a small JSON error and ends the connection. */
static void send_error(http_conn_t *conn, int status, const char *why)
{
  gs_http_response_t res = {.status = status, .content_type = DEFAULT_TYPE};

  if (asprintf(&res.body, "{\"error\":\"%s\"}", why) < 0)
    res.body = NULL;
  res.body_len = res.body ? strlen(res.body) : 0;
  send_response(conn, &res, true, true);
  conn_drain(conn);
}

/* Makes a parser callback fail; on_read replies with `status`. */
static int refuse(http_conn_t *conn, int status, const char *why)
{
  conn->refuse_status = status;
  conn->refuse_why = why;
  return -1;
}

/* Counts the request line and headers against the limit as http-parser
 * hands them over in pieces: the bytes of the URL, names and values, plus
 * four per header for the separator and line end. */
static int count_header_bytes(http_conn_t *conn, size_t n)
{
  conn->header_bytes += n;
  if (conn->header_bytes > conn->srv->limits.max_header_bytes)
    return refuse(conn, 431, "request headers too large");
  return 0;
}

static int on_message_begin(http_parser *p)
{
  http_conn_t *conn = p->data;

  /* Each request gets the whole timeout from its first byte, so a client
   * that trickles bytes cannot hold the connection forever. */
  request_reset(conn);
  conn->in_request = true;
  quiet_touch(conn);
  timer_restart(conn, conn->srv->limits.idle_timeout_ms);
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
  http_conn_t *conn = p->data;

  if (count_header_bytes(conn, n))
    return -1;
  return gs_buf_append_str(&conn->url, at, n) ? refuse(conn, 500, "out of memory") : 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
  http_conn_t *conn = p->data;
  size_t extra = 0;

  if (conn->in_value || conn->field.len == 0) {
    strbuf_clear(&conn->field);
    conn->in_value = false;
    extra = 4;
  }
  if (count_header_bytes(conn, n + extra))
    return -1;
  return gs_buf_append_str(&conn->field, at, n) ? refuse(conn, 500, "out of memory") : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
  http_conn_t *conn = p->data;

  if (!conn->in_value) {
    conn->in_value = true;
    conn->is_auth = !strcasecmp(gs_buf_str(&conn->field), "authorization");
    /* Two credentials are ambiguous: refuse rather than pick one. */
    if (conn->is_auth && conn->has_auth)
      return refuse(conn, 400, "duplicate Authorization header");
    conn->has_auth |= conn->is_auth;
  }
  if (count_header_bytes(conn, n))
    return -1;
  if (conn->is_auth && gs_buf_append_str(&conn->auth, at, n))
    return refuse(conn, 500, "out of memory");
  return 0;
}

static int on_headers_complete(http_parser *p)
{
  http_conn_t *conn = p->data;

  /* We do not speak any upgraded protocol: answer and end. */
  conn->keep_alive = http_should_keep_alive(p) && !p->upgrade;
  /* Refuse a declared oversized body before any of it arrives. */
  if ((p->flags & F_CONTENTLENGTH) && p->content_length > conn->srv->limits.max_body_bytes)
    return refuse(conn, 413, "request body too large");
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
  http_conn_t *conn = p->data;

  if (n > conn->srv->limits.max_body_bytes - conn->body.len)
    return refuse(conn, 413, "request body too large");
  return gs_buf_append_str(&conn->body, at, n) ? refuse(conn, 500, "out of memory") : 0;
}

/* Splits the URL (origin or absolute form) into path and query in place:
 * the byte after each component is a delimiter or the end, so a NUL there
 * harms no other component. */
static int split_target(gs_buf_t *url, gs_http_request_t *req)
{
  struct http_parser_url u;
  const struct {
    int field;
    const char **out;
  } parts[] = {{UF_PATH, &req->path}, {UF_QUERY, &req->query}};

  req->path = "/";
  req->query = "";
  if (!url->data)
    return GS_EPROTO;
  http_parser_url_init(&u);
  if (http_parser_parse_url((const char *)url->data, url->len, 0, &u))
    return GS_EPROTO;
  for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
    if (!(u.field_set & (1 << parts[i].field)))
      continue;
    url->data[u.field_data[parts[i].field].off + u.field_data[parts[i].field].len] = '\0';
    *parts[i].out = (const char *)url->data + u.field_data[parts[i].field].off;
  }
  return 0;
}

/* After a stream's head went out: the connection becomes the stream, or,
 * when it cannot (see gs_http_response_t), the owner hears that it never
 * opened. A live stream is not idle: its timer stops. */
static void stream_start(http_conn_t *conn, const gs_http_response_t *res, bool with_body)
{
  gs_http_server_t *srv = conn->srv;

  if (!with_body || res->status != 200 || conn->s.closing || conn->draining) {
    res->on_stream_close(res->stream_data, NULL);
    return;
  }
  conn->streaming = true;
  conn->on_stream_close = res->on_stream_close;
  conn->stream_data = res->stream_data;
  gs_list_insert_tail(&srv->streams, &conn->stream_node);
  srv->streams_open++;
  uv_timer_stop(&conn->timer);
  if (res->on_stream_open)
    res->on_stream_open(res->stream_data, conn);
}

static int on_message_complete(http_parser *p)
{
  http_conn_t *conn = p->data;
  gs_http_server_t *srv = conn->srv;
  gs_http_request_t req = {
      .method = http_method_str((enum http_method)p->method),
      .authorization = conn->has_auth ? gs_buf_str(&conn->auth) : NULL,
      .peer = conn->s.peer,
      .body = gs_buf_str(&conn->body),
      .body_len = conn->body.len,
  };
  gs_http_response_t res = {0};
  bool stream;

  if (split_target(&conn->url, &req))
    return refuse(conn, 400, "malformed request target");
  srv->handler(srv->ctx, &req, &res);
  if (!response_is_valid(&res)) {
    gs_log(srv->log, GS_LOG_ERROR, NULL, -1, "http: handler gave an invalid %d response to %s %s",
           res.status, req.method, req.path);
    body_free(res.body, res.body_release, res.body_arg);
    if (res.on_stream_close)
      res.on_stream_close(res.stream_data, NULL);
    res = (gs_http_response_t){.status = 500, .body = strdup("{\"error\":\"internal error\"}")};
    res.body_len = res.body ? strlen(res.body) : 0;
  }
  stream = res.on_stream_close != NULL;
  send_response(conn, &res, p->method != HTTP_HEAD, !conn->keep_alive || stream);
  request_reset(conn);
  conn->in_request = false;
  if (stream)
    stream_start(conn, &res, p->method != HTTP_HEAD);
  quiet_touch(conn);
  if (!conn->keep_alive || (stream && !conn->streaming))
    conn_drain(conn);
  /* Stop at this request if the connection is ending (the handler may
   * even have closed the server) or streams; otherwise the idle clock
   * starts again. */
  if (conn->draining || conn->s.closing || conn->streaming) {
    http_parser_pause(p, 1);
    return 0;
  }
  timer_restart(conn, srv->limits.idle_timeout_ms);
  /* Held: its replies wait unread past its share, or it asked for as many
   * as a turn answers; the rest of its input waits (take_bytes). */
  if (held(conn) > srv->hold || ++conn->turn_requests >= TURN_REQUESTS) {
    conn->held = true;
    http_parser_pause(p, 1);
  }
  return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* The parser stopped on an error: log one line (limited), reply and end. */
static void reject_request(http_conn_t *conn, enum http_errno err)
{
  const gs_http_limits_t *lim = &conn->srv->limits;
  int status = conn->refuse_status;
  const char *why = conn->refuse_why;

  if (!status) {
    status = err == HPE_HEADER_OVERFLOW ? 431 : 400;
    why = err == HPE_HEADER_OVERFLOW ? "request headers too large" : "malformed request";
  }
  if (status == 413)
    conn_log(conn, GS_LOG_KIND_HTTP_REQUEST, "sent a body over the %zu-byte limit; replying 413",
             lim->max_body_bytes);
  else if (status == 431)
    conn_log(conn, GS_LOG_KIND_HTTP_REQUEST, "sent headers over the %zu-byte limit; replying 431",
             lim->max_header_bytes);
  else
    conn_log(conn, GS_LOG_KIND_HTTP_REQUEST, "sent a bad request (%s); replying %d",
             conn->refuse_why ? conn->refuse_why : http_errno_description(err), status);
  send_error(conn, status, why);
}

/* Keeps input not parsed yet while the connection is held, within the
 * budget; false if that closed it. */
static bool keep_pending(http_conn_t *conn, const uint8_t *data, size_t len)
{
  size_t cap = conn->pending.cap;

  if (!len)
    return true;
  if (conn->pending.len + len > cap && !mem_allows(conn, len, "a held request"))
    return false;
  if (gs_buf_append(&conn->pending, data, len)) {
    conn_close(conn);
    return false;
  }
  mem_count(conn, conn->pending.cap, cap);
  return true;
}

/* Held for the loop's next turn (it asked for more than a turn answers,
 * and its replies are not what holds it): resumed then (on_next_turn). */
static void defer(http_conn_t *conn)
{
  if (held(conn) <= conn->srv->hold)
    gs__stream_defer(&conn->s);
}

/* Parses request bytes; false once the connection stops taking requests
 * (it ends, streams, or is held: then the rest waits in `pending`). */
static bool take_bytes(http_conn_t *conn, const uint8_t *data, size_t len)
{
  enum http_errno err;
  size_t used;

  used = http_parser_execute(&conn->parser, &parser_settings, (const char *)data, len);
  if (conn->draining || conn->s.closing || conn->streaming)
    return false;
  err = HTTP_PARSER_ERRNO(&conn->parser);
  if (err == HPE_PAUSED && conn->held) {
    if (keep_pending(conn, data + used, len - used)) {
      uv_read_stop((uv_stream_t *)&conn->s.tcp);
      defer(conn);
    }
    return false;
  }
  if (err != HPE_OK) {
    reject_request(conn, err);
    return false;
  }
  return true;
}

static bool tls_plain(void *ctx, const uint8_t *data, size_t len)
{
  return take_bytes(ctx, data, len);
}

/* Told to clients that sent plain HTTP to the TLS port (nginx does the
 * same), so curl shows the reason rather than a reset. */
#define PLAIN_HTTP_BODY "this port speaks TLS only: use https:// (curl --cacert CA)\n"
static const char plain_http_reply[] = "HTTP/1.1 400 Bad Request\r\n"
                                       "Content-Type: text/plain\r\n"
                                       "Content-Length: 59\r\n"
                                       "Connection: close\r\n"
                                       "\r\n" PLAIN_HTTP_BODY;
_Static_assert(sizeof(PLAIN_HTTP_BODY) - 1 == 59, "plain_http_reply's Content-Length");

/* A failed handshake: one line (limited per client address, so a scanner
 * writes few), the plain-text 400 for a plain HTTP request, and
 * the end of the connection. That 400 tells its client what is wrong, and
 * the images' health check (docker/healthcheck.sh, bash cannot speak TLS)
 * gets one every 10 s, so it is logged at debug level only. */
static void tls_failed(http_conn_t *conn)
{
  gs_http_server_t *srv = conn->srv;
  bool http = gs_tls_peer_plain_http(conn->s.tls);

  if (http)
    gs_log(srv->log, GS_LOG_DEBUG, NULL, -1, "http: %s sent plain http to the https port: 400",
           conn->s.peer);
  else
    conn_log(conn, GS_LOG_KIND_HTTP_TLS, "TLS handshake failed: %s", gs_tls_error(conn->s.tls));
  if (http && write_raw(conn, (const uint8_t *)plain_http_reply, sizeof(plain_http_reply) - 1))
    conn_drain(conn);
  else
    conn_close(conn);
}

/* The peer sends no more: replies to complete requests still go out
 * before we close. */
static void end_of_input(http_conn_t *conn)
{
  conn->eof = true;
  stream_end(conn);
  if (conn->draining && conn->s.writes == 0)
    conn_close(conn);
  else
    conn_drain(conn);
}

/* Decrypts what arrived and parses its plaintext into the shared read
 * buffer (the session copied the ciphertext out of it first). */
static void tls_read(http_conn_t *conn, const uint8_t *data, size_t len)
{
  gs_stream_port_t *port = &conn->srv->base;
  int err = gs_tls_input(conn->s.tls, data, len, port->rbuf, sizeof(port->rbuf));

  if (err == GS_EPROTO && !conn->draining && !conn->s.closing)
    tls_failed(conn);
  else if (err == GS_ECLOSED)
    end_of_input(conn); /* its close_notify: it sends no more, and reads no reply to ours */
  else if (err && err != GS_EPROTO)
    conn_close(conn);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* Whether the connection is held by its unread replies: they have not
 * drained to half its share since they passed it (resume's rule). */
static bool behind_on_replies(const http_conn_t *conn)
{
  return conn->held && !conn->s.closing && held(conn) > conn->srv->hold / 2;
}

/* A held connection whose replies drained to half its share, in a later
 * turn: the input that waited is parsed (TURN_REQUESTS more at most),
 * then the socket is read again. */
static void resume(http_conn_t *conn)
{
  gs_buf_t waited = conn->pending;
  bool more = true;

  if (!conn->held || conn->s.closing || conn->draining || conn->streaming ||
      behind_on_replies(conn))
    return;
  gs__stream_undefer(&conn->s);
  conn->held = false;
  conn->turn_requests = 0;
  http_parser_pause(&conn->parser, 0);
  conn->pending = (gs_buf_t){0};
  mem_count(conn, 0, waited.cap);
  if (waited.len)
    more = take_bytes(conn, waited.data, waited.len);
  gs_buf_free(&waited);
  if (more && conn->s.tls)
    tls_read(conn, NULL, 0); /* what the session decrypted no further meanwhile */
  if (!conn->held && !conn->s.closing && !conn->draining && !conn->streaming)
    uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read);
}

/* The loop's next turn, for a connection deferred in the last one. */
static void on_next_turn(gs_stream_t *s)
{
  resume(HCONN_OF(s));
}

static bool may_hold(gs_stream_t *s, size_t more, const char *what)
{
  return mem_allows(HCONN_OF(s), more, what);
}

static void count_writes(gs_stream_t *s, size_t add, size_t sub)
{
  mem_count(HCONN_OF(s), add, sub);
}

static void stream_close(gs_stream_t *s, const char *why)
{
  (void)why;
  conn_close(HCONN_OF(s));
}

static const gs_stream_ops_t stream_ops = {
    .may_hold = may_hold,
    .count = count_writes,
    .on_written = on_written,
    .close = stream_close,
    .on_next_turn = on_next_turn,
};

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  http_conn_t *conn = HCONN_OF(s->data);

  if (nread < 0) {
    if (nread != UV_EOF) {
      conn_log(conn, GS_LOG_KIND_HTTP_IO, "read failed: %s", uv_strerror((int)nread));
      conn_close(conn);
      return;
    }
    end_of_input(conn);
    return;
  }
  /* Bytes after the last request we answer (or one that opened a
   * stream) are read only to be dropped. */
  if (nread == 0 || conn->draining || conn->s.closing || conn->streaming)
    return;
  conn->turn_requests = 0;
  if (conn->s.tls)
    tls_read(conn, (const uint8_t *)buf->base, (size_t)nread);
  else
    take_bytes(conn, (const uint8_t *)buf->base, (size_t)nread);
}

/* Allocates a connection with its handles initialised and links it in. */
static http_conn_t *conn_new(gs_http_server_t *srv)
{
  http_conn_t *conn = calloc(1, sizeof(*conn));

  if (!conn)
    return NULL;
  if (gs__stream_init(&conn->s, &srv->base)) {
    free(conn);
    return NULL;
  }
  uv_timer_init(srv->loop, &conn->timer);
  conn->timer.data = &conn->s;
  conn->handles = 2;
  gs_list_init(&conn->quiet_node);
  gs_list_init(&conn->stream_node);
  conn->srv = srv;
  http_parser_init(&conn->parser, HTTP_REQUEST);
  conn->parser.data = conn;
  conn->next = srv->conns;
  if (srv->conns)
    srv->conns->prev = conn;
  srv->conns = conn;
  srv->open++;
  quiet_touch(conn);
  return conn;
}

/* A failed accept: out of descriptors, most likely, when the open-file
 * limit is below what the caps add up to. A few lines per 10 s. */
static void accept_failed(gs_http_server_t *srv, int err)
{
  uint32_t held_back;

  if (gs_ratelimit_allow(&srv->accept_rl, uv_now(srv->loop), &held_back))
    gs_log(srv->log, GS_LOG_WARN, NULL, -1, "http: accept failed: %s%s (%u such lines held back)",
           uv_strerror(err),
           err == UV_EMFILE || err == UV_ENFILE
               ? " (out of file descriptors: raise the open-file limit or lower "
                 "--max-http-connections or --max-connections)"
               : "",
           held_back);
}

/* The connection furthest behind on its replies: a client that asks and
 * does not read (NULL when none is). Walked only at the cap. */
static http_conn_t *furthest_behind(gs_http_server_t *srv)
{
  http_conn_t *worst = NULL;

  for (http_conn_t *conn = srv->conns; conn; conn = conn->next)
    if (behind_on_replies(conn) && (!worst || held(conn) > held(worst)))
      worst = conn;
  return worst;
}

/* The connection to close at the cap: the one idle longest, else the held
 * one furthest behind on its replies (clients that never read what they
 * asked for cannot hold the port), else the one whose request began
 * first, else the oldest event stream (a dashboard left open must not
 * hold the port); NULL when every one owes a reply it is reading. The
 * walk passes only connections with a request in progress. */
static http_conn_t *eviction_victim(gs_http_server_t *srv)
{
  gs_list_t *first = gs_list_first(&srv->quiet);
  http_conn_t *behind;

  for (gs_list_t *node = first; node && node != &srv->quiet; node = node->next) {
    http_conn_t *conn = GS_CONTAINER_OF(node, http_conn_t, quiet_node);

    if (!conn->in_request)
      return conn;
  }
  behind = furthest_behind(srv);
  if (behind)
    return behind;
  if (first)
    return GS_CONTAINER_OF(first, http_conn_t, quiet_node);
  first = gs_list_first(&srv->streams);
  return first ? GS_CONTAINER_OF(first, http_conn_t, stream_node) : NULL;
}

/* At the cap: closes a connection to admit a new one (true), or says why
 * the new one is refused (false). One line for the port, a few per 10 s. */
static bool make_room(gs_http_server_t *srv)
{
  http_conn_t *old = eviction_victim(srv);
  uint32_t held_back;
  bool say = gs_ratelimit_allow(&srv->cap_rl, uv_now(srv->loop), &held_back);

  if (!old) {
    srv->refused++;
    if (say)
      gs_log(srv->log, GS_LOG_WARN, NULL, -1,
             "http: %zu connections (--max-http-connections), each with a reply being written: "
             "refusing a new connection (%llu refused so far; %u such lines held back)",
             srv->open, (unsigned long long)srv->refused, held_back);
    return false;
  }
  srv->evicted++;
  if (say)
    gs_log(srv->log, GS_LOG_WARN, NULL, -1,
           "http: %zu connections (--max-http-connections): closing %s, the %s, to admit a new "
           "one (%llu closed so far; %u such lines held back)",
           srv->open, old->s.peer,
           old->streaming           ? "oldest event stream"
           : behind_on_replies(old) ? "one furthest behind on its replies"
           : old->in_request        ? "one whose request began first"
                                    : "one idle longest",
           (unsigned long long)srv->evicted, held_back);
  conn_close(old);
  return true;
}

/* Reads once, without waiting, what arrived with a connection just
 * accepted: a request sent with it is answered before the listener
 * accepts more in this loop turn, any of which could close it as the
 * connection idle longest at the cap (a client reconnecting in a loop
 * made /healthz go unanswered so). Only from half the cap on: below it,
 * the read that finds nothing yet cost 3 % of the connections a second
 * the port takes. */
static void read_arrived(http_conn_t *conn)
{
  uv_os_fd_t fd;
  uv_buf_t buf;
  ssize_t n;

  if (uv_fileno((const uv_handle_t *)&conn->s.tcp, &fd))
    return;
  gs__stream_alloc((uv_handle_t *)&conn->s.tcp, GS_STREAM_READ_CHUNK, &buf);
  n = recv(fd, buf.base, buf.len, MSG_DONTWAIT);
  if (n > 0)
    on_read((uv_stream_t *)&conn->s.tcp, n, &buf);
  else if (n == 0)
    on_read((uv_stream_t *)&conn->s.tcp, UV_EOF, &buf);
}

static void on_connection(uv_stream_t *server, int status)
{
  gs_http_server_t *srv = server->data;
  gs_tls_io_t io = {.on_plain = tls_plain, .on_cipher = tls_cipher};
  http_conn_t *conn;
  int err;

  if (status < 0) {
    accept_failed(srv, status);
    return;
  }
  if (srv->limits.max_connections && srv->open >= srv->limits.max_connections && !make_room(srv)) {
    gs__stream_refuse(&srv->base, server);
    return;
  }
  conn = conn_new(srv);
  if (!conn) {
    gs_log(srv->log, GS_LOG_ERROR, NULL, -1, "http: out of memory accepting a connection");
    return;
  }
  io.ctx = conn;
  err = gs__stream_accept(&conn->s, server, srv->tls, false, &io);
  if (err == GS_ENOMEM) {
    gs_log(srv->log, GS_LOG_ERROR, NULL, -1, "http: out of memory for a TLS session");
    conn_close(conn);
    return;
  }
  if (!err)
    err = uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read);
  if (err) {
    accept_failed(srv, err);
    conn_close(conn);
    return;
  }
  timer_restart(conn, srv->limits.idle_timeout_ms);
  if (srv->limits.max_connections && 2 * srv->open >= srv->limits.max_connections)
    read_arrived(conn);
}

gs_http_server_t *gs_http_server_new(uv_loop_t *loop, const gs_log_t *log,
                                     const gs_http_limits_t *limits, gs_http_handler_fn handler,
                                     void *ctx)
{
  gs_http_server_t *srv;
  int err;

  if (!loop || !limits || !handler || !limits->max_header_bytes) {
    gs_log(log, GS_LOG_ERROR, NULL, -1, "http: invalid server arguments");
    return NULL;
  }
  srv = calloc(1, sizeof(*srv));
  if (!srv) {
    gs_log(log, GS_LOG_ERROR, NULL, -1, "http: out of memory creating the server");
    return NULL;
  }
  err = uv_tcp_init(loop, &srv->listener);
  if (err) {
    gs_log(log, GS_LOG_ERROR, NULL, -1, "http: cannot create the listener: %s", uv_strerror(err));
    free(srv);
    return NULL;
  }
  srv->loop = loop;
  srv->log = log;
  srv->limits = *limits;
  srv->lines = limits->lines ? limits->lines : &srv->own_lines;
  gs__log_limit_init(&srv->own_lines, log);
  srv->handler = handler;
  srv->ctx = ctx;
  srv->listener.data = srv;
  gs_list_init(&srv->quiet);
  gs_list_init(&srv->streams);
  gs__stream_port_init(&srv->base, loop, &stream_ops);
  srv->hold = HOLD_MAX;
  if (limits->mem) { /* a quarter of the budget over the connections */
    size_t share =
        limits->mem->max / HTTP_SHARE / (limits->max_connections ? limits->max_connections : 1);

    srv->hold = share < HOLD_MIN ? HOLD_MIN : share > HOLD_MAX ? HOLD_MAX : share;
  }
  return srv;
}

int gs_http_server_listen(gs_http_server_t *srv, const char *host, uint16_t port)
{
  int err;

  if (!srv || !host || srv->closing)
    return GS_EINVAL;
  err = gs_tcp_listen(&srv->listener, host, port, on_connection, srv->log, "http");
  if (!err)
    srv->port = gs_tcp_local_port(&srv->listener);
  return err;
}

void gs_http_server_use_tls(gs_http_server_t *srv, gs_tls_ctx_t *tls)
{
  srv->tls = tls;
}

uint16_t gs_http_server_port(const gs_http_server_t *srv)
{
  return srv->port;
}

size_t gs_http_server_connections(const gs_http_server_t *srv)
{
  return srv->open;
}

size_t gs_http_server_streams(const gs_http_server_t *srv)
{
  return srv->streams_open;
}

int gs_http_stream_write(gs_http_stream_t *conn, const char *data, size_t len)
{
  size_t queued;

  if (!conn->streaming || conn->s.closing)
    return GS_ECLOSED;
  queued = uv_stream_get_write_queue_size((uv_stream_t *)&conn->s.tcp);
  if (queued >= GS_HTTP_STREAM_BACKLOG) {
    conn_log(conn, GS_LOG_KIND_HTTP_LIMIT,
             "is not reading its event stream (%zu bytes queued); closing", queued);
    conn_close(conn);
    return GS_ELIMIT;
  }
  if (conn->s.tls) {
    if (gs_tls_output(conn->s.tls, (const uint8_t *)data, len))
      conn_close(conn);
  } else {
    write_raw(conn, (const uint8_t *)data, len);
  }
  return conn->s.closing ? GS_ECLOSED : 0;
}

static void on_listener_close(uv_handle_t *h)
{
  gs_http_server_t *srv = h->data;

  srv->listener_closed = true;
  server_maybe_free(srv);
}

static void on_port_closed(gs_stream_port_t *p)
{
  server_maybe_free(GS_CONTAINER_OF(p, gs_http_server_t, base));
}

void gs_http_server_close(gs_http_server_t *srv)
{
  if (!srv || srv->closing)
    return;
  srv->closing = true;
  gs__log_limit_close(&srv->own_lines, uv_now(srv->loop)); /* a shared table is its owner's */
  /* The budget's owner may be gone before the connections' close
   * callbacks run: what they held is no longer counted. */
  srv->limits.mem = NULL;
  uv_close((uv_handle_t *)&srv->listener, on_listener_close);
  gs__stream_port_close(&srv->base, on_port_closed);
  for (http_conn_t *conn = srv->conns; conn; conn = conn->next)
    conn_close(conn);
}
