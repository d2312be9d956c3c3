/* The jobs layer (jobs_fixture.h): elastic jobs — survivors regroup,
 * members come back, jobs shrink below their minimum or grow, newcomers
 * unlike the job, evicted ranks — and heartbeats that wait for news. */
#include "jobs_fixture.h"

/* An elastic Join (world min..max) from `peer` for node `node`/`local`;
 * with a reason, a survivor's: it holds state at `step`, and carries the
 * session its connection has. */
static void join_elastic(uint32_t peer, const char *job, uint32_t min, uint32_t max,
                         const char *node, uint32_t local, const char *reason, uint64_t step,
                         uint64_t now)
{
  gradsync_JoinRequest req = th_join_request(job, max, node, local);

  req.world_min = min;
  if (reason) {
    req.has_state = true;
    req.state_step = step;
    snprintf(req.reason, sizeof(req.reason), "%s", reason);
  }
  join(peer, &req, now);
}

/* Peers 0..n-1 join `job` elastic min..max, each on a node of its own
 * ("e<i>"), all at `now`. */
static void start_elastic(const char *job, uint32_t n, uint32_t min, uint32_t max, uint64_t now)
{
  for (uint32_t i = 0; i < n; i++) {
    char node[16];

    snprintf(node, sizeof(node), "e%u", i);
    join_elastic(i, job, min, max, node, 0, NULL, 0, now);
  }
}

/* A rank lost in a 2:3 job: the survivors come back with their state, and
 * generation 2 starts as soon as both are back, from the rank at the
 * newest step; nobody else is waited for. */
START_TEST(elastic_survivors_regroup_without_the_lost_rank)
{
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero;
  gs_call_t call;
  gradsync_JoinResponse r0, r1;
  gs_job_t *job;
  gs_buf_t text = {0};
  cJSON *json;
  char *status;

  start_elastic("e", 3, 2, 3, 0);
  for (uint32_t i = 0; i < 3; i++)
    ck_assert_uint_eq(join_reply(i).world_size, 3);
  job = gs__jobs_find(&jobs, "e");
  snprintf(hb.job, sizeof(hb.job), "e");
  hb.generation = 1;
  hb.wait_ms = 1000;
  call = call_from(0, GS_METHOD_HEARTBEAT, 50);
  call.session = rank_session("e", 0);
  gs__jobs_heartbeat(&jobs, &call, &hb); /* rank 0 waits for news */
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  gs__jobs_peer_closed(&jobs, &peers[2], jobs.now_ms);
  ck_assert_int_eq(fake.parked[peers[0].id], 0); /* a lost rank is told at once */
  ck_assert_int_eq(last_reply(0)->method, GS_METHOD_HEARTBEAT);
  ck_assert_str_eq(gs__job_state_name(job->state), "waiting");
  ck_assert_uint_eq(job->regroup_pending, 2);
  join_elastic(0, "e", 2, 3, "e0", 0, "collective failed", 41, 100);
  ck_assert_int_eq(fake.parked[peers[0].id], 1); /* rank 1 is still expected */
  join_elastic(1, "e", 2, 3, "e1", 0, "collective failed", 42, 150);
  r0 = join_reply(0);
  r1 = join_reply(1);
  ck_assert_uint_eq(r0.generation, 2);
  ck_assert_uint_eq(r0.world_size, 2);
  ck_assert_uint_eq(r1.rank, 1);
  ck_assert(r0.resume_state && r1.resume_state);
  ck_assert_uint_eq(r0.state_rank, 1); /* the newest step wins */
  ck_assert_uint_eq(r0.state_step, 42);
  ck_assert_msg(strstr(r0.regroup_reason, "rank 2 (node 'e2', local_rank 0) lost: connection "
                                          "closed"),
                "%s", r0.regroup_reason);
  ck_assert_uint_eq(jobs.stats.regroups, 1);
  ck_assert_uint_eq(jobs.stats.regroup_ms_total, 100); /* from the loss, at 50 */
  static const uint64_t zero[GS_METHOD_COUNT];
  ck_assert_int_eq(
      gs__metrics_text(&jobs, &(gs_service_info_t){.requests = zero, .errors = zero}, 200, &text),
      0);
  ck_assert_int_eq(gs_buf_append(&text, "", 1), 0);
  ck_assert_ptr_nonnull(strstr((char *)text.data, "gradsync_regroups_total 1\n"));
  ck_assert_ptr_nonnull(strstr((char *)text.data, "gradsync_regroup_seconds_total 0.100\n"));
  gs_buf_free(&text);
  json = gs__job_json(job, 200, &(gs_rank_page_t){.limit = GS_RANKS_PAGE_DEFAULT});
  status = cJSON_PrintUnformatted(json);
  cJSON_Delete(json);
  ck_assert_msg(strstr(status, "\"generations\":[{\"generation\":1,\"world_size\":3"), "%s",
                status);
  ck_assert_msg(strstr(status, "{\"generation\":2,\"world_size\":2,\"started_s_ago\":0.05,"
                               "\"duration_s\":0.05,\"start_step\":42,\"lost_s\":0.1,\"end\":\"\","
                               "\"lost\":\"\"}"),
                "%s", status);
  free(status);
}
END_TEST

/* A member that joined as the world broke holds no state yet (its ranks
 * could not connect): its Join without one, carrying its session, counts
 * it back all the same and ends the generation, so the regroup neither
 * refuses it (its connection is bound to a running member) nor waits for
 * its silence; the state comes from a rank that has one. A Join with
 * neither state nor session on that connection is refused. */
START_TEST(elastic_member_without_state_comes_back)
{
  gradsync_JoinRequest req = th_join_request("n", 3, "e1", 0);
  gradsync_JoinResponse r;
  gs_job_t *job;

  start_elastic("n", 3, 2, 3, 0);
  job = gs__jobs_find(&jobs, "n");
  req.world_min = 2;
  snprintf(req.reason, sizeof(req.reason), "connecting to the other ranks failed");
  rejoin(1, &req, 100, "");
  ck_assert_int_eq(last_reply(1)->err, GS_EPRECOND); /* no session: another agent */
  ck_assert_str_eq(gs__job_state_name(job->state), "running");
  join(1, &req, 110); /* its own session, no state */
  ck_assert_int_eq(fake.parked[peers[1].id], 1);
  ck_assert_str_eq(gs__job_state_name(job->state), "waiting");
  ck_assert_msg(strstr(job->abort_reason, "connecting to the other ranks failed"), "%s",
                job->abort_reason);
  ck_assert_uint_eq(job->regroup_pending, 2);
  gs__jobs_peer_closed(&jobs, &peers[2], jobs.now_ms);
  ck_assert_uint_eq(job->regroup_pending, 1);
  join_elastic(0, "n", 2, 3, "e0", 0, "collective failed", 9, 120);
  r = join_reply(1);
  ck_assert_uint_eq(r.generation, 2);
  ck_assert_uint_eq(r.world_size, 2);
  ck_assert(r.resume_state);
  ck_assert_uint_eq(r.state_rank, 0);
  ck_assert_uint_eq(r.state_step, 9);
  ck_assert_uint_eq(join_reply(0).world_size, 2);
}
END_TEST

/* Fewer than world_min come back: the job waits for joiners until the
 * Joins' deadline, then fails saying so. A fixed job still fails at once. */
START_TEST(elastic_job_below_its_minimum_waits_then_fails)
{
  gs_job_t *job;

  start_elastic("e", 3, 2, 3, 0);
  job = gs__jobs_find(&jobs, "e");
  gs__jobs_peer_closed(&jobs, &peers[1], jobs.now_ms);
  gs__jobs_peer_closed(&jobs, &peers[2], jobs.now_ms);
  ck_assert_uint_eq(job->regroup_pending, 1);
  join_elastic(0, "e", 2, 3, "e0", 0, "collective failed", 7, 100);
  gs__jobs_sweep(&jobs, 30000);
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  ck_assert_str_eq(gs__job_state_name(job->state), "waiting");
  gs__jobs_sweep(&jobs, 100 + 60000); /* the survivor's Join deadline */
  ck_assert_int_eq(last_reply(0)->err, GS_ETIMEDOUT);
  ck_assert_str_eq(gs__job_state_name(job->state), "failed");
  start_world("f", 2, 0);
  gs__jobs_peer_closed(&jobs, &peers[1], jobs.now_ms);
  ck_assert_str_eq(gs__job_state_name(gs__jobs_find(&jobs, "f")->state), "failed");
}
END_TEST

/* A first elastic rendezvous starts with world_min once no Join came for
 * the settle time; an agent joining later waits, the heartbeats ask the
 * ranks to regroup, and when they do the world grows at once, without
 * counting an abort. */
START_TEST(elastic_job_grows_at_a_regroup)
{
  gradsync_HeartbeatResponse hb;
  gradsync_JoinResponse r;
  gs_job_t *job;
  int err;

  start_elastic("g", 2, 2, 3, 0);
  gs__jobs_sweep(&jobs, 1000);
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  gs__jobs_sweep(&jobs, 2000);
  ck_assert_uint_eq(join_reply(0).world_size, 2);
  job = gs__jobs_find(&jobs, "g");
  join_elastic(5, "g", 2, 3, "e5", 0, NULL, 0, 3000);
  ck_assert_int_eq(fake.parked[peers[5].id], 1);
  hb = heartbeat(0, "g", 1, 0, 3100, &err);
  ck_assert_int_eq(err, 0);
  ck_assert(!hb.abort);
  ck_assert_uint_eq(hb.directives.regroup_seq, 1);
  join_elastic(8, "g", 2, 3, "e9", 0, NULL, 0, 3150); /* the largest world is reached */
  ck_assert_int_eq(last_reply(8)->err, GS_EPRECOND);
  join_elastic(0, "g", 2, 3, "e0", 0, "regroup", 30, 3200);
  join_elastic(1, "g", 2, 3, "e1", 0, "regroup", 30, 3200);
  r = join_reply(5);
  ck_assert_uint_eq(r.world_size, 3);
  ck_assert_uint_eq(r.rank, 2);
  ck_assert(r.resume_state);
  ck_assert_uint_eq(r.state_rank, 0);
  ck_assert_uint_eq(r.state_step, 30);
  ck_assert_ptr_nonnull(strstr(r.regroup_reason, "regroup after step 30 to admit 1"));
  ck_assert_uint_eq(jobs.stats.generations_aborted, 0);
  ck_assert_uint_eq(job->world_size, 3);
}
END_TEST

/* A new agent whose settings (or model, or device kind) differ from the
 * running generation's is refused alone, at its Join: no regroup is asked
 * for, the ranks train on, and an agent that agrees is admitted after it. */
START_TEST(elastic_newcomer_unlike_the_job_is_refused_alone)
{
  static const char *const base[] = {"batch", "64", "reduce", "mean", NULL};
  static const char *const other[] = {"batch", "32", "reduce", "mean", NULL};
  const char *const *kv[] = {base, base};
  gs_job_t *job;

  for (uint32_t i = 0; i < 2; i++) {
    char node[16];
    settings_t st;
    gradsync_JoinRequest req;

    snprintf(node, sizeof(node), "e%u", i);
    req = th_join_request("u", 4, node, 0);
    req.world_min = 2;
    set_settings(&req, &st, kv[i]);
    join(i, &req, 0);
  }
  gs__jobs_sweep(&jobs, 2000); /* settled: generation 1 of two */
  job = gs__jobs_find(&jobs, "u");
  ck_assert_uint_eq(job->world_size, 2);
  for (uint32_t k = 0; k < 2; k++) {
    settings_t st;
    gradsync_JoinRequest req = th_join_request("u", 4, "e5", k);

    req.world_min = 2;
    set_settings(&req, &st, k == 0 ? other : base);
    join(5 + k, &req, 3000 + k);
  }
  ck_assert_int_eq(last_reply(5)->err, GS_EINVAL);
  ck_assert_msg(strstr(last_reply(5)->message,
                       "job u runs generation 1, and this agent has settings unlike its rank 0's: "
                       "setting 'batch' is '32' vs '64' (this agent: node 'e5', local_rank 0; "
                       "rank 0: node 'e0', local_rank 0)"),
                "%s", last_reply(5)->message);
  ck_assert_int_eq(fake.parked[peers[5].id], 0);
  ck_assert_int_eq(fake.parked[peers[6].id], 1); /* the one that agrees waits */
  ck_assert_uint_eq(job->regroup_seq, 1);        /* for it alone */
  ck_assert_uint_eq(gs__rendezvous_joined(job), 1);
  ck_assert_str_eq(gs__job_state_name(job->state), "running");
}
END_TEST

/* A rank evicted for its silence that wakes up holds no place any more:
 * its Join with state is refused, and it joins again as a new agent. */
START_TEST(evicted_rank_must_join_afresh)
{
  int err;

  start_elastic("s", 3, 2, 3, 0);
  for (uint32_t i = 0; i < 2; i++)
    heartbeat(i, "s", 1, i, TIMEOUT_MS, &err);
  gs__jobs_sweep(&jobs, TIMEOUT_MS + 1); /* rank 2 silent */
  join_elastic(0, "s", 2, 3, "e0", 0, "aborted", 5, TIMEOUT_MS + 10);
  join_elastic(1, "s", 2, 3, "e1", 0, "aborted", 5, TIMEOUT_MS + 10);
  ck_assert_uint_eq(join_reply(1).world_size, 2);
  join_elastic(2, "s", 2, 3, "e2", 0, "woke up", 4, TIMEOUT_MS + 20);
  ck_assert_int_eq(last_reply(2)->err, GS_EABORTED);
  ck_assert_msg(strstr(last_reply(2)->message, "join again as a new agent"), "%s",
                last_reply(2)->message);
  join_elastic(2, "s", 2, 3, "e2", 0, NULL, 0, TIMEOUT_MS + 30);
  ck_assert_int_eq(fake.parked[peers[2].id], 1);
  gs__jobs_peer_closed(&jobs, &peers[2], jobs.now_ms);
  leave(0, "s", 2, 0, true, TIMEOUT_MS + 40);
  leave(1, "s", 2, 1, true, TIMEOUT_MS + 40);
  /* Back once the job finished without it: nothing to join. */
  join_elastic(3, "s", 2, 3, "e2", 0, "woke up", 4, TIMEOUT_MS + 50);
  ck_assert_int_eq(last_reply(3)->err, GS_EPRECOND);
  ck_assert_msg(strstr(last_reply(3)->message, "finished"), "%s", last_reply(3)->message);
}
END_TEST

/* A heartbeat asking to wait is answered when there is news (a directive,
 * the generation's end) or when its wait ends, at most the interval. */
START_TEST(heartbeats_wait_for_news)
{
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;
  gradsync_HeartbeatResponse resp;
  gs_call_t call;
  char why[128];
  uint32_t before;

  start_world("w", 2, 0);
  snprintf(req.job, sizeof(req.job), "w");
  req.generation = 1;
  req.wait_ms = 5000; /* capped at the interval, 1 s */
  for (uint32_t r = 0; r < 2; r++) {
    call = call_from(r, GS_METHOD_HEARTBEAT, 100);
    call.session = rank_session("w", r);
    req.rank = r;
    before = replies_to(r);
    gs__jobs_heartbeat(&jobs, &call, &req);
    ck_assert_uint_eq(replies_to(r), before);
    ck_assert_int_eq(fake.parked[peers[r].id], 1);
  }
  gs__jobs_sweep(&jobs, 1099);
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  gs__jobs_sweep(&jobs, 1100); /* the wait ended: answered with the directives */
  ck_assert_int_eq(fake.parked[peers[0].id], 0);
  ck_assert_int_eq(last_reply(0)->err, 0);
  call = call_from(0, GS_METHOD_HEARTBEAT, 1200);
  call.session = rank_session("w", 0);
  req.rank = 0;
  gs__jobs_heartbeat(&jobs, &call, &req);
  gs__jobs_control(gs__jobs_find(&jobs, "w"),
                   &(gs_job_control_t){.action = GS_JOB_ACTION_CHECKPOINT});
  ck_assert_int_eq(fake.parked[peers[0].id], 0); /* news: answered at once */
  ck_assert_int_eq(gs_wire_decode(last_reply(0)->body.data, last_reply(0)->body.len,
                                  gradsync_HeartbeatResponse_fields, &resp, why, sizeof(why)),
                   0);
  ck_assert_uint_eq(resp.directives.checkpoint_seq, 1);
  ck_assert_float_eq(resp.directives.lr_scale, 1.0f);
  call = call_from(0, GS_METHOD_HEARTBEAT, 1250);
  call.session = rank_session("w", 0);
  gs__jobs_heartbeat(&jobs, &call, &req);
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  /* A new lr scale is news too, and the cached reply is built again. */
  gs__jobs_control(gs__jobs_find(&jobs, "w"),
                   &(gs_job_control_t){.set_lr_scale = true, .lr_scale = 0.25f});
  ck_assert_int_eq(fake.parked[peers[0].id], 0);
  ck_assert_int_eq(gs_wire_decode(last_reply(0)->body.data, last_reply(0)->body.len,
                                  gradsync_HeartbeatResponse_fields, &resp, why, sizeof(why)),
                   0);
  ck_assert_float_eq(resp.directives.lr_scale, 0.25f);
  call = call_from(0, GS_METHOD_HEARTBEAT, 1300);
  call.session = rank_session("w", 0);
  gs__jobs_heartbeat(&jobs, &call, &req);
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  leave(1, "w", 1, 1, false, 1400); /* rank 1 fails: the generation ends */
  /* A rank that left failing is no news to hurry: the others may still be
   * finishing the step's last collective (a non-finite loss, which every
   * rank decides alike). A lost rank is (test elastic_shrink). */
  ck_assert_int_eq(fake.parked[peers[0].id], 1);
  gs__jobs_sweep(&jobs, 2300);
  ck_assert_int_eq(fake.parked[peers[0].id], 0);
  ck_assert_int_eq(gs_wire_decode(last_reply(0)->body.data, last_reply(0)->body.len,
                                  gradsync_HeartbeatResponse_fields, &resp, why, sizeof(why)),
                   0);
  ck_assert(resp.abort);
  ck_assert_ptr_nonnull(strstr(resp.abort_reason, "rank 1 left"));
}
END_TEST

static Suite *jobs_elastic_suite(void)
{
  const gs_test_case_t cases[] = {
      {"heartbeat_long_poll", heartbeats_wait_for_news},
      {"elastic_shrink", elastic_survivors_regroup_without_the_lost_rank},
      {"elastic_stateless_member", elastic_member_without_state_comes_back},
      {"elastic_minimum", elastic_job_below_its_minimum_waits_then_fails},
      {"elastic_grow", elastic_job_grows_at_a_regroup},
      {"elastic_newcomer_unlike", elastic_newcomer_unlike_the_job_is_refused_alone},
      {"elastic_evicted", evicted_rank_must_join_afresh},
  };

  return GS_TEST_SUITE_OF("jobs_elastic", cases, 0, setup, teardown);
}

const gs_test_binary_t gs_test_binary = {.suites = {jobs_elastic_suite}};
