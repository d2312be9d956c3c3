/* A connection's peers and batches (see link.h). */
#include "link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"

typedef struct slot_peer {
  gs_peer_t peer;
  char name[160];
} slot_peer_t;

struct gs_batch {
  gs_list_t node; /* on gs_link_t.batches */
  uint64_t request_id;
  uint32_t calls, added, answered;
  gs_batch_entry_t entries[];
};

struct gs_link {
  gs_peer_t self;
  char name[128];
  slot_peer_t **slots; /* [GS_LINK_MAX_SLOT + 1], made at a node agent's first slot */
  gs_list_t batches;   /* oldest first */
};

gs_link_t *gs__link_new(uint64_t conn_id, const char *name)
{
  gs_link_t *l = calloc(1, sizeof(*l));

  if (!l)
    return NULL;
  snprintf(l->name, sizeof(l->name), "%s", name);
  l->self.id = conn_id;
  l->self.name = l->name;
  gs_list_init(&l->batches);
  return l;
}

static void batch_free(gs_batch_t *b)
{
  gs_list_remove(&b->node);
  for (uint32_t i = 0; i < b->added; i++)
    gs_buf_free(&b->entries[i].reply);
  free(b);
}

void gs__link_free(gs_link_t *l)
{
  gs_list_t *n;

  if (!l)
    return;
  while ((n = gs_list_first(&l->batches)))
    batch_free(GS_CONTAINER_OF(n, gs_batch_t, node));
  for (uint32_t s = 1; l->slots && s <= GS_LINK_MAX_SLOT; s++)
    free(l->slots[s]);
  free(l->slots);
  free(l);
}

gs_peer_t *gs__link_self(gs_link_t *l)
{
  return &l->self;
}

gs_peer_t *gs__link_peer(gs_link_t *l, uint32_t slot)
{
  slot_peer_t *p;

  if (slot == 0)
    return &l->self;
  if (slot > GS_LINK_MAX_SLOT)
    return NULL;
  if (!l->slots && !(l->slots = calloc(GS_LINK_MAX_SLOT + 1, sizeof(*l->slots))))
    return NULL;
  if (!l->slots[slot]) {
    p = calloc(1, sizeof(*p));
    if (!p)
      return NULL;
    p->peer.id = l->self.id | (uint64_t)slot << GS_CONN_SLOT_BITS;
    snprintf(p->name, sizeof(p->name), "%s slot %u", l->name, slot);
    p->peer.name = p->name;
    p->peer.node_slot = true;
    l->slots[slot] = p;
  }
  return &l->slots[slot]->peer;
}

uint32_t gs__link_slot_of(uint64_t peer_id)
{
  return (uint32_t)(peer_id >> GS_CONN_SLOT_BITS) & 0xffu;
}

void gs__link_each_peer(gs_link_t *l, void (*fn)(void *arg, gs_peer_t *peer), void *arg)
{
  fn(arg, &l->self);
  for (uint32_t s = 1; l->slots && s <= GS_LINK_MAX_SLOT; s++)
    if (l->slots[s])
      fn(arg, &l->slots[s]->peer);
}

bool gs__link_vacant(const gs_link_t *l)
{
  if (l->self.member)
    return false;
  for (uint32_t s = 1; l->slots && s <= GS_LINK_MAX_SLOT; s++)
    if (l->slots[s] && l->slots[s]->peer.member)
      return false;
  return true;
}

gs_batch_t *gs__link_batch_open(gs_link_t *l, uint64_t request_id, uint32_t calls)
{
  gs_batch_t *b;

  if (calls == 0 || calls > GS_BATCH_MAX_CALLS)
    return NULL;
  b = calloc(1, sizeof(*b) + calls * sizeof(b->entries[0]));
  if (!b)
    return NULL;
  b->request_id = request_id;
  b->calls = calls;
  gs_list_insert_tail(&l->batches, &b->node);
  return b;
}

gs_batch_entry_t *gs__link_batch_find(gs_link_t *l, uint32_t slot, uint64_t request_id,
                                      gs_batch_t **batch)
{
  for (gs_list_t *n = l->batches.next; n != &l->batches; n = n->next) {
    gs_batch_t *b = GS_CONTAINER_OF(n, gs_batch_t, node);

    for (uint32_t i = 0; i < b->added; i++) {
      gs_batch_entry_t *e = &b->entries[i];

      if (!e->answered && e->slot == slot && e->request_id == request_id) {
        *batch = b;
        return e;
      }
    }
  }
  return NULL;
}

gs_batch_entry_t *gs__link_batch_add(gs_link_t *l, gs_batch_t *b, uint32_t slot,
                                     uint64_t request_id, bool *duplicate)
{
  gs_batch_t *other;
  gs_batch_entry_t *e;

  if (b->added >= b->calls)
    return NULL;
  *duplicate = gs__link_batch_find(l, slot, request_id, &other) != NULL;
  e = &b->entries[b->added++];
  e->slot = slot;
  e->request_id = request_id;
  return e;
}

bool gs__link_batch_answered(gs_batch_t *b, gs_batch_entry_t *e, gs_buf_t *body,
                             uint64_t *request_id, int *err)
{
  e->answered = true;
  *err = 0;
  if (++b->answered < b->calls)
    return false;
  body->len = 0;
  for (uint32_t i = 0; i < b->calls && !*err; i++)
    *err = gs_buf_append(body, b->entries[i].reply.data, b->entries[i].reply.len);
  *request_id = b->request_id;
  batch_free(b);
  return true;
}
