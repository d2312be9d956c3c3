#include "rng.h"

uint64_t gs_mix64(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t gs_splitmix64(uint64_t *state)
{
  *state += GS_GOLDEN_GAMMA;
  return gs_mix64(*state);
}

void gs_rng_seed(gs_rng_t *r, uint64_t seed)
{
  r->state = seed;
}

uint64_t gs_rng_next(gs_rng_t *r)
{
  return gs_splitmix64(&r->state);
}

float gs_rng_uniform(gs_rng_t *r)
{
  return (float)(gs_rng_next(r) >> 40) * 0x1p-24f;
}

/* Lemire's multiply-and-reject: the high half of a 32x32 product, with the
 * few low halves that would bias it redrawn. */
uint32_t gs_rng_below(gs_rng_t *r, uint32_t n)
{
  uint64_t m;
  uint32_t threshold;

  if (n == 0)
    return 0;
  m = (gs_rng_next(r) >> 32) * n;
  if ((uint32_t)m < n) {
    threshold = -n % n; /* 2^32 mod n */
    while ((uint32_t)m < threshold)
      m = (gs_rng_next(r) >> 32) * n;
  }
  return (uint32_t)(m >> 32);
}
