/* The (node, local_rank) claims of a rendezvous: a hash set of its waiting
 * members keyed by the device they claim, so a Join that claims a taken
 * one is refused in O(1) and a rendezvous of n ranks costs O(n), not
 * O(n^2) (at 65,536 ranks a scan per Join would hold the loop for
 * seconds). Open addressing with linear probing and backward-shift
 * deletion: no tombstones, no allocation but the table's. */
#ifndef GS_CLAIMS_H
#define GS_CLAIMS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gs_member gs_member_t;

typedef struct gs_claims {
  gs_member_t **slot; /* mask + 1 entries; NULL: free */
  uint32_t mask;
  uint32_t count;
} gs_claims_t;

/* Room for `n` claims at a load of at most one half; the claims already
 * held are kept. False when out of memory (the set is unchanged). */
bool gs__claims_reserve(gs_claims_t *c, uint32_t n);

/* The member claiming (node, local_rank), or NULL. */
gs_member_t *gs__claims_find(const gs_claims_t *c, const char *node, uint32_t local_rank);

/* Adds `m` (its req.node, req.local_rank), which claims nothing taken;
 * room was reserved. */
void gs__claims_add(gs_claims_t *c, gs_member_t *m);

/* Removes `m` if it is in the set. */
void gs__claims_remove(gs_claims_t *c, const gs_member_t *m);

/* Empties the set and frees its table. */
void gs__claims_free(gs_claims_t *c);

#endif
