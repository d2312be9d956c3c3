#include "buf.h"

#include <stdlib.h>
#include <string.h>

int gs_buf_reserve(gs_buf_t *b, size_t extra)
{
  size_t need = b->len + extra, cap = b->cap ? b->cap : 256;
  uint8_t *data;

  if (need < b->len)
    return GS_ENOMEM;
  if (need <= b->cap)
    return 0;
  while (cap < need)
    cap *= 2;
  data = realloc(b->data, cap);
  if (!data)
    return GS_ENOMEM;
  b->data = data;
  b->cap = cap;
  return 0;
}

int gs_buf_append(gs_buf_t *b, const void *data, size_t n)
{
  int err = gs_buf_reserve(b, n);

  if (err)
    return err;
  if (n)
    memcpy(b->data + b->len, data, n);
  b->len += n;
  return 0;
}

int gs_buf_append_str(gs_buf_t *b, const char *s, size_t n)
{
  int err = gs_buf_reserve(b, n + 1);

  if (err)
    return err;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

const char *gs_buf_str(const gs_buf_t *b)
{
  return b->data ? (const char *)b->data : "";
}

void gs_buf_consume(gs_buf_t *b, size_t n)
{
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

void gs_buf_free(gs_buf_t *b)
{
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}
