/* See ratelimit.h. */
#include "ratelimit.h"

bool gs_ratelimit_allow(gs_ratelimit_t *rl, uint64_t now_ms, uint32_t *suppressed)
{
  if (rl->in_window == 0 || now_ms - rl->window_start_ms >= GS_RATELIMIT_WINDOW_MS) {
    rl->window_start_ms = now_ms;
    rl->in_window = 0;
  }
  if (rl->in_window >= GS_RATELIMIT_BURST) {
    rl->suppressed++;
    return false;
  }
  rl->in_window++;
  *suppressed = rl->suppressed;
  rl->suppressed = 0;
  return true;
}
