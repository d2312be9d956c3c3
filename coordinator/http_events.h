/* The dashboard's live updates: GET /events[?job=NAME], a stream of
 * server-sent events per client, each sent a snapshot every
 * GS_EVENTS_PERIOD_MS (http_routes.h routes to it). */
#ifndef GS_HTTP_EVENTS_H
#define GS_HTTP_EVENTS_H

#include "http_routes.h"

/* How often the event streams get a new snapshot. Not sooner on a change:
 * the jobs' version moves at every call and sweep, so it tells of none. */
#define GS_EVENTS_PERIOD_MS 1000
/* A job's stream lists its first ranks only (the rest are in
 * rank_summary and /jobs/NAME): a snapshot stays under ~300 KB. */
#define GS_EVENTS_MAX_RANKS 1024

/* GET /events[?job=NAME]: opens a stream (its first event in the
 * response), or answers why not. */
void gs__http_events_route(gs_http_routes_t *r, const gs_http_request_t *req,
                           gs_http_response_t *res);

/* Sends each event stream its snapshot when it is due; the owner's
 * housekeeping timer calls it. */
void gs__http_events_tick(gs_http_routes_t *r, uint64_t now);
/* No event streams yet (before the server starts). */
void gs__http_events_init(gs_http_routes_t *r);

#endif
