/* The coordinator's libuv boundary: its error conversion, and small helpers
 * for the TCP handles both of its servers use. */
#ifndef GS_NET_H
#define GS_NET_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "error.h"
#include "log.h"

/* Converts a (negative) libuv error code, once, at the libuv boundary. */
int gs_err_from_uv(int uverr);

/* Writes the peer's address as "1.2.3.4:5" or "[::1]:5" (for logs), or "?". */
void gs_tcp_peer_name(const uv_tcp_t *tcp, char *out, size_t len);

/* Binds `tcp` to host:port (a ':' in host means IPv6; port 0 any free port)
 * and listens. Returns 0 or a GS_E* code, after logging the reason with
 * `what` ("rpc", "http") in front. */
int gs_tcp_listen(uv_tcp_t *tcp, const char *host, uint16_t port, uv_connection_cb on_connection,
                  const gs_log_t *log, const char *what) GS_WARN_UNUSED;

/* The local port a bound handle holds (the one the kernel chose for port 0),
 * or 0 if unbound. */
uint16_t gs_tcp_local_port(const uv_tcp_t *tcp);

#endif
