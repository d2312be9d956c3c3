/* Test harness: runs the real gradsync-coordinator binary as a child
 * process on free ports, and talks to it over real sockets (the framed RPC
 * protocol and HTTP), blocking with deadlines so a bug fails a test
 * instead of hanging it. */
#ifndef GS_TEST_HARNESS_H
#define GS_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "buf.h"
#include "gradsync.pb.h"
#include "pb_array.h"
#include "wire.h"

/* How long a test waits for what is to happen (a reply, a state, an exit):
 * it only decides failure. On an idle machine these waits end in
 * milliseconds; a loaded one can starve a process for seconds. */
#define TH_WAIT_MS 60000

typedef struct th_coord {
  pid_t pid;
  uint16_t rpc_port;
  uint16_t http_port;
} th_coord_t;

/* Starts the coordinator with extra flags (NULL-terminated list) and waits
 * for its "listening" line. Aborts the test on failure. It is killed when
 * the test's process ends, however the test ended. */
void th_coord_start(th_coord_t *c, ...);
/* SIGTERM, then waits up to TH_WAIT_MS; returns the exit status (or -1 if
 * it had to be killed). */
int th_coord_stop(th_coord_t *c);
/* SIGKILL without waiting for a clean exit. */
void th_coord_kill(th_coord_t *c);

typedef struct th_client {
  int fd;
  uint64_t next_id;
  const char *token;
  char session[48]; /* sent in every envelope; th_recv keeps a JoinResponse's */
} th_client_t;

/* Connects to 127.0.0.1:port; aborts the test on failure. */
void th_connect(th_client_t *cl, uint16_t port);
void th_close(th_client_t *cl);
/* Sends a request frame; returns its request id. */
uint64_t th_send(th_client_t *cl, const char *method, uint32_t timeout_ms,
                 const pb_msgdesc_t *fields, const void *msg);
/* Sends raw bytes as they are. */
void th_send_raw(th_client_t *cl, const void *data, size_t len);
/* Receives one frame within timeout_ms. Returns 0, or -1 on timeout or a
 * closed connection. The body is decoded into resp (if status is OK and
 * resp_fields is not NULL). */
int th_recv(th_client_t *cl, gradsync_Envelope *env, const pb_msgdesc_t *resp_fields, void *resp,
            int timeout_ms);
/* Receives one frame within timeout_ms: its envelope and its body as it
 * came (the caller frees it). 0, or -1 on timeout or a closed connection. */
int th_recv_body(th_client_t *cl, gradsync_Envelope *env, gs_buf_t *body, int timeout_ms);

/* A node agent's calls (proto/README.md "Node agents"): appends one for
 * `slot`, acting with `session` ("" or NULL: none), to the batch being
 * built in `batch`; returns its request id. */
uint64_t th_batch_add(th_client_t *cl, gs_buf_t *batch, uint32_t slot, const char *session,
                      const char *method, uint32_t timeout_ms, const pb_msgdesc_t *fields,
                      const void *msg);
/* Sends the calls as one Batch (and frees `batch`); returns its request id. */
uint64_t th_batch_send(th_client_t *cl, gs_buf_t *batch);
/* A Batch reply's body split into its reply envelopes and their bodies
 * (which the caller frees); returns how many (at most max). */
int th_batch_replies(const gs_buf_t *body, gradsync_Envelope *replies, gs_buf_t *bodies, int max);

/* Whether the peer closed the connection within timeout_ms. */
bool th_closed_by_peer(th_client_t *cl, int timeout_ms);
/* One request and its response; returns the gRPC status (msg gets the
 * error text, may be NULL). */
int th_call(th_client_t *cl, const char *method, const pb_msgdesc_t *req_fields, const void *req,
            const pb_msgdesc_t *resp_fields, void *resp, char *msg, size_t msg_len);

/* A JoinRequest with the usual fields filled in. */
gradsync_JoinRequest th_join_request(const char *job, uint32_t world, const char *node,
                                     uint32_t local_rank);

/* Plain HTTP/1.1 request (Connection: close). Returns the status code and
 * puts the body (NUL-terminated) in *body, which the caller frees. */
int th_http(uint16_t port, const char *method, const char *path, const char *headers,
            const char *body, char **resp_body);
/* GETs `path` until its body holds `needle` (the status JSON is compact:
 * "\"joined\":1,"), up to TH_WAIT_MS, else aborts the test; returns that
 * body, which the caller frees. How a test waits for a state. */
char *th_http_wait(uint16_t port, const char *path, const char *needle);
/* GETs `path` until it answers `code` (a job forgotten: 404), up to
 * TH_WAIT_MS, else aborts the test. */
void th_http_wait_code(uint16_t port, const char *path, int code);
/* The value of the /metrics line `name` (with its labels, as printed), or
 * -1 when there is none. */
double th_metric(uint16_t port, const char *name);

#endif
