/* Packed fixed-width columns (see pb_column.h). */
#include "pb_column.h"

#include <pb_decode.h>
#include <pb_encode.h>
#include <string.h>

/* Values are copied as they lie: little-endian on the wire and here. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pb_column copies little-endian values: a big-endian host would need a swap"
#endif
_Static_assert(sizeof(bool) == 1, "a column of bools is copied a byte each");

static bool decode_column(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
  gs_pb_column_t *c = *arg;
  size_t n = stream->bytes_left;

  (void)field;
  if (n % c->width || n / c->width > c->max - c->count)
    PB_RETURN_ERROR(stream, "column too long or not whole values");
  if (!pb_read(stream, (pb_byte_t *)c->items + c->count * c->width, n))
    return false;
  /* A bool over 1 is a longer varint: not a column of bools, and not a
   * C bool either. */
  for (size_t i = 0; c->width == 1 && i < n; i++)
    if (((pb_byte_t *)c->items)[c->count + i] > 1)
      PB_RETURN_ERROR(stream, "a bool that is not 0 or 1");
  c->count += n / c->width;
  return true;
}

static bool encode_column(pb_ostream_t *stream, const pb_field_t *field, void *const *arg)
{
  const gs_pb_column_t *c = *arg;

  if (!c->count)
    return true;
  return pb_encode_tag(stream, PB_WT_STRING, field->tag) &&
         pb_encode_string(stream, c->items, c->count * c->width);
}

void gs_pb_column_bind_decode(pb_callback_t *cb, gs_pb_column_t *c)
{
  c->count = 0;
  cb->funcs.decode = decode_column;
  cb->arg = c;
}

void gs_pb_column_bind_encode(pb_callback_t *cb, const gs_pb_column_t *c)
{
  cb->funcs.encode = encode_column;
  cb->arg = (void *)c;
}
