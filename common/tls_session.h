/* A TLS session over two memory BIOs, for a libuv loop's streams:
 * OpenSSL never touches a socket and never blocks the loop. The owner
 * feeds the session the ciphertext it read and gets plaintext back
 * through a callback; it hands the session plaintext to send and gets
 * ciphertext back through another, which it writes as it would any
 * bytes. The server side is the coordinator's transports (conn.c,
 * http_server.c); the client side a node agent's link to the coordinator
 * (gradsync-relay) and the load generator of bench/. */
#ifndef GS_TLS_SESSION_H
#define GS_TLS_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

struct ssl_ctx_st;
struct ssl_st;

/* What a session holds besides the bytes waiting in its input BIO: the
 * SSL object, its record buffers (released while idle), the two BIOs.
 * Counted in a connection's memory as its bookkeeping is. Measured: a
 * coordinator holding 12,500 TLS node-agent connections (100,000 ranks
 * heartbeating) had 19.5 KB more RSS a connection than without TLS; 48
 * KiB, the guess before, refused that world at the default --max-memory. */
#define GS_TLS_SESSION_COST (24 * 1024)

typedef struct gs_tls gs_tls_t;

/* Where a session's bytes go: both run during the session's calls. */
typedef struct gs_tls_io {
  void *ctx;
  /* Plaintext that arrived; valid during the call. Return false to stop
   * reading (the transport paused or is closing): the rest stays in the
   * session until the next gs_tls_input. */
  bool (*on_plain)(void *ctx, const uint8_t *data, size_t len);
  /* Ciphertext to write to the socket, valid during the call; `more`:
   * another piece of the same send follows. Return false when the
   * connection is gone, to stop. */
  bool (*on_cipher)(void *ctx, const uint8_t *data, size_t len, bool more);
} gs_tls_io_t;

/* A server session on `ctx` reporting to `io` (copied); `verify_client`
 * demands the client's certificate (the context trusts its CA). NULL
 * when out of memory. */
gs_tls_t *gs_tls_accept_new(struct ssl_ctx_st *ctx, bool verify_client, const gs_tls_io_t *io);
/* A client session that will verify the server's certificate against
 * `host` (its name, or its IP address); start it with gs_tls_input of no
 * bytes, which hands its ClientHello to on_cipher. NULL when out of
 * memory. */
gs_tls_t *gs_tls_connect_new(struct ssl_ctx_st *ctx, const char *host, const gs_tls_io_t *io);
void gs_tls_free(gs_tls_t *s);

/* Takes `len` bytes of ciphertext read from the socket (none: only hands
 * on what waits, after a pause, or starts a client's handshake), moves
 * the handshake on and hands every plaintext byte to on_plain, in pieces
 * decrypted into buf[0..cap) (which may be the buffer `data` is in: it is
 * copied first). Replies the handshake needs go to on_cipher. 0,
 * GS_ECLOSED (the peer ended the session), GS_ENOMEM, or GS_EPROTO: the
 * peer broke the protocol, any alert for it already given to on_cipher,
 * gs_tls_error says how. */
int gs_tls_input(gs_tls_t *s, const uint8_t *data, size_t len, uint8_t *buf,
                 size_t cap) GS_WARN_UNUSED;
/* Whether the handshake is done (a client sends only then). */
bool gs_tls_established(const gs_tls_t *s);
/* Encrypts `len` bytes and hands the ciphertext to on_cipher, in pieces
 * of a record or two, so no BIO grows with the size of a reply. */
int gs_tls_output(gs_tls_t *s, const uint8_t *data, size_t len) GS_WARN_UNUSED;
/* Sends a close_notify, so the peer sees a clean end of the session. */
void gs_tls_shutdown(gs_tls_t *s);
/* The bytes the session holds: its cost and what waits in its input. */
size_t gs_tls_memory(const gs_tls_t *s);
/* After GS_EPROTO on a server session: the peer's first bytes were no TLS
 * record at all (a client without TLS), and whether they were a plain
 * HTTP request. */
bool gs_tls_peer_not_tls(const gs_tls_t *s);
bool gs_tls_peer_plain_http(const gs_tls_t *s);
/* The first error, for a log line ("" when none); a client's says what a
 * refused certificate or alert means for a coordinator's client. */
const char *gs_tls_error(const gs_tls_t *s);

/* A client context for the coordinator: its certificate verified with
 * `ca` (PEM, required); with `cert` and `key`, this client's own (mutual
 * TLS). NULL with the reason in `why`, naming the agents' flags (--tls-ca,
 * --tls-cert, --tls-key). Free with gs_tls_client_ctx_free. */
struct ssl_ctx_st *gs_tls_client_ctx_new(const char *ca, const char *cert, const char *key,
                                         char *why, size_t why_len);
void gs_tls_client_ctx_free(struct ssl_ctx_st *ctx);

/* For a client of the coordinator (here and agent/client's blocking
 * sessions): the peer's certificate must name `host`, the address dialled
 * (an IP address in its subjectAltName, or the host name). 0 or
 * GS_EINVAL. */
int gs_tls_expect_host(struct ssl_st *ssl, const char *host) GS_WARN_UNUSED;
/* What a failed handshake with the coordinator means, and what to do:
 * `verify` is SSL_get_verify_result's, `reason` the SSL error reason of
 * the first queued error (0: none), `words` OpenSSL's words for it. */
void gs_tls_client_failure(long verify, int reason, const char *words, char *why, size_t len);

#endif
