/* The HTTP API's answers, query parameters and token check (http_reply.h). */
#include "http_reply.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "parse.h"

void gs__http_respond(gs_http_response_t *res, int status, const char *type, char *body)
{
  res->status = status;
  res->content_type = type;
  res->body = body;
  res->body_len = body ? strlen(body) : 0;
}

void gs__http_respond_json(gs_http_response_t *res, int status, cJSON *doc)
{
  char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;

  cJSON_Delete(doc);
  if (!text) {
    gs__http_respond(res, 500, GS_HTTP_JSON, strdup("{\"error\":\"out of memory\"}"));
    return;
  }
  gs__http_respond(res, status, GS_HTTP_JSON, text);
}

void gs__http_respond_error(gs_http_response_t *res, int status, const char *fmt, ...)
{
  cJSON *doc = cJSON_CreateObject();
  char msg[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cJSON_AddStringToObject(doc, "error", msg);
  gs__http_respond_json(res, status, doc);
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

bool gs__http_authorized(gs_http_routes_t *r, const gs_http_request_t *req, const char *job,
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
  gs__http_respond_error(res, 401, "%s needs 'Authorization: Bearer TOKEN' (the coordinator's%s)",
                         req->path, job ? " or the job's" : "");
  return false;
}

/* Among the &-separated parameters. */
bool gs__http_query_flag(const char *query, const char *key)
{
  size_t k = strlen(key);

  for (const char *p = query; *p;) {
    size_t n = strcspn(p, "&");

    if (n >= k && !strncmp(p, key, k) &&
        (n == k || (n - k == 2 && !strncmp(p + k, "=1", 2)) ||
         (n - k == 5 && !strncmp(p + k, "=true", 5))))
      return true;
    p += n + (p[n] == '&');
  }
  return false;
}

bool gs__http_param_long(const char *v, size_t len, long min, long max, long *out)
{
  char text[24];

  if (len >= sizeof(text))
    return false;
  memcpy(text, v, len);
  text[len] = '\0';
  return gs_parse_long(text, min, max, out) == 0;
}

static unsigned hex_digit(char c)
{
  return isdigit((unsigned char)c) ? (unsigned)(c - '0')
                                   : (unsigned)(tolower((unsigned char)c) - 'a' + 10);
}

/* "key=VALUE" among the &-separated parameters. */
int gs__http_query_param(const char *query, const char *key, char *out, size_t len)
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
