/* The sharded sampler: every rank computes the same permutation from
 * (seed, epoch) and takes its own slice of each global batch, so no rank
 * needs to talk to another about data. */
#include "sampler.h"

#include <stdlib.h>
#include <string.h>

/* Fills `perm` for `epoch`: identity, then Fisher-Yates when shuffling,
 * with a generator that depends on the seed and the epoch only. */
static void reshuffle(gs_sampler_t *s, uint64_t epoch)
{
  gs_rng_t rng;
  uint32_t i, j, t;

  s->epoch = epoch;
  for (i = 0; i < s->count; i++)
    s->perm[i] = i;
  if (!s->shuffle)
    return;
  gs_rng_seed(&rng, gs_mix64(s->seed ^ (epoch * GS_GOLDEN_GAMMA)));
  for (i = s->count - 1; i > 0; i--) {
    j = gs_rng_below(&rng, i + 1);
    t = s->perm[i];
    s->perm[i] = s->perm[j];
    s->perm[j] = t;
  }
}

int gs_sampler_init(gs_sampler_t *s, uint32_t count, uint32_t batch, uint32_t rank,
                    uint32_t world_size, uint64_t seed, bool shuffle)
{
  memset(s, 0, sizeof(*s));
  if (batch == 0 || world_size == 0 || rank >= world_size)
    return GS_EINVAL;
  if ((uint64_t)batch * world_size > count)
    return GS_EINVAL;
  s->perm = malloc((size_t)count * sizeof(*s->perm));
  if (!s->perm)
    return GS_ENOMEM;
  s->count = count;
  s->batch = batch;
  s->rank = rank;
  s->world_size = world_size;
  s->seed = seed;
  s->shuffle = shuffle;
  reshuffle(s, 0);
  return 0;
}

void gs_sampler_free(gs_sampler_t *s)
{
  free(s->perm);
  memset(s, 0, sizeof(*s));
}

uint32_t gs_sampler_steps_per_epoch(const gs_sampler_t *s)
{
  return s->count / (s->world_size * s->batch);
}

void gs_sampler_set_epoch(gs_sampler_t *s, uint64_t epoch)
{
  if (epoch != s->epoch)
    reshuffle(s, epoch);
}

/* Returns NULL for a step past the epoch rather than a pointer past `perm`. */
const uint32_t *gs_sampler_batch(const gs_sampler_t *s, uint32_t step)
{
  return gs_sampler_batch_at(s, (uint64_t)step * s->world_size * s->batch);
}

const uint32_t *gs_sampler_batch_at(const gs_sampler_t *s, uint64_t sample)
{
  if (sample + (uint64_t)s->world_size * s->batch > s->count)
    return NULL;
  return s->perm + sample + (size_t)s->rank * s->batch;
}

int gs_sampler_set_world(gs_sampler_t *s, uint32_t rank, uint32_t world_size)
{
  if (world_size == 0 || rank >= world_size || (uint64_t)s->batch * world_size > s->count)
    return GS_EINVAL;
  s->rank = rank;
  s->world_size = world_size;
  return 0;
}
