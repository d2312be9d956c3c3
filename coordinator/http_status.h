/* GET /status and /metrics (http_routes.h), and the cached first page of
 * /status that the event streams share. */
#ifndef GS_HTTP_STATUS_H
#define GS_HTTP_STATUS_H

#include "http_routes.h"

/* The first page of GET /status in *text (valid until the next call),
 * rendered unless the cached one still holds (gs_status_cache_t). 0 or
 * GS_ENOMEM. The cache's memory goes with gs__http_status_free. */
int gs__http_status_first_page(gs_http_routes_t *r, uint64_t now, const char **text) GS_WARN_UNUSED;
void gs__http_status_free(gs_http_routes_t *r);
/* GET /status: the service and a page of its jobs. */
void gs__http_status(gs_http_routes_t *r, const gs_http_request_t *req, gs_http_response_t *res);
/* GET /metrics: Prometheus text. */
void gs__http_metrics(gs_http_routes_t *r, gs_http_response_t *res);

#endif
