/* The host collective backend's shared state (docs/design.md,
 * "Data plane"): ring reduce-scatter + allgather, and a chain broadcast, over
 * TCP between agents.
 *
 * Each rank holds two connections: the one it dialed to the next rank in the
 * ring (data only ever goes out on it) and the one it accepted from the
 * previous rank (data only ever comes in on it). Sockets are non-blocking and
 * driven by poll(), which also watches an eventfd that gs_comm_abort writes,
 * so an abort from another thread wakes every wait. Every step's byte counts
 * are known to both sides in advance, so the stream needs no framing. */
#ifndef GS_HOST_INTERNAL_H
#define GS_HOST_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "comm_shm.h"

#define HELLO_MAGIC 0x47534843u /* "GSHC" */
#define HELLO_VERSION 1u
#define HELLO_ACCEPTED 1u /* flag in the acceptor's reply */
#define HELLO_LEN 24
/* Unit of receive-then-reduce; a multiple of every element size. */
#define CHUNK_BYTES (256u * 1024u)
#define SOCK_BUF_BYTES (4 * 1024 * 1024)
/* Rings of three or more shrink the buffers to this once connected: more
 * ranks than cores keep more bytes in flight than the caches hold, and
 * smaller buffers measured faster there (docs/performance.md, "Host allreduce"). */
#define SOCK_BUF_MANY_BYTES (1024 * 1024)
#define RETRY_MS 25
#define MAX_PENDING 8 /* accepted connections that have not sent their hello yet */
#define ADDR_MAX 160
#define MAX_WAIT_MS 60000 /* longest single poll(); waits are re-armed after */
/* A step with nothing to do keeps retrying (yielding the CPU between tries)
 * this long before it sleeps in poll(): on loopback a wake-up from poll()
 * costs tens of microseconds, a retry about one. */
#define SPIN_NS 50000u
/* Allreduces of at most this many bytes gather every rank's whole buffer
 * around the ring (W-1 steps) instead of reduce-scatter + allgather
 * (2(W-1) steps of 1/W of it): fewer steps win while latency dominates.
 * Two ranks move the same bytes either way, and the pipelined ring won
 * from 64 KiB there; larger rings pay more per step. */
#define SMALL_BYTES_TWO (32u * 1024u)
#define SMALL_BYTES_MANY (64u * 1024u)

typedef struct host_comm {
  gs_comm_t base;
  atomic_bool aborted;
  atomic_int next_fd; /* dialed to rank+1: published after the handshake, closed by destroy */
  atomic_int prev_fd; /* accepted from rank-1: likewise */
  int wake_fd;        /* eventfd, readable once aborted */
  int listen_fd;
  int err; /* sticky error of a failed init or operation */
  bool init_called, ready;
  uint32_t rank, world, next, prev;
  uint64_t generation, timeout_ms, connect_timeout_ms;
  bool tcp_only; /* gs_comm_setup_t's */
  char next_addr[ADDR_MAX], prev_addr[ADDR_MAX], listen_addr[ADDR_MAX];
  uint8_t *scratch; /* CHUNK_BYTES: one received chunk before it is reduced */
  uint8_t *gather;  /* small allreduces: every rank's buffer, rank order */
  size_t gather_cap;
  /* Same-host links carry their bytes through shared memory (comm_shm.h);
   * the sockets then carry only wake-up bytes. NULL: the link is TCP. */
  gs_shm_pipe_t *out_pipe; /* to next */
  gs_shm_pipe_t *in_pipe;  /* from prev */
  /* A pipe link's peer closed its socket: a writer that is done may exit
   * while its last bytes still wait in the pipe, so this is an error only
   * once more bytes are needed than the pipe holds (or must be written). */
  bool next_gone, prev_gone;
} host_comm_t;

/* One step of an operation: send to next and receive from prev at once. */
typedef struct xfer {
  const uint8_t *send;
  size_t send_len, sent;
  uint8_t *recv;
  size_t recv_len, recvd;
  size_t fill;  /* bytes of the current chunk waiting in scratch (ring) */
  bool forward; /* send only what has been received (broadcast chain) */
  gs_dtype_t dtype;
  const char *what;  /* "allreduce" or "broadcast", for logs */
  struct ring *ring; /* the pipelined ring allreduce; NULL: send/recv above */
} xfer_t;

/* The ring allreduce as one transfer: the send stream is the 2(W-1)
 * segments that the reduce-scatter and allgather steps send, one after the
 * other, the receive stream the 2(W-1) they receive. Send item k is the
 * segment that receive item k-1 fills, so it goes out as soon as that part
 * has arrived and been reduced: the steps overlap instead of each waiting
 * for the last byte of the one before. */
typedef struct ring {
  uint8_t *buf;
  size_t count, esz;
  uint32_t w, r;
  bool mean;               /* scale the own segment as its sum completes */
  size_t lead;             /* bytes of the first send item (ours, sent at once) */
  size_t done;             /* receive-stream bytes reduced or stored */
  uint32_t s_item, r_item; /* items the cursors are in */
  size_t s_start, r_start; /* stream offsets where those items begin */
} ring_t;

/* The files of the host backend, one concept each: comm_host.c (the
 * backend object: create, abort, destroy), host_connect.c (listen,
 * rendezvous and handshake, shared-memory offer: init), host_link.c (a
 * link's slow path: exact exchanges, errors and failure, sleeping until a
 * link moves) and host_algo.c (the collectives and their data path:
 * the pipelined ring, the small gather, the broadcast chain, with the
 * reduction loops in the same translation unit as the transfer loop that
 * calls them). */

static inline bool gs__host_aborted(host_comm_t *c)
{
  return atomic_load(&c->aborted);
}

/* host_connect.c */
int gs__host_listen(gs_comm_t *base, const gs_comm_endpoint_t *ep, char *addr, size_t addr_len);
int gs__host_init(gs_comm_t *base, const gs_comm_setup_t *s);

/* host_link.c */
int gs__host_wait_ms(uint64_t since, uint64_t timeout, uint64_t now);
int gs__host_fail(host_comm_t *c, int err);
void gs__host_shutdown_ring(host_comm_t *c);
void gs__host_close_fd(int *fd);
int gs__host_io_all(host_comm_t *c, int fd, uint8_t *buf, size_t len, bool out, const char *what);
int gs__host_io_error(host_comm_t *c, int errnum, uint32_t peer, const char *addr,
                      const char *what);
int gs__host_xfer_timeout(host_comm_t *c, const xfer_t *x);
int gs__host_sleep_on_pipes(host_comm_t *c, xfer_t *x, int timeout_ms);

/* host_algo.c */
/* Bytes of the send stream that may go out now: the ring's lead item and
 * what has been reduced since, or all of it (a forwarded stream: what has
 * come in). Inline: both the link's waits and the ring's sends ask. */
static inline size_t gs__host_send_limit(const xfer_t *x)
{
  size_t lim;

  if (x->ring) {
    lim = x->ring->lead + x->ring->done;
    return lim < x->send_len ? lim : x->send_len;
  }
  return x->forward ? x->recvd : x->send_len;
}
int gs__host_allreduce(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                       gs_reduce_op_t op);
int gs__host_broadcast(gs_comm_t *base, void *buf, size_t bytes, uint32_t root);
gs_comm_shard_t gs__host_shard(const gs_comm_t *base, size_t count, uint32_t rank);
size_t gs__host_shard_room(const gs_comm_t *base, size_t count);
int gs__host_reduce_scatter(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype,
                            gs_reduce_op_t op);
int gs__host_allgather(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype);
int gs__host_shard_pass(gs_comm_t *base, void *buf, size_t count, gs_dtype_t dtype);

#endif
