/* The one main() of the C unit tests (tests/runner.c). A test binary
 * defines `gs_test_binary`: the suites it runs and what the run needs
 * around them; the runner builds them, runs them with check's own
 * environment controls (CK_RUN_SUITE, CK_RUN_CASE, CK_EXCLUDE_TAGS,
 * CK_FORK, CK_DEFAULT_TIMEOUT, CK_TIMEOUT_MULTIPLIER, CK_VERBOSITY) and
 * exits nonzero when any case failed.
 *
 *   static Suite *util_suite(void) { ... }
 *   const gs_test_binary_t gs_test_binary = {.suites = {util_suite}};
 */
#ifndef GS_TEST_RUNNER_H
#define GS_TEST_RUNNER_H

#include <check.h>
#include <stdbool.h>

#define GS_TEST_MAX_SUITES 4

typedef struct gs_test_binary {
  /* Run in this order, up to the first NULL; each builds its suite afresh. */
  Suite *(*suites[GS_TEST_MAX_SUITES])(void);
  /* Non-NULL: the binary's scratch folder (scratch.h), named after it, is
   * made before the tests run and removed after them. */
  const char *scratch;
  /* A peer gone before a write must not end the test with SIGPIPE. */
  bool ignore_sigpipe;
} gs_test_binary_t;

/* Defined by each test binary. */
extern const gs_test_binary_t gs_test_binary;

#endif
