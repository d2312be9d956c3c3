/* How the open-file limit is shared: RPC connections (agents), HTTP
 * connections (people, tools, probes) and a few descriptors for the rest,
 * so that neither port can take the descriptors the other needs. Idle
 * HTTP connections need no token: 1,100 of them under a limit of 1,024
 * once used every descriptor, and /healthz and new agents were turned
 * away. Pure: the caller reads the limit. */
#ifndef GS_FD_BUDGET_H
#define GS_FD_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

/* Descriptors kept for everything but connections: stdio, the two
 * listeners, the loop's own (epoll, its wakeup and signal descriptors,
 * libuv's spare for accepts past the limit), OpenSSL's. About a dozen. */
#define GS_FD_OTHERS 32
/* --max-http-connections when not set: this fraction of the descriptors,
 * at most GS_FD_HTTP_MAX (tools and probes use a handful at a time). */
#define GS_FD_HTTP_SHARE 8
#define GS_FD_HTTP_MAX 256
#define GS_FD_CONN_MAX (1u << 20) /* either cap, when the limit is larger */

typedef struct gs_fd_budget {
  uint32_t rpc;  /* open RPC connections at most (--max-connections) */
  uint32_t http; /* open HTTP connections at most (--max-http-connections) */
  bool fits;     /* rpc + http + GS_FD_OTHERS is within the limit */
} gs_fd_budget_t;

/* The caps for an open-file limit of `nofile` (UINT64_MAX: none known).
 * A cap given (non-zero) is kept; one not given is derived: HTTP's as a
 * share of the limit, then RPC's as what is left (at least half), so that
 * the defaults always fit a limit of 64 or more. `fits` says whether the
 * result does. */
gs_fd_budget_t gs__fd_budget(uint64_t nofile, uint32_t rpc, uint32_t http);

#endif
