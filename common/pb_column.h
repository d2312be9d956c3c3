/* A packed column of fixed-width numbers (repeated fixed32, fixed64,
 * float or double; or bools, a byte each), read and written in one copy. Protobuf lays such a
 * list out as the little-endian values back to back (packed, or each with
 * its tag: both decode), so no per-value decoding is needed: what makes a
 * NodeHeartbeat's columns of 255 ranks cheap (nanopb's per-value path cost
 * the coordinator a third of its heartbeat CPU at 100,000 ranks). The
 * column's field must be a nanopb callback (proto/gradsync.options). */
#ifndef GS_PB_COLUMN_H
#define GS_PB_COLUMN_H

#include <pb.h>
#include <stddef.h>

typedef struct gs_pb_column {
  void *items;  /* max values of `width` bytes: the caller's */
  size_t width; /* 4 or 8; 1: bools (each 0 or 1: one byte as a varint) */
  size_t max;
  size_t count; /* decoded so far / to encode */
} gs_pb_column_t;

/* Points a message's callback field at the column, to decode into it
 * (count reset to 0; decoding fails past max values or on a partial one). */
void gs_pb_column_bind_decode(pb_callback_t *cb, gs_pb_column_t *c);
/* Points a message's callback field at the column, to encode count values
 * from it (packed; nothing when count is 0). */
void gs_pb_column_bind_encode(pb_callback_t *cb, const gs_pb_column_t *c);

#endif
