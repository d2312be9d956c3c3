/* The connection base (see stream.h). */
#include "stream.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "net.h"

/* One queued write: the bytes copied (`copy`), and a buffer it holds
 * until written (`held`, given back through release). */
typedef struct stream_write {
  uv_write_t req;
  void (*release)(void *arg);
  void *arg;
  size_t cost; /* counted in the stream's write_bytes and through the ops */
  bool last;
  uint8_t copy[];
} stream_write_t;

static void on_next_turn(uv_idle_t *idle)
{
  gs_stream_port_t *p = idle->data;
  gs_list_t turn;

  gs_list_init(&turn);
  gs_list_move_all(&turn, &p->deferred); /* those deferred again wait for the next */
  while (!gs_list_empty(&turn)) {
    gs_stream_t *s = GS_CONTAINER_OF(turn.next, gs_stream_t, turn_node);

    gs_list_remove(&s->turn_node);
    p->ops->on_next_turn(s);
  }
  if (gs_list_empty(&p->deferred))
    uv_idle_stop(idle);
}

void gs__stream_port_init(gs_stream_port_t *p, uv_loop_t *loop, const gs_stream_ops_t *ops)
{
  p->loop = loop;
  p->ops = ops;
  gs_list_init(&p->deferred);
  uv_idle_init(loop, &p->next_turn);
  p->next_turn.data = p;
}

static void on_next_turn_closed(uv_handle_t *h)
{
  gs_stream_port_t *p = h->data;

  p->next_turn_closed = true;
  p->on_next_turn_closed(p);
}

void gs__stream_port_close(gs_stream_port_t *p, void (*done)(gs_stream_port_t *p))
{
  p->on_next_turn_closed = done;
  uv_close((uv_handle_t *)&p->next_turn, on_next_turn_closed);
}

static void free_refused(uv_handle_t *h)
{
  free(h);
}

void gs__stream_refuse(gs_stream_port_t *p, uv_stream_t *server)
{
  uv_tcp_t *refused = calloc(1, sizeof(*refused));

  if (refused && uv_tcp_init(p->loop, refused) == 0) {
    (void)uv_accept(server, (uv_stream_t *)refused);
    uv_close((uv_handle_t *)refused, free_refused);
  } else {
    free(refused);
  }
}

int gs__stream_init(gs_stream_t *s, gs_stream_port_t *p)
{
  s->port = p;
  gs_list_init(&s->turn_node);
  s->tcp.data = s;
  return uv_tcp_init(p->loop, &s->tcp);
}

int gs__stream_accept(gs_stream_t *s, uv_stream_t *server, gs_tls_ctx_t *tls, bool verify_client,
                      const gs_tls_io_t *io)
{
  int err = uv_accept(server, (uv_stream_t *)&s->tcp);

  if (err)
    return err;
  uv_tcp_nodelay(&s->tcp, 1);
  gs_tcp_peer_name(&s->tcp, s->peer, sizeof(s->peer));
  if (!tls)
    return 0;
  s->tls = gs__tls_new(tls, verify_client, io);
  return s->tls ? 0 : GS_ENOMEM;
}

void gs__stream_close(gs_stream_t *s, uv_close_cb on_close)
{
  s->closing = true;
  gs__stream_undefer(s);
  uv_close((uv_handle_t *)&s->tcp, on_close);
}

static void on_write(uv_write_t *req, int status)
{
  stream_write_t *w = (stream_write_t *)req;
  gs_stream_t *s = req->handle->data;
  bool last = w->last;

  s->writes--;
  s->write_bytes -= w->cost;
  s->port->ops->count(s, 0, w->cost);
  if (w->release)
    w->release(w->arg);
  free(w);
  s->port->ops->on_written(s, status, last);
}

/* Skips `sent` bytes of bufs[0..n). */
static void skip_sent(uv_buf_t *bufs, unsigned n, size_t sent)
{
  for (unsigned i = 0; i < n; i++) {
    size_t skip = sent < bufs[i].len ? sent : bufs[i].len;

    bufs[i].base += skip;
    bufs[i].len -= skip;
    sent -= skip;
  }
}

/* Most writes fit in the socket buffer at once: uv_try_write sends them
 * with no allocation, no write request and no epoll change. What does not
 * fit (or must wait behind earlier writes) goes in a queued write. */
int gs__stream_write(gs_stream_t *s, const uv_buf_t *bufs, unsigned n, void (*release)(void *),
                     void *arg, size_t held_cost, bool last)
{
  uv_stream_t *stream = (uv_stream_t *)&s->tcp;
  uv_buf_t left[2] = {bufs[0], n > 1 ? bufs[1] : uv_buf_init(NULL, 0)};
  size_t copied, cost;
  stream_write_t *w;
  const char *why;
  int sent;

  if (s->closing) {
    if (release)
      release(arg);
    return GS_ECLOSED;
  }
  sent = uv_try_write(stream, left, n);
  if (sent == UV_EAGAIN || sent == UV_ENOSYS)
    sent = 0;
  if (sent < 0) {
    why = uv_strerror(sent);
    goto out_close;
  }
  skip_sent(left, n, (size_t)sent);
  if (left[0].len + left[1].len == 0) {
    if (release)
      release(arg);
    return GS_STREAM_WRITTEN;
  }
  /* What waits: a copy of the rest (of the first buffer only, when the
   * second is held), and what the held one costs. */
  copied = left[0].len + (release ? 0 : left[1].len);
  cost = copied + (release && left[1].len ? held_cost : 0) + GS_STREAM_WRITE_OVERHEAD;
  if (!s->port->ops->may_hold(s, cost, "a reply")) {
    if (release)
      release(arg);
    return GS_ELIMIT;
  }
  w = malloc(sizeof(*w) + copied);
  why = "out of memory";
  if (!w)
    goto out_close;
  memcpy(w->copy, left[0].base, left[0].len);
  if (!release && left[1].len)
    memcpy(w->copy + left[0].len, left[1].base, left[1].len);
  w->release = release;
  w->arg = arg;
  w->cost = cost;
  w->last = last;
  left[0] = uv_buf_init((char *)w->copy, (unsigned)copied);
  n = release && left[1].len ? 2 : 1;
  sent = uv_write(&w->req, stream, left[0].len ? left : left + 1, left[0].len ? n : 1, on_write);
  if (sent) {
    why = uv_strerror(sent);
    free(w);
    goto out_close;
  }
  s->writes++;
  s->write_bytes += cost;
  s->port->ops->count(s, cost, 0);
  return GS_STREAM_QUEUED;

out_close:
  if (release)
    release(arg);
  s->port->ops->close(s, why);
  return GS_ECLOSED;
}

int gs__stream_write_bytes(gs_stream_t *s, const uint8_t *data, size_t len, bool last)
{
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);

  return gs__stream_write(s, &b, 1, NULL, NULL, 0, last);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
  gs_stream_t *s = req->handle->data;

  if (status < 0)
    s->port->ops->close(s, uv_strerror(status));
}

/* A TLS session ends with a close_notify first; its record goes to the
 * write path: written, the FIN may follow; queued, on_written comes back. */
bool gs__stream_notify(gs_stream_t *s)
{
  if (!s->tls || s->notified)
    return false;
  s->notified = true;
  gs_tls_shutdown(s->tls);
  return s->writes || s->closing;
}

int gs__stream_shutdown(gs_stream_t *s)
{
  return uv_shutdown(&s->shutdown, (uv_stream_t *)&s->tcp, on_shutdown);
}

void gs__stream_defer(gs_stream_t *s)
{
  gs_stream_port_t *p = s->port;

  if (gs_list_linked(&s->turn_node))
    return;
  gs_list_insert_tail(&p->deferred, &s->turn_node);
  uv_idle_start(&p->next_turn, on_next_turn);
}

void gs__stream_undefer(gs_stream_t *s)
{
  if (gs_list_linked(&s->turn_node))
    gs_list_remove(&s->turn_node);
}

bool gs__stream_deferred(const gs_stream_t *s)
{
  return gs_list_linked(&s->turn_node);
}

void gs__stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  gs_stream_t *s = h->data;

  (void)suggested;
  *buf = uv_buf_init((char *)s->port->rbuf, sizeof(s->port->rbuf));
}
