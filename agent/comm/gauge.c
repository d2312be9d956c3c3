/* The comm gauge's send wait (comm.h): the comm thread marks a wait's
 * begin and end, the heartbeat thread reads the total at any moment. */
#include "comm.h"

#include <stdatomic.h>

void gs_comm_gauge_wait_begin(gs_comm_gauge_t *g, uint64_t now_ns)
{
  atomic_store_explicit(&g->send_wait_since_ns, now_ns ? now_ns : 1, memory_order_relaxed);
}

/* The begin mark is cleared before the total grows (release): a reader
 * that sees the grown total (acquire) sees the mark cleared, so it never
 * counts one wait twice. */
void gs_comm_gauge_wait_end(gs_comm_gauge_t *g, uint64_t now_ns)
{
  uint64_t since = atomic_load_explicit(&g->send_wait_since_ns, memory_order_relaxed);

  atomic_store_explicit(&g->send_wait_since_ns, 0, memory_order_relaxed);
  if (since && now_ns > since)
    atomic_fetch_add_explicit(&g->send_wait_ns, now_ns - since, memory_order_release);
}

uint64_t gs_comm_gauge_send_wait_ns(gs_comm_gauge_t *g, uint64_t now_ns, uint64_t floor)
{
  uint64_t total = atomic_load_explicit(&g->send_wait_ns, memory_order_acquire);
  uint64_t since = atomic_load_explicit(&g->send_wait_since_ns, memory_order_relaxed);

  if (since && now_ns > since)
    total += now_ns - since;
  return total > floor ? total : floor;
}
