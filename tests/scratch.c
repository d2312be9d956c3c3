/* A C test binary's scratch folder (scratch.h). */
#include "scratch.h"

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The binary's folder: set once by ts_begin in the runner's process,
 * before any test forks, and only read after. */
static char ts_root[4096];

static int ts__remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  if (flag == FTW_DP)
    chmod(path, 0700); /* a test may have made it read-only */
  return remove(path);
}

void ts_begin(const char *name)
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

void ts_end(void)
{
  if (ts_root[0])
    nftw(ts_root, ts__remove, 16, FTW_DEPTH | FTW_PHYS);
}

void ts_mkdtemp(char *dir, size_t len, const char *prefix)
{
  ck_assert_msg(ts_root[0], "ts_begin was not called");
  ck_assert_int_lt(snprintf(dir, len, "%s/%s.XXXXXX", ts_root, prefix), (int)len);
  ck_assert_ptr_nonnull(mkdtemp(dir));
}
