/* The agent's coordinator client: blocking RPCs over one TCP connection,
 * each with a deadline, framed and encoded as in proto/README.md.
 *
 * A lost connection is redialled with exponential backoff and jitter
 * (100 ms doubling to 5 s, +-25%) until the call's deadline; a call that
 * was in flight when the connection broke is sent again on the new one
 * (every RPC of ours is safe to repeat). One gs_client_t per thread: the
 * heartbeat thread has its own. */
#ifndef GS_CLIENT_H
#define GS_CLIENT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "gradsync.pb.h"
#include "log.h"
#include "packlist.h"
#include "wire.h"

/* TLS to the coordinator: the CA that signed its certificate, and this
 * agent's own certificate and key for a coordinator that asks for one
 * (--tls-client-ca). One per process, shared by every client (the
 * heartbeat thread's too). */
typedef struct gs_client_tls gs_client_tls_t;
typedef struct gs_client_tls_config {
  const char *ca;   /* PEM; required */
  const char *cert; /* PEM, the leaf first; NULL: present none */
  const char *key;  /* PEM; with cert */
} gs_client_tls_config_t;

/* Loads and checks the files now: NULL with the reason in `why` (a file
 * that cannot be read or is not PEM, a key that is not the certificate's).
 * Free with gs_client_tls_free once no client uses it. */
gs_client_tls_t *gs_client_tls_new(const gs_client_tls_config_t *cfg, char *why, size_t why_len);
void gs_client_tls_free(gs_client_tls_t *tls);

typedef struct gs_client_config {
  char host[256]; /* coordinator address */
  uint16_t port;
  const char *token; /* shared secret or NULL; never logged */
  const char *job;
  const gs_log_t *log;
  /* Set (to the signal's number) by the owner's SIGTERM/SIGINT handler:
   * every call but Heartbeat and Leave then gives up within
   * GS_CLIENT_SLICE_MS with GS_EINTR, and the error names the signal and
   * what the call waited for. Borrowed; NULL: never interrupted. */
  volatile sig_atomic_t *interrupt;
  /* Borrowed, outlives the client; NULL: plaintext. With it every
   * connection is TLS, and the coordinator's certificate must name `host`
   * (a DNS name, or an IP address in its subjectAltName). */
  const gs_client_tls_t *tls;
} gs_client_config_t;

/* How often a waiting call looks at the interrupt flag. */
#define GS_CLIENT_SLICE_MS 100u
/* A TLS handshake that has not finished in this long is given up, and
 * the coordinator redialled: a coordinator without TLS reads a
 * ClientHello as the start of a frame and may wait for the rest. */
#define GS_CLIENT_HANDSHAKE_MS 10000u
/* How often a waiting call says what it waits for (an info line). */
#define GS_CLIENT_PROGRESS_MS 10000u

typedef struct gs_client gs_client_t;

/* Creates a client (does not connect yet: the first call does). The config
 * strings are copied. NULL on allocation failure. */
gs_client_t *gs_client_new(const gs_client_config_t *cfg);
/* Closes the connection and frees the client (NULL is a no-op). */
void gs_client_free(gs_client_t *cl);

/* Sets how often a waiting call logs that it still waits (tests use a
 * short interval; the default is GS_CLIENT_PROGRESS_MS). */
void gs_client_set_progress_interval(gs_client_t *cl, uint32_t ms);

/* The rank's session (gs_join_result_t.session), sent with every later
 * call: the coordinator acts for the rank it names. */
void gs_client_set_session(gs_client_t *cl, const char *session);
/* The session the client sends ("" before a Join). */
const char *gs_client_session(const gs_client_t *cl);

/* The last error text: the coordinator's message for a refused call, or
 * what failed locally ("connect 127.0.0.1:7070: connection refused"). */
const char *gs_client_error(const gs_client_t *cl);

/* Sends one request and waits for its response until `timeout_ms` from
 * now, reconnecting as needed. The response body is decoded into
 * `resp` (type resp_fields; callback fields bound by the caller). Returns
 * 0, GS_ETIMEDOUT, or the error the coordinator's gRPC status maps to
 * (gs_client_error has its message). `wait_ms` > 0 is sent as the
 * envelope's timeout_ms for RPCs that park (Join, Fetch, FetchPackList). */
int gs_client_call(gs_client_t *cl, gs_method_t method, const pb_msgdesc_t *req_fields,
                   const void *req, const pb_msgdesc_t *resp_fields, void *resp, uint32_t wait_ms,
                   uint64_t timeout_ms) GS_WARN_UNUSED;

/* One peer as the rendezvous answered it. */
typedef struct gs_peer {
  uint32_t rank;
  char node[256];
  uint32_t local_rank;
  char device[64];
  char comm_addr[256];
} gs_peer_t;

typedef struct gs_join_result {
  uint32_t rank;
  uint32_t world_size;
  uint64_t generation;
  int32_t bcast_period;
  uint32_t heartbeat_interval_ms;
  uint32_t heartbeat_timeout_ms;
  char session[48]; /* this rank's credential for the generation */
  /* Elastic regroups: every rank takes its state from rank state_rank
   * (at step state_step) instead of starting fresh; why the previous
   * generation ended. */
  bool resume_state;
  uint32_t state_rank;
  uint64_t state_step;
  char regroup_reason[256];
  /* The directives' counters as they stood (0 from an older coordinator):
   * a new rank 0 passes on only requests made after its Join. */
  uint64_t broadcast_seq, checkpoint_seq, regroup_seq, trace_seq, coordinator_id;
  float lr_scale;   /* the operator's lr scale (Directives.lr_scale; 1 when unset) */
  gs_peer_t *peers; /* world_size entries in rank order; free with gs_join_result_free */
} gs_join_result_t;

/* Join: waits for the rendezvous (req->job is overwritten with the
 * client's job). On success the client keeps the rank's session and
 * sends it with every later call. */
int gs_client_join(gs_client_t *cl, gradsync_JoinRequest *req, uint64_t timeout_ms,
                   gs_join_result_t *out) GS_WARN_UNUSED;
void gs_join_result_free(gs_join_result_t *r);

/* Publish/Fetch of a per-generation blob (at most 16 KiB). Fetch waits
 * until the blob exists; *len gets its size (value holds `cap` bytes). */
int gs_client_publish(gs_client_t *cl, uint64_t generation, const char *key, const void *value,
                      size_t len, uint64_t timeout_ms) GS_WARN_UNUSED;
int gs_client_fetch(gs_client_t *cl, uint64_t generation, const char *key, void *value, size_t cap,
                    size_t *len, uint64_t timeout_ms) GS_WARN_UNUSED;

/* Publishes rank 0's pack list with the params it packs. */
int gs_client_publish_packlist(gs_client_t *cl, uint64_t generation, uint32_t rank,
                               const gs_packlist_t *list, const gs_param_desc_t *params, uint32_t n,
                               uint64_t timeout_ms) GS_WARN_UNUSED;

/* Fetches the published pack list (waits until rank 0 published it). On
 * success `list` is filled (free with gs_packlist_free) and *params and *n get
 * the params it names (names owned by the arrays; free with
 * gs_client_params_free). */
int gs_client_fetch_packlist(gs_client_t *cl, uint64_t generation, gs_packlist_t *list,
                             gs_param_desc_t **params, uint32_t *n,
                             uint64_t timeout_ms) GS_WARN_UNUSED;
void gs_client_params_free(gs_param_desc_t *params, uint32_t n);

int gs_client_heartbeat(gs_client_t *cl, const gradsync_HeartbeatRequest *req,
                        gradsync_HeartbeatResponse *resp, uint64_t timeout_ms) GS_WARN_UNUSED;

int gs_client_leave(gs_client_t *cl, uint64_t generation, uint32_t rank, bool finished,
                    const char *reason, uint64_t timeout_ms) GS_WARN_UNUSED;

#endif
