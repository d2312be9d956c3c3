/* The engine's comm thread: it takes packs' allreduces off a queue (for a
 * blocking backend such as host) while the training thread goes on with
 * backward; and the collectives run at once outside a step. */
#include "comm_thread.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "engine_internal.h"
#include "why.h"

int gs__engine_allreduce_grads(gs_engine_t *e, float *grads, size_t count, uint16_t *wire,
                               size_t elements)
{
  int err;

  if (!wire)
    return gs_comm_allreduce(e->comm, grads, count, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
  gs_device_narrow(e->cfg.dev, wire, grads, elements, e->packs.wire);
  err = gs_comm_allreduce(e->comm, wire, elements, e->packs.wire, GS_REDUCE_SUM);
  if (!err && count > elements)
    err = gs_comm_allreduce(e->comm, grads + elements, count - elements, GS_DTYPE_FLOAT32,
                            GS_REDUCE_SUM);
  return err;
}

int gs__engine_scatter_grads(gs_engine_t *e, float *grads, size_t count, uint16_t *wire)
{
  void *buf = wire ? (void *)wire : (void *)grads;
  gs_dtype_t dtype = wire ? e->packs.wire : GS_DTYPE_FLOAT32;
  int err;

  if (wire)
    gs_device_narrow(e->cfg.dev, wire, grads, count, e->packs.wire);
  err = gs_comm_reduce_scatter(e->comm, buf, count, dtype, GS_REDUCE_SUM);
  if (!err && gs__engine_shard_copies(e))
    err = gs_comm_shard_pass(e->comm, buf, count, dtype);
  return err;
}

void gs__engine_widen_windows(gs_engine_t *e, const gs_pack_t *pk)
{
  for (uint32_t w = 0; pk->wire && w < GS_PACK_WINDOWS; w++)
    gs_device_widen(e->cfg.dev, pk->grads + pk->win[w].off, pk->wire + pk->win[w].off,
                    pk->win[w].len, e->packs.wire);
}

static int run_job(gs_engine_t *e, const comm_job_t *job)
{
  int err;

  switch (job->op) {
  case OP_BROADCAST:
    return gs_comm_broadcast(e->comm, job->buf, job->count, job->root);
  case OP_ALLGATHER:
    return gs_comm_allgather(e->comm, job->buf, job->count, GS_DTYPE_FLOAT32);
  case OP_REDUCE_SCATTER:
    err = gs__engine_scatter_grads(e, job->buf, job->count, job->wire);
    break;
  default:
    err = gs__engine_allreduce_grads(e, job->buf, job->count, job->wire, job->elements);
  }
  /* A blocking backend's device is the cpu: its sums are there already. */
  if (!err && job->wire && !gs_comm_stream_ordered(e->comm))
    gs__engine_widen_windows(e, job->pack);
  return err;
}

int gs__engine_step_collective(gs_engine_t *e, const comm_job_t *job)
{
  int err = gs__engine_run_job(e, job);

  if (!err && gs_comm_stream_ordered(e->comm))
    err = gs_comm_order_after(e->comm, gs_comm_ticket(e->comm) - 1);
  return err;
}

/* A recorded step timeline gets each collective's span. */
int gs__engine_run_job(gs_engine_t *e, const comm_job_t *job)
{
  uint64_t start = gs__trace_now(e);
  int err = run_job(e, job);

  if (start)
    gs__trace_collective(e, job, start);
  return err;
}

static void *comm_main(void *arg)
{
  gs_engine_t *e = arg;

  pthread_mutex_lock(&e->ct.mu);
  while (!e->ct.quit) {
    comm_job_t *job;
    int err;

    if (e->ct.qhead == e->ct.qtail) {
      pthread_cond_wait(&e->ct.cv, &e->ct.mu);
      continue;
    }
    job = e->ct.queue[e->ct.qhead++ % e->ct.qcap];
    pthread_mutex_unlock(&e->ct.mu);
    err = gs__engine_run_job(e, job);
    pthread_mutex_lock(&e->ct.mu);
    job->err = err;
    job->state = JOB_DONE;
    pthread_cond_broadcast(&e->ct.cv);
  }
  /* Whatever is still queued fails: the engine is shutting down. */
  while (e->ct.qhead != e->ct.qtail) {
    comm_job_t *job = e->ct.queue[e->ct.qhead++ % e->ct.qcap];

    job->err = GS_EABORTED;
    job->state = JOB_DONE;
  }
  pthread_cond_broadcast(&e->ct.cv);
  pthread_mutex_unlock(&e->ct.mu);
  return NULL;
}

int gs__engine_comm_start(gs_engine_t *e)
{
  if (pthread_create(&e->ct.thread, NULL, comm_main, e)) {
    gs_set_why(e->error, sizeof(e->error), "cannot start the comm thread");
    return GS_ENOMEM;
  }
  e->ct.running = true;
  return 0;
}

/* With one rank a collective is the identity, so it runs here at once:
 * no thread hand-off in the step. */
void gs__engine_enqueue(gs_engine_t *e, comm_job_t *job)
{
  job->err = 0;
  if (gs__membership_world(&e->member) == 1) {
    job->err = gs__engine_run_job(e, job);
    job->state = JOB_DONE;
    return;
  }
  pthread_mutex_lock(&e->ct.mu);
  job->state = JOB_QUEUED;
  e->ct.queue[e->ct.qtail++ % e->ct.qcap] = job;
  pthread_cond_broadcast(&e->ct.cv);
  pthread_mutex_unlock(&e->ct.mu);
}

int gs__engine_wait_job(gs_engine_t *e, comm_job_t *job)
{
  int err;

  pthread_mutex_lock(&e->ct.mu);
  if (job->state == JOB_QUEUED)
    e->waits.comm++; /* not done yet: the training thread waits for the comm thread */
  while (job->state == JOB_QUEUED)
    pthread_cond_wait(&e->ct.cv, &e->ct.mu);
  err = job->err;
  job->state = JOB_IDLE;
  pthread_mutex_unlock(&e->ct.mu);
  return err;
}

/* How long a failed collective waits for the heartbeat to explain it: two
 * intervals for the coordinator's abort; while the coordinator does not
 * answer, until this rank gives up on it too if that comes within
 * GIVE_UP_WAIT_MS, for a peer that left may have left because of that
 * (each rank's grace ends at its own moment). */
#define GIVE_UP_WAIT_MS 10000.0
static bool explained_soon(gs_engine_t *e, double until, char *why, size_t len)
{
  double start = gs_now_ms_f();

  for (;;) {
    uint64_t gives_up = gs_heartbeat_gives_up_at(e->hb);
    double now = gs_now_ms_f();
    bool soon = gives_up && (double)gives_up < start + GIVE_UP_WAIT_MS;

    if (gs_heartbeat_aborted(e->hb, why, len))
      return true;
    if (now >= until && (!soon || now >= (double)gives_up + 1000.0))
      return false;
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
}

/* Explains a failed collective. The coordinator usually knows the cause (a
 * rank lost) a heartbeat later than our sockets do, so wait briefly for it. */
int gs__engine_comm_failed(gs_engine_t *e, int err, const char *what)
{
  double until = gs_now_ms_f() + (gs__membership_join(&e->member)->heartbeat_interval_ms
                                      ? 2.0 * gs__membership_join(&e->member)->heartbeat_interval_ms
                                      : 2000.0);
  char why[300] = "", held[256] = "", by[300] = "";

  /* A signal's interruption is not a peer's fault: nothing to wait for;
   * an elastic job regroups at once and hears the cause in its Join. */
  if (err != GS_EINTR && !gs__engine_elastic(e) && e->hb)
    explained_soon(e, until, why, sizeof(why));
  /* What the coordinator saw holding the job up, when this rank gave up
   * waiting on it (--comm-timeout), or a neighbour that gave up first
   * closed the ring. */
  if (e->hb && (err == GS_ETIMEDOUT || err == GS_ECLOSED))
    gs_heartbeat_waiting_on(e->hb, held, sizeof(held));
  if (held[0])
    snprintf(by, sizeof(by), "; the coordinator saw the job wait on %s", held);
  if (why[0])
    gs_set_why(e->error, sizeof(e->error), "%s failed: %s generation %" PRIu64 ": %s", what,
               gs_heartbeat_gave_up(e->hb) ? "this rank ended" : "the coordinator aborted",
               gs__membership_generation(&e->member), why);
  else if (gs_comm_why(e->comm)[0])
    gs_set_why(e->error, sizeof(e->error), "%s failed: %s%s", what, gs_comm_why(e->comm), by);
  else
    gs_set_why(e->error, sizeof(e->error),
               "%s failed: %s (a peer rank failed or is unreachable; see its log)%s", what,
               gs_strerror(err), by);
  return gs__engine_fail(e, err);
}

/* Makes `err` (whose words are in e->error) the engine's last: after a
 * failed collective, or a step the ranks did not run alike, the buffers
 * and the communicator are in an unknown state, so every later step,
 * collective and checkpoint is refused. The first failure sticks. */
int gs__engine_fail(gs_engine_t *e, int err)
{
  if (!e->failed) {
    e->failed = err;
    snprintf(e->failure, sizeof(e->failure), "%s", e->error);
  }
  return err;
}

/* The sticky error, for a call made after the engine failed. */
int gs__engine_refuse(gs_engine_t *e, const char *what)
{
  gs_set_why(e->error, sizeof(e->error),
             "%s refused: the engine stopped at an earlier failure (%s); finish it and start a "
             "new one",
             what, e->failure);
  return e->failed;
}

/* One collective on device memory, queued and waited for. */
static int device_collective(gs_engine_t *e, job_op_t op, void *at, size_t count, uint32_t root,
                             bool queued)
{
  int err = op == OP_ALLREDUCE
                ? gs_comm_allreduce(e->comm, at, count, GS_DTYPE_FLOAT32, GS_REDUCE_SUM)
                : gs_comm_broadcast(e->comm, at, count, root);

  if (!err)
    err = gs_comm_order_after(e->comm, gs_comm_ticket(e->comm) - 1);
  if (!err && queued && ++e->queued_between_steps < QUEUED_BETWEEN_STEPS)
    return 0; /* ordered before the device's next work; the next sync watches it */
  if (!err) {
    err = gs_comm_sync(e->comm); /* never block on the device while a collective may hang */
    e->cfg.dev->waits.syncs++;
    e->queued_between_steps = 0;
  }
  return err;
}

/* Runs one collective now and waits for it (outside a step). `buf` is in
 * device memory when `on_device`, else in host memory, which a backend
 * working on device memory gets through the aux_dev staging buffer, in
 * pieces of AUX_BYTES (every rank cuts the same pieces). On device memory
 * a stream-ordered backend only queues it, ordered before the device's
 * next work, unless the job is elastic (a failure must regroup here): the
 * next step's sync waits for it, watching the abort flag and the timeout
 * as this one would. */
static int run_now(gs_engine_t *e, job_op_t op, void *buf, size_t count, bool on_device,
                   uint32_t root, const char *what)
{
  size_t bytes = op == OP_ALLREDUCE ? count * sizeof(float) : count;
  int err = 0;

  if (e->failed)
    return gs__engine_refuse(e, what);
  if (!gs_comm_stream_ordered(e->comm)) {
    /* Outside a step the comm thread is idle: run it on this thread. */
    comm_job_t job = {.op = op, .buf = buf, .count = count, .root = root};

    err = gs__engine_run_job(e, &job);
    return err ? gs__engine_comm_failed(e, err, what) : 0;
  }
  if (on_device)
    err = device_collective(e, op, buf, count, root, !gs__engine_elastic(e));
  for (size_t off = 0; !on_device && !err && off < bytes; off += AUX_BYTES) {
    size_t len = bytes - off < AUX_BYTES ? bytes - off : AUX_BYTES;

    err = gs_device_upload(e->cfg.dev, e->aux_dev, (uint8_t *)buf + off, len);
    if (!err)
      err = device_collective(e, op, e->aux_dev, op == OP_ALLREDUCE ? len / sizeof(float) : len,
                              root, false);
    if (!err)
      err = gs_device_download(e->cfg.dev, (uint8_t *)buf + off, e->aux_dev, len);
  }
  return err ? gs__engine_comm_failed(e, err, what) : 0;
}

/* Outside the step a collective is the phase the rank is in (a broadcast,
 * a metric's sum): the previous phase comes back after it. */
int gs__engine_run_now(gs_engine_t *e, job_op_t op, void *buf, size_t count, bool on_device,
                       uint32_t root, const char *what)
{
  gs_phase_t was = gs__engine_phase_now(e);
  int err;

  gs__engine_enter(e, GS_PHASE_SYNC, 0);
  err = run_now(e, op, buf, count, on_device, root, what);
  gs__engine_enter(e, was, 0);
  return err;
}

/* The heartbeat heard the coordinator abort `generation` (and logged
 * why: `reason`, which a failed collective then reads from the heartbeat,
 * see explained_soon): this rank's collectives of it fail at once. */
void gs__engine_on_abort(void *arg, uint64_t generation, const char *reason)
{
  gs_engine_t *e = arg;

  (void)reason;
  /* Under the lock: an elastic regroup replaces the comm meanwhile, and a
   * late abort of the generation it left must not touch the new one. */
  pthread_mutex_lock(&e->ct.mu);
  if (generation == e->ct.live_generation)
    gs_comm_abort(e->comm);
  pthread_mutex_unlock(&e->ct.mu);
}

void gs__engine_comm_stop(gs_engine_t *e, bool abort)
{
  if (!e->ct.running)
    return;
  if (abort && e->comm)
    gs_comm_abort(e->comm);
  pthread_mutex_lock(&e->ct.mu);
  e->ct.quit = true;
  pthread_cond_broadcast(&e->ct.cv);
  pthread_mutex_unlock(&e->ct.mu);
  pthread_join(e->ct.thread, NULL);
  e->ct.running = false;
}

void gs__comm_thread_init(comm_thread_t *t)
{
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
}

void gs__comm_thread_free(comm_thread_t *t)
{
  free(t->jobs);
  free(t->queue);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
}

int gs__comm_thread_size(comm_thread_t *t, uint32_t packs)
{
  if (t->jobs)
    return 0;
  t->jobs = calloc(packs + 1, sizeof(*t->jobs)); /* +1: never a zero-size calloc */
  t->qcap = packs + 1;
  t->queue = calloc(t->qcap, sizeof(*t->queue));
  if (!t->jobs || !t->queue)
    return GS_ENOMEM;
  t->npacks = packs;
  return 0;
}

void gs__comm_thread_live(comm_thread_t *t, uint64_t generation)
{
  pthread_mutex_lock(&t->mu);
  t->live_generation = generation;
  pthread_mutex_unlock(&t->mu);
}

void gs__comm_thread_set_comm(comm_thread_t *t, gs_comm_t **slot, gs_comm_t *comm)
{
  pthread_mutex_lock(&t->mu);
  *slot = comm;
  pthread_mutex_unlock(&t->mu);
}

gs_comm_t *gs__comm_thread_reset(comm_thread_t *t, gs_comm_t **slot)
{
  gs_comm_t *comm;

  pthread_mutex_lock(&t->mu);
  comm = *slot;
  *slot = NULL;
  t->live_generation = 0;
  t->quit = false;
  t->qhead = t->qtail = 0;
  pthread_mutex_unlock(&t->mu);
  if (t->jobs) /* none yet when the first generation broke as it went live */
    memset(t->jobs, 0, (t->npacks + 1) * sizeof(*t->jobs));
  return comm;
}
