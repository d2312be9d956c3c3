/* The calls the coordinator's socket tests (test_coordinator*.c) share: a
 * coordinator each test starts in `coord`, and the joins, heartbeats and
 * leaves most of them make against it. Assertions fail the calling test. */
#ifndef GS_TEST_COORD_CALLS_H
#define GS_TEST_COORD_CALLS_H

#include <stdbool.h>
#include <stdint.h>

#include "harness.h"

#define OK 0

/* The coordinator the running test started (th_coord_start): each test
 * runs in a process of its own, so each has its own. */
extern th_coord_t coord;

/* Stops the coordinator and checks that it exited cleanly (under ASan
 * that includes no leaks). */
void stop_and_check(void);
/* Joins n clients of `job` (agent i claims node k/4, local_rank k%4 with
 * k = (7i+3) mod n, so arrival order differs from rank order) and returns
 * each client's JoinResponse in resp[i], with its peers in arrs[i]. */
void join_all(th_client_t *cl, gradsync_JoinResponse *resp, bool with_peers, gs_pb_array_t *arrs,
              uint32_t n, const char *job);
/* Every one of the n ranks of generation 1 of `job` leaves, finished, and
 * closes its connection. */
void leave_finished(th_client_t *cl, const gradsync_JoinResponse *resp, uint32_t n,
                    const char *job);
/* Joins n clients of `job` and checks they start generation 1. */
void start_world(th_client_t *cl, uint32_t n, const char *job);
/* One heartbeat of `rank` at `step` (loss 0.5, 1000 samples/s); returns
 * its gRPC status, the reply in *resp. */
int heartbeat(th_client_t *cl, const char *job, uint64_t gen, uint32_t rank, uint64_t step,
              gradsync_HeartbeatResponse *resp);
/* One agent runs job `name` as a world of one on `cl` and leaves it
 * finished, which unties it: its next Join may be for another job. */
void run_one_job(th_client_t *cl, const char *name);

#endif
