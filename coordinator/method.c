/* The method table's names and paths (until common/wire.h has them). */
#include "method.h"

#include <string.h>

#include "wire.h"

static const char *const method_names[] = {
#define GS__METHOD_NAME(id, name) #name,
    GS_METHOD_MAP(GS__METHOD_NAME)
#undef GS__METHOD_NAME
};

static const char *const method_paths[] = {
#define GS__METHOD_PATH(id, name) GS_METHOD_PREFIX #name,
    GS_METHOD_MAP(GS__METHOD_PATH)
#undef GS__METHOD_PATH
};

/* The longest method path must fit the Envelope's method field. */
_Static_assert(sizeof(GS_METHOD_PREFIX "PublishPackList") <=
                   sizeof(((gradsync_Envelope *)0)->method),
               "method paths must fit gradsync.Envelope.method");

const char *gs_method_name(gs_method_t m)
{
  return m < GS_METHOD_COUNT ? method_names[m] : "?";
}

const char *gs_method_path(gs_method_t m)
{
  return m < GS_METHOD_COUNT ? method_paths[m] : "";
}

bool gs_method_from_path(const char *path, gs_method_t *m)
{
  size_t plen = strlen(GS_METHOD_PREFIX);

  if (strncmp(path, GS_METHOD_PREFIX, plen) != 0)
    return false;
  for (int i = 0; i < GS_METHOD_COUNT; i++) {
    if (strcmp(path + plen, method_names[i]) == 0) {
      *m = (gs_method_t)i;
      return true;
    }
  }
  return false;
}
