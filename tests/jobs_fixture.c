/* The fixture of the jobs layer's tests (jobs_fixture.h). */
#include "jobs_fixture.h"

fake_t fake;
gs_jobs_t jobs;
gs_peer_t peers[MAX_PEERS];
gs_log_t quiet = {.level = GS_LOG_ERROR, .component = "test_jobs"};
static uint64_t next_request = 1;
uint64_t jobs_now; /* the clock the views are rendered at */

static void fake_reply(gs_responder_t *r, const gs_reply_t *rep)
{
  fake_t *f = GS_CONTAINER_OF(r, fake_t, responder);
  recorded_t *rec;

  ck_assert_uint_lt(f->count, MAX_REPLIES);
  rec = &f->replies[f->count++];
  memset(rec, 0, sizeof(*rec));
  rec->to = rep->to;
  rec->method = rep->method;
  rec->request_id = rep->request_id;
  rec->err = rep->err;
  if (rep->err)
    snprintf(rec->message, sizeof(rec->message), "%s", rep->message);
  else if (rep->body)
    ck_assert_int_eq(gs_buf_append(&rec->body, rep->body, rep->body_len), 0);
  else
    ck_assert_int_eq(gs_wire_encode(&rec->body, rep->fields, rep->msg), 0);
}

static void fake_park(gs_responder_t *r, uint64_t peer)
{
  GS_CONTAINER_OF(r, fake_t, responder)->parked[peer]++;
}

static void fake_unpark(gs_responder_t *r, uint64_t peer)
{
  fake_t *f = GS_CONTAINER_OF(r, fake_t, responder);

  ck_assert_int_gt(f->parked[peer], 0);
  f->parked[peer]--;
}

void setup(void)
{
  gs_jobs_config_t cfg = {
      .heartbeat_interval_ms = 1000,
      .heartbeat_timeout_ms = TIMEOUT_MS,
      .rendezvous_timeout_ms = 300000,
      .job_retention_ms = RETENTION_MS,
      .max_world_size = 1024,
      .max_jobs = 10000,
      .coordinator_id = 0xc0ffee,
      .log = &quiet,
  };

  memset(&fake, 0, sizeof(fake));
  jobs_now = 0;
  fake.responder = (gs_responder_t){.reply = fake_reply, .park = fake_park, .unpark = fake_unpark};
  for (uint32_t i = 0; i < MAX_PEERS; i++) {
    static char names[MAX_PEERS][16];

    snprintf(names[i], sizeof(names[i]), "peer%u", i);
    peers[i] = (gs_peer_t){.id = i + 1, .name = names[i]};
  }
  gs__jobs_init(&jobs, &cfg, &fake.responder);
}

/* Drops the replies recorded so far (a test of many calls). */
void forget_replies(void)
{
  for (uint32_t i = 0; i < fake.count; i++)
    gs_buf_free(&fake.replies[i].body);
  fake.count = 0;
}

void teardown(void)
{
  gs__jobs_free(&jobs);
  forget_replies();
}

/* The session of the member joined on `peer` ("" when none): what that
 * agent would send. */
const char *peer_session(uint32_t peer)
{
  return peers[peer].member ? peers[peer].member->session : "";
}

/* The session of rank `rank` of job `job` ("" when it has none): what the
 * agent holding that rank would send, whatever connection it calls on. */
const char *rank_session(const char *job, uint32_t rank)
{
  gs_job_t *j = gs__jobs_find(&jobs, job);

  return j && j->ranks && rank < j->world_size && j->ranks[rank] ? j->ranks[rank]->session : "";
}

gs_call_t call_from(uint32_t peer, gs_method_t m, uint64_t now)
{
  return (gs_call_t){.peer = &peers[peer],
                     .method = m,
                     .request_id = next_request++,
                     .now_ms = now,
                     .deadline_ms = now + 60000,
                     .session = peer_session(peer)};
}

/* The last reply to `peer`, or NULL. */
const recorded_t *last_reply(uint32_t peer)
{
  for (uint32_t i = fake.count; i > 0; i--) {
    if (fake.replies[i - 1].to == peers[peer].id)
      return &fake.replies[i - 1];
  }
  return NULL;
}

uint32_t replies_to(uint32_t peer)
{
  uint32_t n = 0;

  for (uint32_t i = 0; i < fake.count; i++)
    n += fake.replies[i].to == peers[peer].id;
  return n;
}

void join(uint32_t peer, const gradsync_JoinRequest *req, uint64_t now)
{
  gs_call_t call = call_from(peer, GS_METHOD_JOIN, now);

  gs__jobs_join(&jobs, &call, req);
}

/* A re-registration presenting `session`. */
void rejoin(uint32_t peer, const gradsync_JoinRequest *req, uint64_t now, const char *session)
{
  gs_call_t call = call_from(peer, GS_METHOD_JOIN, now);

  call.session = session;
  gs__jobs_join(&jobs, &call, req);
}

/* The JoinResponse `peer` got last (which must be one). */
gradsync_JoinResponse join_reply(uint32_t peer)
{
  const recorded_t *rec = last_reply(peer);
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  char why[128];

  ck_assert_ptr_nonnull(rec);
  ck_assert_int_eq(rec->method, GS_METHOD_JOIN);
  ck_assert_msg(rec->err == 0, "join of peer %u: %s", peer, rec->message);
  ck_assert_int_eq(gs_wire_decode(rec->body.data, rec->body.len, gradsync_JoinResponse_fields,
                                  &resp, why, sizeof(why)),
                   0);
  return resp;
}

/* Joins peers first..first+n-1 to `job` as ranks 0..n-1 (rank i claims
 * node "n<i/2>", local rank i%2). */
void start_world_on(const char *job, uint32_t n, uint32_t first, uint64_t now)
{
  for (uint32_t i = 0; i < n; i++) {
    char node[16];
    gradsync_JoinRequest req;

    snprintf(node, sizeof(node), "n%u", i / 2);
    req = th_join_request(job, n, node, i % 2);
    join(first + i, &req, now);
  }
  for (uint32_t i = 0; i < n; i++)
    ck_assert_uint_eq(join_reply(first + i).rank, i);
}

void start_world(const char *job, uint32_t n, uint64_t now)
{
  start_world_on(job, n, 0, now);
}

gradsync_HeartbeatResponse heartbeat(uint32_t peer, const char *job, uint64_t generation,
                                     uint32_t rank, uint64_t now, int *err)
{
  return heartbeat_step(peer, job, generation, rank, now / 100, now, err);
}

/* A heartbeat reporting `step`; *err gets the reply's error. */
gradsync_HeartbeatResponse heartbeat_step(uint32_t peer, const char *job, uint64_t generation,
                                          uint32_t rank, uint64_t step, uint64_t now, int *err)
{
  return heartbeat_progress(peer, job, generation, rank, step, now, NULL, err);
}

/* Sends `req` from `peer` (with its rank's session); *err gets the
 * reply's error. */
gradsync_HeartbeatResponse heartbeat_request(uint32_t peer, const gradsync_HeartbeatRequest *req,
                                             uint64_t now, int *err)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;
  gs_call_t call = call_from(peer, GS_METHOD_HEARTBEAT, now);
  const recorded_t *rec;
  char why[128];

  call.session = rank_session(req->job, req->rank);
  gs__jobs_heartbeat(&jobs, &call, req);
  rec = last_reply(peer);
  ck_assert_ptr_nonnull(rec);
  ck_assert_uint_eq(rec->request_id, call.request_id);
  *err = rec->err;
  if (!rec->err)
    ck_assert_int_eq(gs_wire_decode(rec->body.data, rec->body.len,
                                    gradsync_HeartbeatResponse_fields, &resp, why, sizeof(why)),
                     0);
  return resp;
}

/* The same with where the rank is (NULL: no Progress, as older agents). */
gradsync_HeartbeatResponse heartbeat_progress(uint32_t peer, const char *job, uint64_t generation,
                                              uint32_t rank, uint64_t step, uint64_t now,
                                              const gradsync_Progress *progress, int *err)
{
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  snprintf(req.job, sizeof(req.job), "%s", job);
  req.generation = generation;
  req.rank = rank;
  req.step = step;
  req.has_progress = progress != NULL;
  if (progress)
    req.progress = *progress;
  return heartbeat_request(peer, &req, now, err);
}

void leave(uint32_t peer, const char *job, uint64_t generation, uint32_t rank, bool finished,
           uint64_t now)
{
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;
  gs_call_t call = call_from(peer, GS_METHOD_LEAVE, now);

  snprintf(req.job, sizeof(req.job), "%s", job);
  req.generation = generation;
  req.rank = rank;
  req.finished = finished;
  snprintf(req.reason, sizeof(req.reason), "%s", finished ? "" : "out of memory");
  call.session = rank_session(job, rank);
  gs__jobs_leave(&jobs, &call, &req);
  ck_assert_int_eq(last_reply(peer)->err, 0);
}

void set_settings(gradsync_JoinRequest *req, settings_t *st, const char *const *kv)
{
  size_t n = 0;

  for (; kv[2 * n]; n++) {
    ck_assert_uint_lt(n, 8);
    snprintf(st->items[n].name, sizeof(st->items[n].name), "%s", kv[2 * n]);
    snprintf(st->items[n].value, sizeof(st->items[n].value), "%s", kv[2 * n + 1]);
  }
  gs_pb_array_view(&st->a, gradsync_Setting_fields, sizeof(gradsync_Setting), st->items, n);
  req->settings.arg = &st->a;
}

/* The lines `log` wrote to its file, from the start, NUL-terminated into buf. */
const char *log_text(const gs_log_t *log, char *buf, size_t len)
{
  size_t n;

  fflush(log->out);
  rewind(log->out);
  n = fread(buf, 1, len - 1, log->out);
  buf[n] = 0;
  return buf;
}

/* What /status says of `name` (state and reason), and whether /metrics
 * holds `line`. */
void check_views(const char *name, const char *state, const char *reason, const char *line)
{
  static const uint64_t zero[GS_METHOD_COUNT];
  gs_service_info_t svc = {.requests = zero, .errors = zero};
  cJSON *o = gs__job_json(gs__jobs_find(&jobs, name), jobs_now, NULL);
  gs_buf_t text = {0};

  ck_assert_ptr_nonnull(o);
  ck_assert_str_eq(cJSON_GetObjectItem(o, "state")->valuestring, state);
  ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(o, "reason")->valuestring, reason));
  cJSON_Delete(o);
  ck_assert_int_eq(gs__metrics_text(&jobs, &svc, jobs_now, &text), 0);
  ck_assert_int_eq(gs_buf_append(&text, "", 1), 0);
  ck_assert_msg(strstr((const char *)text.data, line), "no '%s' in:\n%s", line,
                (const char *)text.data);
  gs_buf_free(&text);
}
