/* TLS for the coordinator's two transports (conn.c, http_server.c): one
 * context made from --tls-cert, --tls-key and --tls-client-ca, and per
 * connection a session over two memory BIOs, so OpenSSL never touches a
 * socket and never blocks the loop. The transport feeds the session the
 * ciphertext it read and gets plaintext back through a callback; it hands
 * the session plaintext to send and gets ciphertext back through another,
 * which it writes as it would any bytes. */
#ifndef GS_TLS_H
#define GS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* What a session holds besides the bytes waiting in its input BIO: the
 * SSL object, its record buffers (released while idle), the two BIOs.
 * Counted in a connection's memory as its bookkeeping is. */
#define GS_TLS_SESSION_COST (48 * 1024)

typedef struct gs_tls_ctx gs_tls_ctx_t;
typedef struct gs_tls gs_tls_t;

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

/* Where a session's bytes go: both run during the session's calls. */
typedef struct gs_tls_io {
  void *ctx;
  /* Plaintext that arrived; valid during the call. Return false to stop
   * reading (the transport paused or is closing): the rest stays in the
   * session until the next gs__tls_input. */
  bool (*on_plain)(void *ctx, const uint8_t *data, size_t len);
  /* Ciphertext to write to the socket, valid during the call; `more`:
   * another piece of the same send follows. Return false when the
   * connection is gone, to stop. */
  bool (*on_cipher)(void *ctx, const uint8_t *data, size_t len, bool more);
} gs_tls_io_t;

/* A server session on `ctx` reporting to `io` (copied); `verify_client`
 * demands the client's certificate when the context has a client CA (the
 * RPC port; the HTTP port serves probes and curl without one). NULL when
 * out of memory. */
gs_tls_t *gs__tls_new(gs_tls_ctx_t *ctx, bool verify_client, const gs_tls_io_t *io);
void gs__tls_free(gs_tls_t *s);

/* Takes `len` bytes of ciphertext read from the socket (none: only hands
 * on what waits, after a pause), moves the handshake on and hands every
 * plaintext byte to on_plain, in pieces decrypted into buf[0..cap) (which
 * may be the buffer `data` is in: it is copied first). Replies the
 * handshake needs go to on_cipher. 0, GS_ECLOSED (the peer ended the
 * session), GS_ENOMEM, or GS_EPROTO: the peer broke the protocol, any
 * alert for it already given to on_cipher, gs__tls_error says how. */
int gs__tls_input(gs_tls_t *s, const uint8_t *data, size_t len, uint8_t *buf,
                  size_t cap) GS_WARN_UNUSED;
/* Encrypts `len` bytes and hands the ciphertext to on_cipher, in pieces
 * of a record or two, so no BIO grows with the size of a reply. */
int gs__tls_output(gs_tls_t *s, const uint8_t *data, size_t len) GS_WARN_UNUSED;
/* Sends a close_notify, so the peer sees a clean end of the session. */
void gs__tls_shutdown(gs_tls_t *s);
/* The bytes the session holds: its cost and what waits in its input. */
size_t gs__tls_memory(const gs_tls_t *s);
/* After GS_EPROTO: the peer's first bytes were no TLS record at all (a
 * client without TLS), and whether they were a plain HTTP request. */
bool gs__tls_peer_not_tls(const gs_tls_t *s);
bool gs__tls_peer_plain_http(const gs_tls_t *s);
/* The first error, for a log line ("" when none). */
const char *gs__tls_error(const gs_tls_t *s);

/* A fatal protocol_version alert, written raw to a client that spoke no
 * TLS: a gradsync client without --tls-ca recognises it and says what it
 * lacks, where it would otherwise redial a closed connection. */
extern const uint8_t gs__tls_alert_not_tls[7];

#endif
