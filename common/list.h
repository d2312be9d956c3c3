/* An intrusive, circular, doubly linked list (the Linux kernel's): the
 * node lives inside the element, so insert and remove are O(1) and never
 * allocate. A list head is a node whose prev/next point at itself when
 * empty; GS_CONTAINER_OF gets from a node back to its element. */
#ifndef GS_LIST_H
#define GS_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gs_list {
  struct gs_list *prev, *next;
} gs_list_t;

#define GS_CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static inline void gs_list_init(gs_list_t *head)
{
  head->prev = head->next = head;
}

static inline bool gs_list_empty(const gs_list_t *head)
{
  return head->next == head;
}

/* Whether `node` is on some list (a removed node is re-initialised). */
static inline bool gs_list_linked(const gs_list_t *node)
{
  return node->next != node && node->next != NULL;
}

static inline void gs_list_insert_tail(gs_list_t *head, gs_list_t *node)
{
  node->prev = head->prev;
  node->next = head;
  head->prev->next = node;
  head->prev = node;
}

/* Unlinks `node` and leaves it pointing at itself, so removing twice is
 * harmless. */
static inline void gs_list_remove(gs_list_t *node)
{
  node->prev->next = node->next;
  node->next->prev = node->prev;
  gs_list_init(node);
}

/* Moves every node of `from`, in order, to the end of `to` in O(1);
 * `from` is left empty. */
static inline void gs_list_move_all(gs_list_t *to, gs_list_t *from)
{
  if (gs_list_empty(from))
    return;
  from->next->prev = to->prev;
  to->prev->next = from->next;
  from->prev->next = to;
  to->prev = from->prev;
  gs_list_init(from);
}

/* The first node, or NULL when empty. */
static inline gs_list_t *gs_list_first(const gs_list_t *head)
{
  return gs_list_empty(head) ? NULL : head->next;
}

#endif
