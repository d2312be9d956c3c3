/* RPC methods, in proto order (until the shared table in common/wire.h). */
#ifndef GS_METHOD_H
#define GS_METHOD_H

#include <stdbool.h>

#define GS_METHOD_MAP(XX)                                                                          \
  XX(JOIN, Join)                                                                                   \
  XX(PUBLISH, Publish)                                                                             \
  XX(FETCH, Fetch)                                                                                 \
  XX(PUBLISH_PACK_LIST, PublishPackList)                                                           \
  XX(FETCH_PACK_LIST, FetchPackList)                                                               \
  XX(HEARTBEAT, Heartbeat)                                                                         \
  XX(LEAVE, Leave)

typedef enum gs_method {
#define GS__METHOD_ENUM(id, name) GS_METHOD_##id,
  GS_METHOD_MAP(GS__METHOD_ENUM)
#undef GS__METHOD_ENUM
      GS_METHOD_COUNT
} gs_method_t;

const char *gs_method_name(gs_method_t m);
const char *gs_method_path(gs_method_t m);
bool gs_method_from_path(const char *path, gs_method_t *m);

#endif
