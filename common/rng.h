/* The project's one pseudo-random generator, splitmix64 (Vigna): small,
 * fast and seedable, so every rank and every run draw the same numbers bit
 * for bit (shuffles, initialisation) and a per-object state keeps unrelated
 * streams apart (backoff jitter) without touching rand()'s global state. */
#ifndef GS_RNG_H
#define GS_RNG_H

#include <stdint.h>

/* 2^64 / phi: splitmix64's increment, also a good odd constant for mixing
 * counters into seeds. */
#define GS_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

/* Advances `state` and returns its next 64 random bits. */
uint64_t gs_splitmix64(uint64_t *state);

/* splitmix64's output function alone: a bijective 64-bit mixer (for
 * deriving a seed from several inputs). */
uint64_t gs_mix64(uint64_t z);

typedef struct gs_rng {
  uint64_t state;
} gs_rng_t;

void gs_rng_seed(gs_rng_t *r, uint64_t seed);
uint64_t gs_rng_next(gs_rng_t *r);
/* Uniform in [0, 1) with 24 random bits. */
float gs_rng_uniform(gs_rng_t *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint32_t gs_rng_below(gs_rng_t *r, uint32_t n);

#endif
