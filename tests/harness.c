#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "clock.h"

#ifndef GS_COORDINATOR_BIN
#error "GS_COORDINATOR_BIN must name the coordinator binary"
#endif

void th_coord_start(th_coord_t *c, ...)
{
  const char *argv[64] = {GS_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"};
  int argc = 5, fds[2];
  pid_t parent = getpid();
  char line[256];
  FILE *out;
  va_list ap;

  va_start(ap, c);
  for (const char *a; (a = va_arg(ap, const char *)) && argc < 62;)
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  ck_assert_int_eq(pipe(fds), 0);
  c->pid = fork();
  ck_assert_int_ge(c->pid, 0);
  if (c->pid == 0) {
    /* Dies with the test: a failed assertion ends the test's process
     * (check forks one per test) before it could stop the coordinator. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
      _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  out = fdopen(fds[0], "r");
  ck_assert_ptr_nonnull(fgets(line, sizeof(line), out));
  fclose(out);
  ck_assert_int_eq(sscanf(line,
                          "gradsync-coordinator listening rpc=127.0.0.1:%hu http=127.0.0.1:%hu",
                          &c->rpc_port, &c->http_port),
                   2);
}

int th_coord_stop(th_coord_t *c)
{
  int status;

  kill(c->pid, SIGTERM);
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS; gs_now_ms() < deadline;) {
    if (waitpid(c->pid, &status, WNOHANG) == c->pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(10000);
  }
  kill(c->pid, SIGKILL);
  waitpid(c->pid, &status, 0);
  return -1;
}

void th_coord_kill(th_coord_t *c)
{
  int status;

  kill(c->pid, SIGKILL);
  waitpid(c->pid, &status, 0);
}

static int connect_port(uint16_t port)
{
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void th_connect(th_client_t *cl, uint16_t port)
{
  memset(cl, 0, sizeof(*cl));
  cl->fd = connect_port(port);
  ck_assert_msg(cl->fd >= 0, "connect to 127.0.0.1:%u: %s", port, strerror(errno));
  cl->next_id = 1;
}

void th_close(th_client_t *cl)
{
  if (cl->fd >= 0)
    close(cl->fd);
  cl->fd = -1;
}

void th_send_raw(th_client_t *cl, const void *data, size_t len)
{
  const char *p = data;

  while (len) {
    ssize_t n = send(cl->fd, p, len, MSG_NOSIGNAL);

    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* the peer may have closed on purpose; reading tells */
    p += n;
    len -= n;
  }
}

uint64_t th_send(th_client_t *cl, const char *method, uint32_t timeout_ms,
                 const pb_msgdesc_t *fields, const void *msg)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_buf_t frame = {0};

  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "%s", method);
  env.request_id = cl->next_id++;
  env.timeout_ms = timeout_ms;
  if (cl->token)
    snprintf(env.token, sizeof(env.token), "%s", cl->token);
  snprintf(env.session, sizeof(env.session), "%s", cl->session);
  ck_assert_int_eq(gs_wire_encode_frame(&frame, &env, fields, msg, SIZE_MAX), 0);
  th_send_raw(cl, frame.data, frame.len);
  gs_buf_free(&frame);
  return env.request_id;
}

/* Reads exactly len bytes before the deadline. */
static int read_full(int fd, void *buf, size_t len, long deadline)
{
  char *p = buf;

  while (len) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    long left = deadline - (long)gs_now_ms();
    ssize_t n;

    if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
      return -1;
    n = recv(fd, p, len, 0);
    if (n <= 0)
      return -1;
    p += n;
    len -= n;
  }
  return 0;
}

int th_recv_body(th_client_t *cl, gradsync_Envelope *env, gs_buf_t *body, int timeout_ms)
{
  long deadline = (long)gs_now_ms() + timeout_ms;
  uint8_t hdr[4], *payload;
  uint32_t len;
  char why[128];
  int rc = -1;

  if (read_full(cl->fd, hdr, 4, deadline))
    return -1;
  len = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
  payload = malloc(len ? len : 1);
  if (read_full(cl->fd, payload, len, deadline))
    goto out;
  ck_assert_int_eq(gs_wire_decode_envelope(payload, len, env, body, why, sizeof(why)), 0);
  rc = 0;
out:
  free(payload);
  return rc;
}

int th_recv(th_client_t *cl, gradsync_Envelope *env, const pb_msgdesc_t *resp_fields, void *resp,
            int timeout_ms)
{
  gs_buf_t body = {0};
  char why[128];
  int rc = th_recv_body(cl, env, &body, timeout_ms);

  if (rc == 0 && env->status == 0 && resp_fields)
    ck_assert_msg(gs_wire_decode(body.data, body.len, resp_fields, resp, why, sizeof(why)) == 0,
                  "response body: %s", why);
  /* The session a Join earned: the client acts for that rank from now on. */
  if (rc == 0 && env->status == 0 && resp_fields == gradsync_JoinResponse_fields)
    snprintf(cl->session, sizeof(cl->session), "%s", ((gradsync_JoinResponse *)resp)->session);
  gs_buf_free(&body);
  return rc;
}

uint64_t th_batch_add(th_client_t *cl, gs_buf_t *batch, uint32_t slot, const char *session,
                      const char *method, uint32_t timeout_ms, const pb_msgdesc_t *fields,
                      const void *msg)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_buf_t body = {0};

  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "%s", method);
  env.request_id = cl->next_id++;
  env.timeout_ms = timeout_ms;
  env.slot = slot;
  if (cl->token)
    snprintf(env.token, sizeof(env.token), "%s", cl->token);
  snprintf(env.session, sizeof(env.session), "%s", session ? session : "");
  ck_assert_int_eq(gs_wire_encode(&body, fields, msg), 0);
  ck_assert_int_eq(gs_wire_encode_batch_entry(batch, &env, body.data, body.len, SIZE_MAX), 0);
  gs_buf_free(&body);
  return env.request_id;
}

uint64_t th_batch_send(th_client_t *cl, gs_buf_t *batch)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_buf_t frame = {0};

  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "Batch");
  env.request_id = cl->next_id++;
  if (cl->token)
    snprintf(env.token, sizeof(env.token), "%s", cl->token);
  ck_assert_int_eq(gs_wire_encode_frame_bytes(&frame, &env, batch->data, batch->len, SIZE_MAX), 0);
  th_send_raw(cl, frame.data, frame.len);
  gs_buf_free(&frame);
  gs_buf_free(batch);
  return env.request_id;
}

int th_batch_replies(const gs_buf_t *body, gradsync_Envelope *replies, gs_buf_t *bodies, int max)
{
  const uint8_t *entry;
  size_t off = 0, len;
  char why[128];
  bool bad;
  int n = 0;

  while (gs_wire_batch_next(body->data, body->len, &off, &entry, &len, &bad)) {
    ck_assert_int_lt(n, max);
    ck_assert_msg(gs_wire_decode_envelope(entry, len, &replies[n], &bodies[n], why, sizeof(why)) ==
                      0,
                  "batch reply %d: %s", n, why);
    n++;
  }
  ck_assert_msg(!bad, "the BatchResponse does not decode");
  return n;
}

bool th_closed_by_peer(th_client_t *cl, int timeout_ms)
{
  long deadline = (long)gs_now_ms() + timeout_ms;
  char buf[4096];

  for (;;) {
    struct pollfd pfd = {.fd = cl->fd, .events = POLLIN};
    long left = deadline - (long)gs_now_ms();
    ssize_t n;

    if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
      return false;
    n = recv(cl->fd, buf, sizeof(buf), 0);
    if (n <= 0)
      return true;
  }
}

int th_call(th_client_t *cl, const char *method, const pb_msgdesc_t *req_fields, const void *req,
            const pb_msgdesc_t *resp_fields, void *resp, char *msg, size_t msg_len)
{
  gradsync_Envelope env;
  uint64_t id = th_send(cl, method, 0, req_fields, req);

  ck_assert_msg(th_recv(cl, &env, resp_fields, resp, TH_WAIT_MS) == 0, "no reply to %s", method);
  ck_assert_uint_eq(env.request_id, id);
  if (msg)
    snprintf(msg, msg_len, "%s", env.message);
  return env.status;
}

gradsync_JoinRequest th_join_request(const char *job, uint32_t world, const char *node,
                                     uint32_t local_rank)
{
  gradsync_JoinRequest r = gradsync_JoinRequest_init_zero;

  snprintf(r.job, sizeof(r.job), "%s", job);
  r.world_size = world;
  snprintf(r.node, sizeof(r.node), "%s", node);
  r.local_rank = local_rank;
  snprintf(r.device, sizeof(r.device), "cpu");
  snprintf(r.comm_addr, sizeof(r.comm_addr), "%s:%u", node, 9000 + local_rank);
  r.has_model_signature = true;
  r.model_signature.param_count = 6;
  r.model_signature.total_elements = 235146;
  r.model_signature.shapes_hash = 0x1234;
  r.model_signature.dtypes_hash = 0x5678;
  return r;
}

int th_http(uint16_t port, const char *method, const char *path, const char *headers,
            const char *body, char **resp_body)
{
  int fd = connect_port(port), status = -1;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap), *req, *p;
  long deadline = (long)gs_now_ms() + TH_WAIT_MS;
  int n;

  ck_assert_int_ge(fd, 0);
  n = asprintf(
      &req, "%s %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n%s",
      method, path, headers ? headers : "", body ? strlen(body) : 0, body ? body : "");
  ck_assert_int_gt(n, 0);
  th_send_raw(&(th_client_t){.fd = fd}, req, n);
  free(req);
  for (;;) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t r;

    if (deadline - (long)gs_now_ms() <= 0 ||
        poll(&pfd, 1, (int)(deadline - (long)gs_now_ms())) <= 0)
      break;
    if (len + 4096 > cap)
      buf = realloc(buf, cap *= 2);
    r = recv(fd, buf + len, cap - len - 1, 0);
    if (r <= 0)
      break;
    len += r;
  }
  close(fd);
  buf[len] = '\0';
  sscanf(buf, "HTTP/1.1 %d", &status);
  p = strstr(buf, "\r\n\r\n");
  *resp_body = strdup(p ? p + 4 : "");
  free(buf);
  return status;
}

char *th_http_wait(uint16_t port, const char *path, const char *needle)
{
  uint64_t deadline = gs_now_ms() + TH_WAIT_MS;
  char *body = NULL;

  for (;;) {
    free(body);
    body = NULL;
    if (th_http(port, "GET", path, NULL, NULL, &body) == 200 && strstr(body, needle))
      return body;
    if (gs_now_ms() > deadline)
      break;
    usleep(20000);
  }
  ck_abort_msg("GET %s: no '%s' within %d ms; last: %s", path, needle, TH_WAIT_MS, body);
  return NULL;
}

void th_http_wait_code(uint16_t port, const char *path, int code)
{
  uint64_t deadline = gs_now_ms() + TH_WAIT_MS;
  char *body = NULL;
  int got;

  for (;;) {
    free(body);
    body = NULL;
    got = th_http(port, "GET", path, NULL, NULL, &body);
    if (got == code || gs_now_ms() > deadline)
      break;
    usleep(20000);
  }
  ck_assert_msg(got == code, "GET %s: no %d within %d ms; last: %d %s", path, code, TH_WAIT_MS, got,
                body);
  free(body);
}

double th_metric(uint16_t port, const char *name)
{
  char *body = NULL, *at;
  double v = -1;
  size_t n = strlen(name);

  ck_assert_int_eq(th_http(port, "GET", "/metrics", NULL, NULL, &body), 200);
  for (at = body; (at = strstr(at, name)); at += n)
    if ((at == body || at[-1] == '\n') && at[n] == ' ') {
      v = strtod(at + n + 1, NULL);
      break;
    }
  free(body);
  return v;
}
