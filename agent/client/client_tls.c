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
#include "tls_session.h"

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
  gs_client_tls_t *tls = calloc(1, sizeof(*tls));

  if (!tls || !(tls->bio = bio_method())) {
    snprintf(why, why_len, "out of memory setting up TLS");
    gs_client_tls_free(tls);
    return NULL;
  }
  tls->ctx = gs_tls_client_ctx_new(cfg->ca, cfg->cert, cfg->key, why, why_len);
  if (!tls->ctx) {
    gs_client_tls_free(tls);
    return NULL;
  }
  return tls;
}

void gs_client_tls_free(gs_client_tls_t *tls)
{
  if (!tls)
    return;
  gs_tls_client_ctx_free(tls->ctx);
  BIO_meth_free(tls->bio);
  free(tls);
}

int gs__client_tls_start(const gs_client_tls_t *tls, int fd, const char *host, SSL **out)
{
  SSL *ssl = SSL_new(tls->ctx);
  BIO *bio = BIO_new(tls->bio);

  *out = NULL;
  if (!ssl || !bio || gs_tls_expect_host(ssl, host)) {
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
  gs_tls_reason(r, sizeof(r));
  gs_tls_client_failure(reason == SSL_R_CERTIFICATE_VERIFY_FAILED ? verify : X509_V_OK, reason, r,
                        why, len);
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
