/* Tests for common/flags.c and flags_help.c: the table-driven parser, its
 * messages, the environment fallbacks (one variable, or an ordered list of
 * sources through a lookup), pass-through, --print-config, and the help
 * and the flag reference's markdown made from the same table. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flags.h"
#include "runner.h"

typedef enum color { RED, GREEN, BLUE } color_t;

/* Every kind of target a table can write. */
typedef struct opts {
  bool verbose, shuffle, have_level;
  const char *name;
  char *token;
  char device[8];
  uint32_t count;
  int32_t period;
  uint16_t small;
  long big;
  float lr;
  double ratio;
  uint64_t bytes, wait_ms;
  color_t color;
  char host[64];
  uint16_t port;
  int even;
  char zone[16];
} opts_t;

static const char *const colors[] = {"red", "green", "blue", NULL};
static const char *const devices[] = {"cpu", "cuda", "auto", NULL};
static const char *const zone_envs[] = {"T_ZONE", "T_AREA", "T_A*T_B", NULL};

/* A custom kind: an even integer. */
static int parse_even(const char *v, void *target, char *expect, size_t expect_len)
{
  int n = atoi(v);

  if (n % 2 != 0 || n <= 0) {
    snprintf(expect, expect_len, "a positive even number");
    return GS_EINVAL;
  }
  *(int *)target = n;
  return 0;
}

static void show_even(const void *target, char *buf, size_t len)
{
  snprintf(buf, len, "%d", *(const int *)target);
}

#define AT(m) GS_FLAG_AT(opts_t, m)
static const gs_flag_t rows[] = {
    GS_FLAG_HEADING("General:"),
    {.name = "--verbose", .kind = GS_FLAG_BOOL, AT(verbose), .help = "say more"},
    {.name = "--no-shuffle",
     .kind = GS_FLAG_BOOL,
     .negate = true,
     AT(shuffle),
     .help = "keep file order"},
    {.name = "--name",
     .kind = GS_FLAG_STR,
     AT(name),
     .min = 1,
     .max = 8,
     .metavar = "NAME",
     .help = "a name"},
    {.name = "--token",
     .kind = GS_FLAG_STR,
     AT(token),
     .max = 16,
     .secret = true,
     .env = "T_TOKEN",
     .metavar = "TOKEN",
     .def = "`$T_TOKEN`",
     .help = "the secret"},
    {.name = "--device",
     .kind = GS_FLAG_STRBUF,
     AT(device),
     .names = devices,
     .help = "where to run"},
    {.name = "--count",
     .kind = GS_FLAG_INT,
     AT(count),
     .min = 1,
     .max = 1000,
     .metavar = "N",
     .env = "T_COUNT",
     .help = "how many"},
    {.name = "--period",
     .alias = "--every",
     .kind = GS_FLAG_INT,
     AT(period),
     .min = -1,
     .max = 100,
     .metavar = "P",
     .help = "how often"},
    {.name = "--small",
     .kind = GS_FLAG_INT,
     AT(small),
     .min = 0,
     .max = 65535,
     .metavar = "N",
     .help = "a port-sized number"},
    {.name = "--big",
     .kind = GS_FLAG_INT,
     AT(big),
     .min = 0,
     .max = 1L << 40,
     .metavar = "N",
     .required = true,
     .help = "a big number"},
    GS_FLAG_HEADING("Numbers:"),
    {.name = "--lr",
     .kind = GS_FLAG_DOUBLE,
     AT(lr),
     .metavar = "LR",
     .help = "a learning rate",
     .doc = "the base learning rate, `lr`"},
    {.name = "--ratio",
     .kind = GS_FLAG_DOUBLE,
     AT(ratio),
     .dmin = 0,
     .dmax = 1,
     .metavar = "R",
     .help = "a ratio, a number between 0 and 1 that this text goes on about long enough to wrap",
     .doc = "a ratio"},
    {.name = "--bytes",
     .kind = GS_FLAG_SIZE,
     AT(bytes),
     .umin = 1,
     .metavar = "SIZE",
     .help = "a size"},
    {.name = "--wait",
     .kind = GS_FLAG_DURATION,
     AT(wait_ms),
     .umin = 1000,
     .umax = 60000,
     .metavar = "DUR",
     .help = "a wait"},
    {.name = "--color", .kind = GS_FLAG_ENUM, AT(color), .names = colors, .help = "a color"},
    {.name = "--listen",
     .kind = GS_FLAG_ADDR,
     AT(host),
     GS_FLAG_PORT_AT(opts_t, port),
     .metavar = "HOST:PORT",
     .help = "where to listen"},
    {.name = "--even",
     .kind = GS_FLAG_CUSTOM,
     AT(even),
     .parse = parse_even,
     .show = show_even,
     .metavar = "N",
     .help = "an even number"},
    {.name = "--level",
     .kind = GS_FLAG_INT,
     AT(count),
     .min = 0,
     .max = 3,
     .metavar = "L",
     GS_FLAG_GIVEN(opts_t, have_level),
     .help = "a level"},
    {.name = "--zone",
     .kind = GS_FLAG_STRBUF,
     AT(zone),
     .max = 8,
     .envs = zone_envs,
     .metavar = "Z",
     .help = "a zone"},
};

static const gs_flags_t spec = {
    .prog = "test",
    .usage = "usage: test [options]\n\n",
    .epilog = "That is all.\n",
    .flags = rows,
    .count = sizeof(rows) / sizeof(rows[0]),
};

static void defaults(opts_t *o)
{
  memset(o, 0, sizeof(*o));
  o->shuffle = true;
  o->count = 3;
  o->lr = 0.05f;
  o->ratio = 0.5;
  o->bytes = 10 << 20;
  o->wait_ms = 30000;
  o->color = GREEN;
  snprintf(o->device, sizeof(o->device), "auto");
  snprintf(o->host, sizeof(o->host), "0.0.0.0");
  o->port = 7070;
  o->big = 1;
}

/* The environment the tests give: T_TOKEN, T_COUNT, T_ZONE and T_AREA,
 * from statics. */
static char env_token[32], env_count[32], env_zone[32], env_area[32];

static char *fake_env(const char *name)
{
  if (!strcmp(name, "T_TOKEN"))
    return env_token;
  if (!strcmp(name, "T_COUNT"))
    return env_count;
  if (!strcmp(name, "T_ZONE"))
    return env_zone;
  if (!strcmp(name, "T_AREA"))
    return env_area;
  return NULL;
}

/* A lookup with context: name=value pairs, and "T_A*T_B" derived from
 * them as "A-B" when both are there (as a scheduler dialect would). */
typedef struct lookup_ctx {
  const char *pairs[8][2];
  char derived[32];
  int calls;
} lookup_ctx_t;

static const char *pair(lookup_ctx_t *c, const char *name)
{
  for (size_t i = 0; i < 8 && c->pairs[i][0]; i++)
    if (!strcmp(c->pairs[i][0], name))
      return c->pairs[i][1];
  return NULL;
}

static const char *fake_lookup(void *ctx, const char *name)
{
  lookup_ctx_t *c = ctx;
  const char *a, *b;

  c->calls++;
  if (strcmp(name, "T_A*T_B") != 0)
    return pair(c, name);
  a = pair(c, "T_A");
  b = pair(c, "T_B");
  if (!a || !b)
    return NULL;
  snprintf(c->derived, sizeof(c->derived), "%s-%s", a, b);
  return c->derived;
}

/* Parses a NULL-terminated list of arguments (copied: values are borrowed). */
static int parse(opts_t *o, gs_flags_action_t *action, char *why, size_t why_len,
                 const gs_flags_opts_t *fo, char **args)
{
  char *argv[64];
  int argc = 0;

  argv[argc++] = "test";
  while (*args)
    argv[argc++] = *args++;
  argv[argc] = NULL;
  return gs_flags_parse(&spec, o, argc, argv, fo, action, why, why_len);
}

#define ARGS(...) ((char *[]){__VA_ARGS__, NULL})

/* Expects a usage error whose message holds `want`. */
static void expect_error(char **args, const char *want)
{
  gs_flags_action_t action;
  char why[256];
  opts_t o;
  int err;

  defaults(&o);
  err = parse(&o, &action, why, sizeof(why), NULL, args);
  ck_assert_int_eq(err, GS_EINVAL);
  ck_assert_msg(strstr(why, want), "message '%s' lacks '%s'", why, want);
}

static void expect_ok(opts_t *o, char **args)
{
  gs_flags_action_t action;
  char why[256];
  int err;

  defaults(o);
  err = parse(o, &action, why, sizeof(why), NULL, args);
  ck_assert_msg(err == 0, "parse failed: %s", why);
  ck_assert_int_eq(action, GS_FLAGS_RUN);
}

START_TEST(value_forms)
{
  opts_t o;

  expect_ok(&o, ARGS("--big", "5", "--count", "7", "--name=ab", "--period=-1"));
  ck_assert_int_eq(o.big, 5);
  ck_assert_uint_eq(o.count, 7);
  ck_assert_str_eq(o.name, "ab");
  ck_assert_int_eq(o.period, -1);
  /* The last of a repeated flag wins; a value may start with a dash. */
  expect_ok(&o, ARGS("--big=1", "--count", "2", "--count", "9", "--name", "-x"));
  ck_assert_uint_eq(o.count, 9);
  ck_assert_str_eq(o.name, "-x");
  /* An alias is the same flag, in both forms; the last one given wins. */
  expect_ok(&o, ARGS("--big=1", "--every", "4"));
  ck_assert_int_eq(o.period, 4);
  expect_ok(&o, ARGS("--big=1", "--period", "3", "--every=-1"));
  ck_assert_int_eq(o.period, -1);
}
END_TEST

START_TEST(every_kind)
{
  opts_t o;

  expect_ok(&o, ARGS("--big", "1099511627776", "--verbose", "--no-shuffle", "--device", "CPU",
                     "--small", "65535", "--lr", "0.1", "--ratio", "1", "--bytes", "64KiB",
                     "--wait", "1m", "--color", "BLUE", "--listen", "[::1]:0", "--even", "4"));
  ck_assert_int_eq(o.big, 1L << 40);
  ck_assert(o.verbose);
  ck_assert(!o.shuffle);
  ck_assert_str_eq(o.device, "cpu");
  ck_assert_uint_eq(o.small, 65535);
  ck_assert_float_eq(o.lr, 0.1f);
  ck_assert_double_eq(o.ratio, 1.0);
  ck_assert_uint_eq(o.bytes, 65536);
  ck_assert_uint_eq(o.wait_ms, 60000);
  ck_assert_int_eq(o.color, BLUE);
  ck_assert_str_eq(o.host, "::1");
  ck_assert_uint_eq(o.port, 0);
  ck_assert_int_eq(o.even, 4);
  ck_assert(!o.have_level);
}
END_TEST

START_TEST(bad_values)
{
  expect_error(ARGS("--big", "1", "--count", "0"),
               "invalid value '0' for --count: expected an integer from 1 to 1000");
  expect_error(ARGS("--big", "1", "--count", "1x"), "for --count: expected an integer");
  expect_error(ARGS("--big", "1", "--lr", "fast"), "for --lr: expected a number");
  expect_error(ARGS("--big", "1", "--lr", "1e39"), "for --lr: expected a number");
  expect_error(ARGS("--big", "1", "--ratio", "1.5"), "expected a number from 0 to 1");
  expect_error(ARGS("--big", "1", "--bytes", "0"), "expected a positive size such as");
  expect_error(ARGS("--big", "1", "--wait", "10"), "expected a duration from 1s to 1m");
  expect_error(ARGS("--big", "1", "--wait", "2m"), "expected a duration from 1s to 1m");
  expect_error(ARGS("--big", "1", "--color", "pink"), "expected red, green or blue");
  expect_error(ARGS("--big", "1", "--device", "tpu"), "expected cpu, cuda or auto");
  expect_error(ARGS("--big", "1", "--name", ""), "expected 1 to 8 bytes");
  expect_error(ARGS("--big", "1", "--name", "123456789"), "expected 1 to 8 bytes");
  expect_error(ARGS("--big", "1", "--listen", "nohost"), "expected HOST:PORT or :PORT");
  expect_error(ARGS("--big", "1", "--even", "3"), "for --even: expected a positive even number");
  expect_error(ARGS("--big", "1", "--small", "65536"), "from 0 to 65535");
}
END_TEST

START_TEST(secret_hidden)
{
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  /* A secret's value is never echoed, even when it is what is wrong. */
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL,
                         ARGS("--big", "1", "--token", "far-too-long-a-secret")),
                   GS_EINVAL);
  ck_assert_str_eq(why, "invalid value '(hidden)' for --token: expected at most 16 bytes");
  expect_error(ARGS("--token"), "--token needs a value: --token TOKEN");
  expect_ok(&o, ARGS("--big", "1", "--token", "s3cret"));
  ck_assert_str_eq(o.token, "s3cret");
}
END_TEST

START_TEST(usage_errors)
{
  expect_error(ARGS("--big", "1", "--bogus"), "unknown flag '--bogus' (see --help)");
  expect_error(ARGS("--big", "1", "--bogus=3"), "unknown flag '--bogus'");
  expect_error(ARGS("--big", "1", "-x"), "unknown flag '-x'");
  expect_error(ARGS("--big", "1", "extra"), "unexpected argument 'extra'");
  expect_error(ARGS("--big", "1", "--", "--count"), "unexpected argument '--count'");
  expect_error(ARGS("--big", "1", "--count"), "--count needs a value: --count N");
  expect_error(ARGS("--big", "1", "--verbose=yes"), "--verbose takes no value");
  expect_error(ARGS("--count", "2"), "--big N is required");
  /* No prefix matching: a flag is its whole name. */
  expect_error(ARGS("--big", "1", "--coun", "2"), "unknown flag '--coun'");
}
END_TEST

START_TEST(actions_first)
{
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  /* Help wins over everything and applies nothing, so it shows defaults. */
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL, ARGS("--count", "9", "--help")), 0);
  ck_assert_int_eq(action, GS_FLAGS_HELP);
  ck_assert_uint_eq(o.count, 3);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL, ARGS("--count", "0", "-h")), 0);
  ck_assert_int_eq(action, GS_FLAGS_HELP);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL, ARGS("--version")), 0);
  ck_assert_int_eq(action, GS_FLAGS_VERSION);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL, ARGS("--help-markdown")), 0);
  ck_assert_int_eq(action, GS_FLAGS_MARKDOWN);
  /* As a flag's value "--help" is just a value. */
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), NULL, ARGS("--big", "1", "--name", "-h")),
                   0);
  ck_assert_int_eq(action, GS_FLAGS_RUN);
  ck_assert_str_eq(o.name, "-h");
}
END_TEST

START_TEST(env_fallback)
{
  gs_flags_opts_t fo = {.getenv = fake_env};
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  snprintf(env_token, sizeof(env_token), "from-env");
  snprintf(env_count, sizeof(env_count), "42");
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_str_eq(o.token, "from-env");
  ck_assert_uint_eq(o.count, 42);
  /* The flag wins over the variable, whose bad value is then not looked at. */
  snprintf(env_count, sizeof(env_count), "many");
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1", "--count", "5")),
                   0);
  ck_assert_uint_eq(o.count, 5);
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), GS_EINVAL);
  ck_assert_str_eq(why, "invalid value 'many' for --count (from $T_COUNT): expected an integer "
                        "from 1 to 1000");
  /* An empty variable counts as unset. */
  env_count[0] = env_token[0] = '\0';
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_uint_eq(o.count, 3);
  ck_assert_ptr_null(o.token);
}
END_TEST

START_TEST(pass_through)
{
  char *pass[16];
  int npass = -1, dashes = -2;
  gs_flags_opts_t fo = {.pass = pass, .npass = &npass, .pass_dashes = &dashes};
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  defaults(&o);
  ck_assert_int_eq(
      parse(&o, &action, why, sizeof(why), &fo,
            ARGS("--reduce", "mean", "--big", "2", "--lr=1", "x", "--", "--count", "4", "--help")),
      0);
  ck_assert_int_eq(action, GS_FLAGS_RUN);
  ck_assert_int_eq(o.big, 2);
  ck_assert_float_eq(o.lr, 1.0f);
  ck_assert_uint_eq(o.count, 3);
  ck_assert_int_eq(npass, 6);
  ck_assert_str_eq(pass[0], "--reduce");
  ck_assert_str_eq(pass[1], "mean");
  ck_assert_str_eq(pass[2], "x");
  ck_assert_str_eq(pass[3], "--count");
  ck_assert_str_eq(pass[4], "4");
  ck_assert_str_eq(pass[5], "--help");
  /* What came before "--" is told from what followed it; a "--" taken as
   * a flag's value is no separator; without one, everything came before. */
  ck_assert_int_eq(dashes, 3);
  ck_assert_int_eq(
      parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1", "--name", "--", "y", "--", "z")),
      0);
  ck_assert_str_eq(o.name, "--");
  ck_assert_int_eq(npass, 2);
  ck_assert_int_eq(dashes, 1);
  ck_assert_int_eq(
      parse(&o, &action, why, sizeof(why), &fo, ARGS("a", "--big", "1", "--count", "5", "b")), 0);
  ck_assert_int_eq(npass, 2);
  ck_assert_int_eq(dashes, 2);
}
END_TEST

START_TEST(given_marks)
{
  opts_t o;

  expect_ok(&o, ARGS("--big", "1", "--level", "2"));
  ck_assert(o.have_level);
  ck_assert_uint_eq(o.count, 2);
}
END_TEST

START_TEST(table_checked)
{
  static const gs_flag_t bad_int[] = {
      {.name = "--n", .kind = GS_FLAG_INT, GS_FLAG_AT(opts_t, small), .min = 0, .max = 70000}};
  static const gs_flag_t bad_name[] = {
      {.name = "n", .kind = GS_FLAG_BOOL, GS_FLAG_AT(opts_t, verbose)}};
  static const gs_flag_t bad_bool[] = {
      {.name = "--n", .kind = GS_FLAG_BOOL, GS_FLAG_AT(opts_t, count)}};
  static const gs_flag_t bad_enum[] = {
      {.name = "--n", .kind = GS_FLAG_ENUM, GS_FLAG_AT(opts_t, color)}};
  static const char *const no_names[] = {NULL};
  static const gs_flag_t both_envs[] = {{.name = "--n",
                                         .kind = GS_FLAG_STRBUF,
                                         GS_FLAG_AT(opts_t, zone),
                                         .env = "T_ZONE",
                                         .envs = zone_envs}};
  static const gs_flag_t empty_envs[] = {
      {.name = "--n", .kind = GS_FLAG_STRBUF, GS_FLAG_AT(opts_t, zone), .envs = no_names}};
  static const gs_flag_t bad_alias[] = {
      {.name = "--n", .alias = "n", .kind = GS_FLAG_BOOL, GS_FLAG_AT(opts_t, verbose)}};
  const gs_flag_t *tables[] = {bad_int,   bad_name,   bad_bool, bad_enum,
                               both_envs, empty_envs, bad_alias};
  char why[256];

  ck_assert_int_eq(gs_flags_check_table(&spec, why, sizeof(why)), 0);
  for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
    gs_flags_t s = {.prog = "t", .usage = "", .flags = tables[i], .count = 1};

    ck_assert_int_eq(gs_flags_check_table(&s, why, sizeof(why)), GS_EINVAL);
    ck_assert_msg(strstr(why, "flag table row 0"), "%s", why);
  }
}
END_TEST

/* An enum flag with a bare value: alone it takes that value, with "="
 * another, and it never takes the next argument as its value. */
START_TEST(bare_value)
{
  static const char *const modes[] = {"off", "on", "auto", NULL};
  static const gs_flag_t table[] = {{.name = "--mode",
                                     .kind = GS_FLAG_ENUM,
                                     GS_FLAG_AT(opts_t, color),
                                     .names = modes,
                                     .bare = "on",
                                     .help = "a mode"}};
  static const gs_flag_t bad[] = {{.name = "--mode",
                                   .kind = GS_FLAG_ENUM,
                                   GS_FLAG_AT(opts_t, color),
                                   .names = modes,
                                   .bare = "maybe"}};
  gs_flags_t s = {.prog = "t", .usage = "", .flags = table, .count = 1};
  gs_flags_t b = {.prog = "t", .usage = "", .flags = bad, .count = 1};
  char *a1[] = {"t", "--mode", NULL}, *a2[] = {"t", "--mode=auto", NULL};
  char *a3[] = {"t", "--mode", "auto", NULL}, *a4[] = {"t", "--mode=sometimes", NULL};
  gs_flags_action_t action;
  opts_t o = {.color = RED};
  char why[256], *text = NULL;
  size_t len = 0;
  FILE *f;

  ck_assert_int_eq(gs_flags_parse(&s, &o, 2, a1, NULL, &action, why, sizeof(why)), 0);
  ck_assert_int_eq(o.color, 1);
  ck_assert_int_eq(gs_flags_parse(&s, &o, 2, a2, NULL, &action, why, sizeof(why)), 0);
  ck_assert_int_eq(o.color, 2);
  ck_assert_int_eq(gs_flags_parse(&s, &o, 3, a3, NULL, &action, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "unexpected argument 'auto'"), "%s", why);
  ck_assert_int_eq(gs_flags_parse(&s, &o, 2, a4, NULL, &action, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "'sometimes' for --mode"), "%s", why);
  ck_assert_int_eq(gs_flags_check_table(&b, why, sizeof(why)), GS_EINVAL);
  ck_assert_msg(strstr(why, "bare value"), "%s", why);
  f = open_memstream(&text, &len);
  gs_flags_help(&s, &o, f);
  fclose(f);
  ck_assert_msg(strstr(text, "--mode[=off|on|auto]"), "%s", text);
  free(text);
}
END_TEST

START_TEST(env_sources)
{
  const char *sources[sizeof(rows) / sizeof(rows[0])];
  gs_flags_opts_t fo = {.getenv = fake_env, .sources = sources};
  size_t zone = sizeof(rows) / sizeof(rows[0]) - 1, count = 6, big = 9;
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  ck_assert_str_eq(rows[zone].name, "--zone");
  ck_assert_str_eq(rows[count].name, "--count");
  ck_assert_str_eq(rows[big].name, "--big");
  /* The first source that is set wins; the later ones are not applied. */
  env_token[0] = env_count[0] = '\0';
  snprintf(env_zone, sizeof(env_zone), "z1");
  snprintf(env_area, sizeof(env_area), "far-too-long-area");
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_str_eq(o.zone, "z1");
  ck_assert_str_eq(sources[zone], "T_ZONE");
  ck_assert_str_eq(sources[big], "flag");
  ck_assert_ptr_null(sources[count]);
  /* An empty first source counts as unset: the next one is used, and its
   * bad value is named with its variable. */
  env_zone[0] = '\0';
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), GS_EINVAL);
  ck_assert_str_eq(why, "invalid value 'far-too-long-area' for --zone (from $T_AREA): expected at "
                        "most 8 bytes");
  snprintf(env_area, sizeof(env_area), "a1");
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_str_eq(o.zone, "a1");
  ck_assert_str_eq(sources[zone], "T_AREA");
  /* The flag wins over every source. */
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1", "--zone=f")), 0);
  ck_assert_str_eq(o.zone, "f");
  ck_assert_str_eq(sources[zone], "flag");
  /* Nothing set: the default stays, and its source is NULL. */
  env_area[0] = '\0';
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_str_eq(o.zone, "");
  ck_assert_ptr_null(sources[zone]);
}
END_TEST

START_TEST(env_lookup)
{
  const char *sources[sizeof(rows) / sizeof(rows[0])];
  lookup_ctx_t c = {.pairs = {{"T_A", "x"}, {"T_B", "y"}, {"T_COUNT", "8"}, {"T_TOKEN", ""}}};
  gs_flags_opts_t fo = {.getenv = fake_env, .lookup = fake_lookup, .ctx = &c, .sources = sources};
  size_t zone = sizeof(rows) / sizeof(rows[0]) - 1;
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  /* The lookup replaces getenv for .env and .envs alike, and may derive a
   * source from others. */
  snprintf(env_zone, sizeof(env_zone), "not-this");
  snprintf(env_count, sizeof(env_count), "99");
  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "1")), 0);
  ck_assert_str_eq(o.zone, "x-y");
  ck_assert_str_eq(sources[zone], "T_A*T_B");
  ck_assert_uint_eq(o.count, 8);
  ck_assert_ptr_null(o.token); /* "" is unset */
  ck_assert_int_gt(c.calls, 3);
  env_zone[0] = env_count[0] = '\0';
}
END_TEST

/* What render writes: open_memstream's buffer and its length. */
typedef struct {
  char *text;
  size_t len;
} rendered_t;

/* Renders help or markdown into out->text (caller frees). The stream
 * writes through the caller's pointer and length, not through locals of
 * this function: once their address has gone to open_memstream, gcc -O2
 * (-Wdangling-pointer) cannot rule out that the returned text is one of
 * them, dead after the return. */
static void render(bool markdown, const opts_t *o, rendered_t *out)
{
  FILE *f;

  *out = (rendered_t){0};
  f = open_memstream(&out->text, &out->len);
  ck_assert_ptr_nonnull(f);
  if (markdown)
    gs_flags_markdown(&spec, o, f);
  else
    gs_flags_help(&spec, o, f);
  fclose(f);
}

START_TEST(help_text)
{
  rendered_t r;
  opts_t o;
  char *help, *line;

  defaults(&o);
  o.count = 17; /* the help shows what the struct holds */
  render(false, &o, &r);
  help = r.text;
  ck_assert_msg(strncmp(help, "usage: test [options]\n\nGeneral:\n", 32) == 0, "%s", help);
  /* Long texts wrap under their column. */
  ck_assert_ptr_nonnull(strstr(
      help, "  --ratio R               a ratio, a number between 0 and 1 that this text goes\n"
            "                          on about long enough to wrap (default: 0.5)\n"));
  ck_assert_ptr_nonnull(strstr(help, "  --count N               how many (default: 17)\n"));
  ck_assert_ptr_nonnull(strstr(help, "  --verbose               say more\n"));
  ck_assert_ptr_nonnull(strstr(help, "  --period, --every P     how often (default: "));
  ck_assert_ptr_nonnull(strstr(help, "  --big N                 a big number (required)\n"));
  ck_assert_ptr_nonnull(strstr(help, "the secret (default: $T_TOKEN)\n"));
  ck_assert_ptr_nonnull(strstr(help, "  --device cpu|cuda|auto  where to run (default: auto)\n"));
  ck_assert_ptr_nonnull(strstr(help, "a size (default: 10MiB)"));
  ck_assert_ptr_nonnull(strstr(help, "a wait (default: 30s)"));
  ck_assert_ptr_nonnull(strstr(help, "a learning rate (default: 0.05)"));
  ck_assert_ptr_nonnull(strstr(help, "where to listen (default: :7070)"));
  ck_assert_ptr_nonnull(strstr(help, "a color (default: green)"));
  ck_assert_ptr_nonnull(strstr(
      help, "  --zone Z                a zone (from $T_ZONE, $T_AREA or $T_A×$T_B; default:\n"
            "                          none)\n"));
  ck_assert_ptr_nonnull(strstr(help, "  --version               print the version and exit\n"));
  ck_assert_ptr_nonnull(
      strstr(help, "  -h, --help              print this help and exit\n\nThat is all.\n"));
  for (line = strtok(help, "\n"); line; line = strtok(NULL, "\n"))
    ck_assert_msg(strlen(line) < 80, "line too long: %s", line);
  free(help);
}
END_TEST

START_TEST(markdown_table)
{
  const char *head = "| flag | default | meaning |\n|---|---|---|\n"
                     "| `--verbose` | off | say more |\n";
  rendered_t r;
  opts_t o;
  char *md;

  defaults(&o);
  render(true, &o, &r);
  md = r.text;
  ck_assert_msg(strncmp(md, head, strlen(head)) == 0, "%s", md);
  ck_assert_ptr_nonnull(strstr(md, "| `--name NAME` | none | a name |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--token TOKEN` | `$T_TOKEN` | the secret |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--device cpu\\|cuda\\|auto` | `auto` | where to run |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--big N` | required | a big number |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--lr LR` | `0.05` | the base learning rate, `lr` |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--period, --every P` | `0` | how often |\n"));
  ck_assert_ptr_nonnull(strstr(md, "| `--even N` | `0` | an even number |\n"));
  ck_assert_ptr_nonnull(
      strstr(md, "| `--zone Z` | `$T_ZONE`, `$T_AREA` or `$T_A`×`$T_B`, else none | a zone |\n"));
  ck_assert_msg(strstr(md, "| `--version`, `-h/--help` | | |\n") + 33 == md + strlen(md), "%s", md);
  ck_assert_ptr_null(strstr(md, "General"));
  free(md);
}
END_TEST

START_TEST(print_config)
{
  const char *sources[sizeof(rows) / sizeof(rows[0])];
  lookup_ctx_t c = {.pairs = {{"T_ZONE", "z"}, {"T_AREA", "a"}, {"T_TOKEN", "s3cret"}}};
  gs_flags_opts_t fo = {.lookup = fake_lookup, .ctx = &c, .sources = sources};
  gs_flags_action_t action;
  char why[256], *text = NULL;
  size_t len = 0;
  FILE *f;
  opts_t o;

  defaults(&o);
  ck_assert_int_eq(parse(&o, &action, why, sizeof(why), &fo, ARGS("--big", "7", "--verbose")), 0);
  f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  gs_flags_print_config(&spec, &o, &fo, f);
  fclose(f);
  ck_assert_ptr_nonnull(strstr(text, "--big         7                         flag\n"));
  ck_assert_ptr_nonnull(strstr(text, "--verbose     on                        flag\n"));
  ck_assert_ptr_nonnull(strstr(text, "--no-shuffle  off                       default\n"));
  ck_assert_ptr_nonnull(strstr(text, "--count       3                         default\n"));
  ck_assert_ptr_nonnull(
      strstr(text, "--zone        z                         $T_ZONE; unused: $T_AREA=a\n"));
  /* A secret says where it came from, never what it is. */
  ck_assert_ptr_nonnull(strstr(text, "--token       (hidden)                  $T_TOKEN\n"));
  ck_assert_ptr_null(strstr(text, "s3cret"));
  free(text);
}
END_TEST

/* Argument strings end right before an unreadable page, so a parser that
 * reads past a NUL crashes the test. */
START_TEST(no_overread)
{
  const char *args[] = {"--count=12", "--bytes", "1KiB", "--listen", ":80", "--color", "red"};
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = sizeof(args) / sizeof(args[0]);
  char *mem[8], *argv[10];
  gs_flags_action_t action;
  char why[256];
  opts_t o;

  argv[0] = "test";
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(args[i]) + 1;

    mem[i] = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(mem[i], MAP_FAILED);
    ck_assert_int_eq(mprotect(mem[i] + page, page, PROT_NONE), 0);
    argv[i + 1] = memcpy(mem[i] + page - len, args[i], len);
  }
  argv[n + 1] = "--big";
  argv[n + 2] = "1";
  defaults(&o);
  ck_assert_int_eq(gs_flags_parse(&spec, &o, (int)n + 3, argv, NULL, &action, why, sizeof(why)), 0);
  ck_assert_uint_eq(o.count, 12);
  ck_assert_uint_eq(o.bytes, 1024);
  ck_assert_uint_eq(o.port, 80);
  ck_assert_int_eq(o.color, RED);
  for (size_t i = 0; i < n; i++)
    munmap(mem[i], 2 * page);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *flags_suite(void)
{
  Suite *s = suite_create("flags");

  suite_add_tcase(s, tcase("value_forms", value_forms));
  suite_add_tcase(s, tcase("every_kind", every_kind));
  suite_add_tcase(s, tcase("bad_values", bad_values));
  suite_add_tcase(s, tcase("secret_hidden", secret_hidden));
  suite_add_tcase(s, tcase("usage_errors", usage_errors));
  suite_add_tcase(s, tcase("actions_first", actions_first));
  suite_add_tcase(s, tcase("env_fallback", env_fallback));
  suite_add_tcase(s, tcase("env_sources", env_sources));
  suite_add_tcase(s, tcase("env_lookup", env_lookup));
  suite_add_tcase(s, tcase("print_config", print_config));
  suite_add_tcase(s, tcase("pass_through", pass_through));
  suite_add_tcase(s, tcase("given_marks", given_marks));
  suite_add_tcase(s, tcase("table_checked", table_checked));
  suite_add_tcase(s, tcase("bare_value", bare_value));
  suite_add_tcase(s, tcase("help_text", help_text));
  suite_add_tcase(s, tcase("markdown_table", markdown_table));
  suite_add_tcase(s, tcase("no_overread", no_overread));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {flags_suite}};
