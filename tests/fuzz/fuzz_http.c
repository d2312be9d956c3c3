/* HTTP routing and the control endpoint's JSON (coordinator/http_routes.c)
 * without a socket: the input is split at its first three newlines into
 * method, target (path?query), Authorization (empty: none) and body, as
 * http_server.c hands a parsed request over. The jobs layer holds job "a"
 * with one running rank, so /jobs/a and its control endpoint have
 * something to act on. Every response must be a well-formed status with a
 * body of the length it claims, and JSON where it says so. */
#include <cJSON.h>
#include <string.h>

#include "fuzz.h"
#include "http_routes.h"
#include "http_status.h"

typedef struct fuzz_http {
  gs_responder_t responder;
  gs_jobs_t jobs;
  gs_http_routes_t routes;
  gs_log_limit_t lines;
  gs_peer_t peer;
  uv_loop_t loop;
} fuzz_http_t;

static void on_reply(gs_responder_t *r, const gs_reply_t *rep)
{
  (void)r;
  (void)rep;
}

static void on_park(gs_responder_t *r, uint64_t peer)
{
  (void)r;
  (void)peer;
}

static void service_info(void *ctx, gs_service_info_t *out)
{
  static const uint64_t zeros[GS_METHOD_COUNT];

  (void)ctx;
  *out =
      (gs_service_info_t){.uptime_ms = 1000, .connections = 1, .requests = zeros, .errors = zeros};
}

/* The next line of the input (up to '\n'), NUL-terminated into `out`. */
static const uint8_t *take_line(const uint8_t *p, const uint8_t *end, char *out, size_t cap)
{
  const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
  size_t n = (size_t)((nl ? nl : end) - p);

  n = n < cap - 1 ? n : cap - 1;
  memcpy(out, p, n);
  out[n] = '\0';
  return nl ? nl + 1 : end;
}

/* Frees a response as the server would; an event stream (GET /events)
 * is told it never opened, as for a connection already ending. */
static void end_response(gs_http_response_t *res)
{
  free(res->body);
  if (res->on_stream_close)
    res->on_stream_close(res->stream_data, NULL);
}

static void check_response(const gs_http_response_t *res)
{
  GS_FUZZ_CHECK(res->status >= 200 && res->status < 600);
  GS_FUZZ_CHECK(res->body != NULL && res->content_type != NULL);
  GS_FUZZ_CHECK(strlen(res->body) == res->body_len);
  if (!strcmp(res->content_type, "application/json")) {
    cJSON *doc = cJSON_ParseWithLength(res->body, res->body_len);

    GS_FUZZ_CHECK(cJSON_IsObject(doc));
    cJSON_Delete(doc);
  }
  if (res->status == 405)
    GS_FUZZ_CHECK(res->allow != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static const gs_log_t quiet = {.level = GS_LOG_ERROR, .component = "fuzz"};
  static fuzz_http_t f;
  static bool loop_ready;
  gs_jobs_config_t cfg = {.heartbeat_interval_ms = 1000,
                          .heartbeat_timeout_ms = 10000,
                          .rendezvous_timeout_ms = 60000,
                          .job_retention_ms = 5000,
                          .max_world_size = 64,
                          .max_jobs = 64,
                          .coordinator_id = 1,
                          .log = &quiet};
  gradsync_JoinRequest join = {.job = "a", .world_size = 1, .node = "n", .device = "cpu"};
  const uint8_t *p = data, *end = data + size;
  char method[16], target[512], auth[256], *query;
  char *body = malloc(size + 1);
  gs_http_response_t res = {0};
  gs_http_request_t req;

  if (!body)
    return 0;
  if (!loop_ready) /* uv_now() is all the routes ask of it: never run */
    GS_FUZZ_CHECK(uv_loop_init(&f.loop) == 0);
  loop_ready = true;
  f.responder = (gs_responder_t){.reply = on_reply, .park = on_park, .unpark = on_park};
  gs__jobs_init(&f.jobs, &cfg, &f.responder);
  f.peer = (gs_peer_t){.id = 1, .name = "peer"};
  gs__jobs_join(
      &f.jobs,
      &(gs_call_t){
          .peer = &f.peer, .method = GS_METHOD_JOIN, .request_id = 1, .deadline_ms = 60000},
      &join);
  gs__log_limit_init(&f.lines, &quiet);
  f.routes = (gs_http_routes_t){.jobs = &f.jobs,
                                .loop = &f.loop,
                                .log = &quiet,
                                .lines = &f.lines,
                                .token = "t0ken",
                                .service_info = service_info};
  p = take_line(p, end, method, sizeof(method));
  p = take_line(p, end, target, sizeof(target));
  p = take_line(p, end, auth, sizeof(auth));
  memcpy(body, p, (size_t)(end - p));
  body[end - p] = '\0';
  query = strchr(target, '?');
  if (query)
    *query++ = '\0';
  req = (gs_http_request_t){.method = method,
                            .path = target,
                            .query = query ? query : "",
                            .authorization = auth[0] ? auth : NULL,
                            .body = body,
                            .body_len = (size_t)(end - p)};
  gs__http_routes_handle(&f.routes, &req, &res);
  check_response(&res);
  /* Twice: GET /status is served from its cache the second time. */
  end_response(&res);
  res = (gs_http_response_t){0};
  gs__http_routes_handle(&f.routes, &req, &res);
  check_response(&res);
  end_response(&res);
  gs__http_status_free(&f.routes);
  gs__jobs_peer_closed(&f.jobs, &f.peer, f.jobs.now_ms);
  gs__jobs_free(&f.jobs);
  free(body);
  return 0;
}
