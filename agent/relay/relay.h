/* The node agent (gradsync-relay): speaks for the ranks of one node to
 * the coordinator over one connection (proto/README.md, "Batch").
 *
 * The ranks connect to it on a Unix socket and speak the usual protocol,
 * unchanged. Each local connection gets a slot; the relay stamps every
 * call with it and sends it upstream, and hands each reply, by the slot it
 * echoes, back to its connection. Joins are held for a short window (or
 * until every expected rank's is in) and go up as one Batch: one frame
 * per node instead of one per rank. Heartbeats are answered here, from
 * the last reply the coordinator sent for the rank's slot, and go up as
 * one NodeHeartbeat per node and interval, which the coordinator answers
 * only with news (proto/README.md, "NodeHeartbeat"). The pack list is
 * fetched once per generation and handed to every rank that asks.
 *
 * With a TLS context it speaks TLS (and mutual TLS, with a certificate in
 * the context) to the coordinator; the ranks' Unix socket is local and
 * plain. A handshake the coordinator's certificate fails (or the
 * coordinator refuses ours) would fail again at every redial: on_fatal
 * says why and the owner ends the relay.
 *
 * When the upstream connection ends, every local connection is closed
 * (the ranks redial, and re-register when a restarted coordinator asks
 * them to) and the relay redials. When the relay itself ends, the
 * coordinator loses its ranks together: "its node agent's connection
 * closed". One libuv loop, no threads. */
#ifndef GS_RELAY_H
#define GS_RELAY_H

#include <stdint.h>
#include <uv.h>

#include "log.h"

struct ssl_ctx_st;

/* gradsync-relay's exit status for a failure a restart would repeat (TLS
 * refused): gradsync-run does not start it again. */
#define GS_RELAY_EXIT_FATAL 3

typedef struct gs_relay_config {
  char coord_host[256];
  uint16_t coord_port;
  char socket_path[108]; /* where the ranks connect (sun_path) */
  uint32_t ranks;        /* ranks expected on this node: a batch goes when all are in */
  uint32_t window_ms;    /* or this long after its first call */
  /* Borrowed: a TLS client context to speak TLS to the coordinator with
   * (NULL: plaintext), and where a failure it cannot get past goes. */
  struct ssl_ctx_st *tls;
  void (*on_fatal)(void *ctx, const char *why);
  void *fatal_ctx;
  const gs_log_t *log;
} gs_relay_config_t;

typedef struct gs_relay gs_relay_t;

/* Listens on cfg->socket_path (removing a stale socket there) and dials
 * the coordinator; NULL with the reason in `why`. */
gs_relay_t *gs_relay_start(uv_loop_t *loop, const gs_relay_config_t *cfg, char *why,
                           size_t why_len);
/* Closes every handle (run the loop once more to finish) and removes the
 * socket; frees the relay once its handles are closed. */
void gs_relay_stop(gs_relay_t *r);

#endif
