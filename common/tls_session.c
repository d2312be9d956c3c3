/* TLS sessions over memory BIOs for a loop's streams (tls_session.h). */
#include "tls_session.h"

#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tls_files.h"

/* Plaintext encrypted per SSL_write: one full record. */
#define WRITE_CHUNK 16384
/* Room for the ciphertext of WRITE_CHUNK (record header, tag, padding):
 * one piece handed to on_cipher. */
#define PIECE_BYTES (WRITE_CHUNK + 1024)

struct gs_tls {
  SSL *ssl;
  BIO *rbio, *wbio; /* owned by ssl */
  gs_tls_io_t io;
  bool server;
  bool not_tls, plain_http;
  char err[256];
};

/* A session on `ctx` with its two memory BIOs, in neither role yet. */
static gs_tls_t *session_new(SSL_CTX *ctx, const gs_tls_io_t *io)
{
  gs_tls_t *s = calloc(1, sizeof(*s));

  if (!s)
    return NULL;
  s->io = *io;
  s->ssl = SSL_new(ctx);
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
  return s;
}

gs_tls_t *gs_tls_accept_new(SSL_CTX *ctx, bool verify_client, const gs_tls_io_t *io)
{
  gs_tls_t *s = session_new(ctx, io);

  if (!s)
    return NULL;
  s->server = true;
  SSL_set_accept_state(s->ssl);
  if (verify_client)
    SSL_set_verify(s->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  return s;
}

gs_tls_t *gs_tls_connect_new(SSL_CTX *ctx, const char *host, const gs_tls_io_t *io)
{
  gs_tls_t *s = session_new(ctx, io);

  if (!s)
    return NULL;
  if (gs_tls_expect_host(s->ssl, host)) {
    gs_tls_free(s);
    return NULL;
  }
  SSL_set_connect_state(s->ssl);
  return s;
}

void gs_tls_free(gs_tls_t *s)
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

/* Records why the session failed (the first reason only) and, on a
 * server, whether the peer spoke no TLS at all. */
static void failed(gs_tls_t *s)
{
  unsigned long e = ERR_peek_error();
  int reason = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
  long verify = SSL_get_verify_result(s->ssl);
  char r[128];

  if (s->server && !SSL_is_init_finished(s->ssl)) {
    s->plain_http = reason == SSL_R_HTTP_REQUEST;
    s->not_tls = s->plain_http || reason == SSL_R_WRONG_VERSION_NUMBER ||
                 reason == SSL_R_HTTPS_PROXY_REQUEST;
  }
  gs_tls_reason(r, sizeof(r));
  if (s->err[0])
    return;
  if (!e)
    snprintf(s->err, sizeof(s->err), "the connection broke during the TLS handshake");
  else if (!s->server)
    gs_tls_client_failure(reason == SSL_R_CERTIFICATE_VERIFY_FAILED ? verify : X509_V_OK, reason, r,
                          s->err, sizeof(s->err));
  else if (verify != X509_V_OK)
    snprintf(s->err, sizeof(s->err), "client certificate refused: %s",
             X509_verify_cert_error_string(verify));
  else
    snprintf(s->err, sizeof(s->err), "%s", r);
}

int gs_tls_input(gs_tls_t *s, const uint8_t *data, size_t len, uint8_t *buf, size_t cap)
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

bool gs_tls_established(const gs_tls_t *s)
{
  return SSL_is_init_finished(s->ssl);
}

int gs_tls_output(gs_tls_t *s, const uint8_t *data, size_t len)
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

void gs_tls_shutdown(gs_tls_t *s)
{
  if (!SSL_is_init_finished(s->ssl))
    return;
  ERR_clear_error();
  (void)SSL_shutdown(s->ssl);
  ERR_clear_error();
  drain(s, false);
}

size_t gs_tls_memory(const gs_tls_t *s)
{
  return GS_TLS_SESSION_COST + BIO_ctrl_pending(s->rbio);
}

bool gs_tls_peer_not_tls(const gs_tls_t *s)
{
  return s->not_tls;
}

bool gs_tls_peer_plain_http(const gs_tls_t *s)
{
  return s->plain_http;
}

const char *gs_tls_error(const gs_tls_t *s)
{
  return s->err;
}

SSL_CTX *gs_tls_client_ctx_new(const char *ca, const char *cert, const char *key, char *why,
                               size_t why_len)
{
  SSL_CTX *ctx;

  if (!ca || (!cert != !key)) {
    snprintf(why, why_len, "%s",
             !ca    ? "--tls-cert and --tls-key need --tls-ca (the CA that signed the "
                      "coordinator's certificate)"
             : cert ? "--tls-cert needs --tls-key"
                    : "--tls-key needs --tls-cert");
    return NULL;
  }
  ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) {
    snprintf(why, why_len, "out of memory setting up TLS");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS); /* idle sessions give their buffers back */
  if (gs_tls_use_ca(ctx, "--tls-ca", ca, why, why_len) ||
      (cert && gs_tls_use_cert_key(ctx, cert, key, why, why_len))) {
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

void gs_tls_client_ctx_free(SSL_CTX *ctx)
{
  SSL_CTX_free(ctx);
}

int gs_tls_expect_host(SSL *ssl, const char *host)
{
  unsigned char addr[16];

  if (!host[0])
    host = "localhost";
  if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1)
    return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 ? 0 : GS_EINVAL;
  if (SSL_set1_host(ssl, host) != 1 || SSL_set_tlsext_host_name(ssl, host) != 1)
    return GS_EINVAL;
  return 0;
}

/* What an alert or failure means for a coordinator client. */
static const char *hint_for(int reason)
{
  switch (reason) {
  case SSL_R_WRONG_VERSION_NUMBER:
  case SSL_R_PACKET_LENGTH_TOO_LONG:
  case SSL_R_RECORD_LENGTH_MISMATCH:
    return " (the coordinator did not answer in TLS: does it run without --tls-cert?)";
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
  case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
    return " (the coordinator asks for a client certificate: --tls-cert and --tls-key)";
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    return " (the coordinator refused --tls-cert: was it signed by the coordinator's "
           "--tls-client-ca?)";
  default:
    return "";
  }
}

void gs_tls_client_failure(long verify, int reason, const char *words, char *why, size_t len)
{
  const char *hint;

  if (verify == X509_V_OK) {
    snprintf(why, len, "%s%s", words, hint_for(reason));
    return;
  }
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH)
    hint = " (the coordinator's certificate does not name the address --coordinator gives: "
           "add it to the certificate's subjectAltName, or dial a name it has)";
  else if (verify == X509_V_ERR_CERT_HAS_EXPIRED || verify == X509_V_ERR_CERT_NOT_YET_VALID)
    hint = " (check the certificate's dates and this machine's clock)";
  else
    hint = " (is --tls-ca the CA that signed the coordinator's certificate?)";
  snprintf(why, len, "certificate verify failed: %s%s", X509_verify_cert_error_string(verify),
           hint);
}
