/* TLS files into an OpenSSL context (tls_files.h). */
#include "tls_files.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

void gs_tls_reason(char *out, size_t len)
{
  unsigned long e = ERR_peek_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;

  if (r)
    snprintf(out, len, "%s", r);
  else if (e)
    ERR_error_string_n(e, out, len);
  else
    snprintf(out, len, "unknown error");
  ERR_clear_error();
}

/* Whether `path` can be opened for reading; if not, why in errno's words
 * (OpenSSL's own would say only that it failed). */
static bool readable(const char *flag, const char *path, char *why, size_t len)
{
  FILE *f = fopen(path, "r");

  if (!f) {
    snprintf(why, len, "%s %s: %s", flag, path, strerror(errno));
    return false;
  }
  fclose(f);
  return true;
}

int gs_tls_use_cert_key(struct ssl_ctx_st *ctx, const char *cert, const char *key, char *why,
                        size_t why_len)
{
  char r[128];

  if (!readable("--tls-cert", cert, why, why_len) || !readable("--tls-key", key, why, why_len))
    return GS_EINVAL;
  if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
    gs_tls_reason(r, sizeof(r));
    snprintf(why, why_len, "--tls-cert %s: not a PEM certificate (%s)", cert, r);
    return GS_EINVAL;
  }
  /* Loading the key checks it against the certificate too. */
  if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;

    gs_tls_reason(r, sizeof(r));
    if (mismatch)
      snprintf(why, why_len, "--tls-key %s does not match the certificate in --tls-cert %s", key,
               cert);
    else
      snprintf(why, why_len, "--tls-key %s: not a PEM private key (%s)", key, r);
    return GS_EINVAL;
  }
  return 0;
}

int gs_tls_use_ca(struct ssl_ctx_st *ctx, const char *flag, const char *ca, char *why,
                  size_t why_len)
{
  char r[128];

  if (!readable(flag, ca, why, why_len))
    return GS_EINVAL;
  if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
    gs_tls_reason(r, sizeof(r));
    snprintf(why, why_len, "%s %s: no PEM certificate in it (%s)", flag, ca, r);
    return GS_EINVAL;
  }
  return 0;
}

/* "2026-11-26 14:10 UTC" */
static void format_time(const ASN1_TIME *t, char *out, size_t len)
{
  struct tm tm;

  if (!ASN1_TIME_to_tm(t, &tm) || !strftime(out, len, "%Y-%m-%d %H:%M UTC", &tm))
    snprintf(out, len, "an unreadable date");
}

bool gs_tls_cert_dates_warn(const struct ssl_ctx_st *ctx, const char *flag, const char *path,
                            int soon_days, char *why, size_t why_len)
{
  X509 *cert = SSL_CTX_get0_certificate(ctx);
  const ASN1_TIME *after, *before;
  char when[64];
  int days = 0, secs = 0;

  if (!cert)
    return false;
  after = X509_get0_notAfter(cert);
  before = X509_get0_notBefore(cert);
  if (X509_cmp_current_time(after) < 0) {
    format_time(after, when, sizeof(when));
    (void)ASN1_TIME_diff(&days, &secs, after, NULL);
    snprintf(why, why_len,
             "%s %s: the certificate expired on %s (%d day(s) ago): TLS clients will refuse it",
             flag, path, when, days);
    return true;
  }
  if (X509_cmp_current_time(before) > 0) {
    format_time(before, when, sizeof(when));
    snprintf(why, why_len,
             "%s %s: the certificate is not valid before %s (is this machine's clock right?): "
             "TLS clients will refuse it until then",
             flag, path, when);
    return true;
  }
  if (ASN1_TIME_diff(&days, &secs, NULL, after) && days < soon_days) {
    format_time(after, when, sizeof(when));
    snprintf(why, why_len, "%s %s: the certificate expires on %s, in %d day(s): renew it", flag,
             path, when, days);
    return true;
  }
  return false;
}
