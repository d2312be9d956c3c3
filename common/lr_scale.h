/* The operator's learning-rate scale (POST /jobs/NAME/control
 * {"lr_scale": x}, Directives.lr_scale): every parameter group's lr is
 * multiplied by it, on top of the script's own schedule. Its bounds and
 * its reading from the wire, for the coordinator and the agents alike. */
#ifndef GS_LR_SCALE_H
#define GS_LR_SCALE_H

#include <stdbool.h>

#define GS_LR_SCALE_MAX 1000.0

/* Whether x is a scale to accept: finite, above 0, at most GS_LR_SCALE_MAX. */
bool gs_lr_scale_valid(double x);

/* A scale as the wire carries it: 0 (unset, an older peer) or anything not
 * valid reads as 1. */
float gs_lr_scale_or_one(float x);

#endif
