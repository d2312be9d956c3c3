/* SGD with momentum and weight decay, PyTorch's semantics (torch.optim.SGD
 * with dampening 0), plus Detectron's per-parameter rules (bias LR
 * multiplier and bias weight decay) and a learning-rate schedule.
 *
 * Per element, with g the reduced gradient times `grad_scale`:
 *   d = g + wd * p
 *   buf = momentum * buf + d      (buf starts at 0, so step 1 gives buf = d)
 *   d = nesterov ? d + momentum * buf : buf
 *   p = p - lr * lr_mult * d
 * With momentum 0 there is no buffer: p -= lr * lr_mult * d. */
#ifndef GS_SGD_H
#define GS_SGD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum gs_lr_schedule {
  GS_LR_CONSTANT = 0,
  GS_LR_STEP,   /* lr * gamma^floor(step / step_size) */
  GS_LR_COSINE, /* lr * (1 + cos(pi * step / total_steps)) / 2 */
} gs_lr_schedule_t;

int gs_lr_schedule_parse(const char *s, gs_lr_schedule_t *out) GS_WARN_UNUSED;
const char *gs_lr_schedule_name(gs_lr_schedule_t s);

typedef struct gs_sgd_config {
  float lr;              /* base learning rate (default 0.05) */
  float momentum;        /* default 0.9 */
  float weight_decay;    /* default 5e-4 */
  bool nesterov;         /* needs momentum > 0 */
  float bias_lr_mult;    /* LR multiplier of biases (default 1; Detectron 2) */
  float bias_wd;         /* weight decay of biases (default: weight_decay; Detectron 0) */
  uint64_t warmup_steps; /* linear warmup from warmup_factor * lr (default 0) */
  float warmup_factor;   /* default 1/3, as Detectron */
  gs_lr_schedule_t schedule;
  uint64_t step_size;   /* GS_LR_STEP */
  float gamma;          /* GS_LR_STEP, default 0.1 */
  uint64_t total_steps; /* GS_LR_COSINE */
} gs_sgd_config_t;

/* The defaults above. */
void gs_sgd_config_default(gs_sgd_config_t *c);

/* GS_EINVAL with a reason for nonsense (negative lr or decay, momentum
 * outside [0, 1), nesterov without momentum, a step schedule without
 * step_size, ...). */
int gs_sgd_config_check(const gs_sgd_config_t *c, char *why, size_t why_len) GS_WARN_UNUSED;

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
