/* What one row of a flag table says in words, and where its value may
 * come from: the leaf that parsing (flags.c), --help and the flag
 * reference (flags_help.c) both use (flags_internal.h). */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>

#include "flags_internal.h"

typedef struct unit {
  uint64_t scale;
  const char *name;
} unit_t;

static const unit_t size_units[] = {
    {1ULL << 30, "GiB"}, {1ULL << 20, "MiB"}, {1ULL << 10, "KiB"}, {1, "B"}};
static const unit_t duration_units[] = {{3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}};

/* Joins names with ", " and `sep_last` before the last one. */
void gs__flags_names(const char *const *names, const char *sep_last, char *buf, size_t len)
{
  size_t used = 0;

  buf[0] = '\0';
  for (size_t i = 0; names[i] && used < len; i++) {
    const char *sep = i == 0 ? "" : names[i + 1] ? ", " : sep_last;
    int n = snprintf(buf + used, len - used, "%s%s", sep, names[i]);

    if (n < 0)
      return;
    used += (size_t)n;
  }
}

void gs__flags_metavar(const gs_flag_t *f, char *buf, size_t len)
{
  size_t used = 0;

  if (f->metavar || !f->names) {
    snprintf(buf, len, "%s", f->metavar ? f->metavar : "VALUE");
    return;
  }
  buf[0] = '\0';
  for (size_t i = 0; f->names[i] && used < len; i++) {
    int n = snprintf(buf + used, len - used, "%s%s", i ? "|" : "", f->names[i]);

    if (n < 0)
      return;
    used += (size_t)n;
  }
}

long gs__flags_max_len(const gs_flag_t *f)
{
  long cap = f->kind == GS_FLAG_STRBUF ? (long)f->size - 1 : LONG_MAX;

  return f->max > 0 && f->max < cap ? f->max : cap;
}

void gs__flags_show_u64(gs_flag_kind_t kind, uint64_t v, char *buf, size_t len)
{
  const unit_t *u = kind == GS_FLAG_SIZE ? size_units : duration_units;

  if (v == 0) {
    snprintf(buf, len, "0%s", kind == GS_FLAG_SIZE ? "B" : "s");
    return;
  }
  for (size_t i = 0;; i++) {
    if (v % u[i].scale == 0) {
      snprintf(buf, len, "%" PRIu64 "%s", v / u[i].scale, u[i].name);
      return;
    }
  }
}

/* The value of source `name`: through the lookup, else getenv; NULL when
 * unset or empty. */
const char *gs__flags_env(const gs_flags_opts_t *opts, const char *name)
{
  const char *v = NULL;

  if (opts && opts->lookup)
    v = opts->lookup(opts->ctx, name);
  else if (opts && opts->getenv)
    v = opts->getenv(name);
  return v && *v ? v : NULL;
}

/* The row's sources: its .envs list, or its one .env as a list of one
 * (into `one`, which must hold two entries). */
const char *const *gs__flags_sources(const gs_flag_t *f, const char **one)
{
  if (f->envs)
    return f->envs;
  one[0] = f->env;
  one[1] = NULL;
  return one;
}
