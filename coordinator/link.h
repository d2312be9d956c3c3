/* What the RPC layer keeps per client connection: the peer the jobs layer
 * sees for it and, on a node agent's connection, one peer per slot (each
 * rank the node agent speaks for, proto/README.md "Node agents"), and the
 * batches whose replies are still being gathered.
 *
 * A slot's peer id is the connection's id with the slot in the bits
 * gs__conn_get ignores (conn.h), so a reply, a park or an unpark addressed
 * to it reaches the connection, and gs__link_slot_of says which slot. No
 * libuv, no sockets: the RPC layer does the sending. */
#ifndef GS_LINK_H
#define GS_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "list.h"
#include "responder.h"

#define GS_LINK_MAX_SLOT 255    /* slots 1..255; 0 is the connection's own */
#define GS_BATCH_MAX_CALLS 1024 /* calls in one Batch */

typedef struct gs_link gs_link_t;
typedef struct gs_batch gs_batch_t;

/* One call of a batch and, once answered, its reply (an encoded batch
 * entry, gs_wire_encode_batch_entry). */
typedef struct gs_batch_entry {
  uint32_t slot;
  uint64_t request_id;
  bool answered;
  gs_buf_t reply;
} gs_batch_entry_t;

/* NULL when out of memory. `name` ("10.0.0.2:40312") is copied. */
gs_link_t *gs__link_new(uint64_t conn_id, const char *name);
/* Frees the link, its slots' peers and open batches. The jobs layer must
 * have been told of every peer's end first (gs__link_each_peer). */
void gs__link_free(gs_link_t *l);

/* The connection's own peer (slot 0). */
gs_peer_t *gs__link_self(gs_link_t *l);
/* The peer of `slot`: 0 is the connection's own; another is made at its
 * first call, named "NAME slot N". NULL past GS_LINK_MAX_SLOT or out of
 * memory. */
gs_peer_t *gs__link_peer(gs_link_t *l, uint32_t slot);
/* Which slot a peer id names (0: the connection's own). */
uint32_t gs__link_slot_of(uint64_t peer_id);
/* Calls fn for each peer of the link, its own first. */
void gs__link_each_peer(gs_link_t *l, void (*fn)(void *arg, gs_peer_t *peer), void *arg);
/* Whether no peer of the link carries a rank. */
bool gs__link_vacant(const gs_link_t *l);

/* A Batch of `calls` calls (1..GS_BATCH_MAX_CALLS) came as request
 * `request_id`; NULL when out of memory. */
gs_batch_t *gs__link_batch_open(gs_link_t *l, uint64_t request_id, uint32_t calls);
/* The batch's next call (there are `calls` of them). *duplicate says that
 * another call of the link awaits a reply to the same slot and request id
 * already: the caller answers this one itself, with an error. */
gs_batch_entry_t *gs__link_batch_add(gs_link_t *l, gs_batch_t *b, uint32_t slot,
                                     uint64_t request_id, bool *duplicate);
/* The oldest unanswered call awaiting (slot, request_id) in the link's
 * batches, or NULL (the reply goes out as a frame of its own). */
gs_batch_entry_t *gs__link_batch_find(gs_link_t *l, uint32_t slot, uint64_t request_id,
                                      gs_batch_t **batch);
/* `e`, of batch `b`, holds its reply now. True when that was the batch's
 * last: then `body` gets the BatchResponse (its replies in the calls'
 * order; *err if that failed), *request_id the Batch's, and the batch is
 * freed. */
bool gs__link_batch_answered(gs_batch_t *b, gs_batch_entry_t *e, gs_buf_t *body,
                             uint64_t *request_id, int *err);

#endif
