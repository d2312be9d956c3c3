/* Tests for agent/engine/checkpoint.c: bit-exact round trips, retention, and the
 * loader's fallback past corrupt, torn, foreign and stray files, on real
 * files in fresh temporary directories; plus the Python reader from
 * docs/checkpoint.md run against a file written here. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "scratch.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define HASH 0x0123456789abcdefULL
#define NOBODY 65534
#define PYTHON "/usr/bin/python3"

/* Four buffers, one of them empty, and the state describing them. */
typedef struct tstate {
  float a[7];
  float c[1000];
  float d[3];
  gs_ckpt_buffer_t bufs[4];
  gs_ckpt_state_t st;
} tstate_t;

/* A captured log: warnings land in `text`. */
typedef struct tlog {
  char *text;
  size_t len;
  FILE *f;
  gs_log_t log;
} tlog_t;

static float from_bits(uint32_t u)
{
  float f;

  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t to_bits(float f)
{
  uint32_t u;

  memcpy(&u, &f, sizeof(u));
  return u;
}

/* Points the state at its own arrays with the given position and hash. */
static void tstate_wire(tstate_t *t, uint64_t step, uint64_t hash)
{
  t->bufs[0] = (gs_ckpt_buffer_t){t->a, COUNT(t->a)};
  t->bufs[1] = (gs_ckpt_buffer_t){NULL, 0};
  t->bufs[2] = (gs_ckpt_buffer_t){t->c, COUNT(t->c)};
  t->bufs[3] = (gs_ckpt_buffer_t){t->d, COUNT(t->d)};
  t->st = (gs_ckpt_state_t){
      step, step / 10, step * 7919 + 1, hash, COUNT(t->bufs), t->bufs, NULL, 0, 0, 0, 0, NULL, 0};
}

/* Fills the buffers with special values (NaNs with payloads, signed zeros,
 * denormals, infinities) and pseudo-random bit patterns drawn from `seed`. */
static void tstate_fill(tstate_t *t, uint64_t step, uint32_t seed)
{
  /* quiet NaN (payload set below), negative signalling NaN, -0.0, +0.0,
   * smallest denormal, largest negative denormal, largest float */
  static const uint32_t special[] = {0x7fc00000u, 0xff812345u, 0x80000000u, 0x00000000u,
                                     0x00000001u, 0x807fffffu, 0x7f7fffffu};
  uint32_t x = seed * 2654435761u + 1;

  for (uint32_t i = 0; i < COUNT(t->a); i++)
    t->a[i] = from_bits(special[i]);
  t->a[0] = from_bits(special[0] | (seed & 0xffff));
  for (uint32_t i = 0; i < COUNT(t->c); i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t->c[i] = from_bits(x);
  }
  t->d[0] = from_bits(0x7f800000u); /* +inf */
  t->d[1] = from_bits(0xff800000u); /* -inf */
  t->d[2] = (float)seed + 0.5f;
  tstate_wire(t, step, HASH);
}

/* A state of the same shape whose buffers hold a recognisable filler. */
static void tstate_blank(tstate_t *t, uint64_t hash)
{
  memset(t, 0xa5, sizeof(*t));
  tstate_wire(t, 0, hash);
  t->st.step = t->st.epoch = t->st.rng_state = t->st.sample = 0xa5a5a5a5a5a5a5a5ULL;
  t->st.world_size = 0xa5a5a5a5u;
}

static void expect_same_data(const tstate_t *got, const tstate_t *want)
{
  ck_assert_msg(memcmp(got->a, want->a, sizeof(got->a)) == 0, "buffer 0 differs");
  ck_assert_msg(memcmp(got->c, want->c, sizeof(got->c)) == 0, "buffer 2 differs");
  ck_assert_msg(memcmp(got->d, want->d, sizeof(got->d)) == 0, "buffer 3 differs");
}

static void expect_same(const tstate_t *got, const tstate_t *want)
{
  expect_same_data(got, want);
  ck_assert_uint_eq(got->st.step, want->st.step);
  ck_assert_uint_eq(got->st.epoch, want->st.epoch);
  ck_assert_uint_eq(got->st.rng_state, want->st.rng_state);
  /* Saved only with the world size (version 4); loaded as 0 without. */
  ck_assert_uint_eq(got->st.world_size, want->st.world_size);
  ck_assert_uint_eq(got->st.sample, want->st.world_size ? want->st.sample : 0);
}

static char *make_dir(void)
{
  char dir[PATH_MAX];

  ts_mkdtemp(dir, sizeof(dir), "ckpt");
  return strdup(dir);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb;
  (void)ftw;
  if (flag == FTW_DP)
    chmod(path, 0700); /* a test may have made it read-only */
  return remove(path);
}

static void rm_dir(char *dir)
{
  chmod(dir, 0700);
  nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static void tlog_open(tlog_t *l)
{
  l->text = NULL;
  l->len = 0;
  l->f = open_memstream(&l->text, &l->len);
  ck_assert_ptr_nonnull(l->f);
  l->log = (gs_log_t){GS_LOG_DEBUG, l->f, "test"};
}

static void tlog_close(tlog_t *l)
{
  fclose(l->f);
  free(l->text);
}

static const char *tlog_text(tlog_t *l)
{
  fflush(l->f);
  return l->text ? l->text : "";
}

static void save(const char *dir, const tstate_t *t, uint32_t keep)
{
  char why[512] = "";

  ck_assert_msg(gs_checkpoint_save(dir, &t->st, keep, NULL, 0, why, sizeof(why)) == 0, "%s", why);
}

static void name_of(char *out, size_t len, const char *dir, uint64_t step)
{
  snprintf(out, len, "%s/ckpt-%012llu.gsck", dir, (unsigned long long)step);
}

static bool exists(const char *path)
{
  return access(path, F_OK) == 0;
}

static long file_size(const char *path)
{
  struct stat sb;

  ck_assert_int_eq(stat(path, &sb), 0);
  return (long)sb.st_size;
}

static void xor_byte(const char *path, long off, uint8_t mask)
{
  int fd = open(path, O_RDWR);
  uint8_t b;

  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pread(fd, &b, 1, off), 1);
  b ^= mask;
  ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

/* Loads the newest valid checkpoint of `dir` into a blank state; returns
 * the loader's result, `why` and the path. */
static int load_latest(const char *dir, tstate_t *got, tlog_t *l, char *path, size_t path_len,
                       char *why, size_t why_len)
{
  tstate_blank(got, HASH);
  return gs_checkpoint_load_latest(dir, &got->st, &l->log, path, path_len, why, why_len);
}

/* Expects loading `dir` to skip the file of `bad_step` with a warning that
 * contains `reason`, and to load `good` (step `good_step`) instead. */
static void expect_fallback(const char *dir, uint64_t bad_step, const char *reason,
                            const tstate_t *good, uint64_t good_step, const char *what)
{
  char path[PATH_MAX], want[PATH_MAX], bad[PATH_MAX], why[512] = "";
  tstate_t got;
  tlog_t l;
  int err;

  tlog_open(&l);
  err = load_latest(dir, &got, &l, path, sizeof(path), why, sizeof(why));
  ck_assert_msg(err == 0, "%s: %s (%s)", what, why, gs_strerror(err));
  name_of(want, sizeof(want), dir, good_step);
  name_of(bad, sizeof(bad), dir, bad_step);
  ck_assert_str_eq(path, want);
  expect_same(&got, good);
  ck_assert_msg(strstr(tlog_text(&l), bad) && strstr(tlog_text(&l), ", skipped") &&
                    strstr(tlog_text(&l), " WARN "),
                "%s: no warning naming %s: [%s]", what, bad, tlog_text(&l));
  ck_assert_msg(!reason || strstr(tlog_text(&l), reason), "%s: want '%s' in [%s]", what, reason,
                tlog_text(&l));
  tlog_close(&l);
}

START_TEST(round_trip)
{
  char *dir = make_dir(), path[PATH_MAX], want[PATH_MAX], why[512] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  ck_assert_int_eq(gs_checkpoint_save(dir, &t.st, 0, path, sizeof(path), why, sizeof(why)), 0);
  name_of(want, sizeof(want), dir, 100);
  ck_assert_str_eq(path, want);
  ck_assert_int_eq(file_size(path), 48 + 4 * 8 + 4 * (7 + 1000 + 3) + 12);

  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, path, sizeof(path), why, sizeof(why)), 0);
  ck_assert_str_eq(path, want);
  expect_same(&got, &t);
  ck_assert_uint_eq(got.st.layout_hash, HASH);
  ck_assert_uint_eq(got.st.nbuf, 4);
  ck_assert_str_eq(tlog_text(&l), ""); /* nothing skipped, nothing said */
  tlog_close(&l);

  tstate_blank(&got, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(want, &got.st, why, sizeof(why)), 0);
  expect_same(&got, &t);
  /* Bit patterns, not just values: NaN payloads and -0.0 survive. */
  ck_assert_uint_eq(to_bits(got.a[0]), 0x7fc00001u);
  ck_assert_uint_eq(to_bits(got.a[1]), 0xff812345u);
  ck_assert_uint_eq(to_bits(got.a[2]), 0x80000000u);
  ck_assert_uint_eq(to_bits(got.a[4]), 0x00000001u);
  rm_dir(dir);
}
END_TEST

START_TEST(position_round_trip)
{
  /* step, epoch, rng_state, sample */
  static const uint64_t cases[][4] = {
      {0, 0, 0, 0},
      {1, 2, 3, 4},
      {UINT64_MAX, UINT64_MAX - 1, 0xfedcba9876543210ULL, UINT64_MAX - 1},
      {999999999999ULL, 1ULL << 63, 1, 1ULL << 63},
      {1000000000000ULL, 7, UINT64_MAX, UINT64_MAX}, /* 13 digits: the name grows */
  };
  char *dir = make_dir(), path[PATH_MAX], want[PATH_MAX], why[512];
  tstate_t t, got;

  for (uint32_t i = 0; i < COUNT(cases); i++) {
    tstate_fill(&t, cases[i][0], i);
    t.st.epoch = cases[i][1];
    t.st.rng_state = cases[i][2];
    t.st.sample = cases[i][3];
    t.st.world_size = i % 2 ? UINT32_MAX : i + 1; /* with a world size: version 4 */
    ck_assert_int_eq(gs_checkpoint_save(dir, &t.st, 0, path, sizeof(path), why, sizeof(why)), 0);
    name_of(want, sizeof(want), dir, cases[i][0]);
    ck_assert_str_eq(path, want);
    tstate_blank(&got, HASH);
    ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
    expect_same(&got, &t);
  }
  /* The newest of them all is the UINT64_MAX one. */
  tstate_blank(&got, HASH);
  ck_assert_int_eq(
      gs_checkpoint_load_latest(dir, &got.st, NULL, path, sizeof(path), why, sizeof(why)), 0);
  ck_assert_uint_eq(got.st.step, UINT64_MAX);
  ck_assert_uint_eq(got.st.epoch, UINT64_MAX - 1);
  ck_assert_uint_eq(got.st.sample, UINT64_MAX - 1);
  ck_assert_uint_eq(got.st.world_size, 3);
  rm_dir(dir);
}
END_TEST

/* A buffer of many MiB goes through the 1 MiB scratch in several pieces. */
START_TEST(large_buffer)
{
  const uint64_t n = (5u << 20) / 4 + 13;
  float *data = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
  char *dir = make_dir(), path[PATH_MAX], why[512];
  gs_ckpt_buffer_t b = {data, n}, bb = {back, n};
  gs_ckpt_state_t st = {42, 1, 2, HASH, 1, &b, NULL, 0, 0, 0, 0, NULL, 0},
                  in = {0, 0, 0, HASH, 1, &bb, NULL, 0, 0, 0, 0, NULL, 0};

  ck_assert_ptr_nonnull(data);
  ck_assert_ptr_nonnull(back);
  for (uint64_t i = 0; i < n; i++)
    data[i] = (float)i * 0.25f - 3.0f;
  memset(back, 0, n * sizeof(float));
  ck_assert_int_eq(gs_checkpoint_save(dir, &st, 1, path, sizeof(path), why, sizeof(why)), 0);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &in, why, sizeof(why)), 0);
  ck_assert(memcmp(data, back, n * sizeof(float)) == 0);
  ck_assert_uint_eq(in.step, 42);
  free(data);
  free(back);
  rm_dir(dir);
}
END_TEST

static uint32_t count_entries(const char *dir)
{
  char cmd[PATH_MAX + 64];
  uint32_t n = 0;
  FILE *p;
  int c;

  snprintf(cmd, sizeof(cmd), "ls -A '%s'", dir);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  while ((c = fgetc(p)) != EOF)
    n += c == '\n';
  pclose(p);
  return n;
}

START_TEST(retention)
{
  char *dir = make_dir(), path[PATH_MAX];
  tstate_t t;

  for (uint64_t step = 1; step <= 5; step++) {
    tstate_fill(&t, step * 100, (uint32_t)step);
    save(dir, &t, 2);
  }
  for (uint64_t step = 1; step <= 5; step++) {
    name_of(path, sizeof(path), dir, step * 100);
    ck_assert_msg(exists(path) == (step >= 4), "step %llu", (unsigned long long)step * 100);
  }
  ck_assert_uint_eq(count_entries(dir), 2); /* no .tmp left behind either */

  /* keep 0 removes nothing. */
  tstate_fill(&t, 600, 6);
  save(dir, &t, 0);
  ck_assert_uint_eq(count_entries(dir), 3);

  /* A save below the newest file (after a restore from an older one) keeps
   * itself and the newer file, and prunes only older ones. */
  tstate_fill(&t, 450, 7);
  save(dir, &t, 1);
  ck_assert_uint_eq(count_entries(dir), 3); /* 450, 500, 600 */
  name_of(path, sizeof(path), dir, 400);
  ck_assert(!exists(path));
  name_of(path, sizeof(path), dir, 450);
  ck_assert(exists(path));
  name_of(path, sizeof(path), dir, 600);
  ck_assert(exists(path));
  tstate_fill(&t, 700, 8);
  save(dir, &t, 1);
  ck_assert_uint_eq(count_entries(dir), 1);
  rm_dir(dir);
}
END_TEST

/* Saves a good step 100 and a different step 200 in a fresh directory. */
static char *two_checkpoints(tstate_t *old, tstate_t *newer, char *newest, size_t len)
{
  char *dir = make_dir();

  tstate_fill(old, 100, 1);
  tstate_fill(newer, 200, 2);
  save(dir, old, 0);
  save(dir, newer, 0);
  name_of(newest, len, dir, 200);
  return dir;
}

/* One byte changed in each region of the newest file: the header fields,
 * a count, data of each buffer, the CRC and the end magic. */
START_TEST(corrupt_byte_falls_back)
{
  static const struct {
    long off; /* negative: from the end */
    const char *reason;
  } cases[] = {
      {0, "bad magic"},
      {7, "bad magic"},
      {8, "format version"},
      {12, "20 buffers, expected 4"},
      {16, "CRC mismatch"}, /* step */
      {24, "CRC mismatch"}, /* epoch */
      {39, "CRC mismatch"}, /* rng_state */
      {40, "layout hash"},
      {48, "buffer 0 has"},
      {60, "CRC mismatch"},                         /* buffer 0 data */
      {48 + 8 + 28 + 8 + 8 + 2000, "CRC mismatch"}, /* middle of buffer 2 */
      {-13, "CRC mismatch"},                        /* last data byte */
      {-12, "CRC mismatch"},
      {-9, "CRC mismatch"},
      {-8, "bad end magic"},
      {-1, "bad end magic"},
  };
  char newest[PATH_MAX], what[64];
  tstate_t old, newer;

  for (uint32_t i = 0; i < COUNT(cases); i++) {
    char *dir = two_checkpoints(&old, &newer, newest, sizeof(newest));
    long off = cases[i].off < 0 ? file_size(newest) + cases[i].off : cases[i].off;

    xor_byte(newest, off, 0x10);
    snprintf(what, sizeof(what), "byte %ld", off);
    expect_fallback(dir, 200, cases[i].reason, &old, 100, what);
    rm_dir(dir);
  }
}
END_TEST

/* Every byte of a small file, three different flips each: no single
 * changed byte gets through. Twice: version 1, and version 6 (a flip in
 * the description length, world size, sample offset, optimizer steps or
 * the front end's bytes included). */
START_TEST(every_byte_checked)
{
  static const uint8_t masks[] = {0x01, 0x80, 0xff};
  float a[3] = {1.0f, -2.0f, 3.5f}, b[3] = {9.0f, 8.0f, 7.0f}, got[3];
  gs_ckpt_buffer_t ba[2] = {{a, 3}, {NULL, 0}}, bb[2] = {{b, 3}, {NULL, 0}};
  gs_ckpt_buffer_t bg[2] = {{got, 3}, {NULL, 0}};
  FILE *devnull = fopen("/dev/null", "w");
  gs_log_t quiet = {GS_LOG_WARN, devnull, "test"};

  ck_assert_ptr_nonnull(devnull);
  for (uint32_t world = 0; world <= 2; world += 2) {
    gs_ckpt_state_t sa = {1, 0,  5,    HASH,         2, ba, NULL, world, 0x1122334455667788ULL,
                          0, 77, "xy", world ? 2 : 0};
    gs_ckpt_state_t sb = {2, 0,  6,     HASH,         2, bb, NULL, world, 0x8877665544332211ULL,
                          0, 88, "xyz", world ? 3 : 0};
    char *dir = make_dir(), path[PATH_MAX], why[512];
    long size;

    ck_assert_int_eq(gs_checkpoint_save(dir, &sa, 0, NULL, 0, why, sizeof(why)), 0);
    ck_assert_int_eq(gs_checkpoint_save(dir, &sb, 0, path, sizeof(path), why, sizeof(why)), 0);
    size = file_size(path);
    ck_assert_int_eq(size, 48 + 8 + 12 + 8 + (world ? 4 + 4 + 8 + 8 + 8 + 3 : 0) + 12);
    for (long off = 0; off < size; off++) {
      for (uint32_t m = 0; m < COUNT(masks); m++) {
        gs_ckpt_state_t sg = {0, 0, 0, HASH, 2, bg, NULL, 7, 7, 0, 0, NULL, 0};
        int err;

        memset(got, 0, sizeof(got));
        xor_byte(path, off, masks[m]);
        err = gs_checkpoint_load_latest(dir, &sg, &quiet, NULL, 0, why, sizeof(why));
        ck_assert_msg(err == 0 && sg.step == 1 && sg.rng_state == 5,
                      "world %u, byte %ld ^ 0x%02x: step %llu", world, off, masks[m],
                      (unsigned long long)sg.step);
        ck_assert_uint_eq(sg.world_size, world);
        ck_assert_uint_eq(sg.sample, world ? sa.sample : 0);
        /* Version 5 stores the optimizer steps; before it they are the step. */
        ck_assert_uint_eq(sg.optim_steps, world ? sa.optim_steps : sa.step);
        /* Version 6 stores the front end's bytes. */
        ck_assert_uint_eq(sg.extra_len, world ? 2 : 0);
        ck_assert(!world || memcmp(sg.extra, "xy", 2) == 0);
        free(sg.extra);
        ck_assert(memcmp(got, a, sizeof(a)) == 0);
        xor_byte(path, off, masks[m]);
      }
    }
    rm_dir(dir);
  }
  fclose(devnull);
}
END_TEST

/* A file failing the CRC is verified before anything reaches the
 * caller's buffers, so they keep their contents. */
START_TEST(corrupt_leaves_buffers)
{
  char newest[PATH_MAX], oldest[PATH_MAX], why[512] = "";
  tstate_t old, newer, got, blank;
  char *dir = two_checkpoints(&old, &newer, newest, sizeof(newest));
  tlog_t l;

  xor_byte(newest, 48 + 8 + 28 + 8 + 8 + 3999, 0x01); /* last byte of buffer 2 */
  tstate_blank(&got, HASH);
  tstate_blank(&blank, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(newest, &got.st, why, sizeof(why)), GS_EPROTO);
  ck_assert_msg(strstr(why, newest) && strstr(why, "CRC mismatch (file 0x"), "%s", why);
  ck_assert(memcmp(&got, &blank, offsetof(tstate_t, bufs)) == 0);
  ck_assert_uint_eq(got.st.step, blank.st.step);

  /* With no valid file at all, GS_ENOTFOUND leaves the buffers alone too. */
  name_of(oldest, sizeof(oldest), dir, 100);
  ck_assert_int_eq(unlink(oldest), 0);
  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, NULL, 0, why, sizeof(why)), GS_ENOTFOUND);
  ck_assert_msg(strstr(why, dir) && strstr(why, "1 skipped"), "%s", why);
  ck_assert(memcmp(&got, &blank, offsetof(tstate_t, bufs)) == 0);
  tlog_close(&l);
  rm_dir(dir);
}
END_TEST

START_TEST(truncated_skipped)
{
  char newest[PATH_MAX], what[64];
  tstate_t old, newer;
  char *dir = two_checkpoints(&old, &newer, newest, sizeof(newest));
  long size = file_size(newest);
  const long cuts[] = {0, 1, 8, 47, 48, 55, 56, 60, 100, size / 2, size - 13, size - 12, size - 1};

  for (uint32_t i = 0; i < COUNT(cuts); i++) {
    ck_assert_int_eq(truncate(newest, cuts[i]), 0);
    snprintf(what, sizeof(what), "cut at %ld", cuts[i]);
    expect_fallback(dir, 200, "truncated", &old, 100, what);
    save(dir, &newer, 0); /* whole again */
  }
  /* A byte too many is refused as well. */
  ck_assert_int_eq(truncate(newest, size + 1), 0);
  expect_fallback(dir, 200, "trailing bytes", &old, 100, "one byte appended");
  rm_dir(dir);
}
END_TEST

static void write_file(const char *path, const void *data, size_t len)
{
  FILE *f = fopen(path, "wb");

  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* The bytes of the file at `path` (*len of them); caller frees. */
static uint8_t *read_whole(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  uint8_t *data;

  *len = (size_t)file_size(path);
  ck_assert_ptr_nonnull(f);
  data = malloc(*len ? *len : 1);
  ck_assert_ptr_nonnull(data);
  ck_assert_uint_eq(fread(data, 1, *len, f), *len);
  fclose(f);
  return data;
}

static void copy_file(const char *from, const char *to)
{
  size_t len;
  uint8_t *data = read_whole(from, &len);

  write_file(to, data, len);
  free(data);
}

/* Writes `data` (a whole checkpoint) to `path` with the CRC of its
 * trailer computed afresh, as a writer of that content would have. */
static void write_with_crc(const char *path, uint8_t *data, size_t len)
{
  uint32_t crc = (uint32_t)crc32(0, data, (uInt)(len - 12));

  for (int i = 0; i < 4; i++)
    data[len - 12 + i] = (uint8_t)(crc >> (8 * i));
  write_file(path, data, len);
}

/* Turns the file of version `version` + 1 at `path` into the file of
 * `version` the writer made of the same state before: without its last
 * field (version 5's optimizer steps, version 4's sample offset). */
static void rewrite_as_older(const char *path, uint8_t version)
{
  size_t len;
  uint8_t *data = read_whole(path, &len);

  ck_assert_uint_eq(data[8], version + 1);
  data[8] = version;
  memmove(data + len - 12 - 8, data + len - 12, 12); /* the trailer over the last field */
  write_with_crc(path, data, len - 8);
  free(data);
}

/* Leftover .tmp files (complete or torn) and other names are not read. */
START_TEST(strays_ignored)
{
  char *dir = make_dir(), path[PATH_MAX], src[PATH_MAX], why[512] = "";
  tstate_t t, newer, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  tstate_fill(&newer, 300, 3);
  save(dir, &t, 0);
  save(dir, &newer, 0);
  name_of(src, sizeof(src), dir, 300);
  /* A valid file under names the loader must not take. */
  snprintf(path, sizeof(path), "%s/.ckpt-000000000300.tmp", dir);
  ck_assert_int_eq(rename(src, path), 0);
  snprintf(src, sizeof(src), "%s/ckpt-300.gsck", dir);
  copy_file(path, src);
  snprintf(src, sizeof(src), "%s/ckpt-000000000300.gsck.bak", dir);
  copy_file(path, src);
  snprintf(path, sizeof(path), "%s/.ckpt-000000000400.tmp", dir);
  write_file(path, "GSCKPT", 6);
  snprintf(path, sizeof(path), "%s/notes.txt", dir);
  write_file(path, "hello", 5);
  snprintf(path, sizeof(path), "%s/ckpt-000000000900.gsck", dir);
  ck_assert_int_eq(mkdir(path, 0755), 0); /* a directory under a valid name */

  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, path, sizeof(path), why, sizeof(why)), 0);
  expect_same(&got, &t);
  ck_assert_msg(strstr(tlog_text(&l), "ckpt-000000000900.gsck: not a regular file, skipped"), "%s",
                tlog_text(&l));
  ck_assert_msg(!strstr(tlog_text(&l), ".tmp") && !strstr(tlog_text(&l), "ckpt-300"), "%s",
                tlog_text(&l));
  tlog_close(&l);
  rm_dir(dir);
}
END_TEST

/* A symlink planted at the temporary file's name is replaced, never written
 * through: its target keeps its bytes. A stale temporary file is replaced. */
START_TEST(tmp_symlink_not_followed)
{
  char *dir = make_dir(), tmp[PATH_MAX], target[PATH_MAX], buf[16];
  tstate_t t, got;
  struct stat sb;
  tlog_t l;
  FILE *f;

  snprintf(target, sizeof(target), "%s/precious", dir);
  write_file(target, "precious", 8);
  snprintf(tmp, sizeof(tmp), "%s/.ckpt-000000000100.tmp", dir);
  ck_assert_int_eq(symlink(target, tmp), 0);
  tstate_fill(&t, 100, 1);
  save(dir, &t, 0);
  f = fopen(target, "rb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fread(buf, 1, sizeof(buf), f), 8);
  fclose(f);
  ck_assert_int_eq(memcmp(buf, "precious", 8), 0);
  ck_assert_int_ne(lstat(tmp, &sb), 0); /* renamed into place, link gone */
  name_of(target, sizeof(target), dir, 100);
  ck_assert_int_eq(lstat(target, &sb), 0);
  ck_assert(S_ISREG(sb.st_mode));

  /* A stale temporary file of a crashed save, longer than the new one. */
  snprintf(tmp, sizeof(tmp), "%s/.ckpt-000000000200.tmp", dir);
  f = fopen(tmp, "wb");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 10000; i++)
    fputc('x', f);
  fclose(f);
  tstate_fill(&t, 200, 2);
  save(dir, &t, 0);
  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, NULL, 0, NULL, 0), 0);
  expect_same(&got, &t);
  tlog_close(&l);
  rm_dir(dir);
}
END_TEST

/* A FIFO under a checkpoint's name is skipped at once, not waited on. */
START_TEST(fifo_skipped)
{
  char *dir = make_dir(), path[PATH_MAX], why[512] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 200);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, NULL, 0, why, sizeof(why)), 0);
  expect_same(&got, &t);
  ck_assert_msg(strstr(tlog_text(&l), "ckpt-000000000200.gsck: not a regular file, skipped"), "%s",
                tlog_text(&l));
  tlog_close(&l);
  tstate_wire(&got, 0, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPROTO);
  rm_dir(dir);
}
END_TEST

/* A file renamed to another step's name is refused. */
START_TEST(renamed_refused)
{
  char *dir = make_dir(), from[PATH_MAX], to[PATH_MAX];
  tstate_t t, newer;

  tstate_fill(&t, 100, 1);
  tstate_fill(&newer, 200, 2);
  save(dir, &t, 0);
  save(dir, &newer, 0);
  name_of(from, sizeof(from), dir, 200);
  name_of(to, sizeof(to), dir, 500);
  ck_assert_int_eq(rename(from, to), 0);
  expect_fallback(dir, 500, "holds step 200, not the step its name says", &t, 100, "renamed");
  rm_dir(dir);
}
END_TEST

START_TEST(layout_mismatch)
{
  char *dir = make_dir(), path[PATH_MAX], why[512] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);

  tstate_blank(&got, HASH ^ 1);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(strstr(why, path) && strstr(why, "layout hash 0x0123456789abcdef differs from the "
                                                 "expected 0x0123456789abcdee"),
                "%s", why);

  /* Only a file of another model: that is the error, not "no checkpoint". */
  tlog_open(&l);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &got.st, &l.log, NULL, 0, why, sizeof(why)),
                   GS_EPRECOND);
  ck_assert_msg(strstr(why, path) && strstr(why, "layout hash"), "%s", why);
  ck_assert_msg(strstr(tlog_text(&l), "layout hash"), "%s", tlog_text(&l));
  tlog_close(&l);

  /* A newer file of another layout is passed over for an older match. */
  tstate_fill(&t, 200, 2);
  t.st.layout_hash = HASH ^ 1;
  save(dir, &t, 0);
  tstate_fill(&t, 100, 1);
  expect_fallback(dir, 200, "layout hash", &t, 100, "newer file of another layout");
  rm_dir(dir);
}
END_TEST

/* Version 2: the layout described in words is stored, read back like
 * version 1, and named next to the model's when the layout differs. */
START_TEST(layout_description)
{
  char *dir = make_dir(), path[PATH_MAX], why[1024] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  t.st.desc = "layers 784,128,10";
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);
  ck_assert_int_eq(file_size(path), 48 + 4 * 8 + 4 * (7 + 1000 + 3) + 4 + 17 + 12);
  tstate_blank(&got, HASH);
  got.st.desc = "layers 784,128,10";
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same(&got, &t);

  /* A bit flip in the description is a CRC mismatch. */
  xor_byte(path, file_size(path) - 12 - 3, 0x01);
  tstate_blank(&got, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPROTO);
  ck_assert_msg(strstr(why, "CRC mismatch"), "%s", why);
  xor_byte(path, file_size(path) - 12 - 3, 0x01);

  tstate_blank(&got, HASH ^ 1);
  got.st.desc = "layers 784,256,10";
  tlog_open(&l);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &got.st, &l.log, NULL, 0, why, sizeof(why)),
                   GS_EPRECOND);
  tlog_close(&l);
  ck_assert_msg(strstr(why, path) &&
                    strstr(why, "another model: the checkpoint has layers 784,128,10, the model "
                                "has layers 784,256,10 (layout hash"),
                "%s", why);
  /* Without the caller's description the hash is named, as for version 1. */
  got.st.desc = NULL;
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(!strstr(why, "another model") && strstr(why, "layout hash"), "%s", why);
  rm_dir(dir);
}
END_TEST

/* The world size after the description (version 3 on; the writer writes
 * version 4, the sample offset after it); loading gives it back, a version
 * 2 file gives 0, and a flipped bit in it is caught. */
START_TEST(world_size_stored)
{
  char *dir = make_dir(), path[PATH_MAX], why[1024] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  t.st.desc = "layers 784,128,10";
  t.st.world_size = 4;
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);
  ck_assert_int_eq(file_size(path), 48 + 4 * 8 + 4 * (7 + 1000 + 3) + 4 + 17 + 4 + 8 + 8 + 8 + 12);
  tstate_blank(&got, HASH);
  got.st.desc = "layers 784,256,10";
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same(&got, &t);
  ck_assert_uint_eq(got.st.world_size, 4);

  xor_byte(path, file_size(path) - 12 - 8 - 4, 0x01); /* world size 5: the CRC says no */
  tstate_blank(&got, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPROTO);
  ck_assert_msg(strstr(why, "CRC mismatch"), "%s", why);
  xor_byte(path, file_size(path) - 12 - 8 - 4, 0x01);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);

  /* Another model: the message names both layouts, as for version 2. */
  tstate_blank(&got, HASH ^ 1);
  got.st.desc = "layers 784,256,10";
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(strstr(why, "the checkpoint has layers 784,128,10, the model has layers"), "%s",
                why);

  /* A newer version 2 file (no world size) loads with world_size 0. */
  tstate_fill(&t, 200, 2);
  t.st.desc = "layers 784,128,10";
  save(dir, &t, 0);
  tstate_blank(&got, HASH);
  got.st.world_size = 9;
  tlog_open(&l);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &got.st, &l.log, NULL, 0, why, sizeof(why)), 0);
  tlog_close(&l);
  expect_same(&got, &t);
  ck_assert_uint_eq(got.st.world_size, 0);
  rm_dir(dir);
}
END_TEST

/* Loads `path` into a blank state, expecting GS_EPROTO and `want` in the
 * reason. */
static void expect_refused(const char *path, const char *want, const char *what)
{
  char why[1024] = "";
  tstate_t got;

  tstate_blank(&got, HASH);
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPROTO);
  ck_assert_msg(strstr(why, path) && strstr(why, want), "%s: want '%s' in '%s'", what, want, why);
}

/* The u64 right before the trailer of the file `data` (`size` bytes, at
 * `path`): a flip in any of its bytes is a CRC mismatch, and a file that
 * ends inside it (or right before it), its trailer kept, "ends before
 * `name`". Leaves the file as `data`. */
static void expect_last_field_checked(const char *path, const uint8_t *data, size_t size,
                                      const char *name)
{
  size_t at = size - 12 - 8;
  uint8_t *cut = malloc(size);
  char what[96], refusal[96];

  ck_assert_ptr_nonnull(cut);
  for (size_t i = 0; i < 8; i++) {
    snprintf(what, sizeof(what), "%s: byte %zu flipped", name, i);
    xor_byte(path, (long)(at + i), 0x40);
    expect_refused(path, "CRC mismatch", what);
    xor_byte(path, (long)(at + i), 0x40);
  }
  snprintf(refusal, sizeof(refusal), "ends before %s", name);
  for (size_t k = 0; k < 8; k++) {
    memcpy(cut, data, at + k);
    memcpy(cut + at + k, data + size - 12, 12);
    write_file(path, cut, at + k + 12);
    snprintf(what, sizeof(what), "%zu bytes of %s", k, name);
    expect_refused(path, refusal, what);
  }
  write_file(path, data, size);
  free(cut);
}

/* Version 4 stores the in-epoch sample offset after the world size: it
 * loads back, a flip in any of its bytes is a CRC mismatch, a file that
 * ends inside it is truncated, one byte more is refused, and a version 3
 * file (the same state without it) loads with sample 0. */
START_TEST(sample_stored)
{
  char *dir = make_dir(), path[PATH_MAX], why[1024] = "", what[64];
  tstate_t t, got;
  size_t size, at;
  uint8_t *data, *cut;

  tstate_fill(&t, 100, 1);
  t.st.desc = "layers 784,128,10";
  t.st.world_size = 4;
  t.st.sample = 0x0102030405060708ULL;
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);
  rewrite_as_older(path, 5);
  rewrite_as_older(path, 4);
  data = read_whole(path, &size);
  ck_assert_uint_eq(size, 48 + 4 * 8 + 4 * (7 + 1000 + 3) + 4 + 17 + 4 + 8 + 12);
  ck_assert_uint_eq(data[8], 4); /* version 4, little-endian */
  at = size - 12 - 8;            /* the sample: little-endian, before the trailer */
  for (size_t i = 0; i < 8; i++)
    ck_assert_uint_eq(data[at + i], 8 - i);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same(&got, &t);
  ck_assert_uint_eq(got.st.sample, 0x0102030405060708ULL);

  expect_last_field_checked(path, data, size, "the sample offset");

  /* Then cut plainly, where the sample is the first field that the
   * trailer leaves no room for. */
  cut = malloc(size + 1);
  ck_assert_ptr_nonnull(cut);
  for (size_t len = at + 12; len < size; len++) {
    write_file(path, data, len);
    snprintf(what, sizeof(what), "cut at %zu of %zu", len, size);
    expect_refused(path, "truncated (", what);
    expect_refused(path, "ends before the sample offset", what);
  }
  write_file(path, data, at + 11);
  expect_refused(path, "ends before the world size", "cut before the sample");

  /* One byte between the sample and the trailer. */
  memcpy(cut, data, at + 8);
  cut[at + 8] = 0;
  memcpy(cut + at + 9, data + size - 12, 12);
  write_with_crc(path, cut, size + 1);
  expect_refused(path, "trailing bytes", "a byte after the sample");

  /* A version from the future is named. */
  memcpy(cut, data, size);
  cut[8] = 7;
  write_with_crc(path, cut, size);
  expect_refused(path, "format version 7, this build reads versions 1 to 6", "version 7");

  /* Version 3, as written before version 4: no sample, sample 0. */
  write_file(path, data, size);
  rewrite_as_older(path, 3);
  ck_assert_int_eq(file_size(path), (long)size - 8);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same_data(&got, &t);
  ck_assert_uint_eq(got.st.step, 100);
  ck_assert_uint_eq(got.st.world_size, 4);
  ck_assert_uint_eq(got.st.sample, 0);
  tstate_blank(&got, HASH);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &got.st, NULL, NULL, 0, why, sizeof(why)), 0);
  ck_assert_uint_eq(got.st.sample, 0);
  free(cut);
  free(data);
  rm_dir(dir);
}
END_TEST

/* Version 5 stores the optimizer's steps after the sample offset: they
 * load back, a flip in any of their bytes is a CRC mismatch, a file that
 * ends inside them is refused, and a version 4 file loads with the step. */
START_TEST(optim_steps_stored)
{
  char *dir = make_dir(), path[PATH_MAX], why[1024] = "";
  tstate_t t, got;
  size_t size, at;
  uint8_t *data;

  tstate_fill(&t, 100, 1);
  t.st.desc = "layers 784,128,10";
  t.st.world_size = 4;
  t.st.sample = 5;
  t.st.optim_steps = 0x0102030405060708ULL;
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);
  rewrite_as_older(path, 5);
  data = read_whole(path, &size);
  ck_assert_uint_eq(data[8], 5);
  at = size - 12 - 8; /* the optimizer steps: little-endian, before the trailer */
  for (size_t i = 0; i < 8; i++)
    ck_assert_uint_eq(data[at + i], 8 - i);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same(&got, &t);
  ck_assert_uint_eq(got.st.sample, 5);
  ck_assert_uint_eq(got.st.optim_steps, 0x0102030405060708ULL);
  expect_last_field_checked(path, data, size, "the optimizer steps");
  rewrite_as_older(path, 4);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  ck_assert_uint_eq(got.st.sample, 5);
  ck_assert_uint_eq(got.st.optim_steps, 100);
  free(data);
  rm_dir(dir);
}
END_TEST

/* Version 6 stores a front end's bytes last: they load back (malloc'd),
 * a flip in them is a CRC mismatch, a length past the file is refused
 * before anything is read by it, and a cut file is refused. */
START_TEST(extra_stored)
{
  char *dir = make_dir(), path[PATH_MAX], why[1024] = "";
  static const char blob[] = "buffers of the model, any bytes\0\1\2";
  tstate_t t, got;
  size_t size, at;
  uint8_t *data;

  tstate_fill(&t, 100, 1);
  t.st.world_size = 2;
  t.st.extra = (void *)blob;
  t.st.extra_len = sizeof(blob);
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);
  data = read_whole(path, &size);
  ck_assert_uint_eq(data[8], 6);
  tstate_blank(&got, HASH);
  ck_assert_msg(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)) == 0, "%s", why);
  expect_same_data(&got, &t);
  ck_assert_uint_eq(got.st.extra_len, sizeof(blob));
  ck_assert(memcmp(got.st.extra, blob, sizeof(blob)) == 0);
  free(got.st.extra);
  at = size - 12 - sizeof(blob); /* the bytes, right before the trailer */
  xor_byte(path, (long)at + 3, 0x10);
  expect_refused(path, "CRC mismatch", "a flip in the front end's bytes");
  xor_byte(path, (long)at + 3, 0x10);
  data[at - 8] = 0xff; /* the length: far past the file */
  write_with_crc(path, data, size);
  expect_refused(path, "ends inside the front end's", "a length past the file");
  write_file(path, data, size - 5);
  expect_refused(path, "truncated (", "cut inside the bytes");
  free(data);
  rm_dir(dir);
}
END_TEST

START_TEST(wrong_counts)
{
  char *dir = make_dir(), path[PATH_MAX], why[512] = "";
  tstate_t t, got;
  tlog_t l;

  tstate_fill(&t, 100, 1);
  save(dir, &t, 0);
  name_of(path, sizeof(path), dir, 100);

  /* Buffer 2 expected one element shorter. */
  tstate_blank(&got, HASH);
  got.bufs[2].count--;
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(strstr(why, path) && strstr(why, "buffer 2 has 1000 elements, expected 999"), "%s",
                why);
  tlog_open(&l);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &got.st, &l.log, NULL, 0, why, sizeof(why)),
                   GS_EPRECOND);
  ck_assert_msg(strstr(tlog_text(&l), "buffer 2 has 1000 elements, expected 999, skipped"), "%s",
                tlog_text(&l));
  tlog_close(&l);

  /* The empty buffer expected non-empty. */
  tstate_blank(&got, HASH);
  got.bufs[1] = (gs_ckpt_buffer_t){got.d, 1};
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(strstr(why, "buffer 1 has 0 elements, expected 1"), "%s", why);

  /* One buffer fewer. */
  tstate_blank(&got, HASH);
  got.st.nbuf = 3;
  ck_assert_int_eq(gs_checkpoint_load_file(path, &got.st, why, sizeof(why)), GS_EPRECOND);
  ck_assert_msg(strstr(why, "4 buffers, expected 3"), "%s", why);
  rm_dir(dir);
}
END_TEST

START_TEST(empty_or_missing_dir)
{
  char *dir = make_dir(), sub[PATH_MAX], why[512] = "";
  tstate_t got, t;
  tlog_t l;

  tlog_open(&l);
  ck_assert_int_eq(load_latest(dir, &got, &l, NULL, 0, why, sizeof(why)), GS_ENOTFOUND);
  ck_assert_msg(strstr(why, dir) && strstr(why, "no checkpoint files"), "%s", why);
  snprintf(sub, sizeof(sub), "%s/missing", dir);
  ck_assert_int_eq(load_latest(sub, &got, &l, NULL, 0, why, sizeof(why)), GS_ENOTFOUND);
  ck_assert_msg(strstr(why, sub), "%s", why);
  ck_assert_int_eq(gs_checkpoint_load_file(sub, &got.st, why, sizeof(why)), GS_ENOTFOUND);
  ck_assert_str_eq(tlog_text(&l), "");
  tlog_close(&l);

  /* Save creates missing parents, with or without a trailing slash. */
  snprintf(sub, sizeof(sub), "%s/a/b/c/", dir);
  tstate_fill(&t, 5, 5);
  save(sub, &t, 3);
  snprintf(sub, sizeof(sub), "%s/a/b/c/ckpt-000000000005.gsck", dir);
  ck_assert(exists(sub));
  rm_dir(dir);
}
END_TEST

/* Saves into `dir` and expects an error naming `want`, in a child that
 * drops root (root ignores permissions) when the test runs as root. */
static void expect_save_denied(const char *dir, const char *want)
{
  int fds[2], status;
  char why[512] = "";
  ssize_t n;
  pid_t pid;

  ck_assert_int_eq(pipe(fds), 0);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    tstate_t t;
    int err;

    close(fds[0]);
    if (geteuid() == 0 && (setgid(NOBODY) != 0 || setuid(NOBODY) != 0))
      _exit(100);
    tstate_fill(&t, 100, 1);
    err = gs_checkpoint_save(dir, &t.st, 0, NULL, 0, why, sizeof(why));
    if (write(fds[1], why, strlen(why)) < 0)
      _exit(101);
    _exit(-err & 0xff);
  }
  close(fds[1]);
  n = read(fds[0], why, sizeof(why) - 1);
  why[n > 0 ? n : 0] = '\0';
  close(fds[0]);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status));
  if (WEXITSTATUS(status) == 100)
    return; /* no way to drop root here: nothing to test */
  ck_assert_int_eq(WEXITSTATUS(status), -GS_EPERM & 0xff);
  ck_assert_msg(strstr(why, want) && strstr(why, "Permission denied"), "%s", why);
}

START_TEST(unwritable_dir)
{
  char *dir = make_dir(), ro[256], sub[PATH_MAX], file[PATH_MAX], why[512] = "";
  tstate_t t;

  snprintf(ro, sizeof(ro), "%s/ro", dir);
  ck_assert_int_eq(mkdir(ro, 0755), 0);
  if (geteuid() == 0) { /* let the child, as nobody, reach and own ro */
    ck_assert_int_eq(chmod(dir, 0755), 0);
    ck_assert_int_eq(chown(ro, NOBODY, NOBODY), 0);
  }
  ck_assert_int_eq(chmod(ro, 0500), 0);
  snprintf(file, sizeof(file), "%s/.ckpt-000000000100.tmp", ro);
  expect_save_denied(ro, file);
  snprintf(sub, sizeof(sub), "%s/sub", ro);
  expect_save_denied(sub, sub); /* mkdir of the missing directory fails */
  ck_assert_uint_eq(count_entries(ro), 0);

  /* A regular file in the way of the directory. */
  snprintf(file, sizeof(file), "%s/plain", dir);
  write_file(file, "x", 1);
  snprintf(sub, sizeof(sub), "%s/plain/ckpts", dir);
  tstate_fill(&t, 1, 1);
  ck_assert_int_ne(gs_checkpoint_save(sub, &t.st, 0, NULL, 0, why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, file) && strstr(why, "mkdir"), "%s", why);
  ck_assert_int_ne(gs_checkpoint_save(file, &t.st, 0, NULL, 0, why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, file) && strstr(why, "not a directory"), "%s", why);
  rm_dir(dir);
}
END_TEST

START_TEST(bad_arguments)
{
  char *dir = make_dir(), why[512] = "";
  gs_ckpt_state_t st = {1, 0, 0, HASH, 2, NULL, NULL, 0, 0, 0, 0, NULL, 0};
  gs_ckpt_buffer_t b = {NULL, 3};
  gs_ckpt_buffer_t huge = {(float *)&b, UINT64_MAX / 2};

  ck_assert_int_eq(gs_checkpoint_save(dir, NULL, 0, NULL, 0, why, sizeof(why)), GS_EINVAL);
  ck_assert_int_eq(gs_checkpoint_save(NULL, &st, 0, NULL, 0, why, sizeof(why)), GS_EINVAL);
  ck_assert_int_eq(gs_checkpoint_save(dir, &st, 0, NULL, 0, why, sizeof(why)), GS_EINVAL);
  st.nbuf = 1;
  st.bufs = &b;
  ck_assert_int_eq(gs_checkpoint_save(dir, &st, 0, NULL, 0, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "buffer 0 has 3 elements but no data"), "%s", why);
  st.bufs = &huge;
  ck_assert_int_eq(gs_checkpoint_save(dir, &st, 0, NULL, 0, why, sizeof(why)), GS_ERANGE);
  ck_assert_int_eq(gs_checkpoint_load_latest(dir, &st, NULL, NULL, 0, why, sizeof(why)), GS_ERANGE);
  ck_assert_uint_eq(count_entries(dir), 0);
  /* why may be NULL. */
  ck_assert_int_eq(gs_checkpoint_save(dir, NULL, 0, NULL, 0, NULL, 0), GS_EINVAL);
  rm_dir(dir);
}
END_TEST

/* Copies the first ```python block of docs/checkpoint.md into `out`;
 * false if the doc is not where this source file says. */
static bool extract_reader(const char *out)
{
  char doc[PATH_MAX], line[1024];
  const char *slash = strrchr(__FILE__, '/');
  bool in = false, done = false;
  FILE *f, *o;

  /* __FILE__ is .../tests/test_checkpoint.c; the doc is .../docs/. */
  snprintf(doc, sizeof(doc), "%.*s../docs/checkpoint.md", slash ? (int)(slash - __FILE__ + 1) : 0,
           __FILE__);
  f = fopen(doc, "r");
  if (!f)
    return false;
  o = fopen(out, "w");
  ck_assert_ptr_nonnull(o);
  while (!done && fgets(line, sizeof(line), f)) {
    if (!in)
      in = strcmp(line, "```python\n") == 0;
    else if (strcmp(line, "```\n") == 0)
      done = true;
    else
      fputs(line, o);
  }
  fclose(f);
  fclose(o);
  ck_assert_msg(done, "%s has no complete ```python block", doc);
  return true;
}

static void expect_token(FILE *f, const char *want)
{
  char tok[64];

  ck_assert_int_eq(fscanf(f, "%63s", tok), 1);
  ck_assert_str_eq(tok, want);
}

static unsigned long long read_ull(FILE *f)
{
  unsigned long long v;

  ck_assert_int_eq(fscanf(f, "%llu", &v), 1);
  return v;
}

/* Checks that the Python reader printed exactly `t`'s contents, as a file
 * of `version` holds them. */
static void expect_python_output(FILE *f, const tstate_t *t, int version)
{
  expect_token(f, "step");
  ck_assert_uint_eq(read_ull(f), t->st.step);
  expect_token(f, "epoch");
  ck_assert_uint_eq(read_ull(f), t->st.epoch);
  expect_token(f, "rng_state");
  ck_assert_uint_eq(read_ull(f), t->st.rng_state);
  expect_token(f, "layout_hash");
  ck_assert_uint_eq(read_ull(f), t->st.layout_hash);
  if (t->st.desc || t->st.world_size) {
    char want[256];

    snprintf(want, sizeof(want), "%s", t->st.desc && *t->st.desc ? t->st.desc : "-");
    for (char *c = want; *c; c++)
      *c = *c == ' ' ? '_' : *c; /* the reader prints it as one token */
    expect_token(f, "desc");
    expect_token(f, want);
  }
  if (t->st.world_size) {
    expect_token(f, "world_size");
    ck_assert_uint_eq(read_ull(f), t->st.world_size);
  }
  if (version >= 4) {
    expect_token(f, "sample");
    ck_assert_uint_eq(read_ull(f), t->st.sample);
  }
  if (version >= 5) {
    expect_token(f, "optim_steps");
    ck_assert_uint_eq(read_ull(f), t->st.optim_steps);
  }
  if (version >= 6) {
    expect_token(f, "extra");
    ck_assert_uint_eq(read_ull(f), t->st.extra_len);
  }
  for (uint32_t i = 0; i < t->st.nbuf; i++) {
    expect_token(f, "buffer");
    ck_assert_uint_eq(read_ull(f), i);
    ck_assert_uint_eq(read_ull(f), t->bufs[i].count);
    for (uint64_t j = 0; j < t->bufs[i].count; j++) {
      float want = t->bufs[i].data[j], got;
      char tok[64];

      ck_assert_int_eq(fscanf(f, "%63s", tok), 1);
      got = strtof(tok, NULL); /* float.hex() is exact */
      if (want != want)
        ck_assert_msg(strcmp(tok, "nan") == 0, "buffer %u[%llu]: %s, want NaN", i,
                      (unsigned long long)j, tok);
      else
        ck_assert_msg(to_bits(got) == to_bits(want), "buffer %u[%llu]: %s, want 0x%08x", i,
                      (unsigned long long)j, tok, to_bits(want));
    }
  }
  ck_assert_int_eq(fscanf(f, "%*s"), EOF);
}

/* Runs the reader `script` on `ckpt`, its output into `out`, and checks
 * that it printed `t`. */
static void expect_reader(const char *script, const char *ckpt, const char *out, const tstate_t *t,
                          int version)
{
  char cmd[4 * PATH_MAX];
  FILE *f;

  snprintf(cmd, sizeof(cmd), "%s '%s' '%s' > '%s'", PYTHON, script, ckpt, out);
  ck_assert_int_eq(system(cmd), 0);
  f = fopen(out, "r");
  ck_assert_ptr_nonnull(f);
  expect_python_output(f, t, version);
  fclose(f);
}

START_TEST(python_reader)
{
  char *dir = make_dir(), script[PATH_MAX], out[PATH_MAX], ckpt[PATH_MAX], cmd[4 * PATH_MAX];
  tstate_t t;

  if (access(PYTHON, X_OK) != 0) {
    fprintf(stderr, "python_reader: no %s, skipped\n", PYTHON);
    rm_dir(dir);
    return;
  }
  snprintf(script, sizeof(script), "%s/reader.py", dir);
  if (!extract_reader(script)) {
    fprintf(stderr, "python_reader: docs/checkpoint.md not found from %s, skipped\n", __FILE__);
    rm_dir(dir);
    return;
  }
  snprintf(out, sizeof(out), "%s/out.txt", dir);
  tstate_fill(&t, 1234, 9);
  t.st.rng_state = UINT64_MAX;
  save(dir, &t, 0);
  name_of(ckpt, sizeof(ckpt), dir, 1234);
  expect_reader(script, ckpt, out, &t, 1);

  /* Version 2, with the layout described. */
  tstate_fill(&t, 1235, 10);
  t.st.desc = "layers 784,256,10";
  save(dir, &t, 0);
  name_of(ckpt, sizeof(ckpt), dir, 1235);
  expect_reader(script, ckpt, out, &t, 2);

  /* Version 5, with the world size, the sample offset and the optimizer
   * steps; and without a description. */
  tstate_fill(&t, 1236, 11);
  t.st.desc = "layers 784,256,10";
  t.st.world_size = 12;
  t.st.sample = UINT64_MAX - 1;
  t.st.optim_steps = 1234567;
  t.st.extra = "abc";
  t.st.extra_len = 3;
  save(dir, &t, 0);
  name_of(ckpt, sizeof(ckpt), dir, 1236);
  expect_reader(script, ckpt, out, &t, 6);
  tstate_fill(&t, 1237, 12);
  t.st.world_size = 3;
  t.st.sample = 60000;
  save(dir, &t, 0);
  name_of(ckpt, sizeof(ckpt), dir, 1237);
  expect_reader(script, ckpt, out, &t, 6);

  /* Version 5: no front end's bytes; 4: no optimizer steps; 3: no sample
   * offset either. */
  rewrite_as_older(ckpt, 5);
  expect_reader(script, ckpt, out, &t, 5);
  rewrite_as_older(ckpt, 4);
  expect_reader(script, ckpt, out, &t, 4);
  rewrite_as_older(ckpt, 3);
  expect_reader(script, ckpt, out, &t, 3);

  /* The reader refuses a corrupt file too. */
  xor_byte(ckpt, 48 + 8 + 5, 0x04);
  snprintf(cmd, sizeof(cmd), "%s '%s' '%s' > /dev/null 2>&1", PYTHON, script, ckpt);
  ck_assert_int_ne(system(cmd), 0);
  rm_dir(dir);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *checkpoint_suite(void)
{
  Suite *s = suite_create("checkpoint");

  suite_add_tcase(s, tcase("round_trip", round_trip));
  suite_add_tcase(s, tcase("position_round_trip", position_round_trip));
  suite_add_tcase(s, tcase("large_buffer", large_buffer));
  suite_add_tcase(s, tcase("retention", retention));
  suite_add_tcase(s, tcase("corrupt_byte_falls_back", corrupt_byte_falls_back));
  suite_add_tcase(s, tcase("every_byte_checked", every_byte_checked));
  suite_add_tcase(s, tcase("corrupt_leaves_buffers", corrupt_leaves_buffers));
  suite_add_tcase(s, tcase("truncated_skipped", truncated_skipped));
  suite_add_tcase(s, tcase("strays_ignored", strays_ignored));
  suite_add_tcase(s, tcase("renamed_refused", renamed_refused));
  suite_add_tcase(s, tcase("tmp_symlink_not_followed", tmp_symlink_not_followed));
  suite_add_tcase(s, tcase("fifo_skipped", fifo_skipped));
  suite_add_tcase(s, tcase("layout_mismatch", layout_mismatch));
  suite_add_tcase(s, tcase("layout_description", layout_description));
  suite_add_tcase(s, tcase("world_size_stored", world_size_stored));
  suite_add_tcase(s, tcase("sample_stored", sample_stored));
  suite_add_tcase(s, tcase("optim_steps_stored", optim_steps_stored));
  suite_add_tcase(s, tcase("extra_stored", extra_stored));
  suite_add_tcase(s, tcase("wrong_counts", wrong_counts));
  suite_add_tcase(s, tcase("empty_or_missing_dir", empty_or_missing_dir));
  suite_add_tcase(s, tcase("unwritable_dir", unwritable_dir));
  suite_add_tcase(s, tcase("bad_arguments", bad_arguments));
  suite_add_tcase(s, tcase("python_reader", python_reader));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {checkpoint_suite},
                                         .scratch = "test_checkpoint"};
