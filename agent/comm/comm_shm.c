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
#define NAME_LEN 48           /* offer bytes [0, 48): the name; [48, 64): the cookie */

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
  char name[NAME_LEN];
  bool linked; /* writer: the name still exists */
};

static gs_shm_pipe_t *map_segment(int fd, const char *name)
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
  snprintf(p->name, sizeof(p->name), "%s", name);
  return p;
}

gs_shm_pipe_t *gs__shm_create(uint8_t offer[GS_SHM_OFFER_LEN])
{
  uint64_t rnd[3];
  char name[NAME_LEN];
  gs_shm_pipe_t *p;
  int fd;

  memset(offer, 0, GS_SHM_OFFER_LEN);
  if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
    return NULL;
  snprintf(name, sizeof(name), "/gradsync-%ld-%016llx", (long)getpid(), (unsigned long long)rnd[0]);
  fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return NULL;
  if (ftruncate(fd, (off_t)(sizeof(shm_header_t) + PIPE_BYTES)) != 0) {
    close(fd);
    shm_unlink(name);
    return NULL;
  }
  p = map_segment(fd, name);
  close(fd);
  if (!p) {
    shm_unlink(name);
    return NULL;
  }
  p->linked = true;
  p->h->cookie[0] = rnd[1];
  p->h->cookie[1] = rnd[2];
  memcpy(offer, name, strlen(name));
  memcpy(offer + NAME_LEN, p->h->cookie, sizeof(p->h->cookie));
  return p;
}

gs_shm_pipe_t *gs__shm_open(const uint8_t offer[GS_SHM_OFFER_LEN])
{
  char name[NAME_LEN];
  gs_shm_pipe_t *p;
  struct stat st;
  int fd;

  memcpy(name, offer, NAME_LEN);
  name[NAME_LEN - 1] = '\0';
  if (name[0] != '/')
    return NULL;
  fd = shm_open(name, O_RDWR, 0);
  if (fd < 0)
    return NULL;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != sizeof(shm_header_t) + PIPE_BYTES) {
    close(fd);
    return NULL;
  }
  p = map_segment(fd, name);
  close(fd);
  if (p && memcmp(p->h->cookie, offer + NAME_LEN, sizeof(p->h->cookie)) != 0) {
    gs__shm_close(p);
    return NULL;
  }
  return p;
}

void gs__shm_unlink(gs_shm_pipe_t *p)
{
  if (p && p->linked) {
    shm_unlink(p->name);
    p->linked = false;
  }
}

void gs__shm_close(gs_shm_pipe_t *p)
{
  if (!p)
    return;
  gs__shm_unlink(p);
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
