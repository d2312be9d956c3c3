/* Whole writes to a file descriptor (fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#define IO_CHUNK ((size_t)1 << 30) /* largest single write */

int gs_write_all(int fd, const void *buf, size_t len)
{
  const uint8_t *p = buf;

  while (len > 0) {
    ssize_t n = write(fd, p, len < IO_CHUNK ? len : IO_CHUNK);

    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = ENOSPC;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}
