/* Redial pacing for the coordinator client (see backoff.h). */
#include "backoff.h"

#include "rng.h"

void gs__backoff_init(gs_backoff_t *b, uint64_t seed)
{
  b->rng = seed;
  b->ms = GS_BACKOFF_MIN_MS;
  b->next_ms = 0;
}

void gs__backoff_reset(gs_backoff_t *b)
{
  b->ms = GS_BACKOFF_MIN_MS;
}

void gs__backoff_failed(gs_backoff_t *b, uint64_t now_ms)
{
  uint32_t ms = b->ms, span = ms / 2;

  b->next_ms = now_ms + ms - ms / 4 + gs_splitmix64(&b->rng) % (span + 1);
  b->ms = ms * 2 < GS_BACKOFF_MAX_MS ? ms * 2 : GS_BACKOFF_MAX_MS;
}
