/* TLS on the client's blocking-with-deadlines connection (client_tls.c):
 * OpenSSL on the non-blocking socket, each step saying which poll() event
 * it waits for, so client.c keeps every wait in its own slices (deadline,
 * the owner's signal, progress lines). Only client.c includes it. */
#ifndef GS_CLIENT_TLS_H
#define GS_CLIENT_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "client.h"

struct ssl_st;

/* Each step returns 0 with progress made or *wait set (POLLIN or
 * POLLOUT: wait for it, then call again), GS_ECLOSED when the connection
 * broke (redial), or GS_EPROTO when TLS itself failed (a certificate, a
 * peer that does not speak TLS: final); `why` says how, for "coordinator
 * ADDR: TLS <why>". */

/* A session on the connected socket `fd` that will verify the
 * coordinator's certificate against `host` (its name, or its IP address).
 * Free with gs__client_tls_end. */
int gs__client_tls_start(const gs_client_tls_t *tls, int fd, const char *host,
                         struct ssl_st **out) GS_WARN_UNUSED;
int gs__client_tls_handshake(struct ssl_st *ssl, short *wait, char *why,
                             size_t why_len) GS_WARN_UNUSED;
/* Writes buf[0..len), or reads up to `len` bytes into buf: *done bytes
 * went out or arrived. */
int gs__client_tls_io(struct ssl_st *ssl, bool writing, void *buf, size_t len, size_t *done,
                      short *wait, char *why, size_t why_len) GS_WARN_UNUSED;
void gs__client_tls_end(struct ssl_st *ssl);

#endif
