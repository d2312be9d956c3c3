#include "pb_array.h"

#include <pb_decode.h>
#include <pb_encode.h>
#include <stdlib.h>
#include <string.h>

void gs_pb_array_init(gs_pb_array_t *a, const pb_msgdesc_t *fields, size_t item_size,
                      size_t max_count)
{
  memset(a, 0, sizeof(*a));
  a->fields = fields;
  a->item_size = item_size;
  a->max_count = max_count;
}

void gs_pb_array_view(gs_pb_array_t *a, const pb_msgdesc_t *fields, size_t item_size,
                      const void *items, size_t count)
{
  gs_pb_array_init(a, fields, item_size, count);
  a->items = (void *)items;
  a->count = count;
}

/* Returns a zeroed slot at the end of the array, or NULL. */
static void *grow(gs_pb_array_t *a)
{
  void *items, *slot;
  size_t cap;

  if (a->count >= a->max_count)
    return NULL;
  if (a->count == a->cap) {
    cap = a->cap ? a->cap * 2 : 16;
    if (cap > a->max_count)
      cap = a->max_count; /* the bound is on memory too, not only on count */
    items = realloc(a->items, cap * a->item_size);
    if (!items)
      return NULL;
    a->items = items;
    a->cap = cap;
  }
  slot = (char *)a->items + a->count * a->item_size;
  memset(slot, 0, a->item_size);
  return slot;
}

int gs_pb_array_push(gs_pb_array_t *a, const void *item)
{
  void *slot = grow(a);

  if (!slot)
    return a->count >= a->max_count ? GS_ERANGE : GS_ENOMEM;
  memcpy(slot, item, a->item_size);
  a->count++;
  return 0;
}

/* Called once per submessage, or once per packed run of scalars. */
static bool decode_items(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
  gs_pb_array_t *a = *arg;
  uint32_t value;
  void *slot;

  (void)field;
  if (a->fields) {
    slot = grow(a);
    if (!slot)
      PB_RETURN_ERROR(stream, "too many repeated items");
    if (!pb_decode(stream, a->fields, slot))
      return false;
    a->count++;
    return true;
  }
  while (stream->bytes_left) {
    if (!pb_decode_varint32(stream, &value))
      return false;
    if (gs_pb_array_push(a, &value))
      PB_RETURN_ERROR(stream, "too many repeated items");
  }
  return true;
}

static bool encode_scalars(pb_ostream_t *stream, const pb_field_t *field, const gs_pb_array_t *a)
{
  const uint32_t *v = a->items;
  pb_ostream_t sizing = PB_OSTREAM_SIZING;

  if (a->count == 0)
    return true;
  for (size_t i = 0; i < a->count; i++)
    pb_encode_varint(&sizing, v[i]);
  if (!pb_encode_tag(stream, PB_WT_STRING, field->tag) ||
      !pb_encode_varint(stream, sizing.bytes_written))
    return false;
  for (size_t i = 0; i < a->count; i++) {
    if (!pb_encode_varint(stream, v[i]))
      return false;
  }
  return true;
}

static bool encode_items(pb_ostream_t *stream, const pb_field_t *field, void *const *arg)
{
  const gs_pb_array_t *a = *arg;

  if (!a->fields)
    return encode_scalars(stream, field, a);
  for (size_t i = 0; i < a->count; i++) {
    const void *item = (const char *)a->items + i * a->item_size;

    if (!pb_encode_tag_for_field(stream, field) || !pb_encode_submessage(stream, a->fields, item))
      return false;
  }
  return true;
}

void gs_pb_array_bind_decode(pb_callback_t *cb, gs_pb_array_t *a)
{
  cb->funcs.decode = decode_items;
  cb->arg = a;
}

void gs_pb_array_bind_encode(pb_callback_t *cb, const gs_pb_array_t *a)
{
  cb->funcs.encode = encode_items;
  cb->arg = (void *)a;
}

void gs_pb_array_free(gs_pb_array_t *a)
{
  free(a->items);
  a->items = NULL;
  a->count = a->cap = 0;
}
