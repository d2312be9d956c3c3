/* IDX files, plain or gzip-compressed, and the datasets made of them. The
 * parser is a pure function of its bytes; the loader adds the file, zlib and
 * the path every error message starts with. */
#include "idx.h"
#include "why.h"
#include "byteorder.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
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

/* Internal, declared here rather than in idx.h: the gunzip step with its
 * size cap as a parameter, so that tests can exercise the cap cheaply. */
int gs__idx_gunzip(const uint8_t *in, size_t in_len, size_t cap, uint8_t **out, size_t *out_len,
                   char *why, size_t why_len);

/* Checks the header of the `len` bytes at `b` against the bytes present and
 * fills the dims of `out` and the data's offset; reads nothing past `len`. */
static int parse_header(const uint8_t *b, size_t len, gs_idx_t *out, size_t *offset, char *why,
                        size_t why_len)
{
  size_t header, bytes = 1;
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
  header = 4 + 4 * (size_t)out->ndims;
  if (len < header)
    return gs_why(GS_EINVAL, why, why_len,
                  "truncated header: %u dimensions need %zu header bytes, file has %zu", out->ndims,
                  header, len);
  for (i = 0; i < out->ndims; i++) {
    out->dims[i] = gs_load_be32(b + 4 + 4 * i);
    if (__builtin_mul_overflow(bytes, (size_t)out->dims[i], &bytes))
      return gs_why(GS_EINVAL, why, why_len, "dimensions overflow: their product exceeds %zu bytes",
                    SIZE_MAX);
  }
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
  size_t offset, n;
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

/* Grows `*buf` to at least `want` bytes (doubling, at most `cap` + 1 so that
 * going over the cap can be seen). */
static int grow(uint8_t **buf, size_t *size, size_t want, size_t cap)
{
  size_t next = *size ? *size : 4096;
  uint8_t *p;

  while (next < want)
    next *= 2;
  if (next > cap + 1)
    next = cap + 1;
  p = realloc(*buf, next);
  if (!p)
    return GS_ENOMEM;
  *buf = p;
  *size = next;
  return 0;
}

/* Inflates one or more concatenated gzip members into one malloc'd buffer
 * of at most `cap` bytes (the caller frees `*out`); the reason on error has
 * no path, the caller adds it. */
int gs__idx_gunzip(const uint8_t *in, size_t in_len, size_t cap, uint8_t **out, size_t *out_len,
                   char *why, size_t why_len)
{
  z_stream z;
  uint8_t *buf = NULL;
  size_t size = 0, have = 0, used;
  int zr, err = 0;

  *out = NULL;
  *out_len = 0;
  memset(&z, 0, sizeof(z));
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
    return gs_why(GS_ENOMEM, why, why_len, "cannot start zlib: %s", z.msg ? z.msg : "no memory");
  z.next_in = (Bytef *)in;
  for (used = 0;;) {
    if (have == size && (err = grow(&buf, &size, have + 1, cap))) {
      gs_why(err, why, why_len, "out of memory decompressing (%zu bytes so far)", have);
      goto out_free_buf;
    }
    if (have > cap) {
      err = gs_why(GS_ETOOBIG, why, why_len, "decompresses to more than %zu bytes", cap);
      goto out_free_buf;
    }
    z.avail_in = (uInt)(in_len - used > UINT_MAX ? UINT_MAX : in_len - used);
    z.next_out = buf + have;
    z.avail_out = (uInt)(size - have > UINT_MAX ? UINT_MAX : size - have);
    zr = inflate(&z, Z_NO_FLUSH);
    used = (size_t)(z.next_in - (const Bytef *)in);
    have = (size_t)(z.next_out - buf);
    if (zr == Z_STREAM_END) {
      if (have > cap)
        continue; /* reported at the top of the loop */
      if (used == in_len)
        break;
      /* Another member follows, or garbage that inflate will reject. */
      if (inflateReset(&z) != Z_OK) {
        err = gs_why(GS_EINVAL, why, why_len, "corrupt gzip stream: cannot restart zlib");
        goto out_free_buf;
      }
      continue;
    }
    if (zr == Z_OK)
      continue;
    if (zr == Z_BUF_ERROR && used == in_len) {
      err = gs_why(GS_EINVAL, why, why_len,
                   "corrupt gzip stream: unexpected end after %zu compressed bytes", in_len);
      goto out_free_buf;
    }
    if (zr == Z_MEM_ERROR) {
      err = gs_why(GS_ENOMEM, why, why_len, "out of memory in zlib");
      goto out_free_buf;
    }
    err = gs_why(GS_EINVAL, why, why_len, "corrupt gzip stream at compressed byte %zu: %s", used,
                 z.msg ? z.msg : "unknown zlib error");
    goto out_free_buf;
  }
  inflateEnd(&z);
  *out = buf;
  *out_len = have;
  return 0;

out_free_buf:
  free(buf);
  inflateEnd(&z);
  return err;
}

/* Reads all of the regular file `path` into a malloc'd buffer of at most
 * GS_IDX_MAX_BYTES (caller frees); the reason starts with the path. */
static int read_file(const char *path, uint8_t **out, size_t *out_len, char *why, size_t why_len)
{
  struct stat st;
  uint8_t *buf;
  size_t n;
  FILE *f;
  int err;

  f = fopen(path, "rb");
  if (!f)
    return gs_why(gs_err_from_errno(errno), why, why_len, "%s: %s", path, strerror(errno));
  if (fstat(fileno(f), &st) != 0) {
    err = gs_why(GS_EIO, why, why_len, "%s: %s", path, strerror(errno));
    goto out_close_file;
  }
  if (!S_ISREG(st.st_mode)) {
    err = gs_why(GS_EINVAL, why, why_len, "%s: not a regular file", path);
    goto out_close_file;
  }
  if ((uint64_t)st.st_size > GS_IDX_MAX_BYTES) {
    err = gs_why(GS_ETOOBIG, why, why_len, "%s: %lld bytes, over the limit of %zu", path,
                 (long long)st.st_size, GS_IDX_MAX_BYTES);
    goto out_close_file;
  }
  buf = malloc(st.st_size ? (size_t)st.st_size : 1);
  if (!buf) {
    err = gs_why(GS_ENOMEM, why, why_len, "%s: out of memory for %lld bytes", path,
                 (long long)st.st_size);
    goto out_close_file;
  }
  n = fread(buf, 1, (size_t)st.st_size, f);
  if (n != (size_t)st.st_size || ferror(f)) {
    err = gs_why(GS_EIO, why, why_len, "%s: read %zu of %lld bytes: %s", path, n,
                 (long long)st.st_size, ferror(f) ? strerror(errno) : "file shrank");
    free(buf);
    goto out_close_file;
  }
  fclose(f);
  *out = buf;
  *out_len = n;
  return 0;

out_close_file:
  fclose(f);
  return err;
}

/* Parses the image in `buf` and moves its data to the buffer's start, so a
 * 47 MB file is not held twice; takes ownership of `buf` either way. */
static int parse_in_place(const char *path, uint8_t *buf, size_t len, gs_idx_t *out, char *why,
                          size_t why_len)
{
  char reason[256];
  size_t offset, n;
  uint8_t *p;
  int err;

  err = parse_header(buf, len, out, &offset, reason, sizeof(reason));
  if (err) {
    free(buf);
    memset(out, 0, sizeof(*out));
    return gs_why(err, why, why_len, "%s: %s", path, reason);
  }
  n = idx_bytes(out);
  memmove(buf, buf + offset, n);
  p = realloc(buf, n ? n : 1);
  out->data = p ? p : buf;
  return 0;
}

int gs_idx_load(const char *path, gs_idx_t *out, char *why, size_t why_len)
{
  char reason[256];
  uint8_t *raw = NULL, *plain = NULL;
  size_t raw_len = 0, plain_len = 0;
  int err;

  memset(out, 0, sizeof(*out));
  err = read_file(path, &raw, &raw_len, why, why_len);
  if (err)
    return err;
  if (raw_len < 2 || raw[0] != 0x1f || raw[1] != 0x8b)
    return parse_in_place(path, raw, raw_len, out, why, why_len);
  err = gs__idx_gunzip(raw, raw_len, GS_IDX_MAX_BYTES, &plain, &plain_len, reason, sizeof(reason));
  free(raw);
  if (err)
    return gs_why(err, why, why_len, "%s: %s", path, reason);
  return parse_in_place(path, plain, plain_len, out, why, why_len);
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

/* Fills `out` from checked image and label files: x scaled to [0, 1]. */
static int fill_dataset(const char *img_path, const gs_idx_t *img, const gs_idx_t *lbl,
                        gs_dataset_t *out, char *why, size_t why_len)
{
  size_t n, i;
  uint8_t max = 0;

  out->count = img->dims[0];
  out->features = img->dims[1] * img->dims[2];
  n = (size_t)out->count * out->features;
  if (n > SIZE_MAX / sizeof(float) || !(out->x = malloc(n * sizeof(float))))
    return gs_why(GS_ENOMEM, why, why_len, "%s: out of memory for %zu inputs", img_path, n);
  for (i = 0; i < n; i++)
    out->x[i] = img->data[i] / 255.0f;
  for (i = 0; i < out->count; i++)
    if (lbl->data[i] > max) {
      max = lbl->data[i];
      out->max_at = (uint32_t)i;
    }
  out->classes = (uint32_t)max + 1;
  return 0;
}

int gs_dataset_load(const char *dir, const char *split, gs_dataset_t *out, char *why,
                    size_t why_len)
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
  err = fill_dataset(img_path, &img, &lbl, out, why, why_len);
  if (err)
    goto out_free_labels;
  out->y = lbl.data; /* the labels are already one byte each */
  gs_idx_free(&img);
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
  free(ds->x);
  free(ds->y);
  free(ds->labels_path);
  memset(ds, 0, sizeof(*ds));
}
