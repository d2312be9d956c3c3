/* Shared-memory byte pipe (see comm_shm.h). */
#include "comm_shm.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define PIPE_BYTES (4u << 20) /* ring capacity: a power of two */
/* Offer bytes [0, 32): the path the reader opens; [32, 48): the identity
 * of the writer's /dev/shm; [48, 64): the cookie. */
#define PATH_LEN 32
#define SHM_ID_AT 32
#define COOKIE_AT 48

/* The segment's head. The writer owns `head` (bytes written so far), the
 * reader `tail` (bytes read); each on its own cache line. */
typedef struct shm_header {
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint32_t reader_asleep;
  _Atomic uint32_t writer_asleep;
  uint64_t cookie[2];
  _Alignas(64) uint8_t data[];
} shm_header_t;

struct gs_shm_pipe {
  shm_header_t *h;
  size_t map_len;
  int fd; /* writer: the memfd, open while the offer stands; else -1 */
};

static gs_shm_pipe_t *map_segment(int fd)
{
  gs_shm_pipe_t *p = calloc(1, sizeof(*p));
  size_t len = sizeof(shm_header_t) + PIPE_BYTES;

  if (!p)
    return NULL;
  p->h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p->h == MAP_FAILED) {
    free(p);
    return NULL;
  }
  p->map_len = len;
  p->fd = -1;
  return p;
}

/* What says two processes share a machine's shared memory: the device
 * and inode of their /dev/shm (a container, or a test's node, with a
 * /dev/shm of its own stays on TCP, as when segments lived there). */
static void shm_identity(uint64_t id[2])
{
  struct stat st;

  id[0] = id[1] = 0;
  if (stat("/dev/shm", &st) == 0) {
    id[0] = (uint64_t)st.st_dev;
    id[1] = (uint64_t)st.st_ino;
  }
}

gs_shm_pipe_t *gs__shm_create(uint8_t offer[GS_SHM_OFFER_LEN])
{
  uint64_t rnd[2], id[2];
  char path[PATH_LEN];
  gs_shm_pipe_t *p;
  int fd, n;

  memset(offer, 0, GS_SHM_OFFER_LEN);
  if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
    return NULL;
  /* No name in any file system: the segment lives as long as a descriptor
   * or a mapping of it, so a process killed at any point leaks nothing. */
  fd = memfd_create("gradsync-pipe", MFD_CLOEXEC);
  if (fd < 0)
    return NULL;
  n = snprintf(path, sizeof(path), "/proc/%ld/fd/%d", (long)getpid(), fd);
  if (n < 0 || (size_t)n >= sizeof(path) ||
      ftruncate(fd, (off_t)(sizeof(shm_header_t) + PIPE_BYTES)) != 0 || !(p = map_segment(fd))) {
    close(fd);
    return NULL;
  }
  p->fd = fd;
  p->h->cookie[0] = rnd[0];
  p->h->cookie[1] = rnd[1];
  shm_identity(id);
  memcpy(offer, path, (size_t)n);
  memcpy(offer + SHM_ID_AT, id, sizeof(id));
  memcpy(offer + COOKIE_AT, p->h->cookie, sizeof(p->h->cookie));
  return p;
}

gs_shm_pipe_t *gs__shm_open(const uint8_t offer[GS_SHM_OFFER_LEN])
{
  char path[PATH_LEN];
  uint64_t id[2];
  gs_shm_pipe_t *p;
  struct stat st;
  int fd;

  memcpy(path, offer, PATH_LEN);
  path[PATH_LEN - 1] = '\0';
  shm_identity(id);
  if (strncmp(path, "/proc/", 6) != 0 || memcmp(offer + SHM_ID_AT, id, sizeof(id)) != 0)
    return NULL;
  /* The writer's descriptor, reopened (same user, so /proc lets us).
   * Non-blocking and checked: on another host the path may name anything. */
  fd = open(path, O_RDWR | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (size_t)st.st_size != sizeof(shm_header_t) + PIPE_BYTES) {
    close(fd);
    return NULL;
  }
  p = map_segment(fd);
  close(fd);
  if (p && memcmp(p->h->cookie, offer + COOKIE_AT, sizeof(p->h->cookie)) != 0) {
    gs__shm_close(p);
    return NULL;
  }
  return p;
}

void gs__shm_close_offer(gs_shm_pipe_t *p)
{
  if (p && p->fd >= 0) {
    close(p->fd);
    p->fd = -1;
  }
}

void gs__shm_close(gs_shm_pipe_t *p)
{
  if (!p)
    return;
  gs__shm_close_offer(p);
  munmap(p->h, p->map_len);
  free(p);
}

/* Copies n bytes between the ring at byte position `pos` and `buf`, in
 * two pieces where the ring wraps. */
static void ring_copy(shm_header_t *h, uint64_t pos, void *buf, size_t n, bool into_ring)
{
  size_t at = (size_t)(pos & (PIPE_BYTES - 1)), first = PIPE_BYTES - at;

  if (first > n)
    first = n;
  if (into_ring) {
    memcpy(h->data + at, buf, first);
    memcpy(h->data, (uint8_t *)buf + first, n - first);
  } else {
    memcpy(buf, h->data + at, first);
    memcpy((uint8_t *)buf + first, h->data, n - first);
  }
}

size_t gs__shm_write(gs_shm_pipe_t *p, const void *src, size_t len, bool *wake)
{
  shm_header_t *h = p->h;
  uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
  uint64_t room = PIPE_BYTES - (head - atomic_load_explicit(&h->tail, memory_order_acquire));
  size_t n = len < room ? len : (size_t)room;

  *wake = false;
  if (n == 0)
    return 0;
  ring_copy(h, head, (void *)src, n, true);
  atomic_store(&h->head, head + n); /* seq_cst: ordered before the check below */
  *wake = atomic_exchange(&h->reader_asleep, 0) != 0;
  return n;
}

size_t gs__shm_read(gs_shm_pipe_t *p, void *dst, size_t len, bool *wake)
{
  shm_header_t *h = p->h;
  uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
  uint64_t avail = atomic_load_explicit(&h->head, memory_order_acquire) - tail;
  size_t n = len < avail ? len : (size_t)avail;

  *wake = false;
  if (n == 0)
    return 0;
  ring_copy(h, tail, dst, n, false);
  atomic_store(&h->tail, tail + n);
  *wake = atomic_exchange(&h->writer_asleep, 0) != 0;
  return n;
}

bool gs__shm_reader_may_sleep(gs_shm_pipe_t *p)
{
  atomic_store(&p->h->reader_asleep, 1);
  if (atomic_load(&p->h->head) == atomic_load(&p->h->tail))
    return true;
  atomic_store(&p->h->reader_asleep, 0);
  return false;
}

bool gs__shm_writer_may_sleep(gs_shm_pipe_t *p)
{
  atomic_store(&p->h->writer_asleep, 1);
  if (atomic_load(&p->h->head) - atomic_load(&p->h->tail) == PIPE_BYTES)
    return true;
  atomic_store(&p->h->writer_asleep, 0);
  return false;
}

void gs__shm_reader_awake(gs_shm_pipe_t *p)
{
  atomic_store(&p->h->reader_asleep, 0);
}

void gs__shm_writer_awake(gs_shm_pipe_t *p)
{
  atomic_store(&p->h->writer_asleep, 0);
}
