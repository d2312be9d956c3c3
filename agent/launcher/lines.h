/* A child's output as lines, and the prefix each forwarded line gets
 * ("[rank 3] "). Pure functions of the bytes read so far: no I/O, so the
 * launcher forwards whole lines (one write each, never interleaved with
 * another rank's) and the rules are unit-tested on their own. */
#ifndef GS_RUN_LINES_H
#define GS_RUN_LINES_H

#include <stdbool.h>
#include <stddef.h>

#define GS_RUN_LINE_MAX 8192 /* a longer line is forwarded in pieces of this size */

/* Bytes read from one pipe and not yet returned as a line. */
typedef struct gs_run_lines {
  size_t start; /* first byte not yet returned */
  size_t len;   /* bytes held in buf */
  char buf[GS_RUN_LINE_MAX];
} gs_run_lines_t;

void gs_run_lines_init(gs_run_lines_t *l);

/* Where the next read goes: returns the buffer position and sets *room
 * (never 0). Moves the unreturned bytes to the front first. */
char *gs_run_lines_room(gs_run_lines_t *l, size_t *room);

/* Accounts for n bytes just read into the room (n <= room). */
void gs_run_lines_add(gs_run_lines_t *l, size_t n);

/* The next line to forward, without its '\n': a complete line, the whole
 * buffer when it is full without one (an overlong line, in pieces), or at
 * `eof` what is left. Returns false when none; *line points into l and
 * stays valid until the next gs_run_lines_room. */
bool gs_run_lines_next(gs_run_lines_t *l, bool eof, const char **line, size_t *len);

/* Writes prefix, line and '\n' into out (cap bytes, cap >= 1) and returns
 * the bytes written; a line that does not fit is cut, and the '\n' kept. */
size_t gs_run_prefix_line(char *out, size_t cap, const char *prefix, const char *line, size_t len);

#endif
