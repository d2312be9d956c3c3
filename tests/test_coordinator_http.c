/* The real coordinator's HTTP port: /status (summary, ranks, pages,
 * freshness), /metrics, /jobs/NAME pages and the control endpoint, with
 * jobs made over RPC (coord_calls.h). */
#include <cJSON.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_calls.h"
#include "harness.h"
#include "runner.h"

START_TEST(status_json_field_by_field)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  cJSON *doc, *jobs, *job, *ranks, *r1, *summary;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "s");
  for (uint32_t i = 0; i < 2; i++)
    ck_assert_int_eq(heartbeat(&cl[i], "s", 1, resp[i].rank, 42, &hb), OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_ptr_nonnull(doc);
  ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "jobs")->valueint,
                   1);
  jobs = cJSON_GetObjectItem(doc, "jobs");
  ck_assert_int_eq(cJSON_GetArraySize(jobs), 1);
  job = cJSON_GetArrayItem(jobs, 0);
  ck_assert_str_eq(cJSON_GetObjectItem(job, "name")->valuestring, "s");
  ck_assert_str_eq(cJSON_GetObjectItem(job, "state")->valuestring, "running");
  ck_assert_str_eq(cJSON_GetObjectItem(job, "reason")->valuestring, "");
  ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(job, "stalled")));
  ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(job, "stalled_ranks")), 0);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "generation")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "world_size")->valueint, 2);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "bcast_period")->valueint, 0);
  ck_assert(cJSON_IsNull(cJSON_GetObjectItem(job, "pack_list")));
  ck_assert_double_eq(cJSON_GetObjectItem(job, "samples_per_sec")->valuedouble, 2000);
  /* The summary view: counts and ranges, no per-rank list. */
  ck_assert_ptr_null(cJSON_GetObjectItem(job, "ranks"));
  ck_assert_int_eq(cJSON_GetObjectItem(job, "straggler_count")->valueint, 0);
  summary = cJSON_GetObjectItem(job, "rank_summary");
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "running")->valueint, 2);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "lost")->valueint, 0);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_min")->valueint, 42);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_max")->valueint, 42);
  /* Seconds since the heartbeats just sent: small, but a loaded machine
   * can take a while between the two calls. */
  ck_assert_double_lt(cJSON_GetObjectItem(summary, "oldest_heartbeat_s")->valuedouble,
                      TH_WAIT_MS / 1000.0);
  cJSON_Delete(doc);
  free(body);
  /* ?ranks=1 adds every rank. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status?ranks=1", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_ptr_nonnull(doc);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  ranks = cJSON_GetObjectItem(job, "ranks");
  ck_assert_int_eq(cJSON_GetArraySize(ranks), 2);
  r1 = cJSON_GetArrayItem(ranks, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "rank")->valueint, 1);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "node")->valuestring, "node00");
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "local_rank")->valueint, 1);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "device")->valuestring, "cpu");
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "step")->valueint, 42);
  ck_assert_double_eq(cJSON_GetObjectItem(r1, "loss")->valuedouble, 0.5);
  ck_assert_double_eq(cJSON_GetObjectItem(r1, "samples_per_sec")->valuedouble, 1000);
  ck_assert_double_lt(cJSON_GetObjectItem(r1, "last_heartbeat_s")->valuedouble,
                      TH_WAIT_MS / 1000.0);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "state")->valuestring, "running");
  cJSON_Delete(doc);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/nope", NULL, NULL, &body), 404);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/nothing", NULL, NULL, &body), 404);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "DELETE", "/status", NULL, NULL, &body), 405);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/healthz", NULL, NULL, &body), 200);
  ck_assert_str_eq(body, "{\"status\":\"ok\"}");
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

START_TEST(metrics_text)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "m");
  ck_assert_int_eq(heartbeat(&cl[0], "m", 1, resp[0].rank, 7, &hb), OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/metrics", NULL, NULL, &body), 200);
  ck_assert_ptr_nonnull(strstr(body, "# TYPE gradsync_jobs gauge\ngradsync_jobs 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_rpc_requests_total{method=\"Join\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_rpc_requests_total{method=\"Heartbeat\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_world_size{job=\"m\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_running{job=\"m\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_state{job=\"m\",state=\"running\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_stalled{job=\"m\"} 0\n"));
  {
    char line[64];

    snprintf(line, sizeof(line), "gradsync_rank_step{job=\"m\",rank=\"%u\"} 7\n", resp[0].rank);
    ck_assert_ptr_nonnull(strstr(body, line));
  }
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* One HTTP call of a table and what it must answer: the status, pieces
 * its body must hold and pieces it must not. */
struct http_call {
  const char *method, *path, *headers, *body;
  int code;
  const char *has[3], *lacks[2];
};

/* Makes the call of row `k` and checks its answer; a failure names the
 * row and says what came back. */
static void expect_http(const struct http_call *k)
{
  char *body;
  int code = th_http(coord.http_port, k->method, k->path, k->headers, k->body, &body);

  ck_assert_msg(code == k->code, "%s %s [%s] %s: answered %d, not %d: %s", k->method, k->path,
                k->headers ? k->headers : "", k->body ? k->body : "", code, k->code, body);
  for (int i = 0; i < 3 && k->has[i]; i++)
    ck_assert_msg(strstr(body, k->has[i]), "%s %s [%s] %s: no %s in %s", k->method, k->path,
                  k->headers ? k->headers : "", k->body ? k->body : "", k->has[i], body);
  for (int i = 0; i < 2 && k->lacks[i]; i++)
    ck_assert_msg(!strstr(body, k->lacks[i]), "%s %s: %s in %s", k->method, k->path, k->lacks[i],
                  body);
  free(body);
}

/* The control body is read strictly: a field given twice (which copy
 * would win?) or a string holding a NUL (where would it end?) is a 400,
 * and nothing is applied; an escaped backslash before "u0000" is text. */
START_TEST(control_body_is_read_strictly)
{
  th_client_t cl;
  gradsync_JoinResponse resp = {0};
  gradsync_HeartbeatResponse hb;
  const struct {
    const char *body, *error;
  } bad[] = {
      {"{\"action\": \"broadcast\", \"action\": \"stop\"}", "field 'action' is given twice"},
      {"{\"bcast_period\": 5, \"bcast_period\": 7}", "field 'bcast_period' is given twice"},
      {"{\"action\": \"stop\\u0000\"}", "holds a NUL"},
      {"{\"action\\u0000x\": \"stop\"}", "holds a NUL"},
      {"{\"action\": \"stop\\\\u0000\"}", "action must be"},
      {"{\"lr_scale\": 0}", "lr_scale must be a number above 0 and at most 1000"},
      {"{\"lr_scale\": -0.5}", "lr_scale must be"},
      {"{\"lr_scale\": 1001}", "lr_scale must be"},
      {"{\"lr_scale\": 1e-50}", "lr_scale must be"}, /* 0 as a float */
      {"{\"lr_scale\": \"0.5\"}", "lr_scale must be"},
      {"{\"lr_scale\": 0.5, \"lr_scale\": 2}", "field 'lr_scale' is given twice"},
      {"{\"lr\": 0.5}", "unknown field 'lr'"},
      {"{}", "nothing to do"},
      /* Two requests in one body: neither applied, not the first alone. */
      {"{\"action\":\"broadcast\"}{\"action\":\"stop\"}", "with nothing after it"},
      {"{\"action\":\"broadcast\"} x", "with nothing after it"},
  };
  char *body;

  th_coord_start(&coord, NULL);
  th_connect(&cl, coord.rpc_port);
  {
    gradsync_JoinRequest req = th_join_request("c", 1, "n", 0);

    ck_assert_int_eq(th_call(&cl, "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp, NULL, 0),
                     OK);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control", NULL, bad[i].body, &body),
                     400);
    ck_assert_msg(strstr(body, bad[i].error), "%s: %s", bad[i].body, body);
    free(body);
  }
  ck_assert_int_eq(heartbeat(&cl, "c", 1, 0, 1, &hb), OK);
  ck_assert(!hb.directives.stop);
  ck_assert_uint_eq(hb.directives.broadcast_seq, 0);
  ck_assert_float_eq(hb.directives.lr_scale, 1.0f);
  /* A good one is applied, shown in the job's JSON and in /metrics. */
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/c/control", NULL, "{\"lr_scale\": 0.5} \r\n", &body),
      200);
  ck_assert_msg(strstr(body, "\"lr_scale\":0.5"), "%s", body);
  free(body);
  ck_assert_int_eq(heartbeat(&cl, "c", 1, 0, 1, &hb), OK);
  ck_assert_float_eq(hb.directives.lr_scale, 0.5f);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/c", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"lr_scale\":0.5"), "%s", body);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/metrics", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "gradsync_job_lr_scale{job=\"c\"} 0.5\n"), "%s", body);
  free(body);
  th_close(&cl);
}
END_TEST

START_TEST(control_endpoint_needs_token_and_reaches_heartbeats)
{
  static const char ctl[] = "/jobs/c/control", five[] = "{\"bcast_period\": 5}",
                    bearer[] = "Authorization: Bearer tok\r\n";
  /* In order: refused until the token is right; then the good ones apply. */
  static const struct http_call calls[] = {
      {"POST", ctl, NULL, five, .code = 401},
      {"POST", ctl, "Authorization: Bearer nope\r\n", five, .code = 401},
      {"POST", ctl, "Authorization: Basic tok\r\n", five, .code = 401},
      {"POST", ctl, "Authorization: Bearertok\r\n", five, .code = 401},
      /* RFC 7235: the scheme is case-insensitive, and may be followed by several spaces. */
      {"POST", ctl, "Authorization: bearer  tok\r\n", five, .code = 200},
      {"POST", ctl, bearer, "{\"bcast_period\": 5", .code = 400, .has = {"\"error\""}},
      {"POST", ctl, bearer, "{\"bcast_period\": -2}", .code = 400},
      {"POST", ctl, bearer, "{\"action\": \"dance\"}", .code = 400},
      {"GET", ctl, NULL, NULL, .code = 405},
      {"POST", "/jobs/zz/control", bearer, "{\"action\": \"stop\"}", .code = 404},
      {"POST", ctl, bearer, "{\"bcast_period\": 5, \"action\": \"checkpoint\"}", .code = 200},
      {"POST", ctl, bearer, "{\"action\": \"stop\"}", .code = 200},
  };
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  char *body;

  th_coord_start(&coord, "--token", "tok", NULL);
  th_connect(&cl[0], coord.rpc_port);
  cl[0].token = "tok";
  {
    gradsync_JoinRequest req = th_join_request("c", 1, "n", 0);

    ck_assert_int_eq(th_call(&cl[0], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp[0], NULL, 0),
                     OK);
  }
  for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
    expect_http(&calls[i]);
  ck_assert_int_eq(heartbeat(&cl[0], "c", 1, 0, 1, &hb), OK);
  ck_assert_int_eq(hb.directives.bcast_period, 5);
  ck_assert_uint_eq(hb.directives.checkpoint_seq, 1);
  /* A job whose rank 0 said it has no checkpoint dir: a checkpoint request
   * is refused (409, nothing applied); other control still works. */
  th_connect(&cl[1], coord.rpc_port);
  cl[1].token = "tok";
  {
    gradsync_JoinRequest req = th_join_request("nock", 1, "n", 0);
    gradsync_HeartbeatResponse hb2;

    req.checkpoints = gradsync_Checkpoints_CHECKPOINTS_OFF;
    ck_assert_int_eq(th_call(&cl[1], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp[1], NULL, 0),
                     OK);
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/nock/control",
                             "Authorization: Bearer tok\r\n",
                             "{\"bcast_period\": 9, \"action\": \"checkpoint\"}", &body),
                     409);
    ck_assert_msg(strstr(body, "job 'nock' takes no checkpoints"), "%s", body);
    free(body);
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/nock/control",
                             "Authorization: Bearer tok\r\n", "{\"action\": \"broadcast\"}", &body),
                     200);
    free(body);
    ck_assert_int_eq(heartbeat(&cl[1], "nock", 1, 0, 1, &hb2), OK);
    ck_assert_uint_eq(hb2.directives.checkpoint_seq, 0);
    ck_assert_int_ne(hb2.directives.bcast_period, 9);
    ck_assert_uint_eq(hb2.directives.broadcast_seq, 1);
    th_close(&cl[1]);
  }
  ck_assert_uint_eq(hb.directives.broadcast_seq, 0);
  ck_assert(hb.directives.stop);
  ck_assert_uint_ne(hb.coordinator_id, 0);
  th_close(&cl[0]);
  stop_and_check();
}
END_TEST

/* The summary /status is cached between changes: every RPC, control
 * request or connection change must show in the next read. */
START_TEST(status_summary_follows_every_change)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;
  cJSON *doc, *job, *summary;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "c");
  for (uint64_t step = 42; step <= 44; step++) {
    for (uint32_t i = 0; i < 2; i++)
      ck_assert_int_eq(heartbeat(&cl[i], "c", 1, resp[i].rank, step, &hb), OK);
    ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
    doc = cJSON_Parse(body);
    job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
    summary = cJSON_GetObjectItem(job, "rank_summary");
    ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_min")->valueint, (int)step);
    ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_max")->valueint, (int)step);
    cJSON_Delete(doc);
    free(body);
  }
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/c/control", NULL, "{\"bcast_period\": 7}", &body),
      200);
  free(body);
  snprintf(lv.job, sizeof(lv.job), "c");
  lv.generation = 1;
  lv.rank = resp[0].rank;
  lv.finished = true;
  ck_assert_int_eq(th_call(&cl[0], "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0),
                   OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  summary = cJSON_GetObjectItem(job, "rank_summary");
  ck_assert_int_eq(cJSON_GetObjectItem(job, "bcast_period")->valueint, 7);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "left")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "running")->valueint, 1);
  ck_assert_int_eq(
      cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "connections")->valueint, 2);
  cJSON_Delete(doc);
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* /jobs/NAME lists a page of ranks (1,000 unless asked): ranks_from and
 * ranks_limit choose it, and ranks_page.next is the next page's path. */
START_TEST(job_ranks_are_paged)
{
  static const struct http_call pages[] = {
      {"GET", "/jobs/pg?ranks_from=1&ranks_limit=2", .code = 200,
       .has = {"\"ranks\":[{\"rank\":1,", "{\"rank\":2,",
               "\"ranks_page\":{\"from\":1,\"limit\":2,\"listed\":2,"
               "\"next\":\"/jobs/pg?ranks_from=3&ranks_limit=2\"}"},
       .lacks = {"{\"rank\":3,", "{\"rank\":0,"}},
      {"GET", "/jobs/pg?ranks_from=3&ranks_limit=2", .code = 200,
       .has = {"\"listed\":2,\"next\":null"}},
      {"GET", "/jobs/pg?ranks_from=9", .code = 200,
       .has = {"\"ranks\":[],", "\"listed\":0,\"next\":null"}},
      {"GET", "/jobs/pg", .code = 200,
       .has = {"\"ranks_page\":{\"from\":0,\"limit\":1000,\"listed\":5,"}},
      /* The job without its ranks: no next page, which would be this one. */
      {"GET", "/jobs/pg?ranks_limit=0", .code = 200,
       .has = {"\"ranks\":[],", "\"listed\":0,\"next\":null"}},
      {"GET", "/jobs/pg?ranks_limit=10001", .code = 400, .has = {"ranks_limit must be"}},
  };
  th_client_t cl[5];
  gradsync_JoinResponse resp[5];

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 5, "pg");
  for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++)
    expect_http(&pages[i]);
  for (int i = 0; i < 5; i++)
    th_close(&cl[i]);
  stop_and_check();
}
END_TEST

/* The next page's path of a /status document ("" on the last page). */
static void next_page(const cJSON *doc, char *path, size_t len)
{
  const cJSON *next = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "page"), "next");

  ck_assert(cJSON_IsString(next) || cJSON_IsNull(next));
  snprintf(path, len, "%s", cJSON_IsString(next) ? next->valuestring : "");
}

/* GET /status is a page of jobs, newest first: 100 unless ?limit=N (at
 * most 1000), with the total and the path of the next page, which holds
 * every job once even when jobs start while a client pages (issue 23,
 * item 7: 50,000 jobs made /status 27.7 MB and 1.4 s). */
START_TEST(status_is_paged)
{
  enum { JOBS = 105 };
  static const char *const refused[] = {"/status?limit=0", "/status?limit=1001", "/status?limit=5x",
                                        "/status?after=x", "/status?after=0"};
  th_client_t cl;
  bool seen[JOBS + 1] = {false};
  uint32_t pages = 0, shown = 0, newest = JOBS;
  char name[16], path[128], *body;
  cJSON *doc, *jobs, *page, *job;

  th_coord_start(&coord, NULL);
  th_connect(&cl, coord.rpc_port);
  for (uint32_t i = 0; i < JOBS; i++) {
    snprintf(name, sizeof(name), "p%03u", i);
    run_one_job(&cl, name);
  }
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  jobs = cJSON_GetObjectItem(doc, "jobs");
  page = cJSON_GetObjectItem(doc, "page");
  ck_assert_int_eq(cJSON_GetArraySize(jobs), 100);
  ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(jobs, 0), "name")->valuestring, "p104");
  ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(jobs, 99), "name")->valuestring, "p005");
  ck_assert_int_eq(cJSON_GetObjectItem(page, "total")->valueint, JOBS);
  ck_assert_int_eq(cJSON_GetObjectItem(page, "limit")->valueint, 100);
  ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "jobs")->valueint,
                   JOBS);
  next_page(doc, path, sizeof(path));
  ck_assert_str_ne(path, "");
  cJSON_Delete(doc);
  free(body);
  /* Pages of 7, a job started after the first: every job once, in order. */
  for (snprintf(path, sizeof(path), "/status?limit=7"); path[0]; pages++) {
    ck_assert_int_eq(th_http(coord.http_port, "GET", path, NULL, NULL, &body), 200);
    doc = cJSON_Parse(body);
    ck_assert_ptr_nonnull(doc);
    ck_assert_int_le(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "jobs")), 7);
    cJSON_ArrayForEach(job, cJSON_GetObjectItem(doc, "jobs"))
    {
      uint32_t i = (uint32_t)atoi(cJSON_GetObjectItem(job, "name")->valuestring + 1);

      ck_assert_uint_lt(i, newest);
      ck_assert(!seen[i]);
      seen[i] = true;
      newest = i;
      shown++;
    }
    next_page(doc, path, sizeof(path));
    cJSON_Delete(doc);
    free(body);
    if (pages == 0)
      run_one_job(&cl, "p105");
  }
  ck_assert_uint_eq(shown, JOBS);
  ck_assert_uint_eq(pages, JOBS / 7);
  /* The per-rank view pages the same way, and its next page keeps it. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status?ranks=1&limit=1", NULL, NULL, &body),
                   200);
  doc = cJSON_Parse(body);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(job, "name")->valuestring, "p105");
  ck_assert_ptr_nonnull(cJSON_GetObjectItem(job, "ranks"));
  next_page(doc, path, sizeof(path));
  ck_assert_ptr_nonnull(strstr(path, "ranks=1"));
  cJSON_Delete(doc);
  free(body);
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    ck_assert_msg(th_http(coord.http_port, "GET", refused[i], NULL, NULL, &body) == 400, "%s: %s",
                  refused[i], body);
    free(body);
  }
  th_close(&cl);
  stop_and_check();
}
END_TEST

static Suite *coordinator_http_suite(void)
{
  const gs_test_case_t cases[] = {
      {"status", status_json_field_by_field},
      {"metrics", metrics_text},
      {"control", control_endpoint_needs_token_and_reaches_heartbeats},
      {"control_strict", control_body_is_read_strictly},
      {"status_fresh", status_summary_follows_every_change},
      {"job_ranks_paged", job_ranks_are_paged},
      {"status_pages", status_is_paged},
  };

  return GS_TEST_SUITE_OF("coordinator_http", cases, 60, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {coordinator_http_suite}};
