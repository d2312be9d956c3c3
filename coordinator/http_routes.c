/* The HTTP API: /healthz, /status, /jobs/NAME, /metrics,
 * POST /jobs/NAME/control, the dashboard's files and its event streams
 * (/events). Handlers run on the loop and never block. This file routes
 * and answers /jobs/NAME; the others are in http_status.c, http_events.c
 * and http_ui.c, over http_reply.c. */
#include <cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_body.h"
#include "http_events.h"
#include "http_reply.h"
#include "http_routes.h"
#include "http_status.h"
#include "http_ui.h"
#include "parse.h"
#include "trace.h"

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
    gs__http_respond_error(res, 400, "%s", why);
    return;
  }
  /* Nothing is queued for a job that would act on it with no checkpoint dir. */
  if (c.action == GS_JOB_ACTION_CHECKPOINT && gs__jobs_checkpoints_off(job)) {
    gs__http_respond_error(
        res, 409,
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
  gs__http_respond_json(res, 200, out);
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
      if (!gs__http_param_long(p + 11, n - 11, 0, UINT32_MAX, &v)) {
        snprintf(why, len, "ranks_from must be a rank (0 or more)");
        return false;
      }
      page->from = (uint32_t)v;
    } else if (n >= 12 && !strncmp(p, "ranks_limit=", 12)) {
      if (!gs__http_param_long(p + 12, n - 12, 0, GS_RANKS_PAGE_MAX, &v)) {
        snprintf(why, len, "ranks_limit must be a number of ranks from 0 to %d", GS_RANKS_PAGE_MAX);
        return false;
      }
      page->limit = (uint32_t)v;
    }
    p += n + (p[n] == '&');
  }
  return true;
}

/* GET /healthz, /status or /metrics. */
static void service_route(gs_http_routes_t *r, const gs_http_request_t *req,
                          gs_http_response_t *res)
{
  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    gs__http_respond_error(res, 405, "%s allows GET only", req->path);
  } else if (strcmp(req->path, "/healthz") == 0) {
    gs__http_respond(res, 200, GS_HTTP_JSON, strdup("{\"status\":\"ok\"}"));
  } else if (!gs__http_authorized(r, req, NULL, false, gs__http_query_flag(req->query, "ranks"),
                                  res)) {
    return;
  } else if (strcmp(req->path, "/status") == 0) {
    gs__http_status(r, req, res);
  } else {
    gs__http_metrics(r, res);
  }
}

/* GET /jobs/NAME/trace: the merged document (rendered once, shared by the
 * replies), or what it waits for. */
static void trace_reply(gs_job_t *job, gs_http_response_t *res)
{
  gs_trace_doc_t *doc;
  cJSON *pending;
  int err;

  if (!job->trace_seq) {
    gs__http_respond_error(res, 404, "no trace asked of job %s yet: POST /jobs/%s/trace?steps=N",
                           job->name, job->name);
    return;
  }
  err = gs__trace_document(job, &doc, &pending);
  if (err == GS_ELIMIT) {
    gs__http_respond_error(res, 503,
                           "the trace of job %s would pass what jobs may store (a quarter of "
                           "--max-memory): ask for fewer steps",
                           job->name);
  } else if (err) {
    gs__http_respond_error(res, 500, "out of memory rendering the trace of job %s", job->name);
  } else if (pending) {
    gs__http_respond_json(res, 202, pending);
  } else {
    *res = (gs_http_response_t){.status = 200,
                                .content_type = GS_HTTP_JSON,
                                .body = doc->text,
                                .body_len = doc->len,
                                .body_release = gs__trace_doc_release,
                                .body_arg = gs__trace_doc_hold(doc)};
  }
}

/* POST /jobs/NAME/trace?steps=N (default 10) asks the ranks to record
 * their next N steps: 202, and where the result will be. GET gives it:
 * 200 with the Chrome trace-event document once every rank published its
 * part, else 202 with the ranks still missing (404 before any request). */
static void trace(gs_job_t *job, const gs_http_request_t *req, gs_http_response_t *res)
{
  char steps_text[16];
  long steps = 10;
  cJSON *doc;

  if (!strcmp(req->method, "GET")) {
    trace_reply(job, res);
    return;
  }
  if (gs__http_query_param(req->query, "steps", steps_text, sizeof(steps_text)) != GS_ENOTFOUND &&
      gs_parse_long(steps_text, 1, GS_TRACE_MAX_STEPS, &steps)) {
    gs__http_respond_error(res, 400, "steps must be a whole number from 1 to %d",
                           GS_TRACE_MAX_STEPS);
    return;
  }
  if (job->state != GS_JOB_RUNNING) {
    gs__http_respond_error(res, 409, "job %s is %s: only a running job records a trace", job->name,
                           gs__job_state_name(job->state));
    return;
  }
  doc = cJSON_CreateObject();
  cJSON_AddNumberToObject(doc, "trace_seq", (double)gs__jobs_trace(job, (uint32_t)steps));
  cJSON_AddNumberToObject(doc, "steps", (double)steps);
  cJSON_AddNumberToObject(doc, "ranks", job->world_size);
  cJSON_AddStringToObject(doc, "result", req->path);
  gs__http_respond_json(res, 202, doc);
}

/* /jobs/NAME's JSON: with "curve", the job's curve too (NULL when out of
 * memory). */
static cJSON *job_view(const gs_job_t *job, uint64_t now, const gs_rank_page_t *page,
                       const char *query)
{
  cJSON *doc = gs__job_json(job, now, page);

  if (doc && gs__http_query_flag(query, "curve") &&
      !cJSON_AddItemToObject(doc, "curve", gs__curve_json(&job->curve))) {
    cJSON_Delete(doc);
    return NULL;
  }
  return doc;
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
    gs__http_respond_error(res, 405, "%s allows %s only", req->path, res->allow);
    return;
  }
  /* /jobs/NAME lists the job's ranks, with their addresses. */
  if (!gs__http_authorized(r, req, name, is_post, !is_post, res))
    return;
  job = gs__jobs_find(r->jobs, name);
  if (!job)
    gs__http_respond_error(res, 404, "no job named %s", name);
  else if (part == JOB_CONTROL)
    control(r, job, req, res);
  else if (part == JOB_TRACE)
    trace(job, req, res);
  else if (rank_page(req->query, &page, why, sizeof(why)))
    gs__http_respond_json(res, 200, job_view(job, uv_now(r->loop), &page, req->query));
  else
    gs__http_respond_error(res, 400, "%s", why);
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
    gs__http_events_route(r, req, res);
  else if ((asset = gs__http_ui_asset(req->path)))
    gs__http_ui_route(req, asset, res);
  else if (job_path(req->path, name, sizeof(name), &part))
    job_route(r, req, res, name, part);
  else
    gs__http_respond_error(res, 404, "no such path: %s", req->path);
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
      .mem = r->mem,
  };

  gs__http_events_init(r);
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
  gs__http_status_free(r);
}
