/* The coordinator client's state, shared by its files: client.c (the
 * connection and one call on it: dial, send, await the reply, redial) and
 * rpc.c (the RPC methods built on gs_client_call). backoff.c paces the
 * redials. Only these files include it. */
#ifndef GS_CLIENT_INTERNAL_H
#define GS_CLIENT_INTERNAL_H

#include <signal.h>
#include <stdint.h>

#include "backoff.h"
#include "buf.h"
#include "client.h"
#include "log.h"

#define GS_CLIENT_MAX_PARAMS (1u << 20) /* as the coordinator accepts */

struct gs_client {
  char host[256];
  uint16_t port;
  char addr[300]; /* "host:port" or "[v6]:port", for messages */
  char *token;
  char *job;
  char session[48]; /* the rank's session, sent in every envelope ("" before the Join) */
  const gs_log_t *log;
  gs_log_t default_log;       /* used when the config names no log */
  int fd;                     /* -1 while disconnected */
  const gs_client_tls_t *tls; /* borrowed; NULL: plaintext */
  struct ssl_st *ssl;         /* the connection's TLS session, with tls */
  uint64_t next_id;
  gs_backoff_t backoff; /* when the next redial may start */
  gs_buf_t rbuf;        /* bytes received and not yet parsed */
  gs_buf_t wbuf;        /* the encoded request frame */
  char err[768];
  volatile sig_atomic_t *interrupt; /* the owner's signal flag, or NULL */
  uint32_t progress_ms;             /* how often a long wait says so */
  struct call *cur;                 /* the call in progress, for the waits */
  char waiting[320];                /* what the next call waits for, for messages */
};

/* Names what the next call waits for ("the other ranks of job J (world
 * 2)"), for its progress lines and an interruption's error; the call
 * clears it. */
void gs__client_waiting(gs_client_t *cl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* How long a parking RPC (Join, Fetch, FetchPackList) asks the coordinator
 * to wait: a little less than our own deadline, so that its explanation
 * arrives before we give up. */
uint32_t gs__client_wait_for(uint64_t timeout_ms);

/* Records the reason for a failure, for gs_client_error. */
void gs__client_set_err(gs_client_t *cl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
