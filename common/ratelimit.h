/* Log rate limiting: a peer that repeats one mistake thousands of times a
 * second must not write thousands of lines (5 million in 45 s, once). A
 * few lines pass per window; the first line of the next window says how
 * many were held back. Pure: the caller passes the clock. */
#ifndef GS_RATELIMIT_H
#define GS_RATELIMIT_H

#include <stdbool.h>
#include <stdint.h>

#define GS_RATELIMIT_BURST 5          /* lines per window */
#define GS_RATELIMIT_WINDOW_MS 10000u /* window length */

typedef struct gs_ratelimit {
  uint64_t window_start_ms;
  uint32_t in_window;  /* lines passed in this window */
  uint32_t suppressed; /* lines held back since the last one passed */
} gs_ratelimit_t;

/* Whether a line may be written at `now_ms`; when it may, *suppressed is
 * the number held back before it (then reset). A zeroed struct is ready. */
bool gs_ratelimit_allow(gs_ratelimit_t *rl, uint64_t now_ms, uint32_t *suppressed);

#endif
