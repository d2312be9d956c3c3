/* gradsync-coordinator's settings (gs_coord_config_t): what its flags
 * set and the service reads. No libuv, no OpenSSL: gradsync-run includes
 * it too, to parse the coordinator's flags it hands on (coord_flags.h). */
#ifndef GS_COORD_CONFIG_H
#define GS_COORD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"

/* What HTTP needs a token for, when the coordinator has one
 * (--http-auth). /healthz never does. */
typedef enum gs_http_auth {
  GS_HTTP_AUTH_CONTROL = 0, /* control, and what shows ranks' addresses (default) */
  GS_HTTP_AUTH_READ,        /* every endpoint but /healthz */
  GS_HTTP_AUTH_NONE,        /* nothing: a coordinator only trusted callers reach */
} gs_http_auth_t;

/* The TLS context main makes of the --tls-* files (tls.h). */
typedef struct gs_tls_ctx gs_tls_ctx_t;

/* Pack-list entries accepted by default: a model's tensors (about 700 for
 * a 70B dense model, about 47,000 for a 671B mixture of experts with 256
 * experts per layer), with room; each costs about 300 bytes to decode. */
#define GS_COORD_DEFAULT_MAX_PARAMS 131072

/* Jobs held at once by default: far more than a cluster runs, few enough
 * that a client creating jobs as fast as it can (5,000 a second) cannot
 * grow the coordinator without bound. */
#define GS_COORD_DEFAULT_MAX_JOBS 10000

typedef struct gs_coord_config {
  char rpc_host[256];
  uint16_t rpc_port;
  char http_host[256];
  uint16_t http_port;
  char token[256];                /* "" means no authentication */
  int http_auth;                  /* gs_http_auth_t: what HTTP needs the token for */
  uint64_t heartbeat_interval_ms; /* told to agents at Join */
  uint64_t heartbeat_timeout_ms;  /* silence that marks a rank lost */
  uint64_t rendezvous_timeout_ms; /* from a rendezvous' first Join */
  uint64_t idle_timeout_ms;       /* a connection with nothing to do is closed */
  uint64_t vacant_idle_ms;        /* at the cap, idle this long and holding no rank: closed */
  uint64_t default_wait_ms;       /* Fetch/FetchPackList without a timeout */
  uint64_t job_retention_ms;      /* a job that ran is forgotten this long after it rested */
  uint64_t stall_timeout_ms;      /* step not advancing this long: stalled; 0 never */
  uint64_t reregister_slack_ms;   /* after a restart: re-registration past the heartbeat timeout */
  uint64_t loop_pace_ms;  /* many connections open: loop iterations at least this far apart */
  uint64_t log_window_ms; /* lines about clients: each limit's window (log_limit.h) */
  size_t max_frame;       /* largest accepted frame payload */
  uint32_t max_world_size;
  uint32_t max_jobs;             /* jobs held at once; a Join for one more is refused */
  size_t max_memory;             /* connections' buffers and stored blobs together */
  uint32_t max_connections;      /* open RPC connections; 0: what the open-file limit leaves */
  uint32_t max_http_connections; /* open HTTP connections; 0: a share of that limit */
  uint32_t max_params;           /* entries of a pack list */
  /* TLS on both ports: the files (--tls-cert, --tls-key, --tls-client-ca;
   * NULL: none) and the context main made of them (borrowed, outlives the
   * service; NULL: plaintext). */
  const char *tls_cert, *tls_key, *tls_client_ca;
  gs_tls_ctx_t *tls;
  gs_log_t log;
} gs_coord_config_t;

/* Fills in the defaults (":7070", ":8080", 1s heartbeats, 10s timeout, ...). */
void gs_coord_config_defaults(gs_coord_config_t *cfg);

#endif
