/* The engine's state across ranks and across runs, outside a step: the
 * initial sync (resume from a checkpoint or rank 0's params), broadcasts
 * of params from a root, the state an elastic regroup shares, and
 * checkpoints. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_writer.h"
#include "engine_internal.h"
#include "why.h"

/* Broadcasts every pack's params (and optimizer state) from `root` as one
 * grouped collective and waits for it once: a stream-ordered backend
 * launches them together (one round trip instead of one per buffer), a
 * blocking one runs them in turn on this thread (the comm thread is idle
 * outside a step). */
int gs__engine_broadcast_packs(gs_engine_t *e, bool state, uint32_t root)
{
  uint32_t packs = e->packs.list.pack_count, n = 0, per = 1 + (state ? e->packs.nstate : 0);
  gs_comm_span_t *spans = malloc((per * (size_t)packs + 1) * sizeof(*spans));
  const char *what = state ? "broadcast of params and optimizer state" : "broadcast of params";
  int err;

  if (!spans) {
    gs_set_why(e->error, sizeof(e->error), "%s: out of memory", what);
    return GS_ENOMEM;
  }
  for (uint32_t k = 0; k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    spans[n++] = (gs_comm_span_t){pk->params, pk->elements * sizeof(float)};
    for (uint32_t j = 1; j < per; j++) /* sharded: the whole state, assembled */
      spans[n++] = (gs_comm_span_t){gs__engine_state_of(e, k, j - 1), pk->elements * sizeof(float)};
  }
  err = gs_comm_broadcast_group(e->comm, spans, n, root);
  free(spans);
  if (!err)
    err = gs_comm_order_after(e->comm, gs_comm_ticket(e->comm) - 1);
  if (!err)
    err = gs_comm_sync(e->comm); /* never block on the device while a collective may hang */
  return err ? gs__engine_comm_failed(e, err, what) : 0;
}

/* How ckpt_buffers fills the host view of the packs. */
typedef enum ckpt_view {
  CKPT_TO_LOAD,  /* room to load a checkpoint into (the packs themselves on host memory) */
  CKPT_SNAPSHOT, /* a copy of the packs as they are now, always a copy: it outlives the step */
} ckpt_view_t;

/* Buffers per pack in a checkpoint: params, then each optimizer state. */
static uint32_t ckpt_per_pack(const gs_engine_t *e)
{
  return 1 + e->packs.nstate;
}

/* The checkpoint's view of the packs, params then optimizer state of each
 * pack, in host memory (see ckpt_view_t). Release with ckpt_release, or hand a
 * snapshot to the checkpoint writer, which frees it. NULL when out of
 * memory or the download failed. */
static gs_ckpt_buffer_t *ckpt_buffers(gs_engine_t *e, ckpt_view_t view)
{
  uint32_t packs = e->packs.list.pack_count, per = ckpt_per_pack(e);
  gs_ckpt_buffer_t *b = calloc(per * packs, sizeof(*b));
  bool host = e->cfg.dev->host_memory && view == CKPT_TO_LOAD;
  bool download = view == CKPT_SNAPSHOT && !e->cfg.dev->host_memory;

  for (uint32_t k = 0; b && k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    b[per * k] = (gs_ckpt_buffer_t){pk->params, pk->elements};
    for (uint32_t j = 1; j < per; j++) /* sharded: the whole state, assembled */
      b[per * k + j] = (gs_ckpt_buffer_t){gs__engine_state_of(e, k, j - 1), pk->elements};
  }
  for (uint32_t i = 0; b && !host && i < per * packs; i++) {
    float *src = b[i].data;

    b[i].data = malloc(b[i].count * sizeof(float) + 1);
    if (b[i].data && view == CKPT_SNAPSHOT && !download)
      memcpy(b[i].data, src, b[i].count * sizeof(float));
    if (!b[i].data ||
        (download && gs_device_download(e->cfg.dev, b[i].data, src, b[i].count * sizeof(float)))) {
      for (uint32_t j = 0; j <= i; j++)
        free(b[j].data);
      free(b);
      return NULL;
    }
  }
  return b;
}

/* Frees ckpt_buffers' copies, uploading them to the packs first when
 * `upload` (a loaded checkpoint). */
static int ckpt_release(gs_engine_t *e, gs_ckpt_buffer_t *b, bool upload)
{
  uint32_t packs = e->packs.list.pack_count, per = ckpt_per_pack(e);
  int err = 0;

  if (e->cfg.dev->host_memory) {
    free(b);
    return 0;
  }
  for (uint32_t k = 0; k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    for (uint32_t j = 0; upload && !err && j < per; j++)
      err = gs_device_upload(e->cfg.dev, j ? gs__engine_state_of(e, k, j - 1) : pk->params,
                             b[per * k + j].data, pk->elements * sizeof(float));
  }
  if (upload && !err)
    err = gs_device_sync(e->cfg.dev); /* the copies are freed next */
  for (uint32_t i = 0; i < per * packs; i++)
    free(b[i].data);
  free(b);
  return err;
}

/* Frees the first n host copies of a snapshot, and the list. */
static void snapshot_free(gs_ckpt_buffer_t *b, uint32_t n)
{
  for (uint32_t i = 0; b && i < n; i++)
    free(b[i].data);
  free(b);
}

/* A sharded checkpoint's snapshot: rank 0's host copies of the params and
 * of each state buffer, gathered whole in turn through one device buffer
 * of a pack's room (collective: the others only send), so that no rank
 * ever holds more than one pack's state buffer whole. NULL `out` on the
 * others. */
static int sharded_snapshot(gs_engine_t *e, gs_ckpt_buffer_t **out)
{
  uint32_t packs = e->packs.list.pack_count, per = ckpt_per_pack(e);
  bool keep = gs__membership_rank(&e->member) == 0;
  size_t room = 0;
  gs_ckpt_buffer_t *b = keep ? calloc((size_t)per * packs, sizeof(*b)) : NULL;
  float *whole;
  int err = 0;

  *out = NULL;
  for (uint32_t k = 0; k < packs; k++)
    room = e->packs.packs[k].elements > room ? e->packs.packs[k].elements : room;
  whole = gs_device_alloc(e->cfg.dev, (room + e->packs.pad) * sizeof(float));
  if (!whole || (keep && !b))
    err = GS_ENOMEM;
  for (uint32_t i = 0; !err && i < per * packs; i++) {
    gs_pack_t *pk = &e->packs.packs[i / per];
    uint32_t s = i % per;
    const float *src = s ? whole : pk->params;

    if (s)
      err = gs__engine_gather_slot(e, i / per, s - 1, whole);
    if (err || !keep)
      continue;
    b[i] = (gs_ckpt_buffer_t){malloc(pk->elements * sizeof(float) + 1), pk->elements};
    err = b[i].data ? gs_device_download(e->cfg.dev, b[i].data, src, pk->elements * sizeof(float))
                    : GS_ENOMEM;
  }
  gs_device_free(e->cfg.dev, whole);
  if (err == GS_ENOMEM)
    gs_set_why(e->error, sizeof(e->error), "checkpoint: out of memory for the state's copy");
  if (err) {
    snapshot_free(b, per * packs);
    return err;
  }
  *out = b;
  return 0;
}

static int checkpoint(gs_engine_t *e, const gs_position_t *pos)
{
  gs_ckpt_state_t st = {pos->step,
                        pos->epoch,
                        pos->rng_state,
                        gs_packs_layout_hash(&e->packs),
                        ckpt_per_pack(e) * e->packs.list.pack_count,
                        NULL,
                        e->layout_desc,
                        gs__membership_world(&e->member),
                        pos->sample,
                        0,
                        e->optim_steps,
                        NULL,
                        0};
  char why[640];
  int err;

  if (e->failed)
    return gs__engine_refuse(e, "checkpoint");
  if (!e->cfg.checkpoint_dir)
    return 0;
  /* Sharded: every rank takes part (a Join setting makes checkpoints on
   * for all or none), each state buffer gathered whole in turn. */
  if (gs__engine_sharded(e)) {
    err = sharded_snapshot(e, &st.bufs);
    if (err)
      return err;
  } else if (gs__membership_rank(&e->member) == 0) {
    st.bufs = ckpt_buffers(e, CKPT_SNAPSHOT);
  }
  if (gs__membership_rank(&e->member) != 0) {
    e->ckpt_taken = true;
    e->ckpt_step = pos->step;
    return 0;
  }
  if (!st.bufs) {
    gs_set_why(e->error, sizeof(e->error),
               "checkpoint at step %" PRIu64 " failed: cannot copy the packs to the host",
               pos->step);
    return GS_ENOMEM;
  }
  if (e->cfg.checkpoint_extra) {
    size_t len = 0;

    st.extra = e->cfg.checkpoint_extra(e->cfg.checkpoint_extra_arg, &len);
    st.extra_len = st.extra ? len : 0;
  }
  /* Written in the background: the other ranks' next collective must not
   * wait on this rank's disk. */
  err = gs__ckpt_writer_submit(&e->ckpt_writer, &st, why, sizeof(why));
  if (err)
    gs_set_why(e->error, sizeof(e->error), "%s", why);
  e->ckpt_taken = true;
  e->ckpt_step = pos->step;
  return err;
}

int gs_engine_checkpoint(gs_engine_t *e, const gs_position_t *pos)
{
  gs_phase_t was = gs__engine_phase_now(e);
  int err;

  gs__engine_enter(e, GS_PHASE_CHECKPOINT, 0);
  err = checkpoint(e, pos);
  gs__engine_enter(e, was, 0);
  return err;
}

const void *gs_engine_resumed_extra(const gs_engine_t *e, size_t *len)
{
  *len = e->resumed_extra_len;
  return e->resumed_extra;
}

int gs_engine_checkpoint_wait(gs_engine_t *e)
{
  char why[640];
  int err = gs__ckpt_writer_wait(&e->ckpt_writer, why, sizeof(why));

  if (err)
    gs_set_why(e->error, sizeof(e->error), "%s", why);
  return err;
}

/* Rank 0 loads the newest valid checkpoint; true when one was loaded. */
static int load_checkpoint(gs_engine_t *e, gs_position_t *pos, bool *found)
{
  gs_ckpt_state_t st = {0,
                        0,
                        0,
                        gs_packs_layout_hash(&e->packs),
                        ckpt_per_pack(e) * e->packs.list.pack_count,
                        NULL,
                        e->layout_desc,
                        0,
                        0,
                        0,
                        0,
                        NULL,
                        0};
  char path[4096], why[512];
  int err;

  *found = false;
  st.bufs = ckpt_buffers(e, CKPT_TO_LOAD);
  if (!st.bufs)
    return GS_ENOMEM;
  err = gs_checkpoint_load_latest(e->cfg.checkpoint_dir, &st, e->cfg.log, path, sizeof(path), why,
                                  sizeof(why));
  if (ckpt_release(e, st.bufs, err == 0) && !err) {
    snprintf(why, sizeof(why), "cannot copy the checkpoint to the device");
    err = GS_EIO;
  }
  if (err == GS_ENOTFOUND && e->cfg.resume_auto) {
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, 0,
           "--resume=auto: %s; starting fresh from step 0", why);
    return 0;
  }
  if (err == GS_ENOTFOUND) {
    gs_set_why(e->error, sizeof(e->error),
               "--resume: %s (--resume=auto starts fresh when there is none)", why);
    return err;
  }
  if (err) {
    gs_set_why(e->error, sizeof(e->error), "cannot resume from %s: %s", e->cfg.checkpoint_dir, why);
    return err;
  }
  *found = true;
  *pos = (gs_position_t){st.step, st.epoch, st.rng_state,
                         st.version >= 4 ? st.sample : GS_POSITION_SAMPLE_UNKNOWN};
  e->optim_steps = st.optim_steps;
  free(e->resumed_extra);
  e->resumed_extra = st.extra; /* the front end's, for gs_engine_resumed_extra */
  e->resumed_extra_len = st.extra_len;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, 0, "resuming from %s (step %" PRIu64 ")", path,
         st.step);
  /* Allowed (the params and optimizer state are the same whatever the world
   * size), but the global batch, the data each rank sees and, with
   * --reduce sum, the step size differ from the run that wrote it. */
  if (st.world_size && st.world_size != gs__membership_world(&e->member))
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, 0,
           "%s was written at world size %" PRIu32 ", resuming at world size %" PRIu32
           ": the global batch and the data order differ from that run's",
           path, st.world_size, gs__membership_world(&e->member));
  return 0;
}

int gs__engine_share_state(gs_engine_t *e, gs_position_t *pos)
{
  uint64_t hdr[5] = {pos->step, pos->epoch, pos->rng_state, pos->sample, e->optim_steps};
  uint32_t root = gs__membership_join(&e->member)->state_rank;
  int err;

  if (gs__membership_world(&e->member) > 1) {
    err = gs__engine_run_now(e, OP_BROADCAST, hdr, sizeof(hdr), false, root,
                             "broadcast of the position");
    if (!err && gs__engine_sharded(e)) { /* the shards, kept by their ranks (reshard.c) */
      e->optim_steps = hdr[4];
      err = gs__engine_reshard(e);
      hdr[4] = e->optim_steps; /* an update skipped on the device, taken back */
    } else if (!err) {
      err = gs__engine_broadcast_packs(e, true, root);
      err = err ? err : gs__engine_check_same_state(e);
    }
    if (err)
      return err;
  } else if (gs__engine_sharded(e)) {
    e->optim_steps = hdr[4];
    err = gs__engine_reshard(e); /* alone now: the whole state from its windows */
    hdr[4] = e->optim_steps;
    if (err)
      return err;
  }
  *pos = (gs_position_t){hdr[0], hdr[1], hdr[2], hdr[3]};
  e->optim_steps = hdr[4];
  e->committed = *pos;
  e->has_state = true;
  return 0;
}

int gs__engine_sync_state(gs_engine_t *e, gs_position_t *pos)
{
  uint64_t hdr[6] = {0, pos->step, pos->epoch, pos->rng_state, pos->sample, 0};
  bool found = false;
  int err;

  /* A member brought a state (an elastic job this rank joins while it
   * runs, or a regroup): the newest. Until it has one, a later regroup
   * falls back on the caller's start position. */
  e->committed = *pos;
  if (gs__membership_join(&e->member)->resume_state)
    return gs__engine_share_state(e, pos);
  /* A fresh start: the windows of this world (a world that broke before
   * it trained left others), the state zero. */
  err = gs__engine_shard(e);
  if (err)
    return err;
  e->has_state = true;
  if (gs__membership_rank(&e->member) == 0 && e->cfg.resume && e->cfg.checkpoint_dir) {
    /* Sharded: the checkpoint's whole state, each rank keeping its shard. */
    err = gs__engine_full_state_open(e);
    err = err ? err : load_checkpoint(e, pos, &found);
    if (err) {
      gs__engine_full_state_close(e);
      return err;
    }
    if (found)
      hdr[0] = 1, hdr[1] = pos->step, hdr[2] = pos->epoch, hdr[3] = pos->rng_state,
      hdr[4] = pos->sample, hdr[5] = e->optim_steps;
    else
      gs__engine_full_state_close(e);
  }
  if (gs__membership_world(&e->member) == 1) {
    e->committed = *pos;
    return gs__engine_full_state_keep(e);
  }
  err = gs__engine_run_now(e, OP_BROADCAST, hdr, sizeof(hdr), false, 0,
                           "broadcast of the start position");
  if (err) {
    gs__engine_full_state_close(e);
    return err;
  }
  /* Rank 0's position, checkpoint or not: ranks that come to a fresh
   * start from a regroup may hold other ones. */
  *pos = (gs_position_t){hdr[1], hdr[2], hdr[3], hdr[4]};
  e->optim_steps = hdr[5];
  e->committed = *pos;
  if (!hdr[0])
    return e->period >= 0 ? gs__engine_broadcast_packs(e, false, 0) : 0;
  err = gs__engine_full_state_assembled(e)
            ? 0
            : gs__engine_full_state_open(e); /* rank 0's holds the checkpoint */
  err = err ? err : gs__engine_broadcast_packs(e, true, 0);
  if (err) {
    gs__engine_full_state_close(e);
    return err;
  }
  return gs__engine_full_state_keep(e);
}

bool gs__engine_checkpointed(const gs_engine_t *e, uint64_t step)
{
  return e->ckpt_taken && e->ckpt_step == step;
}
