/* GET /status (paged; its first page cached) and GET /metrics. */
#include "http_status.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_reply.h"

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
      if (!gs__http_param_long(p + 6, n - 6, 1, GS_STATUS_PAGE_MAX, &v)) {
        snprintf(why, len, "limit must be a number of jobs from 1 to %d", GS_STATUS_PAGE_MAX);
        return false;
      }
      page->limit = (uint32_t)v;
    } else if (n >= 6 && !strncmp(p, "after=", 6)) {
      if (!gs__http_param_long(p + 6, n - 6, 1, LONG_MAX, &v)) {
        snprintf(why, len, "after must be a job serial, as a page's next path gives it");
        return false;
      }
      page->after = (uint64_t)v;
    }
    p += n + (p[n] == '&');
  }
  return true;
}

static int render_first_page(gs_http_routes_t *r, uint64_t now)
{
  gs_status_page_t page = {.limit = GS_STATUS_PAGE_DEFAULT};
  gs_buf_t *cache = &r->status.body;
  uint32_t n = 0;
  gs_service_info_t svc;
  cJSON *doc;
  char *text;

  r->service_info(r->ctx, &svc);
  if (r->status.valid && r->status.version == r->jobs->version &&
      r->status.connections == svc.connections &&
      (r->status.ranks >= GS_STATUS_LARGE_RANKS
           ? now - r->status.ms < GS_STATUS_LAG_MS
           : r->status.ms == now && r->status.progress == r->jobs->progress))
    return 0;
  doc = gs__status_json(r->jobs, &svc, now, false, &page);
  text = doc ? cJSON_PrintUnformatted(doc) : NULL;
  cJSON_Delete(doc);
  cache->len = 0;
  r->status.valid = text && gs_buf_append_str(cache, text, strlen(text)) == 0;
  free(text);
  if (!r->status.valid)
    return GS_ENOMEM;
  r->status.version = r->jobs->version;
  r->status.progress = r->jobs->progress;
  r->status.ms = now;
  r->status.connections = svc.connections;
  r->status.ranks = 0;
  for (const gs_job_t *j = r->jobs->jobs; j && n++ < page.limit; j = j->next)
    r->status.ranks += j->world_size;
  return 0;
}

int gs__http_status_first_page(gs_http_routes_t *r, uint64_t now, const char **text)
{
  int err = render_first_page(r, now);

  *text = err ? NULL : (const char *)r->status.body.data;
  return err;
}

void gs__http_status_free(gs_http_routes_t *r)
{
  gs_buf_free(&r->status.body);
  r->status.valid = false;
}

/* GET /status: the service and a page of its jobs (see status_page).
 * The first page of summaries, which pollers read, is rendered once and
 * reused while the state is unchanged (see gs_http_routes_t); the others,
 * and ?ranks=1, are rendered each time. */
void gs__http_status(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res)
{
  uint64_t now = uv_now(r->loop);
  gs_buf_t *cache = &r->status.body;
  bool ranks = gs__http_query_flag(req->query, "ranks");
  gs_status_page_t page;
  gs_service_info_t svc;
  char *body, why[128];

  if (!status_page(req->query, &page, why, sizeof(why))) {
    gs__http_respond_error(res, 400, "%s", why);
    return;
  }
  if (ranks || page.after || page.limit != GS_STATUS_PAGE_DEFAULT) {
    r->service_info(r->ctx, &svc);
    gs__http_respond_json(res, 200, gs__status_json(r->jobs, &svc, now, ranks, &page));
    return;
  }
  if (render_first_page(r, now)) {
    gs__http_respond_error(res, 500, "out of memory");
    return;
  }
  body = malloc(cache->len + 1);
  if (!body) {
    gs__http_respond_error(res, 500, "out of memory");
    return;
  }
  memcpy(body, cache->data, cache->len + 1);
  gs__http_respond(res, 200, GS_HTTP_JSON, body);
}

void gs__http_metrics(gs_http_routes_t *r, gs_http_response_t *res)
{
  gs_buf_t text = {0};
  gs_service_info_t svc;

  r->service_info(r->ctx, &svc);
  if (gs__metrics_text(r->jobs, &svc, uv_now(r->loop), &text) || gs_buf_append(&text, "", 1)) {
    gs_buf_free(&text);
    gs__http_respond_error(res, 500, "out of memory");
    return;
  }
  gs__http_respond(res, 200, "text/plain; version=0.0.4", (char *)text.data);
}
