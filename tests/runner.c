/* The main() every C unit test binary shares: runs the suites its
 * gs_test_binary names (runner.h). One copy, so that what a run means
 * (check's environment controls, the exit status, the scratch folder) is
 * the same for every binary. */
#include "runner.h"

#include <check.h>
#include <signal.h>
#include <stdlib.h>

#include "scratch.h"

Suite *gs_test_suite_of(const char *name, const gs_test_case_t *cases, size_t n, double timeout_s,
                        SFun setup, SFun teardown)
{
  Suite *s = suite_create(name);

  for (size_t i = 0; i < n; i++) {
    TCase *tc = tcase_create(cases[i].name);

    if (timeout_s > 0)
      tcase_set_timeout(tc, timeout_s);
    if (setup || teardown)
      tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, cases[i].test);
    suite_add_tcase(s, tc);
  }
  return s;
}

int main(void)
{
  const gs_test_binary_t *b = &gs_test_binary;
  SRunner *sr = srunner_create(NULL);
  int failed;

  for (int i = 0; i < GS_TEST_MAX_SUITES && b->suites[i]; i++)
    srunner_add_suite(sr, b->suites[i]());
  if (b->ignore_sigpipe)
    signal(SIGPIPE, SIG_IGN);
  /* Made here, removed here: check runs each test in a process of its own
   * that a failed assertion ends before the test's own cleanup. */
  if (b->scratch)
    ts_begin(b->scratch);
  srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY, else CK_NORMAL */
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (b->scratch)
    ts_end();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
