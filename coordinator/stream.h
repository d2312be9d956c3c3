/* The connection base under the coordinator's two ports: a stream is one
 * accepted TCP connection, its TLS session, its writes and the end of its
 * write side, and a port the loop-wide part every stream of one listener
 * shares (the read buffer, the next-turn queue, refusals at a cap). The
 * RPC connections (conn.c) and the HTTP ones (http_server.c) embed a
 * stream first and keep only their protocol: what input means, what may be
 * held, what to close at a cap. libuv's stream.c under tcp.c and pipe.c is
 * the model.
 *
 * A stream reports upward only through the ops its port was given. */
#ifndef GS_STREAM_H
#define GS_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "list.h"
#include "tls.h"

/* Reads land in one buffer shared by every stream of a port (the loop is
 * single threaded and a read is parsed before on_read returns). */
#define GS_STREAM_READ_CHUNK (64 * 1024)
/* What a queued write costs besides its bytes (request, buffer, malloc):
 * counted, so many small replies cost what they really do. */
#define GS_STREAM_WRITE_OVERHEAD 256

typedef struct gs_stream gs_stream_t;

/* What the protocol above a stream says. Every op runs on the loop thread. */
typedef struct gs_stream_ops {
  /* Whether `more` bytes of writes may wait for `s`; if not, the protocol
   * closes it (saying `what` would pass which limit) and says false. */
  bool (*may_hold)(gs_stream_t *s, size_t more, const char *what);
  /* What `s` holds in queued writes grew by `add` and shrank by `sub`. */
  void (*count)(gs_stream_t *s, size_t add, size_t sub);
  /* A queued write ended (status < 0: failed; the stream must close).
   * `last`: it ended what the protocol handed over as last. */
  void (*on_written)(gs_stream_t *s, int status, bool last);
  /* The stream must close: a write or the shutdown failed (`why`). */
  void (*close)(gs_stream_t *s, const char *why);
  /* The next turn of the loop after gs__stream_defer. */
  void (*on_next_turn)(gs_stream_t *s);
} gs_stream_ops_t;

/* The part of a listener every one of its streams shares. */
typedef struct gs_stream_port {
  uv_loop_t *loop;
  const gs_stream_ops_t *ops;
  gs_list_t deferred;  /* streams waiting for the loop's next turn */
  uv_idle_t next_turn; /* runs while some are */
  bool next_turn_closed;
  void (*on_next_turn_closed)(struct gs_stream_port *p);
  uint8_t rbuf[GS_STREAM_READ_CHUNK];
} gs_stream_port_t;

struct gs_stream {
  uv_tcp_t tcp; /* its data is the stream */
  uv_shutdown_t shutdown;
  gs_stream_port_t *port;
  gs_tls_t *tls;       /* the TLS session, when the port speaks TLS */
  size_t write_bytes;  /* of queued writes, as counted (GS_STREAM_WRITE_OVERHEAD each) */
  unsigned writes;     /* queued writes in flight */
  gs_list_t turn_node; /* on port->deferred while deferred */
  bool notified;       /* our TLS close_notify is out */
  bool closing;        /* gs__stream_close was called */
  char peer[64];       /* "127.0.0.1:40000", for logs */
};

/* Outcome of a write: all of it taken by the socket at once, or queued
 * (the ops' on_written follows); a negative error: the stream is closing. */
#define GS_STREAM_WRITTEN 1
#define GS_STREAM_QUEUED 0

/* A port for `loop`, whose streams report to `ops`; the next-turn handle
 * is initialised. */
void gs__stream_port_init(gs_stream_port_t *p, uv_loop_t *loop, const gs_stream_ops_t *ops);
/* Closes the port's next-turn handle; `done` runs in its close callback. */
void gs__stream_port_close(gs_stream_port_t *p, void (*done)(gs_stream_port_t *p));
/* Takes the pending connection off `server` and closes it at once, so
 * that the kernel's queue does not fill (libuv stops watching a listener
 * whose connection was not accepted). */
void gs__stream_refuse(gs_stream_port_t *p, uv_stream_t *server);

/* Initialises the stream's socket on its port (0, or a libuv error). */
int gs__stream_init(gs_stream_t *s, gs_stream_port_t *p);
/* Accepts the pending connection of `server` into `s`: no Nagle delay,
 * the peer's name, and a TLS session when `tls` is given (io: where its
 * plaintext and ciphertext go; verify_client as gs__tls_new's). 0, a
 * libuv error (UV_*), or GS_ENOMEM for the session. */
int gs__stream_accept(gs_stream_t *s, uv_stream_t *server, gs_tls_ctx_t *tls, bool verify_client,
                      const gs_tls_io_t *io);
/* Takes the stream off the next-turn queue and closes its socket;
 * `on_close` frees the owner. Once: the protocol checks `closing`. */
void gs__stream_close(gs_stream_t *s, uv_close_cb on_close);

/* Writes bufs[0..n) (n is 1 or 2): what the socket takes at once, the
 * rest queued. A queued write copies what it needs of bufs[0] and, when
 * `release` is given, holds bufs[1] itself and calls release(arg) once it
 * is written or dropped (at once when written now), counting `held_cost`
 * for it; without `release` it copies every buffer. Returns
 * GS_STREAM_WRITTEN, GS_STREAM_QUEUED or a negative error. */
int gs__stream_write(gs_stream_t *s, const uv_buf_t *bufs, unsigned n, void (*release)(void *),
                     void *arg, size_t held_cost, bool last);
/* The same for plain bytes, copied when queued. */
int gs__stream_write_bytes(gs_stream_t *s, const uint8_t *data, size_t len, bool last);
/* The end of the write side, in two: a TLS session's close_notify (once;
 * true while its record waits to be written or the stream closes: the
 * protocol comes back when it is written), then our FIN after what is
 * queued (0, or a libuv error; a later failure reaches the ops' close). */
bool gs__stream_notify(gs_stream_t *s);
int gs__stream_shutdown(gs_stream_t *s);
/* Not read until the loop's next turn, when the ops' on_next_turn takes
 * it up (what it sent meanwhile waits in the kernel). */
void gs__stream_defer(gs_stream_t *s);
/* Takes the stream off the next-turn queue (closing). */
void gs__stream_undefer(gs_stream_t *s);
bool gs__stream_deferred(const gs_stream_t *s);
/* The port's shared read buffer, as a libuv alloc callback gives it. */
void gs__stream_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

#endif
