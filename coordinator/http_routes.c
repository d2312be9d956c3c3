/* The HTTP API: /healthz, /status, /jobs/NAME, /metrics,
 * POST /jobs/NAME/control, the dashboard's files and its event streams
 * (/events). Handlers run on the loop and never block. */
#include <cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "control_body.h"
#include "http_routes.h"
#include "parse.h"
#include "trace.h"
#include "ui_assets.h"

#define JSON "application/json"
#define EVENT_STREAM "text/event-stream"

/* The dashboard's files: never cached stale, never framed, and the page
 * may load and fetch only from this origin (its script and style are
 * files of their own, so no inline code is allowed either). */
#define UI_HEADERS                                                                                 \
  "Cache-Control: no-cache\r\n"                                                                    \
  "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "             \
  "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "                 \
  "form-action 'none'; frame-ancestors 'none'\r\n"                                                 \
  "X-Content-Type-Options: nosniff\r\n"                                                            \
  "Referrer-Policy: no-referrer\r\n"
#define EVENT_HEADERS "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"

/* One open event stream: the /status summary (job "") or one job's JSON. */
typedef struct gs_http_sub {
  gs_list_t node; /* on gs_http_routes_t.subs while open */
  gs_http_routes_t *r;
  gs_http_stream_t *stream;
  char job[128];
} gs_http_sub_t;

static void respond(gs_http_response_t *res, int status, const char *type, char *body)
{
  res->status = status;
  res->content_type = type;
  res->body = body;
  res->body_len = body ? strlen(body) : 0;
}

static void respond_json(gs_http_response_t *res, int status, cJSON *doc)
{
  char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;

  cJSON_Delete(doc);
  if (!text) {
    respond(res, 500, JSON, strdup("{\"error\":\"out of memory\"}"));
    return;
  }
  respond(res, status, JSON, text);
}

static void respond_error(gs_http_response_t *res, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void respond_error(gs_http_response_t *res, int status, const char *fmt, ...)
{
  cJSON *doc = cJSON_CreateObject();
  char msg[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cJSON_AddStringToObject(doc, "error", msg);
  respond_json(res, status, doc);
}

/* What under /jobs/NAME a path names. */
typedef enum job_part { JOB_VIEW, JOB_CONTROL, JOB_TRACE } job_part_t;

/* Splits "/jobs/NAME", "/jobs/NAME/control" or "/jobs/NAME/trace"; false
 * for other paths. */
static bool job_path(const char *path, char *name, size_t len, job_part_t *part)
{
  const char *p = path + strlen("/jobs/"), *slash;
  size_t n;

  if (strncmp(path, "/jobs/", 6) != 0)
    return false;
  slash = strchr(p, '/');
  n = slash ? (size_t)(slash - p) : strlen(p);
  if (n == 0 || n >= len)
    return false;
  if (!slash)
    *part = JOB_VIEW;
  else if (!strcmp(slash, "/control"))
    *part = JOB_CONTROL;
  else if (!strcmp(slash, "/trace"))
    *part = JOB_TRACE;
  else
    return false;
  memcpy(name, p, n);
  name[n] = '\0';
  return true;
}

/* The token of "Bearer TOKEN" (the scheme in any case, then one or more
 * spaces, as RFC 7235 has it), or NULL. */
static const char *bearer(const char *auth)
{
  static const char scheme[] = "Bearer";

  if (!auth || strncasecmp(auth, scheme, sizeof(scheme) - 1) != 0 ||
      auth[sizeof(scheme) - 1] != ' ')
    return NULL;
  auth += sizeof(scheme) - 1;
  while (*auth == ' ')
    auth++;
  return auth;
}

/* Whether the request may go on: a request that changes something, or
 * shows ranks' addresses (`reveals`), or any with --http-auth read, needs
 * the coordinator's token, or the token of `job` (NULL: no job's will
 * do). Answers 401 and logs (limited per client) when it may not. */
static bool authorized(gs_http_routes_t *r, const gs_http_request_t *req, const char *job,
                       bool changes, bool reveals, gs_http_response_t *res)
{
  const char *given;

  if (!r->token[0] || r->auth == GS_HTTP_AUTH_NONE ||
      (!changes && !reveals && r->auth != GS_HTTP_AUTH_READ))
    return true;
  given = bearer(req->authorization);
  if (given && (gs__token_ok(r->token, given) || (job && gs__job_token_ok(r->token, job, given))))
    return true;
  gs__log_limit_line(r->lines, uv_now(r->loop), req->peer, GS_LOG_KIND_HTTP_TOKEN,
                     "%s %s with a %s token", req->method, req->path,
                     req->authorization ? "wrong" : "missing");
  respond_error(res, 401, "%s needs 'Authorization: Bearer TOKEN' (the coordinator's%s)", req->path,
                job ? " or the job's" : "");
  return false;
}

/* Applies a control request (control_body.h) and answers with what the
 * job's directives now are. */
static void control(gs_http_routes_t *r, gs_job_t *job, const gs_http_request_t *req,
                    gs_http_response_t *res)
{
  static const char *const action_names[] = {
      [GS_JOB_ACTION_BROADCAST] = "broadcast",
      [GS_JOB_ACTION_CHECKPOINT] = "checkpoint",
      [GS_JOB_ACTION_STOP] = "stop",
  };
  gs_job_control_t c;
  char why[160];
  cJSON *out;

  if (!gs__control_body_parse(req->body, req->body_len, &c, why, sizeof(why))) {
    respond_error(res, 400, "%s", why);
    return;
  }
  /* Nothing is queued for a job that would act on it with no checkpoint dir. */
  if (c.action == GS_JOB_ACTION_CHECKPOINT && gs__jobs_checkpoints_off(job)) {
    respond_error(res, 409,
                  "job '%s' takes no checkpoints: its rank 0 was started without a checkpoint "
                  "directory (--checkpoint-dir)",
                  job->name);
    return;
  }
  gs__jobs_control(job, &c);
  if (c.action != GS_JOB_ACTION_NONE)
    gs_log(r->log, GS_LOG_INFO, job->name, -1, "control: %s requested", action_names[c.action]);
  out = cJSON_CreateObject();
  cJSON_AddStringToObject(out, "job", job->name);
  cJSON_AddNumberToObject(out, "bcast_period", job->bcast_period);
  cJSON_AddNumberToObject(out, "lr_scale", job->lr_scale);
  cJSON_AddNumberToObject(out, "broadcast_seq", (double)job->broadcast_seq);
  cJSON_AddNumberToObject(out, "checkpoint_seq", (double)job->checkpoint_seq);
  cJSON_AddBoolToObject(out, "stop", job->stop);
  respond_json(res, 200, out);
}

/* Whether the query asks for the per-rank lists: "ranks", "ranks=1" or
 * "ranks=true" among its &-separated parameters. */
static bool wants_ranks(const char *query)
{
  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&");

    if ((n == 5 && !strncmp(p, "ranks", n)) || (n == 7 && !strncmp(p, "ranks=1", n)) ||
        (n == 10 && !strncmp(p, "ranks=true", n)))
      return true;
    p += n + (p[n] == '&');
  }
  return false;
}

/* A query parameter's value (`len` bytes at `v`) as an integer in
 * [min, max]; false when it is not one. */
static bool param_long(const char *v, size_t len, long min, long max, long *out)
{
  char text[24];

  if (len >= sizeof(text))
    return false;
  memcpy(text, v, len);
  text[len] = '\0';
  return gs_parse_long(text, min, max, out) == 0;
}

/* The page a /status query asks for: "limit=N" (1 to GS_STATUS_PAGE_MAX)
 * and "after=SERIAL" (from a page's `next`) among its &-separated
 * parameters. False, with the reason in `why`, when one is malformed. */
static bool status_page(const char *query, gs_status_page_t *page, char *why, size_t len)
{
  *page = (gs_status_page_t){.limit = GS_STATUS_PAGE_DEFAULT};
  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&");
    long v;

    if (n >= 6 && !strncmp(p, "limit=", 6)) {
      if (!param_long(p + 6, n - 6, 1, GS_STATUS_PAGE_MAX, &v)) {
        snprintf(why, len, "limit must be a number of jobs from 1 to %d", GS_STATUS_PAGE_MAX);
        return false;
      }
      page->limit = (uint32_t)v;
    } else if (n >= 6 && !strncmp(p, "after=", 6)) {
      if (!param_long(p + 6, n - 6, 1, LONG_MAX, &v)) {
        snprintf(why, len, "after must be a job serial, as a page's next path gives it");
        return false;
      }
      page->after = (uint64_t)v;
    }
    p += n + (p[n] == '&');
  }
  return true;
}

/* The ranks a /jobs/NAME query asks for: "ranks_from=R" (0 when not
 * given) and "ranks_limit=N" (0 to GS_RANKS_PAGE_MAX; GS_RANKS_PAGE_DEFAULT
 * when not given). False, with the reason in `why`, when one is malformed. */
static bool rank_page(const char *query, gs_rank_page_t *page, char *why, size_t len)
{
  *page = (gs_rank_page_t){.limit = GS_RANKS_PAGE_DEFAULT};
  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&");
    long v;

    if (n >= 11 && !strncmp(p, "ranks_from=", 11)) {
      if (!param_long(p + 11, n - 11, 0, UINT32_MAX, &v)) {
        snprintf(why, len, "ranks_from must be a rank (0 or more)");
        return false;
      }
      page->from = (uint32_t)v;
    } else if (n >= 12 && !strncmp(p, "ranks_limit=", 12)) {
      if (!param_long(p + 12, n - 12, 0, GS_RANKS_PAGE_MAX, &v)) {
        snprintf(why, len, "ranks_limit must be a number of ranks from 0 to %d", GS_RANKS_PAGE_MAX);
        return false;
      }
      page->limit = (uint32_t)v;
    }
    p += n + (p[n] == '&');
  }
  return true;
}

/* Renders the first page of GET /status into r->status_body unless the
 * cached one still holds (see gs_http_routes_t). */
static int status_first_page(gs_http_routes_t *r, uint64_t now)
{
  gs_status_page_t page = {.limit = GS_STATUS_PAGE_DEFAULT};
  gs_buf_t *cache = &r->status_body;
  uint32_t n = 0;
  gs_service_info_t svc;
  cJSON *doc;
  char *text;

  r->service_info(r->ctx, &svc);
  if (r->status_valid && r->status_version == r->jobs->version &&
      r->status_connections == svc.connections &&
      (r->status_ranks >= GS_STATUS_LARGE_RANKS
           ? now - r->status_ms < GS_STATUS_LAG_MS
           : r->status_ms == now && r->status_progress == r->jobs->progress))
    return 0;
  doc = gs__status_json(r->jobs, &svc, now, false, &page);
  text = doc ? cJSON_PrintUnformatted(doc) : NULL;
  cJSON_Delete(doc);
  cache->len = 0;
  r->status_valid = text && gs_buf_append_str(cache, text, strlen(text)) == 0;
  free(text);
  if (!r->status_valid)
    return GS_ENOMEM;
  r->status_version = r->jobs->version;
  r->status_progress = r->jobs->progress;
  r->status_ms = now;
  r->status_connections = svc.connections;
  r->status_ranks = 0;
  for (const gs_job_t *j = r->jobs->jobs; j && n++ < page.limit; j = j->next)
    r->status_ranks += j->world_size;
  return 0;
}

/* GET /status: the service and a page of its jobs (see status_page).
 * The first page of summaries, which pollers read, is rendered once and
 * reused while the state is unchanged (see gs_http_routes_t); the others,
 * and ?ranks=1, are rendered each time. */
static void status(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res)
{
  uint64_t now = uv_now(r->loop);
  gs_buf_t *cache = &r->status_body;
  bool ranks = wants_ranks(req->query);
  gs_status_page_t page;
  gs_service_info_t svc;
  char *body, why[128];

  if (!status_page(req->query, &page, why, sizeof(why))) {
    respond_error(res, 400, "%s", why);
    return;
  }
  if (ranks || page.after || page.limit != GS_STATUS_PAGE_DEFAULT) {
    r->service_info(r->ctx, &svc);
    respond_json(res, 200, gs__status_json(r->jobs, &svc, now, ranks, &page));
    return;
  }
  if (status_first_page(r, now)) {
    respond_error(res, 500, "out of memory");
    return;
  }
  body = malloc(cache->len + 1);
  if (!body) {
    respond_error(res, 500, "out of memory");
    return;
  }
  memcpy(body, cache->data, cache->len + 1);
  respond(res, 200, JSON, body);
}

static void metrics(gs_http_routes_t *r, gs_http_response_t *res)
{
  gs_buf_t text = {0};
  gs_service_info_t svc;

  r->service_info(r->ctx, &svc);
  if (gs__metrics_text(r->jobs, &svc, uv_now(r->loop), &text) || gs_buf_append(&text, "", 1)) {
    gs_buf_free(&text);
    respond_error(res, 500, "out of memory");
    return;
  }
  respond(res, 200, "text/plain; version=0.0.4", (char *)text.data);
}

/* GET /healthz, /status or /metrics. */
static void service_route(gs_http_routes_t *r, const gs_http_request_t *req,
                          gs_http_response_t *res)
{
  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    respond_error(res, 405, "%s allows GET only", req->path);
  } else if (strcmp(req->path, "/healthz") == 0) {
    respond(res, 200, JSON, strdup("{\"status\":\"ok\"}"));
  } else if (!authorized(r, req, NULL, false, wants_ranks(req->query), res)) {
    return;
  } else if (strcmp(req->path, "/status") == 0) {
    status(r, req, res);
  } else {
    metrics(r, res);
  }
}

static int query_param(const char *query, const char *key, char *out, size_t len);

/* POST /jobs/NAME/trace?steps=N (default 10) asks the ranks to record
 * their next N steps: 202, and where the result will be. GET gives it:
 * 200 with the Chrome trace-event document once every rank published its
 * part, else 202 with the ranks still missing (404 before any request). */
static void trace(gs_job_t *job, const gs_http_request_t *req, gs_http_response_t *res)
{
  char steps_text[16];
  long steps = 10;
  bool complete;
  cJSON *doc;

  if (!strcmp(req->method, "GET")) {
    if (!job->trace_seq) {
      respond_error(res, 404, "no trace asked of job %s yet: POST /jobs/%s/trace?steps=N",
                    job->name, job->name);
      return;
    }
    doc = gs__trace_json(job, &complete);
    respond_json(res, complete ? 200 : 202, doc);
    return;
  }
  if (query_param(req->query, "steps", steps_text, sizeof(steps_text)) != GS_ENOTFOUND &&
      gs_parse_long(steps_text, 1, GS_TRACE_MAX_STEPS, &steps)) {
    respond_error(res, 400, "steps must be a whole number from 1 to %d", GS_TRACE_MAX_STEPS);
    return;
  }
  if (job->state != GS_JOB_RUNNING) {
    respond_error(res, 409, "job %s is %s: only a running job records a trace", job->name,
                  gs__job_state_name(job->state));
    return;
  }
  doc = cJSON_CreateObject();
  cJSON_AddNumberToObject(doc, "trace_seq", (double)gs__jobs_trace(job, (uint32_t)steps));
  cJSON_AddNumberToObject(doc, "steps", (double)steps);
  cJSON_AddNumberToObject(doc, "ranks", job->world_size);
  cJSON_AddStringToObject(doc, "result", req->path);
  respond_json(res, 202, doc);
}

/* GET /jobs/NAME, POST /jobs/NAME/control, POST or GET /jobs/NAME/trace. */
static void job_route(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res,
                      const char *name, job_part_t part)
{
  static const char *const allowed[] = {
      [JOB_VIEW] = "GET", [JOB_CONTROL] = "POST", [JOB_TRACE] = "GET, POST"};
  bool is_post = !strcmp(req->method, "POST");
  gs_rank_page_t page;
  char why[128];
  gs_job_t *job;

  if (is_post ? part == JOB_VIEW : strcmp(req->method, "GET") || part == JOB_CONTROL) {
    res->allow = allowed[part];
    respond_error(res, 405, "%s allows %s only", req->path, res->allow);
    return;
  }
  /* /jobs/NAME lists the job's ranks, with their addresses. */
  if (!authorized(r, req, name, is_post, !is_post, res))
    return;
  job = gs__jobs_find(r->jobs, name);
  if (!job)
    respond_error(res, 404, "no job named %s", name);
  else if (part == JOB_CONTROL)
    control(r, job, req, res);
  else if (part == JOB_TRACE)
    trace(job, req, res);
  else if (rank_page(req->query, &page, why, sizeof(why)))
    respond_json(res, 200, gs__job_json(job, uv_now(r->loop), &page));
  else
    respond_error(res, 400, "%s", why);
}

/* The dashboard file a path names: "/" and "/ui" the page, "/ui/FILE" its
 * other files; NULL for any other path. */
static const gs_ui_asset_t *ui_asset(const char *path)
{
  const char *name = NULL;

  if (!strcmp(path, "/") || !strcmp(path, "/ui"))
    name = "index.html";
  else if (!strncmp(path, "/ui/", 4))
    name = path + 4;
  for (size_t i = 0; name && i < gs__ui_asset_count; i++) {
    if (!strcmp(gs__ui_assets[i].name, name))
      return &gs__ui_assets[i];
  }
  return NULL;
}

/* GET of a dashboard file. It holds no data (the page fetches that with
 * the token its user types), so it needs no token. */
static void ui_route(const gs_http_request_t *req, const gs_ui_asset_t *a, gs_http_response_t *res)
{
  char *body;

  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    respond_error(res, 405, "%s allows GET only", req->path);
    return;
  }
  body = malloc(a->len + 1);
  if (!body) {
    respond_error(res, 500, "out of memory");
    return;
  }
  memcpy(body, a->data, a->len + 1); /* with embed.cmake's NUL */
  res->status = 200;
  res->content_type = a->content_type;
  res->body = body;
  res->body_len = a->len;
  res->headers = UI_HEADERS;
}

static unsigned hex_digit(char c)
{
  return isdigit((unsigned char)c) ? (unsigned)(c - '0')
                                   : (unsigned)(tolower((unsigned char)c) - 'a' + 10);
}

/* The value of query parameter `key` ("key=VALUE" among the &-separated
 * ones), %XX escapes decoded, into `out`. 0, GS_ENOTFOUND when absent, or
 * GS_EINVAL when malformed, too long for `len` or holding a NUL. */
static int query_param(const char *query, const char *key, char *out, size_t len)
{
  size_t klen = strlen(key);

  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&"), o = 0;

    if (n > klen && !strncmp(p, key, klen) && p[klen] == '=') {
      for (size_t i = klen + 1; i < n; i++) {
        unsigned v = (unsigned char)p[i];

        if (p[i] == '%') {
          if (i + 2 >= n || !isxdigit((unsigned char)p[i + 1]) ||
              !isxdigit((unsigned char)p[i + 2]))
            return GS_EINVAL;
          v = hex_digit(p[i + 1]) * 16 + hex_digit(p[i + 2]);
          i += 2;
        }
        if (v == 0 || o + 1 >= len)
          return GS_EINVAL;
        out[o++] = (char)v;
      }
      out[o] = '\0';
      return o ? 0 : GS_EINVAL;
    }
    p += n + (p[n] == '&');
  }
  return GS_ENOTFOUND;
}

/* A job's JSON for its stream: its first GS_EVENTS_MAX_RANKS ranks, and
 * `ranks_listed` saying how many are listed. */
static cJSON *job_event_json(const gs_job_t *job, uint64_t now)
{
  const gs_rank_page_t first = {.from = 0, .limit = GS_EVENTS_MAX_RANKS};
  cJSON *doc = gs__job_json(job, now, &first);

  cJSON_AddNumberToObject(doc, "ranks_listed",
                          job->world_size < GS_EVENTS_MAX_RANKS ? job->world_size
                                                                : GS_EVENTS_MAX_RANKS);
  cJSON_AddNumberToObject(doc, "ranks_max_listed", GS_EVENTS_MAX_RANKS);
  return doc;
}

/* One server-sent event, "event: KIND\ndata: JSON\n\n", for what `job`
 * streams ("": the first page of /status; a job no longer known: a
 * "gone" event). NULL when out of memory; the caller frees it. */
static char *event_text(gs_http_routes_t *r, const char *job, uint64_t now, size_t *len)
{
  const gs_job_t *j = job[0] ? gs__jobs_find(r->jobs, job) : NULL;
  const char *kind = !job[0] ? "status" : j ? "job" : "gone";
  char *json = NULL, *text = NULL;
  cJSON *doc = NULL;

  if (!job[0]) {
    json = status_first_page(r, now) ? NULL : strdup((const char *)r->status_body.data);
  } else {
    if (j) {
      doc = job_event_json(j, now);
    } else if ((doc = cJSON_CreateObject())) {
      cJSON_AddStringToObject(doc, "job", job);
    }
    json = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
  }
  if (json && asprintf(&text, "event: %s\ndata: %s\n\n", kind, json) < 0)
    text = NULL;
  free(json);
  *len = text ? strlen(text) : 0;
  return text;
}

static void on_stream_open(void *data, gs_http_stream_t *s)
{
  gs_http_sub_t *sub = data;

  sub->stream = s;
  gs_list_insert_tail(&sub->r->subs, &sub->node);
}

/* The stream ended, or never opened (s NULL): the subscription goes. */
static void on_stream_close(void *data, gs_http_stream_t *s)
{
  gs_http_sub_t *sub = data;

  (void)s;
  gs_list_remove(&sub->node);
  free(sub);
}

/* GET /events[?job=NAME]: a stream of server-sent events, the first page
 * of /status (or the job's JSON) now and then each GS_EVENTS_PERIOD_MS
 * (all streams at the same tick). Authorized as /status (or as
 * /jobs/NAME, which shows the same). */
static void events_route(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res)
{
  gs_http_sub_t *sub;
  char name[128];
  int err = query_param(req->query, "job", name, sizeof(name));
  bool is_job = err == 0;

  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    respond_error(res, 405, "%s allows GET only", req->path);
    return;
  }
  if (err && err != GS_ENOTFOUND) {
    respond_error(res, 400, "job must be a job's name (URL-encoded, up to %zu bytes)",
                  sizeof(name) - 1);
    return;
  }
  if (!authorized(r, req, is_job ? name : NULL, false, is_job, res))
    return;
  if (is_job && !gs__jobs_find(r->jobs, name)) {
    respond_error(res, 404, "no job named %s", name);
    return;
  }
  sub = calloc(1, sizeof(*sub));
  if (!sub) {
    respond_error(res, 500, "out of memory");
    return;
  }
  gs_list_init(&sub->node);
  sub->r = r;
  snprintf(sub->job, sizeof(sub->job), "%s", is_job ? name : "");
  res->body = event_text(r, sub->job, uv_now(r->loop), &res->body_len);
  if (!res->body) {
    free(sub);
    respond_error(res, 500, "out of memory");
    return;
  }
  res->status = 200;
  res->content_type = EVENT_STREAM;
  res->headers = EVENT_HEADERS;
  res->on_stream_open = on_stream_open;
  res->on_stream_close = on_stream_close;
  res->stream_data = sub;
}

/* One tick's rendered events, so that streams of the same subject share
 * one rendering (a job's JSON costs O(world)). */
typedef struct rendered {
  char job[128]; /* a copy: a write may free the sub it came from */
  char *text;
  size_t len;
} rendered_t;

/* The event for `sub` this tick: rendered now, or by an earlier stream of
 * the same subject. NULL when out of memory. */
static rendered_t *render_once(gs_http_routes_t *r, rendered_t *done, size_t *ndone,
                               const gs_http_sub_t *sub, uint64_t now)
{
  rendered_t *e;

  for (size_t i = 0; i < *ndone; i++) {
    if (!strcmp(done[i].job, sub->job))
      return &done[i];
  }
  e = &done[(*ndone)++];
  memcpy(e->job, sub->job, sizeof(e->job));
  e->text = event_text(r, sub->job, now, &e->len);
  return e->text ? e : NULL;
}

void gs__http_routes_tick(gs_http_routes_t *r, uint64_t now)
{
  gs_list_t *node, *next;
  rendered_t *done;
  size_t ndone = 0, nsubs = 0;

  if (!r->subs.next || gs_list_empty(&r->subs))
    return;
  if (now - r->events_ms < GS_EVENTS_PERIOD_MS)
    return;
  r->events_ms = now;
  for (node = r->subs.next; node != &r->subs; node = node->next)
    nsubs++;
  done = calloc(nsubs, sizeof(*done));
  if (!done)
    return;
  /* A write may end its stream (and free its sub) before it returns. */
  for (node = r->subs.next; node != &r->subs; node = next) {
    gs_http_sub_t *sub = GS_CONTAINER_OF(node, gs_http_sub_t, node);
    rendered_t *e = render_once(r, done, &ndone, sub, now);

    next = node->next;
    if (e && gs_http_stream_write(sub->stream, e->text, e->len))
      continue; /* it ended: the server said why, and on_stream_close freed it */
  }
  for (size_t i = 0; i < ndone; i++)
    free(done[i].text);
  free(done);
}

void gs__http_routes_handle(void *ctx, const gs_http_request_t *req, gs_http_response_t *res)
{
  gs_http_routes_t *r = ctx;
  const gs_ui_asset_t *asset;
  job_part_t part;
  char name[128];

  if (!strcmp(req->path, "/healthz") || !strcmp(req->path, "/status") ||
      !strcmp(req->path, "/metrics"))
    service_route(r, req, res);
  else if (!strcmp(req->path, "/events"))
    events_route(r, req, res);
  else if ((asset = ui_asset(req->path)))
    ui_route(req, asset, res);
  else if (job_path(req->path, name, sizeof(name), &part))
    job_route(r, req, res, name, part);
  else
    respond_error(res, 404, "no such path: %s", req->path);
}

int gs__http_routes_start(gs_http_routes_t *r, const char *host, uint16_t port,
                          uint64_t idle_timeout_ms)
{
  gs_http_limits_t limits = {
      .max_header_bytes = 16 * 1024,
      .max_body_bytes = 64 * 1024,
      .idle_timeout_ms = idle_timeout_ms,
      .max_connections = r->max_connections,
      .lines = r->lines,
  };

  gs_list_init(&r->subs);
  r->http = gs_http_server_new(r->loop, r->log, &limits, gs__http_routes_handle, r);
  if (!r->http)
    return GS_ENOMEM;
  if (r->tls)
    gs_http_server_use_tls(r->http, r->tls);
  return gs_http_server_listen(r->http, host, port);
}

void gs__http_routes_close(gs_http_routes_t *r)
{
  if (r->http)
    gs_http_server_close(r->http);
  r->http = NULL;
  gs_buf_free(&r->status_body);
}
