/* Small helpers for libuv TCP handles shared by the coordinator's servers. */
#ifndef GS_NET_H
#define GS_NET_H

#include <stddef.h>
#include <uv.h>

/* Writes the peer's address as "1.2.3.4:5" or "[::1]:5" (for logs), or "?". */
void gs_tcp_peer_name(const uv_tcp_t *tcp, char *out, size_t len);

#endif
