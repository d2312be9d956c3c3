/* See fd_budget.h. */
#include "fd_budget.h"

gs_fd_budget_t gs__fd_budget(uint64_t nofile, uint32_t rpc, uint32_t http)
{
  /* Below 2 * GS_FD_OTHERS the reserve cannot be kept: half goes to the
   * ports, and the result is said not to fit. */
  uint64_t avail = nofile > 2 * GS_FD_OTHERS ? nofile - GS_FD_OTHERS : nofile / 2;
  gs_fd_budget_t b = {.rpc = rpc, .http = http};

  if (!b.http) {
    uint64_t share = nofile / GS_FD_HTTP_SHARE;

    b.http = share < 1 ? 1 : share > GS_FD_HTTP_MAX ? GS_FD_HTTP_MAX : (uint32_t)share;
  }
  /* Agents come first: an HTTP cap set past half of it leaves RPC half. */
  if (!b.rpc) {
    uint64_t left = avail > 2 * (uint64_t)b.http ? avail - b.http : avail - avail / 2;

    b.rpc = left < 1 ? 1 : left > GS_FD_CONN_MAX ? GS_FD_CONN_MAX : (uint32_t)left;
  }
  b.fits = nofile >= GS_FD_OTHERS && (uint64_t)b.rpc + b.http <= nofile - GS_FD_OTHERS;
  return b;
}
