/* Tests for agent/trainer/idx.c and sampler.c: the real Fashion-MNIST files
 * against an independent zlib read, malformed files with their exact
 * errors, the parser against a guard page, and the sampler's sharding and
 * determinism properties. */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "idx.h"
#include "sampler.h"
#include "scratch.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* An assertion for hot loops: check's own ck_assert_* records a mark
 * through a pipe on every call, which makes a million of them slow. */
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ck_abort_msg(__VA_ARGS__);                                                                   \
  } while (0)

/* Internal to idx.c: the loader with its size cap as a parameter. */
int gs__idx_load_capped(const char *path, size_t cap, gs_idx_t *out, char *why, size_t why_len);

/* ---- helpers: files, gzip, temporary directories ---- */

static void write_file(const char *path, const void *data, size_t len)
{
  FILE *f = fopen(path, "wb");

  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

/* Reads a gzip file with zlib's gzread, independently of idx.c; the caller
 * frees the result. */
static uint8_t *gunzip_file(const char *path, size_t *len)
{
  gzFile gz = gzopen(path, "rb");
  size_t size = 1 << 20, have = 0;
  uint8_t *buf = malloc(size);
  int n;

  ck_assert_msg(gz != NULL, "%s: cannot open", path);
  for (;;) {
    if (have == size)
      ck_assert_ptr_nonnull(buf = realloc(buf, size *= 2));
    n = gzread(gz, buf + have, (unsigned)(size - have));
    ck_assert_int_ge(n, 0);
    if (n == 0)
      break;
    have += (size_t)n;
  }
  gzclose(gz);
  *len = have;
  return buf;
}

/* Compresses `len` bytes into one gzip member; the caller frees it. */
static uint8_t *gzip_bytes(const void *data, size_t len, size_t *out_len)
{
  z_stream z;
  size_t cap = len + len / 2 + 1024;
  uint8_t *out = malloc(cap);

  memset(&z, 0, sizeof(z));
  ck_assert_int_eq(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = (Bytef *)data;
  z.avail_in = (uInt)len;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  ck_assert_int_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
  *out_len = cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

static void write_gz(const char *path, const void *data, size_t len)
{
  size_t n;
  uint8_t *gz = gzip_bytes(data, len, &n);

  write_file(path, gz, n);
  free(gz);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* A fresh directory (in the binary's own, scratch.h); remove it with rm_tmpdir. */
static void make_tmpdir(char *dir, size_t len)
{
  ts_mkdtemp(dir, len, "data");
}

static void rm_tmpdir(const char *dir)
{
  ck_assert_int_eq(nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS), 0);
}

/* Joins dir and name into the caller's buffer. */
static const char *join(char *buf, size_t len, const char *dir, const char *name)
{
  ck_assert_int_lt(snprintf(buf, len, "%s/%s", dir, name), (int)len);
  return buf;
}

/* Builds an IDX image: header for `dims` then `data_len` bytes of data
 * (counting up from 1), into `buf`; returns its length. */
static size_t make_idx(uint8_t *buf, uint8_t type, uint8_t ndims, const uint32_t *dims,
                       size_t data_len)
{
  size_t n = 0, i;
  uint32_t d;

  buf[n++] = 0;
  buf[n++] = 0;
  buf[n++] = type;
  buf[n++] = ndims;
  for (d = 0; d < ndims; d++) {
    buf[n++] = (uint8_t)(dims[d] >> 24);
    buf[n++] = (uint8_t)(dims[d] >> 16);
    buf[n++] = (uint8_t)(dims[d] >> 8);
    buf[n++] = (uint8_t)dims[d];
  }
  for (i = 0; i < data_len; i++)
    buf[n++] = (uint8_t)(i + 1);
  return n;
}

/* Expects gs_idx_load(path) to fail with `err` and exactly `want`. */
static void expect_load_error(const char *path, int err, const char *want)
{
  gs_idx_t idx;
  char why[512] = "";

  ck_assert_int_eq(gs_idx_load(path, &idx, why, sizeof(why)), err);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(idx.data);
}

/* Expects gs_idx_load(path) to fail with `err` and a reason that starts
 * with "PATH: " followed by `prefix`. */
static void expect_load_error_prefix(const char *path, int err, const char *prefix)
{
  gs_idx_t idx;
  char why[512] = "", want[512];

  snprintf(want, sizeof(want), "%s: %s", path, prefix);
  ck_assert_int_eq(gs_idx_load(path, &idx, why, sizeof(why)), err);
  ck_assert_msg(strncmp(why, want, strlen(want)) == 0, "why = \"%s\", want \"%s...\"", why, want);
  ck_assert_ptr_null(idx.data);
}

/* ---- the real dataset ---- */

/* Loads a real split and checks it against the gzip file read with gzread:
 * the header by hand, every input and label, and the class histogram. */
static void check_real_split(const char *split, uint32_t count, uint32_t per_class)
{
  char img_path[256], lbl_path[256], why[512] = "";
  uint32_t hist[10] = {0}, i;
  size_t img_len, lbl_len, k;
  gs_dataset_t ds;
  uint8_t *img, *lbl;

  snprintf(img_path, sizeof(img_path), FASHION_DIR "/%s-images-idx3-ubyte.gz", split);
  snprintf(lbl_path, sizeof(lbl_path), FASHION_DIR "/%s-labels-idx1-ubyte.gz", split);
  img = gunzip_file(img_path, &img_len);
  lbl = gunzip_file(lbl_path, &lbl_len);
  ck_assert_uint_eq(img_len, 16 + (size_t)count * 784);
  ck_assert_uint_eq(lbl_len, 8 + (size_t)count);

  ck_assert_msg(gs_dataset_load(FASHION_DIR, split, 0, &ds, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(ds.count, count);
  ck_assert_uint_eq(ds.features, 28 * 28);
  ck_assert_uint_eq(ds.classes, 10);
  /* Fashion-MNIST's first example of both splits is an ankle boot. */
  ck_assert_uint_eq(ds.y[0], 9);
  for (k = 0; k < (size_t)count * 784; k++) {
    if (ds.pixels[k] != img[16 + k])
      ck_abort_msg("pixels[%zu] = %u, want %u", k, ds.pixels[k], img[16 + k]);
  }
  for (i = 0; i < count; i++) {
    CHECK(ds.y[i] == lbl[8 + i] && ds.y[i] < 10, "y[%u] = %u, want %u", i, ds.y[i], lbl[8 + i]);
    hist[ds.y[i]]++;
  }
  for (i = 0; i < 10; i++)
    ck_assert_msg(hist[i] == per_class, "class %u has %u examples, want %u", i, hist[i], per_class);
  gs_dataset_free(&ds);
  ck_assert_ptr_null(ds.pixels);
  ck_assert_ptr_null(ds.y);
  free(img);
  free(lbl);
}

START_TEST(real_train)
{
  check_real_split("train", 60000, 6000);
}
END_TEST

START_TEST(real_t10k)
{
  check_real_split("t10k", 10000, 1000);
}
END_TEST

/* Plain copies of the t10k files give the same dataset as the gzip files;
 * the plain file wins when both exist, and plain and gzip files mix. */
START_TEST(plain_vs_gzip)
{
  char dir[160], p[256], q[256], why[512] = "";
  gs_dataset_t gz, plain;
  gs_idx_t a, b;
  uint8_t *bytes;
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  bytes = gunzip_file(FASHION_DIR "/t10k-images-idx3-ubyte.gz", &len);
  write_file(join(p, sizeof(p), dir, "t10k-images-idx3-ubyte"), bytes, len);
  free(bytes);
  bytes = gunzip_file(FASHION_DIR "/t10k-labels-idx1-ubyte.gz", &len);
  write_file(join(p, sizeof(p), dir, "t10k-labels-idx1-ubyte"), bytes, len);

  /* gs_idx_load of each form, directly. */
  ck_assert_msg(gs_idx_load(p, &a, why, sizeof(why)) == 0, "%s", why);
  ck_assert_msg(gs_idx_load(FASHION_DIR "/t10k-labels-idx1-ubyte.gz", &b, why, sizeof(why)) == 0,
                "%s", why);
  ck_assert_uint_eq(a.ndims, 1);
  ck_assert_uint_eq(b.ndims, 1);
  ck_assert_uint_eq(a.dims[0], 10000);
  ck_assert_uint_eq(b.dims[0], 10000);
  ck_assert_int_eq(memcmp(a.data, b.data, 10000), 0);
  ck_assert_int_eq(memcmp(a.data, bytes + 8, 10000), 0);
  gs_idx_free(&a);
  gs_idx_free(&b);

  ck_assert_msg(gs_dataset_load(dir, "t10k", 0, &plain, why, sizeof(why)) == 0, "%s", why);
  ck_assert_msg(gs_dataset_load(FASHION_DIR, "t10k", 0, &gz, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(plain.count, gz.count);
  ck_assert_uint_eq(plain.features, gz.features);
  ck_assert_uint_eq(plain.classes, gz.classes);
  ck_assert_int_eq(memcmp(plain.pixels, gz.pixels, (size_t)gz.count * gz.features), 0);
  ck_assert_int_eq(memcmp(plain.y, gz.y, gz.count), 0);
  gs_dataset_free(&plain);

  /* A .gz beside the plain labels, with a different first label: the
   * plain file is read while it exists, the .gz once it is gone. */
  bytes[8] = 3;
  write_gz(join(q, sizeof(q), dir, "t10k-labels-idx1-ubyte.gz"), bytes, len);
  ck_assert_msg(gs_dataset_load(dir, "t10k", 0, &plain, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(plain.y[0], 9);
  gs_dataset_free(&plain);
  ck_assert_int_eq(unlink(p), 0);
  ck_assert_msg(gs_dataset_load(dir, "t10k", 0, &plain, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(plain.y[0], 3);
  ck_assert_int_eq(memcmp(plain.y + 1, gz.y + 1, gz.count - 1), 0);
  ck_assert_int_eq(memcmp(plain.pixels, gz.pixels, (size_t)gz.count * gz.features), 0);
  gs_dataset_free(&plain);
  gs_dataset_free(&gz);
  free(bytes);
  rm_tmpdir(dir);
}
END_TEST

/* ---- the parser ---- */

START_TEST(parse_valid)
{
  static const uint32_t dims1[] = {5}, dims4[] = {2, 3, 1, 2}, dims0[] = {3, 0, 7};
  uint8_t buf[64];
  gs_idx_t idx;
  char why[256] = "";
  size_t len, i;

  len = make_idx(buf, 0x08, 1, dims1, 5);
  ck_assert_msg(gs_idx_parse(buf, len, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(idx.ndims, 1);
  ck_assert_uint_eq(idx.dims[0], 5);
  ck_assert_ptr_ne(idx.data, buf + 8); /* a copy */
  for (i = 0; i < 5; i++)
    ck_assert_uint_eq(idx.data[i], i + 1);
  gs_idx_free(&idx);
  ck_assert_ptr_null(idx.data);
  ck_assert_uint_eq(idx.ndims, 0);

  len = make_idx(buf, 0x08, 4, dims4, 12);
  ck_assert_msg(gs_idx_parse(buf, len, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(idx.ndims, 4);
  ck_assert_uint_eq(idx.dims[0], 2);
  ck_assert_uint_eq(idx.dims[1], 3);
  ck_assert_uint_eq(idx.dims[2], 1);
  ck_assert_uint_eq(idx.dims[3], 2);
  ck_assert_uint_eq(idx.data[11], 12);
  gs_idx_free(&idx);

  /* A zero dimension: no data, which is what the file has. */
  len = make_idx(buf, 0x08, 3, dims0, 0);
  ck_assert_msg(gs_idx_parse(buf, len, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(idx.dims[1], 0);
  gs_idx_free(&idx);

  /* The real header's sizes, with the data present. */
  {
    static const uint32_t dims[] = {60, 28, 28};
    uint8_t *big = calloc(1, 16 + 60 * 784);

    len = make_idx(big, 0x08, 3, dims, 60 * 784);
    ck_assert_msg(gs_idx_parse(big, len, &idx, why, sizeof(why)) == 0, "%s", why);
    ck_assert_int_eq(memcmp(idx.data, big + 16, 60 * 784), 0);
    gs_idx_free(&idx);
    free(big);
  }
}
END_TEST

/* Parses `len` bytes and expects GS_EINVAL with exactly `want`, also with
 * no buffer for the reason. */
static void expect_parse_error(const uint8_t *buf, size_t len, const char *want)
{
  gs_idx_t idx;
  char why[256] = "";

  ck_assert_int_eq(gs_idx_parse(buf, len, &idx, why, sizeof(why)), GS_EINVAL);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(idx.data);
  ck_assert_int_eq(gs_idx_parse(buf, len, &idx, NULL, 0), GS_EINVAL);
}

START_TEST(parse_errors)
{
  static const uint32_t real[] = {60000, 28, 28}, one[] = {5};
  static const uint32_t huge[] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 2};
  uint8_t buf[2048] = {0};
  size_t len;

  expect_parse_error(buf, 0, "empty file (0 bytes)");
  len = make_idx(buf, 0x08, 1, one, 5);
  expect_parse_error(buf, 3, "truncated header: 3 bytes, an IDX file starts with 4 magic bytes");
  expect_parse_error(buf, 7, "truncated header: 1 dimensions need 8 header bytes, file has 7");
  expect_parse_error(buf, len - 1, "truncated: header says 5 bytes of data, file has 4");
  buf[len] = 0;
  expect_parse_error(buf, len + 1, "trailing bytes: header says 5 bytes of data, file has 6");

  buf[1] = 0x01;
  expect_parse_error(buf, len, "not an IDX file (magic starts 0x00 0x01, want 0x00 0x00)");
  buf[0] = 0x1f;
  buf[1] = 0x8b;
  expect_parse_error(buf, len, "not an IDX file (magic starts 0x1f 0x8b, want 0x00 0x00)");
  len = make_idx(buf, 0x0d, 1, one, 5); /* 0x0d: float */
  expect_parse_error(buf, len,
                     "unsupported IDX data type 0x0d (only 0x08, unsigned byte, is supported)");
  len = make_idx(buf, 0x08, 0, one, 0);
  expect_parse_error(buf, len, "unsupported IDX rank 0 (want 1 to 4 dimensions)");
  buf[3] = 5;
  expect_parse_error(buf, len, "unsupported IDX rank 5 (want 1 to 4 dimensions)");

  len = make_idx(buf, 0x08, 3, real, 1000);
  expect_parse_error(buf, len, "truncated: header says 47040000 bytes of data, file has 1000");
  len = make_idx(buf, 0x08, 3, real, 0);
  expect_parse_error(buf, len, "truncated: header says 47040000 bytes of data, file has 0");
  /* A product that wraps around 64 bits must not pass for a small one:
   * (2^32-1)^3 * 2 mod 2^64 is not what is checked. */
  len = make_idx(buf, 0x08, 4, huge, 0);
  expect_parse_error(buf, len,
                     "dimensions overflow: their product exceeds 18446744073709551615 bytes");
}
END_TEST

/* Each prefix of a valid file, and the whole file, placed to end right at
 * an unreadable page: the parser must stop at `len`. */
START_TEST(parse_guard_page)
{
  static const uint32_t dims[] = {2, 2, 3};
  long page = sysconf(_SC_PAGESIZE);
  uint8_t file[64], *mem, *end;
  gs_idx_t idx;
  char why[256];
  size_t len, n;

  mem = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(mem, MAP_FAILED);
  ck_assert_int_eq(mprotect(mem + page, (size_t)page, PROT_NONE), 0);
  end = mem + page;
  len = make_idx(file, 0x08, 3, dims, 12);
  for (n = 0; n < len; n++) {
    memcpy(end - n, file, n);
    why[0] = 0;
    ck_assert_int_eq(gs_idx_parse(end - n, n, &idx, why, sizeof(why)), GS_EINVAL);
    ck_assert_msg(strstr(why, "truncated") || strstr(why, "empty"), "%zu bytes: %s", n, why);
  }
  memcpy(end - len, file, len);
  ck_assert_msg(gs_idx_parse(end - len, len, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_int_eq(memcmp(idx.data, file + 16, 12), 0);
  gs_idx_free(&idx);
  /* A header claiming 4 dims of which only the rank byte is present. */
  memcpy(end - 4, "\0\0\x08\x04", 4);
  ck_assert_int_eq(gs_idx_parse(end - 4, 4, &idx, why, sizeof(why)), GS_EINVAL);
  ck_assert_str_eq(why, "truncated header: 4 dimensions need 20 header bytes, file has 4");
  ck_assert_int_eq(munmap(mem, 2 * (size_t)page), 0);
}
END_TEST

/* ---- the loader: files, gzip and their errors ---- */

START_TEST(load_file_errors)
{
  static const uint32_t real[] = {60000, 28, 28}, one[] = {5};
  char dir[160], p[256], want[512];
  uint8_t buf[2048];
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  join(p, sizeof(p), dir, "missing");
  snprintf(want, sizeof(want), "%s: No such file or directory", p);
  expect_load_error(p, GS_ENOTFOUND, want);

  snprintf(want, sizeof(want), "%s: not a regular file (a directory)", dir);
  expect_load_error(dir, GS_EINVAL, want);

  write_file(join(p, sizeof(p), dir, "empty"), "", 0);
  snprintf(want, sizeof(want), "%s: empty file (0 bytes)", p);
  expect_load_error(p, GS_EINVAL, want);

  len = make_idx(buf, 0x08, 1, one, 5);
  buf[0] = 'P';
  buf[1] = 'K';
  write_file(join(p, sizeof(p), dir, "magic"), buf, len);
  snprintf(want, sizeof(want), "%s: not an IDX file (magic starts 0x50 0x4b, want 0x00 0x00)", p);
  expect_load_error(p, GS_EINVAL, want);

  len = make_idx(buf, 0x0b, 1, one, 5);
  write_file(join(p, sizeof(p), dir, "type"), buf, len);
  snprintf(want, sizeof(want),
           "%s: unsupported IDX data type 0x0b (only 0x08, unsigned byte, is supported)", p);
  expect_load_error(p, GS_EINVAL, want);

  len = make_idx(buf, 0x08, 3, real, 1000);
  write_file(join(p, sizeof(p), dir, "truncated"), buf, len);
  snprintf(want, sizeof(want), "%s: truncated: header says 47040000 bytes of data, file has 1000",
           p);
  expect_load_error(p, GS_EINVAL, want);
  /* The same, gzipped: the message names the .gz file. */
  write_gz(join(p, sizeof(p), dir, "truncated.gz"), buf, len);
  snprintf(want, sizeof(want), "%s: truncated: header says 47040000 bytes of data, file has 1000",
           p);
  expect_load_error(p, GS_EINVAL, want);

  len = make_idx(buf, 0x08, 1, one, 7);
  write_file(join(p, sizeof(p), dir, "trailing"), buf, len);
  snprintf(want, sizeof(want), "%s: trailing bytes: header says 5 bytes of data, file has 7", p);
  expect_load_error(p, GS_EINVAL, want);
  rm_tmpdir(dir);
}
END_TEST

START_TEST(load_gzip)
{
  static const uint32_t dims[] = {40, 50};
  char dir[160], p[256], why[512] = "";
  uint8_t buf[2048], both[4096], *gz1, *gz2;
  size_t len, n1, n2;
  gs_idx_t idx;

  make_tmpdir(dir, sizeof(dir));
  len = make_idx(buf, 0x08, 2, dims, 2000);

  /* A valid gzip file loads to the same bytes. */
  write_gz(join(p, sizeof(p), dir, "ok.gz"), buf, len);
  ck_assert_msg(gs_idx_load(p, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(idx.ndims, 2);
  ck_assert_uint_eq(idx.dims[0], 40);
  ck_assert_uint_eq(idx.dims[1], 50);
  ck_assert_int_eq(memcmp(idx.data, buf + 12, 2000), 0);
  gs_idx_free(&idx);

  /* Two concatenated members, as `cat a.gz b.gz` makes, are one file. */
  gz1 = gzip_bytes(buf, 1000, &n1);
  gz2 = gzip_bytes(buf + 1000, len - 1000, &n2);
  memcpy(both, gz1, n1);
  memcpy(both + n1, gz2, n2);
  write_file(join(p, sizeof(p), dir, "members.gz"), both, n1 + n2);
  ck_assert_msg(gs_idx_load(p, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_int_eq(memcmp(idx.data, buf + 12, 2000), 0);
  gs_idx_free(&idx);

  /* Cut short: the stream ends before its end marker. */
  write_file(join(p, sizeof(p), dir, "cut.gz"), gz1, n1 - 10);
  expect_load_error_prefix(p, GS_EINVAL, "corrupt gzip stream: unexpected end after");

  /* Garbage after a complete member. */
  memcpy(both + n1, "garbage!", 8);
  write_file(join(p, sizeof(p), dir, "garbage.gz"), both, n1 + 8);
  expect_load_error_prefix(p, GS_EINVAL, "corrupt gzip stream at compressed byte");

  /* A bad compression method in the header. */
  memcpy(both, gz1, n1);
  both[2] = 7;
  write_file(join(p, sizeof(p), dir, "method.gz"), both, n1);
  expect_load_error_prefix(p, GS_EINVAL, "corrupt gzip stream at compressed byte");

  /* Damaged deflate data: caught as bad data or by the CRC. */
  memcpy(both, gz1, n1);
  both[n1 / 2] ^= 0x55;
  write_file(join(p, sizeof(p), dir, "flipped.gz"), both, n1);
  expect_load_error_prefix(p, GS_EINVAL, "corrupt gzip stream");
  /* A wrong CRC with intact data. */
  memcpy(both, gz1, n1);
  both[n1 - 8] ^= 1;
  write_file(join(p, sizeof(p), dir, "crc.gz"), both, n1);
  expect_load_error_prefix(p, GS_EINVAL, "corrupt gzip stream at compressed byte");

  free(gz1);
  free(gz2);
  rm_tmpdir(dir);
}
END_TEST

/* The decompressed-size cap, at its boundary: whole image, header included. */
START_TEST(gunzip_cap)
{
  static const uint32_t dims[] = {5000};
  char dir[160], p[256], why[512] = "", want[512];
  uint8_t buf[6000];
  size_t len;
  gs_idx_t idx;

  make_tmpdir(dir, sizeof(dir));
  len = make_idx(buf, 0x08, 1, dims, 5000);
  write_gz(join(p, sizeof(p), dir, "cap.gz"), buf, len);
  ck_assert_msg(gs__idx_load_capped(p, 5008, &idx, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(idx.dims[0], 5000);
  ck_assert_int_eq(memcmp(idx.data, buf + 8, 5000), 0);
  gs_idx_free(&idx);
  ck_assert_int_eq(gs__idx_load_capped(p, 5007, &idx, why, sizeof(why)), GS_ETOOBIG);
  snprintf(want, sizeof(want), "%s: header says 5000 bytes of data, over the limit of 5007 bytes",
           p);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(idx.data);

  /* Past the header's count: the rest is counted up to the cap, no more. */
  len = make_idx(buf, 0x08, 1, (const uint32_t[]){100}, 5000);
  write_gz(join(p, sizeof(p), dir, "more.gz"), buf, len);
  ck_assert_int_eq(gs__idx_load_capped(p, 6000, &idx, why, sizeof(why)), GS_EINVAL);
  snprintf(want, sizeof(want), "%s: trailing bytes: header says 100 bytes of data, file has 5000",
           p);
  ck_assert_str_eq(why, want);
  ck_assert_int_eq(gs__idx_load_capped(p, 4000, &idx, why, sizeof(why)), GS_ETOOBIG);
  snprintf(want, sizeof(want), "%s: decompresses to more than 4000 bytes (the limit)", p);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(idx.data);
  rm_tmpdir(dir);
}
END_TEST

/* A gzip bomb: 1 GiB of data behind a small header, in about a megabyte.
 * The old loader inflated up to the 512 MiB limit into memory before it
 * refused; streaming, the peak stays the image plus a chunk (measured in a
 * child, whose peak is its own). */
START_TEST(gzip_bomb_bounded)
{
  char dir[160], p[256];
  uint8_t *zeros, out[1 << 16];
  z_stream z;
  FILE *f;
  int status;
  pid_t pid;
  struct rusage ru;

  make_tmpdir(dir, sizeof(dir));
  join(p, sizeof(p), dir, "bomb.gz");
  f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  zeros = calloc(1, 1 << 20);
  memset(&z, 0, sizeof(z));
  ck_assert_int_eq(deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
  zeros[2] = 0x08;
  zeros[3] = 1;
  zeros[7] = 100; /* dims {100}: the rest is trailing */
  for (int i = 0; i < 1024; i++) {
    z.next_in = zeros;
    z.avail_in = 1 << 20;
    do {
      z.next_out = out;
      z.avail_out = sizeof(out);
      deflate(&z, i == 1023 ? Z_FINISH : Z_NO_FLUSH);
      ck_assert_uint_eq(fwrite(out, 1, sizeof(out) - z.avail_out, f), sizeof(out) - z.avail_out);
    } while (z.avail_out == 0);
    memset(zeros, 0, 8);
  }
  deflateEnd(&z);
  free(zeros);
  ck_assert_int_eq(fclose(f), 0);

  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    gs_idx_t idx;
    char why[512] = "", want[600];
    int err = gs_idx_load(p, &idx, why, sizeof(why));

    snprintf(want, sizeof(want), "%s: decompresses to more than %zu bytes (the limit)", p,
             (size_t)512 << 20);
    if (err != GS_ETOOBIG || strcmp(why, want) != 0) {
      fprintf(stderr, "bomb: %d %s\n", err, why);
      _exit(1);
    }
    _exit(0);
  }
  ck_assert_int_eq(wait4(pid, &status, 0, &ru), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the bomb was not refused");
  /* ru_maxrss is in KiB; the process itself (check, libc) is a few MiB. */
  ck_assert_msg(ru.ru_maxrss < 64 * 1024, "peak RSS %ld KiB refusing a gzip bomb", ru.ru_maxrss);
  rm_tmpdir(dir);
}
END_TEST

/* A FIFO named like a data file is refused at once, not waited on (a
 * blocking open of a FIFO waits for a writer forever). */
START_TEST(fifo_refused)
{
  char dir[160], p[256], want[512];

  make_tmpdir(dir, sizeof(dir));
  join(p, sizeof(p), dir, "t10k-images-idx3-ubyte");
  ck_assert_int_eq(mkfifo(p, 0600), 0);
  snprintf(want, sizeof(want), "%s: not a regular file (a FIFO)", p);
  expect_load_error(p, GS_EINVAL, want);
  rm_tmpdir(dir);
}
END_TEST

/* ---- the dataset ---- */

START_TEST(dataset_small)
{
  static const uint32_t img_dims[] = {3, 2, 2}, lbl_dims[] = {3};
  static const uint8_t pixels[12] = {0, 255, 51, 1, 2, 3, 4, 5, 128, 127, 254, 0};
  static const uint8_t labels[3] = {2, 0, 7};
  char dir[160], p[256], why[512] = "";
  uint8_t buf[64];
  gs_dataset_t ds;
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  len = make_idx(buf, 0x08, 3, img_dims, 0);
  memcpy(buf + len, pixels, sizeof(pixels));
  write_gz(join(p, sizeof(p), dir, "mini-images-idx3-ubyte.gz"), buf, len + sizeof(pixels));
  len = make_idx(buf, 0x08, 1, lbl_dims, 0);
  memcpy(buf + len, labels, sizeof(labels));
  write_file(join(p, sizeof(p), dir, "mini-labels-idx1-ubyte"), buf, len + sizeof(labels));

  ck_assert_msg(gs_dataset_load(dir, "mini", 0, &ds, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(ds.count, 3);
  ck_assert_uint_eq(ds.features, 4);
  ck_assert_uint_eq(ds.classes, 8);
  ck_assert_int_eq(memcmp(ds.pixels, pixels, 12), 0);
  ck_assert_int_eq(memcmp(ds.y, labels, 3), 0);
  ck_assert_uint_eq(ds.max_at, 2);
  ck_assert_int_eq(gs_dataset_check_labels(&ds, 8, why, sizeof(why)), 0);
  gs_dataset_free(&ds);
  rm_tmpdir(dir);
}
END_TEST

/* A label the model cannot output is named with its value, file, index and
 * the number of classes, not blamed on --layers. */
START_TEST(dataset_label_out_of_range)
{
  static const uint32_t img_dims[] = {4, 1, 2}, lbl_dims[] = {4};
  static const uint8_t labels[4] = {3, 10, 1, 10};
  char dir[160], p[256], want[512], why[512] = "";
  uint8_t buf[64];
  gs_dataset_t ds;
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  len = make_idx(buf, 0x08, 3, img_dims, 8);
  write_file(join(p, sizeof(p), dir, "t10k-images-idx3-ubyte"), buf, len);
  len = make_idx(buf, 0x08, 1, lbl_dims, 0);
  memcpy(buf + len, labels, sizeof(labels));
  write_file(join(p, sizeof(p), dir, "t10k-labels-idx1-ubyte"), buf, len + sizeof(labels));
  ck_assert_msg(gs_dataset_load(dir, "t10k", 0, &ds, why, sizeof(why)) == 0, "%s", why);
  ck_assert_int_eq(gs_dataset_check_labels(&ds, 11, why, sizeof(why)), 0);
  ck_assert_int_eq(gs_dataset_check_labels(&ds, 10, why, sizeof(why)), GS_EINVAL);
  snprintf(want, sizeof(want),
           "%s: label 10 (example 1, counting from 0) is out of range: the model has 10 "
           "classes (labels 0 to 9; the last --layers width is the number of classes)",
           p);
  ck_assert_str_eq(why, want);
  gs_dataset_free(&ds);
  rm_tmpdir(dir);
}
END_TEST

/* Images of another size than the model takes are refused before they are
 * made into floats (four times their bytes): a large image file the model
 * cannot use costs its bytes, no more. */
START_TEST(dataset_features)
{
  static const uint32_t img_dims[] = {2, 3, 3}, lbl_dims[] = {2};
  char dir[160], p[256], want[512], why[512] = "";
  uint8_t buf[64];
  gs_dataset_t ds;
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  len = make_idx(buf, 0x08, 3, img_dims, 18);
  write_file(join(p, sizeof(p), dir, "t10k-images-idx3-ubyte"), buf, len);
  snprintf(want, sizeof(want), "the images in %s have 9 pixels", p);
  len = make_idx(buf, 0x08, 1, lbl_dims, 2);
  write_file(join(p, sizeof(p), dir, "t10k-labels-idx1-ubyte"), buf, len);
  ck_assert_int_eq(gs_dataset_load(dir, "t10k", 784, &ds, why, sizeof(why)), GS_EPRECOND);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(ds.pixels);
  ck_assert_msg(gs_dataset_load(dir, "t10k", 9, &ds, why, sizeof(why)) == 0, "%s", why);
  gs_dataset_free(&ds);
  rm_tmpdir(dir);
}
END_TEST

/* Expects gs_dataset_load(dir, split) to fail with `err` and exactly `want`. */
static void expect_dataset_error(const char *dir, const char *split, int err, const char *want)
{
  gs_dataset_t ds;
  char why[1024] = "";

  ck_assert_int_eq(gs_dataset_load(dir, split, 0, &ds, why, sizeof(why)), err);
  ck_assert_str_eq(why, want);
  ck_assert_ptr_null(ds.pixels);
  ck_assert_ptr_null(ds.y);
  ck_assert_uint_eq(ds.count, 0);
}

START_TEST(dataset_errors)
{
  static const uint32_t img3[] = {3, 2, 2}, img2[] = {3, 4}, lbl4[] = {4}, lbl3[] = {3};
  static const uint32_t lbl2d[] = {3, 1}, img0[] = {0, 2, 2}, lbl0[] = {0};
  char dir[160], img[256], lbl[256], want[1024];
  uint8_t buf[64];
  size_t len;

  make_tmpdir(dir, sizeof(dir));
  join(img, sizeof(img), dir, "s-images-idx3-ubyte");
  join(lbl, sizeof(lbl), dir, "s-labels-idx1-ubyte");

  /* Neither form of the images file. */
  snprintf(want, sizeof(want), "%s: No such file or directory (nor %s.gz)", img, img);
  expect_dataset_error(dir, "s", GS_ENOTFOUND, want);
  /* Images, but no labels. */
  len = make_idx(buf, 0x08, 3, img3, 12);
  write_file(img, buf, len);
  snprintf(want, sizeof(want), "%s: No such file or directory (nor %s.gz)", lbl, lbl);
  expect_dataset_error(dir, "s", GS_ENOTFOUND, want);

  /* Counts that disagree. */
  len = make_idx(buf, 0x08, 1, lbl4, 4);
  write_file(lbl, buf, len);
  snprintf(want, sizeof(want), "%s has 3 images but %s has 4 labels", img, lbl);
  expect_dataset_error(dir, "s", GS_EINVAL, want);

  /* Labels that are not 1-D. */
  len = make_idx(buf, 0x08, 2, lbl2d, 3);
  write_file(lbl, buf, len);
  snprintf(want, sizeof(want), "%s: labels have 2 dimensions, want 1 (count)", lbl);
  expect_dataset_error(dir, "s", GS_EINVAL, want);

  /* Images that are not 3-D. */
  len = make_idx(buf, 0x08, 1, lbl3, 3);
  write_file(lbl, buf, len);
  len = make_idx(buf, 0x08, 2, img2, 12);
  write_file(img, buf, len);
  snprintf(want, sizeof(want), "%s: images have 2 dimensions, want 3 (count, rows, cols)", img);
  expect_dataset_error(dir, "s", GS_EINVAL, want);

  /* A broken labels file: the error is the labels file's. */
  len = make_idx(buf, 0x08, 3, img3, 12);
  write_file(img, buf, len);
  len = make_idx(buf, 0x08, 1, lbl3, 2);
  write_file(lbl, buf, len);
  snprintf(want, sizeof(want), "%s: truncated: header says 3 bytes of data, file has 2", lbl);
  expect_dataset_error(dir, "s", GS_EINVAL, want);

  /* No examples at all. */
  len = make_idx(buf, 0x08, 3, img0, 0);
  write_file(img, buf, len);
  len = make_idx(buf, 0x08, 1, lbl0, 0);
  write_file(lbl, buf, len);
  snprintf(want, sizeof(want), "%s: no examples", img);
  expect_dataset_error(dir, "s", GS_EINVAL, want);

  /* A missing directory names the paths tried. */
  snprintf(want, sizeof(want),
           "/nonexistent/train-images-idx3-ubyte: No such file or directory "
           "(nor /nonexistent/train-images-idx3-ubyte.gz)");
  expect_dataset_error("/nonexistent", "train", GS_ENOTFOUND, want);
  rm_tmpdir(dir);
}
END_TEST

/* ---- the sampler ---- */

/* Checks that `perm` holds each of 0..n-1 once. */
static void expect_permutation(const uint32_t *perm, uint32_t n)
{
  uint8_t *seen = calloc(n, 1);
  uint32_t i;

  for (i = 0; i < n; i++) {
    CHECK(perm[i] < n, "perm[%u] = %u, out of range", i, perm[i]);
    CHECK(!seen[perm[i]], "%u appears twice", perm[i]);
    seen[perm[i]] = 1;
  }
  free(seen);
}

/* Over one epoch with `world` ranks: no index twice, and all batches
 * together are exactly the first steps * world * batch of the permutation. */
static void check_epoch_cover(uint32_t count, uint32_t batch, uint32_t world, bool shuffle,
                              uint64_t epoch)
{
  gs_sampler_t *s = calloc(world, sizeof(*s));
  uint32_t *hits = calloc(count, sizeof(*hits));
  uint32_t steps, used, r, t, k;

  for (r = 0; r < world; r++) {
    ck_assert_int_eq(gs_sampler_init(&s[r], count, batch, r, world, 42, shuffle), 0);
    gs_sampler_set_epoch(&s[r], epoch);
  }
  steps = gs_sampler_steps_per_epoch(&s[0]);
  ck_assert_uint_eq(steps, count / (world * batch));
  for (r = 0; r < world; r++) {
    ck_assert_int_eq(memcmp(s[r].perm, s[0].perm, count * sizeof(uint32_t)), 0);
    for (t = 0; t < steps; t++) {
      const uint32_t *b = gs_sampler_batch(&s[r], t);

      ck_assert_ptr_nonnull(b);
      for (k = 0; k < batch; k++) {
        CHECK(b[k] < count, "index %u out of range", b[k]);
        CHECK(++hits[b[k]] == 1, "index %u seen twice", b[k]);
      }
    }
    ck_assert_ptr_null(gs_sampler_batch(&s[r], steps));
  }
  used = steps * world * batch;
  for (k = 0; k < used; k++)
    CHECK(hits[s[0].perm[k]] == 1, "perm[%u] = %u never sampled", k, s[0].perm[k]);
  for (k = used; k < count; k++)
    CHECK(hits[s[0].perm[k]] == 0, "dropped perm[%u] = %u sampled", k, s[0].perm[k]);
  for (r = 0; r < world; r++)
    gs_sampler_free(&s[r]);
  free(s);
  free(hits);
}

START_TEST(sampler_epoch_cover)
{
  check_epoch_cover(1000, 7, 3, true, 0);
  check_epoch_cover(1000, 7, 3, true, 5);
  check_epoch_cover(1000, 7, 3, false, 0);
  check_epoch_cover(64, 8, 8, true, 1);   /* exactly one step */
  check_epoch_cover(100, 10, 1, true, 2); /* nothing dropped */
  check_epoch_cover(60000, 32, 4, true, 3);
}
END_TEST

/* W=2 with batch 8 sees, step by step, what W=1 with batch 16 sees. */
START_TEST(sampler_equivalence)
{
  gs_sampler_t one, r0, r1;
  uint32_t count = 1003, t, k, steps;
  uint64_t epoch;
  int shuffle;

  for (shuffle = 0; shuffle < 2; shuffle++) {
    ck_assert_int_eq(gs_sampler_init(&one, count, 16, 0, 1, 7, shuffle), 0);
    ck_assert_int_eq(gs_sampler_init(&r0, count, 8, 0, 2, 7, shuffle), 0);
    ck_assert_int_eq(gs_sampler_init(&r1, count, 8, 1, 2, 7, shuffle), 0);
    steps = gs_sampler_steps_per_epoch(&one);
    ck_assert_uint_eq(steps, 62);
    ck_assert_uint_eq(gs_sampler_steps_per_epoch(&r0), steps);
    for (epoch = 0; epoch < 3; epoch++) {
      gs_sampler_set_epoch(&one, epoch);
      gs_sampler_set_epoch(&r0, epoch);
      gs_sampler_set_epoch(&r1, epoch);
      for (t = 0; t < steps; t++) {
        const uint32_t *a = gs_sampler_batch(&one, t), *b0 = gs_sampler_batch(&r0, t);
        const uint32_t *b1 = gs_sampler_batch(&r1, t);

        for (k = 0; k < 8; k++) {
          CHECK(a[k] == b0[k], "step %u: rank 0 [%u] = %u, W=1 has %u", t, k, b0[k], a[k]);
          CHECK(a[8 + k] == b1[k], "step %u: rank 1 [%u] = %u, W=1 has %u", t, k, b1[k], a[8 + k]);
        }
      }
    }
    gs_sampler_free(&one);
    gs_sampler_free(&r0);
    gs_sampler_free(&r1);
  }
}
END_TEST

START_TEST(sampler_identity)
{
  gs_sampler_t s;
  uint32_t t, k, r;

  for (r = 0; r < 3; r++) {
    ck_assert_int_eq(gs_sampler_init(&s, 100, 5, r, 3, 99, false), 0);
    gs_sampler_set_epoch(&s, 4); /* no shuffle: every epoch is the same */
    ck_assert_uint_eq(gs_sampler_steps_per_epoch(&s), 6);
    for (k = 0; k < 100; k++)
      ck_assert_uint_eq(s.perm[k], k);
    for (t = 0; t < 6; t++)
      for (k = 0; k < 5; k++)
        ck_assert_uint_eq(gs_sampler_batch(&s, t)[k], t * 15 + r * 5 + k);
    gs_sampler_free(&s);
    ck_assert_ptr_null(s.perm);
  }
}
END_TEST

START_TEST(sampler_determinism)
{
  gs_sampler_t a, b, c;
  uint32_t *epoch0 = malloc(5000 * sizeof(uint32_t));
  uint32_t k, fixed = 0;

  ck_assert_int_eq(gs_sampler_init(&a, 5000, 10, 0, 1, 1234, true), 0);
  ck_assert_int_eq(gs_sampler_init(&b, 5000, 25, 1, 4, 1234, true), 0);
  ck_assert_int_eq(gs_sampler_init(&c, 5000, 10, 0, 1, 1235, true), 0);
  ck_assert_uint_eq(a.epoch, 0);
  expect_permutation(a.perm, 5000);
  /* Same (seed, epoch), whatever the batch or rank: same permutation. */
  ck_assert_int_eq(memcmp(a.perm, b.perm, 5000 * sizeof(uint32_t)), 0);
  /* Shuffled: few indices stay put (about 1 expected). */
  for (k = 0; k < 5000; k++)
    fixed += a.perm[k] == k;
  ck_assert_uint_lt(fixed, 10);
  /* Another seed: another permutation. */
  ck_assert_int_ne(memcmp(a.perm, c.perm, 5000 * sizeof(uint32_t)), 0);
  memcpy(epoch0, a.perm, 5000 * sizeof(uint32_t));
  /* Another epoch: another permutation; back to 0: the first again. */
  gs_sampler_set_epoch(&a, 1);
  ck_assert_uint_eq(a.epoch, 1);
  expect_permutation(a.perm, 5000);
  ck_assert_int_ne(memcmp(a.perm, epoch0, 5000 * sizeof(uint32_t)), 0);
  gs_sampler_set_epoch(&b, 1);
  ck_assert_int_eq(memcmp(a.perm, b.perm, 5000 * sizeof(uint32_t)), 0);
  gs_sampler_set_epoch(&a, 1); /* unchanged */
  ck_assert_int_eq(memcmp(a.perm, b.perm, 5000 * sizeof(uint32_t)), 0);
  gs_sampler_set_epoch(&a, 0);
  ck_assert_int_eq(memcmp(a.perm, epoch0, 5000 * sizeof(uint32_t)), 0);
  /* The mix of seed and epoch is not a plain xor or sum: seed s at
   * epoch 1 and seed s+1 at epoch 0 differ. */
  gs_sampler_set_epoch(&a, 1);
  ck_assert_int_ne(memcmp(a.perm, c.perm, 5000 * sizeof(uint32_t)), 0);
  gs_sampler_free(&a);
  gs_sampler_free(&b);
  gs_sampler_free(&c);
  free(epoch0);
}
END_TEST

/* Fisher-Yates gives each of the 6 orders of 3 items equally often over
 * many seeds (a common off-by-one makes some orders twice as likely). */
START_TEST(sampler_shuffle_fair)
{
  uint32_t counts[27] = {0}, seed, k, n = 6000;
  gs_sampler_t s;
  double chi = 0;

  for (seed = 0; seed < n; seed++) {
    ck_assert_int_eq(gs_sampler_init(&s, 3, 1, 0, 1, seed, true), 0);
    counts[s.perm[0] * 9 + s.perm[1] * 3 + s.perm[2]]++;
    gs_sampler_free(&s);
  }
  for (k = 0; k < 27; k++) {
    bool perm = k / 9 != k / 3 % 3 && k / 9 != k % 3 && k / 3 % 3 != k % 3;

    if (!perm) {
      ck_assert_uint_eq(counts[k], 0);
      continue;
    }
    chi += (counts[k] - 1000.0) * (counts[k] - 1000.0) / 1000.0;
  }
  /* 5 degrees of freedom: P(chi > 25) < 0.0002. */
  ck_assert_msg(chi < 25, "chi-square %g", chi);
}
END_TEST

START_TEST(sampler_init_errors)
{
  gs_sampler_t s;

  ck_assert_int_eq(gs_sampler_init(&s, 100, 0, 0, 1, 1, true), GS_EINVAL);
  ck_assert_ptr_null(s.perm);
  ck_assert_int_eq(gs_sampler_init(&s, 100, 10, 0, 0, 1, true), GS_EINVAL);
  ck_assert_int_eq(gs_sampler_init(&s, 100, 10, 2, 2, 1, true), GS_EINVAL);
  ck_assert_int_eq(gs_sampler_init(&s, 100, 10, 7, 2, 1, true), GS_EINVAL);
  ck_assert_int_eq(gs_sampler_init(&s, 100, 51, 0, 2, 1, true), GS_EINVAL);
  ck_assert_int_eq(gs_sampler_init(&s, 100, 101, 0, 1, 1, false), GS_EINVAL);
  ck_assert_int_eq(gs_sampler_init(&s, 0, 1, 0, 1, 1, true), GS_EINVAL);
  /* world * batch would wrap to 0 in 32 bits. */
  ck_assert_int_eq(gs_sampler_init(&s, 100, 1u << 16, 0, 1u << 16, 1, true), GS_EINVAL);
  ck_assert_ptr_null(s.perm);
  /* One global batch of exactly the dataset: one step. */
  ck_assert_int_eq(gs_sampler_init(&s, 100, 50, 1, 2, 1, true), 0);
  ck_assert_uint_eq(gs_sampler_steps_per_epoch(&s), 1);
  ck_assert_ptr_eq(gs_sampler_batch(&s, 0), s.perm + 50);
  ck_assert_ptr_null(gs_sampler_batch(&s, 1));
  gs_sampler_free(&s);
}
END_TEST

/* ---- the generator ---- */

START_TEST(rng_reference)
{
  /* splitmix64 from state 0, as published with the algorithm. */
  static const uint64_t want[] = {0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull,
                                  0x06c45d188009454full};
  gs_rng_t r, r2;
  uint32_t i;
  float f;

  gs_rng_seed(&r, 0);
  for (i = 0; i < COUNT(want); i++)
    ck_assert_msg(gs_rng_next(&r) == want[i], "output %u wrong", i);
  gs_rng_seed(&r, 0);
  gs_rng_seed(&r2, 0);
  f = gs_rng_uniform(&r2);
  ck_assert_float_eq(f, (float)(want[0] >> 40) / 16777216.0f);
  (void)gs_rng_next(&r);
  ck_assert_uint_eq(r.state, r2.state);
}
END_TEST

START_TEST(rng_uniform)
{
  gs_rng_t r;
  double sum = 0;
  uint32_t i, n = 200000;
  float f;

  gs_rng_seed(&r, 77);
  for (i = 0; i < n; i++) {
    f = gs_rng_uniform(&r);
    CHECK(f >= 0.0f && f < 1.0f, "uniform gave %g", f);
    CHECK(f * 16777216.0f == floorf(f * 16777216.0f), "%g has more than 24 bits", f);
    sum += f;
  }
  ck_assert_double_eq_tol(sum / n, 0.5, 0.005);
}
END_TEST

/* Draws `draws` values below n into `buckets` equal ranges and returns the
 * chi-square statistic against a uniform spread. */
static double chi_square_below(gs_rng_t *r, uint32_t n, uint32_t buckets, uint32_t draws)
{
  uint32_t *counts = calloc(buckets, sizeof(*counts)), i, v;
  double expect = (double)draws / buckets, chi = 0;

  for (i = 0; i < draws; i++) {
    v = gs_rng_below(r, n);
    CHECK(v < n, "below(%u) gave %u", n, v);
    counts[(uint64_t)v * buckets / n]++;
  }
  for (i = 0; i < buckets; i++)
    chi += (counts[i] - expect) * (counts[i] - expect) / expect;
  free(counts);
  return chi;
}

START_TEST(rng_below)
{
  static const uint32_t ns[] = {1, 2, 3, 7, 10, 1000, 0x80000001u, 0xfffffffeu, 0xffffffffu};
  gs_rng_t r;
  uint32_t i, k, v;
  double chi;

  gs_rng_seed(&r, 5);
  for (i = 0; i < COUNT(ns); i++)
    for (k = 0; k < 20000; k++)
      CHECK((v = gs_rng_below(&r, ns[i])) < ns[i], "below(%u) gave %u", ns[i], v);
  /* 10 values, 9 degrees of freedom: P(chi > 40) < 1e-5. */
  chi = chi_square_below(&r, 10, 10, 100000);
  ck_assert_msg(chi < 40, "n = 10: chi-square %g", chi);
  /* n = 3 * 2^30: a plain 32-bit modulo would make the first third twice
   * as likely as the others, which this catches by a wide margin. */
  chi = chi_square_below(&r, 0xc0000000u, 3, 60000);
  ck_assert_msg(chi < 25, "n = 3 * 2^30: chi-square %g", chi);
  /* n = 2^31 + 1: rejection is nearly half the draws; still uniform. */
  chi = chi_square_below(&r, 0x80000001u, 8, 80000);
  ck_assert_msg(chi < 30, "n = 2^31 + 1: chi-square %g", chi);
}
END_TEST

/* ---- the suite ---- */

static TCase *tcase(const char *name, const TTest *test, int timeout)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  tcase_set_timeout(tc, timeout);
  return tc;
}

static Suite *data_suite(void)
{
  Suite *s = suite_create("data");

  suite_add_tcase(s, tcase("real_train", real_train, 30));
  suite_add_tcase(s, tcase("real_t10k", real_t10k, 10));
  suite_add_tcase(s, tcase("plain_vs_gzip", plain_vs_gzip, 10));
  suite_add_tcase(s, tcase("parse_valid", parse_valid, 5));
  suite_add_tcase(s, tcase("parse_errors", parse_errors, 5));
  suite_add_tcase(s, tcase("parse_guard_page", parse_guard_page, 5));
  suite_add_tcase(s, tcase("load_file_errors", load_file_errors, 5));
  suite_add_tcase(s, tcase("load_gzip", load_gzip, 5));
  suite_add_tcase(s, tcase("gunzip_cap", gunzip_cap, 5));
  suite_add_tcase(s, tcase("gzip_bomb_bounded", gzip_bomb_bounded, 60));
  suite_add_tcase(s, tcase("fifo_refused", fifo_refused, 5));
  suite_add_tcase(s, tcase("dataset_features", dataset_features, 5));
  suite_add_tcase(s, tcase("dataset_small", dataset_small, 5));
  suite_add_tcase(s, tcase("dataset_errors", dataset_errors, 5));
  suite_add_tcase(s, tcase("dataset_label_out_of_range", dataset_label_out_of_range, 5));
  suite_add_tcase(s, tcase("sampler_epoch_cover", sampler_epoch_cover, 10));
  suite_add_tcase(s, tcase("sampler_equivalence", sampler_equivalence, 5));
  suite_add_tcase(s, tcase("sampler_identity", sampler_identity, 5));
  suite_add_tcase(s, tcase("sampler_determinism", sampler_determinism, 5));
  suite_add_tcase(s, tcase("sampler_shuffle_fair", sampler_shuffle_fair, 10));
  suite_add_tcase(s, tcase("sampler_init_errors", sampler_init_errors, 5));
  suite_add_tcase(s, tcase("rng_reference", rng_reference, 5));
  suite_add_tcase(s, tcase("rng_uniform", rng_uniform, 5));
  suite_add_tcase(s, tcase("rng_below", rng_below, 10));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {data_suite}, .scratch = "test_data"};
