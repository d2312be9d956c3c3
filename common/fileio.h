/* Whole writes to a file descriptor. */
#ifndef GS_FILEIO_H
#define GS_FILEIO_H

#include <stddef.h>

/* Writes all `len` bytes (in pieces of at most 1 GiB, retrying EINTR);
 * 0, or -1 with errno set (ENOSPC for a write that wrote nothing). */
int gs_write_all(int fd, const void *buf, size_t len);

#endif
