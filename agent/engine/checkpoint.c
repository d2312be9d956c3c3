/* Checkpoint files: float32 buffers streamed under a running CRC-32 into a
 * temporary file that is fsynced and renamed into place, and a loader that
 * verifies a whole file before it touches the caller's buffers (format:
 * docs/checkpoint.md). */
#include "checkpoint.h"
#include "why.h"
#include "byteorder.h"
#include "fileio.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* The data is written and read as it lies in memory. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoint.c stores float32 data as it lies in memory: it needs a little-endian host"
#endif
_Static_assert(sizeof(float) == 4, "checkpoints store IEEE 754 binary32 floats");

#define CKPT_MAGIC "GSCKPT\0\1"    /* 8 bytes */
#define CKPT_END_MAGIC "GSCKEND\0" /* 8 bytes */
#define CKPT_VERSION 1             /* no layout description */
#define CKPT_VERSION_DESC 2        /* a layout description after the buffers */
#define CKPT_VERSION_WORLD 3       /* and the world size after the description */
#define CKPT_VERSION_SAMPLE 4      /* and the in-epoch sample offset after it */
#define CKPT_VERSION_OPTIM 5       /* and the optimizer's step count after it */
#define CKPT_VERSION_EXTRA 6       /* and a front end's bytes after it */
#define DESC_LEN 4                 /* u32 length of the description */
#define WORLD_LEN 4                /* u32 world size */
#define SAMPLE_LEN 8               /* u64 sample offset */
#define OPTIM_LEN 8                /* u64 optimizer steps */
#define EXTRA_LEN 8                /* u64 length of the front end's bytes */
#define HDR_LEN 48
#define COUNT_LEN 8
#define TRAILER_LEN 12             /* u32 CRC-32, then the end magic */
#define SCRATCH_LEN (1u << 20)     /* verification pass read size */
#define IO_CHUNK ((size_t)1 << 30) /* largest single read or write */
#define MAX_FILE_BYTES ((uint64_t)INT64_MAX)

/* What the fixed header holds, decoded. */
struct ckpt_hdr {
  uint32_t version;
  uint32_t world_size; /* version 3 on; else 0 */
  uint32_t nbuf;
  uint64_t step;
  uint64_t epoch;
  uint64_t rng_state;
  uint64_t layout_hash;
  uint64_t sample;      /* version 4; else 0 */
  uint64_t optim_steps; /* version 5; else step */
  uint64_t extra_len;   /* version 6; else 0 */
};

/* Records that system call `call` failed on `path` (errno must still be
 * the call's) and converts the errno. */
static int sys_fail(char *why, size_t why_len, const char *path, const char *call)
{
  int e = errno;

  gs_set_why(why, why_len, "%s: %s: %s", path, call, strerror(e));
  return gs_err_from_errno(e);
}

static uint32_t crc_update(uint32_t crc, const void *p, size_t len)
{
  return len ? (uint32_t)crc32_z(crc, p, len) : crc;
}

/* Whether `name` is exactly what save calls the checkpoint of some step
 * ("ckpt-" + the step, zero-padded to 12 digits, + ".gsck"). */
static bool parse_name(const char *name, uint64_t *step)
{
  char canon[64];
  unsigned long long v;
  char *end;

  if (strncmp(name, "ckpt-", 5) != 0 || !isdigit((unsigned char)name[5]))
    return false;
  errno = 0;
  v = strtoull(name + 5, &end, 10);
  if (errno != 0 || strcmp(end, ".gsck") != 0)
    return false;
  snprintf(canon, sizeof(canon), "ckpt-%012llu.gsck", v);
  if (strcmp(canon, name) != 0)
    return false;
  *step = v;
  return true;
}

/* Formats DIR/ckpt-STEP.gsck (or DIR/.ckpt-STEP.tmp); false if it does not
 * fit in `len`. */
static bool ckpt_path(char *out, size_t len, const char *dir, uint64_t step, bool tmp)
{
  const char *sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
  unsigned long long s = step;
  int n;

  if (tmp)
    n = snprintf(out, len, "%s%s.ckpt-%012llu.tmp", dir, sep, s);
  else
    n = snprintf(out, len, "%s%sckpt-%012llu.gsck", dir, sep, s);
  return n >= 0 && (size_t)n < len;
}

/* Checks that the caller's state is usable and that the file it implies
 * stays below 2^63 bytes, so no size computed from it can overflow. */
static int check_state(const gs_ckpt_state_t *st, char *why, size_t why_len)
{
  uint64_t total = HDR_LEN + TRAILER_LEN;

  if (!st) {
    gs_set_why(why, why_len, "no checkpoint state given");
    return GS_EINVAL;
  }
  if (st->desc && strlen(st->desc) > GS_CKPT_DESC_MAX) {
    gs_set_why(why, why_len, "checkpoint layout description of %zu bytes (at most %d)",
               strlen(st->desc), GS_CKPT_DESC_MAX);
    return GS_EINVAL;
  }
  if (st->nbuf && !st->bufs) {
    gs_set_why(why, why_len, "checkpoint state has %u buffers but no buffer list", st->nbuf);
    return GS_EINVAL;
  }
  for (uint32_t i = 0; i < st->nbuf; i++) {
    uint64_t count = st->bufs[i].count;

    if (count && !st->bufs[i].data) {
      gs_set_why(why, why_len, "checkpoint buffer %u has %llu elements but no data", i,
                 (unsigned long long)count);
      return GS_EINVAL;
    }
    if (count > (MAX_FILE_BYTES - total - COUNT_LEN) / sizeof(float)) {
      gs_set_why(why, why_len, "checkpoint buffer %u: %llu elements is too many", i,
                 (unsigned long long)count);
      return GS_ERANGE;
    }
    total += COUNT_LEN + count * sizeof(float);
  }
  if (total > MAX_FILE_BYTES - DESC_LEN - GS_CKPT_DESC_MAX - WORLD_LEN - SAMPLE_LEN - OPTIM_LEN) {
    gs_set_why(why, why_len, "checkpoint too large");
    return GS_ERANGE;
  }
  return 0;
}

/* Creates `dir` and any missing parents with mode 0755, like mkdir -p. */
static int mkdir_p(const char *dir, char *why, size_t why_len)
{
  char buf[PATH_MAX];
  size_t len = strlen(dir);
  struct stat sb;

  if (len >= sizeof(buf)) {
    gs_set_why(why, why_len, "%s: path too long", dir);
    return GS_EINVAL;
  }
  memcpy(buf, dir, len + 1);
  for (char *p = buf + 1;; p++) {
    char c = *p;

    if (c != '/' && c != '\0')
      continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
      int e = errno;

      /* Some file systems refuse mkdir of an existing directory with
       * EACCES or EROFS rather than EEXIST. */
      if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        errno = e;
        return sys_fail(why, why_len, buf, "mkdir");
      }
    }
    if (c == '\0')
      break;
    *p = c;
  }
  if (stat(dir, &sb) != 0)
    return sys_fail(why, why_len, dir, "stat");
  if (!S_ISDIR(sb.st_mode)) {
    gs_set_why(why, why_len, "%s: not a directory", dir);
    return GS_EINVAL;
  }
  return 0;
}

int gs_checkpoint_dir_check(const char *dir, char *why, size_t why_len)
{
  char probe[PATH_MAX];
  int fd, err, n;

  if (!dir || !*dir)
    return gs_why(GS_EINVAL, why, why_len, "no checkpoint directory given");
  err = mkdir_p(dir, why, why_len);
  if (err)
    return err;
  /* A name the loader never reads, unique even among ranks that are
   * threads of one process (mkstemp). */
  n = snprintf(probe, sizeof(probe), "%s/.ckpt-probe-XXXXXX", dir);
  if (n < 0 || (size_t)n >= sizeof(probe))
    return gs_why(GS_EINVAL, why, why_len, "%s: path too long", dir);
  fd = mkstemp(probe);
  if (fd < 0)
    return sys_fail(why, why_len, probe, "mkstemp");
  close(fd);
  if (unlink(probe) != 0)
    return sys_fail(why, why_len, probe, "unlink");
  return 0;
}

/* Writes all of buf (retrying short writes and EINTR) and folds it into
 * *crc; -1 with errno set on failure. */
static int write_all(int fd, const void *buf, size_t len, uint32_t *crc)
{
  *crc = crc_update(*crc, buf, len);
  return gs_write_all(fd, buf, len);
}

/* Streams header, buffers and trailer of `st` into the open file `fd`
 * (named `path`), computing the CRC as it goes. */
static int write_body(int fd, const char *path, const gs_ckpt_state_t *st, char *why,
                      size_t why_len)
{
  uint8_t hdr[HDR_LEN], count[COUNT_LEN], trailer[TRAILER_LEN];
  uint32_t crc = 0, unused = 0;

  memcpy(hdr, CKPT_MAGIC, 8);
  gs_store_le32(hdr + 8, st->world_size ? CKPT_VERSION_EXTRA
                         : st->desc     ? CKPT_VERSION_DESC
                                        : CKPT_VERSION);
  gs_store_le32(hdr + 12, st->nbuf);
  gs_store_le64(hdr + 16, st->step);
  gs_store_le64(hdr + 24, st->epoch);
  gs_store_le64(hdr + 32, st->rng_state);
  gs_store_le64(hdr + 40, st->layout_hash);
  if (write_all(fd, hdr, sizeof(hdr), &crc) != 0)
    return sys_fail(why, why_len, path, "write");
  for (uint32_t i = 0; i < st->nbuf; i++) {
    const gs_ckpt_buffer_t *b = &st->bufs[i];

    gs_store_le64(count, b->count);
    if (write_all(fd, count, sizeof(count), &crc) != 0 ||
        write_all(fd, b->data, b->count * sizeof(float), &crc) != 0)
      return sys_fail(why, why_len, path, "write");
  }
  if (st->desc || st->world_size) {
    const char *desc = st->desc ? st->desc : "";
    uint8_t len[DESC_LEN];

    gs_store_le32(len, (uint32_t)strlen(desc));
    if (write_all(fd, len, sizeof(len), &crc) != 0 || write_all(fd, desc, strlen(desc), &crc) != 0)
      return sys_fail(why, why_len, path, "write");
  }
  if (st->world_size) {
    uint8_t world[WORLD_LEN + SAMPLE_LEN + OPTIM_LEN];

    gs_store_le32(world, st->world_size);
    gs_store_le64(world + WORLD_LEN, st->sample);
    gs_store_le64(world + WORLD_LEN + SAMPLE_LEN, st->optim_steps);
    if (write_all(fd, world, sizeof(world), &crc) != 0)
      return sys_fail(why, why_len, path, "write");
    gs_store_le64(world, st->extra_len);
    if (write_all(fd, world, EXTRA_LEN, &crc) != 0 ||
        (st->extra_len && write_all(fd, st->extra, st->extra_len, &crc) != 0))
      return sys_fail(why, why_len, path, "write");
  }
  gs_store_le32(trailer, crc);
  memcpy(trailer + 4, CKPT_END_MAGIC, 8);
  if (write_all(fd, trailer, sizeof(trailer), &unused) != 0)
    return sys_fail(why, why_len, path, "write");
  return 0;
}

/* Makes the directory entries of `dir` (a rename, here) durable. */
static int fsync_dir(const char *dir, char *why, size_t why_len)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = 0;

  if (fd < 0)
    return sys_fail(why, why_len, dir, "open");
  if (fsync(fd) != 0)
    err = sys_fail(why, why_len, dir, "fsync");
  close(fd);
  return err;
}

static int cmp_desc(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

  return x < y ? 1 : x > y ? -1 : 0;
}

/* Collects the steps of the checkpoints in `dir`, newest first (only
 * canonically named ckpt-*.gsck entries count). Caller frees *steps. */
static int list_steps(const char *dir, uint64_t **steps, size_t *n, char *why, size_t why_len)
{
  DIR *d = opendir(dir);
  size_t cap = 0, cnt = 0;
  uint64_t *v = NULL;
  struct dirent *de;
  int err = 0;

  *steps = NULL;
  *n = 0;
  if (!d)
    return sys_fail(why, why_len, dir, "opendir");
  for (;;) {
    uint64_t step;

    errno = 0;
    de = readdir(d);
    if (!de)
      break;
    if (!parse_name(de->d_name, &step))
      continue;
    if (cnt == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      uint64_t *nv = realloc(v, ncap * sizeof(*nv));

      if (!nv) {
        gs_set_why(why, why_len, "%s: out of memory listing checkpoints", dir);
        err = GS_ENOMEM;
        goto out_free;
      }
      v = nv;
      cap = ncap;
    }
    v[cnt++] = step;
  }
  if (errno != 0) {
    err = sys_fail(why, why_len, dir, "readdir");
    goto out_free;
  }
  closedir(d);
  if (cnt)
    qsort(v, cnt, sizeof(*v), cmp_desc);
  *steps = v;
  *n = cnt;
  return 0;

out_free:
  free(v);
  closedir(d);
  return err;
}

/* Retention after saving `step`: keeps that file and the keep - 1 newest
 * older ones, and deletes the rest of the older ones. Files numbered above
 * `step` (say, from a run abandoned after a restore) are not "older" and
 * stay. Tries every deletion and reports the first failure. */
static int prune(const char *dir, uint64_t step, uint32_t keep, char *why, size_t why_len)
{
  char path[PATH_MAX];
  uint32_t kept = 1;
  uint64_t *steps;
  size_t n;
  int err;

  err = list_steps(dir, &steps, &n, why, why_len);
  if (err)
    return err;
  for (size_t i = 0; i < n; i++) {
    if (steps[i] >= step)
      continue;
    if (kept < keep) {
      kept++;
      continue;
    }
    if (!ckpt_path(path, sizeof(path), dir, steps[i], false))
      continue; /* cannot happen: the saved file's path fitted */
    if (unlink(path) != 0 && errno != ENOENT && !err)
      err = sys_fail(why, why_len, path, "unlink (removing an old checkpoint)");
  }
  free(steps);
  return err;
}

/* Creates the temporary file `tmp` afresh: O_EXCL (which also refuses to
 * follow a symlink at the name) and O_NOFOLLOW, so whatever lies there (a
 * stale file of a crashed save, or a symlink someone planted to make us
 * overwrite its target) is unlinked, never written through, and the file
 * is created again. -1 with errno set on failure. */
static int open_tmp(const char *tmp)
{
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(tmp, flags, 0644);

  if (fd >= 0 || errno != EEXIST)
    return fd;
  if (unlink(tmp) != 0 && errno != ENOENT)
    return -1;
  return open(tmp, flags, 0644);
}

/* The checks save and load share; clears `path` first. */
static int check_args(const char *dir, const gs_ckpt_state_t *st, char *path, size_t path_len,
                      char *why, size_t why_len)
{
  if (path && path_len)
    path[0] = '\0';
  if (!dir || !*dir) {
    gs_set_why(why, why_len, "no checkpoint directory given");
    return GS_EINVAL;
  }
  return check_state(st, why, why_len);
}

int gs_checkpoint_save(const char *dir, const gs_ckpt_state_t *st, uint32_t keep, char *path,
                       size_t path_len, char *why, size_t why_len)
{
  char tmp[PATH_MAX], final[PATH_MAX];
  int fd, err;

  err = check_args(dir, st, path, path_len, why, why_len);
  if (err)
    return err;
  if (!ckpt_path(tmp, sizeof(tmp), dir, st->step, true) ||
      !ckpt_path(final, sizeof(final), dir, st->step, false)) {
    gs_set_why(why, why_len, "%s: checkpoint path too long", dir);
    return GS_EINVAL;
  }
  err = mkdir_p(dir, why, why_len);
  if (err)
    return err;
  fd = open_tmp(tmp);
  if (fd < 0)
    return sys_fail(why, why_len, tmp, "open");
  err = write_body(fd, tmp, st, why, why_len);
  if (!err && fsync(fd) != 0)
    err = sys_fail(why, why_len, tmp, "fsync");
  if (close(fd) != 0 && !err)
    err = sys_fail(why, why_len, tmp, "close");
  if (err)
    goto out_unlink_tmp;
  if (rename(tmp, final) != 0) {
    gs_set_why(why, why_len, "%s: rename to %s: %s", tmp, final, strerror(errno));
    err = gs_err_from_errno(errno);
    goto out_unlink_tmp;
  }
  if (path && path_len)
    snprintf(path, path_len, "%s", final);
  err = fsync_dir(dir, why, why_len);
  if (err)
    return err;
  return keep ? prune(dir, st->step, keep, why, why_len) : 0;

out_unlink_tmp:
  unlink(tmp);
  return err;
}

/* Reads len bytes at *off, advancing it and folding them into *crc. A file
 * that ends early changed under us (its size was checked already). */
static int read_span(int fd, const char *path, void *buf, size_t len, uint64_t *off, uint32_t *crc,
                     char *why, size_t why_len)
{
  uint8_t *p = buf;
  size_t done = 0;

  while (done < len) {
    size_t want = len - done < IO_CHUNK ? len - done : IO_CHUNK;
    ssize_t n = pread(fd, p + done, want, (off_t)(*off + done));

    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return sys_fail(why, why_len, path, "read");
    if (n == 0) {
      gs_set_why(why, why_len, "%s: shrank while being read (ends at %llu bytes)", path,
                 (unsigned long long)(*off + done));
      return GS_EIO;
    }
    done += (size_t)n;
  }
  *crc = crc_update(*crc, buf, len);
  *off += len;
  return 0;
}

/* Where a version-2 file's layout description lies (*at) and its length:
 * walks the counts from the header on, each bounded only by the file size.
 * False when the file cannot hold what its counts say. */
static bool find_desc(int fd, const char *path, uint64_t size, uint32_t nbuf, uint64_t *at,
                      uint32_t *len)
{
  uint64_t need = HDR_LEN, off, body = size - TRAILER_LEN, count;
  uint8_t raw[COUNT_LEN];
  uint32_t crc = 0;

  for (uint32_t i = 0; i < nbuf; i++) {
    off = need;
    if (need + COUNT_LEN > body || read_span(fd, path, raw, COUNT_LEN, &off, &crc, NULL, 0))
      return false;
    count = gs_load_le64(raw);
    if (count > (body - need - COUNT_LEN) / sizeof(float))
      return false;
    need += COUNT_LEN + count * sizeof(float);
  }
  off = need;
  if (need + DESC_LEN > body || read_span(fd, path, raw, DESC_LEN, &off, &crc, NULL, 0))
    return false;
  *len = gs_load_le32(raw);
  *at = need + DESC_LEN;
  return *len <= GS_CKPT_DESC_MAX && *at + *len <= body;
}

/* A good file of another layout: `what` differs. Names both layouts when
 * the file has its description (version 2) and the caller gave one. */
static int other_layout(int fd, const char *path, uint64_t size, const struct ckpt_hdr *h,
                        const gs_ckpt_state_t *st, const char *what, char *why, size_t why_len)
{
  char desc[512] = "";
  uint64_t at;
  uint32_t len, crc = 0;

  if (st->desc && h->version >= CKPT_VERSION_DESC &&
      find_desc(fd, path, size, h->nbuf, &at, &len)) {
    len = len < sizeof(desc) - 1 ? len : (uint32_t)sizeof(desc) - 1;
    if (read_span(fd, path, desc, len, &at, &crc, NULL, 0) == 0)
      desc[len] = '\0';
    for (char *c = desc; *c; c++)
      *c = (unsigned char)*c < 0x20 ? '?' : *c; /* one line, whatever the file holds */
  }
  if (desc[0])
    gs_set_why(why, why_len, "%s: another model: the checkpoint has %s, the model has %s (%s)",
               path, desc, st->desc, what);
  else
    gs_set_why(why, why_len, "%s: %s", path, what);
  return GS_EPRECOND;
}

/* Reads the `len`-byte field (at most HDR_LEN) at *need into `raw` and
 * moves *need past it; a file of `size` bytes whose trailer leaves no room
 * for it is truncated, ending before `what`. */
static int read_field(int fd, const char *path, uint64_t size, uint64_t *need, size_t len,
                      const char *what, uint8_t *raw, char *why, size_t why_len)
{
  uint64_t off = *need;
  uint32_t crc = 0; /* unused here: stream_crc computes the real one */
  int err;

  if (*need + len > size - TRAILER_LEN) {
    gs_set_why(why, why_len, "%s: truncated (%llu bytes, ends before %s)", path,
               (unsigned long long)size, what);
    return GS_EPROTO;
  }
  err = read_span(fd, path, raw, len, &off, &crc, why, why_len);
  if (!err)
    *need += len;
  return err;
}

/* Checks the header, the buffer list and the size of the open file `fd`
 * against what `st` expects, reading only the header, the counts and the
 * trailer; fills *h and the stored CRC. Counts are only ever compared with
 * the expected ones, never used to size anything. */
static int check_layout(int fd, const char *path, uint64_t size, const gs_ckpt_state_t *st,
                        struct ckpt_hdr *h, uint32_t *file_crc, char *why, size_t why_len)
{
  uint8_t raw[HDR_LEN], trailer[TRAILER_LEN];
  char what[160];
  uint64_t off = 0, need = HDR_LEN;
  uint32_t crc = 0; /* unused here: stream_crc computes the real one */
  int err;

  if (size < HDR_LEN + TRAILER_LEN) {
    gs_set_why(why, why_len, "%s: truncated (%llu bytes, a checkpoint has at least %d)", path,
               (unsigned long long)size, HDR_LEN + TRAILER_LEN);
    return GS_EPROTO;
  }
  err = read_span(fd, path, raw, HDR_LEN, &off, &crc, why, why_len);
  if (err)
    return err;
  if (memcmp(raw, CKPT_MAGIC, 8) != 0) {
    gs_set_why(why, why_len, "%s: bad magic (not a gradsync checkpoint)", path);
    return GS_EPROTO;
  }
  *h = (struct ckpt_hdr){gs_load_le32(raw + 8),
                         0,
                         gs_load_le32(raw + 12),
                         gs_load_le64(raw + 16),
                         gs_load_le64(raw + 24),
                         gs_load_le64(raw + 32),
                         gs_load_le64(raw + 40),
                         0,
                         0,
                         0};
  if (h->version < CKPT_VERSION || h->version > CKPT_VERSION_EXTRA) {
    gs_set_why(why, why_len, "%s: format version %u, this build reads versions %d to %d", path,
               h->version, CKPT_VERSION, CKPT_VERSION_EXTRA);
    return GS_EPROTO;
  }
  if (h->layout_hash != st->layout_hash) {
    snprintf(what, sizeof(what), "layout hash 0x%016llx differs from the expected 0x%016llx",
             (unsigned long long)h->layout_hash, (unsigned long long)st->layout_hash);
    return other_layout(fd, path, size, h, st, what, why, why_len);
  }
  if (h->nbuf != st->nbuf) {
    snprintf(what, sizeof(what), "%u buffers, expected %u", h->nbuf, st->nbuf);
    return other_layout(fd, path, size, h, st, what, why, why_len);
  }
  for (uint32_t i = 0; i < h->nbuf; i++) {
    uint8_t count_raw[COUNT_LEN];
    uint64_t count;

    if (need + COUNT_LEN > size - TRAILER_LEN) {
      gs_set_why(why, why_len, "%s: truncated (%llu bytes, ends before buffer %u)", path,
                 (unsigned long long)size, i);
      return GS_EPROTO;
    }
    off = need;
    err = read_span(fd, path, count_raw, COUNT_LEN, &off, &crc, why, why_len);
    if (err)
      return err;
    count = gs_load_le64(count_raw);
    if (count != st->bufs[i].count) {
      snprintf(what, sizeof(what), "buffer %u has %llu elements, expected %llu", i,
               (unsigned long long)count, (unsigned long long)st->bufs[i].count);
      return other_layout(fd, path, size, h, st, what, why, why_len);
    }
    need += COUNT_LEN + count * sizeof(float); /* bounded by check_state */
  }
  if (h->version >= CKPT_VERSION_DESC) {
    uint32_t len;

    err = read_field(fd, path, size, &need, DESC_LEN, "the layout description", raw, why, why_len);
    if (err)
      return err;
    len = gs_load_le32(raw);
    if (len > GS_CKPT_DESC_MAX) {
      gs_set_why(why, why_len, "%s: layout description of %u bytes (at most %d)", path, len,
                 GS_CKPT_DESC_MAX);
      return GS_EPROTO;
    }
    need += len;
  }
  if (h->version >= CKPT_VERSION_WORLD) {
    err = read_field(fd, path, size, &need, WORLD_LEN, "the world size", raw, why, why_len);
    if (err)
      return err;
    h->world_size = gs_load_le32(raw);
  }
  if (h->version >= CKPT_VERSION_SAMPLE) {
    err = read_field(fd, path, size, &need, SAMPLE_LEN, "the sample offset", raw, why, why_len);
    if (err)
      return err;
    h->sample = gs_load_le64(raw);
  }
  h->optim_steps = h->step; /* before version 5 every step applied the optimizer */
  if (h->version >= CKPT_VERSION_OPTIM) {
    err = read_field(fd, path, size, &need, OPTIM_LEN, "the optimizer steps", raw, why, why_len);
    if (err)
      return err;
    h->optim_steps = gs_load_le64(raw);
  }
  if (h->version >= CKPT_VERSION_EXTRA) {
    err = read_field(fd, path, size, &need, EXTRA_LEN, "the front end's bytes", raw, why, why_len);
    if (err)
      return err;
    h->extra_len = gs_load_le64(raw);
    if (h->extra_len > size - TRAILER_LEN - need) { /* compared, never used to read past */
      gs_set_why(why, why_len, "%s: truncated (%llu bytes, ends inside the front end's %llu)", path,
                 (unsigned long long)size, (unsigned long long)h->extra_len);
      return GS_EPROTO;
    }
    need += h->extra_len;
  }
  need += TRAILER_LEN;
  if (size != need) {
    gs_set_why(why, why_len, "%s: %s (%llu bytes, header and counts say %llu)", path,
               size < need ? "truncated" : "trailing bytes", (unsigned long long)size,
               (unsigned long long)need);
    return GS_EPROTO;
  }
  off = size - TRAILER_LEN;
  err = read_span(fd, path, trailer, TRAILER_LEN, &off, &crc, why, why_len);
  if (err)
    return err;
  if (memcmp(trailer + 4, CKPT_END_MAGIC, 8) != 0) {
    gs_set_why(why, why_len, "%s: bad end magic (torn or corrupt trailer)", path);
    return GS_EPROTO;
  }
  *file_crc = gs_load_le32(trailer);
  return 0;
}

/* Reads `len` bytes at *off into `dst`, or through `scratch` (SCRATCH_LEN
 * bytes) a piece at a time when dst is NULL, adding them to the CRC. */
static int read_through(int fd, const char *path, void *dst, uint64_t len, uint8_t *scratch,
                        uint64_t *off, uint32_t *crc, char *why, size_t why_len)
{
  int err = 0;

  if (dst)
    return len ? read_span(fd, path, dst, (size_t)len, off, crc, why, why_len) : 0;
  while (!err && len > 0) {
    size_t n = len < SCRATCH_LEN ? (size_t)len : SCRATCH_LEN;

    err = read_span(fd, path, scratch, n, off, crc, why, why_len);
    len -= n;
  }
  return err;
}

/* Reads everything the CRC covers, in order, and returns that CRC. The
 * data goes to st's buffers and the front end's bytes to `extra` (of
 * `extra_len`, the file's) when `into` is set, else through `scratch` and
 * is dropped. */
static int stream_crc(int fd, const char *path, gs_ckpt_state_t *st, bool into, void *extra,
                      uint64_t extra_len, uint8_t *scratch, uint64_t body, uint32_t *crc, char *why,
                      size_t why_len)
{
  uint8_t small[HDR_LEN];
  uint64_t off = 0;
  int err;

  *crc = 0;
  err = read_span(fd, path, small, HDR_LEN, &off, crc, why, why_len);
  for (uint32_t i = 0; !err && i < st->nbuf; i++) {
    err = read_span(fd, path, small, COUNT_LEN, &off, crc, why, why_len);
    if (!err)
      err = read_through(fd, path, into ? st->bufs[i].data : NULL,
                         st->bufs[i].count * sizeof(float), scratch, &off, crc, why, why_len);
  }
  /* The layout description, the world size, the sample offset, the
   * optimizer steps and the length of the front end's bytes (versions 2
   * to 6): under 4 KiB + 28, check_layout checked; then those bytes. */
  if (!err && off + extra_len < body)
    err = read_span(fd, path, scratch, (size_t)(body - extra_len - off), &off, crc, why, why_len);
  if (!err)
    err = read_through(fd, path, into ? extra : NULL, extra_len, scratch, &off, crc, why, why_len);
  return err;
}

/* Verifies the file at `path` completely (a pass that discards the data),
 * then reads it into st's buffers, checking that the CRC comes out the
 * same: a bad file never reaches the buffers. */
static int load_one(const char *path, gs_ckpt_state_t *st, uint8_t *scratch, char *why,
                    size_t why_len)
{
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  uint32_t file_crc = 0, crc;
  struct ckpt_hdr h;
  uint64_t name_step, body;
  void *extra = NULL;
  struct stat sb;
  int fd, err;

  /* Non-blocking: a FIFO at the name is refused below, not waited on. */
  fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0)
    return sys_fail(why, why_len, path, "open");
  if (fstat(fd, &sb) != 0) {
    err = sys_fail(why, why_len, path, "fstat");
    goto out_close;
  }
  if (!S_ISREG(sb.st_mode)) {
    gs_set_why(why, why_len, "%s: not a regular file", path);
    err = GS_EPROTO;
    goto out_close;
  }
  body = (uint64_t)sb.st_size - TRAILER_LEN; /* used once check_layout passed: size >= 60 */
  err = check_layout(fd, path, (uint64_t)sb.st_size, st, &h, &file_crc, why, why_len);
  if (!err)
    err = stream_crc(fd, path, st, false, NULL, h.extra_len, scratch, body, &crc, why, why_len);
  if (err)
    goto out_close;
  if (crc != file_crc) {
    gs_set_why(why, why_len, "%s: CRC mismatch (file 0x%08x, computed 0x%08x)", path, file_crc,
               crc);
    err = GS_EPROTO;
    goto out_close;
  }
  if (parse_name(base, &name_step) && name_step != h.step) {
    gs_set_why(why, why_len, "%s: holds step %llu, not the step its name says", path,
               (unsigned long long)h.step);
    err = GS_EPROTO;
    goto out_close;
  }
  extra = malloc(h.extra_len + 1); /* at most the file's size, check_layout checked */
  if (!extra) {
    gs_set_why(why, why_len, "%s: out of memory for its %llu bytes of the front end's", path,
               (unsigned long long)h.extra_len);
    err = GS_ENOMEM;
    goto out_close;
  }
  err = stream_crc(fd, path, st, true, extra, h.extra_len, scratch, body, &crc, why, why_len);
  if (!err && crc != file_crc) {
    gs_set_why(why, why_len, "%s: changed while being loaded (CRC 0x%08x, then 0x%08x)", path,
               file_crc, crc);
    err = GS_EIO;
  }
  if (!err) {
    st->step = h.step;
    st->epoch = h.epoch;
    st->rng_state = h.rng_state;
    st->world_size = h.world_size;
    st->sample = h.sample;
    st->optim_steps = h.optim_steps;
    st->version = h.version;
    st->extra = h.extra_len ? extra : NULL;
    st->extra_len = h.extra_len;
    extra = h.extra_len ? NULL : extra;
  }
  free(extra);
out_close:
  close(fd);
  return err;
}

int gs_checkpoint_load_file(const char *path, gs_ckpt_state_t *st, char *why, size_t why_len)
{
  uint8_t *scratch;
  int err;

  if (!path || !*path) {
    gs_set_why(why, why_len, "no checkpoint path given");
    return GS_EINVAL;
  }
  err = check_state(st, why, why_len);
  if (err)
    return err;
  scratch = malloc(SCRATCH_LEN);
  if (!scratch) {
    gs_set_why(why, why_len, "%s: out of memory for the read buffer", path);
    return GS_ENOMEM;
  }
  err = load_one(path, st, scratch, why, why_len);
  free(scratch);
  return err;
}

int gs_checkpoint_load_latest(const char *dir, gs_ckpt_state_t *st, const gs_log_t *log, char *path,
                              size_t path_len, char *why, size_t why_len)
{
  char file[PATH_MAX], reason[PATH_MAX + 1024], other[PATH_MAX + 1024] = "";
  uint8_t *scratch = NULL;
  size_t n, skipped = 0;
  uint64_t *steps;
  int err;

  err = check_args(dir, st, path, path_len, why, why_len);
  if (err)
    return err;
  err = list_steps(dir, &steps, &n, why, why_len);
  if (err)
    return err;
  if (n == 0) {
    gs_set_why(why, why_len, "%s: no checkpoint files (ckpt-*.gsck)", dir);
    err = GS_ENOTFOUND;
    goto out_free_steps;
  }
  scratch = malloc(SCRATCH_LEN);
  if (!scratch) {
    gs_set_why(why, why_len, "%s: out of memory for the read buffer", dir);
    err = GS_ENOMEM;
    goto out_free_steps;
  }
  for (size_t i = 0; i < n; i++) {
    if (!ckpt_path(file, sizeof(file), dir, steps[i], false))
      continue; /* cannot happen: opendir took dir, names are short */
    err = load_one(file, st, scratch, reason, sizeof(reason));
    if (!err) {
      if (path && path_len)
        snprintf(path, path_len, "%s", file);
      goto out_free_scratch;
    }
    if (err == GS_ENOMEM) {
      gs_set_why(why, why_len, "%s", reason);
      goto out_free_scratch;
    }
    gs_log(log, GS_LOG_WARN, NULL, -1, "%s, skipped", reason);
    if (err == GS_EPRECOND && !other[0])
      snprintf(other, sizeof(other), "%s", reason);
    skipped++;
  }
  /* Checkpoints of another model are no missing checkpoint: say which. */
  if (other[0]) {
    gs_set_why(why, why_len, "%s", other);
    err = GS_EPRECOND;
  } else {
    gs_set_why(why, why_len, "%s: no valid checkpoint (%zu skipped, see the warnings)", dir,
               skipped);
    err = GS_ENOTFOUND;
  }
out_free_scratch:
  free(scratch);
out_free_steps:
  free(steps);
  return err;
}
