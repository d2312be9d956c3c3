/* The names of a rank's phases (the wire's Phase, gradsync.proto), as the
 * coordinator's status and the agents' messages show them. */
#ifndef GS_PHASE_H
#define GS_PHASE_H

#include <stdint.h>

/* "idle", "data", "compute", "allreduce", "optimizer", "checkpoint",
 * "sync"; "unknown" for anything else. */
const char *gs_phase_name(uint32_t phase);

#endif
