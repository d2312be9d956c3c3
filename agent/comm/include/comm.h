/* Collective backends: allreduce and broadcast among the ranks of one
 * generation. One interface, several backends (docs/design.md,
 * "Data plane"): `host` (ring over TCP or shared memory between agents,
 * comm_host.c and host_*.c) and, with CUDA, `nccl` (comm_nccl.c).
 *
 * Threading: one thread at a time calls init/allreduce/broadcast (the
 * engine's comm thread); gs_comm_abort may be called from any other thread
 * at any time and makes the operation in progress, and every later one,
 * fail with GS_EABORTED promptly. */
#ifndef GS_COMM_H
#define GS_COMM_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h> /* gs_reduce_op_t and its names */

#include "error.h"
#include "log.h"
#include "device.h"
#include "packlist.h"

/* What a rank's collectives are doing, published for another thread (the
 * heartbeat's) to read at any moment: the collectives completed since init,
 * and the time they waited for room to send (a slow outbound link shows
 * here, on the rank that owns it, while its neighbours wait to receive).
 * A wait in progress counts too: behind a slow link one wait can last
 * seconds, and a reader that saw only finished waits would learn of it
 * that late. */
typedef struct gs_comm_gauge {
  _Atomic uint64_t done;
  _Atomic uint64_t send_wait_ns;       /* the finished waits */
  _Atomic uint64_t send_wait_since_ns; /* when the wait in progress began; 0: none */
} gs_comm_gauge_t;

/* The comm thread's side: a send wait begins at `now_ns`, and ends. */
void gs_comm_gauge_wait_begin(gs_comm_gauge_t *g, uint64_t now_ns);
void gs_comm_gauge_wait_end(gs_comm_gauge_t *g, uint64_t now_ns);

/* The reader's side: the time waited to send by `now_ns`, the wait in
 * progress included. Never less than a previous answer's `floor`, which a
 * wait that ends while it is read could otherwise make it. */
uint64_t gs_comm_gauge_send_wait_ns(gs_comm_gauge_t *g, uint64_t now_ns, uint64_t floor);

/* What a backend needs to connect the ranks of one generation. */
typedef struct gs_comm_setup {
  uint32_t rank;
  uint32_t world_size;
  uint64_t generation; /* connections of another generation are refused */
  /* Every rank's comm address ("host:port"), in rank order; host backend. */
  const char *const *peer_addrs;
  /* No progress for this long inside one operation is GS_ETIMEDOUT: a
   * silent peer is an error, never a hang. */
  uint64_t timeout_ms;
  /* The ranks not connected within this long (host: a peer that does not
   * answer at its address, or never dials ours; nccl: its init) fails
   * with a message naming the ranks and the likely cause; 0: timeout_ms. */
  uint64_t connect_timeout_ms;
  /* Set by the owner's signal handler: init gives up within 100 ms with
   * GS_EINTR (a rank told to stop while its peers are still missing).
   * Collectives ignore it. May be NULL. */
  volatile sig_atomic_t *interrupt;
  /* Stream-ordered backends (nccl): the device the buffers live on (its
   * compute stream orders the collectives), rank 0's rendezvous id
   * (gs_comm_make_id, passed to every rank), and the most collectives
   * queued between two gs_comm_sync calls. */
  gs_device_t *device;
  const void *id;
  size_t id_len;
  uint32_t max_queued;
  /* Where the comm publishes its progress; owned by the caller, outlives
   * the comm. NULL: nowhere (and the send wait is not measured). */
  gs_comm_gauge_t *gauge;
  /* Host backend: every link on TCP (default false: the two ends of a link
   * that can map the same memory pass their bytes through it). */
  bool tcp_only;
} gs_comm_setup_t;

typedef struct gs_comm gs_comm_t;

/* Creates a backend by name ("host"). NULL with the reason logged for an
 * unknown name. `log` must outlive the comm. Free with gs_comm_destroy. */
gs_comm_t *gs_comm_new(const char *backend, const gs_log_t *log);

/* Where a rank listens for its peers, and what they dial. */
typedef struct gs_comm_endpoint {
  const char *bind; /* numeric address to listen on; "0.0.0.0" or "::": every interface */
  /* What the peers dial: "host" or "host:port" (a NAT's public side);
   * NULL or "": the bound address (then bind must not be a wildcard). */
  const char *advertise;
  /* The ports bind tries, in order (a firewall's or NetworkPolicy's
   * range); 0 and 0: any free port. */
  uint16_t port_min, port_max;
} gs_comm_endpoint_t;

/* Host backend: binds a listening socket as `ep` says before the
 * rendezvous, and writes the address the other ranks should dial
 * ("10.0.0.2:40123") to addr. nccl: points NCCL's sockets at the
 * interface holding the address (NCCL_SOCKET_IFNAME) and writes "". */
int gs_comm_listen(gs_comm_t *comm, const gs_comm_endpoint_t *ep, char *addr,
                   size_t addr_len) GS_WARN_UNUSED;

/* Why the last listen, init or collective failed, in words naming the
 * ranks and addresses involved ("" when it did not, or said nothing more
 * than its error code). Valid until the comm is destroyed. */
const char *gs_comm_why(const gs_comm_t *comm);

/* Connects this rank to the others of setup->generation (host: to the next
 * rank in the ring, and accepts the previous one). Blocks until connected,
 * or fails after setup->timeout_ms. */
int gs_comm_init(gs_comm_t *comm, const gs_comm_setup_t *setup) GS_WARN_UNUSED;

/* Rank 0, before init, for backends that need a rendezvous id (nccl: the
 * ncclUniqueId): writes it to buf (cap bytes) and its size to *len. Other
 * backends: 0 with *len 0. */
int gs_comm_make_id(gs_comm_t *comm, void *buf, size_t cap, size_t *len) GS_WARN_UNUSED;
/* Whether init needs rank 0's id (every rank asks, rank 0 makes it). */
bool gs_comm_needs_id(const gs_comm_t *comm);

/* Stream-ordered backends (nccl) queue a collective on their own stream
 * and return at once: it starts after everything the device's compute
 * stream holds at the call, and gs_comm_order_after() makes later device
 * work wait for it. Blocking backends (host) return when it is done. */
bool gs_comm_stream_ordered(const gs_comm_t *comm);

/* The number the next collective gets (0, 1, ... since init). */
uint64_t gs_comm_ticket(const gs_comm_t *comm);

/* Stream-ordered: device work queued after this call waits for collective
 * `ticket` (already queued). Blocking backends: 0, nothing to do. */
int gs_comm_order_after(gs_comm_t *comm, uint64_t ticket) GS_WARN_UNUSED;

/* Stream-ordered: waits until every queued collective is done, polling for
 * the library's asynchronous errors and gs_comm_abort; no completion for
 * setup->timeout_ms aborts the communicator and fails with GS_ETIMEDOUT.
 * Call it before any blocking device sync that depends on collectives.
 * Blocking backends: 0. */
int gs_comm_sync(gs_comm_t *comm) GS_WARN_UNUSED;

/* Stream-ordered: gs_comm_sync for the collectives numbered below `until`
 * only (those of an earlier step, while this step's are queued): at once
 * when they are done, which the caller may know from a device fence behind
 * them. Blocking backends: 0. */
int gs_comm_sync_until(gs_comm_t *comm, uint64_t until) GS_WARN_UNUSED;

/* In place: every rank's `buf` of `count` elements becomes the elementwise
 * sum (or mean) over all ranks. Every rank passes the same count, dtype and
 * op. Any gs_dtype_t (else GS_EINVAL); 16-bit floats (bfloat16, float16)
 * add in float32 at each step of the reduction and round back. count 0
 * and world size 1 are valid (mean with one rank leaves buf unchanged). */
int gs_comm_allreduce(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype,
                      gs_reduce_op_t op) GS_WARN_UNUSED;

/* In place: every rank's `buf` of `bytes` bytes becomes root's. */
int gs_comm_broadcast(gs_comm_t *comm, void *buf, size_t bytes, uint32_t root) GS_WARN_UNUSED;

/* Sharded reductions (optimizer state sharded over the ranks): a buffer
 * of `count` elements is cut into one shard per rank, where gs_comm_shard
 * says (the backend's layout: the host ring's segments, NCCL's equal
 * pieces; a shard may be empty). gs_comm_reduce_scatter leaves this
 * rank's shard holding the reduction over every rank (sum or mean; the
 * rest of the buffer is left undefined); gs_comm_allgather fills every
 * other shard from its rank. Both work in place on a buffer of
 * gs_comm_shard_room elements (NCCL's pieces are equal: the buffer is
 * padded to world × piece). Together they move the bytes of one
 * allreduce. After a successful init only. */
typedef struct gs_comm_shard {
  size_t off, len; /* elements */
} gs_comm_shard_t;
gs_comm_shard_t gs_comm_shard(const gs_comm_t *comm, size_t count, uint32_t rank);
size_t gs_comm_shard_room(const gs_comm_t *comm, size_t count);
int gs_comm_reduce_scatter(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype,
                           gs_reduce_op_t op) GS_WARN_UNUSED;
int gs_comm_allgather(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype) GS_WARN_UNUSED;
/* Each rank's shard goes to the next rank (rank + 1 mod world), in place:
 * after a reduce-scatter, this rank also holds the previous rank's
 * shard's reduction (a copy of a shard on two ranks: 1/world more bytes). */
int gs_comm_shard_pass(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype) GS_WARN_UNUSED;

/* One buffer of a grouped broadcast. */
typedef struct gs_comm_span {
  void *buf;
  size_t bytes;
} gs_comm_span_t;

/* In place, as gs_comm_broadcast on each of n buffers, as one collective
 * with one ticket: a stream-ordered backend launches them as one group
 * (nccl: ncclGroupStart/End), so a caller that then syncs waits once
 * instead of once per buffer; other backends broadcast them in turn. */
int gs_comm_broadcast_group(gs_comm_t *comm, const gs_comm_span_t *spans, size_t n,
                            uint32_t root) GS_WARN_UNUSED;

/* Thread-safe, idempotent, never blocks: unblocks and fails the operation in
 * progress and every later one with GS_EABORTED. */
void gs_comm_abort(gs_comm_t *comm);

/* The backend's name ("host"). */
const char *gs_comm_name(const gs_comm_t *comm);

/* Closes every connection and frees the comm (NULL is a no-op). */
void gs_comm_destroy(gs_comm_t *comm);

/* The backend table (comm.c dispatches through it; one per backend file). */
typedef struct gs_comm_ops {
  const char *name;
  bool stream_ordered;
  int (*make_id)(gs_comm_t *comm, void *buf, size_t cap, size_t *len); /* NULL: no id */
  int (*order_after)(gs_comm_t *comm, uint64_t ticket);                /* stream-ordered */
  int (*sync)(gs_comm_t *comm);                                        /* stream-ordered */
  int (*sync_until)(gs_comm_t *comm, uint64_t until);                  /* stream-ordered */
  int (*listen)(gs_comm_t *comm, const gs_comm_endpoint_t *ep, char *addr, size_t addr_len);
  int (*init)(gs_comm_t *comm, const gs_comm_setup_t *setup);
  int (*allreduce)(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype, gs_reduce_op_t op);
  int (*broadcast)(gs_comm_t *comm, void *buf, size_t bytes, uint32_t root);
  gs_comm_shard_t (*shard)(const gs_comm_t *comm, size_t count, uint32_t rank);
  size_t (*shard_room)(const gs_comm_t *comm, size_t count);
  int (*reduce_scatter)(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype,
                        gs_reduce_op_t op);
  int (*allgather)(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype);
  int (*shard_pass)(gs_comm_t *comm, void *buf, size_t count, gs_dtype_t dtype);
  /* NULL: gs_comm_broadcast_group calls broadcast once per span. */
  int (*broadcast_group)(gs_comm_t *comm, const gs_comm_span_t *spans, size_t n, uint32_t root);
  void (*abort)(gs_comm_t *comm);
  void (*destroy)(gs_comm_t *comm); /* closes and frees the whole object */
} gs_comm_ops_t;

/* Every backend's state starts with this. */
struct gs_comm {
  const gs_comm_ops_t *ops;
  const gs_log_t *log;
  uint64_t ticket;        /* collectives started since init (comm.c counts them) */
  gs_comm_gauge_t *gauge; /* setup's; NULL: nothing measured */
  char why[512];          /* gs_comm_why; a backend sets it with gs__comm_fail */
};

/* Logs an error, keeps its words as gs_comm_why, and returns err. */
/* The arguments every reduction checks (a dtype with a size, sum or
 * mean, a buffer when count > 0, a byte count that fits): 0, or
 * GS_EINVAL after a line naming the collective `what`. */
int gs__comm_check_reduction(gs_comm_t *comm, const char *what, const void *buf, size_t count,
                             gs_dtype_t dtype, gs_reduce_op_t op);
int gs__comm_fail(gs_comm_t *comm, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Backend constructors (comm.c calls them by name). */
gs_comm_t *gs__comm_host_new(const gs_log_t *log);
gs_comm_t *gs__comm_nccl_new(const gs_log_t *log); /* CUDA builds (comm_nccl.c) */

#endif
