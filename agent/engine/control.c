/* The control vector's encoding (see control.h). */
#include "control.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "lr_scale.h"

size_t gs_control_len(uint32_t world_size)
{
  return GS_CTL_FIXED + ((size_t)world_size + GS_CTL_RANKS_PER_SLOT - 1) / GS_CTL_RANKS_PER_SLOT;
}

void gs_control_nonfinite_at(uint32_t rank, size_t n, uint32_t *i, uint32_t *j, float *w)
{
  size_t slot = GS_CTL_FIXED + rank / GS_CTL_RANKS_PER_SLOT;

  *i = GS_CTL_NONFINITE;
  *j = slot < n ? (uint32_t)slot : (uint32_t)n;
  *w = (float)(1u << (rank % GS_CTL_RANKS_PER_SLOT));
}

void gs_control_encode(const gs_control_local_t *in, float *v, size_t n)
{
  uint32_t i, j;
  float w;

  memset(v, 0, n * sizeof(float));
  if (n < GS_CTL_FIXED)
    return;
  v[GS_CTL_STOP] = in->stop;
  if (in->set_period && in->period >= -1 && in->period < GS_CTL_PERIOD_MAX)
    v[GS_CTL_PERIOD] = (float)(in->period + 2);
  v[GS_CTL_BROADCAST] = in->broadcast;
  v[GS_CTL_CHECKPOINT] = in->checkpoint;
  v[GS_CTL_REGROUP] = in->regroup;
  /* Adding the other ranks' zeros leaves rank 0's float as it is. */
  if (in->set_lr_scale && gs_lr_scale_valid(in->lr_scale))
    v[GS_CTL_LR_SCALE] = in->lr_scale;
  v[GS_CTL_TERM] = in->term;
  v[GS_CTL_STEP] = (float)(in->step % GS_CTL_SEQ_MOD);
  v[GS_CTL_SEQ] = (float)(in->collectives % GS_CTL_SEQ_MOD);
  gs_control_nonfinite_at(in->rank, n, &i, &j, &w);
  if (in->nonfinite) {
    v[i] = 1;
    if (j < n)
      v[j] = w;
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
  out->regroup = v[GS_CTL_REGROUP] > 0;
  out->lr_scale_changed = gs_lr_scale_valid(v[GS_CTL_LR_SCALE]);
  out->lr_scale = out->lr_scale_changed ? v[GS_CTL_LR_SCALE] : 0.0f;
  out->nonfinite = v[GS_CTL_NONFINITE] > 0;
}

int gs_control_check(const float *v, size_t n, const gs_control_local_t *mine, uint32_t world,
                     char *why, size_t why_len)
{
  float step = (float)((double)world * (double)(mine->step % GS_CTL_SEQ_MOD));
  float seq = (float)((double)world * (double)(mine->collectives % GS_CTL_SEQ_MOD));

  if (n < GS_CTL_FIXED || world > GS_CTL_CHECK_MAX_WORLD)
    return 0;
  if (v[GS_CTL_STEP] != step) {
    snprintf(why, why_len,
             "the ranks are not at the same step: the step check summed to %g where %" PRIu32
             " ranks at this rank's step (%" PRIu64 " mod %u) give %g; a rank skipped or "
             "repeated a step, or the control vector was summed with other data",
             v[GS_CTL_STEP], world, mine->step % GS_CTL_SEQ_MOD, GS_CTL_SEQ_MOD, step);
    return GS_EPROTO;
  }
  if (v[GS_CTL_SEQ] != seq) {
    snprintf(why, why_len,
             "the ranks ran different numbers of collectives: the check summed to %g where %" PRIu32
             " ranks with this rank's count (%" PRIu64 " mod %u) give %g; a collective (a metric "
             "allreduce, a broadcast) ran on some ranks only, so buffers were summed with the "
             "wrong partners",
             v[GS_CTL_SEQ], world, mine->collectives % GS_CTL_SEQ_MOD, GS_CTL_SEQ_MOD, seq);
    return GS_EPROTO;
  }
  return 0;
}

bool gs_control_rank_nonfinite(const float *v, size_t n, uint32_t rank)
{
  size_t slot = GS_CTL_FIXED + rank / GS_CTL_RANKS_PER_SLOT;

  if (slot >= n)
    return false;
  return ((uint32_t)v[slot] >> (rank % GS_CTL_RANKS_PER_SLOT)) & 1u;
}
