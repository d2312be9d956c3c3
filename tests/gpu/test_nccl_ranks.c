/* Multi-rank tests of agent/comm/comm_nccl.c on one GPU: NCCL refuses two
 * ranks of one communicator on the same GPU of one host, but each rank may
 * present itself as a host of its own (a distinct NCCL_HOSTID, one process
 * each), and NCCL then runs real collectives between them over loopback
 * sockets (NCCL_NET=Socket, NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo), all
 * on GPU 0. Every collective goes through the non-blocking path.
 *
 * The check suites run in this process and start the ranks as children:
 * this program again, `test_nccl_ranks --rank CASE RANK WORLD TIMEOUT_MS ID`
 * (ID: rank 0's NCCL id in hex, made here). Cases: exact SUM and MEAN of
 * the in-place allreduce, and of reduce-scatter + allgather, at worlds 2 to 4 and broadcasts
 * (single and grouped) from a non-zero root; the per-call cost of a small allreduce at worlds 1, 2
 * and 4; one rank killed (-9) or stopped (SIGSTOP) after the first collective: the others must end
 * with an error, never hang.
 *
 * Exits 77 (ctest's "skipped") without a visible GPU. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "device.h"
#include "gpu_check.h"
#include "hex.h"
#include "clock.h"

#define ID_CAP 512
#define MAX_WORLD 4
#define BIG 1000003       /* elements; prime */
#define OP_TIMEOUT 30000  /* ms; the comm timeout of the healthy cases */
#define LOSS_TIMEOUT 8000 /* ms; the comm timeout when a rank is lost */
#define WORLD_LIMIT 180   /* s a whole world may take before it is killed */
#define COST_CALLS 2000
#define COST_ELEMS 4096 /* a 16 KiB pack */
#define COST_QUEUE 16   /* collectives between syncs */
/* The old wait slept 1 ms whenever NCCL answered ncclInProgress, which
 * NCCL 2.28 does almost every time: a median at or above this is that
 * stall back. */
#define COST_MEDIAN_LIMIT_US 900.0

extern char **environ;

/* ------------------------------------------------------------------ */
/* The rank side (a child process). Failures are printed and make the
 * child exit 1; the parent's check reports that. */

typedef struct rank_ctx {
  const char *name; /* the case */
  uint32_t rank, world;
  uint64_t timeout_ms;
  gs_log_t log;
  gs_device_t *dev;
  gs_comm_t *comm;
} rank_ctx_t;

/* Prints a failure of this rank when !ok; returns ok. */
static bool expect(const rank_ctx_t *r, bool ok, const char *what, long long got)
{
  if (!ok)
    printf("rank %" PRIu32 " (%s, world %" PRIu32 "): FAILED: %s (got %lld)\n", r->rank, r->name,
           r->world, what, got);
  fflush(stdout);
  return ok;
}

/* Brings the last collective's result to the host: the compute stream
 * waits for it, the comm syncs, then the download. */
static int finish_into(rank_ctx_t *r, void *host, const void *dev_buf, size_t bytes)
{
  int err = gs_comm_order_after(r->comm, gs_comm_ticket(r->comm) - 1);

  if (!err)
    err = gs_comm_sync(r->comm);
  if (!err)
    err = gs_device_download(r->dev, host, dev_buf, bytes);
  return err;
}

/* Element i of rank r's input: small integers, so every sum is exact. */
static double input_of(uint32_t rank, size_t i)
{
  return (double)((i % 251) * (rank + 1)) - 100.0;
}

/* In-place allreduce of n elements of dtype with op, or (sharded) its two
 * halves, reduce-scatter then allgather, in a buffer of the shards' room;
 * checks every element: SUM exactly, MEAN within float rounding. */
static bool check_allreduce(rank_ctx_t *r, gs_dtype_t dtype, gs_reduce_op_t op, size_t n,
                            bool sharded)
{
  size_t size = gs_dtype_size(dtype), bytes = n * size;
  size_t room = (sharded ? gs_comm_shard_room(r->comm, n) : n) * size;
  double *want = malloc((n + 1) * sizeof(double)), sum_ranks = 0;
  unsigned char *host = malloc(bytes + 8);
  void *buf = gs_device_alloc(r->dev, room + 8);
  bool ok = want && host && buf;
  int err;

  for (uint32_t k = 0; k < r->world; k++)
    sum_ranks += (double)(k + 1);
  for (size_t i = 0; ok && i < n; i++) {
    double mine = input_of(r->rank, i);

    /* sum over ranks k of ((i % 251) * (k + 1) - 100) */
    want[i] = (double)(i % 251) * sum_ranks - 100.0 * r->world;
    if (op == GS_REDUCE_MEAN)
      want[i] /= r->world;
    if (dtype == GS_DTYPE_FLOAT32)
      ((float *)host)[i] = (float)mine;
    else
      ((double *)host)[i] = mine;
  }
  err = ok ? gs_device_upload(r->dev, buf, host, bytes) : GS_ENOMEM;
  if (!err)
    err = sharded ? gs_comm_reduce_scatter(r->comm, buf, n, dtype, op)
                  : gs_comm_allreduce(r->comm, buf, n, dtype, op);
  if (!err && sharded)
    err = gs_comm_allgather(r->comm, buf, n, dtype);
  if (!err)
    err = finish_into(r, host, buf, bytes);
  ok = expect(r, !err,
              sharded ? "reduce-scatter or allgather returned an error"
                      : "allreduce returned an error",
              err);
  for (size_t i = 0; ok && i < n; i++) {
    double got = dtype == GS_DTYPE_FLOAT32 ? ((float *)host)[i] : ((double *)host)[i];
    double tol = op == GS_REDUCE_SUM ? 0 : 1e-6 * (1.0 + (want[i] < 0 ? -want[i] : want[i]));

    if (got - want[i] > tol || want[i] - got > tol) {
      printf("rank %" PRIu32 ": %s %s of %zu %s: element %zu is %.17g, expected %.17g\n", r->rank,
             sharded ? "reduce-scatter + allgather" : "allreduce", gs_reduce_op_name(op), n,
             gs_dtype_name(dtype), i, got, want[i]);
      ok = false;
    }
  }
  gs_device_free(r->dev, buf);
  free(host);
  free(want);
  return ok;
}

/* Byte i of rank r's broadcast input. */
static unsigned char byte_of(uint32_t rank, size_t i)
{
  return (unsigned char)(rank * 31u + i * 7u + (i >> 8));
}

/* Broadcasts from root `root` of the given sizes: one gs_comm_broadcast
 * each when !grouped, else one gs_comm_broadcast_group of them all. */
static bool check_broadcast(rank_ctx_t *r, uint32_t root, const size_t *sizes, size_t n,
                            bool grouped)
{
  gs_comm_span_t spans[8];
  unsigned char *host[8] = {0};
  bool ok = n <= 8;
  int err = 0;

  for (size_t s = 0; ok && s < n; s++) {
    host[s] = malloc(sizes[s] + 1);
    spans[s] = (gs_comm_span_t){gs_device_alloc(r->dev, sizes[s] + 1), sizes[s]};
    ok = host[s] && spans[s].buf;
    for (size_t i = 0; ok && i < sizes[s]; i++)
      host[s][i] = byte_of(r->rank, i + s);
    if (ok)
      err = gs_device_upload(r->dev, spans[s].buf, host[s], sizes[s]);
    if (!err && ok && !grouped)
      err = gs_comm_broadcast(r->comm, spans[s].buf, sizes[s], root);
    ok = ok && !err;
  }
  if (ok && grouped)
    err = gs_comm_broadcast_group(r->comm, spans, n, root);
  if (ok && !err)
    err = gs_comm_order_after(r->comm, gs_comm_ticket(r->comm) - 1);
  if (ok && !err)
    err = gs_comm_sync(r->comm);
  ok = expect(r, ok && !err, grouped ? "grouped broadcast failed" : "broadcast failed", err);
  for (size_t s = 0; s < n; s++) {
    if (ok && gs_device_download(r->dev, host[s], spans[s].buf, sizes[s]) != 0)
      ok = expect(r, false, "download after broadcast", (long long)s);
    for (size_t i = 0; ok && i < sizes[s]; i++)
      if (host[s][i] != byte_of(root, i + s)) {
        printf("rank %" PRIu32 ": %sbroadcast %zu of %zu bytes from %" PRIu32
               ": byte %zu is %u, expected %u\n",
               r->rank, grouped ? "grouped " : "", s, sizes[s], root, i, host[s][i],
               byte_of(root, i + s));
        ok = false;
      }
    if (spans[s].buf)
      gs_device_free(r->dev, spans[s].buf);
    free(host[s]);
  }
  return ok;
}

static int case_values(rank_ctx_t *r)
{
  static const size_t counts[] = {0, 1, 4097, BIG};
  static const size_t sizes[] = {12345, 0, 1, (size_t)3 << 20};
  bool ok = true;

  for (int sharded = 0; sharded < 2; sharded++)
    for (int d = 0; d < 2; d++)
      for (int o = 0; o < 2; o++)
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
          ok &= check_allreduce(r, d ? GS_DTYPE_FLOAT64 : GS_DTYPE_FLOAT32,
                                o ? GS_REDUCE_MEAN : GS_REDUCE_SUM, counts[k], sharded);
  ok &= check_broadcast(r, r->world - 1, sizes, 4, false);
  ok &= check_broadcast(r, r->world - 1, sizes, 4, true);
  ok &= check_broadcast(r, 0, sizes, 4, true);
  if (ok && r->rank == 0)
    printf("world %" PRIu32 ": allreduce and reduce-scatter + allgather sum/mean exact, "
           "broadcasts from rank %" PRIu32 " ok\n",
           r->world, r->world - 1);
  return ok ? 0 : 1;
}

static int compare_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

  return x < y ? -1 : x > y;
}

/* COST_CALLS allreduces of a 16 KiB pack, a sync every COST_QUEUE (as a
 * step's packs): how long one gs_comm_allreduce call holds the caller, the
 * training thread in backward. Rank 0 prints the distribution. */
static int case_cost(rank_ctx_t *r)
{
  uint64_t *ns = malloc(COST_CALLS * sizeof(*ns)), t0, t_all;
  void *buf = gs_device_alloc(r->dev, COST_ELEMS * sizeof(float));
  double mean = 0, median;
  int err = ns && buf ? 0 : GS_ENOMEM;

  for (int i = 0; !err && i < 64; i++) /* warm-up: connections, first launches */
    err = gs_comm_allreduce(r->comm, buf, COST_ELEMS, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
  if (!err)
    err = gs_comm_sync(r->comm);
  t_all = gs_now_ns();
  for (int i = 0; !err && i < COST_CALLS; i++) {
    t0 = gs_now_ns();
    err = gs_comm_allreduce(r->comm, buf, COST_ELEMS, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
    ns[i] = gs_now_ns() - t0;
    if (!err && (i + 1) % COST_QUEUE == 0)
      err = gs_comm_sync(r->comm);
  }
  if (!err)
    err = gs_comm_sync(r->comm);
  t_all = gs_now_ns() - t_all;
  if (!expect(r, !err, "allreduce in the cost loop failed", err))
    return 1;
  qsort(ns, COST_CALLS, sizeof(*ns), compare_u64);
  for (int i = 0; i < COST_CALLS; i++)
    mean += (double)ns[i] / COST_CALLS;
  median = (double)ns[COST_CALLS / 2] / 1e3;
  printf("world %" PRIu32 " rank %" PRIu32 ": allreduce of %d floats, %d calls, a sync every %d: "
         "per call mean %.1f us, p50 %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us; "
         "%.1f us per collective including the syncs\n",
         r->world, r->rank, COST_ELEMS, COST_CALLS, COST_QUEUE, mean / 1e3, median,
         (double)ns[COST_CALLS * 9 / 10] / 1e3, (double)ns[COST_CALLS * 99 / 100] / 1e3,
         (double)ns[COST_CALLS - 1] / 1e3, (double)t_all / 1e3 / COST_CALLS);
  free(ns);
  gs_device_free(r->dev, buf);
  return expect(r, median < COST_MEDIAN_LIMIT_US, "median per-call cost (us) over the limit",
                (long long)median)
             ? 0
             : 1;
}

/* One collective that every rank completes, then the last rank is killed
 * (`sig` SIGKILL) or stopped (SIGSTOP) and the others' next collective
 * must fail: killed, with an error within the timeout (plus a margin);
 * stopped, with GS_ETIMEDOUT at the timeout. */
static int case_loss(rank_ctx_t *r, int sig)
{
  void *buf = gs_device_alloc(r->dev, 1024 * sizeof(float));
  uint64_t t0;
  int err = buf ? 0 : GS_ENOMEM;

  if (!err)
    err = gs_comm_allreduce(r->comm, buf, 1024, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
  if (!err)
    err = gs_comm_sync(r->comm);
  if (!expect(r, !err, "the first collective failed", err))
    return 1;
  if (r->rank == r->world - 1) {
    printf("rank %" PRIu32 ": raising signal %d\n", r->rank, sig);
    fflush(stdout);
    raise(sig);
    pause(); /* stopped: the parent kills us */
    return 1;
  }
  t0 = gs_now_ms();
  for (int i = 0; !err && i < 100; i++) {
    err = gs_comm_allreduce(r->comm, buf, 1024, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
    if (!err)
      err = gs_comm_sync(r->comm);
  }
  t0 = gs_now_ms() - t0;
  printf("rank %" PRIu32 ": after rank %" PRIu32 " got signal %d: %s after %" PRIu64 " ms\n",
         r->rank, r->world - 1, sig, gs_err_name(err), t0);
  /* Not hung: the parent's WORLD_LIMIT decides that, generously. */
  if (!expect(r, err != 0, "collectives went on without the lost rank", err))
    return 1;
  if (sig == SIGSTOP)
    return expect(r, err == GS_ETIMEDOUT && t0 >= r->timeout_ms,
                  "a stopped peer should end in GS_ETIMEDOUT at the comm timeout (ms)",
                  (long long)t0)
               ? 0
               : 1;
  return 0;
}

/* The child's main: argv = CASE RANK WORLD TIMEOUT_MS ID. Sets its own
 * NCCL_HOSTID before any CUDA or NCCL call, opens cuda:0, joins the world
 * and runs the case. */
static int rank_main(char **argv)
{
  rank_ctx_t r = {.name = argv[0]};
  unsigned char id[ID_CAP];
  size_t id_len = 0;
  char host_id[64], why[256] = "";
  gs_comm_setup_t setup;
  int err, rc = 1;

  r.rank = (uint32_t)strtoul(argv[1], NULL, 10);
  r.world = (uint32_t)strtoul(argv[2], NULL, 10);
  r.timeout_ms = strtoull(argv[3], NULL, 10);
  if (!gs_hex_decode(argv[4], id, sizeof(id), &id_len) || r.world == 0 || r.rank >= r.world) {
    printf("rank: bad arguments\n");
    return 2;
  }
  snprintf(host_id, sizeof(host_id), "gradsync-test-rank-%" PRIu32, r.rank);
  setenv("NCCL_HOSTID", host_id, 1);
  r.log = (gs_log_t){.level = GS_LOG_WARN, .out = stdout, .component = "test_nccl_ranks"};
  r.dev = gs_device_open("cuda", 0, &r.log, why, sizeof(why));
  if (!expect(&r, r.dev != NULL, why, 0))
    return 1;
  r.comm = gs_comm_new("nccl", &r.log);
  setup = (gs_comm_setup_t){.rank = r.rank,
                            .world_size = r.world,
                            .generation = 1,
                            .timeout_ms = r.timeout_ms,
                            .device = r.dev,
                            .id = id,
                            .id_len = id_len,
                            .max_queued = COST_QUEUE + 64};
  err = r.comm ? gs_comm_init(r.comm, &setup) : GS_ENOMEM;
  if (expect(&r, !err, "init failed", err)) {
    if (!strcmp(r.name, "values"))
      rc = case_values(&r);
    else if (!strcmp(r.name, "cost"))
      rc = case_cost(&r);
    else if (!strcmp(r.name, "kill"))
      rc = case_loss(&r, SIGKILL);
    else if (!strcmp(r.name, "stop"))
      rc = case_loss(&r, SIGSTOP);
    else
      printf("rank: unknown case %s\n", r.name);
  }
  gs_comm_destroy(r.comm);
  gs_device_destroy(r.dev);
  fflush(stdout);
  return rc;
}

/* ------------------------------------------------------------------ */
/* The parent side: the check suites. */

typedef struct world {
  pid_t pid[MAX_WORLD];
  int status[MAX_WORLD];
  bool done[MAX_WORLD];
  uint32_t n;
} world_t;

/* Starts n ranks of `name` with a fresh id (made here: NCCL's rendezvous
 * root runs in this process until every rank has connected). */
static void world_start(world_t *w, const char *name, uint32_t n, uint64_t timeout_ms)
{
  gs_log_t log = {GS_LOG_WARN, NULL, "test_nccl_ranks"};
  gs_comm_t *maker = gs_comm_new("nccl", &log);
  unsigned char id[ID_CAP];
  char hex[2 * ID_CAP + 1], rank[16], world[16], timeout[24], self[4096];
  size_t id_len = 0;
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);

  ck_assert(len > 0);
  self[len] = '\0';
  ck_assert_ptr_nonnull(maker);
  ck_assert_int_eq(gs_comm_make_id(maker, id, sizeof(id), &id_len), 0);
  gs_comm_destroy(maker);
  gs_hex_encode(id, id_len, hex);
  memset(w, 0, sizeof(*w));
  w->n = n;
  snprintf(world, sizeof(world), "%" PRIu32, n);
  snprintf(timeout, sizeof(timeout), "%" PRIu64, timeout_ms);
  for (uint32_t r = 0; r < n; r++) {
    char *argv[] = {self, "--rank", (char *)name, rank, world, timeout, hex, NULL};

    snprintf(rank, sizeof(rank), "%" PRIu32, r);
    ck_assert_int_eq(posix_spawn(&w->pid[r], self, NULL, NULL, argv, environ), 0);
  }
}

/* Kills and reaps every rank that has not been reaped. */
static void world_reap(world_t *w)
{
  for (uint32_t r = 0; r < w->n; r++)
    if (!w->done[r]) {
      kill(w->pid[r], SIGKILL);
      waitpid(w->pid[r], &w->status[r], 0);
      w->done[r] = true;
    }
}

/* Waits for ranks [0, upto) to exit, at most WORLD_LIMIT seconds; when they
 * do not, kills and reaps the whole world and fails. */
static void world_wait(world_t *w, uint32_t upto)
{
  uint64_t deadline = gs_now_ms() + WORLD_LIMIT * 1000ull;
  uint32_t left = 0;

  for (uint32_t r = 0; r < upto; r++)
    left += !w->done[r];
  while (left > 0 && gs_now_ms() < deadline) {
    struct timespec ts = {0, 20 * 1000 * 1000};

    for (uint32_t r = 0; r < upto; r++)
      if (!w->done[r] && waitpid(w->pid[r], &w->status[r], WNOHANG) == w->pid[r]) {
        w->done[r] = true;
        left--;
      }
    if (left)
      nanosleep(&ts, NULL);
  }
  if (left)
    world_reap(w);
  ck_assert_msg(left == 0, "%u of %u ranks still running after %d s (killed)", left, upto,
                WORLD_LIMIT);
}

static void assert_exited_ok(const world_t *w, uint32_t upto, const char *name)
{
  for (uint32_t r = 0; r < upto; r++)
    ck_assert_msg(WIFEXITED(w->status[r]) && WEXITSTATUS(w->status[r]) == 0,
                  "%s, world %u: rank %u ended with status 0x%x (its output is above)", name, w->n,
                  r, w->status[r]);
}

static void run_world(const char *name, uint32_t n)
{
  world_t w;

  world_start(&w, name, n, OP_TIMEOUT);
  world_wait(&w, n);
  world_reap(&w);
  assert_exited_ok(&w, n, name);
}

START_TEST(values_world)
{
  run_world("values", (uint32_t)_i);
}
END_TEST

START_TEST(cost_world)
{
  static const uint32_t worlds[] = {1, 2, 4};

  run_world("cost", worlds[_i]);
}
END_TEST

/* The last rank dies (or stops) after the first collective; the others
 * must end on their own, with an error. */
static void lose_a_rank(const char *name, int sig)
{
  world_t w;

  world_start(&w, name, 3, LOSS_TIMEOUT);
  world_wait(&w, 2);
  if (sig == SIGKILL) {
    world_wait(&w, 3);
    ck_assert_msg(WIFSIGNALED(w.status[2]) && WTERMSIG(w.status[2]) == SIGKILL,
                  "the victim ended with status 0x%x", w.status[2]);
  }
  world_reap(&w);
  assert_exited_ok(&w, 2, name);
}

START_TEST(kill_one_rank)
{
  lose_a_rank("kill", SIGKILL);
}
END_TEST

START_TEST(stop_one_rank)
{
  lose_a_rank("stop", SIGSTOP);
}
END_TEST

static TCase *ranks_tcase(const char *name, const TTest *test, int from, int to)
{
  TCase *tc = tcase_create(name);

  tcase_set_timeout(tc, 3 * WORLD_LIMIT);
  tcase_add_loop_test(tc, test, from, to);
  return tc;
}

static Suite *ranks_suite(void)
{
  Suite *s = suite_create("comm_nccl_one_gpu_ranks");

  suite_add_tcase(s, ranks_tcase("values_world", values_world, 2, MAX_WORLD + 1));
  suite_add_tcase(s, ranks_tcase("cost_world", cost_world, 0, 3));
  suite_add_tcase(s, ranks_tcase("kill_one_rank", kill_one_rank, 0, 1));
  suite_add_tcase(s, ranks_tcase("stop_one_rank", stop_one_rank, 0, 1));
  return s;
}

int main(int argc, char **argv)
{
  int skip;

  /* Every process (the ranks inherit it): NCCL over loopback sockets only. */
  setenv("NCCL_NET", "Socket", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  if (argc == 7 && !strcmp(argv[1], "--rank"))
    return rank_main(argv + 2);
  skip = gs_gpu_skip();
  if (skip)
    return skip;
  return gs_gpu_run_suite(ranks_suite()) ? EXIT_FAILURE : EXIT_SUCCESS;
}
