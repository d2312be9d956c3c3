/* Tests for agent/launcher/lines.c: how gradsync-run cuts a child's output
 * into lines and prefixes them, whatever sizes the reads come in. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lines.h"
#include "runner.h"

/* The lines a byte stream makes, each followed by '\n', in one string. */
typedef struct collected {
  char *text;
  size_t len, cap;
  int count;
} collected_t;

static void collect(collected_t *c, const char *line, size_t len)
{
  if (c->len + len + 1 >= c->cap) {
    c->cap = 2 * (c->len + len + 1);
    c->text = realloc(c->text, c->cap);
    ck_assert_ptr_nonnull(c->text);
  }
  memcpy(c->text + c->len, line, len);
  c->len += len;
  c->text[c->len++] = '\n';
  c->text[c->len] = '\0';
  c->count++;
}

static void drain(gs_run_lines_t *l, bool eof, collected_t *c)
{
  const char *line;
  size_t len;

  while (gs_run_lines_next(l, eof, &line, &len))
    collect(c, line, len);
}

/* Feeds data as the launcher reads it, in reads of at most `chunk` bytes,
 * then end of file. */
static void feed(const char *data, size_t n, size_t chunk, collected_t *c)
{
  gs_run_lines_t *l = malloc(sizeof(*l));

  ck_assert_ptr_nonnull(l);
  gs_run_lines_init(l);
  memset(c, 0, sizeof(*c));
  while (n > 0) {
    size_t room, k;
    char *at = gs_run_lines_room(l, &room);

    ck_assert_uint_gt(room, 0);
    k = n < room ? n : room;
    k = k < chunk ? k : chunk;
    memcpy(at, data, k);
    gs_run_lines_add(l, k);
    drain(l, false, c);
    data += k;
    n -= k;
  }
  drain(l, true, c);
  free(l);
}

START_TEST(complete_lines)
{
  collected_t c;

  feed("one\ntwo\n\nthree\n", 15, 1 << 20, &c);
  ck_assert_str_eq(c.text, "one\ntwo\n\nthree\n");
  ck_assert_int_eq(c.count, 4);
  free(c.text);
}
END_TEST

START_TEST(partial_line_waits)
{
  gs_run_lines_t l;
  const char *line;
  size_t room, len;
  char *at;

  gs_run_lines_init(&l);
  at = gs_run_lines_room(&l, &room);
  memcpy(at, "ab", 2);
  gs_run_lines_add(&l, 2);
  ck_assert(!gs_run_lines_next(&l, false, &line, &len));
  at = gs_run_lines_room(&l, &room);
  memcpy(at, "c\nd", 3);
  gs_run_lines_add(&l, 3);
  ck_assert(gs_run_lines_next(&l, false, &line, &len));
  ck_assert_uint_eq(len, 3);
  ck_assert(memcmp(line, "abc", 3) == 0);
  ck_assert(!gs_run_lines_next(&l, false, &line, &len));
  /* At end of file the unterminated rest is a line. */
  ck_assert(gs_run_lines_next(&l, true, &line, &len));
  ck_assert_uint_eq(len, 1);
  ck_assert_int_eq(line[0], 'd');
  ck_assert(!gs_run_lines_next(&l, true, &line, &len));
}
END_TEST

/* Whatever the read sizes, the same lines come out. */
START_TEST(any_read_sizes)
{
  static const size_t chunks[] = {1, 2, 3, 7, 64, 4095, 8191, 8192, 100000};
  size_t n = 50000;
  char *data = malloc(n);
  collected_t whole, c;
  uint64_t x = 42;

  ck_assert_ptr_nonnull(data);
  for (size_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    data[i] = (x >> 60) == 0 ? '\n' : (char)('a' + (x >> 59) % 26);
  }
  feed(data, n, n, &whole);
  for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
    feed(data, n, chunks[i], &c);
    ck_assert_msg(c.len == whole.len && memcmp(c.text, whole.text, c.len) == 0,
                  "reads of %zu bytes give other lines", chunks[i]);
    free(c.text);
  }
  free(whole.text);
  free(data);
}
END_TEST

/* A line longer than the buffer goes out in GS_RUN_LINE_MAX pieces. */
START_TEST(overlong_line_in_pieces)
{
  size_t n = 2 * GS_RUN_LINE_MAX + 11;
  char *data = malloc(n);
  collected_t c;

  ck_assert_ptr_nonnull(data);
  memset(data, 'x', n - 1);
  data[n - 1] = '\n';
  feed(data, n, 1000, &c);
  ck_assert_int_eq(c.count, 3);
  ck_assert_uint_eq(c.len, n + 2);
  ck_assert_int_eq(c.text[GS_RUN_LINE_MAX], '\n');
  ck_assert_int_eq(c.text[2 * GS_RUN_LINE_MAX + 1], '\n');
  free(c.text);
  free(data);
}
END_TEST

START_TEST(eof_without_newline)
{
  collected_t c;

  feed("last words", 10, 3, &c);
  ck_assert_str_eq(c.text, "last words\n");
  free(c.text);
  feed("", 0, 3, &c);
  ck_assert_int_eq(c.count, 0);
}
END_TEST

START_TEST(prefix_line)
{
  char out[64];
  size_t n = gs_run_prefix_line(out, sizeof(out), "[rank 3] ", "hello", 5);

  ck_assert_uint_eq(n, 15);
  ck_assert(memcmp(out, "[rank 3] hello\n", 15) == 0);
  n = gs_run_prefix_line(out, sizeof(out), "[coordinator] ", "", 0);
  ck_assert(memcmp(out, "[coordinator] \n", n) == 0);
  /* Too small a buffer cuts the line, never the newline. */
  n = gs_run_prefix_line(out, 12, "[rank 3] ", "hello", 5);
  ck_assert_uint_eq(n, 12);
  ck_assert(memcmp(out, "[rank 3] he\n", 12) == 0);
  n = gs_run_prefix_line(out, 4, "[rank 3] ", "hello", 5);
  ck_assert(memcmp(out, "[ra\n", n) == 0);
}
END_TEST

/* n bytes copied to end right before an unreadable page; unmap with
 * unguard. */
static char *guarded(const char *bytes, size_t n)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *mem = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  ck_assert_ptr_ne(mem, MAP_FAILED);
  ck_assert_int_eq(mprotect(mem + page, page, PROT_NONE), 0);
  return memcpy(mem + page - n, bytes, n);
}

static void unguard(char *p)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE);

  munmap((char *)((uintptr_t)p & ~(uintptr_t)(page - 1)), 2 * page);
}

/* The line (no NUL: a line is data and length) and the prefix each end
 * right before an unreadable page: formatting reads no byte past them. */
START_TEST(prefix_no_overread)
{
  char *line = guarded("hello", 5), *prefix = guarded("[rank 12] ", 11), out[64];

  ck_assert_uint_eq(gs_run_prefix_line(out, sizeof(out), prefix, line, 5), 16);
  ck_assert(memcmp(out, "[rank 12] hello\n", 16) == 0);
  unguard(line);
  unguard(prefix);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *lines_suite(void)
{
  Suite *s = suite_create("launcher_lines");

  suite_add_tcase(s, tcase("complete_lines", complete_lines));
  suite_add_tcase(s, tcase("partial_line_waits", partial_line_waits));
  suite_add_tcase(s, tcase("any_read_sizes", any_read_sizes));
  suite_add_tcase(s, tcase("overlong_line_in_pieces", overlong_line_in_pieces));
  suite_add_tcase(s, tcase("eof_without_newline", eof_without_newline));
  suite_add_tcase(s, tcase("prefix_line", prefix_line));
  suite_add_tcase(s, tcase("prefix_no_overread", prefix_no_overread));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {lines_suite}};
