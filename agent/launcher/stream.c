/* One pipe from a child: reads what it has and hands each complete line to
 * the callback its owner set (lines.h decides what a line is). */
#include <errno.h>
#include <unistd.h>

#include "launcher.h"

void gs__run_stream_init(gs_run_stream_t *s, gs_run_line_fn on_line, void *data)
{
  s->fd = -1;
  s->out_fd = -1;
  s->on_line = on_line;
  s->data = data;
  gs_run_lines_init(&s->lines);
}

/* Starts reading fd (non-blocking), whose lines go to out_fd. */
void gs__run_stream_open(gs_run_stream_t *s, int fd, int out_fd)
{
  s->fd = fd;
  s->out_fd = out_fd;
  gs_run_lines_init(&s->lines);
}

/* Hands every line the buffer holds to on_line; at eof the rest too. */
static void stream_lines(gs_run_stream_t *s, bool eof)
{
  const char *line;
  size_t len;

  while (gs_run_lines_next(&s->lines, eof, &line, &len))
    s->on_line(s, line, len);
}

/* Forwards a last unterminated line and closes the pipe. */
void gs__run_stream_close(gs_run_stream_t *s)
{
  if (s->fd < 0)
    return;
  stream_lines(s, true);
  close(s->fd);
  s->fd = -1;
}

/* Reads what the pipe has (one read, to be fair to the other pipes) and
 * forwards its complete lines; closes it at EOF or on error. Returns true
 * when it read something (more may be waiting). */
bool gs__run_stream_pump(gs_run_stream_t *s)
{
  size_t room;
  char *at = gs_run_lines_room(&s->lines, &room);
  ssize_t n;

  do
    n = read(s->fd, at, room);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN)
    return false;
  if (n <= 0) {
    gs__run_stream_close(s);
    return false;
  }
  gs_run_lines_add(&s->lines, (size_t)n);
  stream_lines(s, false);
  return true;
}
