/* IDX files, plain or gzip-compressed, and the datasets made of them. The
 * parser is a pure function of its bytes; the loader adds the file, zlib and
 * the path every error message starts with. */
#include "idx.h"
#include "why.h"
#include "byteorder.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* The largest file, compressed or not, and the largest decompressed image
 * the loader accepts: Fashion-MNIST's biggest file is 47 MB. */
#define GS_IDX_MAX_BYTES ((size_t)512 << 20)

#define GS_IDX_TYPE_UBYTE 0x08

/* Internal, declared here rather than in idx.h: the loader with its size
 * cap as a parameter, so that tests can exercise the cap cheaply. */
int gs__idx_load_capped(const char *path, size_t cap, gs_idx_t *out, char *why, size_t why_len);

/* Checks the header at the start of the `len` bytes at `b` and fills the
 * dims of `out`, its length (*header) and the data's (*bytes); reads
 * nothing past `len` and says nothing yet about the data. */
static int parse_dims(const uint8_t *b, size_t len, gs_idx_t *out, size_t *header, size_t *bytes,
                      char *why, size_t why_len)
{
  uint32_t i;

  if (len == 0)
    return gs_why(GS_EINVAL, why, why_len, "empty file (0 bytes)");
  if (len < 4)
    return gs_why(GS_EINVAL, why, why_len,
                  "truncated header: %zu bytes, an IDX file starts with 4 magic bytes", len);
  if (b[0] != 0 || b[1] != 0)
    return gs_why(GS_EINVAL, why, why_len,
                  "not an IDX file (magic starts 0x%02x 0x%02x, want 0x00 0x00)", b[0], b[1]);
  if (b[2] != GS_IDX_TYPE_UBYTE)
    return gs_why(GS_EINVAL, why, why_len,
                  "unsupported IDX data type 0x%02x (only 0x08, unsigned byte, is supported)",
                  b[2]);
  if (b[3] < 1 || b[3] > 4)
    return gs_why(GS_EINVAL, why, why_len, "unsupported IDX rank %u (want 1 to 4 dimensions)",
                  (unsigned)b[3]);
  out->ndims = b[3];
  *header = 4 + 4 * (size_t)out->ndims;
  if (len < *header)
    return gs_why(GS_EINVAL, why, why_len,
                  "truncated header: %u dimensions need %zu header bytes, file has %zu", out->ndims,
                  *header, len);
  *bytes = 1;
  for (i = 0; i < out->ndims; i++) {
    out->dims[i] = gs_load_be32(b + 4 + 4 * i);
    if (__builtin_mul_overflow(*bytes, (size_t)out->dims[i], bytes))
      return gs_why(GS_EINVAL, why, why_len, "dimensions overflow: their product exceeds %zu bytes",
                    SIZE_MAX);
  }
  return 0;
}

/* Checks the header of the `len` bytes at `b` against the bytes present and
 * fills the dims of `out` and the data's offset; reads nothing past `len`. */
static int parse_header(const uint8_t *b, size_t len, gs_idx_t *out, size_t *offset, char *why,
                        size_t why_len)
{
  size_t header = 0, bytes = 0;
  int err;

  err = parse_dims(b, len, out, &header, &bytes, why, why_len);
  if (err)
    return err;
  if (len - header < bytes)
    return gs_why(GS_EINVAL, why, why_len, "truncated: header says %zu bytes of data, file has %zu",
                  bytes, len - header);
  if (len - header > bytes)
    return gs_why(GS_EINVAL, why, why_len,
                  "trailing bytes: header says %zu bytes of data, file has %zu", bytes,
                  len - header);
  *offset = header;
  return 0;
}

static size_t idx_bytes(const gs_idx_t *idx)
{
  size_t bytes = 1;
  uint32_t i;

  for (i = 0; i < idx->ndims; i++)
    bytes *= idx->dims[i];
  return bytes;
}

int gs_idx_parse(const uint8_t *bytes, size_t len, gs_idx_t *out, char *why, size_t why_len)
{
  gs_idx_t idx = {0};
  size_t offset = 0, n;
  int err;

  memset(out, 0, sizeof(*out));
  err = parse_header(bytes, len, &idx, &offset, why, why_len);
  if (err)
    return err;
  n = idx_bytes(&idx);
  idx.data = malloc(n ? n : 1);
  if (!idx.data)
    return gs_why(GS_ENOMEM, why, why_len, "out of memory for %zu bytes of IDX data", n);
  memcpy(idx.data, bytes + offset, n);
  *out = idx;
  return 0;
}

void gs_idx_free(gs_idx_t *idx)
{
  free(idx->data);
  memset(idx, 0, sizeof(*idx));
}

/* A file read as a stream of its (decompressed) bytes: the loader never
 * holds more than the image it keeps plus one chunk of each side, so a
 * small gzip that inflates to gigabytes costs no more than a chunk. */
#define CHUNK ((size_t)64 << 10)

typedef struct idx_src {
  int fd;
  bool gz;     /* inflating, else plain reads */
  bool z_open; /* `z` needs inflateEnd */
  bool in_eof; /* the file has no more bytes */
  bool z_end;  /* the last member ended */
  z_stream z;
  uint64_t used; /* compressed bytes consumed, for messages */
  uint8_t in[CHUNK];
} idx_src_t;

/* Refills the compressed input; false at the end of the file. */
static int src_fill(idx_src_t *s, char *why, size_t why_len)
{
  ssize_t n;

  do
    n = read(s->fd, s->in, sizeof(s->in));
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return gs_why(gs_err_from_errno(errno), why, why_len, "read: %s", strerror(errno));
  s->in_eof = n == 0;
  s->z.next_in = s->in;
  s->z.avail_in = (uInt)n;
  return 0;
}

/* Inflates up to `len` bytes into `buf`; *got < len only at the end of the
 * last member. Concatenated members (`cat a.gz b.gz`) are one stream. */
static int src_inflate(idx_src_t *s, uint8_t *buf, size_t len, size_t *got, char *why,
                       size_t why_len)
{
  int zr, err;

  s->z.next_out = buf;
  s->z.avail_out = (uInt)len;
  while (s->z.avail_out > 0 && !s->z_end) {
    if (s->z.avail_in == 0 && !s->in_eof && (err = src_fill(s, why, why_len)))
      return err;
    s->used += s->z.avail_in;
    zr = inflate(&s->z, Z_NO_FLUSH);
    s->used -= s->z.avail_in;
    if (zr == Z_STREAM_END) {
      if (s->z.avail_in == 0 && !s->in_eof && (err = src_fill(s, why, why_len)))
        return err;
      if (s->z.avail_in == 0 && s->in_eof)
        s->z_end = true; /* else another member follows, or garbage inflate rejects */
      else if (inflateReset(&s->z) != Z_OK)
        return gs_why(GS_EINVAL, why, why_len, "corrupt gzip stream: cannot restart zlib");
      continue;
    }
    if (zr == Z_OK)
      continue;
    if (zr == Z_BUF_ERROR && s->in_eof)
      return gs_why(GS_EINVAL, why, why_len,
                    "corrupt gzip stream: unexpected end after %llu compressed bytes",
                    (unsigned long long)s->used);
    if (zr == Z_MEM_ERROR)
      return gs_why(GS_ENOMEM, why, why_len, "out of memory in zlib");
    return gs_why(GS_EINVAL, why, why_len, "corrupt gzip stream at compressed byte %llu: %s",
                  (unsigned long long)s->used, s->z.msg ? s->z.msg : "unknown zlib error");
  }
  *got = len - s->z.avail_out;
  return 0;
}

/* Reads up to `len` bytes of the file's content; *got < len only at its end. */
static int src_read(idx_src_t *s, uint8_t *buf, size_t len, size_t *got, char *why, size_t why_len)
{
  size_t done = 0, part = 0;
  ssize_t n;
  int err;

  while (done < len) {
    size_t want = len - done < CHUNK ? len - done : CHUNK; /* fits a uInt */

    if (s->gz) {
      if ((err = src_inflate(s, buf + done, want, &part, why, why_len)))
        return err;
      done += part;
      if (part < want)
        break;
      continue;
    }
    n = read(s->fd, buf + done, want);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return gs_why(gs_err_from_errno(errno), why, why_len, "read: %s", strerror(errno));
    if (n == 0)
      break;
    done += (size_t)n;
  }
  *got = done;
  return 0;
}

/* Opens `path` for src_read: a regular file only (opened non-blocking, so
 * a FIFO or a device named like a data file is refused, not waited on),
 * inflated when it starts with the gzip magic. The reason has no path. */
static int src_open(idx_src_t *s, const char *path, char *why, size_t why_len)
{
  uint8_t magic[2];
  struct stat st;
  ssize_t n;

  memset(s, 0, offsetof(idx_src_t, in));
  s->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (s->fd < 0)
    return gs_why(gs_err_from_errno(errno), why, why_len, "%s", strerror(errno));
  if (fstat(s->fd, &st) != 0)
    return gs_why(GS_EIO, why, why_len, "fstat: %s", strerror(errno));
  if (!S_ISREG(st.st_mode))
    return gs_why(GS_EINVAL, why, why_len, "not a regular file (%s)",
                  S_ISDIR(st.st_mode)    ? "a directory"
                  : S_ISFIFO(st.st_mode) ? "a FIFO"
                  : S_ISSOCK(st.st_mode) ? "a socket"
                                         : "a device");
  if ((uint64_t)st.st_size > GS_IDX_MAX_BYTES)
    return gs_why(GS_ETOOBIG, why, why_len, "%lld bytes, over the limit of %zu",
                  (long long)st.st_size, GS_IDX_MAX_BYTES);
  n = pread(s->fd, magic, 2, 0);
  s->gz = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  if (s->gz) {
    if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK)
      return gs_why(GS_ENOMEM, why, why_len, "cannot start zlib: %s",
                    s->z.msg ? s->z.msg : "no memory");
    s->z_open = true;
  }
  return 0;
}

static void src_close(idx_src_t *s)
{
  if (s->z_open)
    inflateEnd(&s->z);
  if (s->fd >= 0)
    close(s->fd);
}

/* Reads the header from `s` into `out` (parse_dims' checks and messages),
 * its length into *header and the data's into *bytes. */
static int read_header(idx_src_t *s, gs_idx_t *out, size_t *header, size_t *bytes, char *why,
                       size_t why_len)
{
  uint8_t b[4 + 4 * 4];
  size_t got, more = 0;
  int err;

  if ((err = src_read(s, b, 4, &got, why, why_len)))
    return err;
  if (got == 4 && b[3] >= 1 && b[3] <= 4 &&
      (err = src_read(s, b + 4, 4 * (size_t)b[3], &more, why, why_len)))
    return err;
  return parse_dims(b, got + more, out, header, bytes, why, why_len);
}

/* Counts what follows the data, up to `cap` bytes in all, through one chunk
 * of scratch: the exact count for a message, or GS_ETOOBIG past the cap. */
static int count_trailing(idx_src_t *s, size_t have, size_t cap, size_t *total, char *why,
                          size_t why_len)
{
  uint8_t *scratch = malloc(CHUNK);
  size_t got = 0;
  int err = 0;

  if (!scratch)
    return gs_why(GS_ENOMEM, why, why_len, "out of memory");
  for (*total = have;; *total += got) {
    if ((err = src_read(s, scratch, CHUNK, &got, why, why_len)) || got == 0)
      break;
    if (*total + got > cap) {
      err =
          gs_why(GS_ETOOBIG, why, why_len, "decompresses to more than %zu bytes (the limit)", cap);
      break;
    }
  }
  free(scratch);
  return err;
}

/* gs_idx_load with the decompressed-size cap as a parameter (tests use a
 * small one). The reason on error has no path. */
static int load_stream(idx_src_t *s, size_t cap, gs_idx_t *out, char *why, size_t why_len)
{
  size_t bytes = 0, header = 0, got, total = 0;
  uint8_t probe;
  int err;

  if ((err = read_header(s, out, &header, &bytes, why, why_len)))
    return err;
  if (bytes > cap || header > cap - bytes)
    return gs_why(GS_ETOOBIG, why, why_len,
                  "header says %zu bytes of data, over the limit of %zu bytes", bytes, cap);
  out->data = malloc(bytes ? bytes : 1);
  if (!out->data)
    return gs_why(GS_ENOMEM, why, why_len, "out of memory for %zu bytes of IDX data", bytes);
  if ((err = src_read(s, out->data, bytes, &got, why, why_len)))
    return err;
  if (got < bytes)
    return gs_why(GS_EINVAL, why, why_len, "truncated: header says %zu bytes of data, file has %zu",
                  bytes, got);
  if ((err = src_read(s, &probe, 1, &got, why, why_len)) || got == 0)
    return err;
  if ((err = count_trailing(s, header + bytes + 1, cap, &total, why, why_len)))
    return err;
  return gs_why(GS_EINVAL, why, why_len,
                "trailing bytes: header says %zu bytes of data, file has %zu", bytes,
                total - header);
}

int gs__idx_load_capped(const char *path, size_t cap, gs_idx_t *out, char *why, size_t why_len)
{
  char reason[256];
  idx_src_t *s;
  int err;

  memset(out, 0, sizeof(*out));
  s = malloc(sizeof(*s));
  if (!s)
    return gs_why(GS_ENOMEM, why, why_len, "%s: out of memory", path);
  err = src_open(s, path, reason, sizeof(reason));
  if (!err)
    err = load_stream(s, cap, out, reason, sizeof(reason));
  src_close(s);
  free(s);
  if (err) {
    gs_idx_free(out);
    return gs_why(err, why, why_len, "%s: %s", path, reason);
  }
  return 0;
}

int gs_idx_load(const char *path, gs_idx_t *out, char *why, size_t why_len)
{
  return gs__idx_load_capped(path, GS_IDX_MAX_BYTES, out, why, why_len);
}

/* Puts into `path` the first of DIR/SPLIT-KIND and DIR/SPLIT-KIND.gz that
 * exists; GS_ENOTFOUND naming both when neither does. */
static int find_file(const char *dir, const char *split, const char *kind, char *path,
                     size_t path_len, char *why, size_t why_len)
{
  static const char *const suffixes[] = {"", ".gz"};
  char plain[PATH_MAX];
  int n;
  size_t i;

  for (i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
    n = snprintf(path, path_len, "%s/%s-%s%s", dir, split, kind, suffixes[i]);
    if (n < 0 || (size_t)n >= path_len)
      return gs_why(GS_EINVAL, why, why_len, "%s/%s-%s: path too long", dir, split, kind);
    if (i == 0)
      memcpy(plain, path, (size_t)n + 1);
    if (access(path, F_OK) == 0)
      return 0;
  }
  return gs_why(GS_ENOTFOUND, why, why_len, "%s: No such file or directory (nor %s)", plain, path);
}

/* Checks that the two files make a dataset: 3-D images, 1-D labels, equal
 * counts, at least one example of at least one pixel. */
static int check_shapes(const char *img_path, const gs_idx_t *img, const char *lbl_path,
                        const gs_idx_t *lbl, char *why, size_t why_len)
{
  if (img->ndims != 3)
    return gs_why(GS_EINVAL, why, why_len,
                  "%s: images have %u dimensions, want 3 (count, rows, cols)", img_path,
                  img->ndims);
  if (lbl->ndims != 1)
    return gs_why(GS_EINVAL, why, why_len, "%s: labels have %u dimensions, want 1 (count)",
                  lbl_path, lbl->ndims);
  if (img->dims[0] != lbl->dims[0])
    return gs_why(GS_EINVAL, why, why_len, "%s has %u images but %s has %u labels", img_path,
                  img->dims[0], lbl_path, lbl->dims[0]);
  if (img->dims[0] == 0)
    return gs_why(GS_EINVAL, why, why_len, "%s: no examples", img_path);
  if (img->dims[1] == 0 || img->dims[2] == 0)
    return gs_why(GS_EINVAL, why, why_len, "%s: empty images of %u x %u pixels", img_path,
                  img->dims[1], img->dims[2]);
  if ((uint64_t)img->dims[1] * img->dims[2] > UINT32_MAX)
    return gs_why(GS_EINVAL, why, why_len, "%s: images of %u x %u pixels are too large", img_path,
                  img->dims[1], img->dims[2]);
  return 0;
}

/* Fills `out`'s shape and label statistics from checked image and label files. */
static void fill_dataset(const gs_idx_t *img, const gs_idx_t *lbl, gs_dataset_t *out)
{
  size_t i;
  uint8_t max = 0;

  out->count = img->dims[0];
  out->features = img->dims[1] * img->dims[2];
  for (i = 0; i < out->count; i++)
    if (lbl->data[i] > max) {
      max = lbl->data[i];
      out->max_at = (uint32_t)i;
    }
  out->classes = (uint32_t)max + 1;
}

int gs_dataset_load(const char *dir, const char *split, uint32_t features, gs_dataset_t *out,
                    char *why, size_t why_len)
{
  char img_path[PATH_MAX], lbl_path[PATH_MAX];
  gs_idx_t img, lbl;
  int err;

  memset(out, 0, sizeof(*out));
  err = find_file(dir, split, "images-idx3-ubyte", img_path, sizeof(img_path), why, why_len);
  if (err)
    return err;
  err = find_file(dir, split, "labels-idx1-ubyte", lbl_path, sizeof(lbl_path), why, why_len);
  if (err)
    return err;
  err = gs_idx_load(img_path, &img, why, why_len);
  if (err)
    return err;
  err = gs_idx_load(lbl_path, &lbl, why, why_len);
  if (err)
    goto out_free_images;
  err = check_shapes(img_path, &img, lbl_path, &lbl, why, why_len);
  if (err)
    goto out_free_labels;
  if (features && img.dims[1] * img.dims[2] != features) {
    err = gs_why(GS_EPRECOND, why, why_len, "the images in %s have %u pixels", img_path,
                 img.dims[1] * img.dims[2]);
    goto out_free_labels;
  }
  fill_dataset(&img, &lbl, out);
  out->pixels = img.data; /* the images and labels are already one byte each */
  out->y = lbl.data;
  out->labels_path = strdup(lbl_path);
  if (!out->labels_path) {
    gs_dataset_free(out);
    return gs_why(GS_ENOMEM, why, why_len, "%s: out of memory", lbl_path);
  }
  return 0;

out_free_labels:
  gs_idx_free(&lbl);
out_free_images:
  gs_idx_free(&img);
  gs_dataset_free(out);
  return err;
}

int gs_dataset_check_labels(const gs_dataset_t *ds, uint32_t classes, char *why, size_t why_len)
{
  if (ds->classes <= classes)
    return 0;
  return gs_why(GS_EINVAL, why, why_len,
                "%s: label %u (example %u, counting from 0) is out of range: the model has %u "
                "classes (labels 0 to %u; the last --layers width is the number of classes)",
                ds->labels_path ? ds->labels_path : "the label file", ds->classes - 1, ds->max_at,
                classes, classes - 1);
}

void gs_dataset_free(gs_dataset_t *ds)
{
  free(ds->pixels);
  free(ds->y);
  free(ds->labels_path);
  memset(ds, 0, sizeof(*ds));
}
