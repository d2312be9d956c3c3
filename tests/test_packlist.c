/* Tests for common/packlist.c: the packs computed for hand-picked and
 * random parameter sets, and validation of good and corrupted lists. */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "packlist.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))
#define F32 GS_DTYPE_FLOAT32
#define F16 GS_DTYPE_FLOAT16
#define BF16 GS_DTYPE_BFLOAT16
#define F64 GS_DTYPE_FLOAT64

/* Computes the list of `params`, checks it has the expected pack sizes and
 * order, and that it validates. */
static void expect_packs(const gs_param_desc_t *params, uint32_t n, uint64_t threshold,
                         const uint32_t *sizes, uint32_t packs, const uint32_t *order)
{
  gs_packlist_t list;
  char why[256] = "";
  uint32_t i;

  ck_assert_int_eq(gs_packlist_compute(params, n, threshold, &list), 0);
  ck_assert_uint_eq(list.threshold_bytes, threshold);
  ck_assert_uint_eq(list.param_count, n);
  ck_assert_uint_eq(list.pack_count, packs);
  for (i = 0; i < packs; i++)
    ck_assert_msg(list.pack_sizes[i] == sizes[i], "pack %u: size %u, want %u", i,
                  list.pack_sizes[i], sizes[i]);
  for (i = 0; i < n; i++)
    ck_assert_msg(list.order[i] == order[i], "order[%u] = %u, want %u", i, list.order[i], order[i]);
  ck_assert_msg(gs_packlist_validate(&list, params, n, why, sizeof(why)) == 0, "%s", why);
  gs_packlist_free(&list);
}

START_TEST(empty)
{
  gs_packlist_t list;
  char why[64] = "";

  memset(&list, 0xff, sizeof(list));
  ck_assert_int_eq(gs_packlist_compute(NULL, 0, 1000, &list), 0);
  ck_assert_uint_eq(list.param_count, 0);
  ck_assert_uint_eq(list.pack_count, 0);
  ck_assert_ptr_null(list.order);
  ck_assert_ptr_null(list.pack_sizes);
  ck_assert_int_eq(gs_packlist_validate(&list, NULL, 0, why, sizeof(why)), 0);
  gs_packlist_free(&list);
}
END_TEST

START_TEST(single_param)
{
  static const gs_param_desc_t p[] = {{"w", 10, F32}};
  static const uint32_t sizes[] = {1}, order[] = {0};

  expect_packs(p, 1, 1000, sizes, 1, order);
  expect_packs(p, 1, 1, sizes, 1, order); /* over the threshold, still one pack */
  expect_packs(p, 1, 0, sizes, 1, order);
}
END_TEST

START_TEST(all_fit_in_one)
{
  static const gs_param_desc_t p[] = {
      {"a", 100, F32}, {"b", 100, F32}, {"c", 100, F32}, {"d", 100, F32}};
  static const uint32_t sizes[] = {4}, order[] = {3, 2, 1, 0};

  expect_packs(p, COUNT(p), 10000, sizes, 1, order);
  expect_packs(p, COUNT(p), UINT64_MAX, sizes, 1, order);
}
END_TEST

/* Three params of 1000 bytes: a pack of exactly the threshold fits, one
 * byte less does not. */
START_TEST(threshold_boundary)
{
  static const gs_param_desc_t p[] = {{"a", 250, F32}, {"b", 250, F32}, {"c", 250, F32}};
  static const uint32_t order[] = {2, 1, 0};
  static const uint32_t two_one[] = {2, 1}, ones[] = {1, 1, 1}, all[] = {3};

  expect_packs(p, COUNT(p), 2000, two_one, 2, order);
  expect_packs(p, COUNT(p), 2999, two_one, 2, order);
  expect_packs(p, COUNT(p), 3000, all, 1, order);
  expect_packs(p, COUNT(p), 1999, ones, 3, order);
  expect_packs(p, COUNT(p), 1000, ones, 3, order);
  expect_packs(p, COUNT(p), 999, ones, 3, order);
}
END_TEST

START_TEST(big_param_alone)
{
  static const gs_param_desc_t p[] = {
      {"a", 25, F32}, {"b", 25, F32}, {"big", 1250, F32}, {"c", 25, F32}, {"d", 25, F32}};
  static const uint32_t sizes[] = {2, 1, 2}, order[] = {4, 3, 2, 1, 0};

  expect_packs(p, COUNT(p), 1000, sizes, 3, order);
}
END_TEST

START_TEST(dtype_changes)
{
  static const gs_param_desc_t p[] = {{"a", 1, F32}, {"b", 1, F32},  {"c", 1, F16}, {"d", 1, F16},
                                      {"e", 1, F32}, {"f", 1, BF16}, {"g", 1, F64}, {"h", 1, F64}};
  /* Same element size, different dtype: bf16 and f16 never share a pack. */
  static const gs_param_desc_t q[] = {{"x", 1, F16}, {"y", 1, BF16}, {"z", 1, F16}};
  static const uint32_t sizes[] = {2, 1, 1, 2, 2}, order[] = {7, 6, 5, 4, 3, 2, 1, 0};
  static const uint32_t qsizes[] = {1, 1, 1}, qorder[] = {2, 1, 0};

  expect_packs(p, COUNT(p), 1 << 20, sizes, 5, order);
  expect_packs(q, COUNT(q), 1 << 20, qsizes, 3, qorder);
}
END_TEST

START_TEST(threshold_zero)
{
  static const gs_param_desc_t p[] = {{"a", 0, F32}, {"b", 0, F32}, {"c", 5, F32}, {"d", 0, F32}};
  static const uint32_t sizes[] = {1, 1, 1, 1}, order[] = {3, 2, 1, 0};

  expect_packs(p, COUNT(p), 0, sizes, 4, order);
}
END_TEST

/* Params of zero elements weigh nothing, so with a threshold they join
 * whatever pack is open. */
START_TEST(zero_elements)
{
  static const gs_param_desc_t p[] = {{"a", 0, F32}, {"b", 250, F32}, {"c", 0, F32}};
  static const uint32_t sizes[] = {3}, order[] = {2, 1, 0};

  expect_packs(p, COUNT(p), 1000, sizes, 1, order);
}
END_TEST

START_TEST(order_is_reverse)
{
  gs_param_desc_t p[40];
  uint64_t thresholds[] = {0, 1, 100, 4000, UINT64_MAX};
  gs_packlist_t list;
  uint32_t i, t;

  for (i = 0; i < COUNT(p); i++)
    p[i] = (gs_param_desc_t){"p", i * 7 % 13, (gs_dtype_t)(i / 5 % 4)};
  for (t = 0; t < COUNT(thresholds); t++) {
    ck_assert_int_eq(gs_packlist_compute(p, COUNT(p), thresholds[t], &list), 0);
    for (i = 0; i < COUNT(p); i++)
      ck_assert_uint_eq(list.order[i], COUNT(p) - 1 - i);
    gs_packlist_free(&list);
  }
}
END_TEST

START_TEST(unknown_dtype)
{
  static const gs_param_desc_t p[] = {{"a", 1, F32}, {"b", 1, (gs_dtype_t)7}};
  gs_packlist_t list = {0};

  ck_assert_int_eq(gs_packlist_compute(p, COUNT(p), 100, &list), GS_EINVAL);
  ck_assert_ptr_null(list.order);
  ck_assert_uint_eq(gs_dtype_size((gs_dtype_t)7), 0);
  ck_assert_str_eq(gs_dtype_name((gs_dtype_t)7), "unknown");
}
END_TEST

START_TEST(dtype_table)
{
  ck_assert_uint_eq(gs_dtype_size(F32), 4);
  ck_assert_uint_eq(gs_dtype_size(F16), 2);
  ck_assert_uint_eq(gs_dtype_size(BF16), 2);
  ck_assert_uint_eq(gs_dtype_size(F64), 8);
  ck_assert_str_eq(gs_dtype_name(F32), "float32");
  ck_assert_str_eq(gs_dtype_name(F16), "float16");
  ck_assert_str_eq(gs_dtype_name(BF16), "bfloat16");
  ck_assert_str_eq(gs_dtype_name(F64), "float64");
}
END_TEST

START_TEST(pack_bytes_and_free)
{
  static const gs_param_desc_t p[] = {
      {"a", 10, F32}, {"b", 20, F32}, {"c", 30, F16}, {"huge", UINT64_MAX / 2, F64}};
  gs_packlist_t list;

  ck_assert_int_eq(gs_packlist_compute(p, COUNT(p), 1000, &list), 0);
  /* Packs: {huge}, {c}, {b, a}. */
  ck_assert_uint_eq(list.pack_count, 3);
  ck_assert_uint_eq(gs_packlist_pack_bytes(&list, p, 0, 1), UINT64_MAX); /* saturates */
  ck_assert_uint_eq(gs_packlist_pack_bytes(&list, p, 1, 1), 60);
  ck_assert_uint_eq(gs_packlist_pack_bytes(&list, p, 2, 2), 120);
  ck_assert_uint_eq(gs_packlist_pack_bytes(&list, p, 2, 99), 120); /* clamped to the list */
  ck_assert_uint_eq(gs_packlist_pack_bytes(&list, p, 9, 1), 0);
  gs_packlist_free(&list);
  ck_assert_ptr_null(list.order);
  ck_assert_ptr_null(list.pack_sizes);
  ck_assert_uint_eq(list.param_count, 0);
  ck_assert_uint_eq(list.pack_count, 0);
  ck_assert_uint_eq(list.threshold_bytes, 0);
}
END_TEST

/* Eight params for the corruption tests; one pack per param is valid. */
static const gs_param_desc_t model[] = {
    {"emb.weight", 1000, F32}, {"emb.bias", 10, F32},     {"x", 500, F16},
    {"fc2.bias", 250, F32},    {"fc1.weight", 1000, F32}, {"fc3.bias", 250, F32},
    {"fc3.weight", 1000, F32}, {NULL, 10, F32},
};

/* Validates a hand-made list of `model` and expects GS_EINVAL with `want`
 * somewhere in the reason. */
static void expect_invalid(uint32_t *sizes, uint32_t packs, uint32_t *order, uint32_t count,
                           uint64_t threshold, const char *want)
{
  gs_packlist_t list = {threshold, count, packs, sizes, order};
  char why[256] = "";

  ck_assert_int_eq(gs_packlist_validate(&list, model, COUNT(model), why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, want), "why = \"%s\", want \"%s\"", why, want);
  /* Without a buffer the verdict is the same. */
  ck_assert_int_eq(gs_packlist_validate(&list, model, COUNT(model), NULL, 0), GS_EINVAL);
}

START_TEST(validate_computed)
{
  uint64_t thresholds[] = {0, 1, 1000, 4000, 8000, 10000, UINT64_MAX};
  gs_packlist_t list;
  char why[256] = "";
  uint32_t t;

  for (t = 0; t < COUNT(thresholds); t++) {
    ck_assert_int_eq(gs_packlist_compute(model, COUNT(model), thresholds[t], &list), 0);
    ck_assert_msg(gs_packlist_validate(&list, model, COUNT(model), why, sizeof(why)) == 0,
                  "threshold %llu: %s", (unsigned long long)thresholds[t], why);
    ck_assert_int_eq(gs_packlist_validate(&list, model, COUNT(model), NULL, 0), 0);
    gs_packlist_free(&list);
  }
}
END_TEST

START_TEST(validate_hand_made)
{
  uint32_t sizes[] = {1, 1, 1, 1, 1, 1, 1, 1}, order[] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint32_t big_sizes[] = {3, 1, 1, 1, 1, 1}, big_order[] = {6, 5, 4, 3, 2, 1, 0, 7};
  gs_packlist_t any = {0, 8, 8, sizes, order};
  gs_packlist_t fits = {10000, 8, 6, big_sizes, big_order}; /* 4000 + 1000 + 4000 */

  /* Any order of the packs is acceptable, and one param may exceed it. */
  ck_assert_int_eq(gs_packlist_validate(&any, model, COUNT(model), NULL, 0), 0);
  ck_assert_int_eq(gs_packlist_validate(&fits, model, COUNT(model), NULL, 0), 0);
  fits.threshold_bytes = 9000; /* exactly the pack's bytes */
  ck_assert_int_eq(gs_packlist_validate(&fits, model, COUNT(model), NULL, 0), 0);
}
END_TEST

START_TEST(validate_duplicate)
{
  uint32_t sizes[] = {1, 1, 1, 1, 1, 1, 1, 1}, order[] = {3, 6, 3, 4, 1, 0, 7, 2};
  uint32_t noname[] = {7, 6, 5, 4, 3, 2, 1, 7};

  expect_invalid(sizes, 8, order, 8, 10000, "param 3 (fc2.bias) appears in pack 0 and pack 2");
  expect_invalid(sizes, 8, noname, 8, 10000, "param 7 (?) appears in pack 0 and pack 7");
}
END_TEST

START_TEST(validate_mixed_dtype)
{
  uint32_t sizes[] = {1, 2, 1, 1, 1, 1, 1}, order[] = {7, 4, 2, 6, 5, 3, 1, 0};

  expect_invalid(sizes, 7, order, 8, 1 << 20,
                 "pack 1 mixes float32 (param 4 fc1.weight) and float16 (param 2 x)");
}
END_TEST

START_TEST(validate_over_threshold)
{
  uint32_t sizes[] = {3, 1, 1, 1, 1, 1}, order[] = {6, 4, 0, 7, 5, 3, 2, 1};

  expect_invalid(sizes, 6, order, 8, 10000,
                 "pack 0 holds 3 params totalling 12000 bytes, over the threshold of 10000");
}
END_TEST

START_TEST(validate_missing)
{
  uint32_t sizes[] = {1, 1, 1, 1, 1, 1, 1}, order[] = {7, 6, 4, 3, 2, 1, 0};

  expect_invalid(sizes, 7, order, 7, 10000, "param 5 (fc3.bias) is in no pack");
}
END_TEST

START_TEST(validate_empty_pack)
{
  uint32_t sizes[] = {1, 1, 0, 1, 1, 1, 1, 1, 1}, order[] = {7, 6, 5, 4, 3, 2, 1, 0};

  expect_invalid(sizes, 9, order, 8, 10000, "pack 2 is empty");
}
END_TEST

START_TEST(validate_out_of_range)
{
  uint32_t sizes[] = {1, 1, 1, 1, 1, 1, 1, 1}, order[] = {7, 6, 9, 4, 3, 2, 1, 0};
  uint32_t far[] = {UINT32_MAX, 6, 5, 4, 3, 2, 1, 0};

  expect_invalid(sizes, 8, order, 8, 10000, "index 9 out of range (8 params)");
  expect_invalid(sizes, 8, far, 8, 10000, "index 4294967295 out of range (8 params)");
}
END_TEST

START_TEST(validate_size_mismatch)
{
  uint32_t sizes[] = {1, 1, 1, 1, 1, 1, 1}, more[] = {2, 2, 2, 2, 2};
  uint32_t order[] = {7, 6, 5, 4, 3, 2, 1, 0};

  expect_invalid(sizes, 7, order, 8, 10000, "pack sizes add up to 7, but 8 params");
  expect_invalid(more, 5, order, 8, 10000, "pack sizes add up to 10, but 8 params");
}
END_TEST

START_TEST(validate_bad_shape)
{
  uint32_t sizes[] = {8}, order[] = {7, 6, 5, 4, 3, 2, 1, 0};
  uint32_t big[] = {UINT32_MAX, 9};
  static const gs_param_desc_t bad[] = {{"a", 1, F32}, {"b", 1, (gs_dtype_t)9}};
  uint32_t bad_sizes[] = {1, 1}, bad_order[] = {1, 0};
  gs_packlist_t bad_list = {100, 2, 2, bad_sizes, bad_order};
  char why[128] = "";

  expect_invalid(NULL, 1, order, 8, 1 << 20, "pack_sizes is missing");
  expect_invalid(sizes, 1, NULL, 8, 1 << 20, "order is missing");
  /* Sizes whose 32-bit sum would wrap around to the right count. */
  expect_invalid(big, 2, order, 8, 1 << 20, "pack sizes add up to 4294967304, but 8 params");
  /* The list is checked against the params the caller has, not the ones
   * it claims: one param fewer puts an index out of range. */
  ck_assert_int_eq(gs_packlist_validate(&bad_list, bad, 1, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "index 1 out of range (1 params)"), "%s", why);
  ck_assert_int_eq(gs_packlist_validate(&bad_list, bad, 2, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "param 1 (b) has unknown dtype 9"), "%s", why);
  ck_assert_int_eq(gs_packlist_validate(NULL, bad, 2, why, sizeof(why)), GS_EINVAL);
}
END_TEST

START_TEST(validate_short_why)
{
  uint32_t sizes[] = {1, 1, 0, 1, 1, 1, 1, 1, 1}, order[] = {7, 6, 5, 4, 3, 2, 1, 0};
  gs_packlist_t list = {10000, 8, 9, sizes, order};
  char why[9];

  memset(why, 'z', sizeof(why));
  ck_assert_int_eq(gs_packlist_validate(&list, model, COUNT(model), why, 8), GS_EINVAL);
  ck_assert_str_eq(why, "pack 2 ");
  ck_assert_int_eq(why[8], 'z');
}
END_TEST

/* Xorshift64: a fixed, local generator so the property test is the same on
 * every run and shares no state with anything else. */
static uint64_t xorshift(uint64_t *state)
{
  uint64_t x = *state;

  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return x;
}

/* Fills `p` with n random params: mostly small, some empty, a few huge;
 * dtypes in runs so packs of several params happen. */
static void random_params(uint64_t *rng, gs_param_desc_t *p, uint32_t n)
{
  gs_dtype_t dtype = F32;
  uint32_t i;

  for (i = 0; i < n; i++) {
    uint64_t r = xorshift(rng);

    if (r % 5 == 0)
      dtype = (gs_dtype_t)(xorshift(rng) % 4);
    p[i].name = r % 7 == 0 ? NULL : "p";
    p[i].dtype = dtype;
    if (r % 11 == 0)
      p[i].elements = 0;
    else if (r % 13 == 0)
      p[i].elements = xorshift(rng) % 1000000;
    else
      p[i].elements = xorshift(rng) % 3000;
  }
}

/* Checks the list is the greedy one the header describes: every param
 * once, in reverse, and each pack closed only because the next param had a
 * different dtype or would have pushed it over the threshold. */
static void check_greedy(const gs_packlist_t *list, const gs_param_desc_t *p, uint32_t n)
{
  uint32_t seen[128] = {0}, first = 0, k, i;

  for (i = 0; i < n; i++) {
    ck_assert_uint_eq(list->order[i], n - 1 - i);
    seen[list->order[i]]++;
  }
  for (i = 0; i < n; i++)
    ck_assert_uint_eq(seen[i], 1);
  for (k = 0; k + 1 < list->pack_count; k++) {
    uint32_t count = list->pack_sizes[k];
    const gs_param_desc_t *next = &p[list->order[first + count]];
    uint64_t more = gs_packlist_pack_bytes(list, p, first, count + 1);

    ck_assert(list->threshold_bytes == 0 || next->dtype != p[list->order[first]].dtype ||
              more > list->threshold_bytes);
    first += count;
  }
}

START_TEST(random_property)
{
  static const uint64_t thresholds[] = {0, 1, 4096, 25000, 1 << 20, UINT64_MAX};
  gs_param_desc_t p[128];
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  gs_packlist_t list;
  char why[256] = "";
  int iter;

  for (iter = 0; iter < 200; iter++) {
    uint32_t n = (uint32_t)(xorshift(&rng) % (COUNT(p) + 1));
    uint64_t threshold = thresholds[xorshift(&rng) % COUNT(thresholds)];

    random_params(&rng, p, n);
    ck_assert_int_eq(gs_packlist_compute(p, n, threshold, &list), 0);
    ck_assert_msg(gs_packlist_validate(&list, p, n, why, sizeof(why)) == 0, "iteration %d: %s",
                  iter, why);
    check_greedy(&list, p, n);
    gs_packlist_free(&list);
  }
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *packlist_suite(void)
{
  Suite *s = suite_create("packlist");

  suite_add_tcase(s, tcase("empty", empty));
  suite_add_tcase(s, tcase("single_param", single_param));
  suite_add_tcase(s, tcase("all_fit_in_one", all_fit_in_one));
  suite_add_tcase(s, tcase("threshold_boundary", threshold_boundary));
  suite_add_tcase(s, tcase("big_param_alone", big_param_alone));
  suite_add_tcase(s, tcase("dtype_changes", dtype_changes));
  suite_add_tcase(s, tcase("threshold_zero", threshold_zero));
  suite_add_tcase(s, tcase("zero_elements", zero_elements));
  suite_add_tcase(s, tcase("order_is_reverse", order_is_reverse));
  suite_add_tcase(s, tcase("unknown_dtype", unknown_dtype));
  suite_add_tcase(s, tcase("dtype_table", dtype_table));
  suite_add_tcase(s, tcase("pack_bytes_and_free", pack_bytes_and_free));
  suite_add_tcase(s, tcase("validate_computed", validate_computed));
  suite_add_tcase(s, tcase("validate_hand_made", validate_hand_made));
  suite_add_tcase(s, tcase("validate_duplicate", validate_duplicate));
  suite_add_tcase(s, tcase("validate_mixed_dtype", validate_mixed_dtype));
  suite_add_tcase(s, tcase("validate_over_threshold", validate_over_threshold));
  suite_add_tcase(s, tcase("validate_missing", validate_missing));
  suite_add_tcase(s, tcase("validate_empty_pack", validate_empty_pack));
  suite_add_tcase(s, tcase("validate_out_of_range", validate_out_of_range));
  suite_add_tcase(s, tcase("validate_size_mismatch", validate_size_mismatch));
  suite_add_tcase(s, tcase("validate_bad_shape", validate_bad_shape));
  suite_add_tcase(s, tcase("validate_short_why", validate_short_why));
  suite_add_tcase(s, tcase("random_property", random_property));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {packlist_suite}};
