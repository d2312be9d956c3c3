/* Tests for agent/comm/comm.c and the host backend (comm_host.c,
 * host_*.c): W ranks run as W threads in one process, each with its own
 * host comm over 127.0.0.1, and their results are checked against
 * references computed here, serially. */
#include <arpa/inet.h>
#include <dirent.h>
#include <check.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "half.h"
#include "clock.h"
#include "why.h"
#include "runner.h"

/* Every link on TCP: set in each test's process by its suite's fixture
 * (comm_host_tcp_suite), read by every setup. */
static bool tcp_only;

#define MAX_W 5
#define BIG 3000017 /* floats; prime, so the ring segments differ in length */
/* The comm timeout where nothing is to time out: generous, since a loaded
 * machine can starve a rank's thread for seconds. */
#define WAIT_MS 60000
/* Where only an abort, a signal or a peer's close may end the wait: an
 * hour, so that a wait that did not end would fail the test (at its check
 * timeout) rather than pass slowly. How soon they end is bench/'s. */
#define NEVER_MS 3600000

typedef struct world world_t;

typedef struct rank_ctx {
  world_t *w;
  uint32_t rank;
  gs_comm_t *comm;
  gs_log_t log;
  int init_err;
  int err;       /* what the body's operation of interest returned */
  uint64_t took; /* ms the body's operation of interest took */
  int stage;     /* 1: calling init; 2: calling the operation of interest (atomic) */
  char why[512]; /* first mismatch found by the body, "" if none */
  float *result; /* body_agree's results, compared across ranks */
  pthread_t thread;
} rank_ctx_t;

typedef void (*body_fn)(rank_ctx_t *rc);

struct world {
  uint32_t size;
  uint64_t generation;
  uint64_t timeout_ms;
  uint64_t connect_timeout_ms; /* 0: timeout_ms */
  char addrs[MAX_W][64];
  const char *addr_ptrs[MAX_W];
  rank_ctx_t ranks[MAX_W];
  body_fn body;
  size_t stuck_len;              /* body_stuck's allreduce length; 0: 1009 */
  bool skip_init[MAX_W];         /* this rank never calls init (a silent peer) */
  uint64_t generation_of[MAX_W]; /* a stale rank's generation; 0: the world's */
};

static void sleep_ms(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

  nanosleep(&ts, NULL);
}

/* Records the first mismatch a rank's thread finds (threads must not call
 * ck_assert; the main thread reports it). */
static void mismatch(rank_ctx_t *rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(rank_ctx_t *rc, const char *fmt, ...)
{
  va_list ap;

  if (rc->why[0])
    return;
  va_start(ap, fmt);
  gs_set_whyv(rc->why, sizeof(rc->why), fmt, ap);
  va_end(ap);
}

/* Creates `size` host comms listening on 127.0.0.1. */
static void world_open(world_t *w, uint32_t size, uint64_t generation, uint64_t timeout_ms)
{
  memset(w, 0, sizeof(*w));
  w->size = size;
  w->generation = generation;
  w->timeout_ms = timeout_ms;
  for (uint32_t r = 0; r < size; r++) {
    rank_ctx_t *rc = &w->ranks[r];

    rc->w = w;
    rc->rank = r;
    rc->log = (gs_log_t){GS_LOG_WARN, NULL, "comm-test"};
    rc->comm = gs_comm_new("host", &rc->log);
    ck_assert_ptr_nonnull(rc->comm);
    ck_assert_int_eq(gs_comm_listen(rc->comm, &(gs_comm_endpoint_t){.bind = "127.0.0.1"},
                                    w->addrs[r], sizeof(w->addrs[r])),
                     0);
    ck_assert_msg(strncmp(w->addrs[r], "127.0.0.1:", 10) == 0, "addr %s", w->addrs[r]);
    w->addr_ptrs[r] = w->addrs[r];
  }
}

static void *rank_main(void *arg)
{
  rank_ctx_t *rc = arg;
  world_t *w = rc->w;
  uint64_t gen = w->generation_of[rc->rank] ? w->generation_of[rc->rank] : w->generation;
  gs_comm_setup_t setup = {.rank = rc->rank,
                           .world_size = w->size,
                           .generation = gen,
                           .peer_addrs = w->addr_ptrs,
                           .timeout_ms = w->timeout_ms,
                           .tcp_only = tcp_only,
                           .connect_timeout_ms = w->connect_timeout_ms};

  if (w->skip_init[rc->rank])
    return NULL;
  __atomic_store_n(&rc->stage, 1, __ATOMIC_SEQ_CST);
  rc->init_err = gs_comm_init(rc->comm, &setup);
  if (rc->init_err == 0 && w->body)
    w->body(rc);
  return NULL;
}

static void world_start(world_t *w, body_fn body)
{
  w->body = body;
  for (uint32_t r = 0; r < w->size; r++)
    ck_assert_int_eq(pthread_create(&w->ranks[r].thread, NULL, rank_main, &w->ranks[r]), 0);
}

/* Waits until ranks 0..n-1 reached `stage` (see rank_ctx_t). */
static void world_wait_stage(world_t *w, uint32_t n, int stage)
{
  for (uint32_t r = 0; r < n; r++)
    for (uint64_t deadline = gs_now_ms() + WAIT_MS;
         __atomic_load_n(&w->ranks[r].stage, __ATOMIC_SEQ_CST) < stage;) {
      ck_assert_msg(gs_now_ms() < deadline, "rank %u never reached stage %d", r, stage);
      sleep_ms(1);
    }
}

static void world_join(world_t *w)
{
  for (uint32_t r = 0; r < w->size; r++)
    pthread_join(w->ranks[r].thread, NULL);
}

/* Asserts every rank that ran found no mismatch (and, if `init_ok`, that
 * its init succeeded). */
static void world_check(world_t *w, bool init_ok)
{
  for (uint32_t r = 0; r < w->size; r++) {
    if (w->skip_init[r])
      continue;
    if (init_ok)
      ck_assert_msg(w->ranks[r].init_err == 0, "rank %u of %u: init: %s", r, w->size,
                    gs_strerror(w->ranks[r].init_err));
    ck_assert_msg(w->ranks[r].why[0] == '\0', "rank %u of %u: %s", r, w->size, w->ranks[r].why);
  }
}

static void world_close(world_t *w)
{
  for (uint32_t r = 0; r < w->size; r++)
    gs_comm_destroy(w->ranks[r].comm);
}

/* Runs `body` on every rank of a fresh world and checks the results. */
static void run_world(uint32_t size, body_fn body)
{
  world_t *w = malloc(sizeof(*w));

  ck_assert_ptr_nonnull(w);
  world_open(w, size, 42, WAIT_MS);
  world_start(w, body);
  world_join(w);
  world_check(w, true);
  world_close(w);
  free(w);
}

/* Small integers, so that float sums over a few ranks are exact. */
static float int_value(uint32_t rank, size_t i, unsigned iter)
{
  return (float)((int)((i * 31 + rank * 17 + iter * 7) % 19) - 9);
}

static bool close_enough(double got, double want, double rel)
{
  return fabs(got - want) <= rel * fmax(1.0, fabs(want));
}

/* Element i of the reduction of int_value over a world of w ranks. */
static double int_reduced(uint32_t w, size_t i, unsigned iter, gs_reduce_op_t op)
{
  double want = 0;

  for (uint32_t r = 0; r < w; r++)
    want += int_value(r, i, iter);
  return op == GS_REDUCE_MEAN ? want / w : want;
}

/* One float32 allreduce of n elements on this rank, checked element by
 * element against the serially computed sum (or mean). */
static void allreduce_f32_checked(rank_ctx_t *rc, size_t n, gs_reduce_op_t op, unsigned iter)
{
  uint32_t w = rc->w->size;
  float *buf = malloc(n ? n * sizeof(float) : 1);
  int err;

  if (!buf) {
    mismatch(rc, "out of memory");
    return;
  }
  for (size_t i = 0; i < n; i++)
    buf[i] = int_value(rc->rank, i, iter);
  err = gs_comm_allreduce(rc->comm, buf, n, GS_DTYPE_FLOAT32, op);
  if (err)
    mismatch(rc, "allreduce of %zu (%s, iter %u): %s", n, gs_reduce_op_name(op), iter,
             gs_strerror(err));
  for (size_t i = 0; i < n && !err; i++) {
    double want = int_reduced(w, i, iter, op);

    if (op == GS_REDUCE_SUM ? buf[i] != want : !close_enough(buf[i], want, 1e-6)) {
      mismatch(rc, "allreduce of %zu (%s, iter %u): [%zu] = %.9g, want %.9g", n,
               gs_reduce_op_name(op), iter, i, buf[i], want);
      break;
    }
  }
  free(buf);
}

static const size_t lengths[] = {0, 1, 7, 1009, BIG};

static void body_sizes(rank_ctx_t *rc)
{
  unsigned iter = 0;

  for (size_t k = 0; k < sizeof(lengths) / sizeof(lengths[0]); k++) {
    allreduce_f32_checked(rc, lengths[k], GS_REDUCE_SUM, iter++);
    allreduce_f32_checked(rc, lengths[k], GS_REDUCE_MEAN, iter++);
  }
}

/* World sizes 1..5 (the loop index) × every length × sum and mean. */
START_TEST(allreduce_float32)
{
  run_world((uint32_t)_i, body_sizes);
}
END_TEST

static double f64_value(uint32_t rank, size_t i)
{
  return sin((double)i * 0.37 + rank) * 1e3 + rank * 0.1;
}

/* float64, sum and mean, at lengths on both sides of the small-message
 * thresholds (32 KiB: 4096 doubles; 64 KiB: 8192) and a ring length. */
static void body_f64(rank_ctx_t *rc)
{
  static const size_t flens[] = {1009, 4096, 4097, 8192, 8193, 100003};
  double *buf = malloc(100003 * sizeof(double));

  if (!buf) {
    mismatch(rc, "out of memory");
    return;
  }
  for (size_t k = 0; k < sizeof(flens) / sizeof(flens[0]); k++) {
    size_t n = flens[k];

    for (int op = GS_REDUCE_SUM; op <= GS_REDUCE_MEAN; op++) {
      for (size_t i = 0; i < n; i++)
        buf[i] = f64_value(rc->rank, i);
      if (gs_comm_allreduce(rc->comm, buf, n, GS_DTYPE_FLOAT64, (gs_reduce_op_t)op)) {
        mismatch(rc, "float64 allreduce of %zu failed", n);
        goto out_free;
      }
      for (size_t i = 0; i < n; i++) {
        double want = 0;

        for (uint32_t r = 0; r < rc->w->size; r++)
          want += f64_value(r, i);
        if (op == GS_REDUCE_MEAN)
          want /= rc->w->size;
        if (!close_enough(buf[i], want, 1e-12)) {
          mismatch(rc, "float64 %s of %zu: [%zu] = %.17g, want %.17g", gs_reduce_op_name(op), n, i,
                   buf[i], want);
          goto out_free;
        }
      }
    }
  }
out_free:
  free(buf);
}

/* World sizes 2..5 (the loop index). */
START_TEST(allreduce_float64)
{
  run_world((uint32_t)_i, body_f64);
}
END_TEST

/* Values whose float sums depend on the order they are added in. */
static float messy_value(uint32_t rank, size_t i)
{
  return (float)(sin((double)i * 0.731 + rank * 1.37) * pow(10.0, (double)(i % 7) - 3));
}

/* bfloat16 and float16 (2-byte elements: the small-message thresholds
 * fall at 16384 and 32768 of them), sum and mean: small integers come out
 * exact (the mean as float32's sum times 1/w, rounded once); messy values
 * within one rounding per reduction step of the true sum. */
static void body_half(rank_ctx_t *rc)
{
  static const size_t hlens[] = {7, 1009, 16384, 16385, 32769, 100003};
  static const struct {
    gs_dtype_t dtype;
    float (*widen)(uint16_t);
    uint16_t (*narrow)(float);
    double eps; /* half an ulp, relative */
  } kinds[] = {{GS_DTYPE_BFLOAT16, gs_bf16_to_f32, gs_f32_to_bf16, 0x1p-8},
               {GS_DTYPE_FLOAT16, gs_f16_to_f32, gs_f32_to_f16, 0x1p-11}};
  uint32_t w = rc->w->size;
  uint16_t *buf = malloc(100003 * sizeof(uint16_t));

  for (size_t t = 0; buf && t < 2; t++)
    for (size_t k = 0; k < sizeof(hlens) / sizeof(hlens[0]); k++)
      for (int op = GS_REDUCE_SUM; op <= GS_REDUCE_MEAN + 1; op++) {
        bool messy = op > GS_REDUCE_MEAN;
        size_t n = hlens[k];

        for (size_t i = 0; i < n; i++)
          buf[i] = kinds[t].narrow(messy ? messy_value(rc->rank, i) : int_value(rc->rank, i, 3));
        if (gs_comm_allreduce(rc->comm, buf, n, kinds[t].dtype,
                              messy ? GS_REDUCE_SUM : (gs_reduce_op_t)op)) {
          mismatch(rc, "%s allreduce of %zu failed", gs_dtype_name(kinds[t].dtype), n);
          goto out;
        }
        for (size_t i = 0; i < n; i++) {
          double want = 0, mag = 0, got = kinds[t].widen(buf[i]);

          for (uint32_t r = 0; r < w; r++) {
            double v =
                kinds[t].widen(kinds[t].narrow(messy ? messy_value(r, i) : int_value(r, i, 3)));

            want += v;
            mag += fabs(v);
          }
          if (op == GS_REDUCE_MEAN)
            want = kinds[t].widen(kinds[t].narrow((float)want * (1.0f / (float)w)));
          if (messy ? fabs(got - want) > 2.0 * w * kinds[t].eps * mag + 1e-30 : got != want) {
            mismatch(rc, "%s %s of %zu: [%zu] = %.9g, want %.9g", gs_dtype_name(kinds[t].dtype),
                     messy ? "messy sum" : gs_reduce_op_name((gs_reduce_op_t)op), n, i, got, want);
            goto out;
          }
        }
      }
out:
  free(buf);
}

/* World sizes 2..5 (the loop index). */
START_TEST(allreduce_half)
{
  run_world((uint32_t)_i, body_half);
}
END_TEST

/* float32 lengths on both sides of the small-message thresholds (32 KiB
 * at two ranks, 64 KiB above), and ring lengths that leave the segments
 * uneven. */
/* The shards of `count` over the world's ranks cover it exactly once. */
static void check_shards_cover(rank_ctx_t *rc, size_t count)
{
  size_t covered = 0;
  uint32_t w = rc->w->size;

  for (uint32_t r = 0; r < w; r++) {
    gs_comm_shard_t s = gs_comm_shard(rc->comm, count, r);

    if (s.off > count || s.len > count - s.off)
      mismatch(rc, "shard of rank %u of %zu: [%zu, +%zu) outside it", r, count, s.off, s.len);
    covered += s.len;
    for (uint32_t q = 0; q < r; q++) {
      gs_comm_shard_t t = gs_comm_shard(rc->comm, count, q);

      if (s.len && t.len && s.off < t.off + t.len && t.off < s.off + s.len)
        mismatch(rc, "shards of ranks %u and %u of %zu overlap", q, r, count);
    }
  }
  if (covered != count)
    mismatch(rc, "the shards of %zu cover %zu", count, covered);
}

/* Whether buf[from, to) holds the reduction; names the first that does not. */
static bool reduced_range(rank_ctx_t *rc, const float *buf, size_t from, size_t to, size_t n,
                          gs_reduce_op_t op, unsigned iter, const char *what)
{
  for (size_t i = from; i < to; i++) {
    double want = int_reduced(rc->w->size, i, iter, op);

    if (op == GS_REDUCE_SUM ? buf[i] != want : !close_enough(buf[i], want, 1e-6)) {
      mismatch(rc, "%s of %zu (%s, iter %u): [%zu] = %.9g, want %.9g", what, n,
               gs_reduce_op_name(op), iter, i, buf[i], want);
      return false;
    }
  }
  return true;
}

/* Reduce-scatter, shard pass, allgather of n floats: this rank's shard
 * holds the sum (or mean) after the first, the previous rank's too after
 * the second, every element after the third. */
static void sharded_f32_checked(rank_ctx_t *rc, size_t n, gs_reduce_op_t op, unsigned iter)
{
  uint32_t w = rc->w->size;
  size_t room = gs_comm_shard_room(rc->comm, n);
  gs_comm_shard_t mine = gs_comm_shard(rc->comm, n, rc->rank);
  gs_comm_shard_t prev = gs_comm_shard(rc->comm, n, (rc->rank + w - 1) % w);
  float *buf = malloc(room ? room * sizeof(float) : 1);
  int err;

  if (!buf) {
    mismatch(rc, "out of memory");
    return;
  }
  check_shards_cover(rc, n);
  for (size_t i = 0; i < n; i++)
    buf[i] = int_value(rc->rank, i, iter);
  err = gs_comm_reduce_scatter(rc->comm, buf, n, GS_DTYPE_FLOAT32, op);
  if (!err && reduced_range(rc, buf, mine.off, mine.off + mine.len, n, op, iter, "reduce-scatter"))
    err = gs_comm_shard_pass(rc->comm, buf, n, GS_DTYPE_FLOAT32);
  if (!err && reduced_range(rc, buf, mine.off, mine.off + mine.len, n, op, iter, "shard pass") &&
      reduced_range(rc, buf, prev.off, prev.off + prev.len, n, op, iter, "shard pass"))
    err = gs_comm_allgather(rc->comm, buf, n, GS_DTYPE_FLOAT32);
  if (!err)
    reduced_range(rc, buf, 0, n, n, op, iter, "allgather");
  if (err)
    mismatch(rc, "sharded reduction of %zu (%s, iter %u): %s", n, gs_reduce_op_name(op), iter,
             gs_strerror(err));
  free(buf);
}

static const size_t slens[] = {0, 1, 2, 3, 7, 1009, BIG};

static void body_sharded(rank_ctx_t *rc)
{
  unsigned iter = 0;

  for (size_t k = 0; k < sizeof(slens) / sizeof(slens[0]); k++) {
    sharded_f32_checked(rc, slens[k], GS_REDUCE_SUM, iter++);
    sharded_f32_checked(rc, slens[k], GS_REDUCE_MEAN, iter++);
  }
}

/* World sizes 1..5 × lengths that leave shards uneven or empty. */
START_TEST(reduce_scatter_allgather)
{
  run_world((uint32_t)_i, body_sharded);
}
END_TEST

static const size_t plens[] = {4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385, 65537};

static void body_paths(rank_ctx_t *rc)
{
  unsigned iter = 100;

  for (size_t k = 0; k < sizeof(plens) / sizeof(plens[0]); k++) {
    allreduce_f32_checked(rc, plens[k], GS_REDUCE_SUM, iter++);
    allreduce_f32_checked(rc, plens[k], GS_REDUCE_MEAN, iter++);
  }
}

/* World sizes 2..5 (the loop index) around the algorithm switch. */
START_TEST(allreduce_paths)
{
  run_world((uint32_t)_i, body_paths);
}
END_TEST

/* Every rank allreduces the same messy values at both algorithms and keeps
 * the results; the main thread checks they are equal bit for bit across
 * ranks (replicas must not drift apart) and close to the true sum. */
static void body_agree(rank_ctx_t *rc)
{
  static const size_t alens[] = {1000, 100003};
  size_t total = alens[0] + alens[1], at = 0;

  rc->result = malloc(total * sizeof(float));
  if (!rc->result) {
    mismatch(rc, "out of memory");
    return;
  }
  for (size_t k = 0; k < 2; k++) {
    float *buf = rc->result + at;

    for (size_t i = 0; i < alens[k]; i++)
      buf[i] = messy_value(rc->rank, i);
    if (gs_comm_allreduce(rc->comm, buf, alens[k], GS_DTYPE_FLOAT32, GS_REDUCE_SUM)) {
      mismatch(rc, "allreduce of %zu failed", alens[k]);
      return;
    }
    for (size_t i = 0; i < alens[k]; i++) {
      double want = 0, mag = 0;

      for (uint32_t r = 0; r < rc->w->size; r++) {
        want += messy_value(r, i);
        mag += fabs(messy_value(r, i));
      }
      /* float rounding: a few ulps of the largest partial sums */
      if (fabs(buf[i] - want) > 1e-6 * mag + 1e-30) {
        mismatch(rc, "allreduce of %zu: [%zu] = %.9g, want %.9g", alens[k], i, buf[i], want);
        return;
      }
    }
    at += alens[k];
  }
}

START_TEST(ranks_agree_bitwise)
{
  world_t *w = malloc(sizeof(*w));
  size_t total = 1000 + 100003;

  ck_assert_ptr_nonnull(w);
  world_open(w, (uint32_t)_i, 42, WAIT_MS);
  world_start(w, body_agree);
  world_join(w);
  world_check(w, true);
  for (uint32_t r = 1; r < w->size; r++)
    ck_assert_msg(memcmp(w->ranks[0].result, w->ranks[r].result, total * sizeof(float)) == 0,
                  "ranks 0 and %u of %u hold different sums", r, w->size);
  for (uint32_t r = 0; r < w->size; r++)
    free(w->ranks[r].result);
  world_close(w);
  free(w);
}
END_TEST

static uint8_t pattern(uint32_t root, size_t len, size_t i)
{
  return (uint8_t)(i * 7 + root * 3 + len);
}

/* One broadcast from root of len bytes, checked on this rank. */
static void broadcast_checked(rank_ctx_t *rc, size_t len, uint32_t root)
{
  uint8_t *buf = malloc(len ? len : 1);
  int err;

  if (!buf) {
    mismatch(rc, "out of memory");
    return;
  }
  for (size_t i = 0; i < len; i++)
    buf[i] = rc->rank == root ? pattern(root, len, i) : 0xee;
  err = gs_comm_broadcast(rc->comm, buf, len, root);
  if (err)
    mismatch(rc, "broadcast of %zu from %u: %s", len, root, gs_strerror(err));
  for (size_t i = 0; i < len && !err; i++) {
    if (buf[i] != pattern(root, len, i)) {
      mismatch(rc, "broadcast of %zu from %u: [%zu] = %u, want %u", len, root, i, buf[i],
               pattern(root, len, i));
      break;
    }
  }
  free(buf);
}

static void body_broadcast(rank_ctx_t *rc)
{
  static const size_t blens[] = {0, 1, 13, 1000003};

  for (uint32_t root = 0; root < rc->w->size; root++)
    for (size_t k = 0; k < sizeof(blens) / sizeof(blens[0]); k++)
      broadcast_checked(rc, blens[k], root);
}

/* World sizes 1..5 (the loop index), every root, odd lengths and 0. */
START_TEST(broadcast_every_root)
{
  run_world((uint32_t)_i, body_broadcast);
}
END_TEST

/* Back-to-back operations of different lengths and kinds: a stream that
 * mixed two operations' bytes would shift the data and fail the checks. */
static void body_mixed(rank_ctx_t *rc)
{
  static const size_t mlens[] = {5, 100003, 0, 1, 77777, 4, 262147};

  for (unsigned k = 0; k < 30; k++) {
    size_t n = mlens[k % (sizeof(mlens) / sizeof(mlens[0]))];

    if (k % 3 == 2)
      broadcast_checked(rc, n * 3 + 1, k % rc->w->size);
    else
      allreduce_f32_checked(rc, n, k % 2 ? GS_REDUCE_MEAN : GS_REDUCE_SUM, k);
  }
}

START_TEST(back_to_back)
{
  run_world(4, body_mixed);
  run_world(2, body_mixed);
}
END_TEST

/* The operation of interest for the failure tests: one allreduce, timed. */
static void timed_allreduce(rank_ctx_t *rc, size_t n)
{
  float *buf = calloc(n, sizeof(float));
  uint64_t t0 = gs_now_ms();

  __atomic_store_n(&rc->stage, 2, __ATOMIC_SEQ_CST);
  rc->err = buf ? gs_comm_allreduce(rc->comm, buf, n, GS_DTYPE_FLOAT32, GS_REDUCE_SUM) : GS_ENOMEM;
  rc->took = gs_now_ms() - t0;
  free(buf);
}

/* The failure tests' allreduce lengths (loop index): one that takes the
 * small-message path, one that takes the pipelined ring. */
static const size_t stuck_lens[] = {1009, BIG};

/* Ranks 0 and 1 start an allreduce that rank 2 never joins. */
static void body_stuck(rank_ctx_t *rc)
{
  float x = 1;

  if (rc->rank == 2)
    return;
  timed_allreduce(rc, rc->w->stuck_len ? rc->w->stuck_len : 1009);
  /* A broken comm fails every later operation at once. */
  if (gs_comm_allreduce(rc->comm, &x, 1, GS_DTYPE_FLOAT32, GS_REDUCE_SUM) != rc->err)
    mismatch(rc, "the operation after a failed one did not fail the same way");
}

/* Aborting ranks 1 and 0 from the main thread once both are in the
 * allreduce: neither waits for its timeout (an hour). Rank 1, aborted
 * first, returns GS_EABORTED. Rank 0 does too, unless rank 1's closed
 * links reached it first: in the pipelined ring it also sends to rank 1,
 * and then its allreduce fails with GS_ECLOSED before its own abort
 * (seen once under ASan on a loaded machine). Either way its next
 * operation fails the same way (body_stuck). */
START_TEST(abort_unblocks)
{
  world_t *w = malloc(sizeof(*w));

  world_open(w, 3, 1, NEVER_MS);
  w->stuck_len = stuck_lens[_i];
  world_start(w, body_stuck);
  world_wait_stage(w, 2, 2);
  gs_comm_abort(w->ranks[1].comm);
  gs_comm_abort(w->ranks[0].comm);
  gs_comm_abort(w->ranks[0].comm); /* idempotent */
  world_join(w);
  world_check(w, true);
  ck_assert_msg(w->ranks[1].err == GS_EABORTED, "rank 1: %s", gs_err_name(w->ranks[1].err));
  ck_assert_msg(w->ranks[0].err == GS_EABORTED || w->ranks[0].err == GS_ECLOSED, "rank 0: %s",
                gs_err_name(w->ranks[0].err));
  world_close(w);
  free(w);
}
END_TEST

/* Aborting a rank that waits in init for a peer that never comes (for an
 * hour, its timeout). */
START_TEST(abort_during_init)
{
  world_t *w = malloc(sizeof(*w));

  world_open(w, 2, 1, NEVER_MS);
  w->skip_init[1] = true;
  world_start(w, NULL);
  world_wait_stage(w, 1, 1);
  gs_comm_abort(w->ranks[0].comm);
  world_join(w);
  ck_assert_int_eq(w->ranks[0].init_err, GS_EABORTED);
  world_close(w);
  free(w);
}
END_TEST

/* Same as abort_unblocks, no abort, a 300 ms timeout: rank 0 (which waits
 * on rank 2) times out; rank 1 times out too, or sees rank 0 give up. A
 * rank that timed out did not before its timeout (how soon after is no
 * test's business); one that saw the other give up may have started late.
 * The ring itself may take its time to form (a loaded machine). */
START_TEST(timeout_in_op)
{
  world_t *w = malloc(sizeof(*w));

  world_open(w, 3, 1, 300);
  w->connect_timeout_ms = WAIT_MS;
  w->stuck_len = stuck_lens[_i];
  world_start(w, body_stuck);
  world_join(w);
  world_check(w, true);
  ck_assert_msg(w->ranks[0].err == GS_ETIMEDOUT, "rank 0: %s", gs_err_name(w->ranks[0].err));
  ck_assert_msg(w->ranks[1].err == GS_ETIMEDOUT || w->ranks[1].err == GS_ECLOSED, "rank 1: %s",
                gs_err_name(w->ranks[1].err));
  for (uint32_t r = 0; r < 2; r++)
    if (w->ranks[r].err == GS_ETIMEDOUT)
      ck_assert_msg(w->ranks[r].took >= 250, "rank %u took %llu ms", r,
                    (unsigned long long)w->ranks[r].took);
  world_close(w);
  free(w);
}
END_TEST

START_TEST(timeout_in_init)
{
  world_t *w = malloc(sizeof(*w));
  uint64_t t0 = gs_now_ms(), took;

  world_open(w, 2, 1, 300);
  w->skip_init[1] = true;
  world_start(w, NULL);
  world_join(w);
  took = gs_now_ms() - t0;
  ck_assert_int_eq(w->ranks[0].init_err, GS_ETIMEDOUT);
  ck_assert_msg(took >= 250, "took %llu ms", (unsigned long long)took);
  world_close(w);
  free(w);
}
END_TEST

/* Rank 2 takes part in one allreduce and then destroys its comm while the
 * others start a large one. */
static void body_death(rank_ctx_t *rc)
{
  float x[7] = {0};

  if (gs_comm_allreduce(rc->comm, x, 7, GS_DTYPE_FLOAT32, GS_REDUCE_SUM))
    mismatch(rc, "the first allreduce failed");
  if (rc->rank == 2) {
    sleep_ms(50);
    gs_comm_destroy(rc->comm);
    rc->comm = NULL;
    return;
  }
  timed_allreduce(rc, BIG);
  if (gs_comm_allreduce(rc->comm, x, 7, GS_DTYPE_FLOAT32, GS_REDUCE_SUM) != rc->err)
    mismatch(rc, "the operation after a failed one did not fail the same way");
}

/* Reads everything a log file got. */
static void read_log(FILE *f, char *out, size_t len)
{
  size_t n;

  rewind(f);
  n = fread(out, 1, len - 1, f);
  out[n] = '\0';
}

START_TEST(peer_death)
{
  world_t *w = malloc(sizeof(*w));
  char text[2][4096];

  world_open(w, 3, 1, NEVER_MS); /* only rank 2's close can end the wait */
  for (uint32_t r = 0; r < 2; r++)
    ck_assert_ptr_nonnull(w->ranks[r].log.out = tmpfile());
  world_start(w, body_death);
  world_join(w);
  world_check(w, true);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_msg(w->ranks[r].err == GS_ECLOSED, "rank %u: %s", r, gs_err_name(w->ranks[r].err));
    read_log(w->ranks[r].log.out, text[r], sizeof(text[r]));
  }
  /* Whoever noticed first names rank 2 and its address. */
  ck_assert_msg(strstr(text[0], w->addrs[2]) || strstr(text[1], w->addrs[2]),
                "no log line names rank 2 (%s):\n%s\n%s", w->addrs[2], text[0], text[1]);
  world_close(w);
  for (uint32_t r = 0; r < 2; r++)
    fclose(w->ranks[r].log.out);
  free(w);
}
END_TEST

/* The handshake as the backend sends it: big-endian magic "GSHC", version
 * 1, flags, rank, world size, generation. */
static void encode_hello(uint8_t *out, uint32_t rank, uint32_t world, uint64_t generation)
{
  uint32_t v[6] = {0x47534843u,         1u << 16, rank, world, (uint32_t)(generation >> 32),
                   (uint32_t)generation};

  for (int i = 0; i < 6; i++) {
    uint32_t be = htonl(v[i]);
    memcpy(out + 4 * i, &be, 4);
  }
}

static int connect_to(const char *addr)
{
  struct sockaddr_in sa = {.sin_family = AF_INET};
  const char *colon = strrchr(addr, ':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);

  ck_assert_int_ge(fd, 0);
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  return fd;
}

/* Reads until EOF (at most 5 s); returns the byte count. */
static size_t read_to_eof(int fd, uint8_t *buf, size_t len)
{
  struct pollfd p = {fd, POLLIN, 0};
  size_t got = 0;
  ssize_t n;

  for (;;) {
    ck_assert_msg(poll(&p, 1, 5000) == 1, "the backend kept a refused connection open");
    n = read(fd, buf + got, len - got);
    if (n <= 0)
      return got;
    got += (size_t)n;
    ck_assert_uint_lt(got, len);
  }
}

static void body_small_sum(rank_ctx_t *rc)
{
  allreduce_f32_checked(rc, 7, GS_REDUCE_SUM, 3);
}

/* Strangers dialing rank 1 (wrong generation, wrong rank, garbage) are
 * answered with a refusal and closed; the real ring still forms. */
START_TEST(handshake_refuses_strangers)
{
  world_t *w = malloc(sizeof(*w));
  uint8_t hello[3][24], reply[64];
  int fd[3];

  world_open(w, 2, 7, WAIT_MS);
  encode_hello(hello[0], 0, 2, 6); /* a stale rank 0 */
  encode_hello(hello[1], 1, 2, 7); /* claims to be rank 1 */
  memset(hello[2], 'x', sizeof(hello[2]));
  for (int k = 0; k < 3; k++) {
    fd[k] = connect_to(w->addrs[1]);
    ck_assert_int_eq(write(fd[k], hello[k], 24), 24);
  }
  world_start(w, body_small_sum);
  for (int k = 0; k < 3; k++) {
    size_t n = read_to_eof(fd[k], reply, sizeof(reply));

    /* The refusal: rank 1's hello (generation 7) with the accepted flag clear. */
    ck_assert_uint_eq(n, 24);
    ck_assert_int_eq(reply[7], 0);
    ck_assert_int_eq(reply[11], 1);
    ck_assert_int_eq(reply[23], 7);
    close(fd[k]);
  }
  world_join(w);
  world_check(w, true);
  world_close(w);
  free(w);
}
END_TEST

/* A rank of another generation: each side refuses the other. The first to
 * see the refusal fails with GS_EPROTO and closes its listening socket, so
 * the other may instead be left without an answer until its timeout. */
START_TEST(handshake_stale_rank)
{
  world_t *w = malloc(sizeof(*w));
  int e0, e1;

  world_open(w, 2, 7, 5000);
  w->generation_of[1] = 8;
  world_start(w, NULL);
  world_join(w);
  e0 = w->ranks[0].init_err;
  e1 = w->ranks[1].init_err;
  ck_assert_msg(e0 == GS_EPROTO || e0 == GS_ETIMEDOUT, "rank 0: %s", gs_err_name(e0));
  ck_assert_msg(e1 == GS_EPROTO || e1 == GS_ETIMEDOUT, "rank 1: %s", gs_err_name(e1));
  ck_assert_msg(e0 == GS_EPROTO || e1 == GS_EPROTO, "neither rank saw the refusal");
  world_close(w);
  free(w);
}
END_TEST

START_TEST(unknown_backend)
{
  gs_log_t log = {GS_LOG_ERROR, NULL, "comm-test"};
  gs_comm_t *c;
  gs_reduce_op_t op;

  ck_assert_ptr_null(gs_comm_new("carrier-pigeon", &log));
  ck_assert_ptr_null(gs_comm_new(NULL, &log));
  c = gs_comm_new("host", &log);
  ck_assert_ptr_nonnull(c);
  ck_assert_str_eq(gs_comm_name(c), "host");
  gs_comm_destroy(c);
  gs_comm_destroy(NULL);
  ck_assert_int_eq(gs_reduce_op_parse("sum", &op), 0);
  ck_assert_int_eq(op, GS_REDUCE_SUM);
  ck_assert_int_eq(gs_reduce_op_parse("mean", &op), 0);
  ck_assert_int_eq(op, GS_REDUCE_MEAN);
  ck_assert_int_eq(gs_reduce_op_parse("max", &op), GS_EINVAL);
  ck_assert_str_eq(gs_reduce_op_name(GS_REDUCE_SUM), "sum");
  ck_assert_str_eq(gs_reduce_op_name(GS_REDUCE_MEAN), "mean");
  ck_assert_str_eq(gs_reduce_op_name((gs_reduce_op_t)9), "unknown");
}
END_TEST

/* Bad arguments fail with GS_EINVAL and leave the comm usable. */
static void body_bad_args(rank_ctx_t *rc)
{
  uint16_t h[4] = {0};
  char b[3] = {0};

  if (gs_comm_allreduce(rc->comm, h, 4, (gs_dtype_t)9, GS_REDUCE_SUM) != GS_EINVAL)
    mismatch(rc, "an allreduce of an unknown dtype did not fail with GS_EINVAL");
  if (gs_comm_allreduce(rc->comm, NULL, 4, GS_DTYPE_FLOAT32, GS_REDUCE_SUM) != GS_EINVAL)
    mismatch(rc, "allreduce of NULL did not fail with GS_EINVAL");
  if (gs_comm_broadcast(rc->comm, b, 3, rc->w->size) != GS_EINVAL)
    mismatch(rc, "broadcast from a root past the world did not fail with GS_EINVAL");
  allreduce_f32_checked(rc, 1009, GS_REDUCE_MEAN, 1);
}

START_TEST(bad_arguments)
{
  gs_log_t log = {GS_LOG_ERROR, NULL, "comm-test"};
  const char *addrs[2] = {"127.0.0.1:1", "127.0.0.1:2"};
  gs_comm_setup_t setup = {
      .rank = 0, .world_size = 2, .generation = 1, .peer_addrs = addrs, .timeout_ms = 1000};
  gs_comm_t *c = gs__comm_host_new(&log);
  char addr[64], tiny[8];
  float x = 1;

  ck_assert_int_eq(gs_comm_allreduce(c, &x, 1, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), GS_EINVAL);
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL); /* no listen yet */
  ck_assert_int_eq(
      gs_comm_listen(c, &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, tiny, sizeof(tiny)), GS_ERANGE);
  ck_assert_int_eq(
      gs_comm_listen(c, &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, addr, sizeof(addr)), 0);
  ck_assert_int_eq(
      gs_comm_listen(c, &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, addr, sizeof(addr)), GS_EINVAL);
  setup.rank = 2;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  setup.rank = 0;
  setup.timeout_ms = 0;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  gs_comm_destroy(c);
  run_world(2, body_bad_args);
  run_world(1, body_bad_args);
}
END_TEST

/* A free TCP port on 127.0.0.1 (bound, then released). */
static uint16_t free_port(void)
{
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  int fd = socket(AF_INET, SOCK_STREAM, 0);

  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

/* Listens as `ep` says; returns the comm (destroy it) with the address in addr. */
static gs_comm_t *listen_as(const gs_comm_endpoint_t *ep, int want, char *addr, size_t len)
{
  static gs_log_t log = {GS_LOG_ERROR, NULL, "comm-test"};
  gs_comm_t *c = gs_comm_new("host", &log);
  int err = gs_comm_listen(c, ep, addr, len);

  ck_assert_msg(err == want, "listen on %s: got %s, want %s (%s)", ep->bind, gs_err_name(err),
                gs_err_name(want), gs_comm_why(c));
  return c;
}

/* Bind and advertised addresses, port ranges, and their errors. */
START_TEST(endpoints)
{
  char addr[128], want[128];
  uint16_t p = free_port();
  gs_comm_t *a, *b;
  unsigned port;

  /* A range skips ports in use. */
  a = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1", .port_min = p, .port_max = p}, 0, addr,
                sizeof(addr));
  snprintf(want, sizeof(want), "127.0.0.1:%u", p);
  ck_assert_str_eq(addr, want);
  b = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1", .port_min = p, .port_max = p + 3}, 0,
                addr, sizeof(addr));
  ck_assert_int_eq(sscanf(addr, "127.0.0.1:%u", &port), 1);
  ck_assert(port > p && port <= p + 3u);
  gs_comm_destroy(b);
  b = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1", .port_min = p, .port_max = p},
                GS_EUNAVAIL, addr, sizeof(addr));
  snprintf(want, sizeof(want), "cannot listen on 127.0.0.1, port %u: ", p);
  ck_assert_msg(strstr(gs_comm_why(b), want), "%s", gs_comm_why(b));
  gs_comm_destroy(b);
  gs_comm_destroy(a);
  /* The advertised address, with the bound port or its own. */
  a = listen_as(&(gs_comm_endpoint_t){.bind = "0.0.0.0", .advertise = "192.0.2.7"}, 0, addr,
                sizeof(addr));
  ck_assert_int_eq(sscanf(addr, "192.0.2.7:%u", &port), 1);
  gs_comm_destroy(a);
  a = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1", .advertise = "192.0.2.7:31000"}, 0, addr,
                sizeof(addr));
  ck_assert_str_eq(addr, "192.0.2.7:31000");
  gs_comm_destroy(a);
  a = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1", .advertise = "2001:db8::5"}, 0, addr,
                sizeof(addr));
  ck_assert_int_eq(sscanf(addr, "[2001:db8::5]:%u", &port), 1);
  gs_comm_destroy(a);
  /* Every interface, but nothing to tell the peers; an address not ours. */
  a = listen_as(&(gs_comm_endpoint_t){.bind = "0.0.0.0"}, GS_EINVAL, addr, sizeof(addr));
  ck_assert_msg(strstr(gs_comm_why(a), "--comm-advertise"), "%s", gs_comm_why(a));
  gs_comm_destroy(a);
  a = listen_as(&(gs_comm_endpoint_t){.bind = "192.0.2.1"}, GS_EUNAVAIL, addr, sizeof(addr));
  ck_assert_msg(strstr(gs_comm_why(a), "no interface of this host has that address"), "%s",
                gs_comm_why(a));
  gs_comm_destroy(a);
}
END_TEST

/* Rank 0 of a world of two whose addresses are addrs. */
static gs_comm_setup_t rank0_of_two(const char **addrs)
{
  return (gs_comm_setup_t){
      .rank = 0, .world_size = 2, .generation = 1, .peer_addrs = addrs, .timeout_ms = NEVER_MS};
}

/* A peer that cannot be reached fails within the connect timeout, with a
 * message naming both ranks, the address and the likely cause. */
START_TEST(unreachable_peer_fails_within_connect_timeout)
{
  char self[64], peer[64], want[160];
  const char *addrs[2] = {self, peer};
  gs_comm_t *c = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1"}, 0, self, sizeof(self));
  gs_comm_setup_t setup = rank0_of_two(addrs);
  uint64_t t0;

  snprintf(peer, sizeof(peer), "127.0.0.1:%u", free_port()); /* nothing listens there */
  setup.connect_timeout_ms = 300;
  t0 = gs_now_ms();
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_ETIMEDOUT);
  ck_assert_uint_ge(gs_now_ms() - t0, 290); /* its own (0.3 s), not the hour of rank0_of_two */
  snprintf(want, sizeof(want),
           "rank 0 could not connect to rank 1 at %s within 0.3 s: connection refused", peer);
  ck_assert_msg(strstr(gs_comm_why(c), want), "%s", gs_comm_why(c));
  gs_comm_destroy(c);
}
END_TEST

static volatile sig_atomic_t term_flag;

static void *raise_term_later(void *arg)
{
  struct timespec ts = {0, 200 * 1000 * 1000};

  (void)arg;
  nanosleep(&ts, NULL);
  term_flag = SIGTERM;
  return NULL;
}

/* The owner's signal ends a rendezvous whose peer is missing, not the
 * connect timeout (an hour). */
START_TEST(signal_ends_connecting)
{
  char self[64], peer[64];
  const char *addrs[2] = {self, peer};
  gs_comm_t *c = listen_as(&(gs_comm_endpoint_t){.bind = "127.0.0.1"}, 0, self, sizeof(self));
  gs_comm_setup_t setup = rank0_of_two(addrs);
  pthread_t t;

  snprintf(peer, sizeof(peer), "127.0.0.1:%u", free_port());
  setup.interrupt = &term_flag;
  term_flag = 0;
  ck_assert_int_eq(pthread_create(&t, NULL, raise_term_later, NULL), 0);
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINTR);
  ck_assert_msg(strstr(gs_comm_why(c), "rank 0: interrupted by SIGTERM while connecting to rank 1"),
                "%s", gs_comm_why(c));
  pthread_join(t, NULL);
  gs_comm_destroy(c);
}
END_TEST

/* Over IPv6 loopback, where the machine has it. */
START_TEST(ipv6_loopback)
{
  gs_log_t log = {GS_LOG_ERROR, NULL, "comm-test"};
  gs_comm_t *c[2];
  char addr[2][64];
  const char *addrs[2] = {addr[0], addr[1]};
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  world_t *w;

  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
    if (fd >= 0)
      close(fd);
    return; /* no IPv6 here */
  }
  close(fd);
  for (int r = 0; r < 2; r++) {
    c[r] = gs_comm_new("host", &log);
    ck_assert_int_eq(
        gs_comm_listen(c[r], &(gs_comm_endpoint_t){.bind = "::1"}, addr[r], sizeof(addr[r])), 0);
    ck_assert_msg(strncmp(addr[r], "[::1]:", 6) == 0, "addr %s", addr[r]);
  }
  /* Run it through a world whose comms are these two. */
  w = malloc(sizeof(*w));
  memset(w, 0, sizeof(*w));
  w->size = 2;
  w->generation = 3;
  w->timeout_ms = WAIT_MS;
  for (int r = 0; r < 2; r++) {
    w->ranks[r] = (rank_ctx_t){.w = w, .rank = (uint32_t)r, .comm = c[r]};
    w->addr_ptrs[r] = addrs[r];
  }
  world_start(w, body_small_sum);
  world_join(w);
  world_check(w, true);
  world_close(w);
  free(w);
}
END_TEST

/* Ranks in one process can map each other's pipes, so every link goes
 * through shared memory, unless the setup's tcp_only keeps it on TCP (the
 * whole suite runs both ways, see main). The log names the transport. */
START_TEST(transport_as_configured)
{
  const char *want = tcp_only ? ") over TCP, from rank 2 over TCP"
                              : ") over shared memory, from rank 2 over shared memory";
  world_t *w = malloc(sizeof(*w));
  char text[4096];

  world_open(w, 3, 1, WAIT_MS);
  w->ranks[0].log.level = GS_LOG_DEBUG;
  ck_assert_ptr_nonnull(w->ranks[0].log.out = tmpfile());
  world_start(w, body_small_sum);
  world_join(w);
  world_check(w, true);
  read_log(w->ranks[0].log.out, text, sizeof(text));
  ck_assert_msg(strstr(text, want), "wanted '%s' in:\n%s", want, text);
  world_close(w);
  fclose(w->ranks[0].log.out);
  free(w);
}
END_TEST

/* Internal to comm_shm.c (comm_shm.h is private to agent/comm). */
#define SHM_OFFER_LEN 64
typedef struct gs_shm_pipe gs_shm_pipe_t;
gs_shm_pipe_t *gs__shm_create(uint8_t offer[SHM_OFFER_LEN]);
gs_shm_pipe_t *gs__shm_open(const uint8_t offer[SHM_OFFER_LEN]);
void gs__shm_close(gs_shm_pipe_t *p);
size_t gs__shm_write(gs_shm_pipe_t *p, const void *src, size_t len, bool *wake);
size_t gs__shm_read(gs_shm_pipe_t *p, void *dst, size_t len, bool *wake);

/* How many entries of /dev/shm mention process `pid` (as the segments
 * named /gradsync-PID-... did). */
static int shm_entries_of(pid_t pid)
{
  char tag[64];
  struct dirent *de;
  int n = 0;
  DIR *d = opendir("/dev/shm");

  snprintf(tag, sizeof(tag), "-%ld-", (long)pid);
  while (d && (de = readdir(d)))
    n += strstr(de->d_name, tag) != NULL;
  if (d)
    closedir(d);
  return n;
}

/* The writer of a pipe, in a process of its own: creates it, hands the
 * offer to the test over `out`, writes "hello" into it, then waits to be
 * killed (it never closes anything). */
static pid_t fork_writer(int out)
{
  pid_t pid = fork();

  if (pid == 0) {
    uint8_t offer[SHM_OFFER_LEN];
    gs_shm_pipe_t *p = gs__shm_create(offer);
    bool wake;

    if (!p)
      _exit(3);
    if (write(out, offer, sizeof(offer)) != (ssize_t)sizeof(offer) ||
        gs__shm_write(p, "hello", 5, &wake) != 5)
      _exit(4);
    for (;;)
      pause();
  }
  return pid;
}

/* The reader, a sibling of the writer (not its parent: two unrelated
 * processes of one user): maps the offer, reads "hello" and says 'y' (or
 * 'n' when the offer cannot be mapped) on `out`, then waits to be killed. */
static pid_t fork_reader(const uint8_t *offer, int out)
{
  pid_t pid = fork();

  if (pid == 0) {
    gs_shm_pipe_t *p = gs__shm_open(offer);
    char buf[8] = "", c = 'n';
    bool wake;

    for (uint64_t t0 = gs_now_ms(); p && gs_now_ms() - t0 < WAIT_MS;)
      if (gs__shm_read(p, buf, 5, &wake) == 5) {
        c = memcmp(buf, "hello", 5) == 0 ? 'y' : 'x';
        break;
      }
    if (write(out, &c, 1) != 1)
      _exit(4);
    for (;;)
      pause();
  }
  return pid;
}

static void kill_and_reap(pid_t pid)
{
  int status;

  kill(pid, SIGKILL);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status), "process %ld exited %d before it was killed", (long)pid,
                WEXITSTATUS(status));
}

/* kill -9 at the worst points of a pipe's life leaks nothing: the writer
 * killed right after creating the segment and sending its offer (before
 * any reader came, or with the reader's mapping live), the reader killed
 * with it. A segment in /dev/shm would outlive them (3 of 6 targeted
 * kills leaked before segments became memfds); none may appear there at
 * all, even while the pipe is in use. */
START_TEST(shm_kill_leaks_nothing)
{
  int to_test[2];

  ck_assert_int_eq(pipe(to_test), 0);
  for (int i = 0; i < 12; i++) {
    uint8_t offer[SHM_OFFER_LEN];
    pid_t w = fork_writer(to_test[1]), r = -1;
    char c = 0;

    ck_assert_int_ge(w, 0);
    ck_assert_int_eq(read(to_test[0], offer, sizeof(offer)), (ssize_t)sizeof(offer));
    ck_assert_msg(offer[0] == '/', "no offer");
    ck_assert_int_eq(shm_entries_of(w), 0);
    if (i % 3 != 0) { /* a reader maps it; every third round the writer dies alone */
      r = fork_reader(offer, to_test[1]);
      ck_assert_int_ge(r, 0);
      ck_assert_int_eq(read(to_test[0], &c, 1), 1);
      ck_assert_msg(c == 'y', "round %d: the reader could not use the pipe (%c)", i, c);
      ck_assert_int_eq(shm_entries_of(w), 0);
    }
    if (i % 2)
      usleep((useconds_t)(i * 100)); /* a varied moment */
    kill_and_reap(w);
    if (r > 0)
      kill_and_reap(r);
    ck_assert_msg(shm_entries_of(w) == 0, "round %d: a segment of process %ld outlived it", i,
                  (long)w);
    /* Its offer is dead with it: nobody can map the pipe any more. */
    ck_assert_ptr_null(gs__shm_open(offer));
  }
  close(to_test[0]);
  close(to_test[1]);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test, double timeout)
{
  TCase *tc = tcase_create(name);

  tcase_set_timeout(tc, timeout);
  tcase_add_test(tc, test);
  return tc;
}

static void add_tcase(Suite *s, void (*links)(void), TCase *tc)
{
  tcase_add_checked_fixture(tc, links, NULL);
  suite_add_tcase(s, tc);
}

static void links_shm(void)
{
  tcp_only = false;
}

static void links_tcp(void)
{
  tcp_only = true;
}

/* Every case, its links made as `links` says (a checked fixture: it runs in
 * each test's own process, before the test). */
static Suite *comm_host_suite(const char *name, void (*links)(void))
{
  Suite *s = suite_create(name);
  TCase *tc;

  tc = tcase_create("allreduce_float32");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, allreduce_float32, 1, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("reduce_scatter_allgather");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, reduce_scatter_allgather, 1, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("allreduce_paths");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, allreduce_paths, 2, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("ranks_agree_bitwise");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, ranks_agree_bitwise, 2, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("allreduce_half");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, allreduce_half, 2, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("allreduce_float64");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, allreduce_float64, 2, MAX_W + 1);
  add_tcase(s, links, tc);
  tc = tcase_create("broadcast_every_root");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, broadcast_every_root, 1, MAX_W + 1);
  add_tcase(s, links, tc);
  add_tcase(s, links, tcase("back_to_back", back_to_back, 30));
  tc = tcase_create("abort_unblocks");
  tcase_set_timeout(tc, 10);
  tcase_add_loop_test(tc, abort_unblocks, 0, 2);
  add_tcase(s, links, tc);
  add_tcase(s, links, tcase("abort_during_init", abort_during_init, 10));
  tc = tcase_create("timeout_in_op");
  tcase_set_timeout(tc, 10);
  tcase_add_loop_test(tc, timeout_in_op, 0, 2);
  add_tcase(s, links, tc);
  add_tcase(s, links, tcase("timeout_in_init", timeout_in_init, 10));
  add_tcase(s, links, tcase("peer_death", peer_death, 20));
  add_tcase(s, links, tcase("handshake_refuses_strangers", handshake_refuses_strangers, 10));
  add_tcase(s, links, tcase("handshake_stale_rank", handshake_stale_rank, 10));
  add_tcase(s, links, tcase("unknown_backend", unknown_backend, 10));
  add_tcase(s, links, tcase("bad_arguments", bad_arguments, 10));
  add_tcase(s, links, tcase("endpoints", endpoints, 10));
  add_tcase(s, links, tcase("signal_ends_connecting", signal_ends_connecting, 10));
  add_tcase(s, links, tcase("unreachable_peer", unreachable_peer_fails_within_connect_timeout, 10));
  add_tcase(s, links, tcase("ipv6_loopback", ipv6_loopback, 10));
  add_tcase(s, links, tcase("transport_as_configured", transport_as_configured, 10));
  add_tcase(s, links, tcase("shm_kill_leaks_nothing", shm_kill_leaks_nothing, 30));
  return s;
}

/* The suite runs twice: links through shared memory (the default for ranks
 * on one host), then every link on TCP. */
static Suite *comm_host_shm_suite(void)
{
  return comm_host_suite("comm_host_shm", links_shm);
}

static Suite *comm_host_tcp_suite(void)
{
  return comm_host_suite("comm_host_tcp", links_tcp);
}

const gs_test_binary_t gs_test_binary = {.suites = {comm_host_shm_suite, comm_host_tcp_suite}};
