/* The operator's lr scale (see lr_scale.h). */
#include "lr_scale.h"

#include <math.h>

bool gs_lr_scale_valid(double x)
{
  return isfinite(x) && x > 0.0 && x <= GS_LR_SCALE_MAX;
}

float gs_lr_scale_or_one(float x)
{
  return gs_lr_scale_valid(x) ? x : 1.0f;
}
