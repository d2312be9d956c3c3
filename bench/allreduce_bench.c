/* allreduce_bench: the host backend's allreduce between N real processes on
 * this machine, over real sockets, measured the way nccl-tests measures
 * (CONVENTIONS.md "nccl-tests"): for each size, one checked allreduce, a
 * few warm-up ones, then timed iterations; one line per size with the time,
 * algbw (bytes / time), busbw (algbw × 2(n−1)/n) and whether the sum was
 * right. bench/allreduce_vs_mpi.sh runs it next to Open MPI and gloo, whose
 * drivers (bench/mpi_allreduce.c, bench/gloo_allreduce.py) print the same
 * lines.
 *
 * The parent binds every rank's listener (gs_comm_listen, port 0) so that
 * all addresses are known before any rank starts, then forks one process per
 * rank; each child keeps its own comm and drops the others. */
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "parse.h"
#include "clock.h"

#define MAX_RANKS 64
#define ADDR_LEN 64

typedef struct opts {
  uint32_t ranks;
  uint64_t min_bytes, max_bytes;
  uint64_t factor;
  double target_s; /* timed seconds per size */
  uint64_t timeout_ms;
  gs_reduce_op_t op;
  bool csv;
  bool bind;     /* pin rank r to CPU r (mod the CPUs we may use), as mpirun does */
  bool tcp_only; /* $GRADSYNC_HOST_SHM=0: every link on TCP, as the agent reads it */
} opts_t;

static void usage(FILE *out)
{
  fprintf(out,
          "usage: allreduce_bench [options]\n"
          "  --ranks N     processes (default 2, at most %d)\n"
          "  --min SIZE    smallest message in bytes (default 4KiB)\n"
          "  --max SIZE    largest message in bytes (default 256MiB)\n"
          "  --factor K    size step (default 4)\n"
          "  --time SECS   timed seconds per size (default 0.3)\n"
          "  --op OP       sum or mean (default sum)\n"
          "  --timeout DUR no progress for this long fails (default 30s)\n"
          "  --csv         impl,ranks,bytes,time_us,algbw_gbps,busbw_gbps,correct lines\n"
          "  --bind        pin rank r to the r-th allowed CPU (mpirun's default for\n"
          "                as many ranks as cores)\n"
          "  --help        this text\n"
          "Messages are float32; sizes accept suffixes (64KiB, 1MiB). GRADSYNC_HOST_SHM=0\n"
          "keeps the links between ranks on TCP (default: shared memory on one machine).\n",
          MAX_RANKS);
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
  static const struct option longs[] = {{"ranks", required_argument, NULL, 'n'},
                                        {"min", required_argument, NULL, 'a'},
                                        {"max", required_argument, NULL, 'b'},
                                        {"factor", required_argument, NULL, 'f'},
                                        {"time", required_argument, NULL, 't'},
                                        {"op", required_argument, NULL, 'o'},
                                        {"timeout", required_argument, NULL, 'T'},
                                        {"csv", no_argument, NULL, 'c'},
                                        {"bind", no_argument, NULL, 'B'},
                                        {"help", no_argument, NULL, 'h'},
                                        {NULL, 0, NULL, 0}};
  long v;
  int ch;

  *o = (opts_t){.ranks = 2,
                .min_bytes = 4096,
                .max_bytes = 256u << 20,
                .factor = 4,
                .target_s = 0.3,
                .timeout_ms = 30000,
                .op = GS_REDUCE_SUM,
                .tcp_only =
                    getenv("GRADSYNC_HOST_SHM") && !strcmp(getenv("GRADSYNC_HOST_SHM"), "0")};
  while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    switch (ch) {
    case 'n':
      if (gs_parse_long(optarg, 1, MAX_RANKS, &v))
        return -1;
      o->ranks = (uint32_t)v;
      break;
    case 'a':
      if (gs_parse_size(optarg, &o->min_bytes))
        return -1;
      break;
    case 'b':
      if (gs_parse_size(optarg, &o->max_bytes))
        return -1;
      break;
    case 'f':
      if (gs_parse_long(optarg, 2, 1024, &v))
        return -1;
      o->factor = (uint64_t)v;
      break;
    case 't':
      o->target_s = atof(optarg);
      if (!(o->target_s > 0 && o->target_s < 3600))
        return -1;
      break;
    case 'o':
      if (gs_reduce_op_parse(optarg, &o->op))
        return -1;
      break;
    case 'T':
      if (gs_parse_duration_ms(optarg, &o->timeout_ms) || o->timeout_ms == 0)
        return -1;
      break;
    case 'c':
      o->csv = true;
      break;
    case 'B':
      o->bind = true;
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      return -1;
    }
  }
  if (optind != argc || o->min_bytes < sizeof(float) || o->min_bytes > o->max_bytes)
    return -1;
  return 0;
}

/* Rank r's value at i: small integers, so the float sum over the ranks is
 * exact and the check can demand equality. */
static float value(uint32_t rank, size_t i)
{
  return (float)((int)((i * 13 + rank * 7) % 23) - 11);
}

/* One allreduce of rank-dependent values, checked element by element
 * against the sum (or mean) computed here. */
static int checked_allreduce(gs_comm_t *comm, float *buf, size_t n, const opts_t *o, uint32_t rank,
                             bool *ok)
{
  int err;

  for (size_t i = 0; i < n; i++)
    buf[i] = value(rank, i);
  err = gs_comm_allreduce(comm, buf, n, GS_DTYPE_FLOAT32, o->op);
  if (err)
    return err;
  *ok = true;
  for (size_t i = 0; i < n && *ok; i++) {
    double want = 0;

    for (uint32_t r = 0; r < o->ranks; r++)
      want += value(r, i);
    if (o->op == GS_REDUCE_MEAN)
      want /= o->ranks;
    *ok =
        o->op == GS_REDUCE_SUM ? buf[i] == (float)want : (buf[i] - want) * (buf[i] - want) < 1e-10;
  }
  return 0;
}

/* Every rank agrees on rank 0's value of *x (a broadcast of 8 bytes). */
static int agree(gs_comm_t *comm, uint64_t *x)
{
  return gs_comm_broadcast(comm, x, sizeof(*x), 0);
}

static void print_line(const opts_t *o, size_t bytes, double sec, bool ok)
{
  double algbw = sec > 0 ? (double)bytes / sec / 1e9 : 0;
  double busbw = algbw * 2.0 * (o->ranks - 1) / o->ranks;

  if (o->csv)
    printf("gradsync,%" PRIu32 ",%zu,%.2f,%.3f,%.3f,%s\n", o->ranks, bytes, sec * 1e6, algbw, busbw,
           ok ? "yes" : "no");
  else
    printf("%12zu %12.2f %10.3f %10.3f  %s\n", bytes, sec * 1e6, algbw, busbw, ok ? "yes" : "no");
  fflush(stdout);
}

/* One size: checked run, warm-up, then rank 0 picks the iteration count
 * that fills opts.time and every rank runs that many. Rank 0 prints. */
static int run_size(gs_comm_t *comm, float *buf, size_t n, const opts_t *o, uint32_t rank)
{
  bool ok = false, all_ok;
  uint64_t iters, warm;
  double t0, per, sec;
  float flag;
  int err;

  err = checked_allreduce(comm, buf, n, o, rank, &ok);
  if (err)
    return err;
  /* Everyone's verdict: the sum of the ones that failed. */
  flag = ok ? 0.0f : 1.0f;
  err = gs_comm_allreduce(comm, &flag, 1, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
  if (err)
    return err;
  all_ok = flag == 0.0f;
  memset(buf, 0, n * sizeof(float)); /* timed runs: no growth towards inf */
  /* Warm-up (the same count on every rank), timed on rank 0 to size the
   * timed loop. */
  warm = n * sizeof(float) <= (1u << 20) ? 20 : n * sizeof(float) <= (16u << 20) ? 5 : 2;
  t0 = gs_now_ms_f() / 1e3;
  for (uint64_t i = 0; i < warm; i++) {
    err = gs_comm_allreduce(comm, buf, n, GS_DTYPE_FLOAT32, o->op);
    if (err)
      return err;
  }
  per = (gs_now_ms_f() / 1e3 - t0) / (double)warm;
  iters = (uint64_t)(o->target_s / per);
  iters = iters < 3 ? 3 : iters > 1000000 ? 1000000 : iters;
  err = agree(comm, &iters);
  if (err)
    return err;
  t0 = gs_now_ms_f() / 1e3;
  for (uint64_t i = 0; i < iters; i++) {
    err = gs_comm_allreduce(comm, buf, n, GS_DTYPE_FLOAT32, o->op);
    if (err)
      return err;
  }
  sec = (gs_now_ms_f() / 1e3 - t0) / (double)iters;
  if (rank == 0)
    print_line(o, n * sizeof(float), sec, all_ok);
  return 0;
}

/* Pins this process to the (rank mod count)-th CPU it may run on. */
static void bind_rank(uint32_t rank)
{
  cpu_set_t allowed, one;
  int count, k = -1;

  if (sched_getaffinity(0, sizeof(allowed), &allowed) || (count = CPU_COUNT(&allowed)) == 0)
    return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE && k < 0; cpu++)
    if (CPU_ISSET(cpu, &allowed) && seen++ == (int)(rank % (uint32_t)count))
      k = cpu;
  CPU_ZERO(&one);
  CPU_SET(k, &one);
  if (sched_setaffinity(0, sizeof(one), &one))
    perror("allreduce_bench: sched_setaffinity");
}

static int rank_main(gs_comm_t *comm, const char *const *addrs, const opts_t *o, uint32_t rank)
{
  gs_comm_setup_t setup = {.rank = rank,
                           .world_size = o->ranks,
                           .generation = 1,
                           .peer_addrs = addrs,
                           .timeout_ms = o->timeout_ms,
                           .tcp_only = o->tcp_only};
  size_t max_n = o->max_bytes / sizeof(float);
  float *buf = malloc(max_n * sizeof(float));
  int err;

  if (!buf) {
    fprintf(stderr, "allreduce_bench: rank %u: out of memory\n", rank);
    return 1;
  }
  if (o->bind)
    bind_rank(rank);
  err = gs_comm_init(comm, &setup);
  for (uint64_t bytes = o->min_bytes; !err && bytes <= o->max_bytes; bytes *= o->factor)
    err = run_size(comm, buf, (size_t)(bytes / sizeof(float)), o, rank);
  if (err)
    fprintf(stderr, "allreduce_bench: rank %u: %s\n", rank, gs_strerror(err));
  free(buf);
  return err ? 1 : 0;
}

int main(int argc, char **argv)
{
  gs_log_t log = {GS_LOG_WARN, NULL, "allreduce_bench"};
  static char addrs[MAX_RANKS][ADDR_LEN];
  const char *addr_ptrs[MAX_RANKS];
  gs_comm_t *comms[MAX_RANKS] = {0};
  pid_t pids[MAX_RANKS];
  int status, failed = 0;
  opts_t o;

  if (parse_opts(argc, argv, &o)) {
    usage(stderr);
    return 2;
  }
  for (uint32_t r = 0; r < o.ranks; r++) {
    comms[r] = gs_comm_new("host", &log);
    if (!comms[r] ||
        gs_comm_listen(comms[r], &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, addrs[r], ADDR_LEN)) {
      fprintf(stderr, "allreduce_bench: cannot set up rank %u's listener\n", r);
      return 1;
    }
    addr_ptrs[r] = addrs[r];
  }
  if (!o.csv)
    printf("# gradsync host allreduce, %u ranks, float32 %s\n"
           "# %10s %12s %10s %10s  %s\n",
           o.ranks, gs_reduce_op_name(o.op), "bytes", "time_us", "algbw_GB/s", "busbw_GB/s",
           "correct");
  fflush(stdout);
  for (uint32_t r = 0; r < o.ranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("allreduce_bench: fork");
      for (uint32_t k = 0; k < r; k++)
        kill(pids[k], SIGTERM);
      return 1;
    }
    if (pids[r] == 0) {
      for (uint32_t k = 0; k < o.ranks; k++)
        if (k != r)
          gs_comm_destroy(comms[k]);
      status = rank_main(comms[r], addr_ptrs, &o, r);
      gs_comm_destroy(comms[r]);
      _exit(status);
    }
  }
  for (uint32_t r = 0; r < o.ranks; r++)
    gs_comm_destroy(comms[r]);
  for (uint32_t r = 0; r < o.ranks; r++) {
    if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed = 1;
  }
  return failed;
}
