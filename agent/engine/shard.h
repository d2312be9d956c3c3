/* Sharded optimizer state's bookkeeping, owned by shard.c (the windows,
 * the whole state assembled) and reshard.c (the state through an elastic
 * regroup). Other files of the engine reach it through the functions
 * declared with it in engine_internal.h. */
#ifndef GS_ENGINE_SHARD_H
#define GS_ENGINE_SHARD_H

#include <stdint.h>

typedef struct engine_shard {
  /* The rank and world the windows were cut for. */
  uint32_t rank, world;
  /* The step whose reduced gradients the windows hold (a regroup may
   * catch up on its update). */
  uint64_t reduced;
  /* In an elastic job, the step whose update was queued and whose
   * readback was not yet taken (0: none), that update's gate values
   * (skip, veto, factor: 3 floats of device memory, copied at the
   * update) and what gated it (skip asked, grads scaled, a veto, a
   * factor: bits 0-3). */
  uint64_t untaken;
  float *gates;
  uint32_t gate_flags;
  /* Every pack's whole state, while assembled (NULL: not). */
  float **full_state;
} engine_shard_t;

#endif
