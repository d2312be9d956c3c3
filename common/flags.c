/* The flag parser: argv and a table of gs_flag_t rows into the caller's
 * struct. Pure: it prints nothing and reads the environment only through
 * the lookup it is given. Help and markdown rendering are in flags_help.c. */
#include "flags.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "flags_internal.h"
#include "parse.h"
#include "why.h"

/* Rows a table may have: the parser keeps one "given" bit per row. */
#define GS_FLAGS_MAX 256

static bool is_int_size(size_t size)
{
  return size == 1 || size == 2 || size == 4 || size == 8;
}

/* Whether [min, max] fits an integer of `size` bytes, signed or not. */
static bool range_fits(long min, long max, size_t size)
{
  long lo, hi;

  if (size >= sizeof(long))
    return true;
  hi = (1L << (8 * size)) - 1;  /* unsigned maximum */
  lo = -(1L << (8 * size - 1)); /* signed minimum */
  return min >= lo && max <= hi && !(min < 0 && max > hi / 2);
}

static size_t count_names(const char *const *names)
{
  size_t n = 0;

  while (names && names[n])
    n++;
  return n;
}

static long find_name(const char *const *names, const char *v);

/* Checks one row; returns NULL or what is wrong with it. */
static const char *row_problem(const gs_flag_t *f)
{
  if (f->kind == GS_FLAG_SECTION)
    return f->help ? NULL : "a heading needs its text";
  if (!f->name || strncmp(f->name, "--", 2) != 0 || !f->name[2])
    return "a name must start with --";
  if (f->alias && (strncmp(f->alias, "--", 2) != 0 || !f->alias[2]))
    return "an alias must start with --";
  if (f->env && f->envs)
    return "a row has .env or .envs, not both";
  if (f->envs && !f->envs[0])
    return "an .envs list needs a name";
  switch (f->kind) {
  case GS_FLAG_BOOL:
    return f->size == sizeof(bool) ? NULL : "a bool flag needs a bool target";
  case GS_FLAG_STR:
    return f->size == sizeof(char *) ? NULL : "a string flag needs a char * target";
  case GS_FLAG_STRBUF:
    return f->size >= 2 ? NULL : "a string buffer needs at least 2 bytes";
  case GS_FLAG_INT:
    if (!is_int_size(f->size) || f->min > f->max || !range_fits(f->min, f->max, f->size))
      return "an integer flag needs a 1, 2, 4 or 8 byte target its range fits";
    return NULL;
  case GS_FLAG_DOUBLE:
    if ((f->size != sizeof(float) && f->size != sizeof(double)) || f->dmin > f->dmax)
      return "a number flag needs a float or double target and dmin <= dmax";
    return NULL;
  case GS_FLAG_SIZE:
  case GS_FLAG_DURATION:
    if (f->size != sizeof(uint64_t) || (f->umax && f->umin > f->umax))
      return "a size or duration flag needs a uint64_t target and umin <= umax";
    return NULL;
  case GS_FLAG_ENUM:
    if (!is_int_size(f->size) || count_names(f->names) == 0)
      return "an enum flag needs names and an integer target";
    if (f->bare && find_name(f->names, f->bare) < 0)
      return "an enum flag's bare value must be one of its names";
    return NULL;
  case GS_FLAG_ADDR:
    return f->size >= 2 && f->off2 != f->off ? NULL : "an address flag needs a host and a port";
  case GS_FLAG_CUSTOM:
    return f->parse ? NULL : "a custom flag needs its parse function";
  case GS_FLAG_SECTION:
    break;
  }
  return "unknown kind";
}

int gs_flags_check_table(const gs_flags_t *spec, char *why, size_t why_len)
{
  const char *problem;

  if (spec->count > GS_FLAGS_MAX)
    return gs_why(GS_EINVAL, why, why_len, "flag table of %zu rows: at most %d", spec->count,
                  GS_FLAGS_MAX);
  for (size_t i = 0; i < spec->count; i++) {
    problem = row_problem(&spec->flags[i]);
    if (problem)
      return gs_why(GS_EINVAL, why, why_len, "flag table row %zu (%s): %s", i,
                    spec->flags[i].name ? spec->flags[i].name : "?", problem);
  }
  return 0;
}

/* Stores v in an integer of `size` bytes. The value is in the row's range,
 * which fits the target, so the conversion keeps it whether the target is
 * signed or not (two's complement). */
static void store_int(void *t, size_t size, long v)
{
  uint8_t u8 = (uint8_t)v;
  uint16_t u16 = (uint16_t)v;
  uint32_t u32 = (uint32_t)v;
  uint64_t u64 = (uint64_t)v;

  switch (size) {
  case 1:
    memcpy(t, &u8, 1);
    break;
  case 2:
    memcpy(t, &u16, 2);
    break;
  case 4:
    memcpy(t, &u32, 4);
    break;
  default:
    memcpy(t, &u64, 8);
    break;
  }
}

/* The row's accepted form, for messages: "an integer from 1 to 1024". */
void gs__flags_expect(const gs_flag_t *f, char *buf, size_t len)
{
  char lo[32], hi[32];

  if (f->expect) {
    snprintf(buf, len, "%s", f->expect);
    return;
  }
  switch (f->kind) {
  case GS_FLAG_STR:
  case GS_FLAG_STRBUF:
    if (f->names)
      gs__flags_names(f->names, " or ", buf, len);
    else if (f->min > 0 && gs__flags_max_len(f) == LONG_MAX)
      snprintf(buf, len, "at least %ld byte%s", f->min, f->min == 1 ? "" : "s");
    else if (f->min > 0)
      snprintf(buf, len, "%ld to %ld bytes", f->min, gs__flags_max_len(f));
    else
      snprintf(buf, len, "at most %ld bytes", gs__flags_max_len(f));
    break;
  case GS_FLAG_INT:
    snprintf(buf, len, "an integer from %ld to %ld", f->min, f->max);
    break;
  case GS_FLAG_DOUBLE:
    if (f->dmin == 0 && f->dmax == 0)
      snprintf(buf, len, "a number");
    else
      snprintf(buf, len, "a number from %g to %g", f->dmin, f->dmax);
    break;
  case GS_FLAG_SIZE:
  case GS_FLAG_DURATION: {
    bool size = f->kind == GS_FLAG_SIZE;
    const char *what = size ? "size" : "duration";
    const char *eg = size ? "such as 64KiB or 10MiB" : "such as 500ms, 10s or 2m";

    gs__flags_show_u64(f->kind, f->umin, lo, sizeof(lo));
    gs__flags_show_u64(f->kind, f->umax, hi, sizeof(hi));
    if (f->umax)
      snprintf(buf, len, "a %s from %s to %s", what, lo, hi);
    else if (f->umin > 1)
      snprintf(buf, len, "a %s of at least %s", what, lo);
    else
      snprintf(buf, len, "a %s%s %s", f->umin ? "positive " : "", what, eg);
    break;
  }
  case GS_FLAG_ENUM:
    gs__flags_names(f->names, " or ", buf, len);
    break;
  case GS_FLAG_ADDR:
    if (f->min > 0)
      snprintf(buf, len, "HOST:PORT or :PORT with a port from %ld to 65535", f->min);
    else
      snprintf(buf, len, "HOST:PORT or :PORT");
    break;
  default:
    snprintf(buf, len, "a valid value");
    break;
  }
}

/* Parses a finite number into a float or double target. */
static int apply_double(const gs_flag_t *f, const char *v, void *t)
{
  char *end;
  double d = strtod(v, &end);
  float fl = (float)d;

  if (end == v || *end || !isfinite(d))
    return GS_EINVAL;
  if ((f->dmin != 0 || f->dmax != 0) && (d < f->dmin || d > f->dmax))
    return GS_ERANGE;
  if (f->size == sizeof(float)) {
    if (!isfinite(fl))
      return GS_ERANGE;
    memcpy(t, &fl, sizeof(fl));
  } else {
    memcpy(t, &d, sizeof(d));
  }
  return 0;
}

/* Index of v in names (any case), or -1. */
static long find_name(const char *const *names, const char *v)
{
  for (long i = 0; names[i]; i++)
    if (strcasecmp(names[i], v) == 0)
      return i;
  return -1;
}

static int apply_string(const gs_flag_t *f, char *v, void *t)
{
  size_t n = strlen(v);
  long k;

  if (f->names) {
    k = find_name(f->names, v);
    if (k < 0)
      return GS_EINVAL;
    v = (char *)f->names[k]; /* stored, never written through */
    n = strlen(v);
  }
  if ((f->min > 0 && n < (size_t)f->min) || n > (size_t)gs__flags_max_len(f))
    return GS_ERANGE;
  if (f->kind == GS_FLAG_STR)
    memcpy(t, &v, sizeof(v)); /* char * and const char * share a representation */
  else
    memcpy(t, v, n + 1);
  return 0;
}

static int apply_u64(const gs_flag_t *f, const char *v, void *t)
{
  uint64_t u;
  int err = f->kind == GS_FLAG_SIZE ? gs_parse_size(v, &u) : gs_parse_duration_ms(v, &u);

  if (err)
    return err;
  if (u < f->umin || (f->umax && u > f->umax))
    return GS_ERANGE;
  memcpy(t, &u, sizeof(u));
  return 0;
}

static int apply_addr(const gs_flag_t *f, const char *v, char *base)
{
  char host[256];
  uint16_t port;

  bool is_unix = f->unix_ok && !strncmp(v, GS_UNIX_PREFIX, strlen(GS_UNIX_PREFIX));

  if ((f->unix_ok ? gs_parse_endpoint(v, host, sizeof(host), &port)
                  : gs_parse_addr(v, host, sizeof(host), &port)) ||
      (port < f->min && !is_unix) || strlen(host) >= f->size)
    return GS_EINVAL;
  memcpy(base + f->off, host, strlen(host) + 1);
  memcpy(base + f->off2, &port, sizeof(port));
  return 0;
}

/* Converts v and stores it; 0 or an error with `expect` filled in by a
 * custom parser. */
static int apply_value(const gs_flag_t *f, char *v, char *base, char *expect, size_t expect_len)
{
  void *t = base + f->off;
  long n;

  switch (f->kind) {
  case GS_FLAG_STR:
  case GS_FLAG_STRBUF:
    return apply_string(f, v, t);
  case GS_FLAG_INT:
    if (gs_parse_long(v, f->min, f->max, &n))
      return GS_EINVAL;
    store_int(t, f->size, n);
    return 0;
  case GS_FLAG_DOUBLE:
    return apply_double(f, v, t);
  case GS_FLAG_SIZE:
  case GS_FLAG_DURATION:
    return apply_u64(f, v, t);
  case GS_FLAG_ENUM:
    n = find_name(f->names, v);
    if (n < 0)
      return GS_EINVAL;
    store_int(t, f->size, n);
    return 0;
  case GS_FLAG_ADDR:
    return apply_addr(f, v, base);
  case GS_FLAG_CUSTOM:
    return f->parse(v, t, expect, expect_len);
  case GS_FLAG_BOOL:
  case GS_FLAG_SECTION:
    break;
  }
  return GS_EINVAL;
}

/* Applies one flag's value (v is NULL for a bool), from argv or, when
 * `env` is set, from that variable. */
static int apply(const gs_flag_t *f, char *v, const char *env, char *base, char *why,
                 size_t why_len)
{
  char expect[160] = "", from[80] = "";

  if (f->given_off)
    base[f->given_off - 1] = true;
  if (f->kind == GS_FLAG_BOOL) {
    base[f->off] = !f->negate;
    return 0;
  }
  if (apply_value(f, v, base, expect, sizeof(expect)) == 0)
    return 0;
  if (!expect[0])
    gs__flags_expect(f, expect, sizeof(expect));
  if (env)
    snprintf(from, sizeof(from), " (from $%s)", env);
  return gs_why(GS_EINVAL, why, why_len, "invalid value '%s' for %s%s: expected %s",
                f->secret ? "(hidden)" : v, f->name, from, expect);
}

/* Whether `name` is the first n bytes of argument a. */
static bool names(const char *name, const char *a, size_t n)
{
  return name && strlen(name) == n && strncmp(name, a, n) == 0;
}

/* The row named by argument `a` ("--name" or "--name=value", or its alias),
 * or NULL. */
static const gs_flag_t *find_flag(const gs_flags_t *spec, const char *a)
{
  size_t n = strcspn(a, "=");

  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];

    if (f->kind != GS_FLAG_SECTION && (names(f->name, a, n) || names(f->alias, a, n)))
      return f;
  }
  return NULL;
}

const char *gs_flags_source(const gs_flags_t *spec, const char *const *sources, const char *name)
{
  const gs_flag_t *f = find_flag(spec, name);

  return f ? sources[f - spec->flags] : NULL;
}

/* Whether argument a ends the parse, and how. */
static bool is_action(const char *a, gs_flags_action_t *action)
{
  if (!strcmp(a, "-h") || !strcmp(a, "--help"))
    *action = GS_FLAGS_HELP;
  else if (!strcmp(a, "--help-markdown"))
    *action = GS_FLAGS_MARKDOWN;
  else if (!strcmp(a, "--version"))
    *action = GS_FLAGS_VERSION;
  else
    return false;
  return true;
}

/* An argument that is no flag of the table: passed on, or an error. */
static int other_arg(const gs_flags_opts_t *opts, char *a, bool dashes, bool apply_pass, char *why,
                     size_t why_len)
{
  if (opts && opts->pass) {
    if (apply_pass)
      opts->pass[(*opts->npass)++] = a;
    return 0;
  }
  if (!dashes && a[0] == '-' && a[1])
    return gs_why(GS_EINVAL, why, why_len, "unknown flag '%.*s' (see --help)", (int)strcspn(a, "="),
                  a);
  return gs_why(GS_EINVAL, why, why_len, "unexpected argument '%s' (see --help)", a);
}

static int missing_value(const gs_flag_t *f, char *why, size_t why_len)
{
  char meta[128];

  gs__flags_metavar(f, meta, sizeof(meta));
  return gs_why(GS_EINVAL, why, why_len, "%s needs a value: %s %s", f->name, f->name, meta);
}

/* One walk over argv. The first (apply false) finds -h/--version and the
 * errors of shape (unknown flags, missing values) before any value is
 * stored; the second (apply true) stores values and collects what is
 * passed on. */
static int walk(const gs_flags_t *spec, char *base, int argc, char **argv,
                const gs_flags_opts_t *opts, bool do_apply, bool *given, gs_flags_action_t *action,
                char *why, size_t why_len)
{
  bool dashes = false;
  int err;

  for (int i = 1; i < argc; i++) {
    char *a = argv[i], *eq, *v = NULL;
    const gs_flag_t *f;

    if (!dashes && !strcmp(a, "--")) {
      dashes = true;
      if (do_apply && opts && opts->pass && opts->pass_dashes)
        *opts->pass_dashes = *opts->npass;
      continue;
    }
    if (!dashes && is_action(a, action))
      return 0;
    f = dashes || strncmp(a, "--", 2) != 0 ? NULL : find_flag(spec, a);
    if (!f) {
      err = other_arg(opts, a, dashes, do_apply, why, why_len);
      if (err)
        return err;
      continue;
    }
    eq = strchr(a, '=');
    if (f->kind == GS_FLAG_BOOL && eq)
      return gs_why(GS_EINVAL, why, why_len, "%s takes no value", f->name);
    if (f->kind == GS_FLAG_ENUM && f->bare && !eq)
      v = (char *)f->bare; /* only read */
    else if (f->kind != GS_FLAG_BOOL) {
      if (eq)
        v = eq + 1;
      else if (i + 1 < argc)
        v = argv[++i];
      else
        return missing_value(f, why, why_len);
    }
    if (!do_apply)
      continue;
    given[f - spec->flags] = true;
    if (opts && opts->sources)
      opts->sources[f - spec->flags] = "flag";
    err = apply(f, v, NULL, base, why, why_len);
    if (err)
      return err;
  }
  return 0;
}

/* Row i's value from the first of its sources that is set, if any. */
static int from_env(const gs_flags_t *spec, size_t i, char *base, const gs_flags_opts_t *opts,
                    bool *given, char *why, size_t why_len)
{
  const gs_flag_t *f = &spec->flags[i];
  const char *one[2], *const *names = gs__flags_sources(f, one);

  for (size_t k = 0; names[k]; k++) {
    const char *v = gs__flags_env(opts, names[k]);

    if (!v)
      continue;
    given[i] = true;
    if (opts->sources)
      opts->sources[i] = names[k];
    /* Stored (STR rows borrow it), never written through. */
    return apply(f, (char *)v, names[k], base, why, why_len);
  }
  return 0;
}

/* Values from the environment for the flags argv did not give, then the
 * check that every required flag is there. */
static int finish(const gs_flags_t *spec, char *base, const gs_flags_opts_t *opts, bool *given,
                  char *why, size_t why_len)
{
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];
    int err;

    if (f->kind == GS_FLAG_SECTION || given[i] || (!f->env && !f->envs) || !opts)
      continue;
    err = from_env(spec, i, base, opts, given, why, why_len);
    if (err)
      return err;
  }
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];
    char meta[128];

    if (f->kind == GS_FLAG_SECTION || !f->required || given[i])
      continue;
    gs__flags_metavar(f, meta, sizeof(meta));
    return gs_why(GS_EINVAL, why, why_len, "%s %s is required (see --help)", f->name, meta);
  }
  return 0;
}

int gs_flags_parse(const gs_flags_t *spec, void *base, int argc, char **argv,
                   const gs_flags_opts_t *opts, gs_flags_action_t *action, char *why,
                   size_t why_len)
{
  bool given[GS_FLAGS_MAX] = {false};
  int err;

  *action = GS_FLAGS_RUN;
  if (why && why_len)
    why[0] = '\0';
  err = gs_flags_check_table(spec, why, why_len);
  if (err)
    return err;
  if (opts && opts->pass)
    *opts->npass = 0;
  if (opts && opts->pass && opts->pass_dashes)
    *opts->pass_dashes = -1;
  if (opts && opts->sources)
    for (size_t i = 0; i < spec->count; i++)
      opts->sources[i] = NULL;
  err = walk(spec, base, argc, argv, opts, false, given, action, why, why_len);
  if (err || *action != GS_FLAGS_RUN)
    return err;
  err = walk(spec, base, argc, argv, opts, true, given, action, why, why_len);
  if (err)
    return err;
  if (opts && opts->pass && opts->pass_dashes && *opts->pass_dashes < 0)
    *opts->pass_dashes = *opts->npass;
  return finish(spec, base, opts, given, why, why_len);
}
