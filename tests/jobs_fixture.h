/* The fixture of the jobs layer's tests (test_jobs*.c): no sockets at all;
 * requests go in as calls from fake peers, on a clock the test sets, and a
 * fake responder records every answer, so each test checks what each peer
 * was told. */
#ifndef GS_TEST_JOBS_FIXTURE_H
#define GS_TEST_JOBS_FIXTURE_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "claims.h"
#include "job.h"
#include "jobs.h"
#include "rng.h"
#include "list.h"
#include "status.h"
#include "trace.h"
#include "wire.h"
#include "harness.h"
#include "runner.h"

#define MAX_REPLIES 256
#define MAX_PEERS 16
#define TIMEOUT_MS 10000 /* heartbeat timeout */
#define RETENTION_MS 5000

typedef struct recorded {
  uint64_t to;
  gs_method_t method;
  uint64_t request_id;
  int err;
  char message[512];
  gs_buf_t body; /* the response message, encoded */
} recorded_t;

/* A responder that records replies and counts parked calls per peer. */
typedef struct fake {
  gs_responder_t responder;
  recorded_t replies[MAX_REPLIES];
  uint32_t count;
  int parked[MAX_PEERS + 1];
} fake_t;

/* A Join's settings as the RPC layer hands them over (see jobs.h): `kv`
 * holds name, value pairs; `items` and `a` must outlive the call. */
typedef struct settings {
  gradsync_Setting items[8];
  gs_pb_array_t a;
} settings_t;

/* The fixture's state: the responder, the jobs layer, the peers calls
 * come from, and the clock the views are rendered at. */
extern fake_t fake;
extern gs_jobs_t jobs;
extern gs_peer_t peers[MAX_PEERS];
extern gs_log_t quiet;
extern uint64_t jobs_now;

/* A fresh jobs layer and responder for each case, and its end. */
void setup(void);
void teardown(void);
/* Drops the replies recorded so far (a test of many calls). */
void forget_replies(void);

/* The session of the member joined on `peer` ("" when none): what that
 * agent would send; the session of rank `rank` of job `job` ("" when it
 * has none), whatever connection it calls on. */
const char *peer_session(uint32_t peer);
const char *rank_session(const char *job, uint32_t rank);
gs_call_t call_from(uint32_t peer, gs_method_t m, uint64_t now);
/* The last reply to `peer`, or NULL; how many it got. */
const recorded_t *last_reply(uint32_t peer);
uint32_t replies_to(uint32_t peer);

void join(uint32_t peer, const gradsync_JoinRequest *req, uint64_t now);
/* A re-registration presenting `session`. */
void rejoin(uint32_t peer, const gradsync_JoinRequest *req, uint64_t now, const char *session);
/* The JoinResponse `peer` got last (which must be one). */
gradsync_JoinResponse join_reply(uint32_t peer);
/* Joins peers first..first+n-1 to `job` as ranks 0..n-1 (rank i claims
 * node "n<i/2>", local rank i%2); start_world from peer 0. */
void start_world_on(const char *job, uint32_t n, uint32_t first, uint64_t now);
void start_world(const char *job, uint32_t n, uint64_t now);

/* Heartbeats: plain, reporting `step`, with where the rank is (NULL: no
 * Progress, as older agents), or a whole request; *err gets the reply's
 * error. */
gradsync_HeartbeatResponse heartbeat(uint32_t peer, const char *job, uint64_t generation,
                                     uint32_t rank, uint64_t now, int *err);
gradsync_HeartbeatResponse heartbeat_step(uint32_t peer, const char *job, uint64_t generation,
                                          uint32_t rank, uint64_t step, uint64_t now, int *err);
gradsync_HeartbeatResponse heartbeat_progress(uint32_t peer, const char *job, uint64_t generation,
                                              uint32_t rank, uint64_t step, uint64_t now,
                                              const gradsync_Progress *progress, int *err);
gradsync_HeartbeatResponse heartbeat_request(uint32_t peer, const gradsync_HeartbeatRequest *req,
                                             uint64_t now, int *err);
void leave(uint32_t peer, const char *job, uint64_t generation, uint32_t rank, bool finished,
           uint64_t now);

/* A Join's settings from name, value pairs (settings_t). */
void set_settings(gradsync_JoinRequest *req, settings_t *st, const char *const *kv);
/* The lines `log` wrote to its file, from the start, NUL-terminated into buf. */
const char *log_text(const gs_log_t *log, char *buf, size_t len);
/* What /status says of `name` (state and reason), and whether /metrics
 * holds `line`. */
void check_views(const char *name, const char *state, const char *reason, const char *line);

#endif
