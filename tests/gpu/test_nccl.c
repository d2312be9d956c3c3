/* Tests for agent/comm/comm_nccl.c on GPU 0, world size 1: allreduce (sum and
 * mean) and broadcast (single and grouped) leave the data as it was, the
 * collectives are ordered against the device's compute stream both ways,
 * tickets count up, the queue bound, abort and bad setups fail cleanly. A
 * last suite starts a world of 2 whose second rank never comes: init must
 * time out (or be aborted) instead of hanging; it runs after the others
 * have reported, in case NCCL does hang there.
 *
 * Exits 77 (ctest's "skipped") without a visible GPU. The runner does not
 * fork: CUDA is initialized by main's device count and cannot be used again
 * in a forked child. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "device.h"
#include "gpu_check.h"
#include "clock.h"
#include "rng.h"

#define TIMEOUT_MS 30000
#define ID_CAP 512
#define BIG 1000003 /* elements; prime */

/* One device and one initialized world-1 comm on it. */
typedef struct fixture {
  gs_log_t log;
  gs_device_t *dev;
  gs_comm_t *comm;
  unsigned long long seed;
  uint64_t rng;
} fixture_t;

/* Uniform in [-1000, 1000). */
static double uniform(fixture_t *f)
{
  return -1000.0 + 2000.0 * ((double)(gs_splitmix64(&f->rng) >> 11) * 0x1p-53);
}

/* n random elements of dtype (float32 or float64); caller frees. */
static void *random_values(fixture_t *f, gs_dtype_t dtype, size_t n)
{
  size_t size = gs_dtype_size(dtype);
  void *a = malloc(n ? n * size : size);

  ck_assert_ptr_nonnull(a);
  for (size_t i = 0; i < n; i++) {
    if (dtype == GS_DTYPE_FLOAT32)
      ((float *)a)[i] = (float)uniform(f);
    else
      ((double *)a)[i] = uniform(f);
  }
  return a;
}

/* Makes a comm for `dev` with a fresh id, world size 1. */
static int comm_start(gs_comm_t *comm, gs_device_t *dev, uint32_t max_queued)
{
  unsigned char id[ID_CAP];
  size_t id_len = 0;
  gs_comm_setup_t setup;

  ck_assert_int_eq(gs_comm_make_id(comm, id, sizeof(id), &id_len), 0);
  ck_assert_msg(id_len > 0 && id_len <= sizeof(id), "id length %zu", id_len);
  setup = (gs_comm_setup_t){.rank = 0,
                            .world_size = 1,
                            .generation = 1,
                            .timeout_ms = TIMEOUT_MS,
                            .device = dev,
                            .id = id,
                            .id_len = id_len,
                            .max_queued = max_queued};
  return gs_comm_init(comm, &setup);
}

/* Opens cuda:0 and a comm on it, with a seed that differs on every run. */
static void fixture_open(fixture_t *f, uint32_t max_queued)
{
  struct timespec ts;
  char why[256] = "";

  clock_gettime(CLOCK_REALTIME, &ts);
  memset(f, 0, sizeof(*f));
  f->seed = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
  f->seed ^= (unsigned long long)getpid() << 40;
  f->rng = f->seed;
  f->log = (gs_log_t){.level = GS_LOG_WARN, .out = NULL, .component = "test_nccl"};
  f->dev = gs_device_open("cuda", 0, &f->log, why, sizeof(why));
  ck_assert_msg(f->dev, "cuda device: %s", why);
  f->comm = gs_comm_new("nccl", &f->log);
  ck_assert_ptr_nonnull(f->comm);
  ck_assert_int_eq(comm_start(f->comm, f->dev, max_queued), 0);
  ck_assert_uint_eq(gs_comm_ticket(f->comm), 0);
}

static void fixture_close(fixture_t *f)
{
  gs_comm_destroy(f->comm);
  ck_assert_int_eq(gs_device_sync(f->dev), 0);
  gs_device_destroy(f->dev);
}

/* Fails with the first element where got and want differ. */
static void assert_same(fixture_t *f, const void *got, const void *want, size_t n, gs_dtype_t dtype,
                        const char *what)
{
  size_t size = gs_dtype_size(dtype);

  if (memcmp(got, want, n * size) == 0)
    return;
  for (size_t i = 0; i < n; i++) {
    double g = dtype == GS_DTYPE_FLOAT32 ? ((const float *)got)[i] : ((const double *)got)[i];
    double w = dtype == GS_DTYPE_FLOAT32 ? ((const float *)want)[i] : ((const double *)want)[i];

    ck_assert_msg(memcmp((const char *)got + i * size, (const char *)want + i * size, size) == 0,
                  "%s: element %zu of %zu is %.17g, expected %.17g (seed %llu)", what, i, n, g, w,
                  f->seed);
  }
}

/* Upload, allreduce, order_after, download: with one rank the result is
 * the input, and the download (queued on the compute stream after
 * order_after) must see it. */
static void allreduce_round_trip(fixture_t *f, gs_dtype_t dtype, gs_reduce_op_t op, size_t n)
{
  size_t bytes = n * gs_dtype_size(dtype);
  void *in = random_values(f, dtype, n), *out = malloc(bytes ? bytes : 1);
  void *buf = gs_device_alloc(f->dev, bytes ? bytes : 8);
  uint64_t t = gs_comm_ticket(f->comm);
  char what[96];

  snprintf(what, sizeof(what), "allreduce %s of %zu %s", gs_reduce_op_name(op), n,
           gs_dtype_name(dtype));
  ck_assert_ptr_nonnull(out);
  ck_assert_ptr_nonnull(buf);
  ck_assert_int_eq(gs_device_upload(f->dev, buf, in, bytes), 0);
  ck_assert_msg(gs_comm_allreduce(f->comm, buf, n, dtype, op) == 0, "%s failed", what);
  ck_assert_uint_eq(gs_comm_ticket(f->comm), t + 1);
  ck_assert_int_eq(gs_comm_order_after(f->comm, t), 0);
  ck_assert_int_eq(gs_device_download(f->dev, out, buf, bytes), 0);
  assert_same(f, out, in, n, dtype, what);
  ck_assert_int_eq(gs_comm_sync(f->comm), 0);
  gs_device_free(f->dev, buf);
  free(in);
  free(out);
}

START_TEST(allreduce_values)
{
  static const size_t sizes[] = {0, 1, BIG};
  static const gs_dtype_t dtypes[] = {GS_DTYPE_FLOAT32, GS_DTYPE_FLOAT64};
  static const gs_reduce_op_t ops[] = {GS_REDUCE_SUM, GS_REDUCE_MEAN};
  fixture_t f;

  fixture_open(&f, 8);
  for (size_t d = 0; d < 2; d++)
    for (size_t o = 0; o < 2; o++)
      for (size_t s = 0; s < 3; s++)
        allreduce_round_trip(&f, dtypes[d], ops[o], sizes[s]);
  fixture_close(&f);
}
END_TEST

/* A collective starts only after what the compute stream held at the call:
 * behind a large asynchronous upload, a tiny allreduce cannot be done (and
 * gs_comm_sync cannot return) before the upload is. */
START_TEST(waits_for_compute_stream)
{
  const size_t big = (size_t)256 << 20;
  fixture_t f;
  void *host, *dbig, *one;
  cudaError_t q;

  fixture_open(&f, 8);
  host = gs_device_host_alloc(f.dev, big);
  dbig = gs_device_alloc(f.dev, big);
  one = gs_device_alloc(f.dev, sizeof(float));
  ck_assert_ptr_nonnull(host);
  ck_assert_ptr_nonnull(dbig);
  ck_assert_ptr_nonnull(one);
  for (int round = 0; round < 3; round++) {
    ck_assert_int_eq(gs_device_upload(f.dev, dbig, host, big), 0);
    ck_assert_int_eq(gs_comm_allreduce(f.comm, one, 1, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), 0);
    ck_assert_int_eq(gs_comm_sync(f.comm), 0);
    q = cudaStreamQuery((cudaStream_t)f.dev->stream);
    ck_assert_msg(q == cudaSuccess,
                  "round %d: the collective finished before the upload queued ahead of it (%s)",
                  round, cudaGetErrorName(q));
  }
  gs_device_free(f.dev, one);
  gs_device_free(f.dev, dbig);
  gs_device_host_free(f.dev, host);
  fixture_close(&f);
}
END_TEST

START_TEST(broadcast_bytes)
{
  static const size_t sizes[] = {0, 1, 12345, (size_t)4 << 20};
  fixture_t f;

  fixture_open(&f, 8);
  for (size_t s = 0; s < 4; s++) {
    size_t n = sizes[s];
    unsigned char *in = malloc(n ? n : 1), *out = malloc(n ? n : 1);
    void *buf = gs_device_alloc(f.dev, n ? n : 1);
    uint64_t t = gs_comm_ticket(f.comm);

    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    ck_assert_ptr_nonnull(buf);
    for (size_t i = 0; i < n; i++)
      in[i] = (unsigned char)gs_splitmix64(&f.rng);
    ck_assert_int_eq(gs_device_upload(f.dev, buf, in, n), 0);
    ck_assert_int_eq(gs_comm_broadcast(f.comm, buf, n, 0), 0);
    ck_assert_uint_eq(gs_comm_ticket(f.comm), t + 1);
    ck_assert_int_eq(gs_comm_order_after(f.comm, t), 0);
    ck_assert_int_eq(gs_device_download(f.dev, out, buf, n), 0);
    ck_assert_msg(n == 0 || memcmp(in, out, n) == 0, "broadcast of %zu bytes changed them", n);
    ck_assert_int_eq(gs_comm_sync(f.comm), 0);
    gs_device_free(f.dev, buf);
    free(in);
    free(out);
  }
  /* Root past the world; the comm stays usable. */
  ck_assert_int_eq(gs_comm_broadcast(f.comm, &f, 1, 1), GS_EINVAL);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  fixture_close(&f);
}
END_TEST

/* A grouped broadcast is one collective (one ticket, one done event) over
 * several buffers, some empty; with one rank it leaves them as they were.
 * Bad arguments are refused and leave the comm usable. */
START_TEST(broadcast_group_bytes)
{
  static const size_t sizes[] = {4099, 0, 1, (size_t)2 << 20};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  fixture_t f;
  gs_comm_span_t spans[N];
  unsigned char *in[N], *out = malloc(sizes[N - 1]);
  void *first;
  uint64_t t;

  fixture_open(&f, 4);
  ck_assert_ptr_nonnull(out);
  for (size_t s = 0; s < N; s++) {
    in[s] = malloc(sizes[s] + 1);
    spans[s] = (gs_comm_span_t){gs_device_alloc(f.dev, sizes[s] + 1), sizes[s]};
    ck_assert_ptr_nonnull(in[s]);
    ck_assert_ptr_nonnull(spans[s].buf);
    for (size_t i = 0; i < sizes[s]; i++)
      in[s][i] = (unsigned char)gs_splitmix64(&f.rng);
    ck_assert_int_eq(gs_device_upload(f.dev, spans[s].buf, in[s], sizes[s]), 0);
  }
  t = gs_comm_ticket(f.comm);
  ck_assert_int_eq(gs_comm_broadcast_group(f.comm, spans, N, 0), 0);
  ck_assert_uint_eq(gs_comm_ticket(f.comm), t + 1);
  ck_assert_int_eq(gs_comm_order_after(f.comm, t), 0);
  for (size_t s = 0; s < N; s++) {
    ck_assert_int_eq(gs_device_download(f.dev, out, spans[s].buf, sizes[s]), 0);
    ck_assert_msg(memcmp(in[s], out, sizes[s]) == 0, "grouped broadcast changed buffer %zu", s);
  }
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  ck_assert_int_eq(gs_comm_broadcast_group(f.comm, spans, 0, 0), 0);         /* empty group */
  ck_assert_int_eq(gs_comm_broadcast_group(f.comm, spans, N, 1), GS_EINVAL); /* root */
  first = spans[0].buf;
  spans[0].buf = NULL;
  ck_assert_int_eq(gs_comm_broadcast_group(f.comm, spans, N, 0), GS_EINVAL);
  ck_assert_int_eq(gs_comm_broadcast_group(f.comm, NULL, 1, 0), GS_EINVAL);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  spans[0].buf = first;
  for (size_t s = 0; s < N; s++) {
    if (spans[s].buf)
      gs_device_free(f.dev, spans[s].buf);
    free(in[s]);
  }
  free(out);
  fixture_close(&f);
}
END_TEST

/* Tickets number the collectives; several may be queued before a sync and
 * each ordered after separately. */
START_TEST(tickets_count_up)
{
  enum { N = 6, LEN = 4099 };
  fixture_t f;
  float *in[N], *out = malloc(LEN * sizeof(float));
  void *buf[N];

  fixture_open(&f, N);
  ck_assert_ptr_nonnull(out);
  ck_assert_str_eq(gs_comm_name(f.comm), "nccl");
  ck_assert(gs_comm_stream_ordered(f.comm));
  ck_assert(gs_comm_needs_id(f.comm));
  ck_assert_int_eq(gs_comm_order_after(f.comm, 0), GS_EINVAL); /* nothing queued yet */
  for (int i = 0; i < N; i++) {
    in[i] = random_values(&f, GS_DTYPE_FLOAT32, LEN);
    buf[i] = gs_device_alloc(f.dev, LEN * sizeof(float));
    ck_assert_ptr_nonnull(buf[i]);
    ck_assert_int_eq(gs_device_upload(f.dev, buf[i], in[i], LEN * sizeof(float)), 0);
    ck_assert_uint_eq(gs_comm_ticket(f.comm), (uint64_t)i);
    ck_assert_int_eq(gs_comm_allreduce(f.comm, buf[i], LEN, GS_DTYPE_FLOAT32,
                                       i % 2 ? GS_REDUCE_MEAN : GS_REDUCE_SUM),
                     0);
  }
  ck_assert_uint_eq(gs_comm_ticket(f.comm), N);
  ck_assert_int_eq(gs_comm_order_after(f.comm, N), GS_EINVAL);
  for (int i = N - 1; i >= 0; i--) {
    ck_assert_int_eq(gs_comm_order_after(f.comm, (uint64_t)i), 0);
    ck_assert_int_eq(gs_device_download(f.dev, out, buf[i], LEN * sizeof(float)), 0);
    assert_same(&f, out, in[i], LEN, GS_DTYPE_FLOAT32, "queued allreduce");
  }
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);           /* nothing queued: at once */
  ck_assert_int_eq(gs_comm_order_after(f.comm, 0), 0); /* complete since the sync */
  ck_assert_int_eq(gs_comm_broadcast(f.comm, buf[0], 16, 0), 0);
  ck_assert_uint_eq(gs_comm_ticket(f.comm), N + 1);
  ck_assert_int_eq(gs_comm_order_after(f.comm, N), 0);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  for (int i = 0; i < N; i++) {
    gs_device_free(f.dev, buf[i]);
    free(in[i]);
  }
  free(out);
  fixture_close(&f);
}
END_TEST

/* More than max_queued collectives without a sync are refused (their done
 * events would be reused while still needed); a sync makes room again. */
START_TEST(queue_bound)
{
  fixture_t f;
  void *buf;

  fixture_open(&f, 2);
  buf = gs_device_alloc(f.dev, 64 * sizeof(float));
  ck_assert_ptr_nonnull(buf);
  for (int round = 0; round < 2; round++) {
    uint64_t t = gs_comm_ticket(f.comm);

    ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 64, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), 0);
    ck_assert_int_eq(gs_comm_broadcast(f.comm, buf, 64, 0), 0);
    ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 64, GS_DTYPE_FLOAT32, GS_REDUCE_SUM),
                     GS_EINVAL);
    ck_assert_uint_eq(gs_comm_ticket(f.comm), t + 3); /* the refused one used its number */
    ck_assert_int_eq(gs_comm_order_after(f.comm, t + 2), GS_EINVAL); /* never queued */
    ck_assert_int_eq(gs_comm_order_after(f.comm, t + 1), 0);
    ck_assert_int_eq(gs_comm_sync(f.comm), 0);
    ck_assert_int_eq(gs_comm_order_after(f.comm, t + 2), 0); /* before the sync: done */
  }
  /* Bad arguments (a dtype that does not exist, no buffer) are refused
   * without harming the comm. (16-bit floats are valid: they add in float32.) */
  ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 64, (gs_dtype_t)9, GS_REDUCE_SUM), GS_EINVAL);
  ck_assert_int_eq(gs_comm_allreduce(f.comm, NULL, 64, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), GS_EINVAL);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 64, GS_DTYPE_FLOAT64, GS_REDUCE_MEAN), 0);
  ck_assert_int_eq(gs_comm_sync(f.comm), 0);
  gs_device_free(f.dev, buf);
  fixture_close(&f);
}
END_TEST

/* After gs_comm_abort every operation fails with GS_EABORTED at once,
 * whether or not something was queued; abort is idempotent. */
START_TEST(abort_fails_ops)
{
  fixture_t f;
  void *buf;

  for (int queued = 0; queued < 2; queued++) {
    fixture_open(&f, 4);
    buf = gs_device_alloc(f.dev, 1024 * sizeof(float));
    ck_assert_ptr_nonnull(buf);
    if (queued)
      ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 1024, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), 0);
    gs_comm_abort(f.comm);
    gs_comm_abort(f.comm);
    ck_assert_int_eq(gs_comm_sync(f.comm), GS_EABORTED);
    ck_assert_int_eq(gs_comm_allreduce(f.comm, buf, 1024, GS_DTYPE_FLOAT32, GS_REDUCE_SUM),
                     GS_EABORTED);
    ck_assert_int_eq(gs_comm_broadcast(f.comm, buf, 16, 0), GS_EABORTED);
    ck_assert_int_eq(gs_comm_order_after(f.comm, 0), GS_EABORTED);
    ck_assert_int_eq(gs_comm_sync(f.comm), GS_EABORTED);
    gs_comm_abort(f.comm);
    ck_assert_int_eq(gs_device_sync(f.dev), 0); /* the device is unharmed */
    gs_device_free(f.dev, buf);
    fixture_close(&f);
  }
}
END_TEST

/* Setups init must refuse, with the reason logged, leaving a comm that can
 * still be destroyed (or initialized properly). */
START_TEST(bad_setup)
{
  gs_log_t log = {GS_LOG_ERROR, NULL, "test_nccl"};
  char why[256] = "";
  gs_device_t *gpu = gs_device_open("cuda", 0, &log, why, sizeof(why));
  gs_device_t *cpu = gs_device_open("cpu", 0, &log, why, sizeof(why));
  gs_comm_t *c = gs_comm_new("nccl", &log);
  unsigned char id[ID_CAP], tiny[8];
  size_t id_len = 0;
  gs_comm_setup_t setup;
  char addr[64] = "x";
  float x = 1;

  ck_assert_ptr_nonnull(gpu);
  ck_assert_ptr_nonnull(cpu);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(
      gs_comm_listen(c, &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, addr, sizeof(addr)), 0);
  ck_assert_str_eq(addr, "");
  ck_assert_int_eq(gs_comm_make_id(c, tiny, sizeof(tiny), &id_len), GS_EINVAL);
  ck_assert_int_eq(gs_comm_make_id(c, id, sizeof(id), &id_len), 0);
  ck_assert_int_eq(gs_comm_allreduce(c, &x, 1, GS_DTYPE_FLOAT32, GS_REDUCE_SUM), GS_EINVAL);
  ck_assert_int_eq(gs_comm_sync(c), GS_EINVAL);
  setup = (gs_comm_setup_t){.rank = 0,
                            .world_size = 1,
                            .generation = 1,
                            .timeout_ms = 5000,
                            .device = gpu,
                            .id = id,
                            .id_len = id_len - 1,
                            .max_queued = 4};
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL); /* wrong id length */
  setup.id_len = id_len + 1;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  setup.id_len = id_len;
  setup.device = cpu;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL); /* no CUDA stream */
  setup.device = NULL;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  setup.device = gpu;
  setup.rank = 1;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL); /* rank past the world */
  setup.rank = 0;
  setup.timeout_ms = 0;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  gs_comm_destroy(c); /* never initialized */

  /* Refused setups leave the comm able to init properly afterwards. */
  c = gs_comm_new("nccl", &log);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(gs_comm_make_id(c, id, sizeof(id), &id_len), 0);
  setup.timeout_ms = 5000;
  setup.id_len = 3;
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL);
  setup.id_len = id_len;
  ck_assert_int_eq(gs_comm_init(c, &setup), 0);
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EINVAL); /* twice */
  ck_assert_int_eq(gs_comm_sync(c), 0);
  gs_comm_destroy(c);

  /* Aborted before init: init refuses. */
  c = gs_comm_new("nccl", &log);
  ck_assert_ptr_nonnull(c);
  gs_comm_abort(c);
  ck_assert_int_eq(gs_comm_init(c, &setup), GS_EABORTED);
  gs_comm_destroy(c);
  gs_device_destroy(cpu);
  gs_device_destroy(gpu);
}
END_TEST

/* The agent's path: rank 0 makes the id, init with world size 1 and a
 * timeout completes well within it; a second comm on the same GPU works
 * alongside the first. */
START_TEST(make_id_then_init)
{
  gs_log_t log = {GS_LOG_WARN, NULL, "test_nccl"};
  char why[256] = "";
  gs_device_t *dev = gs_device_open("cuda", 0, &log, why, sizeof(why));
  gs_comm_t *a = gs_comm_new("nccl", &log), *b = gs_comm_new("nccl", &log);
  double *buf;
  uint64_t t0;

  ck_assert_msg(dev, "cuda device: %s", why);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  t0 = gs_now_ms();
  ck_assert_int_eq(comm_start(a, dev, 1), 0);
  ck_assert_msg(gs_now_ms() - t0 < TIMEOUT_MS, "init took %llu ms",
                (unsigned long long)(gs_now_ms() - t0));
  ck_assert_int_eq(comm_start(b, dev, 0), 0); /* max_queued 0 counts as 1 */
  buf = gs_device_alloc(dev, 100 * sizeof(double));
  ck_assert_ptr_nonnull(buf);
  ck_assert_int_eq(gs_comm_allreduce(a, buf, 100, GS_DTYPE_FLOAT64, GS_REDUCE_SUM), 0);
  ck_assert_int_eq(gs_comm_allreduce(b, buf, 100, GS_DTYPE_FLOAT64, GS_REDUCE_SUM), 0);
  ck_assert_int_eq(gs_comm_allreduce(b, buf, 100, GS_DTYPE_FLOAT64, GS_REDUCE_SUM), GS_EINVAL);
  ck_assert_int_eq(gs_comm_sync(a), 0);
  ck_assert_int_eq(gs_comm_sync(b), 0);
  gs_comm_destroy(b);
  gs_comm_destroy(a); /* the second destroy of a healthy comm */
  gs_device_free(dev, buf);
  ck_assert_int_eq(gs_device_sync(dev), 0);
  gs_device_destroy(dev);
}
END_TEST

/* Rank 0 of a world of 2 whose rank 1 never starts. */
static int lonely_init(gs_comm_t *c, gs_device_t *dev, uint64_t timeout_ms)
{
  unsigned char id[ID_CAP];
  size_t id_len = 0;
  gs_comm_setup_t setup;

  ck_assert_int_eq(gs_comm_make_id(c, id, sizeof(id), &id_len), 0);
  setup = (gs_comm_setup_t){.rank = 0,
                            .world_size = 2,
                            .generation = 1,
                            .timeout_ms = timeout_ms,
                            .device = dev,
                            .id = id,
                            .id_len = id_len,
                            .max_queued = 4};
  return gs_comm_init(c, &setup);
}

START_TEST(init_times_out)
{
  char *text = NULL, why[256] = "";
  size_t text_len = 0;
  FILE *out = open_memstream(&text, &text_len);
  gs_log_t log = {GS_LOG_WARN, out, "test_nccl"};
  gs_device_t *dev = gs_device_open("cuda", 0, &log, why, sizeof(why));
  gs_comm_t *c = gs_comm_new("nccl", &log);
  uint64_t t0 = gs_now_ms(), took;
  int err;

  ck_assert_ptr_nonnull(out);
  ck_assert_msg(dev, "cuda device: %s", why);
  ck_assert_ptr_nonnull(c);
  err = lonely_init(c, dev, 1500);
  took = gs_now_ms() - t0;
  ck_assert_msg(err == GS_ETIMEDOUT, "init: %s", gs_err_name(err));
  ck_assert_msg(took >= 1500, "init gave up after %llu ms", (unsigned long long)took);
  ck_assert_int_eq(gs_comm_allreduce(c, &t0, 1, GS_DTYPE_FLOAT64, GS_REDUCE_SUM), GS_ETIMEDOUT);
  gs_comm_destroy(c);
  fflush(out);
  ck_assert_msg(text && strstr(text, "did not complete within 1500 ms: a rank is missing"),
                "log: %s", text ? text : "");
  fclose(out);
  free(text);
  gs_device_destroy(dev);
}
END_TEST

typedef struct aborter {
  gs_comm_t *comm;
  unsigned delay_ms;
} aborter_t;

static void *abort_later(void *arg)
{
  aborter_t *a = arg;
  struct timespec ts = {a->delay_ms / 1000, (long)(a->delay_ms % 1000) * 1000000L};

  nanosleep(&ts, NULL);
  gs_comm_abort(a->comm);
  return NULL;
}

START_TEST(abort_during_init)
{
  gs_log_t log = {GS_LOG_ERROR, NULL, "test_nccl"};
  char why[256] = "";
  gs_device_t *dev = gs_device_open("cuda", 0, &log, why, sizeof(why));
  gs_comm_t *c = gs_comm_new("nccl", &log);
  aborter_t a = {c, 300};
  pthread_t thread;
  uint64_t t0 = gs_now_ms(), took;
  int err;

  ck_assert_msg(dev, "cuda device: %s", why);
  ck_assert_ptr_nonnull(c);
  ck_assert_int_eq(pthread_create(&thread, NULL, abort_later, &a), 0);
  err = lonely_init(c, dev, TIMEOUT_MS);
  took = gs_now_ms() - t0;
  pthread_join(thread, NULL);
  /* Aborted, not timed out (how soon is no test's business). */
  ck_assert_msg(err == GS_EABORTED, "init: %s after %llu ms", gs_err_name(err),
                (unsigned long long)took);
  ck_assert_int_eq(gs_comm_sync(c), GS_EABORTED);
  gs_comm_destroy(c);
  gs_device_destroy(dev);
}
END_TEST

static Suite *nccl_suite(void)
{
  Suite *s = suite_create("comm_nccl");

  suite_add_tcase(s, gs_gpu_tcase("allreduce_values", allreduce_values));
  suite_add_tcase(s, gs_gpu_tcase("waits_for_compute_stream", waits_for_compute_stream));
  suite_add_tcase(s, gs_gpu_tcase("broadcast_bytes", broadcast_bytes));
  suite_add_tcase(s, gs_gpu_tcase("broadcast_group_bytes", broadcast_group_bytes));
  suite_add_tcase(s, gs_gpu_tcase("tickets_count_up", tickets_count_up));
  suite_add_tcase(s, gs_gpu_tcase("queue_bound", queue_bound));
  suite_add_tcase(s, gs_gpu_tcase("abort_fails_ops", abort_fails_ops));
  suite_add_tcase(s, gs_gpu_tcase("bad_setup", bad_setup));
  suite_add_tcase(s, gs_gpu_tcase("make_id_then_init", make_id_then_init));
  return s;
}

/* Last: if NCCL hung in a rendezvous that never completes, the results
 * above are already out. */
static Suite *missing_rank_suite(void)
{
  Suite *s = suite_create("comm_nccl_missing_rank");

  suite_add_tcase(s, gs_gpu_tcase("init_times_out", init_times_out));
  suite_add_tcase(s, gs_gpu_tcase("abort_during_init", abort_during_init));
  return s;
}

int main(void)
{
  int failed, skip = gs_gpu_skip();

  if (skip)
    return skip;
  failed = gs_gpu_run_suite(nccl_suite());
  failed += gs_gpu_run_suite(missing_rank_suite());
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
