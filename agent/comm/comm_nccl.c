/* NCCL collective backend (docs/design.md, "Data plane"): allreduce and
 * broadcast between GPUs, queued on a stream of our own and ordered against
 * the device's compute stream with events, so the caller never blocks on a
 * collective until gs_comm_sync.
 *
 * Each collective: record `ready` on the compute stream, make the comm
 * stream wait for it, enqueue the NCCL call on the comm stream, then record
 * done[ticket % nevents] there; gs_comm_order_after makes the compute stream
 * wait for that event. The communicator is non-blocking (config.blocking =
 * 0), so no NCCL call waits for a peer: every wait is one of our polling
 * loops (init, an enqueue that returned ncclInProgress, sync, finalize), and
 * those loops watch the abort flag and the timeout. gs_comm_abort only sets
 * the flag; the loop (or the next operation) that sees it calls
 * ncclCommAbort on the comm thread itself, never while that thread is
 * inside NCCL. */
#include "comm.h"

#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <limits.h>
#include <nccl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "netif.h"
#include "why.h"
#include "clock.h"

/* Pacing of wait_ready, the wait for a non-blocking NCCL call to leave
 * ncclInProgress. NCCL 2.28 runs each collective's group launch on a thread
 * it spawns and answers ncclInProgress almost every time, so the old flat
 * 1 ms sleep stalled the training thread (and let the GPU run dry) once per
 * pack in the middle of backward, though the launch itself (a thread start,
 * the plan, a kernel launch) should take tens of microseconds. Now it polls
 * without sleeping for WAIT_SPIN_NS, then sleeps from WAIT_SLEEP_MIN_US
 * (timer slack makes that ~60 us in practice), doubling to a cap: 1 ms for
 * a collective or finalize (a launch still running then is an outlier, and
 * a stall costs at most one late poll), 10 ms for init, which takes seconds
 * at a large world and has nothing behind it to starve. Each poll still
 * watches the abort flag and the timeout. test_nccl_ranks measures the
 * per-call cost on a GPU (its "cost" case). */
#define WAIT_SPIN_NS 50000u        /* 50 us */
#define WAIT_SLEEP_MIN_US 10L      /* the first sleep after the spin */
#define WAIT_OP_SLEEP_MAX_US 1000L /* collectives, group launches, finalize */
#define WAIT_INIT_SLEEP_MAX_US 10000L
/* The oldest NCCL we accept at run time. Every call this file makes
 * (non-blocking communicators, ncclCommFinalize, ncclCommGetAsyncError
 * answering ncclInProgress, non-blocking group launches) exists since 2.14;
 * 2.18 is the oldest line PyTorch's CUDA 12 wheels shipped (torch 2.1), so
 * it is the oldest a GPU machine is likely to hand us. The library we have
 * actually run is 2.28 (docs/gpu-results.md); below 2.18 is refused rather
 * than guessed at. */
#define NCCL_MIN_VERSION 21800
/* nccl_sync, the end of a step's wait for its allreduces: the optimizer's
 * kernels are queued only once it returns, so the GPU idles from the last
 * allreduce's end until the poll that sees it. 200 queries (a few hundred
 * microseconds) before 100 us sleeps (~160 us with timer slack) cost a
 * step of 2.9 ms on an H100 ~80 us on average; a step's wait is mostly the
 * tail of backward, so sync now spins for SYNC_SPIN_NS (one training
 * thread per GPU busy meanwhile, as CUDA's own default synchronization
 * spins) and only a longer wait, a slow peer's, polls with sleeps. */
#define SYNC_SPIN_NS 5000000u /* 5 ms */
#define SYNC_POLL_US 100
#define NO_TICKET UINT64_MAX
#define MAX_QUEUED 65536 /* done events kept: max_queued + 1 */

typedef struct nccl_comm {
  gs_comm_t base;
  atomic_bool aborted;
  bool init_called, ready;
  int err; /* sticky error of a failed init or operation */
  uint32_t rank, world, max_queued, nevents;
  uint64_t timeout_ms;
  volatile sig_atomic_t *interrupt; /* during init only (gs_comm_setup_t) */
  int cuda_dev;
  ncclComm_t nccl;       /* NULL before init and once aborted or destroyed */
  cudaStream_t compute;  /* the device's stream; not ours */
  cudaStream_t stream;   /* ours: every collective runs on it */
  cudaEvent_t ready_ev;  /* the compute stream's position at an enqueue */
  cudaEvent_t *done;     /* nevents: ticket t's completion is done[t % nevents] */
  uint64_t *slot_ticket; /* the ticket last recorded in each done event, or NO_TICKET */
  uint64_t window;       /* first ticket since the last sync: earlier ones are complete */
  uint64_t last;         /* the last ticket recorded since the last sync */
  bool pending;          /* a done event was recorded since the last sync */
} nccl_comm_t;

static void sleep_us(long us)
{
  struct timespec ts = {0, us * 1000L};

  nanosleep(&ts, NULL);
}

static bool is_aborted(nccl_comm_t *c)
{
  return atomic_load(&c->aborted);
}

/* A non-blocking communicator answers ncclInProgress for a call it has
 * accepted but not finished: not an error, the caller polls (*in_progress).
 * Any other result goes through the usual check, keeping the call's text. */
static int nccl_started(const gs_log_t *log, const char *file, int line, const char *call,
                        ncclResult_t r, bool *in_progress)
{
  *in_progress = r == ncclInProgress;
  return *in_progress ? 0 : gs__nccl_status(log, file, line, call, (int)r);
}

#define NCCL_STARTED(log, call, in_progress)                                                       \
  nccl_started((log), __FILE__, __LINE__, #call, (call), (in_progress))

/* Aborts the communicator (once; it frees it) and makes `err` stick: every
 * later operation fails with it. Returns err (GS_EABORTED once aborted). */
static int comm_fail(nccl_comm_t *c, int err)
{
  bool in_progress;

  if (is_aborted(c))
    err = GS_EABORTED;
  if (c->nccl) {
    /* After ncclCommAbort the handle is gone whatever it answers. */
    (void)NCCL_STARTED(c->base.log, ncclCommAbort(c->nccl), &in_progress);
    c->nccl = NULL;
  }
  if (!c->err)
    c->err = err;
  c->ready = false;
  return err;
}

/* Makes the communicator's GPU current for this thread (the comm thread
 * need not be the one that opened the device). */
static int enter(nccl_comm_t *c)
{
  return GS_CUDA_STATUS(c->base.log, cudaSetDevice(c->cuda_dev));
}

/* Logs an error the communicator reported asynchronously and aborts it. */
static int async_failed(nccl_comm_t *c, const char *what, ncclResult_t async_error)
{
  int err = GS_NCCL_STATUS(c->base.log, async_error);

  GS_LOG_ERR(c->base.log, "nccl comm: rank %" PRIu32 ": %s failed: %s", c->rank, what,
             ncclGetLastError(c->nccl));
  return comm_fail(c, err);
}

/* Polls the communicator until it leaves ncclInProgress (init, an enqueue
 * or finalize that answered ncclInProgress): spins for WAIT_SPIN_NS when
 * `spin`, then sleeps from WAIT_SLEEP_MIN_US doubling to sleep_max_us.
 * Gives up on gs_comm_abort, the owner's signal (c->interrupt, during
 * init) or after `timeout_ms`, aborting the communicator; `hint` ends the
 * timeout message. */
static int wait_ready(nccl_comm_t *c, const char *what, const char *hint, bool spin,
                      long sleep_max_us, uint64_t timeout_ms)
{
  uint64_t start = gs_now_ms(), spin_until = gs_now_ns() + (spin ? WAIT_SPIN_NS : 0);
  ncclResult_t async_error = ncclInProgress;
  long sleep = WAIT_SLEEP_MIN_US;
  int err;

  for (;;) {
    err = GS_NCCL_STATUS(c->base.log, ncclCommGetAsyncError(c->nccl, &async_error));
    if (err)
      return comm_fail(c, err);
    if (async_error != ncclInProgress)
      break;
    if (is_aborted(c)) {
      GS_LOG_WARNING(c->base.log, "nccl comm: rank %" PRIu32 ": NCCL %s aborted", c->rank, what);
      return comm_fail(c, GS_EABORTED);
    }
    if (c->interrupt && *c->interrupt)
      return comm_fail(c, gs__comm_fail(&c->base, GS_EINTR,
                                        "rank %" PRIu32 ": NCCL %s interrupted by %s", c->rank,
                                        what, gs_signal_name(*c->interrupt)));
    if (gs_now_ms() - start >= timeout_ms)
      return comm_fail(c, gs__comm_fail(&c->base, GS_ETIMEDOUT,
                                        "rank %" PRIu32 ": NCCL %s did not complete within %" PRIu64
                                        " ms%s",
                                        c->rank, what, timeout_ms, hint));
    if (gs_now_ns() < spin_until)
      continue;
    sleep_us(sleep);
    sleep = sleep * 2 < sleep_max_us ? sleep * 2 : sleep_max_us;
  }
  return async_error == ncclSuccess ? 0 : async_failed(c, what, async_error);
}

/* A collective's launch: spin first, sleep at most 1 ms at a time. */
static int wait_launch(nccl_comm_t *c, const char *what)
{
  return wait_ready(c, what, "", true, WAIT_OP_SLEEP_MAX_US, c->timeout_ms);
}

/* "2.28.9" from a version code (2.9 and later: 10000 * major + 100 * minor
 * + patch; before: 1000 * major + 100 * minor + patch). */
static void version_text(int code, char *out, size_t len)
{
  if (code >= 20900)
    snprintf(out, len, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  else
    snprintf(out, len, "%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

/* Refuses an NCCL library older than NCCL_MIN_VERSION (the one loaded at
 * run time, which need not be the one we were built with); with `say`,
 * logs both versions. */
static int check_version(const gs_log_t *log, bool say)
{
  char found[32], built[32], least[32];
  int code = 0;

  GS_NCCL_CHECK(log, ncclGetVersion(&code));
  version_text(code, found, sizeof(found));
  version_text(NCCL_VERSION_CODE, built, sizeof(built));
  version_text(NCCL_MIN_VERSION, least, sizeof(least));
  if (code < NCCL_MIN_VERSION) {
    GS_LOG_ERR(log,
               "nccl comm: NCCL %s found at run time (built with %s); gradsync needs %s or "
               "newer: put a newer libnccl.so.2 first on LD_LIBRARY_PATH",
               found, built, least);
    return GS_EPRECOND;
  }
  if (say)
    GS_LOG_INF(log, "nccl comm: NCCL %s at run time (built with %s)", found, built);
  return 0;
}

/* Fails at once when aborted (aborting the communicator here, on the comm
 * thread), after a failure, or before a successful init. */
static int op_begin(nccl_comm_t *c, const char *what)
{
  if (is_aborted(c))
    return comm_fail(c, GS_EABORTED);
  if (c->err)
    return c->err;
  if (!c->ready) {
    GS_LOG_ERR(c->base.log, "nccl comm: %s before a successful init", what);
    return GS_EINVAL;
  }
  return enter(c);
}

static int nccl_make_id(gs_comm_t *base, void *buf, size_t cap, size_t *len)
{
  ncclUniqueId id;
  int err;

  if (!buf || cap < sizeof(id)) {
    GS_LOG_ERR(base->log, "nccl comm: an NCCL id needs %zu bytes, the buffer has %zu", sizeof(id),
               buf ? cap : 0);
    return GS_EINVAL;
  }
  err = check_version(base->log, false);
  if (err)
    return err;
  GS_NCCL_CHECK(base->log, ncclGetUniqueId(&id));
  memcpy(buf, &id, sizeof(id));
  *len = sizeof(id);
  return 0;
}

/* NCCL picks its own interface for its sockets (bootstrap, and the Socket
 * transport), which on a machine with several can be one the peers cannot
 * reach. The engine calls listen with the address the host backend would
 * bind (--comm-iface, --comm-bind), before any NCCL call and before it starts a thread:
 * when the user has not set NCCL_SOCKET_IFNAME, name the interface holding
 * that address ("=" asks NCCL for that exact name). NCCL reads the variable
 * only in the process's first bootstrap, hence the environment. No listening
 * socket: addr is "". */
static int nccl_listen(gs_comm_t *base, const gs_comm_endpoint_t *ep, char *addr, size_t addr_len)
{
  char name[IF_NAMESIZE + 1], value[IF_NAMESIZE + 2];
  const char *host = ep->bind;

  addr[0] = '\0';
  (void)addr_len;
  if (!host || getenv("NCCL_SOCKET_IFNAME") || !gs_netif_of_address(host, name, sizeof(name)))
    return 0;
  snprintf(value, sizeof(value), "=%s", name);
  if (setenv("NCCL_SOCKET_IFNAME", value, 0) != 0)
    return 0; /* NCCL picks one itself, as before */
  GS_LOG_INF(base->log, "nccl comm: NCCL_SOCKET_IFNAME=%s (the interface holding %s)", value, host);
  return 0;
}

/* Destroys the events and the stream that exist (init's partial failures
 * and destroy share it). */
static void release_cuda(nccl_comm_t *c)
{
  for (uint32_t i = 0; c->done && i < c->nevents; i++)
    if (c->done[i])
      GS_CUDA_STATUS(c->base.log, cudaEventDestroy(c->done[i]));
  if (c->ready_ev)
    GS_CUDA_STATUS(c->base.log, cudaEventDestroy(c->ready_ev));
  if (c->stream)
    GS_CUDA_STATUS(c->base.log, cudaStreamDestroy(c->stream));
  free(c->done);
  free(c->slot_ticket);
  c->done = NULL;
  c->slot_ticket = NULL;
  c->ready_ev = NULL;
  c->stream = NULL;
}

/* Our stream, on the compute stream's GPU, and the events that order the
 * two. */
static int create_cuda(nccl_comm_t *c)
{
  const gs_log_t *log = c->base.log;
  int err;

  GS_CUDA_CHECK(log, cudaStreamGetDevice(c->compute, &c->cuda_dev));
  err = enter(c);
  if (err)
    return err;
  c->done = calloc(c->nevents, sizeof(*c->done));
  c->slot_ticket = malloc(c->nevents * sizeof(*c->slot_ticket));
  if (!c->done || !c->slot_ticket) {
    GS_LOG_ERR(log, "nccl comm: out of memory");
    return GS_ENOMEM;
  }
  for (uint32_t i = 0; i < c->nevents; i++)
    c->slot_ticket[i] = NO_TICKET;
  GS_CUDA_CHECK(log, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  GS_CUDA_CHECK(log, cudaEventCreateWithFlags(&c->ready_ev, cudaEventDisableTiming));
  for (uint32_t i = 0; i < c->nevents; i++)
    GS_CUDA_CHECK(log, cudaEventCreateWithFlags(&c->done[i], cudaEventDisableTiming));
  return 0;
}

/* Checks what init needs; logs what is wrong. */
static int check_setup(nccl_comm_t *c, const gs_comm_setup_t *s)
{
  const gs_log_t *log = c->base.log;

  if (!s->device || !s->device->stream) {
    GS_LOG_ERR(log, "nccl comm: needs a CUDA device with a compute stream (device %s)",
               s->device ? s->device->label : "none");
    return GS_EINVAL;
  }
  if (!s->id || s->id_len != sizeof(ncclUniqueId)) {
    GS_LOG_ERR(log, "nccl comm: rank 0's NCCL id must be %zu bytes, got %zu", sizeof(ncclUniqueId),
               s->id ? s->id_len : 0);
    return GS_EINVAL;
  }
  if (s->world_size == 0 || s->world_size > INT_MAX || s->rank >= s->world_size ||
      s->timeout_ms == 0 || s->max_queued > MAX_QUEUED) {
    GS_LOG_ERR(log,
               "nccl comm: invalid setup: rank %" PRIu32 " of %" PRIu32 ", timeout %" PRIu64
               " ms, max_queued %" PRIu32 " (at most %d)",
               s->rank, s->world_size, s->timeout_ms, s->max_queued, MAX_QUEUED);
    return GS_EINVAL;
  }
  return 0;
}

/* Creates the non-blocking communicator and polls until every rank has
 * joined; a missing rank is a timeout, never a hang. */
static int nccl_init(gs_comm_t *base, const gs_comm_setup_t *s)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclUniqueId id;
  bool in_progress;
  int err;

  if (c->init_called) {
    GS_LOG_ERR(base->log, "nccl comm: init called twice");
    return GS_EINVAL;
  }
  if (is_aborted(c))
    return comm_fail(c, GS_EABORTED);
  err = check_setup(c, s);
  if (!err)
    err = check_version(base->log, true);
  if (err)
    return err; /* nothing done: init may be called again */
  c->init_called = true;
  c->rank = s->rank;
  c->world = s->world_size;
  c->timeout_ms = s->timeout_ms;
  c->max_queued = s->max_queued ? s->max_queued : 1;
  c->nevents = c->max_queued + 1;
  c->compute = (cudaStream_t)s->device->stream;
  err = create_cuda(c);
  if (err)
    goto out_release_cuda;
  memcpy(&id, s->id, sizeof(id));
  config.blocking = 0;
  err = NCCL_STARTED(base->log,
                     ncclCommInitRankConfig(&c->nccl, (int)c->world, id, (int)c->rank, &config),
                     &in_progress);
  if (err) {
    c->nccl = NULL; /* NCCL frees it when the call itself fails */
    goto out_release_cuda;
  }
  c->interrupt = s->interrupt;
  err = wait_ready(c, "init",
                   ": a rank is missing, or its GPU or network unreachable (NCCL_SOCKET_IFNAME, "
                   "--comm-iface)",
                   false, WAIT_INIT_SLEEP_MAX_US,
                   s->connect_timeout_ms ? s->connect_timeout_ms : s->timeout_ms);
  c->interrupt = NULL;
  if (err)
    goto out_release_cuda;
  c->ready = true;
  GS_LOG_INF(base->log, "nccl comm: rank %" PRIu32 " of %" PRIu32 " ready on cuda:%d", c->rank,
             c->world, c->cuda_dev);
  return 0;

out_release_cuda:
  c->err = c->err ? c->err : err;
  release_cuda(c);
  return err;
}

/* Refuses a collective whose done event would still be needed (more than
 * max_queued since the last sync); otherwise orders our stream after the
 * compute stream's work so far. */
static int queue_begin(nccl_comm_t *c, const char *what)
{
  uint64_t ticket = c->base.ticket;
  int err;

  if (ticket - c->window >= c->max_queued) {
    GS_LOG_ERR(c->base.log,
               "nccl comm: %s %" PRIu64 ": %" PRIu32 " collectives already queued since the last "
               "sync (the most allowed); call gs_comm_sync first",
               what, ticket, c->max_queued);
    return GS_EINVAL;
  }
  err = GS_CUDA_STATUS(c->base.log, cudaEventRecord(c->ready_ev, c->compute));
  if (!err)
    err = GS_CUDA_STATUS(c->base.log, cudaStreamWaitEvent(c->stream, c->ready_ev, 0));
  return err ? comm_fail(c, err) : 0;
}

/* After the NCCL call (err is its result): waits out ncclInProgress, then
 * records the ticket's done event. */
static int queue_end(nccl_comm_t *c, const char *what, int err, bool in_progress)
{
  uint64_t ticket = c->base.ticket;
  uint32_t slot = (uint32_t)(ticket % c->nevents);

  if (err)
    return comm_fail(c, err);
  if (in_progress) {
    err = wait_launch(c, what);
    if (err)
      return err;
  }
  err = GS_CUDA_STATUS(c->base.log, cudaEventRecord(c->done[slot], c->stream));
  if (err)
    return comm_fail(c, err);
  c->slot_ticket[slot] = ticket;
  c->last = ticket;
  c->pending = true;
  return 0;
}

/* NCCL adds 16-bit floats in float32 at each step too. */
static ncclDataType_t nccl_type(gs_dtype_t dtype)
{
  static const ncclDataType_t types[] = {[GS_DTYPE_FLOAT32] = ncclFloat,
                                         [GS_DTYPE_FLOAT16] = ncclFloat16,
                                         [GS_DTYPE_BFLOAT16] = ncclBfloat16,
                                         [GS_DTYPE_FLOAT64] = ncclDouble};

  return gs_dtype_size(dtype) ? types[dtype] : ncclFloat;
}

static int nccl_allreduce(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                          gs_reduce_op_t op)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  bool in_progress = false;
  int err = op_begin(c, "allreduce");

  if (!err)
    err = gs__comm_check_reduction(base, "allreduce", buf, count, dtype, op);
  if (!err)
    err = queue_begin(c, "allreduce");
  if (err)
    return err;
  if (count)
    err = NCCL_STARTED(base->log,
                       ncclAllReduce(buf, buf, count, nccl_type(dtype),
                                     op == GS_REDUCE_SUM ? ncclSum : ncclAvg, c->nccl, c->stream),
                       &in_progress);
  return queue_end(c, "allreduce enqueue", err, in_progress);
}

/* NCCL's shards are equal pieces in rank order: the buffer is padded to
 * world x piece, the last shards short (or empty) of the count. */
static size_t nccl_piece(const gs_comm_t *base, size_t count)
{
  const nccl_comm_t *c = (const nccl_comm_t *)base;
  uint32_t w = c->world ? c->world : 1;

  return count / w + (count % w != 0);
}

static gs_comm_shard_t nccl_shard(const gs_comm_t *base, size_t count, uint32_t rank)
{
  size_t piece = nccl_piece(base, count), off = rank * piece < count ? rank * piece : count;

  return (gs_comm_shard_t){off, count - off < piece ? count - off : piece};
}

static size_t nccl_shard_room(const gs_comm_t *base, size_t count)
{
  const nccl_comm_t *c = (const nccl_comm_t *)base;

  return nccl_piece(base, count) * (c->world ? c->world : 1);
}

/* In place: this rank's piece of the buffer is the receive buffer. */
static int nccl_reduce_scatter(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                               gs_reduce_op_t op)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  size_t piece = nccl_piece(base, count);
  bool in_progress = false;
  int err = op_begin(c, "reduce-scatter");

  if (!err)
    err = gs__comm_check_reduction(base, "reduce-scatter", buf, count, dtype, op);
  if (!err)
    err = queue_begin(c, "reduce-scatter");
  if (err)
    return err;
  if (count)
    err =
        NCCL_STARTED(base->log,
                     ncclReduceScatter(buf, (char *)buf + c->rank * piece * gs_dtype_size(dtype),
                                       piece, nccl_type(dtype),
                                       op == GS_REDUCE_SUM ? ncclSum : ncclAvg, c->nccl, c->stream),
                     &in_progress);
  return queue_end(c, "reduce-scatter enqueue", err, in_progress);
}

static int nccl_allgather(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  size_t piece = nccl_piece(base, count);
  bool in_progress = false;
  int err = op_begin(c, "allgather");

  if (!err)
    err = gs__comm_check_reduction(base, "allgather", buf, count, dtype, GS_REDUCE_SUM);
  if (!err)
    err = queue_begin(c, "allgather");
  if (err)
    return err;
  if (count)
    err = NCCL_STARTED(base->log,
                       ncclAllGather((char *)buf + c->rank * piece * gs_dtype_size(dtype), buf,
                                     piece, nccl_type(dtype), c->nccl, c->stream),
                       &in_progress);
  return queue_end(c, "allgather enqueue", err, in_progress);
}

static int nccl_broadcast(gs_comm_t *base, void *buf, size_t bytes, uint32_t root)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  bool in_progress = false;
  int err = op_begin(c, "broadcast");

  if (err)
    return err;
  if (root >= c->world || (bytes && !buf)) {
    GS_LOG_ERR(base->log,
               "nccl comm: broadcast of %zu bytes from root %" PRIu32 " in a world of %" PRIu32
               ": invalid arguments",
               bytes, root, c->world);
    return GS_EINVAL;
  }
  err = queue_begin(c, "broadcast");
  if (err)
    return err;
  if (bytes)
    err = NCCL_STARTED(base->log,
                       ncclBroadcast(buf, buf, bytes, ncclUint8, (int)root, c->nccl, c->stream),
                       &in_progress);
  return queue_end(c, "broadcast enqueue", err, in_progress);
}

/* The spans' broadcasts as one NCCL group: one launch (one wait for
 * NCCL's launch thread) and one done event for all of them. */
static int nccl_broadcast_group(gs_comm_t *base, const gs_comm_span_t *spans, size_t n,
                                uint32_t root)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  bool in_progress = false, ignored;
  int err = op_begin(c, "broadcast group"), end;

  if (err)
    return err;
  for (size_t i = 0; i < n; i++)
    if (spans[i].bytes && !spans[i].buf)
      err = GS_EINVAL;
  if (err || root >= c->world) {
    GS_LOG_ERR(base->log,
               "nccl comm: broadcast group of %zu buffers from root %" PRIu32
               " in a world of %" PRIu32 ": invalid arguments",
               n, root, c->world);
    return GS_EINVAL;
  }
  err = queue_begin(c, "broadcast group");
  if (err)
    return err;
  err = GS_NCCL_STATUS(base->log, ncclGroupStart());
  if (err)
    return comm_fail(c, err);
  for (size_t i = 0; i < n && !err; i++)
    if (spans[i].bytes)
      err = NCCL_STARTED(base->log,
                         ncclBroadcast(spans[i].buf, spans[i].buf, spans[i].bytes, ncclUint8,
                                       (int)root, c->nccl, c->stream),
                         &ignored);
  /* The group must be closed even after a failed call in it. */
  end = NCCL_STARTED(base->log, ncclGroupEnd(), &in_progress);
  return queue_end(c, "broadcast group launch", err ? err : end, in_progress);
}

/* This rank's piece to the next rank, the previous rank's piece from it:
 * one grouped send and receive. */
static int nccl_shard_pass(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  size_t piece = nccl_piece(base, count), esz = gs_dtype_size(dtype);
  uint32_t next = (c->rank + 1) % c->world, prev = (c->rank + c->world - 1) % c->world;
  bool in_progress = false, ignored;
  int err = op_begin(c, "shard pass"), end;

  if (!err)
    err = gs__comm_check_reduction(base, "shard pass", buf, count, dtype, GS_REDUCE_SUM);
  if (!err)
    err = queue_begin(c, "shard pass");
  if (err || !count || c->world == 1)
    return err ? err : queue_end(c, "shard pass", 0, false);
  err = GS_NCCL_STATUS(base->log, ncclGroupStart());
  if (err)
    return comm_fail(c, err);
  err = NCCL_STARTED(base->log,
                     ncclSend((char *)buf + c->rank * piece * esz, piece, nccl_type(dtype),
                              (int)next, c->nccl, c->stream),
                     &ignored);
  if (!err)
    err = NCCL_STARTED(base->log,
                       ncclRecv((char *)buf + prev * piece * esz, piece, nccl_type(dtype),
                                (int)prev, c->nccl, c->stream),
                       &ignored);
  end = NCCL_STARTED(base->log, ncclGroupEnd(), &in_progress); /* closed even after a failure */
  return queue_end(c, "shard pass launch", err ? err : end, in_progress);
}

/* Compute-stream work queued from now on waits for collective `ticket`.
 * Tickets before the last sync are complete already: nothing to do. */
static int nccl_order_after(gs_comm_t *base, uint64_t ticket)
{
  nccl_comm_t *c = (nccl_comm_t *)base;
  uint32_t slot;
  int err = op_begin(c, "order_after");

  if (err)
    return err;
  if (ticket >= base->ticket) {
    GS_LOG_ERR(base->log,
               "nccl comm: order_after(%" PRIu64 "): not queued yet (next is %" PRIu64 ")", ticket,
               base->ticket);
    return GS_EINVAL;
  }
  if (ticket < c->window)
    return 0;
  slot = (uint32_t)(ticket % c->nevents);
  if (c->slot_ticket[slot] != ticket) {
    GS_LOG_ERR(base->log, "nccl comm: order_after(%" PRIu64 "): that collective was refused",
               ticket);
    return GS_EINVAL;
  }
  err = GS_CUDA_STATUS(base->log, cudaStreamWaitEvent(c->compute, c->done[slot], 0));
  return err ? comm_fail(c, err) : 0;
}

/* One poll of collective `ticket`'s event: 1 done, 0 not yet, or an
 * error. cudaEventQuery's "not ready" can stay behind as this thread's last
 * CUDA error, which the device module reads after each kernel launch; it is
 * cleared here, and anything else found there is reported. */
static int poll_done(nccl_comm_t *c, uint64_t ticket)
{
  cudaError_t status = cudaEventQuery(c->done[ticket % c->nevents]);
  cudaError_t last_error;

  if (status == cudaSuccess)
    return 1;
  if (status != cudaErrorNotReady)
    return GS_CUDA_STATUS(c->base.log, status);
  last_error = cudaGetLastError();
  return last_error == cudaErrorNotReady ? 0 : GS_CUDA_STATUS(c->base.log, last_error);
}

/* Waits for the collectives numbered below `until` (the queued ones, for
 * a sync): spins for SYNC_SPIN_NS, then polls every ~100 us, watching
 * NCCL's asynchronous errors, the abort flag and the timeout (any of them
 * aborts the communicator). Those done no longer count against
 * max_queued. */
static int sync_until(nccl_comm_t *c, uint64_t until)
{
  gs_comm_t *base = &c->base;
  uint64_t start, spin_until, last;
  ncclResult_t async_error;
  int err = op_begin(c, "sync"), done;

  if (err)
    return err;
  if (until > base->ticket)
    until = base->ticket;
  if (until <= c->window || !c->pending)
    return 0;
  last = until - 1;
  start = gs_now_ms();
  spin_until = gs_now_ns() + SYNC_SPIN_NS;
  for (;;) {
    done = poll_done(c, last);
    if (done < 0)
      return comm_fail(c, done);
    if (done)
      break;
    err = GS_NCCL_STATUS(base->log, ncclCommGetAsyncError(c->nccl, &async_error));
    if (err)
      return comm_fail(c, err);
    if (async_error != ncclSuccess && async_error != ncclInProgress)
      return async_failed(c, "collective", async_error);
    if (is_aborted(c)) {
      GS_LOG_WARNING(base->log, "nccl comm: rank %" PRIu32 ": sync aborted", c->rank);
      return comm_fail(c, GS_EABORTED);
    }
    if (gs_now_ms() - start >= c->timeout_ms) {
      GS_LOG_ERR(base->log,
                 "nccl comm: rank %" PRIu32 ": collective did not complete within %" PRIu64
                 " ms (ticket %" PRIu64 "; a peer is stalled or gone)",
                 c->rank, c->timeout_ms, last);
      return comm_fail(c, GS_ETIMEDOUT);
    }
    if (gs_now_ns() >= spin_until)
      sleep_us(SYNC_POLL_US);
  }
  /* The events can complete while the communicator has failed (a peer's
   * error reported after our kernels ran): never call that a success. */
  err = GS_NCCL_STATUS(base->log, ncclCommGetAsyncError(c->nccl, &async_error));
  if (err)
    return comm_fail(c, err);
  if (async_error != ncclSuccess && async_error != ncclInProgress)
    return async_failed(c, "collective", async_error);
  c->window = until;
  if (until == base->ticket)
    c->pending = false;
  return 0;
}

static int nccl_sync(gs_comm_t *base)
{
  return sync_until((nccl_comm_t *)base, base->ticket);
}

static int nccl_sync_until(gs_comm_t *base, uint64_t until)
{
  return sync_until((nccl_comm_t *)base, until);
}

/* Only sets the flag (safe from any thread, never blocks): the comm
 * thread's next poll or operation aborts the communicator. */
static void nccl_abort(gs_comm_t *base)
{
  atomic_store(&((nccl_comm_t *)base)->aborted, true);
}

/* A clean shutdown when the communicator is healthy: wait for the queued
 * collectives, then finalize (bounded by the timeout) and destroy. Any
 * failure on the way aborts it instead. */
static void shut_down(nccl_comm_t *c)
{
  bool in_progress;
  int err = nccl_sync(&c->base);

  if (!err)
    err = NCCL_STARTED(c->base.log, ncclCommFinalize(c->nccl), &in_progress);
  if (!err && in_progress)
    err = wait_ready(c, "finalize", "", false, WAIT_OP_SLEEP_MAX_US, c->timeout_ms);
  if (err) {
    comm_fail(c, err);
    return;
  }
  (void)NCCL_STARTED(c->base.log, ncclCommDestroy(c->nccl), &in_progress);
  c->nccl = NULL;
}

static void nccl_destroy(gs_comm_t *base)
{
  nccl_comm_t *c = (nccl_comm_t *)base;

  if (c->nccl || c->stream) {
    if (!enter(c) && c->nccl && c->ready && !is_aborted(c))
      shut_down(c);
    comm_fail(c, GS_EABORTED); /* aborts what shut_down left */
    release_cuda(c);
  }
  free(c);
}

static const gs_comm_ops_t nccl_ops = {
    .name = "nccl",
    .stream_ordered = true,
    .make_id = nccl_make_id,
    .listen = nccl_listen,
    .order_after = nccl_order_after,
    .sync = nccl_sync,
    .sync_until = nccl_sync_until,
    .init = nccl_init,
    .allreduce = nccl_allreduce,
    .shard = nccl_shard,
    .shard_room = nccl_shard_room,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .shard_pass = nccl_shard_pass,
    .broadcast = nccl_broadcast,
    .broadcast_group = nccl_broadcast_group,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

gs_comm_t *gs__comm_nccl_new(const gs_log_t *log)
{
  nccl_comm_t *c = calloc(1, sizeof(*c));

  if (!c) {
    GS_LOG_ERR(log, "nccl comm: out of memory");
    return NULL;
  }
  c->base.ops = &nccl_ops;
  c->base.log = log;
  atomic_init(&c->aborted, false);
  return &c->base;
}
