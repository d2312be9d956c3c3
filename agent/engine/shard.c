/* Sharded optimizer state (cfg.shard_optimizer; docs/design.md, "Sharded
 * optimizer state"): each pack's window is this rank's shard, where the
 * backend's reduce-scatter leaves the summed gradients and from where its
 * allgather spreads the updated params. The step's own part is in step.c;
 * here the windows, and the whole state assembled for what needs every
 * parameter's (a checkpoint, a resume, a broadcast of the state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

bool gs__engine_sharded(const gs_engine_t *e)
{
  return e->cfg.shard_optimizer;
}

/* The elements of room a pack's buffers need past its own for the
 * backends' shards in the largest world: NCCL's shards are equal pieces,
 * the last ones padded (at most world - 1 elements); the host ring's fit. */
size_t gs__engine_shard_pad(const gs_engine_t *e)
{
  return gs__engine_sharded(e) && e->cfg.world_size > 1 ? e->cfg.world_size - 1 : 0;
}

int gs__engine_shard(gs_engine_t *e)
{
  atomic_store_explicit(&e->board.state_bytes, gs_packs_state_bytes(&e->packs),
                        memory_order_relaxed);
  for (uint32_t k = 0; gs__engine_sharded(e) && k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];
    gs_comm_shard_t s = gs_comm_shard(e->comm, pk->elements, e->join.rank);
    int err;

    if (gs_comm_shard_room(e->comm, pk->elements) > pk->elements + e->packs.pad) {
      gs_set_why(e->error, sizeof(e->error),
                 "pack %u: the %s backend's shards need more room than the packs have", k,
                 gs_comm_name(e->comm));
      return GS_EINVAL;
    }
    err = gs_packs_set_window(&e->packs, k, s.off, s.len);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "out of memory for the optimizer state");
      return err;
    }
    atomic_store_explicit(&e->board.state_bytes, gs_packs_state_bytes(&e->packs),
                          memory_order_relaxed);
  }
  return 0;
}

/* Every pack's state buffers at full length (room for the backend's
 * shards), zeroed; the window's own state copied into place unless
 * `empty`. */
static int full_open(gs_engine_t *e, bool empty)
{
  uint32_t packs = e->packs.list.pack_count, n = e->packs.nstate;
  int err = 0;

  e->full_state = calloc((size_t)packs * n + 1, sizeof(*e->full_state));
  if (!e->full_state)
    return GS_ENOMEM;
  for (uint32_t k = 0; !err && k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    for (uint32_t s = 0; !err && s < n; s++) {
      float *full = gs_device_alloc(e->cfg.dev, (pk->elements + e->packs.pad) * sizeof(float));

      e->full_state[k * n + s] = full;
      err = full ? 0 : GS_ENOMEM;
      if (!err && !empty)
        err = gs_device_copy(e->cfg.dev, full + pk->win_off, pk->state[s],
                             pk->win_len * sizeof(float));
    }
  }
  return err;
}

void gs__engine_full_state_close(gs_engine_t *e)
{
  uint32_t n = e->packs.list.pack_count * e->packs.nstate;

  for (uint32_t i = 0; e->full_state && i < n; i++)
    gs_device_free(e->cfg.dev, e->full_state[i]);
  free(e->full_state);
  e->full_state = NULL;
}

float *gs__engine_state_of(const gs_engine_t *e, uint32_t k, uint32_t s)
{
  return e->full_state ? e->full_state[k * e->packs.nstate + s] : e->packs.packs[k].state[s];
}

int gs__engine_full_state_gather(gs_engine_t *e)
{
  int err;

  if (!gs__engine_sharded(e))
    return 0;
  err = full_open(e, false);
  for (uint32_t k = 0; !err && k < e->packs.list.pack_count; k++)
    for (uint32_t s = 0; !err && s < e->packs.nstate; s++) {
      comm_job_t job = {.op = OP_ALLGATHER,
                        .buf = gs__engine_state_of(e, k, s),
                        .count = e->packs.packs[k].elements};

      err = gs__engine_step_collective(e, &job);
    }
  if (!err)
    err = gs_comm_sync(e->comm); /* never block on the device while a collective may hang */
  if (err) {
    gs__engine_full_state_close(e);
    return gs__engine_comm_failed(e, err, "allgather of the optimizer state");
  }
  return 0;
}

int gs__engine_full_state_open(gs_engine_t *e)
{
  int err = gs__engine_sharded(e) ? full_open(e, true) : 0;

  if (err) {
    gs__engine_full_state_close(e);
    gs_set_why(e->error, sizeof(e->error), "out of memory for the whole optimizer state");
  }
  return err;
}

int gs__engine_full_state_keep(gs_engine_t *e)
{
  int err = 0;

  for (uint32_t k = 0; e->full_state && !err && k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
      err = gs_device_copy(e->cfg.dev, pk->state[s], gs__engine_state_of(e, k, s) + pk->win_off,
                           pk->win_len * sizeof(float));
  }
  if (!err && e->full_state)
    err = gs_device_sync(e->cfg.dev); /* the whole buffers are freed next */
  gs__engine_full_state_close(e);
  if (err)
    gs_set_why(e->error, sizeof(e->error),
               "cannot keep this rank's shard of the optimizer state: %s", gs_strerror(err));
  return err;
}

int gs_engine_state_assemble(gs_engine_t *e, bool empty)
{
  if (e->failed)
    return gs__engine_refuse(e, "assembling the optimizer state");
  if (!e->packs.packs || e->full_state) {
    gs_set_why(e->error, sizeof(e->error), "the optimizer state %s",
               e->full_state ? "is assembled already" : "does not exist before start");
    return GS_EPRECOND;
  }
  return empty ? gs__engine_full_state_open(e) : gs__engine_full_state_gather(e);
}

int gs_engine_state_release(gs_engine_t *e, bool keep)
{
  if (keep)
    return gs__engine_full_state_keep(e);
  gs__engine_full_state_close(e);
  return 0;
}

void gs_engine_window(const gs_engine_t *e, uint32_t i, uint64_t *first, uint64_t *count)
{
  const gs_pack_t *pk;
  size_t at, end, lo, hi;

  *first = *count = 0;
  if (!e->packs.packs || i >= e->packs.nparams)
    return;
  pk = &e->packs.packs[e->packs.pack_of[i]];
  at = e->packs.offset_of[i];
  end = at + e->packs.params[i].elements;
  lo = at > pk->win_off ? at : pk->win_off;
  hi = end < pk->win_off + pk->win_len ? end : pk->win_off + pk->win_len;
  if (lo < hi)
    *first = lo - at, *count = hi - lo;
}

uint64_t gs_engine_state_bytes(const gs_engine_t *e)
{
  return gs_packs_state_bytes(&e->packs);
}
