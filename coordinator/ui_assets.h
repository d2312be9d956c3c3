/* The dashboard's files (coordinator/ui/), compiled into the binary by
 * ui/embed.cmake at build time: see http_routes.c for how they are
 * served. */
#ifndef GS_UI_ASSETS_H
#define GS_UI_ASSETS_H

#include <stddef.h>

typedef struct gs_ui_asset {
  const char *name;         /* file name in coordinator/ui/: "index.html" */
  const char *content_type; /* from the extension */
  const unsigned char *data;
  size_t len;
} gs_ui_asset_t;

extern const gs_ui_asset_t gs__ui_assets[];
extern const size_t gs__ui_asset_count;

#endif
