/* The jobs layer (jobs_fixture.h): what a held-up or slow job waits on —
 * stalls, the ranks held up and why, step waits, stragglers, slow links. */
#include "jobs_fixture.h"

/* Whether /status shows `name` stalled, with stalled_since_s and the
 * lagging ranks in `ranks` (a JSON array, as printed). */
static void check_stall(const char *name, bool stalled, double since_s, const char *ranks)
{
  cJSON *o = gs__job_json(gs__jobs_find(&jobs, name), jobs_now, NULL);
  char *printed;

  ck_assert_ptr_nonnull(o);
  ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "stalled")) == stalled);
  ck_assert_double_eq_tol(cJSON_GetObjectItem(o, "stalled_since_s")->valuedouble, since_s, 1e-9);
  printed = cJSON_PrintUnformatted(cJSON_GetObjectItem(o, "stalled_ranks"));
  ck_assert_str_eq(printed, ranks);
  free(printed);
  cJSON_Delete(o);
}

/* Heartbeats for ranks 0..2 of "s" every 5 s from `from` to `to`: ranks 0
 * and 1 at `step`, rank 2 at `lag`. */
static void beat(uint64_t from, uint64_t to, uint64_t step, uint64_t lag)
{
  int err;

  for (uint64_t t = from; t <= to; t += 5000) {
    for (uint32_t r = 0; r < 3; r++) {
      heartbeat_step(r, "s", 1, r, r == 2 ? lag : step, t, &err);
      ck_assert_int_eq(err, 0);
    }
    gs__jobs_sweep(&jobs, t);
  }
}

/* A running job whose highest step has not advanced for --stall-timeout
 * while its heartbeats are fresh is stalled, in /status (since when, and
 * the ranks at the lowest step) and /metrics; an advancing step clears
 * it; a stall timeout of 0 never flags one. */
START_TEST(job_whose_step_stops_is_stalled)
{
  jobs.cfg.stall_timeout_ms = 60000;
  start_world("s", 3, 0);
  beat(5000, 60000, 10, 7); /* step 10 reached at 5 s */
  jobs_now = 64999;
  beat(64999, 64999, 10, 7);
  check_stall("s", false, 0, "[]");
  jobs_now = 65000;
  beat(65000, 65000, 10, 7);
  check_stall("s", true, 60, "[2]");
  check_views("s", "stalled", "step 10 has not advanced for 60 s",
              "gradsync_job_stalled{job=\"s\"} 1");
  jobs_now = 70000;
  beat(70000, 70000, 11, 11);
  check_stall("s", false, 0, "[]");
  check_views("s", "running", "", "gradsync_job_stalled{job=\"s\"} 0");
  jobs.cfg.stall_timeout_ms = 0;
  beat(75000, 200000, 11, 11);
  check_stall("s", false, 0, "[]");
}
END_TEST

/* Rank r of "h" (a 3-rank job) says it has been in `phase` (pack 1) for
 * `phase_ms` at `now`, having done `done` collectives; the reply. */
static gradsync_HeartbeatResponse in_phase(uint32_t r, gradsync_Phase phase, uint32_t phase_ms,
                                           uint64_t done, float send_wait, uint64_t now)
{
  gradsync_Progress p = {.phase = phase,
                         .pack = 1,
                         .phase_ms = phase_ms,
                         .collectives_done = done,
                         .send_wait = send_wait};
  gradsync_HeartbeatResponse resp;
  int err;

  jobs_now = now;
  resp = heartbeat_progress(r, "h", 1, r, 50, now, &p, &err);
  ck_assert_int_eq(err, 0);
  return resp;
}

/* waiting_on in /jobs/NAME: its kind and ranks, printed ("null" when none). */
static void check_waiting(const char *kind, const char *ranks, const char *state)
{
  cJSON *o = gs__job_json(gs__jobs_find(&jobs, "h"), jobs_now,
                          &(gs_rank_page_t){.limit = GS_RANKS_PAGE_DEFAULT});
  cJSON *w = cJSON_GetObjectItem(o, "waiting_on");
  char *printed = cJSON_PrintUnformatted(cJSON_GetObjectItem(w, "ranks"));

  ck_assert_msg(!strcmp(cJSON_GetObjectItem(o, "state")->valuestring, state),
                "state %s, not %s (waiting_on: %s)", cJSON_GetObjectItem(o, "state")->valuestring,
                state, kind ? kind : "null");
  if (!kind) {
    ck_assert(cJSON_IsNull(w));
  } else {
    ck_assert_str_eq(cJSON_GetObjectItem(w, "kind")->valuestring, kind);
    ck_assert_str_eq(printed, ranks);
  }
  free(printed);
  cJSON_Delete(o);
}

/* Ranks 0 and 1 wait in the allreduce of pack 1 while rank 2 is in its
 * data phase: not named before the waiters have waited GS_WAITING_MIN_MS,
 * named at the first look after it (looks are 250 ms apart) (the job stalled, the reason in /status
 * and in heartbeat replies); rank 2 reaching the allreduce clears it. Silence names a rank that
 * says nothing (SIGSTOP), ahead of one in another phase. */
START_TEST(held_up_ranks_are_named)
{
  gradsync_HeartbeatResponse resp;

  start_world("h", 3, 0);
  in_phase(2, gradsync_Phase_PHASE_DATA, 0, 4, 0, 10000);
  in_phase(0, gradsync_Phase_PHASE_ALLREDUCE, 0, 4, 0, 10000);
  in_phase(1, gradsync_Phase_PHASE_ALLREDUCE, 100, 4, 0, 10000);
  gs__jobs_sweep(&jobs, 10150); /* rank 1 has waited 250 ms */
  check_waiting(NULL, NULL, "running");
  in_phase(1, gradsync_Phase_PHASE_ALLREDUCE, 499, 4, 0, 10399);
  gs__jobs_sweep(&jobs, 10400); /* it said 499 ms: what a heartbeat said, not a guess */
  check_waiting(NULL, NULL, "running");
  in_phase(1, gradsync_Phase_PHASE_ALLREDUCE, 600, 4, 0, 10500);
  in_phase(0, gradsync_Phase_PHASE_ALLREDUCE, 500, 4, 0, 10500);
  gs__jobs_sweep(&jobs, 10650);
  check_waiting("phase", "[2]", "stalled");
  resp = in_phase(0, gradsync_Phase_PHASE_ALLREDUCE, 700, 4, 0, 10700);
  ck_assert_ptr_nonnull(strstr(resp.waiting_on, "rank 2 in data for 0.7 s at step 50; 2 rank(s) "
                                                "wait in the allreduce of pack 1 for 0.8 s"));
  /* Rank 2 done with the collective they wait in: its word is news they
   * have not heard yet, not a rank to name. */
  in_phase(2, gradsync_Phase_PHASE_DATA, 0, 5, 0, 10800);
  gs__jobs_sweep(&jobs, 10900);
  check_waiting(NULL, NULL, "running");
  resp = in_phase(0, gradsync_Phase_PHASE_DATA, 0, 5, 0, 11000);
  ck_assert_str_eq(resp.waiting_on, "");

  /* Rank 2 goes silent in an allreduce; the others wait in the next one. */
  in_phase(2, gradsync_Phase_PHASE_ALLREDUCE, 0, 5, 0, 20000);
  gs__jobs_sweep(&jobs, 20000); /* a longer gap would be the coordinator's own stall */
  in_phase(0, gradsync_Phase_PHASE_ALLREDUCE, 0, 5, 0, 20100);
  in_phase(1, gradsync_Phase_PHASE_ALLREDUCE, 0, 5, 0, 20100);
  in_phase(0, gradsync_Phase_PHASE_ALLREDUCE, 1150, 5, 0, 21250);
  in_phase(1, gradsync_Phase_PHASE_ALLREDUCE, 1150, 5, 0, 21250);
  gs__jobs_sweep(&jobs, 21250); /* held, but rank 2 not silent yet: nobody named */
  check_waiting(NULL, NULL, "running");
  gs__jobs_sweep(&jobs, 21501);
  check_waiting("no_heartbeat", "[2]", "stalled");
}
END_TEST

/* A rank's blocking waits in its last step (its Progress) reach
 * /jobs/NAME's ranks as it reported them. */
START_TEST(step_waits_per_rank)
{
  gradsync_Progress p = {.phase = gradsync_Phase_PHASE_DATA, .device_waits = 1, .comm_waits = 2};
  cJSON *o, *r1;
  int err;

  start_world("h", 3, 0);
  jobs_now = 10000;
  heartbeat_progress(1, "h", 1, 1, 50, jobs_now, &p, &err);
  ck_assert_int_eq(err, 0);
  o = gs__job_json(gs__jobs_find(&jobs, "h"), jobs_now,
                   &(gs_rank_page_t){.limit = GS_RANKS_PAGE_DEFAULT});
  r1 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "ranks"), 1);
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "rank")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "device_waits")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "comm_waits")->valueint, 2);
  cJSON_Delete(o);
}
END_TEST

/* The coordinator's own --stall-timeout line names what holds the job up,
 * as the views and the agents' timeout errors do. */
START_TEST(stall_timeout_line_names_the_held_rank)
{
  gs_log_t log = {.level = GS_LOG_INFO, .component = "test_jobs", .out = tmpfile()};
  static char text[16384];

  ck_assert_ptr_nonnull(log.out);
  jobs.cfg.log = &log;
  jobs.cfg.stall_timeout_ms = 2000;
  start_world("h", 3, 0);
  for (uint32_t r = 0; r < 3; r++)
    in_phase(r, r == 2 ? gradsync_Phase_PHASE_DATA : gradsync_Phase_PHASE_ALLREDUCE, 0, 4, 0,
             10000);
  for (uint64_t t = 10500; t <= 13000; t += 500) {
    for (uint32_t r = 0; r < 3; r++)
      in_phase(r, r == 2 ? gradsync_Phase_PHASE_DATA : gradsync_Phase_PHASE_ALLREDUCE,
               (uint32_t)(t - 10000), 4, 0, t);
    gs__jobs_sweep(&jobs, t);
  }
  log_text(&log, text, sizeof(text));
  ck_assert_msg(strstr(text, "while heartbeats are fresh; held up: rank 2 in data for "), "%s",
                text);
  jobs.cfg.log = &quiet;
  jobs.cfg.stall_timeout_ms = 0;
  fclose(log.out);
}
END_TEST

/* A rank whose heartbeats cross a slow link (800 ms round trips) is silent
 * only an interval and a half plus that round trip after its last one:
 * its next heartbeat is on its way. */
START_TEST(silence_allows_for_a_slow_round_trip)
{
  gradsync_HeartbeatRequest req = {
      .generation = 1,
      .rank = 2,
      .step = 50,
      .has_progress = true,
      .progress = {.phase = gradsync_Phase_PHASE_ALLREDUCE, .pack = 1, .collectives_done = 5}};
  int err;

  start_world("h", 3, 0);
  snprintf(req.job, sizeof(req.job), "h");
  jobs_now = 19000;
  heartbeat_request(2, &req, 19000, &err);
  req.clock_sent_us = 18600000;    /* that beat left 400 ms before it arrived, */
  req.clock_replied_us = 19400000; /* and its reply took 400 ms to come back */
  jobs_now = 20000;
  heartbeat_request(2, &req, 20000, &err);
  ck_assert_int_eq(err, 0);
  for (uint32_t r = 0; r < 2; r++) {
    in_phase(r, gradsync_Phase_PHASE_ALLREDUCE, 0, 5, 0, 20100);
    in_phase(r, gradsync_Phase_PHASE_ALLREDUCE, 1150, 5, 0, 21250);
  }
  gs__jobs_sweep(&jobs, 21501); /* 1.5 s: silent on a fast network, not behind 800 ms trips */
  check_waiting(NULL, NULL, "running");
  for (uint32_t r = 0; r < 2; r++)
    in_phase(r, gradsync_Phase_PHASE_ALLREDUCE, 2200, 5, 0, 22300);
  gs__jobs_sweep(&jobs, 22301);
  check_waiting("no_heartbeat", "[2]", "stalled");
}
END_TEST

/* Every rank inside one collective and none behind: the transport is named
 * only after ten times the threshold; a rank whose sends wait there (most
 * of the time, twice any other's) owns the slow link, named from one
 * heartbeat when its share jumps high, not when it jumps halfway; two such
 * ranks are both named; without a clear gap, or with every rank's sends
 * waiting, none is. */
START_TEST(collective_without_a_culprit_names_the_transport_or_a_link)
{
  start_world("h", 3, 0);
  for (uint32_t r = 0; r < 3; r++)
    in_phase(r, gradsync_Phase_PHASE_SYNC, 4000, 0, 0.1f, 10000);
  gs__jobs_sweep(&jobs, 10000);
  check_waiting(NULL, NULL, "running");
  for (uint32_t r = 0; r < 3; r++)
    in_phase(r, gradsync_Phase_PHASE_SYNC, 5000, 0, 0.1f, 11000);
  gs__jobs_sweep(&jobs, 11000);
  check_waiting("transport", "[]", "stalled");
  in_phase(1, gradsync_Phase_PHASE_SYNC, 5300, 0, 0.6f, 11300); /* 0.3 x 0.1 + 0.7 x 0.6 */
  gs__jobs_sweep(&jobs, 11300);
  check_waiting("transport", "[]", "stalled");
  in_phase(1, gradsync_Phase_PHASE_SYNC, 5600, 0, 0.9f, 11600); /* 0.3 x 0.45 + 0.7 x 0.9 */
  gs__jobs_sweep(&jobs, 11600);
  check_waiting("slow_link", "[1]", "stalled");
  in_phase(2, gradsync_Phase_PHASE_SYNC, 5900, 0, 0.7f, 11900); /* 0.52 */
  gs__jobs_sweep(&jobs, 11900);
  check_waiting("slow_link", "[1,2]", "stalled");
  in_phase(0, gradsync_Phase_PHASE_SYNC, 6200, 0, 0.4f, 12200); /* 0.52 < 2 x 0.31 */
  gs__jobs_sweep(&jobs, 12200);
  check_waiting("transport", "[]", "stalled");
  in_phase(0, gradsync_Phase_PHASE_SYNC, 6500, 0, 0.9f, 12500); /* all three */
  gs__jobs_sweep(&jobs, 12500);
  check_waiting("transport", "[]", "stalled");
}
END_TEST

/* Rank r of "h" (3 ranks) reports a step of compute_ms and comm_ms, its
 * sends waiting `send_wait` of the time, in an allreduce for 10 ms. */
static void timed_step(uint32_t r, float compute_ms, float comm_ms, float send_wait, uint64_t now)
{
  gradsync_HeartbeatRequest req = {.generation = 1,
                                   .rank = r,
                                   .step = 50,
                                   .compute_ms = compute_ms,
                                   .comm_wait_ms = comm_ms,
                                   .has_progress = true,
                                   .progress = {.phase = gradsync_Phase_PHASE_ALLREDUCE,
                                                .phase_ms = 10,
                                                .send_wait = send_wait}};
  int err;

  snprintf(req.job, sizeof(req.job), "h");
  jobs_now = now;
  heartbeat_request(r, &req, now, &err);
  ck_assert_int_eq(err, 0);
}

/* Nothing held, what slows every step: a rank computing twice the median
 * is a straggler; the same extra millisecond in a step that waits a
 * second on a slow link is jitter, and the link is named. */
START_TEST(straggler_named_only_when_it_costs_the_step)
{
  start_world("h", 3, 0);
  for (uint32_t r = 0; r < 3; r++)
    timed_step(r, r == 2 ? 2.0f : 1.0f, r == 2 ? 0.2f : 1.2f, 0.01f, 1000);
  check_waiting("straggler", "[2]", "running");
  for (uint32_t t = 1; t <= 20; t++) /* the step times are smoothed: many steps */
    for (uint32_t r = 0; r < 3; r++)
      timed_step(r, r == 2 ? 2.0f : 1.0f, 1000, r == 0 ? 0.9f : 0.01f, 1000 + t * 1000);
  check_waiting("slow_link", "[0]", "running");
}
END_TEST

static Suite *jobs_waiting_suite(void)
{
  const gs_test_case_t cases[] = {
      {"stalled", job_whose_step_stops_is_stalled},
      {"held_up", held_up_ranks_are_named},
      {"step_waits", step_waits_per_rank},
      {"held_transport", collective_without_a_culprit_names_the_transport_or_a_link},
      {"held_slow_beats", silence_allows_for_a_slow_round_trip},
      {"stall_line_held", stall_timeout_line_names_the_held_rank},
      {"straggler_cost", straggler_named_only_when_it_costs_the_step},
  };

  return GS_TEST_SUITE_OF("jobs_waiting", cases, 0, setup, teardown);
}

const gs_test_binary_t gs_test_binary = {.suites = {jobs_waiting_suite}};
