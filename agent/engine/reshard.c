/* An elastic regroup's state when the optimizer state is sharded
 * (docs/design.md, "Sharded optimizer state"). Every rank of the old world
 * held its shard of every pack and a copy of the previous rank's, both
 * updated at every step; the new world's ranks:
 *
 *   1. tell each other which old rank they were, at which step their
 *      state is, and which step's reduced gradients their windows hold;
 *   2. catch up: a rank one step behind the newest whose windows hold
 *      that step's sums (its peers applied the update, the collective
 *      after it failed here) applies it, gated as its peers' was (the
 *      newest rank hands on the gates);
 *   3. assemble every pack's params and state from the windows of the
 *      ranks that hold them at the newest step (a lost rank's shard from
 *      the next rank's copy), each element written by one rank into zeros
 *      and summed over the new world;
 *   4. check that every rank holds the same, and cut the new windows.
 *
 * A shard whose owner and copy holder are both lost is lost: the regroup
 * fails, naming them (resume from a checkpoint). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

/* What a member says of itself (step 1). */
enum { SAID_OLD_RANK, SAID_OLD_WORLD, SAID_STEP, SAID_REDUCED, SAID_COUNT };
#define CHUNKS 4 /* a uint64 as four 16-bit chunks: exact in a float32 sum */

/* Every member's `n` numbers, by new rank: each writes its own into
 * zeros, and an allreduce of host memory sums them. */
static int gather_said(gs_engine_t *e, const uint64_t *mine, uint64_t *all)
{
  uint32_t w = gs__membership_world(&e->member), r = gs__membership_rank(&e->member);
  size_t per = SAID_COUNT * CHUNKS;
  float *v = calloc((size_t)w * per, sizeof(float));
  int err;

  if (!v) {
    gs_set_why(e->error, sizeof(e->error), "resharding: out of memory");
    return GS_ENOMEM;
  }
  for (uint32_t i = 0; i < SAID_COUNT; i++)
    for (uint32_t c = 0; c < CHUNKS; c++)
      v[r * per + i * CHUNKS + c] = (float)((mine[i] >> (16 * c)) & 0xffff);
  err =
      gs__engine_run_now(e, OP_ALLREDUCE, v, w * per, false, 0, "allreduce of the members' shards");
  for (uint32_t m = 0; !err && m < w; m++)
    for (uint32_t i = 0; i < SAID_COUNT; i++) {
      uint64_t x = 0;

      for (uint32_t c = 0; c < CHUNKS; c++)
        x |= (uint64_t)v[m * per + i * CHUNKS + c] << (16 * c);
      all[m * SAID_COUNT + i] = x;
    }
  free(v);
  return err;
}

/* The gates' flags (keep_update's bits 0-3), and whether the newest
 * rank's readback of that update was never taken (its update count holds
 * the step even if the device skipped it). */
#define UNTAKEN 16u

/* Step 2: the newest rank's gates of its last update, on every rank (the
 * host's flags, the device's values into shard_gates); this rank applies
 * the update it owes (`owes`: it holds that step's sums one step behind;
 * e->optim_steps is already the newest rank's, which counted it). The
 * update count is taken back when that update was skipped on the device
 * and nobody's readback said so. */
static int catch_up(gs_engine_t *e, uint64_t newest, bool owes)
{
  uint64_t flags = e->shard.gate_flags | (e->shard.untaken == newest ? UNTAKEN : 0);
  uint32_t root = gs__membership_join(&e->member)->state_rank;
  float gates[3];
  gs_optim_step_t st;
  int err;

  err = gs__engine_run_now(e, OP_BROADCAST, &flags, sizeof(flags), false, root,
                           "broadcast of the last update's gates");
  if (!err)
    err = gs__engine_run_now(e, OP_BROADCAST, e->shard.gates, 3 * sizeof(float), true, root,
                             "broadcast of the last update's gates");
  if (!err && (flags & UNTAKEN) && !(flags & 1)) {
    err = gs_device_download(e->cfg.dev, gates, e->shard.gates, sizeof(gates));
    if (!err && e->optim_steps && (gates[0] != 0.0f || ((flags & 4) && gates[1] != 0.0f)))
      e->optim_steps--;
  }
  if (err || !owes || (flags & 1)) /* bit 0: the front end skipped the step */
    return err;
  gs__engine_resolve_groups(e, newest, &st);
  st.t = e->optim_steps ? e->optim_steps : 1;         /* the count with this update */
  st.grad_scale = (flags & 2) ? 1.0f : st.grad_scale; /* bit 1: the sums were scaled in place */
  st.gate = (gs_optim_gate_t){
      .skip = e->shard.gates,
      .veto = (flags & 4) ? e->shard.gates + 1 : NULL,
      .factor = (flags & 8) ? e->shard.gates + 2 : NULL,
  };
  for (uint32_t k = 0; k < e->packs.list.pack_count; k++)
    gs__engine_update_windows(e, k, &st);
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
         "applied step %" PRIu64 "'s update to this rank's shards, as the others did", newest);
  return 0;
}

/* Step 3: this rank's windows that hold old shards nobody else gives
 * (`give[w]`), written into zeroed whole buffers and summed. */
static int assemble(gs_engine_t *e, const bool give[GS_PACK_WINDOWS])
{
  gs_device_t *d = e->cfg.dev;
  int err = gs__engine_full_state_open(e);

  for (uint32_t k = 0; !err && k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];
    size_t room = pk->elements + e->packs.pad;
    float *params = gs_device_alloc(d, room * sizeof(float));

    err = params ? 0 : GS_ENOMEM;
    for (uint32_t w = 0; !err && w < GS_PACK_WINDOWS; w++) {
      if (!give[w] || !pk->win[w].len)
        continue;
      err = gs_device_copy(d, params + pk->win[w].off, pk->params + pk->win[w].off,
                           pk->win[w].len * sizeof(float));
      for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
        err = gs_device_copy(d, gs__engine_state_of(e, k, s) + pk->win[w].off, pk->win[w].state[s],
                             pk->win[w].len * sizeof(float));
    }
    if (err == GS_ENOMEM)
      gs_set_why(e->error, sizeof(e->error), "resharding: out of memory");
    if (!err)
      err = gs__engine_run_now(e, OP_ALLREDUCE, params, pk->elements, true, 0,
                               "allreduce of the params' shards");
    for (uint32_t s = 0; !err && s < e->packs.nstate; s++)
      err = gs__engine_run_now(e, OP_ALLREDUCE, gs__engine_state_of(e, k, s), pk->elements, true, 0,
                               "allreduce of the optimizer state's shards");
    if (!err)
      err = gs_device_copy(d, pk->params, params, pk->elements * sizeof(float));
    if (!err)
      err = gs_device_sync(d); /* the copy is done before its source is freed */
    gs_device_free(d, params);
  }
  if (err)
    gs__engine_full_state_close(e);
  return err;
}

/* The member holding old rank `r`'s windows at the newest step (`at`:
 * each member's step once caught up), or -1. */
static int64_t member_of(const uint64_t *said, uint32_t w, uint64_t r, uint64_t newest,
                         const uint64_t *at)
{
  for (uint32_t m = 0; m < w; m++)
    if (said[m * SAID_COUNT + SAID_OLD_RANK] == r + 1 && at[m] == newest)
      return m;
  return -1;
}

int gs__engine_reshard(gs_engine_t *e)
{
  uint32_t w = gs__membership_world(&e->member), me = gs__membership_rank(&e->member);
  uint64_t mine[SAID_COUNT] = {e->has_state ? e->shard.rank + 1 : 0, e->shard.world,
                               e->committed.step, e->shard.reduced};
  uint64_t *said = calloc((size_t)w * (SAID_COUNT + 1), sizeof(uint64_t)), *at, newest = 0;
  uint64_t old_world = 0;
  bool give[GS_PACK_WINDOWS] = {false, false}, owes;
  int err;

  if (!said) {
    gs_set_why(e->error, sizeof(e->error), "resharding: out of memory");
    return GS_ENOMEM;
  }
  at = said + (size_t)w * SAID_COUNT;
  err = gather_said(e, mine, said);
  for (uint32_t m = 0; !err && m < w; m++) {
    const uint64_t *s = &said[m * SAID_COUNT];

    if (!s[SAID_OLD_RANK])
      continue;
    if (old_world && s[SAID_OLD_WORLD] != old_world) {
      gs_set_why(e->error, sizeof(e->error),
                 "resharding: the members held shards of worlds of %" PRIu64 " and %" PRIu64
                 " ranks",
                 old_world, s[SAID_OLD_WORLD]);
      err = GS_EPROTO;
    }
    old_world = s[SAID_OLD_WORLD];
    newest = s[SAID_STEP] > newest ? s[SAID_STEP] : newest;
  }
  /* Step 2: who is at the newest step once the ranks one behind that
   * hold its sums have applied it. */
  for (uint32_t m = 0; !err && m < w; m++) {
    const uint64_t *s = &said[m * SAID_COUNT];

    at[m] = s[SAID_OLD_RANK] && s[SAID_STEP] + 1 == newest && s[SAID_REDUCED] == newest
                ? newest
                : s[SAID_STEP];
  }
  owes =
      !err && mine[SAID_OLD_RANK] && e->committed.step + 1 == newest && e->shard.reduced == newest;
  err = err ? err : catch_up(e, newest, owes);
  /* Step 3: each old shard from its owner, else from the next rank's copy. */
  for (uint64_t r = 0; !err && r < old_world; r++) {
    int64_t own = member_of(said, w, r, newest, at);
    int64_t copy = old_world > 1 ? member_of(said, w, (r + 1) % old_world, newest, at) : -1;

    if (own < 0 && copy < 0) {
      gs_set_why(e->error, sizeof(e->error),
                 "the optimizer state of old rank %" PRIu64 "'s shard is lost: it and rank %" PRIu64
                 " (its copy) left together; resume from a checkpoint",
                 r, (r + 1) % old_world);
      err = GS_ENOTFOUND;
    } else if (own == (int64_t)me) {
      give[GS_WINDOW_OWN] = true;
    } else if (own < 0 && copy == (int64_t)me) {
      give[GS_WINDOW_COPY] = true;
    }
  }
  free(said);
  err = err ? err : assemble(e, give);
  /* Step 4: every rank alike, then the new world's windows. */
  err = err ? err : gs__engine_check_same_state(e);
  err = err ? err : gs__engine_shard(e);
  err = err ? err : gs__engine_full_state_keep(e);
  gs__engine_full_state_close(e);
  if (!err)
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
           "resharded the optimizer state of step %" PRIu64 " from %" PRIu64
           " ranks to %u (hash %016" PRIx64 ")",
           newest, old_world, w, e->state_hash);
  return err;
}

void gs__engine_shard_gates_at(gs_engine_t *e, float *gates)
{
  e->shard.gates = gates;
}

void gs__engine_shard_reduced(gs_engine_t *e, uint64_t step)
{
  e->shard.reduced = step;
}

/* A sharded elastic step's update is queued: the step is this rank's
 * state (a regroup from here keeps it), and what gated the update is kept
 * (copied on the device, with the host's part) for a regroup to hand to a
 * rank that must catch up on it. */
void gs__engine_shard_keep_update(gs_engine_t *e, bool skip_asked)
{
  gs_device_t *d = e->cfg.dev;
  int err = 0;

  e->committed = e->after;
  e->shard.untaken = e->after.step;
  e->shard.gate_flags = (uint32_t)skip_asked | (uint32_t)e->reduced.scaled << 1 |
                        (uint32_t)(e->drive.veto_at != NULL) << 2 |
                        (uint32_t)(e->drive.factor_at != NULL) << 3;
  err = e->cfg.nonfinite == GS_NONFINITE_OFF
            ? gs_device_zero(d, e->shard.gates, sizeof(float))
            : gs_device_copy(d, e->shard.gates, e->skip_dev, sizeof(float));
  if (!err && e->drive.veto_at)
    err = gs_device_copy(d, e->shard.gates + 1, e->drive.veto_at, sizeof(float));
  if (!err && e->drive.factor_at)
    err = gs_device_copy(d, e->shard.gates + 2, e->drive.factor_at, sizeof(float));
  if (err) /* the device failed: the step's own readback says so */
    e->shard.untaken = 0;
}

void gs__engine_shard_taken(gs_engine_t *e)
{
  e->shard.untaken = 0;
}
