/* The dashboard's files (http_ui.h). */
#include "http_ui.h"

#include <stdlib.h>
#include <string.h>

#include "beat_fields.h"
#include "http_reply.h"

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

/* The dashboard's columns of what ranks report (beat_fields.h), a script
 * the page loads before app.js: [key, label, format] of each field that
 * has a label. */
#define UI_COLUMN(name, ctype, part, member, newer, label, format)                                 \
  "  [\"" #name "\", \"" label "\", \"" format "\"],\n"
static const char beat_fields_js[] =
    "// Made by the coordinator from its table of heartbeat fields.\n"
    "const BEAT_FIELDS = [\n" GS_BEAT_FIELDS(UI_COLUMN) "].filter((f) => f[1]);\n";
static const gs_ui_asset_t beat_fields = {
    .name = "beat_fields.js",
    .content_type = "text/javascript; charset=utf-8",
    .data = (const unsigned char *)beat_fields_js,
    .len = sizeof(beat_fields_js) - 1,
};

const gs_ui_asset_t *gs__http_ui_asset(const char *path)
{
  const char *name = NULL;

  if (!strcmp(path, "/") || !strcmp(path, "/ui"))
    name = "index.html";
  else if (!strncmp(path, "/ui/", 4))
    name = path + 4;
  if (name && !strcmp(name, beat_fields.name))
    return &beat_fields;
  for (size_t i = 0; name && i < gs__ui_asset_count; i++) {
    if (!strcmp(gs__ui_assets[i].name, name))
      return &gs__ui_assets[i];
  }
  return NULL;
}

void gs__http_ui_route(const gs_http_request_t *req, const gs_ui_asset_t *a,
                       gs_http_response_t *res)
{
  char *body;

  if (strcmp(req->method, "GET") != 0) {
    res->allow = "GET";
    gs__http_respond_error(res, 405, "%s allows GET only", req->path);
    return;
  }
  body = malloc(a->len + 1);
  if (!body) {
    gs__http_respond_error(res, 500, "out of memory");
    return;
  }
  memcpy(body, a->data, a->len + 1); /* with embed.cmake's NUL */
  res->status = 200;
  res->content_type = a->content_type;
  res->body = body;
  res->body_len = a->len;
  res->headers = UI_HEADERS;
}
