/* The engine's SGD settings (the trainer's flags) and the learning-rate
 * schedule (linear warmup, then constant, step or cosine), as sgd.h
 * describes; the fused update itself is optim.c's. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parse.h"
#include "sgd.h"

static const char *const schedule_names[] = {
    [GS_LR_CONSTANT] = "constant",
    [GS_LR_STEP] = "step",
    [GS_LR_COSINE] = "cosine",
};

GS_DEFINE_ENUM_NAMES(gs_lr_schedule_parse, gs_lr_schedule_name, gs_lr_schedule_t, schedule_names)

void gs_sgd_config_default(gs_sgd_config_t *c)
{
  *c = (gs_sgd_config_t){
      .lr = 0.05f,
      .momentum = 0.9f,
      .weight_decay = 5e-4f,
      .nesterov = false,
      .bias_lr_mult = 1.0f,
      .bias_wd = 5e-4f,
      .warmup_steps = 0,
      .warmup_factor = 1.0f / 3.0f,
      .schedule = GS_LR_CONSTANT,
      .step_size = 0,
      .gamma = 0.1f,
      .total_steps = 0,
  };
}

/* Formats the reason into `why` (when given) and returns GS_EINVAL. */
static int reject(char *why, size_t why_len, const char *fmt, double value)
{
  if (why && why_len)
    snprintf(why, why_len, fmt, value);
  return GS_EINVAL;
}

/* True for a finite value >= 0 (false for NaN). */
static bool non_negative(float v)
{
  return isfinite(v) && v >= 0.0f;
}

int gs_sgd_config_check(const gs_sgd_config_t *c, char *why, size_t why_len)
{
  if (!non_negative(c->lr))
    return reject(why, why_len, "--lr must be a finite number >= 0 (got %g)", c->lr);
  if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
    return reject(why, why_len, "--momentum must be in [0, 1) (got %g)", c->momentum);
  if (!non_negative(c->weight_decay))
    return reject(why, why_len, "--weight-decay must be a finite number >= 0 (got %g)",
                  c->weight_decay);
  if (c->nesterov && c->momentum <= 0.0f)
    return reject(why, why_len, "--nesterov needs --momentum > 0 (got %g)", c->momentum);
  if (!non_negative(c->bias_lr_mult))
    return reject(why, why_len, "--bias-lr-mult must be a finite number >= 0 (got %g)",
                  c->bias_lr_mult);
  if (!non_negative(c->bias_wd))
    return reject(why, why_len, "--bias-wd must be a finite number >= 0 (got %g)", c->bias_wd);
  if (!(c->warmup_factor >= 0.0f && c->warmup_factor <= 1.0f))
    return reject(why, why_len, "--warmup-factor must be in [0, 1] (got %g)", c->warmup_factor);
  switch (c->schedule) {
  case GS_LR_CONSTANT:
    break;
  case GS_LR_STEP:
    if (c->step_size == 0)
      return reject(why, why_len, "--schedule step needs --lr-step-size (a step count > 0)", 0);
    if (!(c->gamma > 0.0f && c->gamma <= 1.0f))
      return reject(why, why_len, "--lr-gamma must be in (0, 1] (got %g)", c->gamma);
    break;
  case GS_LR_COSINE:
    if (c->total_steps == 0)
      return reject(why, why_len, "--schedule cosine needs the total step count (> 0)", 0);
    break;
  default:
    return reject(why, why_len, "--schedule: unknown schedule %g (constant, step or cosine)",
                  (double)c->schedule);
  }
  return 0;
}

/* The schedule's factor at `step`, before warmup; degenerate settings that
 * the config check rejects give 1. */
static double schedule_factor(const gs_sgd_config_t *c, uint64_t step)
{
  switch (c->schedule) {
  case GS_LR_STEP:
    if (c->step_size == 0)
      return 1.0;
    return pow(c->gamma, (double)(step / c->step_size));
  case GS_LR_COSINE:
    if (c->total_steps == 0)
      return 1.0;
    if (step >= c->total_steps)
      return 0.0;
    return (1.0 + cos(M_PI * (double)step / (double)c->total_steps)) / 2.0;
  default:
    return 1.0;
  }
}

float gs_sgd_lr(const gs_sgd_config_t *c, uint64_t step)
{
  double f = schedule_factor(c, step);

  if (step < c->warmup_steps) {
    double alpha = (double)step / (double)c->warmup_steps;

    f *= c->warmup_factor + (1.0 - c->warmup_factor) * alpha;
  }
  return (float)(c->lr * f);
}
