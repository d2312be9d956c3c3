/* What every route of the HTTP API shares (http_routes.h): its answers
 * (a body, JSON, or a JSON error), the query's parameters, and the token
 * check that guards a route. */
#ifndef GS_HTTP_REPLY_H
#define GS_HTTP_REPLY_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "http_routes.h"

#define GS_HTTP_JSON "application/json"

/* The response: `status`, of `type`, with `body` (malloc'd, NUL-ended; the
 * server frees it; NULL: none). */
void gs__http_respond(gs_http_response_t *res, int status, const char *type, char *body);
/* The same with `doc` printed (and deleted); 500 when out of memory. */
void gs__http_respond_json(gs_http_response_t *res, int status, cJSON *doc);
/* {"error": the formatted message} with `status`. */
void gs__http_respond_error(gs_http_response_t *res, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether the request may go on: a request that changes something, or
 * shows ranks' addresses (`reveals`), or any with --http-auth read, needs
 * the coordinator's token, or the token of `job` (NULL: no job's will
 * do). Answers 401 and logs (limited per client) when it may not. */
bool gs__http_authorized(gs_http_routes_t *r, const gs_http_request_t *req, const char *job,
                         bool changes, bool reveals, gs_http_response_t *res);

/* Whether the query turns on `key` ("KEY", "KEY=1" or "KEY=true"): /status's
 * "ranks" (the per-rank lists), /jobs/NAME's "curve". */
bool gs__http_query_flag(const char *query, const char *key);
/* A parameter's value (`len` bytes at `v`) as an integer in [min, max];
 * false when it is not one. */
bool gs__http_param_long(const char *v, size_t len, long min, long max, long *out);
/* The value of query parameter `key`, %XX escapes decoded, into `out`. 0,
 * GS_ENOTFOUND when absent, or GS_EINVAL when malformed, too long for
 * `len` or holding a NUL. */
int gs__http_query_param(const char *query, const char *key, char *out, size_t len);

#endif
