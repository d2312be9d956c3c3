/* A program's parse, whole (flags.h: gs_flags_main): above both the parser
 * (flags.c) and the help (flags_help.c). */
#include <stdio.h>

#include "flags.h"

int gs_flags_main(const gs_flags_t *spec, void *base, int argc, char **argv,
                  const gs_flags_opts_t *opts, const char *version)
{
  gs_flags_action_t action;
  char why[512];

  if (gs_flags_parse(spec, base, argc, argv, opts, &action, why, sizeof(why))) {
    fprintf(stderr, "%s: %s\n", spec->prog, why);
    return 2;
  }
  return gs_flags_answer(spec, base, action, version) ? -1 : 0;
}
