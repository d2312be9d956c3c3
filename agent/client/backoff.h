/* Redial pacing for the coordinator client: exponential backoff with
 * jitter, 100 ms doubling to 5 s, each delay +-25% so that agents that lost
 * the coordinator together do not come back together. */
#ifndef GS_BACKOFF_H
#define GS_BACKOFF_H

#include <stdint.h>

#include "error.h"

#define GS_BACKOFF_MIN_MS 100u
#define GS_BACKOFF_MAX_MS 5000u

typedef struct gs_backoff {
  uint64_t rng;     /* splitmix64 state for the jitter */
  uint32_t ms;      /* delay before the next redial after a failure */
  uint64_t next_ms; /* no dial before this time (CLOCK_MONOTONIC ms) */
} gs_backoff_t;

/* Starts at the shortest delay, nothing to wait for; `seed` should differ
 * between processes. */
void gs__backoff_init(gs_backoff_t *b, uint64_t seed);

/* A connection worked: the next failure waits the shortest delay again. */
void gs__backoff_reset(gs_backoff_t *b);

/* A dial or connection failed at `now_ms`: the next redial waits the
 * current delay +-25%, and the delay doubles up to its cap. */
void gs__backoff_failed(gs_backoff_t *b, uint64_t now_ms);

#endif
