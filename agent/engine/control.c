/* The control vector's encoding (see control.h). */
#include "control.h"

#include <string.h>

size_t gs_control_len(uint32_t world_size)
{
  return GS_CTL_FIXED + ((size_t)world_size + GS_CTL_RANKS_PER_SLOT - 1) / GS_CTL_RANKS_PER_SLOT;
}

void gs_control_encode(const gs_control_local_t *in, float *v, size_t n)
{
  size_t slot = GS_CTL_FIXED + in->rank / GS_CTL_RANKS_PER_SLOT;

  memset(v, 0, n * sizeof(float));
  if (n < GS_CTL_FIXED)
    return;
  v[GS_CTL_STOP] = in->stop;
  if (in->set_period && in->period >= -1 && in->period < GS_CTL_PERIOD_MAX)
    v[GS_CTL_PERIOD] = (float)(in->period + 2);
  v[GS_CTL_BROADCAST] = in->broadcast;
  v[GS_CTL_CHECKPOINT] = in->checkpoint;
  v[GS_CTL_TERM] = in->term;
  if (in->nonfinite) {
    v[GS_CTL_NONFINITE] = 1;
    if (slot < n)
      v[slot] = (float)(1u << (in->rank % GS_CTL_RANKS_PER_SLOT));
  }
}

void gs_control_decode(const float *v, size_t n, gs_control_t *out)
{
  memset(out, 0, sizeof(*out));
  if (n < GS_CTL_FIXED)
    return;
  out->stop = v[GS_CTL_STOP] > 0;
  out->term = v[GS_CTL_TERM] > 0;
  out->period_changed = v[GS_CTL_PERIOD] > 0;
  out->period = out->period_changed ? (int32_t)v[GS_CTL_PERIOD] - 2 : 0;
  out->broadcast = v[GS_CTL_BROADCAST] > 0;
  out->checkpoint = v[GS_CTL_CHECKPOINT] > 0;
  out->nonfinite = v[GS_CTL_NONFINITE] > 0;
}

bool gs_control_rank_nonfinite(const float *v, size_t n, uint32_t rank)
{
  size_t slot = GS_CTL_FIXED + rank / GS_CTL_RANKS_PER_SLOT;

  if (slot >= n)
    return false;
  return ((uint32_t)v[slot] >> (rank % GS_CTL_RANKS_PER_SLOT)) & 1u;
}
