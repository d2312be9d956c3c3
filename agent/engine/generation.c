/* Entering a generation: the steps of start that an elastic regroup
 * repeats. A new collective backend listening for its peers, the Join,
 * the heartbeat, the pack list agreed with rank 0, and going live: the
 * ranks connected, the comm thread started. The engine's lifecycle
 * (engine.c) and its elastic regroups (elastic.c) both call these; these
 * call neither. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

/* Whether two pack lists group the same parameters alike. */
static bool same_packlist(const gs_packlist_t *a, const gs_packlist_t *b)
{
  return a->param_count == b->param_count && a->pack_count == b->pack_count &&
         !memcmp(a->pack_sizes, b->pack_sizes, a->pack_count * sizeof(*a->pack_sizes)) &&
         !memcmp(a->order, b->order, a->param_count * sizeof(*a->order));
}

/* Rank 0 computes and publishes the pack list; the others fetch it. Either
 * way the packs are then built from it. After an elastic regroup the packs
 * exist: rank 0 publishes the list they were built from, and the others
 * check theirs against it. */
int gs__engine_agree_packlist(gs_engine_t *e)
{
  gs_packlist_t list;
  gs_param_desc_t *params = e->packs.params;
  uint32_t n = e->packs.nparams;
  bool fetched = false, built = e->packs.packs != NULL;
  char why[512];
  int err;

  if (gs__membership_rank(&e->member) == 0) {
    err = built ? 0 : gs_packlist_compute(params, n, e->cfg.pack_threshold, &list);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot compute the pack list: %s", gs_strerror(err));
      return err;
    }
    err = gs_client_publish_packlist(e->client, gs__membership_generation(&e->member), 0,
                                     built ? &e->packs.list : &list, params, n,
                                     e->cfg.rpc_timeout_ms);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot publish the pack list: %s",
                 gs_client_error(e->client));
      if (!built)
        gs_packlist_free(&list);
      return err;
    }
  } else {
    err = gs_client_fetch_packlist(e->client, gs__membership_generation(&e->member), &list, &params,
                                   &n, e->cfg.join_timeout_ms);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot fetch the pack list from the coordinator: %s",
                 gs_client_error(e->client));
      return err;
    }
    fetched = true;
  }
  if (built) {
    err = gs__membership_rank(&e->member) == 0 || same_packlist(&list, &e->packs.list) ? 0
                                                                                       : GS_EINVAL;
    if (err)
      gs_set_why(e->error, sizeof(e->error),
                 "rank 0's pack list after the regroup differs from this rank's");
    if (fetched)
      gs_packlist_free(&list);
  } else {
    gs_packs_layout_t layout = {
        .extra = gs__engine_sharded(e) ? 0 : e->nctl_cap, /* the control vector rides along */
        .pad = gs__engine_shard_pad(e),
        .nstate = gs__engine_state_count(e),
        .wire = gs__engine_wire_dtype(e),
        .sharded = gs__engine_sharded(e),
    };

    err = gs_packs_build(&e->packs, e->cfg.dev, &list, params, n, &layout, why, sizeof(why));
    if (err)
      gs_set_why(e->error, sizeof(e->error), "rank 0's pack list does not fit this model: %s", why);
  }
  if (fetched)
    gs_client_params_free(params, n);
  if (!err && gs__membership_rank(&e->member) == 0)
    gs_heartbeat_set_packlist(e->hb, &e->packs.list, e->packs.params, e->packs.nparams);
  return err;
}

/* The first Join of this engine, for the world its config asks for. */
int gs__engine_join(gs_engine_t *e, const char *comm_addr)
{
  gradsync_JoinRequest *req = &e->member.req;
  char where[320];
  int err;

  req->world_size = e->cfg.world_size;
  req->world_min = e->cfg.world_min;
  snprintf(req->node, sizeof(req->node), "%s", e->cfg.node);
  req->local_rank = e->cfg.local_rank;
  req->has_rank = e->cfg.has_rank && !e->cfg.world_min;
  req->rank = req->has_rank ? e->cfg.rank : 0;
  snprintf(req->device, sizeof(req->device), "%s", e->cfg.device);
  req->has_model_signature = true;
  gs_packs_signature(&e->packs, &req->model_signature);
  snprintf(req->comm_addr, sizeof(req->comm_addr), "%s", comm_addr);
  req->peers = gradsync_PeerSet_PEERS_RING; /* the ring needs its neighbours only */
  req->bcast_period = e->cfg.bcast_period;
  /* So the coordinator can refuse a checkpoint request that nobody would act on. */
  req->checkpoints = e->cfg.checkpoint_dir ? gradsync_Checkpoints_CHECKPOINTS_ON
                                           : gradsync_Checkpoints_CHECKPOINTS_OFF;
  err = gs__engine_add_own_settings(e);
  if (err)
    return err;
  gs_pb_array_bind_encode(&req->settings, &e->member.settings);
  /* A node agent's socket has no port. */
  if (e->cfg.coord.port)
    snprintf(where, sizeof(where), "%s:%u", e->cfg.coord.host, e->cfg.coord.port);
  else
    snprintf(where, sizeof(where), "%s (a node agent)", e->cfg.coord.host);
  if (e->cfg.world_min)
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, -1,
           "joining %s as node '%s' local rank %u (elastic: %u to %u ranks)", where, e->cfg.node,
           e->cfg.local_rank, e->cfg.world_min, e->cfg.world_size);
  else
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, -1,
           "joining %s as node '%s' local rank %u (world size %u)", where, e->cfg.node,
           e->cfg.local_rank, e->cfg.world_size);
  err = gs_client_join(e->client, req, e->cfg.join_timeout_ms, &e->member.join);
  if (err) {
    /* A signal is no failure of the join: its message says what was waited for. */
    gs_set_why(e->error, sizeof(e->error), "%s%s",
               err == GS_EINTR ? "" : "join failed: ", gs_client_error(e->client));
    return err;
  }
  /* A coordinator older than the rank field orders by node alone. */
  if (req->has_rank && gs__membership_rank(&e->member) != req->rank) {
    gs_set_why(e->error, sizeof(e->error),
               "the coordinator made this agent rank %u, but its launcher numbered it rank %u "
               "($RANK): the coordinator is older than this agent; upgrade it, or start the "
               "agents without a rank",
               gs__membership_rank(&e->member), req->rank);
    return GS_EPROTO;
  }
  gs__engine_joined(e);
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
         "joined generation %" PRIu64 ": rank %u of %u, broadcast period %d",
         gs__membership_generation(&e->member), gs__membership_rank(&e->member),
         gs__membership_world(&e->member), e->period);
  return 0;
}

/* What follows from a Join's answer: the period, the control vector's
 * length and the scales that depend on the world size. */
void gs__engine_joined(gs_engine_t *e)
{
  gs__comm_thread_live(&e->ct, gs__membership_generation(&e->member));
  e->member.joined = true;
  e->period = e->member.join.bcast_period;
  /* Requests made before this Join were for the ranks before it (a rank 0
   * of an earlier generation passed them on, or they are moot). */
  e->coordinator_id = e->member.join.coordinator_id;
  e->seen_broadcast_seq = e->member.join.broadcast_seq;
  e->seen_checkpoint_seq = e->member.join.checkpoint_seq;
  e->seen_regroup_seq = e->member.join.regroup_seq;
  gs__trace_joined(e);
  e->nctl = gs_control_len(gs__membership_world(&e->member));
  e->grad_scale = e->cfg.reduce == GS_REDUCE_MEAN ? 1.0 / gs__membership_world(&e->member) : 1.0;
  e->lr_scale = e->cfg.elastic_lr == GS_ELASTIC_LR_LINEAR
                    ? (float)gs__membership_world(&e->member) / (float)e->cfg.world_size
                    : 1.0f;
  /* Every rank of the generation took the same from its Join. */
  gs__engine_operator_lr_scale(e, e->member.join.lr_scale);
}

/* The operator's lr scale in effect, and in the Join a re-registration
 * sends, so that a restarted coordinator is told. */
void gs__engine_operator_lr_scale(gs_engine_t *e, float scale)
{
  e->operator_lr_scale = e->member.req.lr_scale = scale;
}

#define COMM_ID_KEY "comm-id"

#define COMM_ID_MAX 1024

/* Backends with a rendezvous id (nccl): rank 0 makes it and publishes it
 * for this generation through the coordinator; the others fetch it. */
static int share_comm_id(gs_engine_t *e, uint8_t *id, size_t *len)
{
  int err;

  *len = 0;
  if (!gs_comm_needs_id(e->comm))
    return 0;
  if (gs__membership_rank(&e->member) == 0) {
    err = gs_comm_make_id(e->comm, id, COMM_ID_MAX, len);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "the %s backend cannot make its rendezvous id: %s",
                 gs_comm_name(e->comm), gs_strerror(err));
      return err;
    }
    err = gs_client_publish(e->client, gs__membership_generation(&e->member), COMM_ID_KEY, id, *len,
                            e->cfg.rpc_timeout_ms);
  } else {
    err = gs_client_fetch(e->client, gs__membership_generation(&e->member), COMM_ID_KEY, id,
                          COMM_ID_MAX, len, e->cfg.join_timeout_ms);
  }
  if (err)
    gs_set_why(e->error, sizeof(e->error),
               "cannot %s the %s rendezvous id through the coordinator: %s",
               gs__membership_rank(&e->member) == 0 ? "publish" : "fetch", gs_comm_name(e->comm),
               gs_client_error(e->client));
  return err;
}

static int connect_ranks(gs_engine_t *e)
{
  uint32_t w = gs__membership_world(&e->member);
  const char **addrs = calloc(w, sizeof(*addrs));
  uint8_t id[COMM_ID_MAX];
  gs_comm_setup_t setup = {
      .rank = gs__membership_rank(&e->member),
      .world_size = w,
      .generation = gs__membership_generation(&e->member),
      .timeout_ms = e->cfg.comm_timeout_ms,
      .connect_timeout_ms = e->cfg.connect_timeout_ms,
      .interrupt = e->cfg.term_flag,
      .device = e->cfg.dev,
      .id = id,
      /* a step queues one allreduce per pack (sharded: a reduce-scatter and
       * an allgather per pack, and the control vector's); deciding late
       * retires a step's after the next one's reductions are queued; a
       * broadcast of the packs two per pack; a front end's device
       * collectives between steps up to QUEUED_BETWEEN_STEPS before a sync
       * (comm_thread.c) */
      .max_queued =
          (gs__engine_sharded(e) ? 4 : 2) * e->packs.list.pack_count + 2 + QUEUED_BETWEEN_STEPS,
      .gauge = e->cfg.no_progress ? NULL : &e->board.comm,
      .tcp_only = e->cfg.host_tcp_only,
  };
  int err;

  if (!addrs)
    return GS_ENOMEM;
  err = share_comm_id(e, id, &setup.id_len);
  if (err) {
    free(addrs);
    return err;
  }
  for (uint32_t r = 0; r < w; r++)
    addrs[r] = "";
  for (uint32_t k = 0; k < w && e->member.join.peers; k++)
    if (e->member.join.peers[k].rank < w && e->member.join.peers[k].comm_addr[0])
      addrs[e->member.join.peers[k].rank] = e->member.join.peers[k].comm_addr;
  setup.peer_addrs = addrs;
  err = gs_comm_init(e->comm, &setup);
  free(addrs);
  if (err) {
    char what[64];

    /* The heartbeat runs already: name the coordinator's abort if there was one. */
    snprintf(what, sizeof(what), "connecting to the other ranks (%s backend)",
             gs_comm_name(e->comm));
    return gs__engine_comm_failed(e, err, what);
  }
  return 0;
}

/* What a step needs besides the packs, sized by them: made once, at the
 * first generation this engine goes live in (the packs never change). */
static int alloc_step_state(gs_engine_t *e)
{
  uint32_t packs = e->packs.list.pack_count;

  if (e->ready)
    return 0;
  /* Sharded: the control vector travels alone, with the shards' verdict
   * after it (step.c's reduce_control). */
  if (gs__engine_sharded(e)) {
    /* and the gates of an update a regroup may hand on, after them */
    e->ctl_dev = gs_device_alloc(e->cfg.dev, (e->nctl_cap + 4) * sizeof(float));
    e->skip_dev = e->ctl_dev ? e->ctl_dev + e->nctl_cap : NULL;
    gs__engine_shard_gates_at(e, e->ctl_dev ? e->ctl_dev + e->nctl_cap + 1 : NULL);
  } else {
    e->ctl_dev = e->packs.packs[gs_packs_last(&e->packs)].grads +
                 e->packs.packs[gs_packs_last(&e->packs)].elements;
    e->skip_dev = gs_device_alloc(e->cfg.dev, sizeof(float));
  }
  e->ready = calloc(e->packs.nparams, sizeof(*e->ready));
  e->ticket = calloc(packs + 1, sizeof(*e->ticket));
  for (int k = 0; k < 2; k++) {
    e->ctl_up[k] = gs_device_host_alloc(e->cfg.dev, e->nctl_cap * sizeof(float));
    e->flight[k].ctl = gs_device_host_alloc(e->cfg.dev, e->nctl_cap * sizeof(float));
    e->flight[k].fetched = gs_device_host_alloc(e->cfg.dev, FETCHED_COUNT * sizeof(float));
  }
  e->ctl = e->ctl_up[0];
  e->late = e->cfg.decide == GS_DECIDE_LATE && !gs__engine_elastic(e);
  e->aux_dev = gs_device_alloc(e->cfg.dev, AUX_BYTES);
  e->drive.fetched = gs_device_host_alloc(e->cfg.dev, FETCHED_COUNT * sizeof(float));
  if (gs__comm_thread_size(&e->ct, packs) || !e->ready || !e->ticket || !e->ctl_up[0] ||
      !e->ctl_up[1] || !e->flight[0].ctl || !e->flight[1].ctl || !e->flight[0].fetched ||
      !e->flight[1].fetched || !e->aux_dev || !e->skip_dev || !e->drive.fetched) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  return 0;
}

/* The coordinator client's view of the config. */
gs_client_config_t gs__engine_client_config(const gs_engine_t *e)
{
  gs_client_config_t c = {
      .port = e->cfg.coord.port,
      .token = e->cfg.coord.token,
      .job = e->cfg.coord.job,
      .log = e->cfg.coord.log,
      .tls = e->tls,
  };

  snprintf(c.host, sizeof(c.host), "%s", e->cfg.coord.host);
  return c;
}

/* Starts heartbeating right after Join: the coordinator's timeout runs
 * from the Join, and agreeing on the pack list and connecting the ranks
 * (an NCCL init takes seconds to a minute on a real cluster) must neither
 * look like a lost rank nor keep a coordinator's abort from reaching this
 * rank: the abort callback aborts the communicator, which the backends'
 * init waits watch. */
int gs__engine_start_heartbeat(gs_engine_t *e)
{
  gs_heartbeat_config_t hc = {
      .client = gs__engine_client_config(e),
      .generation = gs__membership_generation(&e->member),
      .rank = gs__membership_rank(&e->member),
      .world_size = gs__membership_world(&e->member),
      .interval_ms =
          e->member.join.heartbeat_interval_ms ? e->member.join.heartbeat_interval_ms : 1000,
      .timeout_ms =
          e->member.join.heartbeat_timeout_ms ? e->member.join.heartbeat_timeout_ms : 10000,
      .grace_ms = e->cfg.coordinator_grace_ms,
      .session = e->member.join.session,
      .on_abort = gs__engine_on_abort,
      .arg = e,
      .rejoin = &e->member.req,
      .where = e->cfg.no_progress ? NULL : gs__engine_where,
      .where_arg = e,
  };

  if (hc.grace_ms < hc.timeout_ms && !e->member.grace_told) {
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
           "--coordinator-grace %.1f s is below the coordinator's heartbeat timeout (%.1f s): this "
           "rank waits %.1f s for an unreachable coordinator before it stops (it may not give up "
           "on a generation the coordinator still runs)",
           hc.grace_ms / 1000.0, hc.timeout_ms / 1000.0, hc.timeout_ms / 1000.0);
    e->member.grace_told = true;
  }
  e->hb = gs_heartbeat_start(&hc);
  if (!e->hb) {
    gs_set_why(e->error, sizeof(e->error), "cannot start the heartbeat thread");
    return GS_ENOMEM;
  }
  return 0;
}

/* A new collective backend for this generation, listening for its peers
 * (its address in `addr`). */
int gs__engine_open_comm(gs_engine_t *e, char *addr, size_t addr_len)
{
  gs_comm_t *comm = gs_comm_new(e->cfg.backend, e->cfg.log);

  if (!comm) {
    gs_set_why(e->error, sizeof(e->error), "unknown backend '%s'", e->cfg.backend);
    return GS_EINVAL;
  }
  gs__comm_thread_set_comm(&e->ct, &e->comm, comm);
  /* Blocking backends move host memory, stream-ordered ones device memory. */
  if (gs_comm_stream_ordered(e->comm) == e->cfg.dev->host_memory) {
    gs_set_why(e->error, sizeof(e->error),
               "the %s backend cannot work on %s memory (use --backend %s with --device %s)",
               gs_comm_name(e->comm), e->cfg.dev->label, e->cfg.dev->host_memory ? "host" : "nccl",
               e->cfg.dev->host_memory ? "cpu" : "cuda");
    return GS_EINVAL;
  }
  return gs__engine_listen(e, addr, addr_len);
}

/* The last steps of start, and of an elastic regroup: the step's state
 * allocated once, connect the ranks,
 * give rank 0 its checkpoint writer (a rank that becomes rank 0 in a
 * regroup starts one), start the comm thread. */
int gs__engine_go_live(gs_engine_t *e)
{
  int err = alloc_step_state(e);

  err = err ? err : connect_ranks(e);
  /* Sharded: the windows of the first world (a regroup's state is cut
   * again once its shards are assembled: reshard.c). */
  if (!err && !e->packs.packs[0].win[GS_WINDOW_OWN].segs)
    err = gs__engine_shard(e);
  /* What the heartbeat and the step's result say this rank holds (a
   * reshard says it again). */
  atomic_store_explicit(&e->board.state_bytes, gs_packs_state_bytes(&e->packs),
                        memory_order_relaxed);
  if (err)
    return err;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, gs__membership_rank(&e->member),
         "%u params in %u packs (threshold %" PRIu64 " bytes), %s backend connected",
         e->packs.nparams, e->packs.list.pack_count, e->cfg.pack_threshold, gs_comm_name(e->comm));
  if (gs__membership_rank(&e->member) == 0 && e->cfg.checkpoint_dir && !e->ckpt_writer.started) {
    err = gs__ckpt_writer_start(&e->ckpt_writer, e->error, sizeof(e->error));
    if (err)
      return err;
  }
  return gs__engine_comm_start(e);
}
