/* TLS sessions over memory BIOs for the loop's transports (tls.h). */
#include "tls.h"

#include "tls_files.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* Plaintext encrypted per SSL_write: one full record. */
#define WRITE_CHUNK 16384
/* Room for the ciphertext of WRITE_CHUNK (record header, tag, padding):
 * one piece handed to on_cipher. */
#define PIECE_BYTES (WRITE_CHUNK + 1024)

struct gs_tls_ctx {
  SSL_CTX *ssl;
  bool client_ca;
};

struct gs_tls {
  gs_tls_ctx_t *ctx;
  SSL *ssl;
  BIO *rbio, *wbio; /* owned by ssl */
  gs_tls_io_t io;
  bool not_tls, plain_http;
  char err[160];
};

const uint8_t gs__tls_alert_not_tls[7] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46};

/* Trusts `ca` for client certificates and names it in the handshake's
 * certificate request. */
static bool load_client_ca(SSL_CTX *ssl, const char *ca, char *why, size_t len)
{
  STACK_OF(X509_NAME) * names;

  if (gs_tls_use_ca(ssl, "--tls-client-ca", ca, why, len))
    return false;
  names = SSL_load_client_CA_file(ca);
  if (!names) {
    snprintf(why, len, "--tls-client-ca %s: no CA certificate in it", ca);
    return false;
  }
  SSL_CTX_set_client_CA_list(ssl, names);
  return true;
}

gs_tls_ctx_t *gs__tls_ctx_new(const char *cert, const char *key, const char *client_ca, char *why,
                              size_t why_len)
{
  gs_tls_ctx_t *ctx = calloc(1, sizeof(*ctx));

  if (!ctx || !(ctx->ssl = SSL_CTX_new(TLS_server_method()))) {
    snprintf(why, why_len, "out of memory setting up TLS");
    free(ctx);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx->ssl, TLS1_2_VERSION);
  /* Idle sessions give their record buffers back; no renegotiation (a
   * client could make us redo handshakes at will); no session tickets
   * (agents hold their connections, and curl does not resume). */
  SSL_CTX_set_mode(ctx->ssl, SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(ctx->ssl, SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(ctx->ssl, 0);
  if (gs_tls_use_cert_key(ctx->ssl, cert, key, why, why_len) ||
      (client_ca && !load_client_ca(ctx->ssl, client_ca, why, why_len))) {
    gs__tls_ctx_free(ctx);
    return NULL;
  }
  ctx->client_ca = client_ca != NULL;
  return ctx;
}

bool gs__tls_ctx_cert_warning(const gs_tls_ctx_t *ctx, const char *cert, char *why, size_t why_len)
{
  return gs_tls_cert_dates_warn(ctx->ssl, "--tls-cert", cert, GS_TLS_CERT_SOON_DAYS, why, why_len);
}

void gs__tls_ctx_free(gs_tls_ctx_t *ctx)
{
  if (!ctx)
    return;
  SSL_CTX_free(ctx->ssl);
  free(ctx);
}

gs_tls_t *gs__tls_new(gs_tls_ctx_t *ctx, bool verify_client, const gs_tls_io_t *io)
{
  gs_tls_t *s = calloc(1, sizeof(*s));

  if (!s)
    return NULL;
  s->ctx = ctx;
  s->io = *io;
  s->ssl = SSL_new(ctx->ssl);
  s->rbio = BIO_new(BIO_s_mem());
  s->wbio = BIO_new(BIO_s_mem());
  if (!s->ssl || !s->rbio || !s->wbio) {
    BIO_free(s->rbio);
    BIO_free(s->wbio);
    SSL_free(s->ssl);
    free(s);
    return NULL;
  }
  /* An empty input BIO means "more to come", not end of stream. */
  BIO_set_mem_eof_return(s->rbio, -1);
  SSL_set_bio(s->ssl, s->rbio, s->wbio);
  SSL_set_accept_state(s->ssl);
  if (verify_client && ctx->client_ca)
    SSL_set_verify(s->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  return s;
}

void gs__tls_free(gs_tls_t *s)
{
  if (!s)
    return;
  SSL_free(s->ssl);
  free(s);
}

/* Hands what waits in the output BIO to on_cipher; `more`: the caller
 * has more of the same send to come. False when on_cipher stopped. The
 * piece is on the stack: on_cipher may close a connection, whose owner
 * may send on other sessions before it returns. */
static bool drain(gs_tls_t *s, bool more)
{
  uint8_t piece[PIECE_BYTES];
  int n;

  while ((n = BIO_read(s->wbio, piece, sizeof(piece))) > 0) {
    bool left = BIO_ctrl_pending(s->wbio) > 0;

    if (!s->io.on_cipher(s->io.ctx, piece, (size_t)n, more || left))
      return false;
  }
  return true;
}

/* Records why the session failed (the first reason only) and whether the
 * peer spoke no TLS at all. */
static void failed(gs_tls_t *s)
{
  unsigned long e = ERR_peek_error();
  int reason = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
  long verify = SSL_get_verify_result(s->ssl);
  char r[128];

  if (!SSL_is_init_finished(s->ssl)) {
    s->plain_http = reason == SSL_R_HTTP_REQUEST;
    s->not_tls = s->plain_http || reason == SSL_R_WRONG_VERSION_NUMBER ||
                 reason == SSL_R_HTTPS_PROXY_REQUEST;
  }
  gs_tls_reason(r, sizeof(r));
  if (s->err[0])
    return;
  if (!e)
    snprintf(s->err, sizeof(s->err), "the connection broke during the TLS handshake");
  else if (verify != X509_V_OK)
    snprintf(s->err, sizeof(s->err), "client certificate refused: %s",
             X509_verify_cert_error_string(verify));
  else
    snprintf(s->err, sizeof(s->err), "%s", r);
}

int gs__tls_input(gs_tls_t *s, const uint8_t *data, size_t len, uint8_t *buf, size_t cap)
{
  if (len && (len > INT_MAX || BIO_write(s->rbio, data, (int)len) != (int)len))
    return GS_ENOMEM;
  for (;;) {
    int n, err;

    ERR_clear_error();
    n = SSL_read(s->ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
    if (n > 0) {
      if (!s->io.on_plain(s->io.ctx, buf, (size_t)n))
        return 0;
      continue;
    }
    err = SSL_get_error(s->ssl, n);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      drain(s, false);
      return 0;
    }
    if (err == SSL_ERROR_ZERO_RETURN) {
      drain(s, false);
      return GS_ECLOSED;
    }
    failed(s);
    drain(s, false); /* the alert OpenSSL queued, if any */
    return GS_EPROTO;
  }
}

int gs__tls_output(gs_tls_t *s, const uint8_t *data, size_t len)
{
  while (len) {
    int n = len > WRITE_CHUNK ? WRITE_CHUNK : (int)len;

    ERR_clear_error();
    n = SSL_write(s->ssl, data, n);
    if (n <= 0) {
      failed(s);
      return GS_EPROTO;
    }
    data += n;
    len -= (size_t)n;
    if (!drain(s, len > 0))
      return GS_ECLOSED;
  }
  return 0;
}

void gs__tls_shutdown(gs_tls_t *s)
{
  if (!SSL_is_init_finished(s->ssl))
    return;
  ERR_clear_error();
  (void)SSL_shutdown(s->ssl);
  ERR_clear_error();
  drain(s, false);
}

size_t gs__tls_memory(const gs_tls_t *s)
{
  return GS_TLS_SESSION_COST + BIO_ctrl_pending(s->rbio);
}

bool gs__tls_peer_not_tls(const gs_tls_t *s)
{
  return s->not_tls;
}

bool gs__tls_peer_plain_http(const gs_tls_t *s)
{
  return s->plain_http;
}

const char *gs__tls_error(const gs_tls_t *s)
{
  return s->err;
}
