/* One memory budget (--max-memory) for everything the coordinator holds
 * for its clients, counted by each layer as it takes and gives back
 * bytes: the RPC connections' buffers (conn.c), the HTTP port's replies
 * waiting to be written and requests held (http_server.c), what the jobs
 * store, their blobs and pack lists (job_store.c), and their members,
 * ranks and parked Joins (job.c). Its owner (coordinator.c) holds it
 * and hands it to each layer, which borrow it; none sees another
 * through it. Counting only, on the loop's thread. */
#ifndef GS_MEM_BUDGET_H
#define GS_MEM_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

/* What the jobs may store is at most this part of the budget (a
 * quarter): whatever one job or tenant publishes, the connections keep
 * room for heartbeats and replies. */
#define GS_MEM_STORED_SHARE 4
/* And their members (ranks, and Joins parked until their rendezvous):
 * another quarter, so that Joins parked on a node agent's 255 slots per
 * connection cannot fill the rest either. */
#define GS_MEM_MEMBERS_SHARE 4

typedef struct gs_mem_budget {
  size_t max;         /* everything together (--max-memory) */
  size_t used;        /* held now: connections and store */
  size_t stored;      /* of it, the jobs' blobs and pack lists */
  size_t http;        /* and the HTTP port's (each connection held at its share) */
  size_t stored_max;  /* what they may hold: max / GS_MEM_STORED_SHARE */
  size_t members;     /* of it, the jobs' members */
  size_t members_max; /* what they may hold: max / GS_MEM_MEMBERS_SHARE */
  /* The most `used` has been since its owner last handed freed memory
   * back to the system (coordinator.c release_memory), which resets it. */
  size_t peak;
} gs_mem_budget_t;

/* An empty budget of `max` bytes. */
void gs_mem_budget_init(gs_mem_budget_t *b, size_t max);
/* Everything together holds `add` bytes more and `sub` fewer (`sub` never
 * passes what was counted before); the peak follows. */
void gs_mem_budget_hold(gs_mem_budget_t *b, size_t add, size_t sub);
/* Whether `n` more stored bytes fit, in the stored share and the whole. */
bool gs_mem_budget_store_fits(const gs_mem_budget_t *b, size_t n);
/* The store holds `add` bytes more and `sub` fewer (counted in `used`
 * too); `sub` never passes what it counted before. */
void gs_mem_budget_store(gs_mem_budget_t *b, size_t add, size_t sub);
/* The same for the members' part. */
bool gs_mem_budget_members_fit(const gs_mem_budget_t *b, size_t n);
void gs_mem_budget_members(gs_mem_budget_t *b, size_t add, size_t sub);

#endif
