/* The coordinator's TLS context (tls.h). */
#include "tls.h"

#include "tls_files.h"

#include <stdio.h>
#include <stdlib.h>

#include <openssl/ssl.h>

struct gs_tls_ctx {
  SSL_CTX *ssl;
  bool client_ca;
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
  return gs_tls_accept_new(ctx->ssl, verify_client && ctx->client_ca, io);
}
