/* Tests for coordinator/http_server.c. The server runs on its own loop in a
 * thread; the test thread talks to it over blocking sockets, reads replies
 * with http-parser in response mode, and stops the loop through a
 * uv_async_t, after which the loop must close with no handle left. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "http_server.h"
#include "clock.h"
#include "runner.h"

#define LOG_MAX 65536

struct fixture {
  uv_loop_t loop;
  uv_async_t stop;
  gs_http_server_t *srv;
  gs_log_t log;
  FILE *log_file;
  pthread_t thread;
  uint16_t port;
  unsigned requests;      /* written on the loop thread, read after join */
  char log_text[LOG_MAX]; /* the server's log, read after join */
  /* The loop's turns (a check handle counts them) and the most requests
   * answered in one: read after join. */
  uv_check_t turns;
  unsigned turn, turn_seen, in_turn, most_in_turn;
  unsigned shared_held; /* references to `shared` the server holds (/shared) */
};

static void on_turn(uv_check_t *h)
{
  struct fixture *f = h->data;

  f->turn++;
}

/* A body several replies share (gs_http_response_t.body_release). */
static char shared[4096];

static void shared_release(void *arg)
{
  struct fixture *f = arg;

  f->shared_held--;
}

/* Echoes the request as JSON. /allow answers 405 with an Allow header,
 * /count the number of open connections and /shared the shared body. */
static void echo_handler(void *ctx, const gs_http_request_t *req, gs_http_response_t *res)
{
  struct fixture *f = ctx;
  char *auth = NULL;
  int n;

  f->requests++;
  if (f->turn != f->turn_seen)
    f->turn_seen = f->turn, f->in_turn = 0;
  if (++f->in_turn > f->most_in_turn)
    f->most_in_turn = f->in_turn;
  res->status = 200;
  res->content_type = "application/json";
  if (!strcmp(req->path, "/allow")) {
    res->status = 405;
    res->allow = "GET, POST";
    n = asprintf(&res->body, "{}");
  } else if (!strcmp(req->path, "/count")) {
    n = asprintf(&res->body, "%zu", gs_http_server_connections(f->srv));
  } else if (!strcmp(req->path, "/shared")) {
    memset(shared, 'x', sizeof(shared));
    f->shared_held++;
    res->body = shared;
    res->body_len = sizeof(shared);
    res->body_release = shared_release;
    res->body_arg = f;
    return;
  } else {
    if (req->authorization && asprintf(&auth, "\"%s\"", req->authorization) < 0)
      auth = NULL;
    n = asprintf(&res->body,
                 "{\"method\":\"%s\",\"path\":\"%s\",\"query\":\"%s\",\"auth\":%s,"
                 "\"body\":\"%.*s\"}",
                 req->method, req->path, req->query, auth ? auth : "null", (int)req->body_len,
                 req->body);
    free(auth);
  }
  if (n < 0)
    res->body = NULL;
  res->body_len = res->body ? strlen(res->body) : 0;
}

static void *loop_thread(void *arg)
{
  struct fixture *f = arg;

  uv_run(&f->loop, UV_RUN_DEFAULT);
  return NULL;
}

static void on_stop(uv_async_t *a)
{
  struct fixture *f = a->data;

  gs_http_server_close(f->srv);
  uv_close((uv_handle_t *)a, NULL);
  if (f->turns.data) /* counted by fixture_start's loops */
    uv_close((uv_handle_t *)&f->turns, NULL);
}

static gs_http_limits_t default_limits(void)
{
  return (gs_http_limits_t){
      .max_header_bytes = 8192, .max_body_bytes = 65536, .idle_timeout_ms = 120000};
}

static void fixture_start(struct fixture *f, const gs_http_limits_t *limits)
{
  memset(f, 0, sizeof(*f));
  ck_assert_int_eq(uv_loop_init(&f->loop), 0);
  f->log_file = tmpfile();
  ck_assert_ptr_nonnull(f->log_file);
  f->log = (gs_log_t){.level = GS_LOG_DEBUG, .out = f->log_file, .component = "test"};
  f->srv = gs_http_server_new(&f->loop, &f->log, limits, echo_handler, f);
  ck_assert_ptr_nonnull(f->srv);
  ck_assert_int_eq(gs_http_server_listen(f->srv, "127.0.0.1", 0), 0);
  f->port = gs_http_server_port(f->srv);
  ck_assert_uint_ne(f->port, 0);
  ck_assert_int_eq(uv_async_init(&f->loop, &f->stop, on_stop), 0);
  f->stop.data = f;
  ck_assert_int_eq(uv_check_init(&f->loop, &f->turns), 0);
  f->turns.data = f;
  ck_assert_int_eq(uv_check_start(&f->turns, on_turn), 0);
  ck_assert_int_eq(pthread_create(&f->thread, NULL, loop_thread, f), 0);
}

/* Stops the server, checks the loop closes cleanly and keeps the log. */
static void fixture_stop(struct fixture *f)
{
  size_t n;

  ck_assert_int_eq(uv_async_send(&f->stop), 0);
  ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
  ck_assert_int_eq(uv_loop_close(&f->loop), 0);
  rewind(f->log_file);
  n = fread(f->log_text, 1, sizeof(f->log_text) - 1, f->log_file);
  f->log_text[n] = '\0';
  fclose(f->log_file);
}

static unsigned count_of(const char *hay, const char *needle)
{
  unsigned n = 0;

  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* A blocking client; replies are parsed by http-parser, and bytes past the
 * end of one reply stay in `buf` for the next. */
struct client {
  int fd;
  http_parser parser;
  bool head; /* the next reply answers a HEAD */
  char buf[16384];
  size_t len;
};

struct reply {
  int status;
  char headers[2048]; /* "Name: value\r\n" lines */
  size_t headers_len;
  char body[8192];
  size_t body_len;
  bool in_value;
  bool head;
  bool complete;
};

static void append(char *dst, size_t cap, size_t *len, const char *src, size_t n)
{
  ck_assert_uint_lt(*len + n, cap);
  memcpy(dst + *len, src, n);
  *len += n;
  dst[*len] = '\0';
}

static int on_reply_field(http_parser *p, const char *at, size_t n)
{
  struct reply *r = p->data;

  if (r->in_value)
    append(r->headers, sizeof(r->headers), &r->headers_len, "\r\n", 2);
  r->in_value = false;
  append(r->headers, sizeof(r->headers), &r->headers_len, at, n);
  return 0;
}

static int on_reply_value(http_parser *p, const char *at, size_t n)
{
  struct reply *r = p->data;

  if (!r->in_value)
    append(r->headers, sizeof(r->headers), &r->headers_len, ": ", 2);
  r->in_value = true;
  append(r->headers, sizeof(r->headers), &r->headers_len, at, n);
  return 0;
}

static int on_reply_headers(http_parser *p)
{
  struct reply *r = p->data;

  append(r->headers, sizeof(r->headers), &r->headers_len, "\r\n", 2);
  r->status = p->status_code;
  return r->head ? 1 : 0;
}

static int on_reply_body(http_parser *p, const char *at, size_t n)
{
  struct reply *r = p->data;

  append(r->body, sizeof(r->body), &r->body_len, at, n);
  return 0;
}

static int on_reply_complete(http_parser *p)
{
  struct reply *r = p->data;

  r->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings reply_settings = {
    .on_header_field = on_reply_field,
    .on_header_value = on_reply_value,
    .on_headers_complete = on_reply_headers,
    .on_body = on_reply_body,
    .on_message_complete = on_reply_complete,
};

static int connect_to(struct client *c, int family, uint16_t port)
{
  struct timeval tv = {.tv_sec = 60}; /* only decides failure: a loaded machine is slow */
  struct sockaddr_storage ss = {0};
  socklen_t len;
  int one = 1;

  memset(c, 0, sizeof(*c));
  if (family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    a->sin6_addr = in6addr_loopback;
    len = sizeof(*a);
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;

    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*a);
  }
  c->fd = socket(family, SOCK_STREAM, 0);
  ck_assert_int_ge(c->fd, 0);
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  http_parser_init(&c->parser, HTTP_RESPONSE);
  return connect(c->fd, (struct sockaddr *)&ss, len);
}

static void client_open(struct client *c, uint16_t port)
{
  ck_assert_int_eq(connect_to(c, AF_INET, port), 0);
}

static void client_close(struct client *c)
{
  close(c->fd);
}

static void send_str(struct client *c, const char *s)
{
  size_t n = strlen(s);

  while (n > 0) {
    ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);

    ck_assert_int_gt(w, 0);
    s += w;
    n -= (size_t)w;
  }
}

/* Reads one reply; false on EOF, error or timeout before it is complete. */
static bool read_reply(struct client *c, struct reply *r)
{
  memset(r, 0, sizeof(*r));
  r->head = c->head;
  c->parser.data = r;
  for (;;) {
    if (c->len) {
      size_t used = http_parser_execute(&c->parser, &reply_settings, c->buf, c->len);

      memmove(c->buf, c->buf + used, c->len - used);
      c->len -= used;
      if (r->complete) {
        http_parser_pause(&c->parser, 0);
        return true;
      }
      if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK)
        return false;
    }
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
    if (n <= 0)
      return false;
    c->len += (size_t)n;
  }
}

/* True if the server has closed the connection (EOF or reset, no bytes). */
static bool peer_closed(struct client *c)
{
  char byte;
  ssize_t n;

  if (c->len)
    return false;
  n = recv(c->fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static void expect_echo(struct client *c, const char *json)
{
  struct reply r;

  ck_assert(read_reply(c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert_str_eq(r.body, json);
}

START_TEST(test_keepalive)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.headers, "Connection: keep-alive\r\n"));
  ck_assert_ptr_nonnull(strstr(r.headers, "Content-Type: application/json\r\n"));
  ck_assert_str_eq(r.body, "{\"method\":\"GET\",\"path\":\"/one\",\"query\":\"\",\"auth\":null,"
                           "\"body\":\"\"}");
  send_str(&c, "GET /two HTTP/1.1\r\nHost: x\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/two\""));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 2);
}
END_TEST

START_TEST(test_pipelined)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz"
               "GET /c?q HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/a\""));
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/b\""));
  ck_assert_ptr_nonnull(strstr(r.body, "\"body\":\"xyz\""));
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/c\",\"query\":\"q\""));
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

/* A hundred pipelined requests in one write are all answered, in order,
 * but a turn of the loop answers a few of them only: one client cannot
 * hold the loop (issue 39: a client reading fast kept it 5.5 s). */
START_TEST(test_pipelined_turns)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;
  char all[100 * 32], want[32];
  size_t len = 0;

  for (int i = 0; i < 100; i++)
    len += (size_t)snprintf(all + len, sizeof(all) - len, "GET /r%d HTTP/1.1\r\n\r\n", i);
  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, all);
  for (int i = 0; i < 100; i++) {
    ck_assert(read_reply(&c, &r));
    snprintf(want, sizeof(want), "\"path\":\"/r%d\"", i);
    ck_assert_msg(strstr(r.body, want), "reply %d: %s", i, r.body);
  }
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 100);
  ck_assert_msg(f.most_in_turn <= 8, "%u requests answered in one turn", f.most_in_turn);
}
END_TEST

/* A body several replies share is released once per reply, never freed:
 * written at once, queued behind a client that reads late, or dropped with
 * a connection that goes away (ASan: no free of `shared`). */
START_TEST(test_shared_body)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;
  char all[8 * 64];
  size_t len = 0;

  for (int i = 0; i < 8; i++)
    len += (size_t)snprintf(all + len, sizeof(all) - len, "GET /shared HTTP/1.1\r\n\r\n");
  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, all);
  for (int i = 0; i < 8; i++) {
    ck_assert(read_reply(&c, &r));
    ck_assert_int_eq(r.status, 200);
  }
  client_close(&c);
  /* A client that asks for 2 MiB of them and reads one: the rest queue
   * (then the connection is held), and go with the connection. The one
   * read says the server took its requests before it stops (under load it
   * stopped first). */
  client_open(&c, f.port);
  for (int i = 0; i < 64; i++)
    send_str(&c, all);
  ck_assert(read_reply(&c, &r));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_gt(f.requests, 8); /* the second client's were taken, some at least */
  ck_assert_uint_eq(f.shared_held, 0);
}
END_TEST

START_TEST(test_post_body)
{
  const char *want = "{\"method\":\"POST\",\"path\":\"/jobs/a/control\",\"query\":\"\","
                     "\"auth\":null,\"body\":\"hello=world\"}";
  gs_http_limits_t limits = default_limits();
  char len_hdr[64];
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "POST /jobs/a/control HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello=world");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert_str_eq(r.body, want);
  snprintf(len_hdr, sizeof(len_hdr), "Content-Length: %zu\r\n", strlen(want));
  ck_assert_ptr_nonnull(strstr(r.headers, len_hdr));
  /* A chunked body arrives whole. */
  send_str(&c, "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"body\":\"abcde\""));
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

START_TEST(test_query)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /jobs/a?x=1&y=2 HTTP/1.1\r\n\r\n");
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/jobs/a\",\"query\":\"x=1&y=2\",\"auth\":null,"
                  "\"body\":\"\"}");
  send_str(&c, "GET /p?k=v#frag HTTP/1.1\r\n\r\n");
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/p\",\"query\":\"k=v\",\"auth\":null,"
                  "\"body\":\"\"}");
  send_str(&c, "GET http://example.com:80/abs?z HTTP/1.1\r\n\r\n");
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/abs\",\"query\":\"z\",\"auth\":null,"
                  "\"body\":\"\"}");
  send_str(&c, "GET /empty? HTTP/1.1\r\n\r\n");
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/empty\",\"query\":\"\",\"auth\":null,"
                  "\"body\":\"\"}");
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

START_TEST(test_authorization)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /a HTTP/1.1\r\nauthorization: Bearer s3cret\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"auth\":\"Bearer s3cret\""));
  /* An empty header before it must not bleed into its name. */
  send_str(&c, "GET /b HTTP/1.1\r\nX-Empty:\r\nAuthorization: Bearer t\r\nX-After: 1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"auth\":\"Bearer t\""));
  /* The last request's credential does not leak into the next. */
  send_str(&c, "GET /c HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"auth\":null"));
  /* Two credentials are refused. */
  send_str(&c, "GET /d HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 400);
  ck_assert(peer_closed(&c));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 3);
  ck_assert_ptr_null(strstr(f.log_text, "s3cret"));
}
END_TEST

START_TEST(test_connection_close)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /ignored HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.headers, "Connection: close\r\n"));
  ck_assert(peer_closed(&c));
  client_close(&c);

  client_open(&c, f.port);
  send_str(&c, "GET /b HTTP/1.0\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.headers, "Connection: close\r\n"));
  ck_assert(peer_closed(&c));
  client_close(&c);

  client_open(&c, f.port);
  send_str(&c, "GET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.headers, "Connection: keep-alive\r\n"));
  send_str(&c, "GET /d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/d\""));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 4);
}
END_TEST

START_TEST(test_response_headers)
{
  const char *head_body = "{\"method\":\"HEAD\",\"path\":\"/h\",\"query\":\"\",\"auth\":null,"
                          "\"body\":\"\"}";
  gs_http_limits_t limits = default_limits();
  char len_hdr[64];
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "DELETE /allow HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 405);
  ck_assert_ptr_nonnull(strstr(r.headers, "Allow: GET, POST\r\n"));
  send_str(&c, "GET /no-allow HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_null(strstr(r.headers, "Allow:"));
  /* HEAD: the headers of a GET, no body; the connection stays usable. */
  c.head = true;
  send_str(&c, "HEAD /h HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert_uint_eq(r.body_len, 0);
  snprintf(len_hdr, sizeof(len_hdr), "Content-Length: %zu\r\n", strlen(head_body));
  ck_assert_ptr_nonnull(strstr(r.headers, len_hdr));
  c.head = false;
  send_str(&c, "GET /after HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/after\""));
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

START_TEST(test_malformed)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "GET /ok HTTP/1.1\r\n\r\nGARBAGE\x01 / HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 400);
  ck_assert_str_eq(r.body, "{\"error\":\"malformed request\"}");
  ck_assert_ptr_nonnull(strstr(r.headers, "Connection: close\r\n"));
  ck_assert(peer_closed(&c));
  client_close(&c);

  client_open(&c, f.port);
  send_str(&c, "POST /x HTTP/1.1\r\nContent-Length: abc\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 400);
  ck_assert(peer_closed(&c));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 1);
  ck_assert_uint_eq(count_of(f.log_text, "replying 400"), 2);
}
END_TEST

START_TEST(test_body_too_large)
{
  gs_http_limits_t limits = {
      .max_header_bytes = 8192, .max_body_bytes = 16, .idle_timeout_ms = 120000};
  struct fixture f;
  struct client c;
  struct reply r;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  send_str(&c, "POST /a HTTP/1.1\r\nContent-Length: 16\r\n\r\n0123456789abcdef");
  expect_echo(&c, "{\"method\":\"POST\",\"path\":\"/a\",\"query\":\"\",\"auth\":null,"
                  "\"body\":\"0123456789abcdef\"}");
  /* Declared too large: refused before the body is read. */
  send_str(&c, "POST /b HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 413);
  ck_assert_str_eq(r.body, "{\"error\":\"request body too large\"}");
  ck_assert(peer_closed(&c));
  client_close(&c);
  /* Chunked: refused once the chunks pass the limit. */
  client_open(&c, f.port);
  send_str(&c, "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               "a\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n");
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 413);
  ck_assert(peer_closed(&c));
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, 1);
  ck_assert_uint_eq(count_of(f.log_text, "replying 413"), 2);
}
END_TEST

START_TEST(test_headers_too_large)
{
  gs_http_limits_t limits = {
      .max_header_bytes = 1024, .max_body_bytes = 1024, .idle_timeout_ms = 120000};
  struct fixture f;
  struct client c;
  struct reply r;
  char req[8192];

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  snprintf(req, sizeof(req), "GET /a HTTP/1.1\r\nX-Big: %0*d\r\n\r\n", 4000, 0);
  send_str(&c, req);
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 431);
  ck_assert_str_eq(r.body, "{\"error\":\"request headers too large\"}");
  ck_assert(peer_closed(&c));
  client_close(&c);
  /* A long URL counts too; one just under the limit is fine. */
  client_open(&c, f.port);
  snprintf(req, sizeof(req), "GET /%0*d HTTP/1.1\r\n\r\n", 2000, 0);
  send_str(&c, req);
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 431);
  client_close(&c);
  client_open(&c, f.port);
  snprintf(req, sizeof(req), "GET /%0*d HTTP/1.1\r\n\r\n", 900, 0);
  send_str(&c, req);
  ck_assert(read_reply(&c, &r));
  ck_assert_int_eq(r.status, 200);
  client_close(&c);
  fixture_stop(&f);
  ck_assert_uint_eq(count_of(f.log_text, "replying 431"), 2);
}
END_TEST

/* A silent connection is closed at the idle timeout (2 s), not before.
 * One used a second in is closed 2 s after its reply, not after its
 * accept: its close comes at least 2 s after the request was sent (how
 * long after a timeout anything comes is no test's business). */
START_TEST(test_idle_timeout)
{
  gs_http_limits_t limits = {
      .max_header_bytes = 8192, .max_body_bytes = 1024, .idle_timeout_ms = 2000};
  struct fixture f;
  struct client silent, used;
  struct reply r;
  double t0;

  fixture_start(&f, &limits);
  t0 = gs_now_ms_f() / 1e3;
  client_open(&silent, f.port);
  ck_assert(peer_closed(&silent));
  ck_assert_double_ge(gs_now_ms_f() / 1e3 - t0, 1.95);
  client_close(&silent);
  /* After a reply, the clock starts again. */
  client_open(&used, f.port);
  usleep(1000 * 1000); /* half the timeout: a request that comes late, on purpose */
  t0 = gs_now_ms_f() / 1e3;
  send_str(&used, "GET /a HTTP/1.1\r\n\r\n");
  ck_assert(read_reply(&used, &r));
  ck_assert(peer_closed(&used));
  ck_assert_double_ge(gs_now_ms_f() / 1e3 - t0, 1.95);
  client_close(&used);
  fixture_stop(&f);
  ck_assert_uint_eq(count_of(f.log_text, "idle for 2000 ms"), 2);
}
END_TEST

#define NCONC 200

START_TEST(test_concurrent)
{
  gs_http_limits_t limits = default_limits();
  struct client *cs = calloc(NCONC, sizeof(*cs));
  struct fixture f;
  struct reply r;
  char req[64], want[32];

  ck_assert_ptr_nonnull(cs);
  fixture_start(&f, &limits);
  for (int i = 0; i < NCONC; i++)
    client_open(&cs[i], f.port);
  for (int i = 0; i < NCONC; i++) {
    snprintf(req, sizeof(req), "GET /c/%d HTTP/1.1\r\n\r\n", i);
    send_str(&cs[i], req);
  }
  for (int i = NCONC - 1; i >= 0; i--) {
    snprintf(want, sizeof(want), "\"path\":\"/c/%d\"", i);
    ck_assert(read_reply(&cs[i], &r));
    ck_assert_ptr_nonnull(strstr(r.body, want));
  }
  /* Every connection has been served and is still open. */
  send_str(&cs[0], "GET /count HTTP/1.1\r\n\r\n");
  snprintf(want, sizeof(want), "%d", NCONC);
  expect_echo(&cs[0], want);
  for (int i = 0; i < NCONC; i++)
    client_close(&cs[i]);
  free(cs);
  fixture_stop(&f);
  ck_assert_uint_eq(f.requests, NCONC + 1);
}
END_TEST

START_TEST(test_client_disconnect)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client c;
  char big[4096];

  fixture_start(&f, &limits);
  /* Gone in the middle of the headers, of the body, and before reading. */
  client_open(&c, f.port);
  send_str(&c, "GET /a HTTP/1.1\r\nHost: ");
  client_close(&c);
  client_open(&c, f.port);
  send_str(&c, "POST /a HTTP/1.1\r\nContent-Length: 50\r\n\r\nabc");
  client_close(&c);
  client_open(&c, f.port);
  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  for (int i = 0; i < 20; i++) {
    char req[128];

    snprintf(req, sizeof(req), "GET /%d HTTP/1.1\r\n\r\n", i);
    send_str(&c, req);
  }
  client_close(&c);
  /* A reset with a request half sent. */
  client_open(&c, f.port);
  send_str(&c, "POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n");
  send_str(&c, big);
  setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &(struct linger){.l_onoff = 1, .l_linger = 0},
             sizeof(struct linger));
  client_close(&c);
  /* A client that half-closes after its request still gets the reply. */
  client_open(&c, f.port);
  send_str(&c, "GET /half HTTP/1.1\r\n\r\n");
  shutdown(c.fd, SHUT_WR);
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/half\",\"query\":\"\",\"auth\":null,"
                  "\"body\":\"\"}");
  ck_assert(peer_closed(&c));
  client_close(&c);
  /* The server still serves. */
  client_open(&c, f.port);
  send_str(&c, "GET /alive HTTP/1.1\r\n\r\n");
  expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/alive\",\"query\":\"\",\"auth\":null,"
                  "\"body\":\"\"}");
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

START_TEST(test_one_byte_writes)
{
  gs_http_limits_t limits = default_limits();
  const char *req = "POST /slow?a=b HTTP/1.1\r\nAuthorization: Basic eA==\r\n"
                    "Content-Length: 4\r\n\r\nbody";
  struct fixture f;
  struct client c;

  fixture_start(&f, &limits);
  client_open(&c, f.port);
  for (size_t i = 0; req[i]; i++) {
    ck_assert_int_eq(send(c.fd, req + i, 1, MSG_NOSIGNAL), 1);
    usleep(500);
  }
  expect_echo(&c, "{\"method\":\"POST\",\"path\":\"/slow\",\"query\":\"a=b\","
                  "\"auth\":\"Basic eA==\",\"body\":\"body\"}");
  client_close(&c);
  fixture_stop(&f);
}
END_TEST

START_TEST(test_shutdown)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client idle, partial, served;
  gs_log_t log = {GS_LOG_ERROR, stderr, "test"};
  uv_loop_t loop;
  gs_http_server_t *srv;

  /* With connections open in every state. */
  fixture_start(&f, &limits);
  client_open(&idle, f.port);
  client_open(&partial, f.port);
  client_open(&served, f.port);
  send_str(&partial, "POST /p HTTP/1.1\r\nContent-Length: 10\r\n\r\nab");
  send_str(&served, "GET /s HTTP/1.1\r\n\r\n");
  expect_echo(&served, "{\"method\":\"GET\",\"path\":\"/s\",\"query\":\"\",\"auth\":null,"
                       "\"body\":\"\"}");
  fixture_stop(&f);
  ck_assert(peer_closed(&idle));
  ck_assert(peer_closed(&partial));
  ck_assert(peer_closed(&served));
  client_close(&idle);
  client_close(&partial);
  client_close(&served);

  /* Never listening, or failing to. */
  ck_assert_int_eq(uv_loop_init(&loop), 0);
  srv = gs_http_server_new(&loop, &log, &limits, echo_handler, &f);
  ck_assert_ptr_nonnull(srv);
  gs_http_server_close(srv);
  srv = gs_http_server_new(&loop, &log, &limits, echo_handler, &f);
  ck_assert_ptr_nonnull(srv);
  ck_assert_int_eq(gs_http_server_listen(srv, "not-an-address", 0), GS_EINVAL);
  gs_http_server_close(srv);
  ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
  ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

START_TEST(test_ipv6)
{
  gs_http_limits_t limits = default_limits();
  gs_log_t log = {GS_LOG_ERROR, stderr, "test"};
  struct fixture f;
  struct client c;
  int err;

  /* The fixture listens on IPv4; an IPv6 listener is checked on its own. */
  memset(&f, 0, sizeof(f));
  ck_assert_int_eq(uv_loop_init(&f.loop), 0);
  f.log_file = tmpfile();
  f.log = log;
  f.srv = gs_http_server_new(&f.loop, &f.log, &limits, echo_handler, &f);
  ck_assert_ptr_nonnull(f.srv);
  err = gs_http_server_listen(f.srv, "::1", 0);
  if (err == 0) {
    f.port = gs_http_server_port(f.srv);
    ck_assert_uint_ne(f.port, 0);
    ck_assert_int_eq(uv_async_init(&f.loop, &f.stop, on_stop), 0);
    f.stop.data = &f;
    ck_assert_int_eq(pthread_create(&f.thread, NULL, loop_thread, &f), 0);
    ck_assert_int_eq(connect_to(&c, AF_INET6, f.port), 0);
    send_str(&c, "GET /six HTTP/1.1\r\n\r\n");
    expect_echo(&c, "{\"method\":\"GET\",\"path\":\"/six\",\"query\":\"\",\"auth\":null,"
                    "\"body\":\"\"}");
    client_close(&c);
    fixture_stop(&f);
  } else {
    /* No IPv6 on this host: the failure is reported, not fatal. */
    ck_assert_int_lt(err, 0);
    gs_http_server_close(f.srv);
    ck_assert_int_eq(uv_run(&f.loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&f.loop), 0);
    fclose(f.log_file);
  }
}
END_TEST

/* Sends GET `path` and reads its reply. */
static void get_ok(struct client *c, const char *path)
{
  char req[128], want[128];
  struct reply r;

  snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\n\r\n", path);
  snprintf(want, sizeof(want), "\"path\":\"%s\"", path);
  send_str(c, req);
  ck_assert(read_reply(c, &r));
  ck_assert_int_eq(r.status, 200);
  ck_assert_ptr_nonnull(strstr(r.body, want));
}

/* Leaves a request to `path` in progress: its request line without the
 * blank line that ends it, sent behind a complete request whose reply says
 * the server has parsed both (one read, one callback, before any other). */
static void begin_request(struct client *c, const char *path)
{
  char req[160], want[128];
  struct reply r;

  snprintf(req, sizeof(req), "GET /sync HTTP/1.1\r\n\r\nGET %s HTTP/1.1\r\n", path);
  snprintf(want, sizeof(want), "\"path\":\"%s\"", "/sync");
  send_str(c, req);
  ck_assert(read_reply(c, &r));
  ck_assert_ptr_nonnull(strstr(r.body, want));
}

/* At the cap of 3 connections, a new one closes the one idle longest; one
 * with a request in progress is kept while any is idle, and when none is,
 * the one whose request began first goes. Each is one line of the log. */
START_TEST(test_max_connections)
{
  gs_http_limits_t limits = default_limits();
  struct fixture f;
  struct client a, b, c, d, e, g;
  struct reply r;

  limits.max_connections = 3;
  fixture_start(&f, &limits);
  client_open(&a, f.port);
  get_ok(&a, "/a");
  client_open(&c, f.port);
  get_ok(&c, "/c");
  client_open(&b, f.port);
  begin_request(&b, "/b");
  /* a, idle longest, makes room for d; then c for e, while b waits. */
  client_open(&d, f.port);
  get_ok(&d, "/d");
  ck_assert(peer_closed(&a));
  client_open(&e, f.port);
  get_ok(&e, "/e");
  ck_assert(peer_closed(&c));
  send_str(&b, "\r\n");
  ck_assert(read_reply(&b, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/b\""));
  /* None idle: d's request began first. */
  begin_request(&d, "/d2");
  begin_request(&e, "/e2");
  begin_request(&b, "/b2");
  client_open(&g, f.port);
  get_ok(&g, "/g");
  ck_assert(peer_closed(&d));
  send_str(&e, "\r\n");
  ck_assert(read_reply(&e, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/e2\""));
  send_str(&b, "\r\n");
  ck_assert(read_reply(&b, &r));
  ck_assert_ptr_nonnull(strstr(r.body, "\"path\":\"/b2\""));
  send_str(&g, "GET /count HTTP/1.1\r\n\r\n");
  expect_echo(&g, "3");
  client_close(&a);
  client_close(&b);
  client_close(&c);
  client_close(&d);
  client_close(&e);
  client_close(&g);
  fixture_stop(&f);
  ck_assert_uint_eq(count_of(f.log_text, "(--max-http-connections)"), 3);
  ck_assert_uint_eq(count_of(f.log_text, "the one idle longest"), 2);
  ck_assert_uint_eq(count_of(f.log_text, "the one whose request began first"), 1);
}
END_TEST

static void add_case(Suite *s, const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test);
  suite_add_tcase(s, tc);
}

static Suite *http_server_suite(void)
{
  Suite *s = suite_create("http_server");

  add_case(s, "keepalive", test_keepalive);
  add_case(s, "pipelined", test_pipelined);
  add_case(s, "pipelined_turns", test_pipelined_turns);
  add_case(s, "shared_body", test_shared_body);
  add_case(s, "post_body", test_post_body);
  add_case(s, "query", test_query);
  add_case(s, "authorization", test_authorization);
  add_case(s, "connection_close", test_connection_close);
  add_case(s, "response_headers", test_response_headers);
  add_case(s, "malformed", test_malformed);
  add_case(s, "body_too_large", test_body_too_large);
  add_case(s, "headers_too_large", test_headers_too_large);
  add_case(s, "idle_timeout", test_idle_timeout);
  add_case(s, "concurrent", test_concurrent);
  add_case(s, "client_disconnect", test_client_disconnect);
  add_case(s, "one_byte_writes", test_one_byte_writes);
  add_case(s, "shutdown", test_shutdown);
  add_case(s, "ipv6", test_ipv6);
  add_case(s, "max_connections", test_max_connections);
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {http_server_suite}, .ignore_sigpipe = true};
