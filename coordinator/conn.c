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

#define READ_CHUNK (64 * 1024)
#define MAX_WRITE_QUEUE (64u << 20) /* a client this far behind is dropped */

typedef struct write_req {
  uv_write_t req;
  gs_buf_t buf;
  bool close_after;
} write_req_t;

static void on_close(uv_handle_t *h)
{
  gs_conn_t *conn = h->data;
  struct gs_coord *c = conn->coord;
  gs_conn_table_t *t = &c->conns;

  t->slots[conn->ref.slot] = NULL;
  t->gens[conn->ref.slot]++;
  t->free_slots[t->free_count++] = conn->ref.slot;
  t->open--;
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
  if (gs_buf_reserve(&conn->rbuf, READ_CHUNK)) {
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  buf->base = (char *)conn->rbuf.data + conn->rbuf.len;
  buf->len = READ_CHUNK;
}

/* Cuts and dispatches every complete frame in the read buffer. */
static void process_frames(gs_conn_t *conn)
{
  struct gs_coord *c = conn->coord;
  size_t off = 0;

  while (!conn->closing && !conn->close_when_written) {
    const uint8_t *payload;
    size_t len;
    long used = gs_frame_parse(conn->rbuf.data + off, conn->rbuf.len - off, c->cfg.max_frame,
                               &payload, &len);

    if (used == 0)
      break;
    if (used < 0) {
      c->stats.bad_frames++;
      gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1,
             "rpc: %s sent a frame over the %zu-byte limit; closing", conn->peer, c->cfg.max_frame);
      gs__conn_fail(conn, GS_GRPC_RESOURCE_EXHAUSTED, "frame exceeds the %zu-byte limit",
                    c->cfg.max_frame);
      return;
    }
    gs__rpc_dispatch(conn, payload, len);
    off += used;
  }
  gs_buf_consume(&conn->rbuf, off);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  gs_conn_t *conn = s->data;

  (void)buf;
  if (nread < 0) {
    gs__conn_close(conn, nread == UV_EOF ? "peer closed" : uv_strerror((int)nread));
    return;
  }
  if (nread == 0)
    return;
  conn->rbuf.len += nread;
  conn->last_activity_ms = gs__now_ms(conn->coord);
  process_frames(conn);
}

static void on_connection(uv_stream_t *server, int status)
{
  struct gs_coord *c = server->data;
  gs_conn_t *conn;

  if (status < 0) {
    gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: accept failed: %s", uv_strerror(status));
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
  conn->last_activity_ms = gs__now_ms(c);
  uv_tcp_init(c->loop, &conn->tcp);
  if (uv_accept(server, (uv_stream_t *)&conn->tcp)) {
    gs__conn_close(conn, "accept failed");
    return;
  }
  uv_tcp_nodelay(&conn->tcp, 1);
  gs_tcp_peer_name(&conn->tcp, conn->peer, sizeof(conn->peer));
  c->stats.conns_accepted++;
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

void gs__conn_sweep_idle(struct gs_coord *c, uint64_t now)
{
  for (uint32_t i = 0; i < c->conns.cap; i++) {
    gs_conn_t *conn = c->conns.slots[i];

    if (!conn || conn->closing || conn->waiting > 0 ||
        now - conn->last_activity_ms < c->cfg.idle_timeout_ms)
      continue;
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

/* Queues an encoded frame; drops a connection that is not reading. */
static void send_frame(gs_conn_t *conn, write_req_t *w)
{
  uv_buf_t b = uv_buf_init((char *)w->buf.data, (unsigned)w->buf.len);
  int err;

  if (uv_stream_get_write_queue_size((uv_stream_t *)&conn->tcp) > MAX_WRITE_QUEUE) {
    gs_log(&conn->coord->cfg.log, GS_LOG_WARN, NULL, -1,
           "rpc: %s is not reading its replies; closing", conn->peer);
    gs_buf_free(&w->buf);
    free(w);
    gs__conn_close(conn, "write queue overrun");
    return;
  }
  err = uv_write(&w->req, (uv_stream_t *)&conn->tcp, &b, 1, on_write);
  if (err) {
    gs_buf_free(&w->buf);
    free(w);
    gs__conn_close(conn, uv_strerror(err));
  }
}

/* Encodes and sends one response; body is (fields, msg) or raw bytes. */
static void reply(struct gs_coord *c, gs_conn_ref_t ref, const gradsync_Envelope *env,
                  const pb_msgdesc_t *fields, const void *msg, const uint8_t *bytes, size_t len)
{
  gs_conn_t *conn = gs__conn_get(c, ref);
  write_req_t *w;
  int err;

  if (!conn)
    return;
  w = calloc(1, sizeof(*w));
  if (!w) {
    gs__conn_close(conn, "out of memory");
    return;
  }
  if (bytes)
    err = gs_wire_encode_frame_bytes(&w->buf, env, bytes, len, SIZE_MAX);
  else
    err = gs_wire_encode_frame(&w->buf, env, fields, msg, SIZE_MAX);
  if (err) {
    gs_log(&c->cfg.log, GS_LOG_ERROR, NULL, -1, "rpc: cannot encode a reply to %s: %s", conn->peer,
           gs_strerror(err));
    gs_buf_free(&w->buf);
    free(w);
    gs__conn_close(conn, "encode failed");
    return;
  }
  w->close_after = conn->close_when_written;
  send_frame(conn, w);
}

static void envelope_for(gradsync_Envelope *env, gs_method_t m, uint64_t request_id)
{
  memset(env, 0, sizeof(*env));
  if (m < GS_METHOD_COUNT)
    snprintf(env->method, sizeof(env->method), GS_METHOD_PREFIX "%s", gs__method_name(m));
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

  if (conn)
    conn->waiting++;
}

void gs__conn_unpark(struct gs_coord *c, gs_conn_ref_t ref)
{
  gs_conn_t *conn = gs__conn_get(c, ref);

  if (conn && conn->waiting > 0) {
    conn->waiting--;
    conn->last_activity_ms = gs__now_ms(c);
  }
}
