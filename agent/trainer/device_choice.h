/* Which device gradsync-agent trains on: a pure function of the flags and
 * of what the process sees (the GPUs visible, CUDA_VISIBLE_DEVICES,
 * LOCAL_WORLD_SIZE), so every case is tested without a GPU
 * (tests/test_device_choice.c). */
#ifndef GS_DEVICE_CHOICE_H
#define GS_DEVICE_CHOICE_H

#include <stdbool.h>
#include <stdint.h>

/* What decides the device. */
typedef struct gs_device_env {
  const char *device;               /* --device: "cpu", "cuda" or "auto" */
  int gpu;                          /* --gpu; -1: chosen here */
  bool cuda_built;                  /* this build has CUDA */
  int visible;                      /* GPUs this process sees */
  const char *cuda_visible_devices; /* $CUDA_VISIBLE_DEVICES; NULL when unset */
  /* $GRADSYNC_RUN_CUDA_VISIBLE_DEVICES: the CUDA_VISIBLE_DEVICES that
   * gradsync-run handed every rank alike (NULL: not started by it, or it
   * had none). A list equal to it is shared, not this process's own. */
  const char *launcher_cuda_visible_devices;
  uint32_t local_world; /* ranks on this machine ($LOCAL_WORLD_SIZE); 0: unknown */
  uint32_t local_rank;
} gs_device_env_t;

/* The choice, and why, for the log. */
typedef struct gs_device_choice {
  const char *name; /* "cpu" or "cuda" (static) */
  int gpu;          /* the GPU on cuda (0 on cpu) */
  /* auto fell back to cpu where the user can expect a GPU (GPUs visible
   * but too few, or CUDA_VISIBLE_DEVICES naming GPUs that are not):
   * say so loudly. No GPU at all is the normal cpu case, not a warning. */
  bool warn;
  char reason[320];
} gs_device_choice_t;

/* The number of entries of a CUDA_VISIBLE_DEVICES value ("" hides every
 * GPU: 0). */
uint32_t gs_cuda_visible_count(const char *list);

/* Picks the device. `auto` takes cuda when the build has CUDA, a GPU is
 * visible and the ranks of this machine have a GPU each: either there
 * are at least LOCAL_WORLD_SIZE GPUs to share out (GPU local_rank mod
 * visible), or CUDA_VISIBLE_DEVICES names exactly the one GPU this
 * process sees, as schedulers that give each task its own GPU set it
 * (SLURM --gpus-per-task=1, a Kubernetes pod per rank): that GPU is this
 * rank's (unless it is the list gradsync-run gave every rank alike).
 * Otherwise cpu, with `warn` when GPUs are there but cannot serve every
 * rank, or CUDA_VISIBLE_DEVICES names GPUs none of which is visible. */
void gs_device_choose(const gs_device_env_t *env, gs_device_choice_t *out);

#endif
