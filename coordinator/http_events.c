/* The dashboard's event streams (http_events.h). */
#include "http_events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_reply.h"
#include "http_status.h"

#define EVENT_STREAM "text/event-stream"
#define EVENT_HEADERS "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"

/* One open event stream: the /status summary (job "") or one job's JSON. */
typedef struct gs_http_sub {
  gs_list_t node; /* on gs_http_routes_t.subs while open */
  gs_http_routes_t *r;
  gs_http_stream_t *stream;
  char job[128];
} gs_http_sub_t;

/* A job's JSON for its stream: its first GS_EVENTS_MAX_RANKS ranks, and
 * `ranks_listed` saying how many are listed; the stream's first event
 * also has the job's curve, which the page then extends itself. */
static cJSON *job_event_json(const gs_job_t *job, uint64_t now, bool with_curve)
{
  const gs_rank_page_t first = {.from = 0, .limit = GS_EVENTS_MAX_RANKS};
  cJSON *doc = gs__job_json(job, now, &first);

  if (doc && with_curve && !cJSON_AddItemToObject(doc, "curve", gs__curve_json(&job->curve))) {
    cJSON_Delete(doc);
    return NULL;
  }
  cJSON_AddNumberToObject(doc, "ranks_listed",
                          job->world_size < GS_EVENTS_MAX_RANKS ? job->world_size
                                                                : GS_EVENTS_MAX_RANKS);
  cJSON_AddNumberToObject(doc, "ranks_max_listed", GS_EVENTS_MAX_RANKS);
  return doc;
}

/* One server-sent event, "event: KIND\ndata: JSON\n\n", for what `job`
 * streams ("": the first page of /status; a job no longer known: a
 * "gone" event); `first`: a stream's first. NULL when out of memory; the
 * caller frees it. */
static char *event_text(gs_http_routes_t *r, const char *job, uint64_t now, bool first, size_t *len)
{
  const gs_job_t *j = job[0] ? gs__jobs_find(r->jobs, job) : NULL;
  const char *kind = !job[0] ? "status" : j ? "job" : "gone";
  char *json = NULL, *text = NULL;
  cJSON *doc = NULL;

  if (!job[0]) {
    const char *page;

    json = gs__http_status_first_page(r, now, &page) ? NULL : strdup(page);
  } else {
    if (j) {
      doc = job_event_json(j, now, first);
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
  gs_list_insert_tail(&sub->r->subs.list, &sub->node);
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
 * of /status (or the job's GS_HTTP_JSON) now and then each GS_EVENTS_PERIOD_MS
 * (all streams at the same tick). Authorized as /status (or as
 * /jobs/NAME, which shows the same). */
void gs__http_events_route(gs_http_routes_t *r, const gs_http_request_t *req,
                           gs_http_response_t *res)
{
  gs_http_sub_t *sub;
  char name[128];
  int err = gs__http_query_param(req->query, "job", name, sizeof(name));
  bool is_job = err == 0;

  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    gs__http_respond_error(res, 405, "%s allows GET only", req->path);
    return;
  }
  if (err && err != GS_ENOTFOUND) {
    gs__http_respond_error(res, 400, "job must be a job's name (URL-encoded, up to %zu bytes)",
                           sizeof(name) - 1);
    return;
  }
  if (!gs__http_authorized(r, req, is_job ? name : NULL, false, is_job, res))
    return;
  if (is_job && !gs__jobs_find(r->jobs, name)) {
    gs__http_respond_error(res, 404, "no job named %s", name);
    return;
  }
  sub = calloc(1, sizeof(*sub));
  if (!sub) {
    gs__http_respond_error(res, 500, "out of memory");
    return;
  }
  gs_list_init(&sub->node);
  sub->r = r;
  snprintf(sub->job, sizeof(sub->job), "%s", is_job ? name : "");
  res->body = event_text(r, sub->job, uv_now(r->loop), true, &res->body_len);
  if (!res->body) {
    free(sub);
    gs__http_respond_error(res, 500, "out of memory");
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
  e->text = event_text(r, sub->job, now, false, &e->len);
  return e->text ? e : NULL;
}

/* Streams of the same subject share one rendering this tick. */
void gs__http_events_tick(gs_http_routes_t *r, uint64_t now)
{
  gs_list_t *node, *next;
  rendered_t *done;
  size_t ndone = 0, nsubs = 0;

  if (!r->subs.list.next || gs_list_empty(&r->subs.list))
    return;
  if (now - r->subs.sent_ms < GS_EVENTS_PERIOD_MS)
    return;
  r->subs.sent_ms = now;
  for (node = r->subs.list.next; node != &r->subs.list; node = node->next)
    nsubs++;
  done = calloc(nsubs, sizeof(*done));
  if (!done)
    return;
  /* A write may end its stream (and free its sub) before it returns. */
  for (node = r->subs.list.next; node != &r->subs.list; node = next) {
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

void gs__http_events_init(gs_http_routes_t *r)
{
  gs_list_init(&r->subs.list);
  r->subs.sent_ms = 0;
}
