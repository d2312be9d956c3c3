/* The node agent's loop (see relay.h). */
#include "relay_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"

#define REDIAL_MS 1000 /* between attempts to reach the coordinator */

static void up_dial(gs_relay_t *r);
static void local_close(local_t *l);

static void on_redial(uv_timer_t *t)
{
  up_dial(t->data);
}

/* The reply to a slot's call that checks a token: one the coordinator
 * took joins the good ones (the oldest makes room). */
static void token_checked(gs_relay_t *r, local_t *l, const gradsync_Envelope *reply)
{
  if (!l->checking || reply->request_id != l->check_id)
    return;
  l->checking = false;
  if (reply->status == gs_err_grpc_code(GS_EUNAUTH) || gs__relay_token_good(r, l->check_token))
    return;
  memmove(r->good_tokens[1], r->good_tokens[0], sizeof(r->good_tokens[0]) * (GOOD_TOKENS - 1));
  snprintf(r->good_tokens[0], sizeof(r->good_tokens[0]), "%s", l->check_token);
  if (r->good_count < GOOD_TOKENS)
    r->good_count++;
}

/* --- batches --- */

static void flush_pending(gs_relay_t *r, pending_t *p)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;

  if (!p->count)
    return;
  snprintf(env.method, sizeof(env.method), "%s", gs_method_path(GS_METHOD_BATCH));
  env.request_id = BATCH_ID_BASE + ++r->batch_seq;
  snprintf(env.token, sizeof(env.token), "%s", p->token);
  if (r->up_ready &&
      !gs__relay_send_frame(r, (uv_stream_t *)&r->up, &env, p->entries.data, p->entries.len))
    gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: cannot send a batch of %u calls upstream",
           p->count);
  p->entries.len = 0;
  p->count = 0;
}

static void flush_all(gs_relay_t *r)
{
  uv_timer_stop(&r->flush);
  flush_pending(r, &r->joins);
  gs__relay_beats_flush(r);
}

static void on_flush(uv_timer_t *t)
{
  flush_all(t->data);
}

/* Holds a Join to go up in the next batch: one under the token of its
 * calls, so a call with another token sends those held first. */
static void hold(gs_relay_t *r, pending_t *p, const gradsync_Envelope *env, const gs_buf_t *body)
{
  if (p->count && strcmp(p->token, env->token))
    flush_pending(r, p);
  if (gs_wire_encode_batch_entry(&p->entries, env, body->data, body->len, UP_FRAME_MAX)) {
    gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: cannot hold a call of slot %u", env->slot);
    return;
  }
  snprintf(p->token, sizeof(p->token), "%s", env->token);
  if (++p->count >= r->cfg.ranks)
    flush_pending(r, p);
  else
    gs__relay_flush_soon(r);
}

/* --- from the coordinator --- */

/* One reply (a frame's, or an entry of a Batch's), decoded: to its slot's
 * rank, without the slot. */
static void route_reply(gs_relay_t *r, gradsync_Envelope *env, const gs_buf_t *body)
{
  uint32_t slot = env->slot;
  local_t *l = slot && slot <= MAX_SLOT ? r->slots[slot] : NULL;

  if (!slot || slot > MAX_SLOT) {
    if (env->status)
      gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: the coordinator refused %s: %s",
             env->method, env->message);
    return;
  }
  if (l && env->request_id >= BATCH_ID_BASE && !strcmp(env->method, HEARTBEAT_PATH)) {
    gs__relay_beat_news(l, env, body); /* for a beat of the node's */
    return;
  }
  if (l)
    token_checked(r, l, env);
  env->slot = 0;
  if (!strcmp(env->method, PACK_LIST_PATH) && r->pl.asked && slot == r->pl.asker_slot &&
      env->request_id == r->pl.asker_id)
    gs__relay_pack_list_reply(r, env, body);
  if (l) /* else that rank's connection has closed */
    gs__relay_send_frame(r, (uv_stream_t *)&l->pipe, env, body->data, body->len);
}

static void up_frame(gs_relay_t *r, const uint8_t *payload, size_t len)
{
  gradsync_Envelope env;
  const uint8_t *entry;
  size_t off = 0, elen;
  char why[128];
  bool bad;

  if (gs_wire_decode_envelope(payload, len, &env, &r->frame_body, why, sizeof(why))) {
    gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: an undecodable frame upstream: %s", why);
  } else if (strcmp(env.method, gs_method_path(GS_METHOD_BATCH)) || env.status) {
    route_reply(r, &env, &r->frame_body);
  } else {
    while (gs_wire_batch_next(r->frame_body.data, r->frame_body.len, &off, &entry, &elen, &bad)) {
      if (gs_wire_decode_envelope(entry, elen, &env, &r->body, why, sizeof(why)))
        gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: an undecodable reply upstream: %s", why);
      else
        route_reply(r, &env, &r->body);
    }
  }
}

/* --- connections --- */

/* One of the relay's handles is closed: the last, once stopping, frees it. */
static void handle_gone(gs_relay_t *r)
{
  if (--r->open_handles == 0 && r->stopping) {
    gs_tls_free(r->up_tls);
    gs_buf_free(&r->up_rbuf);
    gs_buf_free(&r->joins.entries);
    gs_buf_free(&r->pl.body);
    gs_buf_free(&r->body);
    gs_buf_free(&r->frame_body);
    gs_buf_free(&r->out);
    free(r);
  }
}

static void on_handle_closed(uv_handle_t *h)
{
  handle_gone(h->data);
}

static void on_local_closed(uv_handle_t *h)
{
  local_t *l = h->data;
  gs_relay_t *r = l->r;

  gs_buf_free(&l->rbuf);
  gs_buf_free(&l->held_body);
  free(l);
  handle_gone(r);
}

static void local_close(local_t *l)
{
  if (uv_is_closing((uv_handle_t *)&l->pipe))
    return;
  if (l->r->slots[l->slot] == l)
    l->r->slots[l->slot] = NULL;
  if (l->beat_due)
    l->r->beats_due--;
  l->beat_due = l->parked = false;
  uv_close((uv_handle_t *)&l->pipe, on_local_closed);
}

static void close_locals(gs_relay_t *r)
{
  for (uint32_t s = 1; s <= MAX_SLOT; s++)
    if (r->slots[s])
      local_close(r->slots[s]);
}

/* The upstream connection ended: its ranks are lost to the coordinator, so
 * their local connections end too (they redial and re-register), and the
 * relay redials. */
static void up_lost(gs_relay_t *r, const char *why)
{
  bool ranks = false;

  for (uint32_t s = 1; s <= MAX_SLOT && !ranks; s++)
    ranks = r->slots[s] != NULL;
  if (r->up_ready)
    gs_log(r->cfg.log, ranks ? GS_LOG_WARN : GS_LOG_INFO, NULL, -1,
           "relay: lost the coordinator %s:%u (%s); closing the ranks' connections and redialing",
           r->cfg.coord_host, r->cfg.coord_port, why);
  r->up_ready = false;
  gs_tls_free(r->up_tls);
  r->up_tls = NULL;
  r->good_count = 0; /* a coordinator restarted may take other tokens */
  r->joins.count = 0;
  r->joins.entries.len = 0;
  r->pl = (pack_list_t){.body = r->pl.body};
  close_locals(r);
  if (r->up_open && !uv_is_closing((uv_handle_t *)&r->up))
    uv_close((uv_handle_t *)&r->up, on_handle_closed);
  r->up_open = false;
  if (!r->stopping)
    uv_timer_start(&r->redial, on_redial, REDIAL_MS, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  (void)h;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

/* Appends what was read to `rbuf` and calls `frame` for each whole frame;
 * false when the stream is broken (a frame over `max`, out of memory). */
static bool cut_frames(gs_buf_t *rbuf, const uv_buf_t *buf, ssize_t n, size_t max,
                       void (*frame)(void *arg, const uint8_t *p, size_t len), void *arg)
{
  size_t off = 0;

  if (gs_buf_append(rbuf, buf->base, (size_t)n))
    return false;
  for (;;) {
    const uint8_t *payload;
    size_t plen;
    long used = gs_frame_parse(rbuf->data + off, rbuf->len - off, max, &payload, &plen);

    if (used < 0)
      return false;
    if (used == 0)
      break;
    frame(arg, payload, plen);
    off += (size_t)used;
  }
  gs_buf_consume(rbuf, off);
  return true;
}

static void up_frame_cb(void *arg, const uint8_t *p, size_t len)
{
  up_frame(arg, p, len);
}

/* The coordinator is there to speak to (after the TLS handshake, with TLS). */
static void up_is_ready(gs_relay_t *r)
{
  r->up_ready = true;
  gs_log(r->cfg.log, GS_LOG_INFO, NULL, -1, "relay: connected to the coordinator %s:%u%s",
         r->cfg.coord_host, r->cfg.coord_port, r->up_tls ? " (TLS)" : "");
}

/* Plaintext from the coordinator, through the TLS session. A bad frame
 * stops the session's reading; its caller then drops the connection (not
 * here: the session is still at work). */
static bool up_plain(void *ctx, const uint8_t *data, size_t len)
{
  gs_relay_t *r = ctx;
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);

  r->up_heard = true;
  r->up_bad_frame = !cut_frames(&r->up_rbuf, &b, (ssize_t)len, UP_FRAME_MAX, up_frame_cb, r);
  return !r->up_bad_frame;
}

/* Ciphertext for the coordinator. */
static bool up_cipher(void *ctx, const uint8_t *data, size_t len, bool more)
{
  gs_relay_t *r = ctx;

  (void)more;
  return gs__relay_write((uv_stream_t *)&r->up, data, len);
}

/* Ciphertext from the coordinator (none: the handshake's start) through
 * the session. A session that fails before the coordinator said anything
 * is final: its certificate, or its verdict on ours (with TLS 1.3 an
 * alert just after the handshake), will not change at the next dial. */
static void up_tls_input(gs_relay_t *r, const uint8_t *data, size_t len)
{
  int err = gs_tls_input(r->up_tls, data, len, r->up_plain, sizeof(r->up_plain));
  char why[400];

  if (r->up_bad_frame) {
    r->up_bad_frame = false;
    up_lost(r, "a bad frame");
  } else if (err == GS_EPROTO && !r->up_heard) {
    snprintf(why, sizeof(why), "coordinator %s:%u: TLS %s", r->cfg.coord_host, r->cfg.coord_port,
             gs_tls_error(r->up_tls));
    up_lost(r, why);
    if (r->cfg.on_fatal)
      r->cfg.on_fatal(r->cfg.fatal_ctx, why);
  } else if (err) {
    snprintf(why, sizeof(why), "TLS: %s",
             err == GS_EPROTO ? gs_tls_error(r->up_tls) : gs_strerror(err));
    up_lost(r, why);
  } else if (r->up_tls && !r->up_ready && gs_tls_established(r->up_tls)) {
    up_is_ready(r);
  }
}

static void on_up_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  gs_relay_t *r = s->data;

  if (n < 0)
    up_lost(r, uv_strerror((int)n));
  else if (n > 0 && r->up_tls)
    up_tls_input(r, (const uint8_t *)buf->base, (size_t)n);
  else if (n > 0 && !cut_frames(&r->up_rbuf, buf, n, UP_FRAME_MAX, up_frame_cb, r))
    up_lost(r, "a bad frame");
  free(buf->base);
}

static void on_up_connect(uv_connect_t *req, int status)
{
  gs_relay_t *r = req->data;
  const gs_tls_io_t io = {.ctx = r, .on_plain = up_plain, .on_cipher = up_cipher};

  if (status < 0) {
    if (status != UV_ECANCELED)
      up_lost(r, uv_strerror(status));
    return;
  }
  uv_tcp_nodelay(&r->up, 1);
  r->up_rbuf.len = 0;
  if (uv_read_start((uv_stream_t *)&r->up, on_alloc, on_up_read)) {
    up_lost(r, "cannot read");
    return;
  }
  if (!r->cfg.tls) {
    up_is_ready(r);
    return;
  }
  r->up_heard = false;
  r->up_tls = gs_tls_connect_new(r->cfg.tls, r->cfg.coord_host, &io);
  if (!r->up_tls) {
    up_lost(r, "out of memory starting TLS");
    return;
  }
  up_tls_input(r, NULL, 0); /* the ClientHello */
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  gs_relay_t *r = req->data;

  if (r->stopping) {
    uv_freeaddrinfo(res);
    return;
  }
  if (status < 0 || !res) {
    gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: cannot resolve %s: %s", r->cfg.coord_host,
           uv_strerror(status));
    uv_timer_start(&r->redial, on_redial, REDIAL_MS, 0);
    uv_freeaddrinfo(res);
    return;
  }
  uv_tcp_init(r->loop, &r->up);
  r->up.data = r;
  r->up_open = true;
  r->open_handles++;
  r->up_req.data = r;
  if (uv_tcp_connect(&r->up_req, &r->up, res->ai_addr, on_up_connect))
    up_lost(r, "cannot connect");
  uv_freeaddrinfo(res);
}

static void up_dial(gs_relay_t *r)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  char port[8];

  if (r->stopping)
    return;
  snprintf(port, sizeof(port), "%u", r->cfg.coord_port);
  r->resolve.data = r;
  if (uv_getaddrinfo(r->loop, &r->resolve, on_resolved, r->cfg.coord_host, port, &hints))
    uv_timer_start(&r->redial, on_redial, REDIAL_MS, 0);
}

/* One call from a rank: stamped with its slot and sent up, held for a
 * batch, or (the pack list) answered here. */
static void local_frame(void *arg, const uint8_t *payload, size_t len)
{
  local_t *l = arg;
  gs_relay_t *r = l->r;
  gradsync_Envelope env;
  char why[128];
  gs_method_t m;

  if (gs_wire_decode_envelope(payload, len, &env, &r->body, why, sizeof(why))) {
    gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1, "relay: slot %u sent an undecodable frame (%s)",
           l->slot, why);
    local_close(l);
    return;
  }
  if (!r->up_ready) {
    local_close(l); /* it redials, and finds the coordinator reachable or not */
    return;
  }
  env.slot = l->slot;
  if (!gs_method_from_path(env.method, &m))
    m = GS_METHOD_COUNT; /* the coordinator answers it: unknown */
  if (m == GS_METHOD_JOIN) {
    gs__relay_token_check(l, &env);
    hold(r, &r->joins, &env, &r->body);
  } else if (m == GS_METHOD_HEARTBEAT && gs__relay_beat(r, l, &env, &r->body))
    return;
  else if (m != GS_METHOD_FETCH_PACK_LIST || !gs__relay_pack_list_fetch(r, l, &env, &r->body))
    gs__relay_send_frame(r, (uv_stream_t *)&r->up, &env, r->body.data, r->body.len);
}

static void on_local_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  local_t *l = s->data;

  if (n < 0 || (n > 0 && !cut_frames(&l->rbuf, buf, n, GS_FRAME_DEFAULT_MAX, local_frame, l)))
    local_close(l);
  free(buf->base);
}

static void on_local(uv_stream_t *server, int status)
{
  gs_relay_t *r = server->data;
  local_t *l;
  uint32_t slot = 1;

  if (status < 0)
    return;
  while (slot <= MAX_SLOT && r->slots[slot])
    slot++;
  l = calloc(1, sizeof(*l));
  if (!l)
    return;
  l->r = r;
  uv_pipe_init(r->loop, &l->pipe, 0);
  l->pipe.data = l;
  r->open_handles++;
  if (uv_accept(server, (uv_stream_t *)&l->pipe) || slot > MAX_SLOT || !r->up_ready) {
    /* No room, or nothing to relay to yet: the rank redials. */
    l->slot = 0;
    uv_close((uv_handle_t *)&l->pipe, on_local_closed);
    return;
  }
  l->slot = slot;
  r->slots[slot] = l;
  uv_read_start((uv_stream_t *)&l->pipe, on_alloc, on_local_read);
}

gs_relay_t *gs_relay_start(uv_loop_t *loop, const gs_relay_config_t *cfg, char *why, size_t why_len)
{
  gs_relay_t *r = calloc(1, sizeof(*r));
  int err;

  if (!r) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  r->cfg = *cfg;
  r->loop = loop;
  if (!r->cfg.ranks)
    r->cfg.ranks = 1;
  uv_pipe_init(loop, &r->server, 0);
  r->server.data = r;
  unlink(cfg->socket_path);
  err = uv_pipe_bind(&r->server, cfg->socket_path);
  if (!err)
    err = uv_listen((uv_stream_t *)&r->server, 256, on_local);
  if (err) {
    snprintf(why, why_len, "cannot listen on %s: %s", cfg->socket_path, uv_strerror(err));
    uv_close((uv_handle_t *)&r->server, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    free(r);
    return NULL;
  }
  uv_timer_init(loop, &r->flush);
  uv_timer_init(loop, &r->redial);
  uv_timer_init(loop, &r->tick);
  r->flush.data = r->redial.data = r->tick.data = r;
  r->on_flush = on_flush;
  r->open_handles = 4; /* server, flush, redial, tick */
  up_dial(r);
  return r;
}

void gs_relay_stop(gs_relay_t *r)
{
  if (r->stopping)
    return;
  r->stopping = true;
  flush_all(r);
  close_locals(r);
  if (r->up_open && !uv_is_closing((uv_handle_t *)&r->up))
    uv_close((uv_handle_t *)&r->up, on_handle_closed);
  r->up_open = false;
  uv_cancel((uv_req_t *)&r->resolve);
  uv_close((uv_handle_t *)&r->flush, on_handle_closed);
  uv_close((uv_handle_t *)&r->redial, on_handle_closed);
  uv_close((uv_handle_t *)&r->tick, on_handle_closed);
  uv_close((uv_handle_t *)&r->server, on_handle_closed);
  unlink(r->cfg.socket_path);
}
