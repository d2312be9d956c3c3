/* TLS for the coordinator's two transports (conn.c, http_server.c): one
 * context made from --tls-cert, --tls-key and --tls-client-ca, and per
 * connection a server session over memory BIOs (common/tls_session.h:
 * gs_tls_input, gs_tls_output, ...). */
#ifndef GS_TLS_H
#define GS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tls_session.h"

typedef struct gs_tls_ctx gs_tls_ctx_t;

/* The server's certificate chain and key (PEM files), and the CA that
 * must have signed RPC clients' certificates (NULL: none asked for).
 * Checked now: NULL with the reason in `why` (a file that cannot be read,
 * is not PEM, a key that does not match the certificate). Used on one
 * loop thread only. Free with gs__tls_ctx_free, after its sessions. */
gs_tls_ctx_t *gs__tls_ctx_new(const char *cert, const char *key, const char *client_ca, char *why,
                              size_t why_len);
void gs__tls_ctx_free(gs_tls_ctx_t *ctx);
/* Whether the server certificate (from --tls-cert `cert`) is expired, not
 * yet valid or expires within GS_TLS_CERT_SOON_DAYS; why says which. */
#define GS_TLS_CERT_SOON_DAYS 14
bool gs__tls_ctx_cert_warning(const gs_tls_ctx_t *ctx, const char *cert, char *why, size_t why_len);

/* A server session on `ctx` reporting to `io` (copied); `verify_client`
 * demands the client's certificate when the context has a client CA (the
 * RPC port; the HTTP port serves probes and curl without one). NULL when
 * out of memory. */
gs_tls_t *gs__tls_new(gs_tls_ctx_t *ctx, bool verify_client, const gs_tls_io_t *io);

/* A fatal protocol_version alert, written raw to a client that spoke no
 * TLS: a gradsync client without --tls-ca recognises it and says what it
 * lacks, where it would otherwise redial a closed connection. */
extern const uint8_t gs__tls_alert_not_tls[7];

#endif
