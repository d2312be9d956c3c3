/* The error table, and the logging line format. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "error.h"
#include "wire.h"
#include "log.h"
#include "net.h" /* the coordinator's libuv boundary */
#include "runner.h"

START_TEST(table_names_messages_codes)
{
  ck_assert_str_eq(gs_err_name(GS_EINVAL), "GS_EINVAL");
  ck_assert_str_eq(gs_strerror(GS_EINVAL), "invalid argument");
  ck_assert_int_eq(gs_err_grpc_code(GS_EINVAL), 3);
  ck_assert_int_eq(gs_err_grpc_code(GS_ETIMEDOUT), 4);
  ck_assert_int_eq(gs_err_grpc_code(GS_EUNAUTH), 16);
  ck_assert_int_eq(gs_err_grpc_code(GS_OK), 0);
  ck_assert_str_eq(gs_strerror(GS_OK), "ok");
  ck_assert_str_eq(gs_strerror(-1), "unknown error");
  ck_assert_str_eq(gs_strerror(GS__ERRNO_LAST), "unknown error");
  ck_assert_str_eq(gs_err_name(12345), "GS_EUNKNOWN");
  ck_assert_str_eq(gs_grpc_code_name(16), "UNAUTHENTICATED");
  ck_assert_str_eq(gs_grpc_code_name(99), "UNKNOWN");
  ck_assert_int_eq(GS_GRPC_OUT_OF_RANGE, 11);
  /* Every entry has a distinct name and a message. */
  for (int e = GS__ERRNO_FIRST + 1; e < GS__ERRNO_LAST; e++) {
    ck_assert_str_ne(gs_strerror(e), "unknown error");
    for (int f = e + 1; f < GS__ERRNO_LAST; f++)
      ck_assert_str_ne(gs_err_name(e), gs_err_name(f));
  }
}
END_TEST

/* Every error survives the trip to a gRPC status and back as an error of
 * the same status, and each status decodes to its first row. */
START_TEST(grpc_status_round_trip)
{
  for (int e = GS__ERRNO_FIRST + 1; e < GS__ERRNO_LAST; e++) {
    int code = gs_err_grpc_code(e);
    int back = gs_err_from_grpc(code);

    ck_assert_int_gt(code, 0);
    ck_assert_int_eq(gs_err_grpc_code(back), code);
    ck_assert_str_ne(gs_grpc_code_name(code), "UNKNOWN");
    ck_assert_int_le(back, e); /* the first row of its status */
  }
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_OK), GS_OK);
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_RESOURCE_EXHAUSTED), GS_ELIMIT);
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_UNAVAILABLE), GS_EUNAVAIL);
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_INTERNAL), GS_EINTERNAL);
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_OUT_OF_RANGE), GS_ERANGE);
  ck_assert_int_eq(gs_err_from_grpc(GS_GRPC_DATA_LOSS), GS_EPROTO);
  ck_assert_int_eq(gs_err_from_grpc(99), GS_EPROTO);
  ck_assert_int_eq(gs_err_from_grpc(-1), GS_EPROTO);
}
END_TEST

/* Method ids, names and paths agree, and only exact paths parse. */
START_TEST(method_table_round_trip)
{
  gs_method_t m;

  for (int i = 0; i < GS_METHOD_COUNT; i++) {
    ck_assert(gs_method_from_path(gs_method_path((gs_method_t)i), &m));
    ck_assert_int_eq(m, i);
    ck_assert_str_eq(gs_method_path((gs_method_t)i) + strlen(GS_METHOD_PREFIX),
                     gs_method_name((gs_method_t)i));
  }
  ck_assert_str_eq(gs_method_path(GS_METHOD_PUBLISH_PACK_LIST),
                   "/gradsync.Coordinator/PublishPackList");
  ck_assert(!gs_method_from_path("/gradsync.Coordinator/Jo", &m));
  ck_assert(!gs_method_from_path("Join", &m));
  ck_assert(!gs_method_from_path("/gradsync.Coordinator/Join/", &m));
  ck_assert(!gs_method_from_path("", &m));
  ck_assert_str_eq(gs_method_name(GS_METHOD_COUNT), "?");
  ck_assert_str_eq(gs_method_path(GS_METHOD_COUNT), "");
}
END_TEST

START_TEST(foreign_errors_convert)
{
  ck_assert_int_eq(gs_err_from_errno(ENOMEM), GS_ENOMEM);
  ck_assert_int_eq(gs_err_from_errno(ECONNRESET), GS_ECLOSED);
  ck_assert_int_eq(gs_err_from_errno(EIO), GS_EIO);
  ck_assert_int_eq(gs_err_from_uv(UV_EOF), GS_ECLOSED);
  ck_assert_int_eq(gs_err_from_uv(UV_ECONNREFUSED), GS_EUNAVAIL);
  ck_assert_int_eq(gs_err_from_uv(0), GS_OK);
}
END_TEST

START_TEST(log_line_format_and_level)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  gs_log_t log = {GS_LOG_INFO, f, "coordinator"};
  gs_log_level_t lvl;
  int y, mo, d, h, mi, s, ms;
  char rest[256];

  gs_log(&log, GS_LOG_INFO, "job1", 3, "hello %d", 42);
  gs_log(&log, GS_LOG_DEBUG, NULL, -1, "hidden");
  gs_log(&log, GS_LOG_WARN, NULL, -1, "plain");
  gs_log(&log, GS_LOG_ERROR, "job2", -1, "jobonly");
  fclose(f);
  ck_assert_int_eq(
      sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %255[^\n]", &y, &mo, &d, &h, &mi, &s, &ms, rest),
      8);
  ck_assert_str_eq(rest, "INFO coordinator [job1/3] hello 42");
  ck_assert_ptr_null(strstr(text, "hidden"));
  ck_assert_ptr_nonnull(strstr(text, "Z WARN coordinator [-] plain\n"));
  ck_assert_ptr_nonnull(strstr(text, "Z ERROR coordinator [job2] jobonly\n"));
  free(text);
  ck_assert_int_eq(gs_log_level_parse("debug", &lvl), 0);
  ck_assert_int_eq(lvl, GS_LOG_DEBUG);
  ck_assert_int_eq(gs_log_level_parse("WARNING", &lvl), 0);
  ck_assert_int_eq(lvl, GS_LOG_WARN);
  ck_assert_int_eq(gs_log_level_parse("loud", &lvl), GS_EINVAL);
}
END_TEST

/* The --log-level row of the flag tables parses through the same parser
 * and shows the level as the flag spells it. */
START_TEST(log_level_flag_row)
{
  gs_log_level_t lvl = GS_LOG_INFO;
  char expect[64] = "", shown[8];

  ck_assert_int_eq(gs_log_level_flag_parse("Warning", &lvl, expect, sizeof(expect)), 0);
  ck_assert_int_eq(lvl, GS_LOG_WARN);
  ck_assert_int_eq(gs_log_level_flag_parse("loud", &lvl, expect, sizeof(expect)), GS_EINVAL);
  ck_assert_int_eq(lvl, GS_LOG_WARN);
  ck_assert_str_eq(expect, "error, warn, info or debug");
  lvl = GS_LOG_DEBUG;
  gs_log_level_flag_show(&lvl, shown, sizeof(shown));
  ck_assert_str_eq(shown, "debug");
  gs_log_level_flag_show(&lvl, shown, 3);
  ck_assert_str_eq(shown, "de");
}
END_TEST

static Suite *error_suite(void)
{
  Suite *s = suite_create("error");
  TCase *tc = tcase_create("table");

  tcase_add_test(tc, table_names_messages_codes);
  tcase_add_test(tc, grpc_status_round_trip);
  tcase_add_test(tc, method_table_round_trip);
  tcase_add_test(tc, foreign_errors_convert);
  suite_add_tcase(s, tc);
  tc = tcase_create("log");
  tcase_add_test(tc, log_line_format_and_level);
  tcase_add_test(tc, log_level_flag_row);
  suite_add_tcase(s, tc);
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {error_suite}};
