/* The sync engine: rendezvous, packs, overlapped allreduce on a comm thread,
 * SGD per pack, the control vector, broadcast period and checkpoints. */
#include "engine.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "packs.h"
#include "clock.h"

/* The control vector: fixed slots, then one bit per rank for a non-finite
 * loss, 16 ranks per float (sums of distinct powers of two below 2^24 are
 * exact in float32, and the allreduce is always a sum). */
enum {
  CTL_STOP = 0,   /* rank 0: the coordinator asked to stop */
  CTL_PERIOD,     /* rank 0: new broadcast period + 2 (0: no change) */
  CTL_BROADCAST,  /* rank 0: broadcast params now */
  CTL_CHECKPOINT, /* rank 0: checkpoint now */
  CTL_TERM,       /* every rank: 1 if it got SIGTERM */
  CTL_NONFINITE,  /* every rank: 1 if its loss is NaN or Inf */
  CTL_FIXED,
};
#define CTL_RANKS_PER_SLOT 16
#define CTL_PERIOD_MAX (1 << 23) /* keeps period + 2 exact in a float */

/* DEFERRED: the step's last pack, run by the training thread itself when
 * it would otherwise wait for it (see launch()). */
typedef enum job_state { JOB_IDLE = 0, JOB_QUEUED, JOB_DONE, JOB_DEFERRED } job_state_t;
typedef enum job_op { OP_ALLREDUCE, OP_BROADCAST } job_op_t;

/* One collective for the comm thread. */
typedef struct comm_job {
  job_op_t op;
  void *buf;
  size_t count; /* floats (allreduce) or bytes (broadcast) */
  job_state_t state;
  int err;
} comm_job_t;

struct gs_engine {
  gs_engine_config_t cfg;
  char error[768];
  gs_packs_t packs;
  gs_client_t *client;
  gs_heartbeat_t *hb;
  gs_comm_t *comm;
  gradsync_JoinRequest join_req; /* kept to re-register after a coordinator restart */
  gs_join_result_t join;
  bool joined;
  int32_t period;
  double grad_scale;

  /* The comm thread and what it shares with the training thread. */
  pthread_t thread;
  bool thread_running;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  comm_job_t *jobs; /* one per pack */
  comm_job_t **queue;
  uint32_t qhead, qtail, qcap;
  bool quit;
  bool aborted;
  char abort_reason[300];

  /* The step in progress (training thread only). */
  bool in_step;
  bool *ready;        /* per param */
  uint32_t *launched; /* pack indices in launch order */
  uint32_t nlaunched;
  int64_t repeated_param; /* reported twice in this step, or -1 */
  uint64_t *ticket;       /* per pack: its allreduce's number (stream-ordered backends) */
  int launch_err;         /* the first failure to queue an allreduce this step */
  float *ctl;             /* host copy of the control vector */
  float *ctl_dev;         /* where it rides: after the grads of the last pack */
  size_t nctl;
  void *aux_dev;          /* device staging for small host buffers (stream-ordered) */
  gs_position_t after;
  float loss;
  uint64_t seen_broadcast_seq, seen_checkpoint_seq, coordinator_id;
};

static void set_error(gs_engine_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(gs_engine_t *e, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(e->error, sizeof(e->error), fmt, ap);
  va_end(ap);
}

gs_engine_t *gs_engine_new(const gs_engine_config_t *cfg)
{
  gs_engine_t *e = calloc(1, sizeof(*e));

  if (!e)
    return NULL;
  e->cfg = *cfg;
  e->repeated_param = -1;
  gs_packs_init(&e->packs);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  return e;
}

const char *gs_engine_error(const gs_engine_t *e)
{
  return e->error[0] ? e->error : "no error";
}

int gs_engine_register(gs_engine_t *e, const char *name, uint64_t elements, bool is_bias)
{
  int idx = gs_packs_register(&e->packs, name, elements, is_bias);

  if (idx < 0)
    set_error(e, "cannot register parameter '%s': %s", name ? name : "?", gs_strerror(idx));
  return idx;
}

uint32_t gs_engine_rank(const gs_engine_t *e)
{
  return e->join.rank;
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

/* ---- the comm thread ---------------------------------------------------- */

static int run_job(gs_engine_t *e, const comm_job_t *job)
{
  if (job->op == OP_ALLREDUCE)
    return gs_comm_allreduce(e->comm, job->buf, job->count, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
  return gs_comm_broadcast(e->comm, job->buf, job->count, 0);
}

static void *comm_main(void *arg)
{
  gs_engine_t *e = arg;

  pthread_mutex_lock(&e->mu);
  while (!e->quit) {
    comm_job_t *job;
    int err;

    if (e->qhead == e->qtail) {
      pthread_cond_wait(&e->cv, &e->mu);
      continue;
    }
    job = e->queue[e->qhead++ % e->qcap];
    pthread_mutex_unlock(&e->mu);
    err = run_job(e, job);
    pthread_mutex_lock(&e->mu);
    job->err = err;
    job->state = JOB_DONE;
    pthread_cond_broadcast(&e->cv);
  }
  /* Whatever is still queued fails: the engine is shutting down. */
  while (e->qhead != e->qtail) {
    comm_job_t *job = e->queue[e->qhead++ % e->qcap];

    job->err = GS_EABORTED;
    job->state = JOB_DONE;
  }
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* Hands a job to the comm thread. With one rank a collective is the
 * identity, so it runs here at once: no thread hand-off in the step. */
static void enqueue(gs_engine_t *e, comm_job_t *job, job_op_t op, void *buf, size_t count)
{
  job->op = op;
  job->buf = buf;
  job->count = count;
  job->err = 0;
  if (e->join.world_size == 1) {
    job->err = run_job(e, job);
    job->state = JOB_DONE;
    return;
  }
  pthread_mutex_lock(&e->mu);
  job->state = JOB_QUEUED;
  e->queue[e->qtail++ % e->qcap] = job;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static int wait_job(gs_engine_t *e, comm_job_t *job)
{
  int err;

  pthread_mutex_lock(&e->mu);
  while (job->state == JOB_QUEUED)
    pthread_cond_wait(&e->cv, &e->mu);
  err = job->err;
  job->state = JOB_IDLE;
  pthread_mutex_unlock(&e->mu);
  return err;
}

/* Explains a failed collective. The coordinator usually knows the cause (a
 * rank lost) a heartbeat later than our sockets do, so wait briefly for it. */
static int comm_failed(gs_engine_t *e, int err, const char *what)
{
  double until =
      gs_now_ms_f() + (e->join.heartbeat_interval_ms ? 2.0 * e->join.heartbeat_interval_ms : 2000.0);
  char why[300] = "";

  while (e->hb && !gs_heartbeat_aborted(e->hb, why, sizeof(why)) && gs_now_ms_f() < until) {
    struct timespec ts = {0, 20 * 1000 * 1000};

    nanosleep(&ts, NULL);
  }
  if (why[0])
    set_error(e, "%s failed: the coordinator aborted generation %" PRIu64 ": %s", what,
              e->join.generation, why);
  else
    set_error(e, "%s failed: %s (a peer rank failed or is unreachable; see its log)", what,
              gs_strerror(err));
  return err;
}

#define AUX_BYTES 256 /* the largest host buffer staged for a device backend */

/* Runs one collective now and waits for it (outside a step). `buf` is in
 * device memory when `on_device`, else in host memory, which a backend
 * working on device memory gets through the aux_dev staging buffer. */
static int run_now(gs_engine_t *e, job_op_t op, void *buf, size_t count, bool on_device,
                   const char *what)
{
  size_t bytes = op == OP_ALLREDUCE ? count * sizeof(float) : count;
  void *at = buf;
  int err = 0;

  if (!gs_comm_stream_ordered(e->comm)) {
    /* Outside a step the comm thread is idle: run it on this thread. */
    comm_job_t job = {.op = op, .buf = buf, .count = count};

    err = run_job(e, &job);
    return err ? comm_failed(e, err, what) : 0;
  }
  if (!on_device) {
    if (bytes > AUX_BYTES)
      return GS_EINVAL;
    at = e->aux_dev;
    err = gs_device_upload(e->cfg.dev, at, buf, bytes);
  }
  if (!err)
    err = op == OP_ALLREDUCE
              ? gs_comm_allreduce(e->comm, at, count, GS_DTYPE_FLOAT32, GS_REDUCE_SUM)
              : gs_comm_broadcast(e->comm, at, count, 0);
  if (!err)
    err = gs_comm_order_after(e->comm, gs_comm_ticket(e->comm) - 1);
  if (!err)
    err = gs_comm_sync(e->comm); /* never block on the device while a collective may hang */
  if (!err && !on_device)
    err = gs_device_download(e->cfg.dev, buf, at, bytes);
  return err ? comm_failed(e, err, what) : 0;
}

static void on_abort(void *arg, const char *reason)
{
  gs_engine_t *e = arg;

  pthread_mutex_lock(&e->mu);
  e->aborted = true;
  snprintf(e->abort_reason, sizeof(e->abort_reason), "%s", reason);
  pthread_mutex_unlock(&e->mu);
  gs_comm_abort(e->comm); /* the heartbeat thread has logged why */
}

/* ---- start -------------------------------------------------------------- */

/* Rank 0 computes and publishes the pack list; the others fetch it. Either
 * way the packs are then built from it. */
static int agree_packlist(gs_engine_t *e)
{
  gs_packlist_t list;
  gs_param_desc_t *params = e->packs.params;
  uint32_t n = e->packs.nparams;
  bool fetched = false;
  char why[512];
  int err;

  if (e->join.rank == 0) {
    err = gs_packlist_compute(params, n, e->cfg.pack_threshold, &list);
    if (err) {
      set_error(e, "cannot compute the pack list: %s", gs_strerror(err));
      return err;
    }
    err = gs_client_publish_packlist(e->client, e->join.generation, 0, &list, params, n,
                                     e->cfg.rpc_timeout_ms);
    if (err) {
      set_error(e, "cannot publish the pack list: %s", gs_client_error(e->client));
      gs_packlist_free(&list);
      return err;
    }
  } else {
    err = gs_client_fetch_packlist(e->client, e->join.generation, &list, &params, &n,
                                   e->cfg.join_timeout_ms);
    if (err) {
      set_error(e, "cannot fetch the pack list from the coordinator: %s",
                gs_client_error(e->client));
      return err;
    }
    fetched = true;
  }
  err = gs_packs_build(&e->packs, e->cfg.dev, &list, params, n, e->nctl, &e->cfg.sgd, why,
                       sizeof(why));
  if (fetched)
    gs_client_params_free(params, n);
  if (err)
    set_error(e, "rank 0's pack list does not fit this model: %s", why);
  return err;
}

static int join(gs_engine_t *e, const char *comm_addr)
{
  gradsync_JoinRequest *req = &e->join_req;
  int err;

  req->world_size = e->cfg.world_size;
  snprintf(req->node, sizeof(req->node), "%s", e->cfg.node);
  req->local_rank = e->cfg.local_rank;
  snprintf(req->device, sizeof(req->device), "%s", e->cfg.device);
  req->has_model_signature = true;
  gs_packs_signature(&e->packs, &req->model_signature);
  snprintf(req->comm_addr, sizeof(req->comm_addr), "%s", comm_addr);
  req->peers = gradsync_PeerSet_PEERS_RING; /* the ring needs its neighbours only */
  req->bcast_period = e->cfg.bcast_period;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, -1,
         "joining %s:%u as node '%s' local rank %u (world size %u)", e->cfg.coord.host,
         e->cfg.coord.port, e->cfg.node, e->cfg.local_rank, e->cfg.world_size);
  err = gs_client_join(e->client, req, e->cfg.join_timeout_ms, &e->join);
  if (err) {
    set_error(e, "join failed: %s", gs_client_error(e->client));
    return err;
  }
  e->joined = true;
  e->period = e->join.bcast_period;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, e->join.rank,
         "joined generation %" PRIu64 ": rank %u of %u, broadcast period %d", e->join.generation,
         e->join.rank, e->join.world_size, e->period);
  return 0;
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
      set_error(e, "the %s backend cannot make its rendezvous id: %s", gs_comm_name(e->comm),
                gs_strerror(err));
      return err;
    }
    err = gs_client_publish(e->client, e->join.generation, COMM_ID_KEY, id, *len,
                            e->cfg.rpc_timeout_ms);
  } else {
    err = gs_client_fetch(e->client, e->join.generation, COMM_ID_KEY, id, COMM_ID_MAX, len,
                          e->cfg.join_timeout_ms);
  }
  if (err)
    set_error(e, "cannot %s the %s rendezvous id through the coordinator: %s",
              e->join.rank == 0 ? "publish" : "fetch", gs_comm_name(e->comm),
              gs_client_error(e->client));
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
  if (err)
    set_error(e, "cannot connect to the other ranks (%s backend): %s", gs_comm_name(e->comm),
              gs_strerror(err));
  return err;
}

static int alloc_step_state(gs_engine_t *e)
{
  uint32_t packs = e->packs.list.pack_count;

  e->jobs = calloc(packs + 1, sizeof(*e->jobs)); /* +1: never a zero-size calloc */
  e->qcap = packs + 1;
  e->queue = calloc(e->qcap, sizeof(*e->queue));
  e->ready = calloc(e->packs.nparams, sizeof(*e->ready));
  e->launched = calloc(packs + 1, sizeof(*e->launched));
  e->ticket = calloc(packs + 1, sizeof(*e->ticket));
  e->ctl = gs_device_host_alloc(e->cfg.dev, e->nctl * sizeof(float));
  e->aux_dev = gs_device_alloc(e->cfg.dev, AUX_BYTES);
  if (!e->jobs || !e->queue || !e->ready || !e->launched || !e->ticket || !e->ctl ||
      !e->aux_dev) {
    set_error(e, "out of memory");
    return GS_ENOMEM;
  }
  return 0;
}

static int start_threads(gs_engine_t *e)
{
  gs_heartbeat_config_t hc = {
      .client = e->cfg.coord,
      .generation = e->join.generation,
      .rank = e->join.rank,
      .interval_ms = e->join.heartbeat_interval_ms ? e->join.heartbeat_interval_ms : 1000,
      .timeout_ms = e->join.heartbeat_timeout_ms ? e->join.heartbeat_timeout_ms : 10000,
      .on_abort = on_abort,
      .arg = e,
      .rejoin = &e->join_req,
  };

  if (pthread_create(&e->thread, NULL, comm_main, e)) {
    set_error(e, "cannot start the comm thread");
    return GS_ENOMEM;
  }
  e->thread_running = true;
  e->hb = gs_heartbeat_start(&hc);
  if (!e->hb) {
    set_error(e, "cannot start the heartbeat thread");
    return GS_ENOMEM;
  }
  return 0;
}

int gs_engine_start(gs_engine_t *e)
{
  char comm_addr[256];
  char why[512];
  int err;

  if (e->packs.nparams == 0) {
    set_error(e, "no parameters registered");
    return GS_EINVAL;
  }
  if (gs_sgd_config_check(&e->cfg.sgd, why, sizeof(why))) {
    set_error(e, "%s", why);
    return GS_EINVAL;
  }
  if (!e->cfg.dev) {
    set_error(e, "no compute device");
    return GS_EINVAL;
  }
  e->client = gs_client_new(&e->cfg.coord);
  e->comm = gs_comm_new(e->cfg.backend, e->cfg.log);
  if (!e->client || !e->comm) {
    set_error(e, e->comm ? "out of memory" : "unknown backend '%s'", e->cfg.backend);
    return GS_EINVAL;
  }
  /* Blocking backends move host memory, stream-ordered ones device memory. */
  if (gs_comm_stream_ordered(e->comm) == e->cfg.dev->host_memory) {
    set_error(e, "the %s backend cannot work on %s memory (use --backend %s with --device %s)",
              gs_comm_name(e->comm), e->cfg.dev->label,
              e->cfg.dev->host_memory ? "host" : "nccl", e->cfg.dev->host_memory ? "cpu" : "cuda");
    return GS_EINVAL;
  }
  err = gs_comm_listen(e->comm, e->cfg.comm_host, comm_addr, sizeof(comm_addr));
  if (err) {
    set_error(e, "cannot listen for peers on %s: %s", e->cfg.comm_host, gs_strerror(err));
    return err;
  }
  err = join(e, comm_addr);
  if (err)
    return err;
  e->nctl = CTL_FIXED + (e->join.world_size + CTL_RANKS_PER_SLOT - 1) / CTL_RANKS_PER_SLOT;
  e->grad_scale = e->cfg.reduce == GS_REDUCE_MEAN ? 1.0 / e->join.world_size : 1.0;
  err = agree_packlist(e);
  if (err)
    return err;
  e->ctl_dev = e->packs.packs[gs_packs_last(&e->packs)].grads +
               e->packs.packs[gs_packs_last(&e->packs)].elements;
  err = alloc_step_state(e);
  if (err)
    return err;
  err = connect_ranks(e);
  if (err)
    return err;
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, e->join.rank,
         "%u params in %u packs (threshold %" PRIu64 " bytes), %s backend connected",
         e->packs.nparams, e->packs.list.pack_count, e->cfg.pack_threshold, gs_comm_name(e->comm));
  return start_threads(e);
}

/* ---- broadcast and checkpoints ------------------------------------------ */

/* Broadcasts every pack's params (and momentum) from rank 0. */
static int broadcast_packs(gs_engine_t *e, bool momentum)
{
  for (uint32_t k = 0; k < e->packs.list.pack_count; k++) {
    gs_pack_t *pk = &e->packs.packs[k];
    int err = run_now(e, OP_BROADCAST, pk->params, pk->elements * sizeof(float), true,
                      "broadcast of params");

    if (!err && momentum)
      err = run_now(e, OP_BROADCAST, pk->momentum, pk->elements * sizeof(float), true,
                    "broadcast of momentum");
    if (err)
      return err;
  }
  return 0;
}

/* The checkpoint's view of the packs, params then momentum of each pack,
 * in host memory: the pack buffers themselves on a host-memory device,
 * else copies (downloaded from the device when `download`). Release with
 * ckpt_release. NULL when out of memory or the download failed. */
static gs_ckpt_buffer_t *ckpt_buffers(gs_engine_t *e, bool download)
{
  uint32_t packs = e->packs.list.pack_count;
  gs_ckpt_buffer_t *b = calloc(2 * packs, sizeof(*b));
  bool host = e->cfg.dev->host_memory;

  for (uint32_t k = 0; b && k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    b[2 * k] = (gs_ckpt_buffer_t){pk->params, pk->elements};
    b[2 * k + 1] = (gs_ckpt_buffer_t){pk->momentum, pk->elements};
  }
  for (uint32_t i = 0; b && !host && i < 2 * packs; i++) {
    float *src = b[i].data;

    b[i].data = malloc(b[i].count * sizeof(float) + 1);
    if (!b[i].data || (download && gs_device_download(e->cfg.dev, b[i].data, src,
                                                      b[i].count * sizeof(float)))) {
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
  uint32_t packs = e->packs.list.pack_count;
  int err = 0;

  if (e->cfg.dev->host_memory) {
    free(b);
    return 0;
  }
  for (uint32_t k = 0; k < packs; k++) {
    gs_pack_t *pk = &e->packs.packs[k];

    if (upload && !err)
      err = gs_device_upload(e->cfg.dev, pk->params, b[2 * k].data, pk->elements * sizeof(float));
    if (upload && !err)
      err = gs_device_upload(e->cfg.dev, pk->momentum, b[2 * k + 1].data,
                             pk->elements * sizeof(float));
  }
  if (upload && !err)
    err = gs_device_sync(e->cfg.dev); /* the copies are freed next */
  for (uint32_t i = 0; i < 2 * packs; i++)
    free(b[i].data);
  free(b);
  return err;
}

int gs_engine_checkpoint(gs_engine_t *e, const gs_position_t *pos)
{
  gs_ckpt_state_t st = {pos->step,
                        pos->epoch,
                        pos->rng_state,
                        gs_packs_layout_hash(&e->packs),
                        2 * e->packs.list.pack_count,
                        NULL};
  char path[4096], why[512];
  int err;

  if (e->join.rank != 0 || !e->cfg.checkpoint_dir)
    return 0;
  st.bufs = ckpt_buffers(e, true);
  if (!st.bufs) {
    set_error(e, "checkpoint at step %" PRIu64 " failed: cannot copy the packs to the host",
              pos->step);
    return GS_ENOMEM;
  }
  err = gs_checkpoint_save(e->cfg.checkpoint_dir, &st, e->cfg.checkpoint_keep, path, sizeof(path),
                           why, sizeof(why));
  ckpt_release(e, st.bufs, false);
  if (err) {
    set_error(e, "checkpoint at step %" PRIu64 " failed: %s", pos->step, why);
    return err;
  }
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, 0, "checkpoint: step %" PRIu64 " -> %s",
         pos->step, path);
  return 0;
}

/* Rank 0 loads the newest valid checkpoint; true when one was loaded. */
static int load_checkpoint(gs_engine_t *e, gs_position_t *pos, bool *found)
{
  gs_ckpt_state_t st = {0,   0, 0, gs_packs_layout_hash(&e->packs), 2 * e->packs.list.pack_count,
                        NULL};
  char path[4096], why[512];
  int err;

  *found = false;
  st.bufs = ckpt_buffers(e, false);
  if (!st.bufs)
    return GS_ENOMEM;
  err = gs_checkpoint_load_latest(e->cfg.checkpoint_dir, &st, e->cfg.log, path, sizeof(path), why,
                                  sizeof(why));
  if (ckpt_release(e, st.bufs, err == 0) && !err) {
    snprintf(why, sizeof(why), "cannot copy the checkpoint to the device");
    err = GS_EIO;
  }
  if (err == GS_ENOTFOUND) {
    gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, 0, "--resume: %s; starting from scratch",
           why);
    return 0;
  }
  if (err) {
    set_error(e, "cannot resume from %s: %s", e->cfg.checkpoint_dir, why);
    return err;
  }
  *found = true;
  *pos = (gs_position_t){st.step, st.epoch, st.rng_state};
  gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, 0, "resuming from %s (step %" PRIu64 ")", path,
         st.step);
  return 0;
}

int gs_engine_sync_initial(gs_engine_t *e, gs_position_t *pos)
{
  uint64_t hdr[4] = {0, pos->step, pos->epoch, pos->rng_state};
  bool found = false;
  int err;

  if (e->join.rank == 0 && e->cfg.resume && e->cfg.checkpoint_dir) {
    err = load_checkpoint(e, pos, &found);
    if (err)
      return err;
    if (found)
      hdr[0] = 1, hdr[1] = pos->step, hdr[2] = pos->epoch, hdr[3] = pos->rng_state;
  }
  if (e->join.world_size == 1)
    return 0;
  err = run_now(e, OP_BROADCAST, hdr, sizeof(hdr), false, "broadcast of the start position");
  if (err)
    return err;
  if (hdr[0]) {
    *pos = (gs_position_t){hdr[1], hdr[2], hdr[3]};
    return broadcast_packs(e, true);
  }
  return e->period >= 0 ? broadcast_packs(e, false) : 0;
}

/* ---- the step ----------------------------------------------------------- */

/* Fills this rank's part of the control vector. */
static void write_control(gs_engine_t *e, float loss)
{
  uint32_t rank = e->join.rank;

  memset(e->ctl, 0, e->nctl * sizeof(float));
  if (rank == 0) {
    gs_directives_t d;

    gs_heartbeat_directives(e->hb, &d);
    if (d.valid && d.coordinator_id != e->coordinator_id) {
      /* A restarted coordinator counts its requests from zero again. */
      e->coordinator_id = d.coordinator_id;
      e->seen_broadcast_seq = e->seen_checkpoint_seq = 0;
    }
    if (d.valid) {
      e->ctl[CTL_STOP] = d.stop;
      if (d.bcast_period != e->period && d.bcast_period >= -1 && d.bcast_period < CTL_PERIOD_MAX)
        e->ctl[CTL_PERIOD] = (float)(d.bcast_period + 2);
      if (d.broadcast_seq > e->seen_broadcast_seq) {
        e->ctl[CTL_BROADCAST] = 1;
        e->seen_broadcast_seq = d.broadcast_seq;
      }
      if (d.checkpoint_seq > e->seen_checkpoint_seq) {
        e->ctl[CTL_CHECKPOINT] = 1;
        e->seen_checkpoint_seq = d.checkpoint_seq;
      }
    }
  }
  if (e->cfg.term_flag && *e->cfg.term_flag)
    e->ctl[CTL_TERM] = 1;
  if (!isfinite(loss)) {
    e->ctl[CTL_NONFINITE] = 1;
    e->ctl[CTL_FIXED + rank / CTL_RANKS_PER_SLOT] = (float)(1u << (rank % CTL_RANKS_PER_SLOT));
  }
}

void gs_engine_begin_step(gs_engine_t *e, float loss, const gs_position_t *after)
{
  memset(e->ready, 0, e->packs.nparams * sizeof(*e->ready));
  for (uint32_t k = 0; k < e->packs.list.pack_count; k++)
    e->packs.packs[k].pending = e->packs.packs[k].nparams;
  e->nlaunched = 0;
  e->repeated_param = -1;
  e->after = *after;
  e->loss = loss;
  e->launch_err = 0;
  write_control(e, loss);
  /* Queued before backward, so it is in place before the last pack's allreduce. */
  e->launch_err = gs_device_upload(e->cfg.dev, e->ctl_dev, e->ctl, e->nctl * sizeof(float));
  e->in_step = true;
}

/* Starts pack k's allreduce: queued on the comm thread for a blocking
 * backend, on the comm stream (after the gradients queued so far) for a
 * stream-ordered one. */
static void launch(gs_engine_t *e, uint32_t k)
{
  gs_pack_t *pk = &e->packs.packs[k];
  int err;

  if (!gs_comm_stream_ordered(e->comm)) {
    comm_job_t *job = &e->jobs[k];

    /* The training thread waits for the last pack right after backward;
     * handing it to the comm thread and back would only add two wake-ups
     * to the step's critical path. end_step runs it after the others. */
    if (e->nlaunched == e->packs.list.pack_count && e->join.world_size > 1) {
      *job = (comm_job_t){.op = OP_ALLREDUCE, .buf = pk->grads,
                          .count = pk->elements + pk->extra, .state = JOB_DEFERRED};
      return;
    }
    enqueue(e, job, OP_ALLREDUCE, pk->grads, pk->elements + pk->extra);
    return;
  }
  e->ticket[k] = gs_comm_ticket(e->comm);
  err = gs_comm_allreduce(e->comm, pk->grads, pk->elements + pk->extra, GS_DTYPE_FLOAT32,
                          GS_REDUCE_SUM);
  if (err && !e->launch_err)
    e->launch_err = err;
}

/* Makes pack k's reduced gradients available to what comes next: waits
 * for the comm thread, or orders the device's later work after it. */
static int complete(gs_engine_t *e, uint32_t k)
{
  comm_job_t *job = &e->jobs[k];

  if (job->state == JOB_DEFERRED) { /* every earlier pack is complete: the comm thread is idle */
    job->state = JOB_IDLE;
    return run_job(e, job);
  }
  if (!gs_comm_stream_ordered(e->comm))
    return wait_job(e, job);
  return gs_comm_order_after(e->comm, e->ticket[k]);
}

void gs_engine_grad_ready(void *engine, uint32_t i)
{
  gs_engine_t *e = engine;
  gs_pack_t *pk;
  uint32_t k;

  if (!e->in_step || i >= e->packs.nparams || e->ready[i]) {
    e->repeated_param = i;
    return;
  }
  e->ready[i] = true;
  k = e->packs.pack_of[i];
  pk = &e->packs.packs[k];
  if (--pk->pending == 0) {
    e->launched[e->nlaunched++] = k;
    launch(e, k);
  }
}

/* Names the ranks whose bit is set in the non-finite slots. */
static void nonfinite_ranks(const gs_engine_t *e, char *out, size_t len)
{
  size_t used = 0;

  out[0] = '\0';
  for (uint32_t r = 0; r < e->join.world_size && used < len; r++) {
    uint32_t bits = (uint32_t)e->ctl[CTL_FIXED + r / CTL_RANKS_PER_SLOT];

    if (bits & (1u << (r % CTL_RANKS_PER_SLOT)))
      used += snprintf(out + used, len - used, "%s%u", used ? ", " : "", r);
  }
}

/* Every rank reads the same sums here, so every rank decides the same. */
static int act_on_control(gs_engine_t *e, uint64_t step, gs_step_result_t *out)
{
  const float *c = e->ctl;
  bool bcast = c[CTL_BROADCAST] > 0;
  int err;

  if (c[CTL_NONFINITE] > 0) {
    char ranks[256];

    nonfinite_ranks(e, ranks, sizeof(ranks));
    set_error(e, "step %" PRIu64 ": the loss is NaN or infinite on rank(s) %s; every rank stops",
              step, ranks);
    return GS_ERANGE;
  }
  if (c[CTL_PERIOD] > 0) {
    e->period = (int32_t)c[CTL_PERIOD] - 2;
    out->period_changed = true;
    gs_log(e->cfg.log, GS_LOG_INFO, e->cfg.coord.job, e->join.rank,
           "step %" PRIu64 ": broadcast period set to %d by the coordinator", step, e->period);
  }
  out->bcast_period = e->period;
  if (e->period > 0 && step % (uint64_t)e->period == 0)
    bcast = true;
  if (bcast && e->join.world_size > 1) {
    err = broadcast_packs(e, false);
    if (err)
      return err;
    out->broadcast = true;
  }
  if (c[CTL_STOP] > 0 || c[CTL_TERM] > 0) {
    out->stop = true;
    snprintf(out->stop_reason, sizeof(out->stop_reason), "%s",
             c[CTL_STOP] > 0 ? "the coordinator asked every rank to stop"
                             : "SIGTERM received; every rank stops");
  }
  if (c[CTL_CHECKPOINT] > 0 || (e->cfg.checkpoint_every && step % e->cfg.checkpoint_every == 0) ||
      (out->stop && e->cfg.checkpoint_dir)) {
    err = gs_engine_checkpoint(e, &e->after);
    if (err)
      return err;
    out->checkpoint = true;
  }
  return 0;
}

/* The first parameter of a pack that never got its gradient. */
static int missing_gradient(gs_engine_t *e, uint64_t step)
{
  for (uint32_t i = 0; i < e->packs.nparams; i++)
    if (!e->ready[i]) {
      set_error(e,
                "step %" PRIu64 ": parameter '%s' received no gradient (every registered "
                "parameter must get one each step; unused parameters are not supported)",
                step, e->packs.params[i].name);
      return GS_EPRECOND;
    }
  return 0;
}

/* Waits for the allreduces pack by pack and queues each pack's SGD as its
 * gradients arrive, then reads back the summed control vector. */
int gs_engine_end_step(gs_engine_t *e, gs_step_result_t *out)
{
  uint64_t step = e->after.step;
  float lr = gs_sgd_lr(&e->cfg.sgd, step - 1);
  double waited = 0, optimizer = 0, t0;
  char what[64];
  int err;

  memset(out, 0, sizeof(*out));
  e->in_step = false;
  if (e->repeated_param >= 0) {
    set_error(e, "step %" PRIu64 ": gradient of parameter %" PRId64 " reported twice", step,
              e->repeated_param);
    return GS_EPRECOND;
  }
  if (e->nlaunched < e->packs.list.pack_count)
    return missing_gradient(e, step);
  snprintf(what, sizeof(what), "step %" PRIu64 ": allreduce of the gradients", step);
  if (e->launch_err)
    return comm_failed(e, e->launch_err, what);
  for (uint32_t j = 0; j < e->nlaunched; j++) {
    gs_pack_t *pk = &e->packs.packs[e->launched[j]];

    t0 = gs_now_ms_f();
    err = complete(e, e->launched[j]);
    waited += gs_now_ms_f() - t0;
    if (err) {
      snprintf(what, sizeof(what), "step %" PRIu64 ": allreduce of pack %u", step, e->launched[j]);
      return comm_failed(e, err, what);
    }
    t0 = gs_now_ms_f();
    gs_device_sgd_pack(e->cfg.dev, &e->cfg.sgd, lr, (float)e->grad_scale, pk->segs, pk->nparams,
                       pk->params, pk->grads, pk->momentum);
    optimizer += gs_now_ms_f() - t0;
  }
  t0 = gs_now_ms_f();
  err = gs_comm_sync(e->comm);
  waited += gs_now_ms_f() - t0;
  if (err)
    return comm_failed(e, err, what);
  t0 = gs_now_ms_f();
  err = gs_device_download(e->cfg.dev, e->ctl, e->ctl_dev, e->nctl * sizeof(float));
  optimizer += gs_now_ms_f() - t0;
  if (err) {
    set_error(e, "step %" PRIu64 ": the %s device failed: %s (see the log above)", step,
              e->cfg.dev->label, gs_strerror(err));
    return err;
  }
  out->comm_wait_ms = waited;
  out->optimizer_ms = optimizer;
  return act_on_control(e, step, out);
}

int gs_engine_allreduce_sum(gs_engine_t *e, float *buf, size_t n)
{
  if (e->join.world_size == 1)
    return 0;
  return run_now(e, OP_ALLREDUCE, buf, n, false, "allreduce of metrics");
}

void gs_engine_report(gs_engine_t *e, const gs_progress_t *p)
{
  if (e->hb)
    gs_heartbeat_report(e->hb, p);
}

/* ---- the end ------------------------------------------------------------ */

static void stop_comm_thread(gs_engine_t *e, bool abort)
{
  if (!e->thread_running)
    return;
  if (abort && e->comm)
    gs_comm_abort(e->comm);
  pthread_mutex_lock(&e->mu);
  e->quit = true;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  e->thread_running = false;
}

/* Leaves before the heartbeat connection closes: the coordinator counts a
 * running rank's connection closing as that rank lost. */
void gs_engine_finish(gs_engine_t *e, bool finished, const char *reason)
{
  stop_comm_thread(e, !finished);
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
  gs_heartbeat_stop(e->hb);
  stop_comm_thread(e, true);
  gs_comm_destroy(e->comm);
  gs_client_free(e->client);
  gs_join_result_free(&e->join);
  gs_packs_free(&e->packs);
  free(e->jobs);
  free(e->queue);
  free(e->ready);
  free(e->launched);
  free(e->ticket);
  if (e->cfg.dev) {
    gs_device_host_free(e->cfg.dev, e->ctl);
    gs_device_free(e->cfg.dev, e->aux_dev);
  }
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}
