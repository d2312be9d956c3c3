/* A growable byte buffer: read buffers of connections, encoded frames. */
#ifndef GS_BUF_H
#define GS_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct gs_buf {
  uint8_t *data;
  size_t len;
  size_t cap;
} gs_buf_t;

/* Makes room for `extra` more bytes after len. GS_ENOMEM on failure. */
int gs_buf_reserve(gs_buf_t *b, size_t extra) GS_WARN_UNUSED;
int gs_buf_append(gs_buf_t *b, const void *data, size_t n) GS_WARN_UNUSED;
/* Appends n bytes and keeps a NUL after them (not counted in len), so the
 * contents read as a C string through gs_buf_str. */
int gs_buf_append_str(gs_buf_t *b, const char *s, size_t n) GS_WARN_UNUSED;
/* The contents of a buffer filled by gs_buf_append_str; "" when unused. */
const char *gs_buf_str(const gs_buf_t *b);
/* Drops the first n bytes. */
void gs_buf_consume(gs_buf_t *b, size_t n);
/* Frees the storage and zeroes the buffer. */
void gs_buf_free(gs_buf_t *b);

#endif
