/* The launcher's own output: messages ("gradsync-run: ...") on stderr, and
 * writes that survive EINTR and non-blocking descriptors. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

/* Writes all of buf, retrying on EINTR and waiting when fd is non-blocking;
 * gives up silently on other errors (a closed stdout must not stop the run). */
void gs__run_write_all(int fd, const char *buf, size_t len)
{
  while (len > 0) {
    ssize_t n = write(fd, buf, len);

    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};

      poll(&p, 1, -1);
      continue;
    }
    if (n <= 0)
      return;
    buf += n;
    len -= (size_t)n;
  }
}

/* Prints one launcher message to stderr, "gradsync-run: ..." in one write. */
void gs__run_say(const char *fmt, ...)
{
  char line[1024];
  va_list ap;
  int n;

  n = snprintf(line, sizeof(line), "gradsync-run: ");
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof(line) - 2)
    n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  gs__run_write_all(2, line, (size_t)n);
}

const char *gs__run_signal_name(int sig, char *buf, size_t len)
{
  const char *abbrev = sigabbrev_np(sig);

  if (abbrev)
    snprintf(buf, len, "SIG%s", abbrev);
  else
    snprintf(buf, len, "signal %d", sig);
  return buf;
}

/* "exited with status 3" or "killed by signal SIGKILL", for messages. */
const char *gs__run_describe_status(int status, char *buf, size_t len)
{
  char name[32];

  if (WIFEXITED(status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "killed by signal %s%s",
             gs__run_signal_name(WTERMSIG(status), name, sizeof(name)),
             WCOREDUMP(status) ? " (core dumped)" : "");
  else
    snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
  return buf;
}
