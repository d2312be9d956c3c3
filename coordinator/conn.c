/* RPC connections: accept, buffer bytes, cut frames, reply, time out.
 * A connection decodes only complete frames and never blocks the loop; one
 * that sends an oversized frame or stops reading its replies is dropped. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "frame.h"
#include "job.h"
#include "net.h"
#include "wire.h"

#define MAX_WRITE_QUEUE (64u << 20) /* a client this far behind is dropped */

typedef struct write_req {
  uv_write_t req;
  gs_buf_t buf;
  bool close_after;
} write_req_t;

/* The idle list (see gs_conn) makes the idle sweep read only the
 * connections that have timed out: activity moves a connection to the end
 * in O(1), so the cost does not grow with the number of agents. */
static void idle_unlink(gs_conn_t *conn)
{
  struct gs_coord *c = conn->coord;

  if (!conn->idle_linked)
    return;
  if (conn->idle_prev)
    conn->idle_prev->idle_next = conn->idle_next;
  else
    c->idle_oldest = conn->idle_next;
  if (conn->idle_next)
    conn->idle_next->idle_prev = conn->idle_prev;
  else
    c->idle_newest = conn->idle_prev;
  conn->idle_prev = conn->idle_next = NULL;
  conn->idle_linked = false;
}

/* Records activity now; a connection with a parked call stays off the list
 * until its last call ends. */
static void idle_touch(gs_conn_t *conn)
{
  struct gs_coord *c = conn->coord;

  conn->last_activity_ms = gs__now_ms(c);
  idle_unlink(conn);
  if (conn->closing || conn->waiting > 0)
    return;
  conn->idle_prev = c->idle_newest;
  if (c->idle_newest)
    c->idle_newest->idle_next = conn;
  else
    c->idle_oldest = conn;
  c->idle_newest = conn;
  conn->idle_linked = true;
}

static void on_close(uv_handle_t *h)
{
  gs_conn_t *conn = h->data;
  struct gs_coord *c = conn->coord;
  gs_conn_table_t *t = &c->conns;

  t->slots[conn->ref.slot] = NULL;
  t->gens[conn->ref.slot]++;
  t->free_slots[t->free_count++] = conn->ref.slot;
  t->open--;
  gs__state_changed(c);
  gs_buf_free(&conn->rbuf);
  free(conn);
  gs__coord_maybe_free(c);
}

/* Closes the connection; a member bound to it is lost (job.c decides what
 * that means for its job). Idempotent. */
void gs__conn_close(gs_conn_t *conn, const char *why)
{
  if (conn->closing)
    return;
  conn->closing = true;
  gs__state_changed(conn->coord);
  idle_unlink(conn);
  gs_log(&conn->coord->cfg.log, GS_LOG_DEBUG, NULL, -1, "rpc: closing %s: %s", conn->peer, why);
  gs__job_conn_closed(conn);
  uv_close((uv_handle_t *)&conn->tcp, on_close);
}

gs_conn_t *gs__conn_get(struct gs_coord *c, gs_conn_ref_t ref)
{
  gs_conn_table_t *t = &c->conns;
  gs_conn_t *conn;

  if (ref.slot >= t->cap || t->gens[ref.slot] != ref.gen)
    return NULL;
  conn = t->slots[ref.slot];
  return conn && !conn->closing ? conn : NULL;
}

/* Takes a free slot for `conn`, growing the table when full. */
static int table_insert(gs_conn_table_t *t, gs_conn_t *conn)
{
  if (t->free_count == 0) {
    uint32_t cap = t->cap ? t->cap * 2 : 64;
    gs_conn_t **slots = realloc(t->slots, cap * sizeof(*slots));
    uint32_t *gens, *free_slots;

    if (!slots)
      return GS_ENOMEM;
    t->slots = slots;
    gens = realloc(t->gens, cap * sizeof(*gens));
    if (!gens)
      return GS_ENOMEM;
    t->gens = gens;
    free_slots = realloc(t->free_slots, cap * sizeof(*free_slots));
    if (!free_slots)
      return GS_ENOMEM;
    t->free_slots = free_slots;
    for (uint32_t i = cap; i > t->cap; i--) {
      t->slots[i - 1] = NULL;
      t->gens[i - 1] = 0;
      t->free_slots[t->free_count++] = i - 1;
    }
    t->cap = cap;
  }
  conn->ref.slot = t->free_slots[--t->free_count];
  conn->ref.gen = t->gens[conn->ref.slot];
  t->slots[conn->ref.slot] = conn;
  t->open++;
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  gs_conn_t *conn = h->data;

  (void)suggested;
  *buf = uv_buf_init((char *)conn->coord->rbuf, sizeof(conn->coord->rbuf));
}

/* Cuts and dispatches every complete frame in data[0..len); returns the
 * bytes used. Stops early when the connection is ending. */
static size_t process_frames(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  struct gs_coord *c = conn->coord;
  size_t off = 0;

  while (!conn->closing && !conn->close_when_written) {
    const uint8_t *payload;
    size_t plen;
    long used = gs_frame_parse(data + off, len - off, c->cfg.max_frame, &payload, &plen);

    if (used == 0)
      break;
    if (used < 0) {
      c->stats.bad_frames++;
      gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1,
             "rpc: %s sent a frame over the %zu-byte limit; closing", conn->peer, c->cfg.max_frame);
      gs__conn_fail(conn, GS_GRPC_RESOURCE_EXHAUSTED, "frame exceeds the %zu-byte limit",
                    c->cfg.max_frame);
      break;
    }
    gs__rpc_dispatch(conn, payload, plen);
    off += used;
  }
  return off;
}

/* Frames that arrived whole are dispatched straight from the shared read
 * buffer; the rest of a frame waits in the connection's rbuf. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  gs_conn_t *conn = s->data;
  const uint8_t *data = (const uint8_t *)buf->base;
  size_t used;

  if (nread < 0) {
    gs__conn_close(conn, nread == UV_EOF ? "peer closed" : uv_strerror((int)nread));
    return;
  }
  if (nread == 0)
    return;
  idle_touch(conn);
  if (conn->rbuf.len == 0) {
    used = process_frames(conn, data, (size_t)nread);
    if (used == (size_t)nread || conn->closing || conn->close_when_written)
      return;
    if (gs_buf_append(&conn->rbuf, data + used, (size_t)nread - used))
      gs__conn_close(conn, "out of memory");
    return;
  }
  if (gs_buf_append(&conn->rbuf, data, (size_t)nread)) {
    gs__conn_close(conn, "out of memory");
    return;
  }
  gs_buf_consume(&conn->rbuf, process_frames(conn, conn->rbuf.data, conn->rbuf.len));
  if (conn->rbuf.len == 0 && conn->rbuf.cap > GS_COORD_KEEP_BUF_BYTES)
    gs_buf_free(&conn->rbuf);
}

static void on_connection(uv_stream_t *server, int status)
{
  struct gs_coord *c = server->data;
  gs_conn_t *conn;

  if (status < 0) {
    gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: accept failed: %s%s", uv_strerror(status),
           status == UV_EMFILE || status == UV_ENFILE
               ? " (out of file descriptors: raise the open-file limit)"
               : "");
    return;
  }
  conn = calloc(1, sizeof(*conn));
  if (!conn || table_insert(&c->conns, conn)) {
    free(conn);
    gs_log(&c->cfg.log, GS_LOG_ERROR, NULL, -1, "rpc: out of memory accepting a connection");
    return;
  }
  conn->coord = c;
  conn->tcp.data = conn;
  idle_touch(conn);
  uv_tcp_init(c->loop, &conn->tcp);
  if (uv_accept(server, (uv_stream_t *)&conn->tcp)) {
    gs__conn_close(conn, "accept failed");
    return;
  }
  uv_tcp_nodelay(&conn->tcp, 1);
  gs_tcp_peer_name(&conn->tcp, conn->peer, sizeof(conn->peer));
  c->stats.conns_accepted++;
  gs__state_changed(c);
  uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read);
}

int gs__conn_listen(struct gs_coord *c)
{
  return gs_tcp_listen(&c->listener, c->cfg.rpc_host, c->cfg.rpc_port, on_connection, &c->cfg.log,
                       "rpc");
}

void gs__conn_close_all(struct gs_coord *c)
{
  for (uint32_t i = 0; i < c->conns.cap; i++) {
    if (c->conns.slots[i])
      gs__conn_close(c->conns.slots[i], "coordinator shutting down");
  }
}

/* Closes the connections idle too long: the head of the idle list, while
 * it has timed out (closing takes it off the list). */
void gs__conn_sweep_idle(struct gs_coord *c, uint64_t now)
{
  gs_conn_t *conn;

  while ((conn = c->idle_oldest) && now - conn->last_activity_ms >= c->cfg.idle_timeout_ms) {
    c->stats.conns_idle_closed++;
    gs_log(&c->cfg.log, GS_LOG_INFO, NULL, -1, "rpc: %s idle for %llu ms; closing", conn->peer,
           (unsigned long long)(now - conn->last_activity_ms));
    gs__conn_close(conn, "idle timeout");
  }
}

static void on_write(uv_write_t *req, int status)
{
  write_req_t *w = (write_req_t *)req;
  gs_conn_t *conn = req->handle->data;

  if (status < 0 || w->close_after)
    gs__conn_close(conn, status < 0 ? uv_strerror(status) : "closed after error reply");
  gs_buf_free(&w->buf);
  free(w);
}

/* Sends an encoded frame. Most replies fit in the socket buffer at once:
 * uv_try_write sends them with no allocation, no write request and no
 * epoll change. What does not fit (or must wait behind earlier writes) is
 * copied into a queued write; a connection that stops reading is dropped. */
static void send_frame(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  uv_stream_t *stream = (uv_stream_t *)&conn->tcp;
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
  write_req_t *w;
  int n = uv_try_write(stream, &b, 1);

  if (n == UV_EAGAIN || n == UV_ENOSYS)
    n = 0;
  if (n < 0) {
    gs__conn_close(conn, uv_strerror(n));
    return;
  }
  if ((size_t)n == len) {
    if (conn->close_when_written)
      gs__conn_close(conn, "closed after error reply");
    return;
  }
  if (uv_stream_get_write_queue_size(stream) > MAX_WRITE_QUEUE) {
    gs_log(&conn->coord->cfg.log, GS_LOG_WARN, NULL, -1,
           "rpc: %s is not reading its replies; closing", conn->peer);
    gs__conn_close(conn, "write queue overrun");
    return;
  }
  w = calloc(1, sizeof(*w));
  if (!w || gs_buf_append(&w->buf, data + n, len - (size_t)n)) {
    free(w);
    gs__conn_close(conn, "out of memory");
    return;
  }
  w->close_after = conn->close_when_written;
  b = uv_buf_init((char *)w->buf.data, (unsigned)w->buf.len);
  n = uv_write(&w->req, stream, &b, 1, on_write);
  if (n) {
    gs_buf_free(&w->buf);
    free(w);
    gs__conn_close(conn, uv_strerror(n));
  }
}

/* Encodes and sends one response; body is (fields, msg) or raw bytes. The
 * frame is encoded into the service's one scratch buffer (replies are
 * built one at a time on the loop thread). */
static void reply(struct gs_coord *c, gs_conn_ref_t ref, const gradsync_Envelope *env,
                  const pb_msgdesc_t *fields, const void *msg, const uint8_t *bytes, size_t len)
{
  gs_conn_t *conn = gs__conn_get(c, ref);
  gs_buf_t *out = &c->wbuf;
  int err;

  if (!conn)
    return;
  out->len = 0;
  if (bytes)
    err = gs_wire_encode_frame_bytes(out, env, bytes, len, SIZE_MAX);
  else
    err = gs_wire_encode_frame(out, env, fields, msg, SIZE_MAX);
  if (err) {
    gs_log(&c->cfg.log, GS_LOG_ERROR, NULL, -1, "rpc: cannot encode a reply to %s: %s", conn->peer,
           gs_strerror(err));
    gs__conn_close(conn, "encode failed");
  } else {
    send_frame(conn, out->data, out->len);
  }
  if (out->cap > GS_COORD_KEEP_BUF_BYTES)
    gs_buf_free(out);
}

static void envelope_for(gradsync_Envelope *env, gs_method_t m, uint64_t request_id)
{
  const char *path = gs_method_path(m);

  memset(env, 0, sizeof(*env));
  memcpy(env->method, path, strlen(path) + 1); /* every path fits: see GS_METHOD_MAP */
  env->request_id = request_id;
}

void gs__reply(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
               const pb_msgdesc_t *fields, const void *msg)
{
  gradsync_Envelope env;

  envelope_for(&env, m, request_id);
  reply(c, ref, &env, fields, msg, NULL, 0);
}

void gs__reply_bytes(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
                     const uint8_t *body, size_t len)
{
  gradsync_Envelope env;

  envelope_for(&env, m, request_id);
  reply(c, ref, &env, NULL, NULL, body, len);
}

void gs__reply_error(struct gs_coord *c, gs_conn_ref_t ref, gs_method_t m, uint64_t request_id,
                     int grpc_status, const char *fmt, ...)
{
  gradsync_Envelope env;
  va_list ap;

  envelope_for(&env, m, request_id);
  env.status = grpc_status;
  va_start(ap, fmt);
  vsnprintf(env.message, sizeof(env.message), fmt, ap);
  va_end(ap);
  if (m < GS_METHOD_COUNT)
    c->stats.errors[m]++;
  reply(c, ref, &env, NULL, NULL, NULL, 0);
}

void gs__conn_fail(gs_conn_t *conn, int grpc_status, const char *fmt, ...)
{
  gradsync_Envelope env;
  va_list ap;

  envelope_for(&env, GS_METHOD_COUNT, 0);
  env.status = grpc_status;
  va_start(ap, fmt);
  vsnprintf(env.message, sizeof(env.message), fmt, ap);
  va_end(ap);
  uv_read_stop((uv_stream_t *)&conn->tcp);
  conn->close_when_written = true;
  reply(conn->coord, conn->ref, &env, NULL, NULL, NULL, 0);
}

void gs__conn_park(struct gs_coord *c, gs_conn_ref_t ref)
{
  gs_conn_t *conn = gs__conn_get(c, ref);

  if (conn && conn->waiting++ == 0)
    idle_unlink(conn);
}

void gs__conn_unpark(struct gs_coord *c, gs_conn_ref_t ref)
{
  gs_conn_t *conn = gs__conn_get(c, ref);

  if (conn && conn->waiting > 0) {
    conn->waiting--;
    idle_touch(conn);
  }
}
