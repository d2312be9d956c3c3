/* What the GPU check suites share: the skip rule and a non-forking runner.
 * They do not fork because CUDA, initialized by the device count, cannot be
 * used again in a forked child. */
#ifndef GS_TESTS_GPU_CHECK_H
#define GS_TESTS_GPU_CHECK_H

#include <check.h>
#include <stdio.h>

#include "device.h"

#define GS_GPU_SKIP 77 /* ctest's SKIP_RETURN_CODE for these tests */

/* Prints why and returns GS_GPU_SKIP when no GPU can run the tests, else 0. */
static inline int gs_gpu_skip(void)
{
  char why[256] = "";

  if (gs_device_cuda_usable(why, sizeof(why)))
    return 0;
  printf("SKIP: %s\n", why);
  return GS_GPU_SKIP;
}

/* A test case of one test with a generous timeout (first CUDA use is slow). */
static inline TCase *gs_gpu_tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test);
  return tc;
}

/* Runs a suite in this process; returns the number of failed tests. */
static inline int gs_gpu_run_suite(Suite *suite)
{
  SRunner *sr = srunner_create(suite);
  int failed;

  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  fflush(stdout);
  return failed;
}

#endif
