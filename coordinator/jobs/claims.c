/* The claims hash set (see claims.h). */
#include "claims.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "job.h"
#include "rng.h"

/* FNV-1a over the node name, then the local rank mixed in. */
static uint32_t claim_hash(const char *node, uint32_t local_rank)
{
  return (uint32_t)gs_mix64(gs_fnv1a64(GS_FNV1A64_SEED, node, strlen(node)) ^ local_rank);
}

static uint32_t home_of(const gs_claims_t *c, const gs_member_t *m)
{
  return claim_hash(m->req.node, m->req.local_rank) & c->mask;
}

static void insert(gs_claims_t *c, gs_member_t *m)
{
  uint32_t i = home_of(c, m);

  while (c->slot[i])
    i = (i + 1) & c->mask;
  c->slot[i] = m;
  c->count++;
}

bool gs__claims_reserve(gs_claims_t *c, uint32_t n)
{
  uint32_t size = 16, old_size = c->slot ? c->mask + 1 : 0;
  gs_claims_t grown = {0};

  while (size < 2 * (uint64_t)n)
    size *= 2;
  if (size <= old_size)
    return true;
  grown.slot = calloc(size, sizeof(*grown.slot));
  if (!grown.slot)
    return false;
  grown.mask = size - 1;
  for (uint32_t i = 0; i < old_size; i++)
    if (c->slot[i])
      insert(&grown, c->slot[i]);
  free(c->slot);
  *c = grown;
  return true;
}

gs_member_t *gs__claims_find(const gs_claims_t *c, const char *node, uint32_t local_rank)
{
  uint32_t i;

  if (!c->slot)
    return NULL;
  for (i = claim_hash(node, local_rank) & c->mask; c->slot[i]; i = (i + 1) & c->mask) {
    const gs_member_t *m = c->slot[i];

    if (m->req.local_rank == local_rank && strcmp(m->req.node, node) == 0)
      return c->slot[i];
  }
  return NULL;
}

void gs__claims_add(gs_claims_t *c, gs_member_t *m)
{
  insert(c, m);
}

/* Whether `home` lies cyclically in (hole, at]: then the entry at `at`
 * may not move back into the hole. */
static bool stays(uint32_t hole, uint32_t at, uint32_t home)
{
  return hole <= at ? hole < home && home <= at : hole < home || home <= at;
}

void gs__claims_remove(gs_claims_t *c, const gs_member_t *m)
{
  uint32_t hole, at;

  if (!c->slot)
    return;
  for (hole = home_of(c, m); c->slot[hole] != m; hole = (hole + 1) & c->mask)
    if (!c->slot[hole])
      return;
  c->slot[hole] = NULL;
  c->count--;
  /* Backward shift: entries after the hole whose probe passed it move in. */
  for (at = (hole + 1) & c->mask; c->slot[at]; at = (at + 1) & c->mask) {
    if (stays(hole, at, home_of(c, c->slot[at])))
      continue;
    c->slot[hole] = c->slot[at];
    c->slot[at] = NULL;
    hole = at;
  }
}

void gs__claims_free(gs_claims_t *c)
{
  free(c->slot);
  memset(c, 0, sizeof(*c));
}
