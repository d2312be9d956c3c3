/* The PEM files of TLS, loaded into an OpenSSL context with errors that
 * name the flag and the file: the coordinator's --tls-cert, --tls-key and
 * --tls-client-ca, the agents' --tls-ca, --tls-cert and --tls-key. */
#ifndef GS_TLS_FILES_H
#define GS_TLS_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include "error.h"

struct ssl_ctx_st;

/* Loads a certificate chain (`cert`, the leaf first) and its private key
 * into `ctx`, checking that they belong together: 0, or GS_EINVAL with
 * why ("--tls-key K does not match the certificate in --tls-cert C"). */
int gs_tls_use_cert_key(struct ssl_ctx_st *ctx, const char *cert, const char *key, char *why,
                        size_t why_len) GS_WARN_UNUSED;
/* Trusts the CA certificates in `ca` (PEM) to verify the peer's; `flag`
 * names the file in why. 0, or GS_EINVAL. */
int gs_tls_use_ca(struct ssl_ctx_st *ctx, const char *flag, const char *ca, char *why,
                  size_t why_len) GS_WARN_UNUSED;
/* Whether the certificate `ctx` uses (from `flag` `path`) is one to warn
 * about: expired, not valid yet, or expiring within `soon_days`; why
 * says which and when. A client refuses such a certificate, so a
 * coordinator that starts with one serves nobody. */
bool gs_tls_cert_dates_warn(const struct ssl_ctx_st *ctx, const char *flag, const char *path,
                            int soon_days, char *why, size_t why_len);
/* OpenSSL's words for its first queued error; empties the queue. */
void gs_tls_reason(char *out, size_t len);

#endif
