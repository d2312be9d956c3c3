/* Whether every rank holds the same params and optimizer state, after a
 * regroup shared one: an FNV-1a 64 of each rank's (common/hash.h, as a
 * test recomputes it from a checkpoint: each pack's params, then each
 * state buffer, whole), compared in one small allreduce. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine_internal.h"
#include "hash.h"
#include "why.h"

/* Continues `h` over n floats of device memory (downloaded from a
 * device without host memory: a regroup, not a step). */
static int hash_floats(gs_engine_t *e, uint64_t *h, const float *src, size_t n)
{
  float *host = NULL;

  if (!e->cfg.dev->host_memory) {
    host = malloc(n * sizeof(float) + 1);
    if (!host || gs_device_download(e->cfg.dev, host, src, n * sizeof(float))) {
      free(host);
      return GS_ENOMEM;
    }
    src = host;
  }
  *h = gs_fnv1a64(*h, src, n * sizeof(float));
  free(host);
  return 0;
}

/* This rank's hash of every pack's params and state (whole: the state
 * assembled when sharded). */
static int state_hash(gs_engine_t *e, uint64_t *h)
{
  int err = 0;

  *h = GS_FNV1A64_SEED;
  for (uint32_t k = 0; !err && k < e->packs.list.pack_count; k++) {
    const gs_pack_t *pk = &e->packs.packs[k];

    err = hash_floats(e, h, pk->params, pk->elements);
    for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
      err = hash_floats(e, h, gs__engine_state_of(e, k, s), pk->elements);
  }
  return err;
}

/* Each rank adds the 16 nibbles of its hash and their squares; both sums
 * are world times its own exactly when every rank's nibble equals its own
 * (no spread), and they are exact in float32 for any world below 74565
 * ranks. */
#define HASH_NIBBLES 16
int gs__engine_check_same_state(gs_engine_t *e)
{
  float v[2 * HASH_NIBBLES];
  uint64_t h;
  double w = gs__membership_world(&e->member);
  int err = state_hash(e, &h);

  if (err) {
    gs_set_why(e->error, sizeof(e->error), "cannot hash the state: out of memory");
    return err;
  }
  e->state_hash = h;
  for (int i = 0; i < HASH_NIBBLES; i++) {
    float nib = (float)((h >> (4 * i)) & 15);

    v[i] = nib;
    v[HASH_NIBBLES + i] = nib * nib;
  }
  err = gs__engine_run_now(e, OP_ALLREDUCE, v, 2 * HASH_NIBBLES, false, 0,
                           "allreduce of the state's hash");
  for (int i = 0; !err && i < HASH_NIBBLES; i++) {
    float nib = (float)((h >> (4 * i)) & 15);

    if (v[i] != (float)(w * nib) || v[HASH_NIBBLES + i] != (float)(w * nib * nib)) {
      gs_set_why(e->error, sizeof(e->error),
                 "generation %" PRIu64 ": the ranks hold different params or optimizer state after "
                 "taking rank %u's state (hash %016" PRIx64 " on rank %u)",
                 gs__membership_generation(&e->member), gs__membership_join(&e->member)->state_rank,
                 h, gs__membership_rank(&e->member));
      return gs__engine_fail(e, GS_EPROTO);
    }
  }
  return err;
}
