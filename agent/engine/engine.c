/* The sync engine's lifecycle: new, start (join the job, start the
 * heartbeat, agree on the pack list, allocate the packs, connect the
 * ranks, start the comm thread),
 * the accessors, finish and free. The step, the comm thread and the
 * syncs outside a step have their own files (engine_internal.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

/* A copy of `s` in *copy (NULL stays NULL); false when out of memory. */
static bool copy_string(const char *s, char **copy)
{
  *copy = s ? strdup(s) : NULL;
  return !s || *copy;
}

/* The copies gs_engine_new made of the config's strings. */
static void free_strings(gs_engine_t *e)
{
  free(e->job);
  free(e->token);
  free(e->checkpoint_dir);
  free(e->tls_ca);
  free(e->tls_cert);
  free(e->tls_key);
}

gs_engine_t *gs_engine_new(const gs_engine_config_t *cfg)
{
  gs_engine_t *e = calloc(1, sizeof(*e));

  if (!e)
    return NULL;
  e->cfg = *cfg;
  if (!copy_string(cfg->coord.job, &e->job) || !copy_string(cfg->coord.token, &e->token) ||
      !copy_string(cfg->checkpoint_dir, &e->checkpoint_dir) ||
      !copy_string(cfg->coord.tls_ca, &e->tls_ca) ||
      !copy_string(cfg->coord.tls_cert, &e->tls_cert) ||
      !copy_string(cfg->coord.tls_key, &e->tls_key)) {
    free_strings(e);
    free(e);
    return NULL;
  }
  e->cfg.coord.job = e->job;
  e->cfg.coord.token = e->token;
  e->cfg.coord.tls_ca = e->tls_ca;
  e->cfg.coord.tls_cert = e->tls_cert;
  e->cfg.coord.tls_key = e->tls_key;
  e->cfg.checkpoint_dir = e->checkpoint_dir;
  e->log = (gs_log_t){GS_LOG_INFO, NULL, "gradsync"};
  if (!e->cfg.log)
    e->cfg.log = &e->log;
  if (!e->cfg.coord.log)
    e->cfg.coord.log = e->cfg.log;
  e->repeated_param = -1;
  gs_packs_init(&e->packs);
  gs__ckpt_writer_init(&e->ckpt_writer, e->cfg.checkpoint_dir, e->cfg.checkpoint_keep,
                       e->cfg.checkpoint_failures, e->cfg.log, e->cfg.coord.job);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  return e;
}

const char *gs_engine_error(const gs_engine_t *e)
{
  return e->error[0] ? e->error : "no error";
}

const char *gs_engine_strerror(int err)
{
  return gs_strerror(err);
}

int gs_engine_register(gs_engine_t *e, const char *name, uint64_t elements, bool is_bias)
{
  int idx = gs_packs_register(&e->packs, name, elements, is_bias);

  if (idx < 0)
    gs_set_why(e->error, sizeof(e->error), "cannot register parameter '%s': %s", name ? name : "?",
               gs_strerror(idx));
  return idx;
}

int gs_engine_param_rule(gs_engine_t *e, uint32_t i, float lr_mult, float weight_decay)
{
  int err = gs_packs_set_rule(&e->packs, i, lr_mult, weight_decay);

  if (err)
    gs_set_why(e->error, sizeof(e->error),
               "cannot give parameter %u LR multiplier %g and weight decay %g: %s", i,
               (double)lr_mult, (double)weight_decay,
               i >= e->packs.nparams ? "no such parameter"
               : e->packs.packs      ? "the engine has started"
                                     : "each must be finite and not negative");
  return err;
}

uint32_t gs_engine_rank(const gs_engine_t *e)
{
  return e->join.rank;
}

uint32_t gs_engine_state_rank(const gs_engine_t *e)
{
  return e->join.resume_state ? e->join.state_rank : 0;
}

void gs_engine_position(const gs_engine_t *e, gs_position_t *out)
{
  *out = e->committed;
}

bool gs_engine_world_changed(int err)
{
  return err == GS_EREGROUPED;
}

uint32_t gs_engine_world_size(const gs_engine_t *e)
{
  return e->join.world_size;
}

uint64_t gs_engine_generation(const gs_engine_t *e)
{
  return e->join.generation;
}

uint32_t gs_engine_pack_count(const gs_engine_t *e)
{
  return e->packs.list.pack_count;
}

int32_t gs_engine_bcast_period(const gs_engine_t *e)
{
  return e->period;
}

float *gs_engine_param(const gs_engine_t *e, uint32_t i)
{
  return gs_packs_param(&e->packs, i);
}

float *gs_engine_grad(const gs_engine_t *e, uint32_t i)
{
  return gs_packs_grad(&e->packs, i);
}

uint32_t gs_engine_param_pack(const gs_engine_t *e, uint32_t i)
{
  return i < e->packs.nparams && e->packs.pack_of ? e->packs.pack_of[i] : 0;
}

int gs_engine_set_layout_desc(gs_engine_t *e, const char *desc)
{
  char *copy;

  if (e->joined || !desc || strlen(desc) > GS_CKPT_DESC_MAX) {
    gs_set_why(e->error, sizeof(e->error), "cannot set the layout description: %s",
               e->joined ? "called after start" : "missing or over 4096 bytes");
    return GS_EINVAL;
  }
  copy = strdup(desc);
  if (!copy)
    return GS_ENOMEM;
  free(e->layout_desc);
  e->layout_desc = copy;
  return 0;
}

/* The default layout description: each parameter's name and size, as far
 * as they fit ("params fc1.weight[200704] fc1.bias[256] ..."). */
static int describe_params(gs_engine_t *e)
{
  size_t cap = GS_CKPT_DESC_MAX + 1, used;
  char *d = malloc(cap);

  if (!d)
    return GS_ENOMEM;
  used = (size_t)snprintf(d, cap, "params");
  for (uint32_t i = 0; i < e->packs.nparams; i++) {
    char one[320];
    int n = snprintf(one, sizeof(one), " %s[%" PRIu64 "]", e->packs.params[i].name,
                     e->packs.params[i].elements);

    if (n < 0 || used + (size_t)n + 4 >= cap) {
      snprintf(d + used, cap - used, " ...");
      break;
    }
    memcpy(d + used, one, (size_t)n + 1);
    used += (size_t)n;
  }
  e->layout_desc = d;
  return 0;
}

/* ---- start -------------------------------------------------------------- */

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

  if (e->join.rank == 0) {
    err = built ? 0 : gs_packlist_compute(params, n, e->cfg.pack_threshold, &list);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot compute the pack list: %s", gs_strerror(err));
      return err;
    }
    err =
        gs_client_publish_packlist(e->client, e->join.generation, 0, built ? &e->packs.list : &list,
                                   params, n, e->cfg.rpc_timeout_ms);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot publish the pack list: %s",
                 gs_client_error(e->client));
      if (!built)
        gs_packlist_free(&list);
      return err;
    }
  } else {
    err = gs_client_fetch_packlist(e->client, e->join.generation, &list, &params, &n,
                                   e->cfg.join_timeout_ms);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "cannot fetch the pack list from the coordinator: %s",
                 gs_client_error(e->client));
      return err;
    }
    fetched = true;
  }
  if (built) {
    err = e->join.rank == 0 || same_packlist(&list, &e->packs.list) ? 0 : GS_EINVAL;
    if (err)
      gs_set_why(e->error, sizeof(e->error),
                 "rank 0's pack list after the regroup differs from this rank's");
    if (fetched)
      gs_packlist_free(&list);
  } else {
    err = gs_packs_build(&e->packs, e->cfg.dev, &list, params, n, e->nctl_cap, &e->cfg.sgd, why,
                         sizeof(why));
    if (err)
      gs_set_why(e->error, sizeof(e->error), "rank 0's pack list does not fit this model: %s", why);
  }
  if (fetched)
    gs_client_params_free(params, n);
  if (!err && e->join.rank == 0)
    gs_heartbeat_set_packlist(e->hb, &e->packs.list, e->packs.params, e->packs.nparams);
  return err;
}

static int join(gs_engine_t *e, const char *comm_addr)
{
  gradsync_JoinRequest *req = &e->join_req;
  int err;

  req->world_size = e->cfg.world_size;
  req->world_min = e->cfg.world_min;
  snprintf(req->node, sizeof(req->node), "%s", e->cfg.node);
  req->local_rank = e->cfg.local_rank;
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
  gs_pb_array_bind_encode(&req->settings, &e->settings);
  if (e->cfg.world_min)
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, -1,
           "joining %s:%u as node '%s' local rank %u (elastic: %u to %u ranks)", e->cfg.coord.host,
           e->cfg.coord.port, e->cfg.node, e->cfg.local_rank, e->cfg.world_min, e->cfg.world_size);
  else
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, -1,
           "joining %s:%u as node '%s' local rank %u (world size %u)", e->cfg.coord.host,
           e->cfg.coord.port, e->cfg.node, e->cfg.local_rank, e->cfg.world_size);
  err = gs_client_join(e->client, req, e->cfg.join_timeout_ms, &e->join);
  if (err) {
    /* A signal is no failure of the join: its message says what was waited for. */
    gs_set_why(e->error, sizeof(e->error), "%s%s",
               err == GS_EINTR ? "" : "join failed: ", gs_client_error(e->client));
    return err;
  }
  gs__engine_joined(e);
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, e->join.rank,
         "joined generation %" PRIu64 ": rank %u of %u, broadcast period %d", e->join.generation,
         e->join.rank, e->join.world_size, e->period);
  return 0;
}

/* What follows from a Join's answer: the period, the control vector's
 * length and the scales that depend on the world size. */
void gs__engine_joined(gs_engine_t *e)
{
  pthread_mutex_lock(&e->mu);
  e->live_generation = e->join.generation;
  pthread_mutex_unlock(&e->mu);
  e->joined = true;
  e->period = e->join.bcast_period;
  /* Requests made before this Join were for the ranks before it (a rank 0
   * of an earlier generation passed them on, or they are moot). */
  e->coordinator_id = e->join.coordinator_id;
  e->seen_broadcast_seq = e->join.broadcast_seq;
  e->seen_checkpoint_seq = e->join.checkpoint_seq;
  e->seen_regroup_seq = e->join.regroup_seq;
  e->nctl = gs_control_len(e->join.world_size);
  e->grad_scale = e->cfg.reduce == GS_REDUCE_MEAN ? 1.0 / e->join.world_size : 1.0;
  e->lr_scale = e->cfg.elastic_lr == GS_ELASTIC_LR_LINEAR
                    ? (float)e->join.world_size / (float)e->cfg.world_size
                    : 1.0f;
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
  if (e->join.rank == 0) {
    err = gs_comm_make_id(e->comm, id, COMM_ID_MAX, len);
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "the %s backend cannot make its rendezvous id: %s",
                 gs_comm_name(e->comm), gs_strerror(err));
      return err;
    }
    err = gs_client_publish(e->client, e->join.generation, COMM_ID_KEY, id, *len,
                            e->cfg.rpc_timeout_ms);
  } else {
    err = gs_client_fetch(e->client, e->join.generation, COMM_ID_KEY, id, COMM_ID_MAX, len,
                          e->cfg.join_timeout_ms);
  }
  if (err)
    gs_set_why(
        e->error, sizeof(e->error), "cannot %s the %s rendezvous id through the coordinator: %s",
        e->join.rank == 0 ? "publish" : "fetch", gs_comm_name(e->comm), gs_client_error(e->client));
  return err;
}

static int connect_ranks(gs_engine_t *e)
{
  uint32_t w = e->join.world_size;
  const char **addrs = calloc(w, sizeof(*addrs));
  uint8_t id[COMM_ID_MAX];
  gs_comm_setup_t setup = {
      .rank = e->join.rank,
      .world_size = w,
      .generation = e->join.generation,
      .timeout_ms = e->cfg.comm_timeout_ms,
      .connect_timeout_ms = e->cfg.connect_timeout_ms,
      .interrupt = e->cfg.term_flag,
      .device = e->cfg.dev,
      .id = id,
      /* a step queues one allreduce per pack; a broadcast of the packs two per pack */
      .max_queued = 2 * e->packs.list.pack_count + 2,
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
  for (uint32_t k = 0; k < w && e->join.peers; k++)
    if (e->join.peers[k].rank < w && e->join.peers[k].comm_addr[0])
      addrs[e->join.peers[k].rank] = e->join.peers[k].comm_addr;
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

static int alloc_step_state(gs_engine_t *e)
{
  uint32_t packs = e->packs.list.pack_count;

  e->jobs = calloc(packs + 1, sizeof(*e->jobs)); /* +1: never a zero-size calloc */
  e->qcap = packs + 1;
  e->queue = calloc(e->qcap, sizeof(*e->queue));
  e->ready = calloc(e->packs.nparams, sizeof(*e->ready));
  e->ticket = calloc(packs + 1, sizeof(*e->ticket));
  e->ctl = gs_device_host_alloc(e->cfg.dev, e->nctl_cap * sizeof(float));
  e->aux_dev = gs_device_alloc(e->cfg.dev, AUX_BYTES);
  if (!e->jobs || !e->queue || !e->ready || !e->ticket || !e->ctl || !e->aux_dev) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  return 0;
}

/* The coordinator client's view of the config. */
static gs_client_config_t client_config(const gs_engine_t *e)
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

/* The TLS context of coord.tls_*, shared by the client and the heartbeat
 * thread's; made before either dials, so a bad file fails the start. */
static int open_tls(gs_engine_t *e)
{
  const gs_engine_coord_t *c = &e->cfg.coord;
  gs_client_tls_config_t tc = {.ca = c->tls_ca, .cert = c->tls_cert, .key = c->tls_key};
  char why[512];

  if (!c->tls_ca && !c->tls_cert && !c->tls_key)
    return 0;
  e->tls = gs_client_tls_new(&tc, why, sizeof(why));
  if (!e->tls) {
    gs_set_why(e->error, sizeof(e->error), "TLS: %s", why);
    return GS_EINVAL;
  }
  return 0;
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
      .client = client_config(e),
      .generation = e->join.generation,
      .rank = e->join.rank,
      .interval_ms = e->join.heartbeat_interval_ms ? e->join.heartbeat_interval_ms : 1000,
      .timeout_ms = e->join.heartbeat_timeout_ms ? e->join.heartbeat_timeout_ms : 10000,
      .grace_ms = e->cfg.coordinator_grace_ms,
      .session = e->join.session,
      .on_abort = gs__engine_on_abort,
      .arg = e,
      .rejoin = &e->join_req,
  };

  e->hb = gs_heartbeat_start(&hc);
  if (!e->hb) {
    gs_set_why(e->error, sizeof(e->error), "cannot start the heartbeat thread");
    return GS_ENOMEM;
  }
  return 0;
}

/* Opens the device cfg.device names ("cpu", "cuda", "cuda:N") for a
 * caller that passed none; gs_engine_free closes it. */
static int open_device(gs_engine_t *e)
{
  const char *name = e->cfg.device[0] ? e->cfg.device : "cpu";
  bool cpu = strcmp(name, "cpu") == 0;
  char why[256];
  int index = 0;

  if (!cpu && strcmp(name, "cuda") != 0 && (sscanf(name, "cuda:%d", &index) != 1 || index < 0)) {
    gs_set_why(e->error, sizeof(e->error), "unknown device '%s' (cpu, cuda or cuda:N)", name);
    return GS_EINVAL;
  }
  e->cfg.dev = gs_device_open(cpu ? "cpu" : "cuda", index, e->cfg.log, why, sizeof(why));
  if (!e->cfg.dev) {
    gs_set_why(e->error, sizeof(e->error), "cannot open device %s: %s", name, why);
    return GS_EUNAVAIL;
  }
  e->owns_dev = true;
  if (!cpu && e->cfg.cuda_stream && gs_device_use_stream(e->cfg.dev, e->cfg.cuda_stream)) {
    gs_set_why(e->error, sizeof(e->error), "cannot queue %s's work on the given CUDA stream", name);
    return GS_EUNAVAIL;
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
  pthread_mutex_lock(&e->mu); /* the heartbeat's abort reads it */
  e->comm = comm;
  pthread_mutex_unlock(&e->mu);
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

int gs_engine_start(gs_engine_t *e)
{
  char comm_addr[256];
  char why[512];
  int err;

  if (e->packs.nparams == 0) {
    gs_set_why(e->error, sizeof(e->error), "no parameters registered");
    return GS_EINVAL;
  }
  if (gs_sgd_config_check(&e->cfg.sgd, why, sizeof(why))) {
    gs_set_why(e->error, sizeof(e->error), "%s", why);
    return GS_EINVAL;
  }
  if (!e->layout_desc && describe_params(e)) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  /* Before the rendezvous: a directory that cannot take a checkpoint must
   * not surface at the first save, after every rank waited and trained. */
  if (e->cfg.checkpoint_dir) {
    err = gs_checkpoint_dir_check(e->cfg.checkpoint_dir, why, sizeof(why));
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "checkpoint directory %s is not usable: %s",
                 e->cfg.checkpoint_dir, why);
      return err;
    }
  }
  if (!e->cfg.dev) {
    err = open_device(e);
    if (err)
      return err;
  }
  err = open_tls(e);
  if (err)
    return err;
  {
    gs_client_config_t cc = client_config(e);

    cc.interrupt = e->cfg.term_flag; /* the waits of start end at a signal; Leave does not */
    e->client = gs_client_new(&cc);
  }
  if (!e->client) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  err = gs__engine_open_comm(e, comm_addr, sizeof(comm_addr));
  if (err)
    return err;
  err = join(e, comm_addr);
  if (err)
    return err;
  err = gs__engine_start_heartbeat(e);
  if (err)
    return err;
  e->nctl_cap = gs_control_len(e->cfg.world_size); /* room for the largest world */
  err = gs__engine_agree_packlist(e);
  if (err)
    return err;
  e->ctl_dev = e->packs.packs[gs_packs_last(&e->packs)].grads +
               e->packs.packs[gs_packs_last(&e->packs)].elements;
  err = alloc_step_state(e);
  if (err)
    return err;
  return gs__engine_go_live(e);
}

/* The last steps of start, and of an elastic regroup: connect the ranks,
 * give rank 0 its checkpoint writer (a rank that becomes rank 0 in a
 * regroup starts one), start the comm thread. */
int gs__engine_go_live(gs_engine_t *e)
{
  int err = connect_ranks(e);

  if (err)
    return err;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, e->join.rank,
         "%u params in %u packs (threshold %" PRIu64 " bytes), %s backend connected",
         e->packs.nparams, e->packs.list.pack_count, e->cfg.pack_threshold, gs_comm_name(e->comm));
  if (e->join.rank == 0 && e->cfg.checkpoint_dir && !e->ckpt_writer.started) {
    err = gs__ckpt_writer_start(&e->ckpt_writer, e->error, sizeof(e->error));
    if (err)
      return err;
  }
  return gs__engine_comm_start(e);
}

void gs_engine_report(gs_engine_t *e, const gs_progress_t *p)
{
  if (e->hb)
    gs_heartbeat_report(e->hb, p);
}

/* Leaves before the heartbeat connection closes: the coordinator counts a
 * running rank's connection closing as that rank lost. */
void gs_engine_finish(gs_engine_t *e, bool finished, const char *reason)
{
  char why[640];

  /* A run that ends well keeps its model: the last step is checkpointed
   * unless a checkpoint of it was taken already (--checkpoint-every, a stop). */
  if (finished && e->cfg.checkpoint_dir && e->join.rank == 0 && e->steps_begun && !e->failed &&
      !(e->ckpt_taken && e->ckpt_step == e->after.step) && gs_engine_checkpoint(e, &e->after)) {
    finished = false;
    reason = "the last checkpoint could not be written";
  }
  /* A checkpoint still being written (the one taken at a stop, say) is
   * complete before this rank leaves; the writer logged a failure. */
  if (gs__ckpt_writer_wait(&e->ckpt_writer, why, sizeof(why)) && finished) {
    finished = false;
    reason = "the last checkpoint could not be written";
    gs_set_why(e->error, sizeof(e->error), "%s", why);
  }
  gs__engine_comm_stop(e, !finished);
  if (e->joined && e->client) {
    int err = gs_client_leave(e->client, e->join.generation, e->join.rank, finished,
                              reason ? reason : "", 2000);

    if (err)
      gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, e->join.rank, "leave failed: %s",
             gs_client_error(e->client));
    e->joined = false;
  }
  gs_heartbeat_stop(e->hb);
  e->hb = NULL;
  gs_comm_destroy(e->comm);
  e->comm = NULL;
}

void gs_engine_free(gs_engine_t *e)
{
  if (!e)
    return;
  gs__ckpt_writer_stop(&e->ckpt_writer);
  gs_heartbeat_stop(e->hb);
  gs__engine_comm_stop(e, true);
  gs_comm_destroy(e->comm);
  gs_client_free(e->client);
  gs_join_result_free(&e->join);
  gs_packs_free(&e->packs);
  gs_pb_array_free(&e->settings);
  free(e->jobs);
  free(e->queue);
  free(e->ready);
  free(e->ticket);
  if (e->cfg.dev) {
    gs_device_host_free(e->cfg.dev, e->ctl);
    gs_device_free(e->cfg.dev, e->aux_dev);
  }
  if (e->owns_dev)
    gs_device_destroy(e->cfg.dev);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  gs_client_tls_free(e->tls); /* after every client that used it */
  free_strings(e);
  free(e->layout_desc);
  free(e);
}
