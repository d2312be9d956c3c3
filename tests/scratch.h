/* Temporary folders of a C test binary, all inside one folder of its own in
 * $TMPDIR (else /tmp): main() makes it before the tests run and removes it
 * after them, however each test ended. check runs each test in a process
 * of its own that a failed assertion ends at once, before the test's own
 * cleanup; the folder's removal is main()'s, which outlives them.
 *
 *   int main(void) { ts_begin("test_engine"); ...run the suite...; ts_end(); }
 *   char dir[4096]; ts_mkdtemp(dir, sizeof(dir), "ckpt");
 */
#ifndef GS_TEST_SCRATCH_H
#define GS_TEST_SCRATCH_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char ts_root[4096];

static inline int ts__remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  if (flag == FTW_DP)
    chmod(path, 0700); /* a test may have made it read-only */
  return remove(path);
}

/* Makes this binary's folder: $TMPDIR/gs-NAME-XXXXXX. Exits on failure. */
static inline void ts_begin(const char *name)
{
  const char *tmp = getenv("TMPDIR");

  snprintf(ts_root, sizeof(ts_root), "%s/gs-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
  /* 0755: a test that drops root (test_checkpoint's unwritable_dir) must
   * still reach the folders in it. */
  if (!mkdtemp(ts_root) || chmod(ts_root, 0755) != 0) {
    perror(ts_root);
    exit(1);
  }
}

/* Removes the folder and everything the tests left in it. */
static inline void ts_end(void)
{
  if (ts_root[0])
    nftw(ts_root, ts__remove, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh folder ROOT/PREFIX.XXXXXX in `dir`; aborts the test on failure. */
static inline void ts_mkdtemp(char *dir, size_t len, const char *prefix)
{
  ck_assert_msg(ts_root[0], "ts_begin was not called");
  ck_assert_int_lt(snprintf(dir, len, "%s/%s.XXXXXX", ts_root, prefix), (int)len);
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

#endif
