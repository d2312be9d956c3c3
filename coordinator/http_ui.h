/* The dashboard's files (coordinator/ui/, compiled in by ui/embed.cmake):
 * GET /, /ui and /ui/FILE. */
#ifndef GS_HTTP_UI_H
#define GS_HTTP_UI_H

#include "http_routes.h"
#include "ui_assets.h"

/* The file a path names: "/" and "/ui" the page, "/ui/FILE" its other
 * files; NULL for any other path. */
const gs_ui_asset_t *gs__http_ui_asset(const char *path);
/* GET of file `a`. It holds no data (the page fetches that with the token
 * its user types), so it needs no token. */
void gs__http_ui_route(const gs_http_request_t *req, const gs_ui_asset_t *a,
                       gs_http_response_t *res);

#endif
