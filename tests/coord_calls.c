/* What the coordinator's socket tests share (coord_calls.h). */
#include "coord_calls.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

th_coord_t coord;

void stop_and_check(void)
{
  ck_assert_int_eq(th_coord_stop(&coord), 0);
}

void join_all(th_client_t *cl, gradsync_JoinResponse *resp, bool with_peers, gs_pb_array_t *arrs,
              uint32_t n, const char *job)
{
  for (uint32_t i = 0; i < n; i++) {
    char node[32];
    /* Arrival order differs from rank order on purpose. */
    uint32_t k = (i * 7 + 3) % n;
    gradsync_JoinRequest req;

    snprintf(node, sizeof(node), "node%02u", k / 4);
    req = th_join_request(job, n, node, k % 4);
    th_connect(&cl[i], coord.rpc_port);
    th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  for (uint32_t i = 0; i < n; i++) {
    gradsync_Envelope env;

    memset(&resp[i], 0, sizeof(resp[i]));
    if (with_peers) {
      gs_pb_array_init(&arrs[i], gradsync_Peer_fields, sizeof(gradsync_Peer), 64);
      gs_pb_array_bind_decode(&resp[i].peers, &arrs[i]);
    }
    ck_assert_int_eq(th_recv(&cl[i], &env, gradsync_JoinResponse_fields, &resp[i], TH_WAIT_MS), 0);
    ck_assert_msg(env.status == OK, "join %u: %s", i, env.message);
  }
}

void leave_finished(th_client_t *cl, const gradsync_JoinResponse *resp, uint32_t n, const char *job)
{
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;

  snprintf(lv.job, sizeof(lv.job), "%s", job);
  lv.generation = 1;
  lv.finished = true;
  for (uint32_t i = 0; i < n; i++) {
    lv.rank = resp[i].rank;
    ck_assert_int_eq(
        th_call(&cl[i], "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0), OK);
    th_close(&cl[i]);
  }
}

void start_world(th_client_t *cl, uint32_t n, const char *job)
{
  gradsync_JoinResponse resp[8] = {0};

  join_all(cl, resp, false, NULL, n, job);
  for (uint32_t i = 0; i < n; i++)
    ck_assert_uint_eq(resp[i].generation, 1);
}

int heartbeat(th_client_t *cl, const char *job, uint64_t gen, uint32_t rank, uint64_t step,
              gradsync_HeartbeatResponse *resp)
{
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero;

  snprintf(hb.job, sizeof(hb.job), "%s", job);
  hb.generation = gen;
  hb.rank = rank;
  hb.step = step;
  hb.loss = 0.5f;
  hb.samples_per_sec = 1000;
  hb.compute_ms = 10 + rank;
  hb.comm_wait_ms = 1;
  memset(resp, 0, sizeof(*resp));
  return th_call(cl, "Heartbeat", gradsync_HeartbeatRequest_fields, &hb,
                 gradsync_HeartbeatResponse_fields, resp, NULL, 0);
}

void run_one_job(th_client_t *cl, const char *name)
{
  gradsync_JoinRequest req = th_join_request(name, 1, "n0", 0);
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;
  char msg[256];

  ck_assert_msg(th_call(cl, "Join", gradsync_JoinRequest_fields, &req, gradsync_JoinResponse_fields,
                        &resp, msg, sizeof(msg)) == OK,
                "join %s: %s", name, msg);
  snprintf(lv.job, sizeof(lv.job), "%s", name);
  lv.generation = resp.generation;
  lv.finished = true;
  ck_assert_int_eq(th_call(cl, "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0),
                   OK);
}