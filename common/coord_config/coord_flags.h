/* gradsync-coordinator's flag table (coord_flags.c). */
#ifndef GS_COORD_FLAGS_H
#define GS_COORD_FLAGS_H

#include "config.h"
#include "flags.h"

/* The table; its rows' targets are in a gs_coord_config_t (defaults from
 * gs_coord_config_defaults). Static: never freed. */
const gs_flags_t *gs_coord_flags(void);

#endif
