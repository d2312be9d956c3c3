/* The sharded sampler: which examples each rank trains on at each step.
 *
 * Each epoch the indices 0..count-1 are shuffled with a generator seeded by
 * (seed, epoch) (identity order with shuffle off), then cut into global
 * batches of world_size * batch examples (a trailing partial global batch is
 * dropped, so every rank runs the same number of steps). Rank r takes
 * examples [r*batch, (r+1)*batch) of each global batch. Hence world size W
 * with batch b sees, step by step, exactly the examples one rank with batch
 * W*b sees: the basis of the equivalence test. When the world changes
 * mid-epoch (elastic jobs) the order stays and global batches of the new
 * size are cut from where the last one ended. */
#ifndef GS_SAMPLER_H
#define GS_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "rng.h"

typedef struct gs_sampler {
  uint32_t count, batch, rank, world_size;
  uint64_t seed;
  bool shuffle;
  uint64_t epoch; /* the epoch `perm` is for */
  uint32_t *perm; /* count indices */
} gs_sampler_t;

/* GS_EINVAL if batch or world_size is 0, rank >= world_size, or one global
 * batch does not fit in `count`. Free with gs_sampler_free. */
int gs_sampler_init(gs_sampler_t *s, uint32_t count, uint32_t batch, uint32_t rank,
                    uint32_t world_size, uint64_t seed, bool shuffle) GS_WARN_UNUSED;
void gs_sampler_free(gs_sampler_t *s);

/* Steps per epoch: count / (world_size * batch). */
uint32_t gs_sampler_steps_per_epoch(const gs_sampler_t *s);

/* Makes `epoch` current (reshuffles when it changes). */
void gs_sampler_set_epoch(gs_sampler_t *s, uint64_t epoch);

/* This rank's `batch` example indices for step `step` (0-based, within the
 * current epoch; step < steps_per_epoch). Points into the sampler. */
const uint32_t *gs_sampler_batch(const gs_sampler_t *s, uint32_t step);

/* The same for the global batch that starts at example `sample` of the
 * current epoch's order: NULL when a whole global batch no longer fits
 * (the epoch is done). Steps 0, 1, ... start at 0, world*batch, ... */
const uint32_t *gs_sampler_batch_at(const gs_sampler_t *s, uint64_t sample);

/* Re-shards for another world (an elastic regroup): the epoch's order
 * stays, and the next global batch is cut from where the last one ended,
 * so no example of the epoch is skipped or repeated. GS_EINVAL when one
 * global batch no longer fits in `count`. */
int gs_sampler_set_world(gs_sampler_t *s, uint32_t rank, uint32_t world_size) GS_WARN_UNUSED;

#endif
