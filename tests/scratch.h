/* Temporary folders of a C test binary, all inside one folder of its own in
 * $TMPDIR (else /tmp): the runner (runner.c) makes it before the tests run
 * and removes it after them, however each test ended, when the binary's
 * gs_test_binary names it. check runs each test in a process of its own
 * that a failed assertion ends at once, before the test's own cleanup; the
 * folder's removal is the runner's, which outlives them.
 *
 *   const gs_test_binary_t gs_test_binary = {.suites = {...}, .scratch = "test_engine"};
 *   char dir[4096]; ts_mkdtemp(dir, sizeof(dir), "ckpt");
 */
#ifndef GS_TEST_SCRATCH_H
#define GS_TEST_SCRATCH_H

#include <stddef.h>

/* Makes this binary's folder: $TMPDIR/gs-NAME-XXXXXX. Exits on failure. */
void ts_begin(const char *name);
/* Removes the folder and everything the tests left in it. */
void ts_end(void);
/* A fresh folder ROOT/PREFIX.XXXXXX in `dir`; aborts the test on failure. */
void ts_mkdtemp(char *dir, size_t len, const char *prefix);

#endif
