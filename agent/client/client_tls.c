/* TLS for the coordinator client (client.h, client_tls.h): a context
 * from --tls-ca, --tls-cert and --tls-key, and sessions on the client's
 * non-blocking socket. OpenSSL reaches the socket through a BIO of our
 * own that sends with MSG_NOSIGNAL: a coordinator that closes must be an
 * error, not a SIGPIPE in a program that did not ignore it. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "client_tls.h"
#include "tls_files.h"

struct gs_client_tls {
  SSL_CTX *ctx;
  BIO_METHOD *bio; /* the socket BIO below (client_tls.c's header) */
};

static int fd_of(BIO *b)
{
  return (int)(intptr_t)BIO_get_data(b);
}

static bool again(void)
{
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

static int bio_write(BIO *b, const char *data, int len)
{
  ssize_t n = send(fd_of(b), data, (size_t)len, MSG_NOSIGNAL);

  BIO_clear_retry_flags(b);
  if (n < 0 && again())
    BIO_set_retry_write(b);
  return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
  ssize_t n = recv(fd_of(b), buf, (size_t)len, 0);

  BIO_clear_retry_flags(b);
  if (n < 0 && again())
    BIO_set_retry_read(b);
  return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
  (void)b;
  (void)num;
  (void)ptr;
  return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* writes go straight to the socket */
}

static int bio_create(BIO *b)
{
  BIO_set_init(b, 1);
  return 1;
}

static BIO_METHOD *bio_method(void)
{
  BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "gradsync socket");

  if (m && (!BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) ||
            !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create))) {
    BIO_meth_free(m);
    m = NULL;
  }
  return m;
}

gs_client_tls_t *gs_client_tls_new(const gs_client_tls_config_t *cfg, char *why, size_t why_len)
{
  gs_client_tls_t *tls;

  if (!cfg->ca || (!cfg->cert != !cfg->key)) {
    snprintf(why, why_len, "%s",
             !cfg->ca    ? "--tls-cert and --tls-key need --tls-ca (the CA that signed the "
                           "coordinator's certificate)"
             : cfg->cert ? "--tls-cert needs --tls-key"
                         : "--tls-key needs --tls-cert");
    return NULL;
  }
  tls = calloc(1, sizeof(*tls));
  if (!tls || !(tls->ctx = SSL_CTX_new(TLS_client_method())) || !(tls->bio = bio_method())) {
    snprintf(why, why_len, "out of memory setting up TLS");
    gs_client_tls_free(tls);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(tls->ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(tls->ctx, SSL_VERIFY_PEER, NULL);
  if (gs_tls_use_ca(tls->ctx, "--tls-ca", cfg->ca, why, why_len) ||
      (cfg->cert && gs_tls_use_cert_key(tls->ctx, cfg->cert, cfg->key, why, why_len))) {
    gs_client_tls_free(tls);
    return NULL;
  }
  return tls;
}

void gs_client_tls_free(gs_client_tls_t *tls)
{
  if (!tls)
    return;
  SSL_CTX_free(tls->ctx);
  BIO_meth_free(tls->bio);
  free(tls);
}

/* The coordinator's certificate must name the address we dialled: an IP
 * address in its subjectAltName, or the host name. */
static int expect_peer(SSL *ssl, const char *host)
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

int gs__client_tls_start(const gs_client_tls_t *tls, int fd, const char *host, SSL **out)
{
  SSL *ssl = SSL_new(tls->ctx);
  BIO *bio = BIO_new(tls->bio);

  *out = NULL;
  if (!ssl || !bio || expect_peer(ssl, host)) {
    BIO_free(bio);
    SSL_free(ssl);
    return GS_ENOMEM;
  }
  BIO_set_data(bio, (void *)(intptr_t)fd);
  SSL_set_bio(ssl, bio, bio);
  SSL_set_connect_state(ssl);
  *out = ssl;
  return 0;
}

void gs__client_tls_end(SSL *ssl)
{
  SSL_free(ssl);
}

/* What a failed certificate check says, and what to do about it. */
static void verify_failed(long result, char *why, size_t len)
{
  const char *hint = "";

  if (result == X509_V_ERR_HOSTNAME_MISMATCH || result == X509_V_ERR_IP_ADDRESS_MISMATCH)
    hint = " (the coordinator's certificate does not name the address --coordinator gives: "
           "add it to the certificate's subjectAltName, or dial a name it has)";
  else if (result == X509_V_ERR_CERT_HAS_EXPIRED || result == X509_V_ERR_CERT_NOT_YET_VALID)
    hint = " (check the certificate's dates and this machine's clock)";
  else
    hint = " (is --tls-ca the CA that signed the coordinator's certificate?)";
  snprintf(why, len, "certificate verify failed: %s%s", X509_verify_cert_error_string(result),
           hint);
}

/* What OpenSSL's failure means for a coordinator client. */
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

/* Maps the outcome of one SSL call (rc <= 0) onto the steps' returns. */
static int outcome(SSL *ssl, int rc, short *wait, char *why, size_t len)
{
  int err = SSL_get_error(ssl, rc), sys = errno;
  unsigned long e = ERR_peek_error();
  int reason = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
  long verify = SSL_get_verify_result(ssl);
  char r[128];

  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    *wait = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    return 0;
  }
  if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && !e) ||
      reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    snprintf(why, len, "connection %s", err == SSL_ERROR_SYSCALL && sys ? strerror(sys) : "closed");
    return GS_ECLOSED;
  }
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED && verify != X509_V_OK) {
    ERR_clear_error();
    verify_failed(verify, why, len);
    return GS_EPROTO;
  }
  gs_tls_reason(r, sizeof(r));
  snprintf(why, len, "%s%s", r, hint_for(reason));
  return GS_EPROTO;
}

int gs__client_tls_handshake(SSL *ssl, short *wait, char *why, size_t why_len)
{
  int rc;

  *wait = 0;
  ERR_clear_error();
  errno = 0;
  rc = SSL_connect(ssl);
  return rc == 1 ? 0 : outcome(ssl, rc, wait, why, why_len);
}

int gs__client_tls_io(SSL *ssl, bool writing, void *buf, size_t len, size_t *done, short *wait,
                      char *why, size_t why_len)
{
  int n = len > INT_MAX ? INT_MAX : (int)len, rc;

  *done = 0;
  *wait = 0;
  ERR_clear_error();
  errno = 0;
  rc = writing ? SSL_write(ssl, buf, n) : SSL_read(ssl, buf, n);
  if (rc > 0) {
    *done = (size_t)rc;
    return 0;
  }
  return outcome(ssl, rc, wait, why, why_len);
}
