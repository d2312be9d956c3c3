/* The reference trainer: an MLP on Fashion-MNIST, trained data-parallel
 * through the sync engine. Train, validation and test steps are separate
 * functions (as MMEngine's); the loop around them prints progress at a
 * steady rate and a final summary. */
#ifndef GS_TRAINER_H
#define GS_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include <gradsync/engine.h>

#include "faults.h"

#define GS_TRAINER_MAX_LAYERS 16

typedef struct gs_trainer_config {
  gs_engine_config_t engine; /* engine.dev is opened by the trainer */
  char device[16];           /* "cpu", "cuda" or "auto" (cuda when a GPU is visible) */
  int gpu;                   /* GPU index; -1: the local rank modulo the GPUs visible */
  uint32_t local_world;      /* ranks on this machine (0: unknown); see device_choice.h */
  uint32_t layers[GS_TRAINER_MAX_LAYERS];
  uint32_t nlayers;
  const char *data_dir;
  uint32_t batch;  /* per rank */
  uint64_t epochs; /* used when steps == 0 */
  uint64_t steps;  /* total steps; 0: epochs * steps per epoch */
  uint64_t seed;
  bool shuffle;
  uint64_t log_interval_ms; /* progress lines */
  bool validate;            /* a validation pass at each epoch end */
  const char *save_model;   /* rank 0 writes the trained params here (safetensors); NULL: not */
  gs_fault_t fault;         /* --inject-fault (tests, bench/hang_inject.sh) */
} gs_trainer_config_t;

/* Trains; returns 0 when training finished or was stopped cleanly, else a
 * negative GS_E* code after printing what went wrong. */
int gs_trainer_run(const gs_trainer_config_t *cfg);

#endif
