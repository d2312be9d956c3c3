/* RPC connections (see conn.h), over the connection base (stream.h). A
 * connection decodes only complete frames and never blocks the loop; one
 * that sends an oversized frame or stops reading its replies is dropped. */
#include "conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

/* An authenticated client this far behind is dropped. Backpressure keeps
 * a pipelining client near GS_CONN_WRITE_HIGH; only replies to parked
 * calls, answered while it does not read, add to that. */
#define MAX_WRITE_QUEUE (64u << 20)

/* The connection of a stream (its first member). */
#define CONN_OF(stream) GS_CONTAINER_OF(stream, gs_conn_t, s)

static const gs_stream_ops_t stream_ops;

gs_conns_t *gs__conns_new(uv_loop_t *loop, const gs_log_t *log, const gs_conn_limits_t *lim,
                          const gs_conn_callbacks_t *cb)
{
  gs_conns_t *t = calloc(1, sizeof(*t));

  if (!t)
    return NULL;
  t->loop = loop;
  t->log = log;
  t->max_frame = lim->max_frame;
  t->idle_timeout_ms = lim->idle_timeout_ms;
  t->vacant_idle_ms = lim->vacant_idle_ms ? lim->vacant_idle_ms : GS_CONN_VACANT_EVICT_IDLE_MS;
  t->mem = lim->mem;
  t->max_connections = lim->max_connections;
  t->unauth_max_memory = lim->mem->max / GS_CONN_UNAUTH_SHARE;
  t->unauth_max_connections = (uint32_t)(t->unauth_max_memory / GS_CONN_UNAUTH_EACH);
  if (t->unauth_max_connections < GS_CONN_UNAUTH_MIN)
    t->unauth_max_connections = GS_CONN_UNAUTH_MIN;
  if (t->unauth_max_connections > lim->max_connections)
    t->unauth_max_connections = lim->max_connections;
  t->tls = lim->tls;
  t->lines = lim->lines;
  t->cb = *cb;
  gs_list_init(&t->idle);
  gs_list_init(&t->linger);
  gs_list_init(&t->throttled);
  t->unauth_read_tokens = GS_CONN_UNAUTH_ALL_BURST;
  t->unauth_read_ms = uv_now(loop);
  gs__stream_port_init(&t->base, loop, &stream_ops);
  return t;
}

/* New work stops at three quarters of the members' part of the budget,
 * so that replies to calls already accepted (parked ones, answered later)
 * still fit under it. What the jobs store counts in that part; what the
 * HTTP port holds does not (its readers, with or without a token, must
 * not make training's calls refused; each of its connections is held at
 * its share). */
bool gs__conns_over_budget(const gs_conns_t *t)
{
  size_t members = t->mem->max - t->unauth_max_memory;

  return t->mem->used - t->unauth_used - t->mem->http > members - members / 4;
}

/* What `conn` holds grows by `add` and shrinks by `sub`: counted in the
 * total, and in the unauthenticated share while it has not authenticated. */
static void mem_count(gs_conn_t *conn, size_t add, size_t sub)
{
  gs_conns_t *t = conn->conns;

  gs_mem_budget_hold(t->mem, add, sub);
  t->conn_used += add;
  t->conn_used -= sub;
  if (!conn->authenticated) {
    t->unauth_used += add;
    t->unauth_used -= sub;
  }
}

/* What `conn` holds in the budget now. */
static size_t mem_of(const gs_conn_t *conn)
{
  return GS_CONN_BOOKKEEPING + conn->rbuf_counted + conn->tls_counted + conn->s.write_bytes;
}

/* Whether `conn` may hold `more` bytes: within the budget, and within
 * the unauthenticated share before it authenticated. If not, it is
 * closed, saying which limit `what` would pass. */
static bool budget_allows(gs_conn_t *conn, size_t more, const char *what)
{
  gs_conns_t *t = conn->conns;

  if (!conn->authenticated && t->unauth_used + more > t->unauth_max_memory) {
    t->unauth_closed++;
    gs__conn_log(conn, GS_LOG_KIND_RPC_LIMIT,
                 "%s would pass what connections not yet authenticated may hold (%zu bytes, a "
                 "quarter of --max-memory); closing",
                 what, t->unauth_max_memory);
    gs__conn_close(conn, "unauthenticated share of the memory budget exhausted");
    return false;
  }
  if (t->mem->used + more > t->mem->max) {
    gs__conn_log(conn, GS_LOG_KIND_RPC_LIMIT,
                 "%s would pass the memory budget (--max-memory %zu bytes); closing", what,
                 t->mem->max);
    gs__conn_close(conn, "memory budget exhausted");
    return false;
  }
  return true;
}

static void unthrottle(gs_conn_t *conn);

void gs__conn_authenticate(gs_conn_t *conn)
{
  gs_conns_t *t = conn->conns;

  if (conn->authenticated)
    return;
  t->unauth_used -= mem_of(conn);
  t->unauth_open--;
  conn->authenticated = true;
  unthrottle(conn);
}

/* Counts a change of the read buffer's capacity. */
static void rbuf_recount(gs_conn_t *conn)
{
  mem_count(conn, conn->rbuf.cap, conn->rbuf_counted);
  conn->rbuf_counted = conn->rbuf.cap;
}

/* Counts a change of what the TLS session holds. */
static void tls_recount(gs_conn_t *conn)
{
  size_t now = conn->s.tls ? gs_tls_memory(conn->s.tls) : 0;

  mem_count(conn, now, conn->tls_counted);
  conn->tls_counted = now;
}

void gs__conn_log(gs_conn_t *conn, gs_log_kind_t kind, const char *fmt, ...)
{
  va_list ap;

  if (!conn)
    return;
  va_start(ap, fmt);
  gs__log_limit_vline(conn->conns->lines, uv_now(conn->conns->loop), conn->s.peer, kind, fmt, ap);
  va_end(ap);
}

void gs__conns_free(gs_conns_t *t)
{
  if (!t)
    return;
  free(t->slots);
  free(t->gens);
  free(t->free_slots);
  free(t);
}

/* The idle list (see gs_conn) makes the idle sweep read only the
 * connections that have timed out: activity moves a connection to the end
 * in O(1), so the cost does not grow with the number of agents. */
static void idle_unlink(gs_conn_t *conn)
{
  if (gs_list_linked(&conn->idle_node))
    gs_list_remove(&conn->idle_node);
}

/* Records activity now; a connection with a parked call stays off the list
 * until its last call ends. */
static void idle_touch(gs_conn_t *conn)
{
  gs_conns_t *t = conn->conns;

  if (conn->lingering)
    return; /* on the linger list, whose clock started with it */
  conn->last_activity_ms = uv_now(t->loop);
  idle_unlink(conn);
  if (conn->s.closing || conn->waiting > 0)
    return;
  gs_list_insert_tail(&t->idle, &conn->idle_node);
}

static uint32_t slot_of(uint64_t id)
{
  return (uint32_t)id & GS_CONN_SLOT_MASK;
}

static void on_close(uv_handle_t *h)
{
  gs_conn_t *conn = CONN_OF(h->data);
  gs_conns_t *t = conn->conns;
  uint32_t slot = slot_of(conn->id);

  t->slots[slot] = NULL;
  t->gens[slot]++;
  t->free_slots[t->free_count++] = slot;
  t->open--;
  gs_buf_free(&conn->rbuf);
  rbuf_recount(conn);
  gs_tls_free(conn->s.tls);
  conn->s.tls = NULL;
  tls_recount(conn);
  mem_count(conn, 0, GS_CONN_BOOKKEEPING);
  if (!conn->authenticated)
    t->unauth_open--;
  free(conn);
  if (gs__conns_drained(t) && t->cb.on_drained)
    t->cb.on_drained(t->cb.ctx);
}

bool gs__conns_drained(const gs_conns_t *t)
{
  return t->closing && t->open == 0 && t->base.next_turn_closed;
}

/* The owner hears once that a connection it kept has ended: when it
 * closes, or earlier, when it starts to linger. */
static void tell_owner(gs_conn_t *conn)
{
  if (!conn->opened)
    return;
  conn->opened = false;
  conn->conns->cb.on_close(conn->conns->cb.ctx, conn);
}

void gs__conn_close(gs_conn_t *conn, const char *why)
{
  gs_conns_t *t = conn->conns;

  if (conn->s.closing)
    return;
  conn->s.closing = true;
  idle_unlink(conn);
  if (conn->throttled)
    gs_list_remove(&conn->throttle_node);
  gs_log(t->log, GS_LOG_DEBUG, NULL, -1, "rpc: closing %s: %s", conn->s.peer, why);
  tell_owner(conn);
  gs__stream_close(&conn->s, on_close);
}

/* Once the last frame is decided, the owner has nothing more to say on a
 * connection: replies to its parked calls are dropped. */
gs_conn_t *gs__conn_get(gs_conns_t *t, uint64_t id)
{
  uint32_t slot = slot_of(id);
  gs_conn_t *conn;

  if (slot >= t->cap || t->gens[slot] != (uint32_t)(id >> 32))
    return NULL;
  conn = t->slots[slot];
  return conn && !conn->s.closing && !conn->close_when_written ? conn : NULL;
}

/* Takes a free slot for `conn`, growing the table when full. Generations
 * start at 1, so no id is 0. */
static int table_insert(gs_conns_t *t, gs_conn_t *conn)
{
  uint32_t slot;

  if (t->free_count == 0) {
    uint32_t cap = t->cap ? t->cap * 2 : 64;

    if (cap > GS_CONN_SLOT_MASK + 1u)
      return GS_ELIMIT; /* 16M connections: far past any --max-connections */
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
      t->gens[i - 1] = 1;
      t->free_slots[t->free_count++] = i - 1;
    }
    t->cap = cap;
  }
  slot = t->free_slots[--t->free_count];
  conn->id = (uint64_t)t->gens[slot] << 32 | slot;
  t->slots[slot] = conn;
  t->open++;
  return 0;
}

/* Stops reading `conn` until the loop's next turn (GS_CONN_TURN_FRAMES):
 * what it sent meanwhile waits in its rbuf. */
static void defer(gs_conn_t *conn)
{
  if (!conn->read_paused)
    uv_read_stop((uv_stream_t *)&conn->s.tcp);
  conn->read_paused = true;
  gs__stream_defer(&conn->s);
}

/* Cuts and reports the complete frames in data[0..len), GS_CONN_TURN_FRAMES
 * in a turn at most; returns the bytes used. Stops early when the
 * connection is ending or held. */
static size_t process_frames(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  gs_conns_t *t = conn->conns;
  size_t off = 0;

  while (!conn->s.closing && !conn->close_when_written && !gs__stream_deferred(&conn->s)) {
    const uint8_t *payload;
    if (conn->turn_frames >= GS_CONN_TURN_FRAMES) {
      if (off < len)
        defer(conn); /* the next turn takes what waits */
      break;
    }
    if (conn->s.write_bytes > GS_CONN_WRITE_HIGH) {
      /* Backpressure: the rest waits in rbuf until replies drain. */
      if (!conn->read_paused)
        uv_read_stop((uv_stream_t *)&conn->s.tcp);
      conn->read_paused = true;
      break;
    }
    size_t plen;
    long used = gs_frame_parse(data + off, len - off, t->max_frame, &payload, &plen);

    if (used == 0)
      break;
    if (used < 0 && !t->tls && len - off >= 2 && data[off] == 0x16 && data[off + 1] == 0x03) {
      /* A TLS ClientHello read as a frame's length: the error frame that
       * follows is what tells the client that this port has no TLS. */
      gs__conn_log(conn, GS_LOG_KIND_RPC_TLS,
                   "speaks TLS, but this coordinator has no --tls-cert; closing");
    } else if (used < 0) {
      gs__conn_log(conn, GS_LOG_KIND_RPC_FRAME, "sent a frame over the %zu-byte limit; closing",
                   t->max_frame);
    }
    if (used < 0) {
      t->cb.on_oversized(t->cb.ctx, conn, t->max_frame);
      if (!conn->close_when_written)
        gs__conn_close(conn, "oversized frame");
      break;
    }
    conn->turn_frames++;
    t->cb.on_frame(t->cb.ctx, conn, payload, plen);
    off += used;
  }
  return off;
}

/* Keeps bytes of a frame not yet complete (or not yet dispatched) in the
 * connection's rbuf, within the memory budget; false if it was closed. */
static bool rbuf_append(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  if (conn->rbuf.len + len > conn->rbuf.cap && !budget_allows(conn, len, "a frame's bytes"))
    return false;
  if (gs_buf_append(&conn->rbuf, data, len)) {
    gs__conn_close(conn, "out of memory");
    return false;
  }
  rbuf_recount(conn);
  return true;
}

/* Dispatches what waits in rbuf and lets go of a large buffer once used. */
static void rbuf_process(gs_conn_t *conn)
{
  gs_buf_consume(&conn->rbuf, process_frames(conn, conn->rbuf.data, conn->rbuf.len));
  if (conn->rbuf.len == 0 && conn->rbuf.cap > GS_CONN_KEEP_BUF_BYTES)
    gs_buf_free(&conn->rbuf);
  rbuf_recount(conn);
}

/* Frames that arrived whole are reported straight from `data` (the
 * shared read buffer); the rest of a frame waits in the connection's rbuf. */
static void take_bytes(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  size_t used;

  idle_touch(conn);
  if (conn->rbuf.len == 0) {
    used = process_frames(conn, data, len);
    if (used == len || conn->s.closing || conn->close_when_written)
      return;
    rbuf_append(conn, data + used, len - used);
    return;
  }
  if (rbuf_append(conn, data, len))
    rbuf_process(conn);
}

/* Plaintext out of the TLS session: the bytes a plaintext port reads. */
static bool tls_plain(void *ctx, const uint8_t *data, size_t len)
{
  gs_conn_t *conn = ctx;

  take_bytes(conn, data, len);
  return !conn->s.closing && !conn->close_when_written && !conn->read_paused;
}

static void send_raw(gs_conn_t *conn, const uint8_t *data, size_t len, bool last);

/* Ciphertext out of the TLS session, to the socket. */
static bool tls_cipher(void *ctx, const uint8_t *data, size_t len, bool more)
{
  gs_conn_t *conn = ctx;

  send_raw(conn, data, len, !more);
  return !conn->s.closing;
}

/* A handshake that failed is logged (limited per peer address, so a
 * scanner writes few lines) and the connection closed once the alert, if
 * any, is written. A client that spoke no TLS gets an alert too, which a
 * gradsync client without --tls-ca recognises. */
static void tls_failed(gs_conn_t *conn)
{
  bool plain = gs_tls_peer_not_tls(conn->s.tls);

  gs__conn_log(conn, GS_LOG_KIND_RPC_TLS, "TLS handshake failed: %s%s; closing",
               gs_tls_error(conn->s.tls),
               plain ? " (a client without TLS? agents need --tls-ca)" : "");
  if (conn->s.closing)
    return;
  uv_read_stop((uv_stream_t *)&conn->s.tcp);
  conn->close_when_written = true;
  if (plain)
    send_raw(conn, gs__tls_alert_not_tls, sizeof(gs__tls_alert_not_tls), true);
  else
    gs__conn_close(conn, "TLS handshake failed");
}

/* Decrypts what arrived (none: what waited while paused) and takes its
 * plaintext; the shared read buffer takes the plaintext, since the
 * session copied the ciphertext first. */
static void tls_read(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  gs_conns_t *t = conn->conns;
  int err;

  if (len && !budget_allows(conn, len, "TLS input"))
    return;
  err = gs_tls_input(conn->s.tls, data, len, t->base.rbuf, sizeof(t->base.rbuf));
  if (!conn->s.closing)
    tls_recount(conn);
  if (err == GS_EPROTO)
    tls_failed(conn);
  else if (err)
    gs__conn_close(conn, err == GS_ECLOSED ? "peer ended the TLS session" : gs_strerror(err));
}

/* Tokens `*tokens` grows to at `rate` bytes a second since `*at_ms`, up
 * to `burst`. */
static void refill(int64_t *tokens, uint64_t *at_ms, uint64_t now, uint64_t rate, int64_t burst)
{
  int64_t grown = (int64_t)((now - *at_ms) * rate / 1000);

  if (now <= *at_ms)
    return;
  *tokens = *tokens + grown > burst ? burst : *tokens + grown;
  *at_ms = now;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* What an unauthenticated connection read is taken from its tokens and
 * everyone's (GS_CONN_UNAUTH_RATE); past either it is not read again
 * until the sweep finds both refilled (what it read is taken all the
 * same). */
static void debit_unauth(gs_conn_t *conn, size_t n)
{
  gs_conns_t *t = conn->conns;
  uint64_t now = uv_now(t->loop);

  refill(&conn->read_tokens, &conn->read_tokens_ms, now, GS_CONN_UNAUTH_RATE, GS_CONN_UNAUTH_BURST);
  refill(&t->unauth_read_tokens, &t->unauth_read_ms, now, GS_CONN_UNAUTH_ALL_RATE,
         GS_CONN_UNAUTH_ALL_BURST);
  conn->read_tokens -= (int64_t)n;
  t->unauth_read_tokens -= (int64_t)n;
  if (conn->throttled || (conn->read_tokens >= 0 && t->unauth_read_tokens >= 0))
    return;
  conn->throttled = true;
  t->throttles++;
  gs_list_insert_tail(&t->throttled, &conn->throttle_node);
  if (!conn->read_paused)
    uv_read_stop((uv_stream_t *)&conn->s.tcp);
}

/* Reads `conn` again, unless something else holds it. */
static void unthrottle(gs_conn_t *conn)
{
  if (!conn->throttled)
    return;
  conn->throttled = false;
  gs_list_remove(&conn->throttle_node);
  if (!conn->read_paused && !conn->s.closing && !conn->close_when_written && !conn->lingering)
    uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read);
}

/* The throttled connections whose tokens and everyone's have refilled are
 * read again, the oldest first. */
static void resume_throttled(gs_conns_t *t, uint64_t now)
{
  gs_list_t *first;

  refill(&t->unauth_read_tokens, &t->unauth_read_ms, now, GS_CONN_UNAUTH_ALL_RATE,
         GS_CONN_UNAUTH_ALL_BURST);
  while (t->unauth_read_tokens >= 0 && (first = gs_list_first(&t->throttled))) {
    gs_conn_t *conn = GS_CONTAINER_OF(first, gs_conn_t, throttle_node);

    refill(&conn->read_tokens, &conn->read_tokens_ms, now, GS_CONN_UNAUTH_RATE,
           GS_CONN_UNAUTH_BURST);
    if (conn->read_tokens < 0)
      break; /* oldest first: the next ones wait for it */
    unthrottle(conn);
  }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  gs_conn_t *conn = CONN_OF(s->data);

  if (nread < 0) {
    gs__conn_close(conn, nread == UV_EOF ? "peer closed" : uv_strerror((int)nread));
    return;
  }
  if (nread == 0 || conn->lingering)
    return; /* a lingering connection reads only to see the peer's EOF */
  conn->turn_frames = 0;
  if (!conn->authenticated)
    debit_unauth(conn, (size_t)nread);
  if (conn->s.tls)
    tls_read(conn, (const uint8_t *)buf->base, (size_t)nread);
  else
    take_bytes(conn, (const uint8_t *)buf->base, (size_t)nread);
}

/* Replies drained below half the high mark, and the turn it was deferred
 * in is over: dispatch what waited, then read again. */
static void maybe_resume(gs_conn_t *conn)
{
  if (!conn->read_paused || gs__stream_deferred(&conn->s) || conn->s.closing ||
      conn->close_when_written || conn->s.write_bytes > GS_CONN_WRITE_HIGH / 2)
    return;
  conn->read_paused = false;
  conn->turn_frames = 0;
  idle_touch(conn);
  rbuf_process(conn);
  if (conn->s.tls && !conn->read_paused && !conn->s.closing && !conn->close_when_written)
    tls_read(conn, NULL, 0);
  if (!conn->read_paused && !conn->throttled && !conn->s.closing && !conn->close_when_written)
    uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read);
}

/* The loop's next turn, for a connection deferred in the last one. */
static void on_next_turn(gs_stream_t *s)
{
  maybe_resume(CONN_OF(s));
}

/* At a cap (`cap` names it): the oldest idle connection that never
 * authenticated (an agent's connections authenticate at their first call)
 * and has been idle `min_idle_ms` makes room; false when there is none. */
static bool make_room(gs_conns_t *t, const char *cap, uint64_t min_idle_ms)
{
  uint64_t now = uv_now(t->loop);
  uint32_t held_back;

  for (gs_list_t *node = t->idle.next; node != &t->idle; node = node->next) {
    gs_conn_t *old = GS_CONTAINER_OF(node, gs_conn_t, idle_node);

    if (old->authenticated)
      continue;
    if (now - old->last_activity_ms < min_idle_ms)
      break; /* the idle list is oldest first: none older */
    t->evicted++;
    if (gs_ratelimit_allow(&t->accept_rl, now, &held_back))
      gs_log(t->log, GS_LOG_WARN, NULL, -1,
             "rpc: %u connections, %u unauthenticated (%s): closing %s, the oldest idle one "
             "that never authenticated, to admit a new one (%u such lines held back)",
             t->open, t->unauth_open, cap, old->s.peer, held_back);
    gs__conn_close(old, "evicted at a connection cap");
    return true;
  }
  return false;
}

/* At --max-connections with no unauthenticated connection to close: the
 * oldest authenticated one that holds no rank and has been idle for
 * vacant_idle_ms (--vacant-idle); false when there is none. */
static bool evict_vacant(gs_conns_t *t)
{
  uint64_t now = uv_now(t->loop);

  if (!t->cb.is_vacant)
    return false;
  for (gs_list_t *node = t->idle.next; node != &t->idle; node = node->next) {
    gs_conn_t *old = GS_CONTAINER_OF(node, gs_conn_t, idle_node);

    if (now - old->last_activity_ms < t->vacant_idle_ms)
      break;
    if (!old->authenticated || !t->cb.is_vacant(t->cb.ctx, old))
      continue;
    t->evicted++;
    gs__conn_log(old, GS_LOG_KIND_RPC_LIMIT,
                 "closed at --max-connections: idle for %.0f s and holding no rank",
                 (now - old->last_activity_ms) / 1000.0);
    gs__conn_close(old, "evicted at --max-connections (holds no rank)");
    return true;
  }
  return false;
}

/* A new connection refused at a cap: counted and logged (rate-limited). */
static void refuse(gs_conns_t *t, const char *cap)
{
  uint32_t held_back;

  t->refused++;
  if (gs_ratelimit_allow(&t->accept_rl, uv_now(t->loop), &held_back))
    gs_log(t->log, GS_LOG_WARN, NULL, -1,
           "rpc: %u connections, %u unauthenticated (%s), and none idle to close: refusing a new "
           "connection (%llu refused so far; %u such lines held back)",
           t->open, t->unauth_open, cap, (unsigned long long)t->refused, held_back);
}

/* Whether a new connection may open: under --max-connections, and with
 * room in the unauthenticated connections' share (count and memory),
 * which it joins until its first call passes the token check. */
static bool admit(gs_conns_t *t)
{
  /* t->open counts connections closing too, until their close callback. */
  bool full = t->open >= t->max_connections;
  bool share_full = t->unauth_open >= t->unauth_max_connections ||
                    t->unauth_used + GS_CONN_BOOKKEEPING > t->unauth_max_memory;

  if (!full && !share_full)
    return true;
  /* A connection closed to make room was unauthenticated: room in both. */
  if (full && (make_room(t, "--max-connections", 0) || (!share_full && evict_vacant(t))))
    return true;
  if (!full && make_room(t, "their share of --max-memory", GS_CONN_UNAUTH_EVICT_IDLE_MS))
    return true;
  refuse(t, full ? "--max-connections" : "their share of --max-memory");
  if (!full)
    t->unauth_closed++;
  return false;
}

void gs__conns_accept(gs_conns_t *t, uv_stream_t *server)
{
  gs_conn_t *conn;

  gs_tls_io_t io = {.on_plain = tls_plain, .on_cipher = tls_cipher};
  int err;

  if (!admit(t)) {
    gs__stream_refuse(&t->base, server);
    return;
  }
  conn = calloc(1, sizeof(*conn));
  if (!conn || table_insert(t, conn)) {
    free(conn);
    gs_log(t->log, GS_LOG_ERROR, NULL, -1, "rpc: out of memory accepting a connection");
    return;
  }
  conn->conns = t;
  conn->read_tokens = GS_CONN_UNAUTH_BURST;
  conn->read_tokens_ms = uv_now(t->loop);
  t->unauth_open++;
  mem_count(conn, GS_CONN_BOOKKEEPING, 0);
  idle_touch(conn);
  (void)gs__stream_init(&conn->s, &t->base); /* a TCP handle cannot fail to initialise */
  io.ctx = conn;
  err = gs__stream_accept(&conn->s, server, t->tls, true, &io);
  if (err) {
    gs__conn_close(conn, err == GS_ENOMEM ? "out of memory for a TLS session" : "accept failed");
    return;
  }
  tls_recount(conn);
  if (t->cb.on_open(t->cb.ctx, conn)) {
    gs__conn_close(conn, "refused by its owner");
    return;
  }
  conn->opened = true;
  t->accepted++;
  uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read);
}

static void on_port_closed(gs_stream_port_t *p)
{
  gs_conns_t *t = GS_CONTAINER_OF(p, gs_conns_t, base);

  if (gs__conns_drained(t) && t->cb.on_drained)
    t->cb.on_drained(t->cb.ctx);
}

void gs__conns_close_all(gs_conns_t *t)
{
  t->closing = true;
  gs__stream_port_close(&t->base, on_port_closed);
  for (uint32_t i = 0; i < t->cap; i++) {
    if (t->slots[i])
      gs__conn_close(t->slots[i], "coordinator shutting down");
  }
}

/* Closes the connections idle too long: the head of the idle list, while
 * it has timed out (closing takes it off the list). */
void gs__conns_sweep_idle(gs_conns_t *t, uint64_t now)
{
  gs_list_t *oldest;

  resume_throttled(t, now);
  while ((oldest = gs_list_first(&t->idle))) {
    gs_conn_t *conn = GS_CONTAINER_OF(oldest, gs_conn_t, idle_node);

    if (now - conn->last_activity_ms < t->idle_timeout_ms)
      break;
    t->idle_closed++;
    gs__conn_log(conn, GS_LOG_KIND_RPC_IDLE, "idle for %llu ms; closing",
                 (unsigned long long)(now - conn->last_activity_ms));
    gs__conn_close(conn, "idle timeout");
  }
  while ((oldest = gs_list_first(&t->linger))) {
    gs_conn_t *conn = GS_CONTAINER_OF(oldest, gs_conn_t, idle_node);
    uint64_t linger =
        t->idle_timeout_ms < GS_CONN_LINGER_MS ? t->idle_timeout_ms : GS_CONN_LINGER_MS;

    if (now - conn->last_activity_ms < linger)
      break;
    gs__conn_close(conn, "no EOF from the peer after the last frame");
  }
}

/* The last frame is written (see gs__conn_send_last): the owner hears that
 * the connection ended, a TLS session sends its close_notify, our FIN goes
 * out, and the connection reads (discarding) until the peer's EOF, or
 * closes after GS_CONN_LINGER_MS: a close with unread bytes would reset
 * the connection, and the peer's kernel could drop that last frame. */
static void conn_linger(gs_conn_t *conn)
{
  gs_conns_t *t = conn->conns;

  if (conn->s.closing || conn->lingering)
    return;
  tell_owner(conn);
  /* The close_notify's record goes through send_raw: written, it called
   * here again; queued, on_written will. */
  if (gs__stream_notify(&conn->s) || conn->s.closing || conn->lingering)
    return;
  conn->lingering = true;
  idle_unlink(conn);
  conn->last_activity_ms = uv_now(t->loop);
  gs_list_insert_tail(&t->linger, &conn->idle_node);
  gs_buf_free(&conn->rbuf);
  rbuf_recount(conn);
  if (gs__stream_shutdown(&conn->s) ||
      uv_read_start((uv_stream_t *)&conn->s.tcp, gs__stream_alloc, on_read))
    gs__conn_close(conn, "cannot end the write side");
}

/* A queued write ended: with the last frame, the connection lingers. */
static void on_written(gs_stream_t *s, int status, bool last)
{
  gs_conn_t *conn = CONN_OF(s);

  if (status < 0)
    gs__conn_close(conn, uv_strerror(status));
  else if (last)
    conn_linger(conn);
  maybe_resume(conn);
}

/* Whether `cost` more bytes of replies may wait for `conn`: within its own
 * cap (low before it authenticates) and the budget of all connections;
 * if not, it is closed. The last frame (an error reply of a few hundred
 * bytes, then a TLS close_notify) may pass the cap, as nothing follows it:
 * a client refused with UNAUTHENTICATED learns why even when it has not
 * read the replies before. */
static bool may_hold(gs_stream_t *s, size_t cost, const char *what)
{
  gs_conn_t *conn = CONN_OF(s);
  size_t cap = conn->authenticated ? MAX_WRITE_QUEUE : GS_CONN_UNAUTH_WRITE_MAX;

  if (conn->s.write_bytes + cost > cap && !conn->close_when_written) {
    gs__conn_log(conn, GS_LOG_KIND_RPC_LIMIT,
                 "is not reading its replies (%zu bytes queued, limit %zu%s); closing",
                 conn->s.write_bytes, cap, conn->authenticated ? "" : " before authentication");
    gs__conn_close(conn, "write queue overrun");
    return false;
  }
  return budget_allows(conn, cost, what);
}

static void count_writes(gs_stream_t *s, size_t add, size_t sub)
{
  mem_count(CONN_OF(s), add, sub);
}

static void stream_close(gs_stream_t *s, const char *why)
{
  gs__conn_close(CONN_OF(s), why);
}

static const gs_stream_ops_t stream_ops = {
    .may_hold = may_hold,
    .count = count_writes,
    .on_written = on_written,
    .close = stream_close,
    .on_next_turn = on_next_turn,
};

/* Writes through the connection base; a connection that stops reading is
 * dropped (may_hold). `last`: the end of what was handed to gs__conn_send
 * (TLS sends it in pieces), after which a connection that must close
 * lingers (conn_linger), at once or once it is written. */
static void send_raw(gs_conn_t *conn, const uint8_t *data, size_t len, bool last)
{
  bool ends = conn->close_when_written && last;

  if (conn->s.closing || conn->lingering)
    return;
  if (gs__stream_write_bytes(&conn->s, data, len, ends) == GS_STREAM_WRITTEN && ends)
    conn_linger(conn);
}

void gs__conn_send(gs_conn_t *conn, const uint8_t *data, size_t len)
{
  if (!conn->s.tls) {
    send_raw(conn, data, len, true);
    return;
  }
  if (conn->s.closing)
    return;
  if (gs_tls_output(conn->s.tls, data, len) == GS_EPROTO)
    gs__conn_close(conn, gs_tls_error(conn->s.tls));
}

void gs__conn_send_last(gs_conn_t *conn, const uint8_t *frame, size_t len)
{
  if (conn->s.closing)
    return;
  uv_read_stop((uv_stream_t *)&conn->s.tcp);
  conn->close_when_written = true;
  gs__conn_send(conn, frame, len);
}

void gs__conn_park(gs_conn_t *conn)
{
  if (conn->waiting++ == 0)
    idle_unlink(conn);
}

void gs__conn_unpark(gs_conn_t *conn)
{
  if (conn->waiting > 0) {
    conn->waiting--;
    idle_touch(conn);
  }
}
