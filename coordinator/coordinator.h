/* gradsync-coordinator as a library: the control-plane service on a libuv
 * loop the caller owns. main.c is a thin shell around this; tests run it
 * in-process the same way. */
#ifndef GS_COORDINATOR_H
#define GS_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "error.h"
#include "log.h"
#include "tls.h"

typedef struct gs_coord gs_coord_t;

/* Fills in the defaults (":7070", ":8080", 1s heartbeats, 10s timeout, ...). */
void gs_coord_config_defaults(gs_coord_config_t *cfg);

/* Creates the service on `loop`; NULL (reason logged) on failure.
 * Free with gs_coord_close. */
gs_coord_t *gs_coord_new(uv_loop_t *loop, const gs_coord_config_t *cfg);

/* Binds both listeners and starts the housekeeping timer. */
int gs_coord_start(gs_coord_t *c) GS_WARN_UNUSED;

/* Bound ports, after gs_coord_start. */
uint16_t gs_coord_rpc_port(const gs_coord_t *c);
uint16_t gs_coord_http_port(const gs_coord_t *c);

/* Closes every handle; memory is freed in the last close callback, so the
 * caller keeps running the loop until it has nothing left. */
void gs_coord_close(gs_coord_t *c);

#endif
