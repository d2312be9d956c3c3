/* SGD with momentum and weight decay, PyTorch's semantics (torch.optim.SGD
 * with dampening 0), plus Detectron's per-parameter rules (bias LR
 * multiplier and bias weight decay) and a learning-rate schedule.
 *
 * Per element, with g the reduced gradient times `grad_scale`:
 *   d = g + wd * p
 *   buf = momentum * buf + d      (buf starts at 0, so step 1 gives buf = d)
 *   d = nesterov ? d + momentum * buf : buf
 *   p = p - lr * lr_mult * d
 * With momentum 0 there is no buffer: p -= lr * lr_mult * d.
 *
 * The config type, its defaults, check and the schedule names are public
 * (gradsync/engine.h): they are part of the engine's configuration. */
#ifndef GS_SGD_H
#define GS_SGD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h>

#include "error.h"

/* The learning rate of 0-based step `step`: warmup, then the schedule
 * (which counts from step 0, as Detectron). */
float gs_sgd_lr(const gs_sgd_config_t *c, uint64_t step);

/* A run of elements of one pack sharing LR multiplier and decay (one
 * parameter tensor). */
typedef struct gs_sgd_segment {
  size_t offset, count;
  float lr_mult;
  float weight_decay;
} gs_sgd_segment_t;

/* One fused loop over a pack's contiguous params, grads and momentum. */
void gs_sgd_step_pack(const gs_sgd_config_t *c, float lr, float grad_scale,
                      const gs_sgd_segment_t *segs, uint32_t nseg, float *param, const float *grad,
                      float *momentum);

#endif
