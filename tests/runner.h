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

/* One behaviour of a suite: a TCase of its own named `name`. */
typedef struct gs_test_case {
  const char *name;
  const TTest *test;
} gs_test_case_t;

/* Suite `name` of cases[0..n), each its own TCase with a timeout of
 * `timeout_s` seconds (0: check's default) and the checked fixture
 * `setup`/`teardown` (NULL: none). */
Suite *gs_test_suite_of(const char *name, const gs_test_case_t *cases, size_t n, double timeout_s,
                        SFun setup, SFun teardown);
#define GS_TEST_SUITE_OF(name, cases, timeout_s, setup, teardown)                                  \
  gs_test_suite_of(name, cases, sizeof(cases) / sizeof((cases)[0]), timeout_s, setup, teardown)

#endif
