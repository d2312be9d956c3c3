/* nccl_busbw: our nccl backend's allreduce (gs_comm "nccl":
 * gs_comm_allreduce, then gs_comm_sync) against NCCL's own ncclAllReduce on
 * the same ranks, the same GPU buffer and in the same run, measured as
 * nccl-tests measures (CONVENTIONS.md "nccl-tests"): for each size and each
 * side, one checked allreduce, a few warm-up ones, then timed ones; one line
 * per size with each side's time, algbw (bytes / time), busbw (algbw ×
 * 2(n−1)/n) and whether its sum was right, and the ratio of the busbws.
 *
 * The ranks are processes on GPU 0 of this machine, each posing as a host of
 * its own (a distinct NCCL_HOSTID; NCCL refuses two ranks of a communicator
 * on one GPU of one host), talking through NCCL's socket transport over
 * loopback, as tests/gpu/test_nccl_ranks.c does: what it measures is that
 * transport (and our overhead on top of NCCL), not NVLink.
 *
 * This process makes both rendezvous ids (NCCL's bootstrap roots run in it
 * until every rank has joined) and starts the ranks as this program again,
 * `nccl_busbw --rank RANK OURS_ID NCCL_ID PROGRESS_FD PROG OPTIONS...` (ids
 * in hex; exec'd, so no CUDA state crosses a fork), then watches them: a
 * rank that dies, or no size finished within --timeout, kills them all. */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <inttypes.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm.h"
#include "cuda_check.h"
#include "device.h"
#include "flags.h"
#include "hex.h"
#include "parse.h"
#include "clock.h"

#define MAX_RANKS 8
#define ID_CAP 512
#define CHILD_ARGS 7 /* self --rank RANK OURS_ID NCCL_ID PROGRESS_FD PROG */
#define EXIT_SKIP 77 /* ctest's SKIP_RETURN_CODE: no GPU here */
#define EXIT_WRONG 3 /* a rank that finished, but saw a wrong sum */
/* Collectives queued between two syncs, on both sides alike (our comm
 * refuses more than its max_queued). */
#define QUEUE 1024
/* The check's input at element i is ((i % PERIOD) - 125) * (rank + 1), so
 * every sum is a small integer, exact in float32. It moves through a host
 * buffer of CHUNK floats, a multiple of PERIOD, so one buffer serves every
 * offset. */
#define PERIOD 251
#define CHUNK ((size_t)PERIOD * 16384) /* 15.7 MiB of floats */
#define MIN_ITERS 5
#define MAX_ITERS 1000000
#define POLL_MS 50

extern char **environ;

typedef struct opts {
  uint32_t ranks;
  uint64_t min_bytes, max_bytes;
  uint32_t factor;
  double target_s;     /* timed seconds per size and side */
  uint64_t timeout_ms; /* no size finished for this long fails */
  bool csv;
} opts_t;

/* The defaults, for the parent and the ranks alike: 4 KiB to 1 GiB, 0.2 s a
 * size and side. At 2-5 GB/s over loopback (estimated, not yet measured) a
 * sweep of both sides should take 20-50 s a world, most of it the 1 GiB
 * size, whose 5 timed allreduces outlast 0.2 s. */
static const opts_t default_opts = {
    .min_bytes = 4096, .max_bytes = 1ull << 30, .factor = 4, .target_s = 0.2, .timeout_ms = 120000};

#define OPT(member) GS_FLAG_AT(opts_t, member)
/* clang-format off */
static const gs_flag_t flag_rows[] = {
  {.name = "--ranks", .kind = GS_FLAG_INT, OPT(ranks), .min = 2, .max = MAX_RANKS,
   .required = true, .metavar = "N", .help = "processes, every one on GPU 0"},
  {.name = "--min-bytes", .kind = GS_FLAG_SIZE, OPT(min_bytes), .umin = 4, .umax = 1ull << 34,
   .metavar = "SIZE", .help = "the smallest message (float32)"},
  {.name = "--max-bytes", .kind = GS_FLAG_SIZE, OPT(max_bytes), .umin = 4, .umax = 1ull << 34,
   .metavar = "SIZE", .help = "the largest message; every rank allocates this much on the GPU"},
  {.name = "--factor", .kind = GS_FLAG_INT, OPT(factor), .min = 2, .max = 1024, .metavar = "K",
   .help = "each size is the previous one times K"},
  {.name = "--target-s", .kind = GS_FLAG_DOUBLE, OPT(target_s), .dmin = 0.001, .dmax = 3600,
   .metavar = "SECS",
   .help = "timed seconds per size and side (at least 5 allreduces each)"},
  {.name = "--timeout", .kind = GS_FLAG_DURATION, OPT(timeout_ms), .umin = 1000,
   .metavar = "DUR",
   .help = "no size finished for this long (or one collective stalled for this long) kills "
           "the ranks and fails"},
  {.name = "--csv", .kind = GS_FLAG_BOOL, OPT(csv),
   .help = "CSV lines on stdout, the description on stderr"},
};
/* clang-format on */

static const gs_flags_t flags_spec = {
    .prog = "nccl_busbw",
    .usage = "usage: nccl_busbw --ranks N [options]\n"
             "\n"
             "Float32 sum allreduce of every size from --min-bytes to --max-bytes between N\n"
             "processes on GPU 0: gradsync's nccl backend against NCCL's own ncclAllReduce,\n"
             "in turn, on the same ranks. Time, algbw and busbw as nccl-tests defines them.\n"
             "Each rank poses as a host of its own (NCCL_HOSTID) and the ranks talk through\n"
             "NCCL's socket transport over loopback: the figures measure that transport,\n"
             "not NVLink. Exits 77 where no GPU is visible.\n"
             "\n",
    .flags = flag_rows,
    .count = sizeof(flag_rows) / sizeof(flag_rows[0]),
};

/* Parses argv into *o (which holds the defaults): 0 to run, -1 when it
 * answered --help, 2 on a usage error (printed). */
static int parse_opts(int argc, char **argv, opts_t *o)
{
  gs_flags_opts_t fo = {0};
  int rc = gs_flags_main(&flags_spec, o, argc, argv, &fo, GS_VERSION);

  if (rc == 0 && o->min_bytes > o->max_bytes) {
    fprintf(stderr, "nccl_busbw: --min-bytes is above --max-bytes\n");
    rc = 2;
  }
  return rc;
}

/* ------------------------------------------------------------------ */
/* A rank (a child process). */

typedef struct rank_ctx {
  opts_t o;
  uint32_t rank;
  gs_log_t log;
  gs_device_t *dev;
  gs_comm_t *comm;         /* ours */
  ncclComm_t raw;          /* NCCL's own, blocking, on its own id */
  cudaStream_t raw_stream; /* the raw side's */
  float *buf;              /* max_bytes on the GPU: both sides', in place */
  double *ctl;             /* the ranks' agreement (agree_max), on the GPU */
  float *pattern, *check;  /* host, CHUNK floats (or fewer): input and result */
  size_t chunk;
  int progress_fd; /* rank 0: a byte per finished size */
} rank_ctx_t;

/* A side of the comparison: queues one in-place sum of buf[0, n), and
 * waits for every queued one (a table, as nccl-tests keeps per collective). */
typedef struct side {
  const char *name;
  int (*start)(rank_ctx_t *r, size_t n);
  int (*finish)(rank_ctx_t *r);
} side_t;

static int ours_start(rank_ctx_t *r, size_t n)
{
  return gs_comm_allreduce(r->comm, r->buf, n, GS_DTYPE_FLOAT32, GS_REDUCE_SUM);
}

static int ours_finish(rank_ctx_t *r)
{
  return gs_comm_sync(r->comm);
}

static int raw_start(rank_ctx_t *r, size_t n)
{
  return GS_NCCL_STATUS(
      &r->log, ncclAllReduce(r->buf, r->buf, n, ncclFloat, ncclSum, r->raw, r->raw_stream));
}

/* Waits for the raw stream, then asks the communicator for an error NCCL
 * found on the way (a peer gone). */
static int raw_finish(rank_ctx_t *r)
{
  ncclResult_t async = ncclSuccess;

  GS_CUDA_CHECK(&r->log, cudaStreamSynchronize(r->raw_stream));
  GS_NCCL_CHECK(&r->log, ncclCommGetAsyncError(r->raw, &async));
  return GS_NCCL_STATUS(&r->log, async);
}

static const side_t sides[] = {
    {"gradsync", ours_start, ours_finish},
    {"nccl", raw_start, raw_finish},
};
#define NSIDES (sizeof(sides) / sizeof(sides[0]))

/* Every rank's vals[0, k) become their maximum over the ranks (NCCL's own
 * ncclMax on the raw communicator, outside anything timed). */
static int agree_max(rank_ctx_t *r, double *vals, size_t k)
{
  int err = gs_device_upload(r->dev, r->ctl, vals, k * sizeof(double));

  if (!err)
    err = gs_device_sync(r->dev);
  if (!err)
    err = GS_NCCL_STATUS(
        &r->log, ncclAllReduce(r->ctl, r->ctl, k, ncclDouble, ncclMax, r->raw, r->raw_stream));
  if (!err)
    err = raw_finish(r);
  if (!err)
    err = gs_device_download(r->dev, vals, r->ctl, k * sizeof(double));
  return err;
}

/* The sum over the ranks at element i of the check. */
static float expected(const rank_ctx_t *r, size_t i)
{
  int ranks = (int)r->o.ranks;

  return (float)(((int)(i % PERIOD) - 125) * ranks * (ranks + 1) / 2);
}

/* Uploads this rank's check input into buf[0, n) and waits for it, so that
 * either side's stream sees it. */
static int fill(rank_ctx_t *r, size_t n)
{
  int err = 0;

  for (size_t off = 0; off < n && !err; off += r->chunk) {
    size_t len = n - off < r->chunk ? n - off : r->chunk;

    err = gs_device_upload(r->dev, r->buf + off, r->pattern, len * sizeof(float));
  }
  return err ? err : gs_device_sync(r->dev);
}

/* Compares every element of buf[0, n) with the sum; *bad counts the wrong
 * ones, and the first is printed. */
static int verify(rank_ctx_t *r, const side_t *s, size_t n, uint64_t *bad)
{
  int err = 0;

  *bad = 0;
  for (size_t off = 0; off < n && !err; off += r->chunk) {
    size_t len = n - off < r->chunk ? n - off : r->chunk;

    err = gs_device_download(r->dev, r->check, r->buf + off, len * sizeof(float));
    for (size_t j = 0; j < len && !err; j++) {
      if (r->check[j] == expected(r, j))
        continue;
      if ((*bad)++ == 0)
        fprintf(stderr,
                "nccl_busbw: rank %" PRIu32 ": %s allreduce of %zu floats: element %zu is "
                "%g, expected %g\n",
                r->rank, s->name, n, off + j, (double)r->check[j], (double)expected(r, j));
    }
  }
  return err;
}

/* Queues `iters` allreduces of buf[0, n), waiting every QUEUE and at the
 * end; *sec gets the time per allreduce. */
static int run_iters(rank_ctx_t *r, const side_t *s, size_t n, uint64_t iters, double *sec)
{
  double t0 = gs_now_ms_f();
  int err = 0;

  for (uint64_t i = 0; i < iters && !err; i++) {
    err = s->start(r, n);
    if (!err && (i + 1) % QUEUE == 0)
      err = s->finish(r);
  }
  if (!err)
    err = s->finish(r);
  *sec = (gs_now_ms_f() - t0) / 1e3 / (double)iters;
  return err;
}

typedef struct result {
  double sec; /* per allreduce: the slowest rank's mean */
  bool ok;    /* every rank's every element right */
} result_t;

/* One side at one size: the checked allreduce, warm-ups, then timed ones.
 * The ranks agree on the slowest rank's warm-up pace, hence on how many
 * to time (unequal counts would hang NCCL), then on the verdict and the
 * slowest rank's time. */
static int run_side(rank_ctx_t *r, const side_t *s, size_t n, result_t *res)
{
  size_t bytes = n * sizeof(float);
  uint64_t bad = 0, warm = bytes <= (1u << 20) ? 20 : bytes <= (64u << 20) ? 5 : 1;
  double vals[2], per = 0, iters;
  int err = fill(r, n);

  if (!err)
    err = s->start(r, n);
  if (!err)
    err = s->finish(r);
  if (!err)
    err = verify(r, s, n, &bad);
  if (!err) /* timed runs: no growth towards inf */
    err = gs_device_zero(r->dev, r->buf, bytes);
  if (!err) /* queued on the compute stream, which the raw side does not follow */
    err = gs_device_sync(r->dev);
  if (!err)
    err = run_iters(r, s, n, warm, &per);
  vals[0] = bad ? 1 : 0;
  vals[1] = per;
  if (!err)
    err = agree_max(r, vals, 2);
  if (err)
    return err;
  res->ok = vals[0] == 0;
  iters = r->o.target_s / vals[1];
  iters = iters < MIN_ITERS ? MIN_ITERS : iters > MAX_ITERS ? MAX_ITERS : iters;
  err = run_iters(r, s, n, (uint64_t)iters, &res->sec);
  if (!err)
    err = agree_max(r, &res->sec, 1);
  return err;
}

/* A side's figures: time in us, algbw and busbw in GB/s (nccl-tests). */
static void figures(const rank_ctx_t *r, size_t bytes, const result_t *res, double out[3])
{
  double algbw = res->sec > 0 ? (double)bytes / res->sec / 1e9 : 0;

  out[0] = res->sec * 1e6;
  out[1] = algbw;
  out[2] = algbw * 2.0 * (r->o.ranks - 1) / r->o.ranks;
}

static void print_line(const rank_ctx_t *r, size_t n, const result_t res[NSIDES])
{
  size_t bytes = n * sizeof(float);
  double f[NSIDES][3];

  for (size_t s = 0; s < NSIDES; s++)
    figures(r, bytes, &res[s], f[s]);
  if (r->o.csv)
    printf("%" PRIu32 ",%zu,%zu,%.2f,%.3f,%.3f,%s,%.2f,%.3f,%.3f,%s,%.3f\n", r->o.ranks, bytes, n,
           f[0][0], f[0][1], f[0][2], res[0].ok ? "yes" : "no", f[1][0], f[1][1], f[1][2],
           res[1].ok ? "yes" : "no", f[1][2] > 0 ? f[0][2] / f[1][2] : 0);
  else
    printf("%12zu %11zu  %10.2f %7.3f %7.3f %3s  %10.2f %7.3f %7.3f %3s  %6.3f\n", bytes, n,
           f[0][0], f[0][1], f[0][2], res[0].ok ? "yes" : "no", f[1][0], f[1][1], f[1][2],
           res[1].ok ? "yes" : "no", f[1][2] > 0 ? f[0][2] / f[1][2] : 0);
  fflush(stdout);
}

/* Rank 0's description of the run: on stdout, or on stderr under --csv
 * (whose stdout is the CSV header and lines). */
static int print_header(rank_ctx_t *r)
{
  FILE *out = r->o.csv ? stderr : stdout;
  struct cudaDeviceProp prop;
  int version = 0;

  GS_CUDA_CHECK(&r->log, cudaGetDeviceProperties(&prop, r->dev->ordinal));
  GS_NCCL_CHECK(&r->log, ncclGetVersion(&version));
  fprintf(out,
          "# nccl_busbw: float32 sum allreduce in place, world %" PRIu32
          ", NCCL %d.%d.%d, every rank on GPU %d: %s\n"
          "# one GPU shared by every rank: each rank is a process posing as a host of its own\n"
          "# (NCCL_HOSTID) and the ranks talk through NCCL's socket transport over loopback\n"
          "# (NCCL_NET=Socket, lo), so these figures measure that transport, not NVLink.\n"
          "# gradsync: gs_comm \"nccl\" (gs_comm_allreduce, gs_comm_sync); nccl: ncclAllReduce on\n"
          "# a communicator and stream of its own (cudaStreamSynchronize); both in turn on the\n"
          "# same buffer, a sync every %d. time: per allreduce, the slowest rank's mean over\n"
          "# >= %.2f s; algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests); ok: every\n"
          "# element right on every rank; ratio: busbw gradsync / busbw nccl.\n",
          r->o.ranks, version / 10000, version / 100 % 100, version % 100, r->dev->ordinal,
          prop.name, QUEUE, r->o.target_s);
  if (r->o.csv)
    printf("world,bytes,count,gradsync_time_us,gradsync_algbw_gbps,gradsync_busbw_gbps,gradsync_ok,"
           "nccl_time_us,nccl_algbw_gbps,nccl_busbw_gbps,nccl_ok,busbw_ratio\n");
  else
    printf("# %24s%s  %s\n"
           "# %10s %11s  %10s %7s %7s %3s  %10s %7s %7s %3s  %6s\n"
           "# %10s %11s  %10s %7s %7s %3s  %10s %7s %7s\n",
           "", "---------- gradsync ----------", "------------ nccl ------------", "size", "count",
           "time", "algbw", "busbw", "ok", "time", "algbw", "busbw", "ok", "ratio", "(B)",
           "(floats)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
  fflush(stdout);
  fflush(out);
  return 0;
}

/* Tells the parent that rank 0 made progress (the --timeout watch). */
static void report_progress(const rank_ctx_t *r)
{
  ssize_t k;

  if (r->progress_fd < 0)
    return;
  k = write(r->progress_fd, "+", 1);
  (void)k; /* a failure means the parent is gone, and we with it (PR_SET_PDEATHSIG) */
}

/* Every size, both sides each; rank 0 prints. *wrong counts the sizes whose
 * check failed on either side. */
static int run_sizes(rank_ctx_t *r, uint64_t *wrong)
{
  result_t res[NSIDES];
  int err = 0;

  *wrong = 0;
  for (uint64_t bytes = r->o.min_bytes; bytes <= r->o.max_bytes && !err; bytes *= r->o.factor) {
    size_t n = (size_t)(bytes / sizeof(float));

    for (size_t s = 0; s < NSIDES && !err; s++)
      err = run_side(r, &sides[s], n, &res[s]);
    if (err)
      break;
    *wrong += !res[0].ok || !res[1].ok;
    if (r->rank == 0) {
      print_line(r, n, res);
      report_progress(r);
    }
  }
  return err;
}

/* Opens GPU 0, both communicators, the raw side's stream and the buffers. */
static int rank_setup(rank_ctx_t *r, const unsigned char *ours_id, size_t ours_len,
                      const ncclUniqueId *raw_id)
{
  char why[256] = "";
  gs_comm_setup_t setup = {.rank = r->rank,
                           .world_size = r->o.ranks,
                           .generation = 1,
                           .timeout_ms = r->o.timeout_ms,
                           .id = ours_id,
                           .id_len = ours_len,
                           .max_queued = QUEUE};
  int err;

  r->dev = gs_device_open("cuda", 0, &r->log, why, sizeof(why));
  if (!r->dev) {
    fprintf(stderr, "nccl_busbw: rank %" PRIu32 ": cuda:0: %s\n", r->rank, why);
    return GS_EUNAVAIL;
  }
  setup.device = r->dev;
  r->comm = gs_comm_new("nccl", &r->log);
  err = r->comm ? gs_comm_init(r->comm, &setup) : GS_ENOMEM;
  if (err)
    return err;
  GS_CUDA_CHECK(&r->log, cudaStreamCreateWithFlags(&r->raw_stream, cudaStreamNonBlocking));
  err = GS_NCCL_STATUS(&r->log, ncclCommInitRank(&r->raw, (int)r->o.ranks, *raw_id, (int)r->rank));
  if (err) {
    r->raw = NULL; /* NCCL frees it when the call itself fails */
    return err;
  }
  r->chunk = r->o.max_bytes / sizeof(float) < CHUNK ? r->o.max_bytes / sizeof(float) : CHUNK;
  r->buf = gs_device_alloc(r->dev, r->o.max_bytes);
  r->ctl = gs_device_alloc(r->dev, 2 * sizeof(double));
  r->pattern = malloc(r->chunk * sizeof(float));
  r->check = malloc(r->chunk * sizeof(float));
  if (!r->buf || !r->ctl || !r->pattern || !r->check) {
    fprintf(stderr, "nccl_busbw: rank %" PRIu32 ": out of memory (GPU or host)\n", r->rank);
    return GS_ENOMEM;
  }
  for (size_t j = 0; j < r->chunk; j++)
    r->pattern[j] = (float)(((int)(j % PERIOD) - 125) * (int)(r->rank + 1));
  return 0;
}

/* Frees what rank_setup made. After a failure the communicators are
 * aborted, not finalized: a peer may be gone. */
static void rank_teardown(rank_ctx_t *r, bool failed)
{
  if (r->raw) {
    if (failed || GS_NCCL_STATUS(&r->log, ncclCommFinalize(r->raw)))
      GS_NCCL_STATUS(&r->log, ncclCommAbort(r->raw));
    else
      GS_NCCL_STATUS(&r->log, ncclCommDestroy(r->raw));
  }
  if (r->comm && failed)
    gs_comm_abort(r->comm);
  gs_comm_destroy(r->comm);
  if (r->raw_stream)
    GS_CUDA_STATUS(&r->log, cudaStreamDestroy(r->raw_stream));
  if (r->buf)
    gs_device_free(r->dev, r->buf);
  if (r->ctl)
    gs_device_free(r->dev, r->ctl);
  gs_device_destroy(r->dev);
  free(r->pattern);
  free(r->check);
}

/* The child's main: argv as CHILD_ARGS says, then the parent's options.
 * Takes its own NCCL_HOSTID before any CUDA or NCCL call. Exits 0,
 * EXIT_WRONG when a sum was wrong, 1 on an error (logged with file:line). */
static int rank_main(int argc, char **argv)
{
  rank_ctx_t r = {.progress_fd = -1};
  unsigned char ours_id[ID_CAP];
  ncclUniqueId raw_id;
  size_t ours_len = 0, raw_len = 0;
  char host_id[64];
  uint64_t wrong = 0;
  long rank;
  int err;

  /* Dies with the parent, which may itself be killed past a timeout. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  r.log = (gs_log_t){.level = GS_LOG_WARN, .out = stderr, .component = "nccl_busbw"};
  r.o = default_opts;
  if (gs_parse_long(argv[2], 0, MAX_RANKS - 1, &rank) ||
      !gs_hex_decode(argv[3], ours_id, sizeof(ours_id), &ours_len) ||
      !gs_hex_decode(argv[4], &raw_id, sizeof(raw_id), &raw_len) || raw_len != sizeof(raw_id) ||
      parse_opts(argc - 6, argv + 6, &r.o) || rank >= r.o.ranks) {
    fprintf(stderr, "nccl_busbw: a rank's arguments are malformed\n");
    return 1;
  }
  r.rank = (uint32_t)rank;
  if (r.rank == 0)
    r.progress_fd = atoi(argv[5]);
  else
    close(atoi(argv[5]));
  snprintf(host_id, sizeof(host_id), "gradsync-rank-%" PRIu32, r.rank);
  setenv("NCCL_HOSTID", host_id, 1);
  err = rank_setup(&r, ours_id, ours_len, &raw_id);
  if (!err && r.rank == 0)
    err = print_header(&r);
  if (!err) {
    report_progress(&r);
    err = run_sizes(&r, &wrong);
  }
  if (err)
    fprintf(stderr, "nccl_busbw: rank %" PRIu32 ": %s%s%s\n", r.rank, gs_strerror(err),
            r.comm && *gs_comm_why(r.comm) ? ": " : "", r.comm ? gs_comm_why(r.comm) : "");
  if (!err && wrong && r.rank == 0)
    printf("# FAILED: a wrong sum at %" PRIu64 " sizes (the ok columns; stderr names elements)\n",
           wrong);
  fflush(stdout);
  rank_teardown(&r, err != 0);
  return err ? 1 : wrong ? EXIT_WRONG : 0;
}

/* ------------------------------------------------------------------ */
/* The parent: ids, ranks, and the watch over them. */

/* Prints why and returns EXIT_SKIP when no GPU can run the ranks, else 0.
 * The device count initializes CUDA here, which is why the ranks are
 * exec'd, never merely forked. */
static int gpu_skip(void)
{
  char why[256] = "";

  if (gs_device_cuda_usable(why, sizeof(why)))
    return 0;
  printf("SKIP: %s\n", why);
  return EXIT_SKIP;
}

typedef struct world {
  pid_t pid[MAX_RANKS];
  bool done[MAX_RANKS];
  uint32_t n;
  int progress; /* read end of rank 0's progress pipe; -1 once closed */
} world_t;

/* Both rendezvous ids, in hex: ours (gs_comm_make_id) and NCCL's own. */
static int make_ids(char *ours_hex, char *raw_hex)
{
  gs_log_t log = {GS_LOG_WARN, NULL, "nccl_busbw"};
  gs_comm_t *maker = gs_comm_new("nccl", &log);
  unsigned char id[ID_CAP];
  ncclUniqueId raw;
  size_t len = 0;
  int err = maker ? gs_comm_make_id(maker, id, sizeof(id), &len) : GS_ENOMEM;

  gs_comm_destroy(maker);
  if (!err)
    err = GS_NCCL_STATUS(&log, ncclGetUniqueId(&raw));
  if (err)
    return err;
  gs_hex_encode(id, len, ours_hex);
  gs_hex_encode(&raw, sizeof(raw), raw_hex);
  return 0;
}

/* Kills and reaps every rank not reaped yet. */
static void world_kill(world_t *w)
{
  for (uint32_t r = 0; r < w->n; r++)
    if (!w->done[r]) {
      kill(w->pid[r], SIGKILL);
      waitpid(w->pid[r], NULL, 0);
      w->done[r] = true;
    }
}

/* Starts o->ranks ranks of this program with the parent's options. */
static int world_start(world_t *w, const opts_t *o, int argc, char **argv)
{
  char ours_hex[2 * ID_CAP + 1], raw_hex[2 * sizeof(ncclUniqueId) + 1], rank[16], fd[16];
  char self[4096], **args = calloc((size_t)argc + CHILD_ARGS, sizeof(char *));
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  int fds[2], err = args && len > 0 ? make_ids(ours_hex, raw_hex) : GS_EINVAL;

  memset(w, 0, sizeof(*w));
  w->progress = -1;
  if (err || pipe(fds)) {
    fprintf(stderr, "nccl_busbw: cannot prepare the ranks (%s)\n",
            err ? gs_strerror(err) : "pipe failed");
    free(args);
    return 1;
  }
  self[len] = '\0';
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  snprintf(fd, sizeof(fd), "%d", fds[1]);
  args[0] = self;
  args[1] = "--rank";
  args[2] = rank;
  args[3] = ours_hex;
  args[4] = raw_hex;
  args[5] = fd;
  for (int i = 0; i < argc; i++) /* PROG, then the options */
    args[6 + i] = argv[i];
  for (uint32_t r = 0; r < o->ranks && !err; r++) {
    snprintf(rank, sizeof(rank), "%" PRIu32, r);
    err = posix_spawn(&w->pid[r], self, NULL, NULL, args, environ);
    if (err)
      fprintf(stderr, "nccl_busbw: cannot start rank %" PRIu32 ": %s\n", r, strerror(err));
    else
      w->n++;
  }
  close(fds[1]);
  w->progress = fds[0];
  free(args);
  return err ? 1 : 0;
}

/* Reads rank 0's progress bytes; true when there were some. */
static bool progressed(world_t *w)
{
  struct pollfd p = {.fd = w->progress, .events = POLLIN};
  char buf[64];
  ssize_t k;

  if (poll(&p, 1, POLL_MS) <= 0 || !(p.revents & (POLLIN | POLLHUP)))
    return false;
  k = read(w->progress, buf, sizeof(buf));
  if (k == 0) { /* every rank closed it: poll nothing more, only sleep */
    close(w->progress);
    w->progress = -1;
  }
  return k > 0;
}

/* Watches the ranks: 0 when every one finished well, 1 when one finished
 * with a wrong sum, died, or no size finished within the timeout (the
 * others are killed then). */
static int world_watch(world_t *w, const opts_t *o)
{
  uint64_t deadline = gs_now_ms() + o->timeout_ms;
  uint32_t left = w->n;
  bool wrong = false;
  int status;

  while (left > 0) {
    if (progressed(w))
      deadline = gs_now_ms() + o->timeout_ms;
    for (uint32_t r = 0; r < w->n; r++) {
      if (w->done[r] || waitpid(w->pid[r], &status, WNOHANG) != w->pid[r])
        continue;
      w->done[r] = true;
      left--;
      wrong |= WIFEXITED(status) && WEXITSTATUS(status) == EXIT_WRONG;
      if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == EXIT_WRONG))
        continue;
      if (WIFSIGNALED(status))
        fprintf(stderr, "nccl_busbw: rank %" PRIu32 " was killed by signal %d (%s)", r,
                WTERMSIG(status), strsignal(WTERMSIG(status)));
      else
        fprintf(stderr, "nccl_busbw: rank %" PRIu32 " exited with status %d (its error is above)",
                r, WEXITSTATUS(status));
      fprintf(stderr, "; killing the other ranks\n");
      world_kill(w);
      return 1;
    }
    if (left > 0 && gs_now_ms() >= deadline) {
      fprintf(stderr,
              "nccl_busbw: no size finished within %" PRIu64 " ms (--timeout): killing the "
              "%" PRIu32 " ranks\n",
              o->timeout_ms, left);
      world_kill(w);
      return 1;
    }
  }
  if (wrong)
    fprintf(stderr, "nccl_busbw: wrong sums (the ok columns say where)\n");
  return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
  opts_t o = default_opts;
  world_t w;
  int rc;

  /* Every process (the ranks inherit it): NCCL over loopback sockets only. */
  setenv("NCCL_NET", "Socket", 1);
  setenv("NCCL_IB_DISABLE", "1", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  if (argc >= CHILD_ARGS && !strcmp(argv[1], "--rank"))
    return rank_main(argc, argv);
  rc = parse_opts(argc, argv, &o);
  if (rc)
    return rc < 0 ? 0 : rc;
  rc = gpu_skip();
  if (rc)
    return rc;
  signal(SIGPIPE, SIG_IGN);
  rc = world_start(&w, &o, argc, argv);
  if (!rc)
    rc = world_watch(&w, &o);
  world_kill(&w);
  if (w.progress >= 0)
    close(w.progress);
  return rc;
}
