/* Sharded optimizer state (cfg.shard_optimizer; docs/design.md, "Sharded
 * optimizer state"): each pack's window is this rank's shard, where the
 * backend's reduce-scatter leaves the summed gradients and from where its
 * allgather spreads the updated params. The step's own part is in step.c;
 * here the windows, and the whole state assembled for what needs every
 * parameter's (a checkpoint, a resume, a broadcast of the state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

#include "engine_internal.h"
#include "why.h"

/* The elements of room a pack's buffers need past its own for the
 * backends' shards in the largest world: NCCL's shards are equal pieces,
 * the last ones padded (at most world - 1 elements); the host ring's fit. */
size_t gs__engine_shard_pad(const gs_engine_t *e)
{
  return gs__engine_sharded(e) && e->cfg.world_size > 1 ? e->cfg.world_size - 1 : 0;
}

int gs__engine_shard(gs_engine_t *e)
{
  uint32_t w = gs__membership_world(&e->member),
           prev = (gs__membership_rank(&e->member) + w - 1) % w;

  for (uint32_t k = 0; gs__engine_sharded(e) && k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];
    gs_comm_shard_t own = gs_comm_shard(e->comm, pk->elements, gs__membership_rank(&e->member));
    gs_comm_shard_t copy = gs__engine_shard_copies(e) ? gs_comm_shard(e->comm, pk->elements, prev)
                                                      : (gs_comm_shard_t){0, 0};
    int err;

    if (gs_comm_shard_room(e->comm, pk->elements) > pk->elements + e->packs.pad) {
      gs_set_why(e->error, sizeof(e->error),
                 "pack %u: the %s backend's shards need more room than the packs have", k,
                 gs_comm_name(e->comm));
      return GS_EINVAL;
    }
    err = gs_packs_set_window(&e->packs, k, GS_WINDOW_OWN, own.off, own.len);
    err = err ? err : gs_packs_set_window(&e->packs, k, GS_WINDOW_COPY, copy.off, copy.len);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "out of memory for the optimizer state");
      return err;
    }
  }
  e->shard.rank = gs__membership_rank(&e->member);
  e->shard.world = w;
  atomic_store_explicit(&e->board.state_bytes, gs_packs_state_bytes(&e->packs),
                        memory_order_relaxed);
  return 0;
}

void gs__engine_update_windows(gs_engine_t *e, uint32_t k, const gs_optim_step_t *gated)
{
  gs_pack_t *pk = &e->packs.packs[k];

  for (uint32_t w = 0; w < GS_PACK_WINDOWS; w++)
    if (pk->win[w].len)
      gs_device_optim_pack(e->cfg.dev, gated, pk->win[w].segs, pk->win[w].nseg,
                           pk->params + pk->win[w].off, pk->grads + pk->win[w].off,
                           pk->win[w].state);
}

/* Every pack's state buffers at full length (room for the backend's
 * shards), zeroed. */
static int full_open(gs_engine_t *e)
{
  uint32_t packs = e->packs.list.pack_count, n = e->packs.nstate;
  int err = 0;

  e->shard.full_state = calloc((size_t)packs * n + 1, sizeof(*e->shard.full_state));
  if (!e->shard.full_state)
    return GS_ENOMEM;
  for (uint32_t k = 0; !err && k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    for (uint32_t s = 0; !err && s < n; s++) {
      e->shard.full_state[k * n + s] =
          gs_device_alloc(e->cfg.dev, (pk->elements + e->packs.pad) * sizeof(float));
      err = e->shard.full_state[k * n + s] ? 0 : GS_ENOMEM;
    }
  }
  return err;
}

int gs__engine_gather_slot(gs_engine_t *e, uint32_t k, uint32_t s, float *whole)
{
  gs_pack_t *pk = &e->packs.packs[k];
  comm_job_t job = {.op = OP_ALLGATHER, .buf = whole, .count = pk->elements};
  gs_phase_t was = gs__engine_phase_now(e);
  int err = gs_device_copy(e->cfg.dev, whole + pk->win[0].off, pk->win[0].state[s],
                           pk->win[0].len * sizeof(float));

  /* A wait on the other ranks (a checkpoint's, a state_dict's): the
   * coordinator names the rank that holds them up. */
  gs__engine_enter(e, GS_PHASE_SYNC, 0);
  err = err ? err : gs__engine_step_collective(e, &job);
  if (!err)
    err = gs_comm_sync(e->comm); /* never block on the device while a collective may hang */
  gs__engine_enter(e, was, 0);
  return err ? gs__engine_comm_failed(e, err, "allgather of the optimizer state") : 0;
}

void gs__engine_full_state_close(gs_engine_t *e)
{
  uint32_t n = e->packs.list.pack_count * e->packs.nstate;

  for (uint32_t i = 0; e->shard.full_state && i < n; i++)
    gs_device_free(e->cfg.dev, e->shard.full_state[i]);
  free(e->shard.full_state);
  e->shard.full_state = NULL;
}

float *gs__engine_state_of(const gs_engine_t *e, uint32_t k, uint32_t s)
{
  return e->shard.full_state ? e->shard.full_state[k * e->packs.nstate + s]
                             : e->packs.packs[k].win[0].state[s];
}

int gs__engine_full_state_gather(gs_engine_t *e)
{
  int err;

  if (!gs__engine_sharded(e))
    return 0;
  err = full_open(e);
  if (err)
    gs_set_why(e->error, sizeof(e->error), "out of memory for the whole optimizer state");
  for (uint32_t k = 0; !err && k < e->packs.list.pack_count; k++)
    for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
      err = gs__engine_gather_slot(e, k, s, gs__engine_state_of(e, k, s));
  if (err)
    gs__engine_full_state_close(e);
  return err;
}

bool gs__engine_full_state_assembled(const gs_engine_t *e)
{
  return e->shard.full_state != NULL;
}

int gs__engine_full_state_open(gs_engine_t *e)
{
  int err = gs__engine_sharded(e) ? full_open(e) : 0;

  if (err) {
    gs__engine_full_state_close(e);
    gs_set_why(e->error, sizeof(e->error), "out of memory for the whole optimizer state");
  }
  return err;
}

int gs__engine_full_state_keep(gs_engine_t *e)
{
  int err = 0;

  for (uint32_t k = 0; e->shard.full_state && !err && k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    for (uint32_t w = 0; w < GS_PACK_WINDOWS; w++)
      for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
        err = gs_device_copy(e->cfg.dev, pk->win[w].state[s],
                             gs__engine_state_of(e, k, s) + pk->win[w].off,
                             pk->win[w].len * sizeof(float));
  }
  if (!err && e->shard.full_state)
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
  if (!e->packs.packs || e->shard.full_state) {
    gs_set_why(e->error, sizeof(e->error), "the optimizer state %s",
               e->shard.full_state ? "is assembled already" : "does not exist before start");
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
  lo = at > pk->win[0].off ? at : pk->win[0].off;
  hi = end < pk->win[0].off + pk->win[0].len ? end : pk->win[0].off + pk->win[0].len;
  if (lo < hi)
    *first = lo - at, *count = hi - lo;
}

uint64_t gs_engine_state_bytes(const gs_engine_t *e)
{
  return gs_packs_state_bytes(&e->packs);
}
