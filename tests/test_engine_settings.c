/* gs_engine_add_setting: what a front end may send at Join for the
 * coordinator to compare across ranks (the comparison itself is in
 * test_jobs.c and test_agent.py's settings case). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include <gradsync/engine.h>

#include "runner.h"

static gs_engine_t *new_engine(void)
{
  gs_engine_config_t cfg;
  gs_engine_t *e;

  gs_engine_config_defaults(&cfg);
  cfg.coord.port = 1;
  e = gs_engine_new(&cfg);
  ck_assert_ptr_nonnull(e);
  return e;
}

START_TEST(names_and_values_are_checked)
{
  gs_engine_t *e = new_engine();
  char long_value[200];

  memset(long_value, 'x', sizeof(long_value) - 1);
  long_value[sizeof(long_value) - 1] = '\0';
  ck_assert_int_eq(gs_engine_add_setting(e, "batch", "64"), 0);
  ck_assert_int_eq(gs_engine_add_setting(e, "data.train-examples_2", ""), 0);
  ck_assert_int_lt(gs_engine_add_setting(e, "batch", "64"), 0);
  ck_assert_ptr_nonnull(strstr(gs_engine_error(e), "cannot add setting 'batch'"));
  ck_assert_ptr_nonnull(strstr(gs_engine_error(e), "added twice, or one of the engine's own"));
  ck_assert_int_lt(gs_engine_add_setting(e, "batch size", "64"), 0);
  ck_assert_ptr_nonnull(strstr(gs_engine_error(e), "names: 1-63 of [A-Za-z0-9._-]"));
  ck_assert_int_lt(gs_engine_add_setting(e, "", "64"), 0);
  ck_assert_int_lt(gs_engine_add_setting(e, NULL, "64"), 0);
  ck_assert_int_lt(gs_engine_add_setting(e, "v", NULL), 0);
  ck_assert_int_lt(gs_engine_add_setting(e, "v", long_value), 0);
  long_value[127] = '\0';
  ck_assert_int_eq(gs_engine_add_setting(e, "v", long_value), 0);
  gs_engine_free(e);
}
END_TEST

/* GS_ENGINE_MAX_SETTINGS in all, the engine's own included. */
START_TEST(the_count_is_bounded)
{
  gs_engine_t *e = new_engine();
  char name[16];
  int err = 0;
  int i;

  for (i = 0; i < GS_ENGINE_MAX_SETTINGS + 1 && !err; i++) {
    snprintf(name, sizeof(name), "s%d", i);
    err = gs_engine_add_setting(e, name, "1");
  }
  ck_assert_int_lt(err, 0);
  ck_assert_int_eq(i, GS_ENGINE_MAX_SETTINGS + 1);
  gs_engine_free(e);
}
END_TEST

static Suite *engine_settings_suite(void)
{
  Suite *s = suite_create("engine_settings");
  TCase *tc = tcase_create("add_setting");

  tcase_add_test(tc, names_and_values_are_checked);
  tcase_add_test(tc, the_count_is_bounded);
  suite_add_tcase(s, tc);
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {engine_settings_suite}};
