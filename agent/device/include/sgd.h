/* The engine's SGD settings: PyTorch's SGD (dampening 0) plus
 * Detectron's per-parameter rules (bias LR multiplier and bias weight
 * decay) and a learning-rate schedule. The engine turns them into
 * parameter groups (optim.h does the arithmetic): weights at lr, biases
 * at lr * bias_lr_mult with bias_wd.
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

#endif
