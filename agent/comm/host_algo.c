/* Host backend, the collectives and their data path: large allreduces
 * pipeline the ring's steps into one transfer (ring_t); small ones gather
 * every rank's buffer around the ring and add in rank order; broadcast is
 * a chain from the root. The transfer loop, the sends and receives it
 * makes and the reduction it runs on each chunk stay in this one file, as
 * they were before the split, so the compiler sees the whole hot path.
 * Waits retry briefly before they sleep in poll() (SPIN_NS); the
 * measurements behind the constants: docs/performance.md, "Host
 * allreduce". */
#include "host_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "half.h"
#include "invariant.h"
#include "vectorize.h"

/* Whether the operation may start: not broken, not aborted, initialized.
 * A broken comm fails every later operation with its first error, also
 * when an abort came after it. */
static int op_begin(host_comm_t *c, const char *what)
{
  if (c->err)
    return c->err;
  if (gs__host_aborted(c))
    return GS_EABORTED;
  if (!c->ready) {
    GS_LOG_ERR(c->base.log, "host comm: %s before a successful init", what);
    return GS_EINVAL;
  }
  return 0;
}

/* Element offset of ring segment i of `count` split W ways: the first
 * count % W segments hold one element more. */
static size_t seg_off(size_t count, uint32_t w, uint32_t i)
{
  GS_ASSERT(i < w);
  return i * (count / w) + (i < count % w ? i : count % w);
}

static size_t seg_len(size_t count, uint32_t w, uint32_t i)
{
  return count / w + (i < count % w ? 1 : 0);
}

static void scale(uint8_t *p, size_t n, gs_dtype_t dtype, uint32_t w)
{
  float k = 1.0f / (float)w, *f = (float *)p;
  uint16_t *h = (uint16_t *)p;

  if (dtype == GS_DTYPE_FLOAT64) {
    double kd = 1.0 / w, *d = (double *)p;
    for (size_t i = 0; i < n; i++)
      d[i] *= kd;
  } else if (dtype == GS_DTYPE_BFLOAT16) {
    for (size_t i = 0; i < n; i++)
      h[i] = gs_f32_to_bf16(gs_bf16_to_f32(h[i]) * k);
  } else if (dtype == GS_DTYPE_FLOAT16) {
    for (size_t i = 0; i < n; i++)
      h[i] = gs_f32_to_f16(gs_f16_to_f32(h[i]) * k);
  } else {
    for (size_t i = 0; i < n; i++)
      f[i] *= k;
  }
}

/* dst += src, elementwise. The body works in blocks of REDUCE_BLOCK
 * elements, a trip count -O2's cheap vectorizer takes (it leaves loops of
 * unknown length scalar), compiled for AVX-512 and AVX2 too (GS_WIDE). */
#define REDUCE_BLOCK 32

/* One definition for each element type, so both get the same loop. */
#define GS__DEFINE_REDUCE(name, type)                                                              \
  GS_WIDE static void name(type *restrict dst, const type *restrict src, size_t n)                 \
  {                                                                                                \
    size_t i = 0;                                                                                  \
                                                                                                   \
    for (; i + REDUCE_BLOCK <= n; i += REDUCE_BLOCK)                                               \
      for (size_t j = 0; j < REDUCE_BLOCK; j++)                                                    \
        dst[i + j] += src[i + j];                                                                  \
    for (; i < n; i++)                                                                             \
      dst[i] += src[i];                                                                            \
  }

GS__DEFINE_REDUCE(reduce_f32, float)
GS__DEFINE_REDUCE(reduce_f64, double)

/* 16-bit floats travel as they are and add in float32 at every step of
 * the reduction (rounded back once per step, as NCCL does). */
#define GS__DEFINE_REDUCE_HALF(name, widen, narrow)                                                \
  GS_WIDE static void name(uint16_t *restrict dst, const uint16_t *restrict src, size_t n)         \
  {                                                                                                \
    size_t i = 0;                                                                                  \
                                                                                                   \
    for (; i + REDUCE_BLOCK <= n; i += REDUCE_BLOCK)                                               \
      for (size_t j = 0; j < REDUCE_BLOCK; j++)                                                    \
        dst[i + j] = narrow(widen(dst[i + j]) + widen(src[i + j]));                                \
    for (; i < n; i++)                                                                             \
      dst[i] = narrow(widen(dst[i]) + widen(src[i]));                                              \
  }

GS__DEFINE_REDUCE_HALF(reduce_bf16, gs_bf16_to_f32, gs_f32_to_bf16)
GS__DEFINE_REDUCE_HALF(reduce_f16, gs_f16_to_f32, gs_f32_to_f16)

static void reduce_into(uint8_t *dst, const uint8_t *src, size_t bytes, gs_dtype_t dtype)
{
  if (dtype == GS_DTYPE_FLOAT64)
    reduce_f64((double *)dst, (const double *)src, bytes / sizeof(double));
  else if (dtype == GS_DTYPE_BFLOAT16)
    reduce_bf16((uint16_t *)dst, (const uint16_t *)src, bytes / sizeof(uint16_t));
  else if (dtype == GS_DTYPE_FLOAT16)
    reduce_f16((uint16_t *)dst, (const uint16_t *)src, bytes / sizeof(uint16_t));
  else
    reduce_f32((float *)dst, (const float *)src, bytes / sizeof(float));
}

/* One byte on a link's socket wakes the side sleeping in poll(); when the
 * socket is full a byte is already pending, which wakes it as well. */
static void send_wake(int fd)
{
  static const uint8_t one = 1;

  (void)!send(fd, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Receives up to len bytes from prev into dst: the count, 0 if it would
 * block, or a negative error (the link closed or failed). */
static ssize_t recv_into(host_comm_t *c, xfer_t *x, uint8_t *dst, size_t len)
{
  ssize_t n;

  if (c->in_pipe) {
    bool wake;
    size_t got = gs__shm_read(c->in_pipe, dst, len, &wake);

    if (wake)
      send_wake(atomic_load(&c->prev_fd));
    return (ssize_t)got;
  }
  n = recv(atomic_load(&c->prev_fd), dst, len, MSG_DONTWAIT);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return 0;
    return gs__host_io_error(c, n == 0 ? 0 : errno, c->prev, c->prev_addr, x->what);
  }
  return n;
}

/* Sends up to len bytes from p to next, counting them in x->sent; 1 on
 * progress, 0 if it would block. */
static int send_from(host_comm_t *c, xfer_t *x, const uint8_t *p, size_t len)
{
  ssize_t n;

  if (c->out_pipe) {
    bool wake;
    size_t put = gs__shm_write(c->out_pipe, p, len, &wake);

    if (wake)
      send_wake(atomic_load(&c->next_fd));
    x->sent += put;
    return put > 0;
  }
  n = send(atomic_load(&c->next_fd), p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
      return 0;
    return gs__host_io_error(c, errno, c->next, c->next_addr, x->what);
  }
  x->sent += (size_t)n;
  return 1;
}

/* Sends what it can to next; 1 on progress, 0 if it would block. */
static int send_some(host_comm_t *c, xfer_t *x)
{
  size_t limit = x->forward ? x->recvd : x->send_len;

  if (x->sent >= limit)
    return 0;
  return send_from(c, x, x->send + x->sent, limit - x->sent);
}

/* Receives up to one chunk from prev into place; 1 on progress, 0 if it
 * would block. */
static int recv_some(host_comm_t *c, xfer_t *x)
{
  size_t left = x->recv_len - x->recvd;
  ssize_t n;

  if (left == 0)
    return 0;
  n = recv_into(c, x, x->recv + x->recvd, CHUNK_BYTES < left ? CHUNK_BYTES : left);
  if (n <= 0)
    return (int)n;
  x->recvd += (size_t)n;
  return 1;
}

/* Segment of send item k (recv: of receive item k): rank r's ring sends
 * segment r-k in step k and receives segment r-k-1. */
static uint32_t ring_seg(const ring_t *g, uint32_t item, bool recv)
{
  /* A ring's items: W-1 of the reduce-scatter, W-1 of the allgather. */
  GS_ASSERT(g->r < g->w && item + (recv ? 1u : 0u) <= 2 * g->w);
  return (g->r + 2 * g->w - item - (recv ? 1u : 0u)) % g->w;
}

static size_t ring_item_len(const ring_t *g, uint32_t item, bool recv)
{
  return seg_len(g->count, g->w, ring_seg(g, item, recv)) * g->esz;
}

static uint8_t *ring_item_ptr(const ring_t *g, uint32_t item, bool recv)
{
  return g->buf + seg_off(g->count, g->w, ring_seg(g, item, recv)) * g->esz;
}

/* send_some for the ring: what may go out of the current send item. */
static int ring_send_some(host_comm_t *c, xfer_t *x)
{
  ring_t *g = x->ring;
  size_t limit = gs__host_send_limit(x), len, end;

  if (x->sent >= limit)
    return 0;
  while (x->sent >= g->s_start + (len = ring_item_len(g, g->s_item, false))) {
    g->s_start += len;
    g->s_item++;
  }
  end = g->s_start + len < limit ? g->s_start + len : limit;
  return send_from(c, x, ring_item_ptr(g, g->s_item, false) + (x->sent - g->s_start),
                   end - x->sent);
}

/* recv_some for the ring: the first W-1 receive items are added into
 * place one chunk at a time (the last of them completes this rank's own
 * segment, scaled there for the mean), the others are stored. */
static int ring_recv_some(host_comm_t *c, xfer_t *x)
{
  ring_t *g = x->ring;
  size_t len, left, want;
  uint8_t *item, *dst;
  bool reduce;
  ssize_t n;

  if (x->recvd == x->recv_len)
    return 0;
  while (x->recvd >= g->r_start + (len = ring_item_len(g, g->r_item, true))) {
    g->r_start += len;
    g->r_item++;
  }
  item = ring_item_ptr(g, g->r_item, true);
  reduce = g->r_item < g->w - 1;
  left = g->r_start + len - x->recvd;
  dst = reduce ? c->scratch + x->fill : item + (x->recvd - g->r_start);
  want = reduce ? CHUNK_BYTES - x->fill : left;
  n = recv_into(c, x, dst, want < left ? want : left);
  if (n <= 0)
    return (int)n;
  x->recvd += (size_t)n;
  if (!reduce) {
    g->done += (size_t)n;
    return 1;
  }
  x->fill += (size_t)n;
  if (x->fill == CHUNK_BYTES || (size_t)n == left) {
    dst = item + (x->recvd - g->r_start) - x->fill;
    reduce_into(dst, c->scratch, x->fill, x->dtype);
    if (g->mean && g->r_item == g->w - 2)
      scale(dst, x->fill / g->esz, x->dtype, g->w);
    g->done += x->fill;
    x->fill = 0;
  }
  return 1;
}

/* Whether bytes this rank sent still wait to leave it: handed to send()
 * but not yet sent by the kernel (SIOCOUTQNSD). A slow outbound link
 * keeps them there, hidden by the socket buffer from send() itself. */
static bool unsent_bytes(host_comm_t *c)
{
  int fd = atomic_load(&c->next_fd), n = 0;

  return !c->out_pipe && fd >= 0 && ioctl(fd, SIOCOUTQNSD, &n) == 0 && n > 0;
}

/* Sleeps until a link of x can move, the abort, or timeout_ms. The time
 * it sleeps with bytes waiting to go out counts as send wait. */
static int xfer_sleep(host_comm_t *c, xfer_t *x, int timeout_ms)
{
  bool sending = x->sent < gs__host_send_limit(x);
  bool waits_out = c->base.gauge && (sending || unsent_bytes(c));
  struct pollfd pfd[3];
  int err = 0, nfd = 0;

  if (waits_out)
    gs_comm_gauge_wait_begin(c->base.gauge, gs_now_ns());
  if (c->out_pipe || c->in_pipe) {
    err = gs__host_sleep_on_pipes(c, x, timeout_ms);
  } else {
    pfd[nfd++] = (struct pollfd){c->wake_fd, POLLIN, 0};
    if (sending)
      pfd[nfd++] = (struct pollfd){atomic_load(&c->next_fd), POLLOUT, 0};
    if (x->recvd < x->recv_len)
      pfd[nfd++] = (struct pollfd){atomic_load(&c->prev_fd), POLLIN, 0};
    if (poll(pfd, (nfds_t)nfd, timeout_ms) < 0 && errno != EINTR) {
      GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": poll: %s", c->rank, strerror(errno));
      err = GS_EIO;
    }
  }
  if (waits_out)
    gs_comm_gauge_wait_end(c->base.gauge, gs_now_ns());
  return err;
}

/* Runs one step to completion: sends and receives at once, so two ranks
 * never wait on each other's full buffers. `last` is the time of the last
 * progress, carried across the steps of one operation. */
static int xfer_run(host_comm_t *c, xfer_t *x, uint64_t *last)
{
  uint64_t now, spin_since = gs_now_ns();
  int sent, got, err;

  for (;;) {
    if (gs__host_aborted(c))
      return GS_EABORTED;
    sent = x->ring ? ring_send_some(c, x) : send_some(c, x);
    if (sent < 0)
      return sent;
    got = x->ring ? ring_recv_some(c, x) : recv_some(c, x);
    if (got < 0)
      return got;
    if (x->sent == x->send_len && x->recvd == x->recv_len)
      return 0;
    if (sent || got) {
      *last = gs_now_ms();
      spin_since = gs_now_ns();
      continue;
    }
    if (gs_now_ns() - spin_since < SPIN_NS) {
      sched_yield(); /* lets a peer sharing this core run */
      continue;
    }
    now = gs_now_ms();
    if (now - *last >= c->timeout_ms)
      return gs__host_xfer_timeout(c, x);
    err = xfer_sleep(c, x, gs__host_wait_ms(*last, c->timeout_ms, now));
    if (err)
      return err;
  }
}

/* Grows the gather buffer to `bytes` (it keeps the largest size asked). */
static int gather_reserve(host_comm_t *c, size_t bytes)
{
  uint8_t *p;

  if (bytes <= c->gather_cap)
    return 0;
  p = realloc(c->gather, bytes);
  if (!p) {
    GS_LOG_ERR(c->base.log, "host comm: rank %" PRIu32 ": out of memory for %zu gather bytes",
               c->rank, bytes);
    return GS_ENOMEM;
  }
  c->gather = p;
  c->gather_cap = bytes;
  return 0;
}

/* Small allreduce: every rank's whole buffer travels around the ring (W-1
 * steps: step s forwards the block of rank r-s, receives that of rank
 * r-s-1) into the gather buffer, then each rank adds the W blocks in rank
 * order, so every rank computes the same sum bit for bit. */
static int small_allreduce(host_comm_t *c, uint8_t *buf, size_t bytes, gs_dtype_t dtype,
                           uint64_t *last)
{
  uint32_t w = c->world, r = c->rank, s;
  uint8_t *g;
  int err = gather_reserve(c, bytes * w);

  if (err)
    return err;
  g = c->gather;
  memcpy(g + r * bytes, buf, bytes);
  for (s = 0; s < w - 1; s++) {
    xfer_t x = {
        .send = g + (size_t)((r + w - s) % w) * bytes,
        .send_len = bytes,
        .recv = g + (size_t)((r + 2 * w - s - 1) % w) * bytes,
        .recv_len = bytes,
        .dtype = dtype,
        .what = "allreduce",
    };

    err = xfer_run(c, &x, last);
    if (err)
      return err;
  }
  memcpy(buf, g, bytes);
  for (s = 1; s < w; s++)
    reduce_into(buf, g + (size_t)s * bytes, bytes, dtype);
  return 0;
}

/* The pipelined ring's items first .. end-1 in one transfer (ring_t):
 * items 0 .. W-2 are the reduce-scatter (W-1 steps: rank r ends up owning
 * the full sum of segment r+1, scaled there for the mean), W-1 .. 2W-3
 * the allgather (W-1 steps, each forwarding the segment just received). */
static int ring_run(host_comm_t *c, void *buf, size_t count, gs_dtype_t dtype, gs_reduce_op_t op,
                    uint32_t first, uint32_t end, const char *what)
{
  uint64_t last = gs_now_ms();
  ring_t ring = {0};
  xfer_t x = {.dtype = dtype, .what = what, .ring = &ring};
  int err;

  ring.buf = buf;
  ring.count = count;
  ring.esz = gs_dtype_size(dtype);
  ring.w = c->world;
  ring.r = c->rank;
  ring.mean = op == GS_REDUCE_MEAN;
  ring.s_item = ring.r_item = first;
  ring.lead = ring_item_len(&ring, first, false);
  for (uint32_t s = first; s < end; s++) {
    x.send_len += ring_item_len(&ring, s, false);
    x.recv_len += ring_item_len(&ring, s, true);
  }
  err = xfer_run(c, &x, &last);
  return err ? gs__host_fail(c, err) : 0;
}

/* Whether a buffer takes small_allreduce: a round trip per ring step
 * costs more than its bytes. */
static bool is_small(const host_comm_t *c, size_t count, gs_dtype_t dtype)
{
  return count * gs_dtype_size(dtype) <= (c->world == 2 ? SMALL_BYTES_TWO : SMALL_BYTES_MANY);
}

static int small_reduce(host_comm_t *c, void *buf, size_t count, gs_dtype_t dtype,
                        gs_reduce_op_t op)
{
  uint64_t last = gs_now_ms();
  int err = small_allreduce(c, buf, count * gs_dtype_size(dtype), dtype, &last);

  if (err)
    return gs__host_fail(c, err);
  if (op == GS_REDUCE_MEAN)
    scale(buf, count, dtype, c->world);
  return 0;
}

/* The whole ring (reduce-scatter, then allgather) for large buffers;
 * small ones take small_allreduce. */
int gs__host_allreduce(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                       gs_reduce_op_t op)
{
  host_comm_t *c = (host_comm_t *)base;
  uint32_t w = c->world;
  int err = op_begin(c, "allreduce");

  if (!err)
    err = gs__comm_check_reduction(base, "allreduce", buf, count, dtype, op);
  if (err || w == 1 || count == 0)
    return err;
  if (is_small(c, count, dtype))
    return small_reduce(c, buf, count, dtype, op);
  return ring_run(c, buf, count, dtype, op, 0, 2 * (w - 1), "allreduce");
}

/* Rank r's shard is the segment its reduce-scatter completes: r+1. */
gs_comm_shard_t gs__host_shard(const gs_comm_t *base, size_t count, uint32_t rank)
{
  const host_comm_t *c = (const host_comm_t *)base;
  uint32_t w = c->world ? c->world : 1, seg = (rank + 1) % w;

  return (gs_comm_shard_t){seg_off(count, w, seg), seg_len(count, w, seg)};
}

size_t gs__host_shard_room(const gs_comm_t *base, size_t count)
{
  (void)base;
  return count;
}

/* The ring's first half; a small buffer is reduced whole as the
 * allreduce reduces it, so that a sharded step sums in the same order as
 * an unsharded one, to the bit (its bytes are few). */
int gs__host_reduce_scatter(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                            gs_reduce_op_t op)
{
  host_comm_t *c = (host_comm_t *)base;
  int err = op_begin(c, "reduce-scatter");

  if (!err)
    err = gs__comm_check_reduction(base, "reduce-scatter", buf, count, dtype, op);
  if (err || c->world == 1 || count == 0)
    return err;
  if (is_small(c, count, dtype))
    return small_reduce(c, buf, count, dtype, op);
  return ring_run(c, buf, count, dtype, op, 0, c->world - 1, "reduce-scatter");
}

int gs__host_allgather(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype)
{
  host_comm_t *c = (host_comm_t *)base;
  int err = op_begin(c, "allgather");

  if (!err)
    err = gs__comm_check_reduction(base, "allgather", buf, count, dtype, GS_REDUCE_SUM);
  if (err || c->world == 1 || count == 0)
    return err;
  return ring_run(c, buf, count, dtype, GS_REDUCE_SUM, c->world - 1, 2 * (c->world - 1),
                  "allgather");
}

/* The allgather's first step alone: each rank forwards the segment it
 * owns (r+1) and receives its predecessor's (r). */
int gs__host_shard_pass(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype)
{
  host_comm_t *c = (host_comm_t *)base;
  int err = op_begin(c, "shard pass");

  if (!err)
    err = gs__comm_check_reduction(base, "shard pass", buf, count, dtype, GS_REDUCE_SUM);
  if (err || c->world == 1 || count == 0)
    return err;
  return ring_run(c, buf, count, dtype, GS_REDUCE_SUM, c->world - 1, c->world, "shard pass");
}

/* Chain from root along the ring, forwarding each piece as it arrives. */
int gs__host_broadcast(gs_comm_t *base, void *buf, size_t bytes, uint32_t root)
{
  host_comm_t *c = (host_comm_t *)base;
  uint64_t last = gs_now_ms();
  int err = op_begin(c, "broadcast");
  xfer_t x = {.send = buf, .recv = buf, .what = "broadcast"};

  if (err)
    return err;
  if (root >= c->world || (bytes && !buf)) {
    GS_LOG_ERR(base->log,
               "host comm: broadcast of %zu bytes from root %" PRIu32 " in a world of %" PRIu32
               ": invalid arguments",
               bytes, root, c->world);
    return GS_EINVAL;
  }
  if (c->world == 1 || bytes == 0)
    return 0;
  if (c->rank == root) {
    x.send_len = bytes;
  } else {
    x.recv_len = bytes;
    x.forward = c->next != root;
    x.send_len = x.forward ? bytes : 0;
  }
  err = xfer_run(c, &x, &last);
  return err ? gs__host_fail(c, err) : 0;
}
