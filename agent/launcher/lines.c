/* Line splitting and prefixing for gradsync-run (see lines.h). */
#include "lines.h"

#include <string.h>

void gs_run_lines_init(gs_run_lines_t *l)
{
  l->start = l->len = 0;
}

char *gs_run_lines_room(gs_run_lines_t *l, size_t *room)
{
  if (l->start > 0) {
    memmove(l->buf, l->buf + l->start, l->len - l->start);
    l->len -= l->start;
    l->start = 0;
  }
  *room = sizeof(l->buf) - l->len;
  return l->buf + l->len;
}

void gs_run_lines_add(gs_run_lines_t *l, size_t n)
{
  l->len += n;
}

bool gs_run_lines_next(gs_run_lines_t *l, bool eof, const char **line, size_t *len)
{
  const char *start = l->buf + l->start;
  size_t left = l->len - l->start;
  const char *nl = memchr(start, '\n', left);

  if (nl) {
    *line = start;
    *len = (size_t)(nl - start);
    l->start += *len + 1;
    return true;
  }
  /* A full buffer without '\n' (only possible from the front: room()
   * compacts before every read) goes out as it is. */
  if (left == sizeof(l->buf) || (eof && left > 0)) {
    *line = start;
    *len = left;
    l->start = l->len;
    return true;
  }
  return false;
}

size_t gs_run_prefix_line(char *out, size_t cap, const char *prefix, const char *line, size_t len)
{
  size_t p = strlen(prefix);

  if (p > cap - 1)
    p = cap - 1;
  if (len > cap - 1 - p)
    len = cap - 1 - p;
  memcpy(out, prefix, p);
  memcpy(out + p, line, len);
  out[p + len] = '\n';
  return p + len + 1;
}
