/* The HTTP API: /healthz, /status, /jobs/NAME, /metrics and
 * POST /jobs/NAME/control. Handlers run on the loop and never block. */
#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "http_routes.h"
#include "parse.h"

#define JSON "application/json"

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

/* Splits "/jobs/NAME" or "/jobs/NAME/control"; false for other paths. */
static bool job_path(const char *path, char *name, size_t len, bool *control)
{
  const char *p = path + strlen("/jobs/"), *slash;
  size_t n;

  if (strncmp(path, "/jobs/", 6) != 0)
    return false;
  slash = strchr(p, '/');
  n = slash ? (size_t)(slash - p) : strlen(p);
  if (n == 0 || n >= len)
    return false;
  if (slash && strcmp(slash, "/control") != 0)
    return false;
  memcpy(name, p, n);
  name[n] = '\0';
  *control = slash != NULL;
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

/* Whether a JSON text holds a NUL: a raw one, or one escaped in a string
 * (\u0000), which cJSON decodes into a C string that ends there:
 * "stop\u0000x" would read as "stop". Walks the strings and their
 * escapes; reads only `len` bytes. */
static bool json_has_nul(const char *text, size_t len)
{
  bool in_string = false;

  for (size_t i = 0; i < len; i++) {
    if (text[i] == '\0') {
      return true; /* a raw one, in a string or not, ends what cJSON reads */
    } else if (text[i] == '"') {
      in_string = !in_string;
    } else if (in_string && text[i] == '\\' && i + 1 < len) {
      if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4))
        return true;
      i++; /* the escaped character: an escaped quote ends no string */
    }
  }
  return false;
}

/* Applies {"bcast_period": N} and/or {"action": "broadcast"|"checkpoint"|"stop"}.
 * Read strictly: a field given twice or a string with a NUL is refused,
 * not resolved (which copy wins, or where a string ends, is not ours to
 * guess for a request that stops a job). */
static void control(gs_http_routes_t *r, gs_job_t *job, const gs_http_request_t *req,
                    gs_http_response_t *res)
{
  cJSON *doc, *item, *out;
  const cJSON *period = NULL, *action = NULL;

  if (json_has_nul(req->body, req->body_len)) {
    respond_error(res, 400, "a string in the body holds a NUL (\\u0000)");
    return;
  }
  doc = cJSON_ParseWithLength(req->body, req->body_len);
  if (!cJSON_IsObject(doc)) {
    cJSON_Delete(doc);
    respond_error(res, 400, "the body must be a JSON object");
    return;
  }
  cJSON_ArrayForEach(item, doc)
  {
    const cJSON **slot = strcmp(item->string, "bcast_period") == 0 ? &period
                         : strcmp(item->string, "action") == 0     ? &action
                                                                   : NULL;

    if (!slot || *slot) {
      if (slot)
        respond_error(res, 400, "field '%s' is given twice", item->string);
      else
        respond_error(res, 400, "unknown field '%s' (expected bcast_period or action)",
                      item->string);
      cJSON_Delete(doc);
      return;
    }
    *slot = item;
  }
  if (!period && !action) {
    cJSON_Delete(doc);
    respond_error(res, 400, "nothing to do: give bcast_period and/or action");
    return;
  }
  if (period && (!cJSON_IsNumber(period) || period->valuedouble != floor(period->valuedouble) ||
                 period->valuedouble < -1 || period->valuedouble > INT_MAX)) {
    cJSON_Delete(doc);
    respond_error(res, 400, "bcast_period must be an integer >= -1");
    return;
  }
  if (action && (!cJSON_IsString(action) || (strcmp(action->valuestring, "broadcast") &&
                                             strcmp(action->valuestring, "checkpoint") &&
                                             strcmp(action->valuestring, "stop")))) {
    cJSON_Delete(doc);
    respond_error(res, 400, "action must be \"broadcast\", \"checkpoint\" or \"stop\"");
    return;
  }
  /* Nothing is queued for a job that would act on it with no checkpoint dir. */
  if (action && strcmp(action->valuestring, "checkpoint") == 0 && gs__jobs_checkpoints_off(job)) {
    cJSON_Delete(doc);
    respond_error(res, 409,
                  "job '%s' takes no checkpoints: its rank 0 was started without a checkpoint "
                  "directory (--checkpoint-dir)",
                  job->name);
    return;
  }
  gs__jobs_control(job, period != NULL, period ? (int32_t)period->valuedouble : 0,
                   !action                                          ? GS_JOB_ACTION_NONE
                   : strcmp(action->valuestring, "broadcast") == 0  ? GS_JOB_ACTION_BROADCAST
                   : strcmp(action->valuestring, "checkpoint") == 0 ? GS_JOB_ACTION_CHECKPOINT
                                                                    : GS_JOB_ACTION_STOP);
  if (action)
    gs_log(r->log, GS_LOG_INFO, job->name, -1, "control: %s requested", action->valuestring);
  cJSON_Delete(doc);
  out = cJSON_CreateObject();
  cJSON_AddStringToObject(out, "job", job->name);
  cJSON_AddNumberToObject(out, "bcast_period", job->bcast_period);
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
  char *body, *text, why[128];

  if (!status_page(req->query, &page, why, sizeof(why))) {
    respond_error(res, 400, "%s", why);
    return;
  }
  r->service_info(r->ctx, &svc);
  if (ranks || page.after || page.limit != GS_STATUS_PAGE_DEFAULT) {
    respond_json(res, 200, gs__status_json(r->jobs, &svc, now, ranks, &page));
    return;
  }
  if (!r->status_valid || r->status_version != r->jobs->version || r->status_ms != now ||
      r->status_connections != svc.connections) {
    cJSON *doc = gs__status_json(r->jobs, &svc, now, false, &page);

    text = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    cache->len = 0;
    r->status_valid = text && gs_buf_append_str(cache, text, strlen(text)) == 0;
    free(text);
    if (!r->status_valid) {
      respond_error(res, 500, "out of memory");
      return;
    }
    r->status_version = r->jobs->version;
    r->status_ms = now;
    r->status_connections = svc.connections;
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

/* GET /jobs/NAME or POST /jobs/NAME/control. */
static void job_route(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res,
                      const char *name, bool is_control)
{
  gs_job_t *job;

  if (strcmp(req->method, is_control ? "POST" : "GET") != 0) {
    res->allow = is_control ? "POST" : "GET";
    respond_error(res, 405, "%s allows %s only", req->path, res->allow);
    return;
  }
  /* /jobs/NAME lists the job's ranks, with their addresses. */
  if (!authorized(r, req, name, is_control, !is_control, res))
    return;
  job = gs__jobs_find(r->jobs, name);
  if (!job)
    respond_error(res, 404, "no job named %s", name);
  else if (is_control)
    control(r, job, req, res);
  else
    respond_json(res, 200, gs__job_json(job, uv_now(r->loop), true));
}

void gs__http_routes_handle(void *ctx, const gs_http_request_t *req, gs_http_response_t *res)
{
  gs_http_routes_t *r = ctx;
  bool is_control;
  char name[128];

  if (!strcmp(req->path, "/healthz") || !strcmp(req->path, "/status") ||
      !strcmp(req->path, "/metrics"))
    service_route(r, req, res);
  else if (job_path(req->path, name, sizeof(name), &is_control))
    job_route(r, req, res, name, is_control);
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
