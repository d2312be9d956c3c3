/* What flags.c (parsing) and flags_help.c (help, flag reference) share:
 * flags_row.c's words about one row, and flags.c's accepted form. */
#ifndef GS_FLAGS_INTERNAL_H
#define GS_FLAGS_INTERNAL_H

#include "flags.h"

/* "a, b or c" (sep_last " or ") from a NULL-terminated list. */
void gs__flags_names(const char *const *names, const char *sep_last, char *buf, size_t len);
/* The value's placeholder: .metavar, or "a|b|c" for a list of names. */
void gs__flags_metavar(const gs_flag_t *f, char *buf, size_t len);
/* The accepted form, for error messages. */
void gs__flags_expect(const gs_flag_t *f, char *buf, size_t len);
/* The longest string a STR or STRBUF row takes. */
long gs__flags_max_len(const gs_flag_t *f);
/* A size ("10MiB") or a duration ("5m") in its largest exact unit. */
void gs__flags_show_u64(gs_flag_kind_t kind, uint64_t v, char *buf, size_t len);
/* Source `name`'s value through opts (lookup, else getenv); NULL when
 * unset or empty. */
const char *gs__flags_env(const gs_flags_opts_t *opts, const char *name);
/* A row's sources in order: .envs, or .env as a list of one in `one[2]`. */
const char *const *gs__flags_sources(const gs_flag_t *f, const char **one);

#endif
