/* Repeated protobuf fields that grow with the world or the model (peers,
 * params, pack indices) are nanopb callbacks (see proto/gradsync.options).
 * A gs_pb_array_t is the C side of one: a growable array of submessage
 * structs, or of uint32 scalars, with a bound on how many decode accepts. */
#ifndef GS_PB_ARRAY_H
#define GS_PB_ARRAY_H

#include <pb.h>
#include <stddef.h>

#include "error.h"

typedef struct gs_pb_array {
  void *items; /* owned when decoded; a view when only encoded */
  size_t count;
  size_t cap;
  size_t item_size;           /* sizeof one item */
  size_t max_count;           /* decode fails beyond this */
  const pb_msgdesc_t *fields; /* submessage type; NULL for uint32 scalars */
} gs_pb_array_t;

/* An empty array of submessages of type `fields` (NULL: uint32 scalars). */
void gs_pb_array_init(gs_pb_array_t *a, const pb_msgdesc_t *fields, size_t item_size,
                      size_t max_count);
/* A read-only view of existing items, for encoding. */
void gs_pb_array_view(gs_pb_array_t *a, const pb_msgdesc_t *fields, size_t item_size,
                      const void *items, size_t count);
/* Points a message's callback field at the array, to decode into it. */
void gs_pb_array_bind_decode(pb_callback_t *cb, gs_pb_array_t *a);
/* Points a message's callback field at the array, to encode from it. */
void gs_pb_array_bind_encode(pb_callback_t *cb, const gs_pb_array_t *a);
/* Appends a copy of one item. GS_ENOMEM, or GS_ERANGE past max_count. */
int gs_pb_array_push(gs_pb_array_t *a, const void *item) GS_WARN_UNUSED;
/* Frees owned items. */
void gs_pb_array_free(gs_pb_array_t *a);

#endif
