/* Table-driven command-line flags. Each binary describes its flags once, as
 * a static table of gs_flag_t rows (name, kind, where the value goes, its
 * range, the default shown, its environment fallbacks, help and flag
 * reference text); the parser, --help and the flag reference's tables
 * (docs/guide/flags.md) are all generated from that table, so they cannot
 * drift apart.
 *
 * Targets are offsets into a struct the caller passes (`base`), so a table
 * is a `static const` array and help can show the defaults the code really
 * uses: whatever `base` holds before parsing. Parsing is a pure function of
 * argv, the table and the environment lookup it is given: it prints
 * nothing, and on a usage error writes one line naming the flag and the
 * accepted form into `why`. */
#ifndef GS_FLAGS_H
#define GS_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

typedef enum gs_flag_kind {
  GS_FLAG_SECTION,  /* no flag: a heading in --help ("Job:"); `help` is its text */
  GS_FLAG_BOOL,     /* takes no value: sets a bool to true (false with .negate) */
  GS_FLAG_STR,      /* borrows the argument (or env) string: a char * or const char * */
  GS_FLAG_STRBUF,   /* copies into a char array of .size bytes; .names restricts it (any
                       case; the name as listed is stored) */
  GS_FLAG_INT,      /* integer in [.min, .max] into an integer of 1, 2, 4 or 8 bytes */
  GS_FLAG_DOUBLE,   /* finite number in [.dmin, .dmax] (both 0: any) into float or double */
  GS_FLAG_SIZE,     /* gs_parse_size into a uint64_t or size_t, in [.umin, .umax] */
  GS_FLAG_DURATION, /* gs_parse_duration_ms into a uint64_t, in [.umin, .umax] */
  GS_FLAG_ENUM,     /* one of .names (any case), its index into an enum or int */
  GS_FLAG_ADDR,     /* gs_parse_addr: host into a char array, port (>= .min) at .off2 */
  GS_FLAG_CUSTOM,   /* .parse does it; .show or .def says the default */
} gs_flag_kind_t;

/* A GS_FLAG_CUSTOM parser: stores the value at `target` or returns a
 * negative GS_E* code with what it expected in `expect`. */
typedef int (*gs_flag_parse_fn)(const char *value, void *target, char *expect, size_t expect_len);
/* A GS_FLAG_CUSTOM formatter: the value at `target` as a default to show. */
typedef void (*gs_flag_show_fn)(const void *target, char *buf, size_t len);

typedef struct gs_flag {
  const char *name;  /* "--lr" */
  const char *alias; /* another name of the same flag ("--nproc-per-node"), or NULL */
  gs_flag_kind_t kind;
  size_t off;               /* target: offset in the caller's struct (GS_FLAG_AT) */
  size_t size;              /* sizeof the target */
  size_t off2;              /* GS_FLAG_ADDR: offset of the uint16_t port */
  long min, max;            /* GS_FLAG_INT range; STR/STRBUF length range; ADDR: lowest port */
  uint64_t umin, umax;      /* SIZE/DURATION range (umax 0: no limit) */
  double dmin, dmax;        /* DOUBLE range (both 0: any finite number) */
  const char *const *names; /* ENUM, STRBUF choices: NULL-terminated */
  /* ENUM: the value of the flag given alone ("--resume" is "--resume=on");
   * such a flag takes another value only as "--flag=VALUE". NULL: none. */
  const char *bare;
  gs_flag_parse_fn parse; /* GS_FLAG_CUSTOM */
  gs_flag_show_fn show;   /* GS_FLAG_CUSTOM: its default as text (NULL: .def or none) */
  bool negate;            /* GS_FLAG_BOOL: the flag sets false */
  bool required;          /* an error when neither given nor in .env */
  bool secret;            /* never echo the value (tokens) */
  bool unix_ok;           /* GS_FLAG_ADDR: "unix:/path" too (gs_parse_endpoint) */
  size_t given_off;       /* GS_FLAG_GIVEN: a bool set when the flag (or env) is given */
  const char *env;        /* environment variable used when the flag is absent */
  /* Or an ordered, NULL-terminated list of sources tried when the flag is
   * absent, the first one set winning; --help and the flag reference show it.
   * A name is a variable, or one the caller's lookup derives (see
   * gs_flags_opts_t.lookup). A row has .env or .envs, not both. */
  const char *const *envs;
  const char *metavar; /* "N", "HOST:PORT"; ENUM/choices default to "a|b|c" */
  const char *def;     /* default as shown (markdown); NULL: the target's value */
  const char *expect;  /* error text for a bad value; NULL: made from kind and range */
  const char *help;    /* --help text (backticks are dropped there) */
  const char *doc;     /* flag reference "meaning" column (markdown); NULL: help */
} gs_flag_t;

/* Designated-initializer helpers for table rows. */
#define GS_FLAG_AT(type, member) .off = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define GS_FLAG_PORT_AT(type, member) .off2 = offsetof(type, member)
/* given_off holds offset + 1, so that 0 means "no such bool". */
#define GS_FLAG_GIVEN(type, member) .given_off = offsetof(type, member) + 1
#define GS_FLAG_HEADING(text)                                                                      \
  {                                                                                                \
    .kind = GS_FLAG_SECTION, .help = (text)                                                        \
  }

/* A binary's flags and the text around them in --help. */
typedef struct gs_flags {
  const char *prog;   /* "gradsync-agent", for the caller's messages */
  const char *usage;  /* the help's first lines: synopsis and description */
  const char *epilog; /* text after the flag list, or NULL */
  const gs_flag_t *flags;
  size_t count;
} gs_flags_t;

/* What the command line asks for once it parsed. */
typedef enum gs_flags_action {
  GS_FLAGS_RUN,      /* every flag applied: go on */
  GS_FLAGS_HELP,     /* -h/--help: print gs_flags_help and exit 0 */
  GS_FLAGS_MARKDOWN, /* --help-markdown (hidden): print gs_flags_markdown and exit 0 */
  GS_FLAGS_VERSION,  /* --version: print the version and exit 0 */
} gs_flags_action_t;

typedef struct gs_flags_opts {
  /* Looks up .env variables (getenv); NULL: no environment fallback. */
  char *(*getenv)(const char *name);
  /* When set, looks up .env and .envs names instead of getenv, with `ctx`:
   * it may translate a scheduler's variable into the flag's form. What it
   * returns must live as long as the parsed values (STR rows borrow it);
   * NULL or "" is unset. */
  const char *(*lookup)(void *ctx, const char *name);
  void *ctx;
  /* Non-NULL: spec->count entries, each set to where its row's value came
   * from: "flag", the variable's name, or NULL (the default). */
  const char **sources;
  /* Non-NULL: arguments that are no flag of the table (unknown flags,
   * plain arguments, everything after "--") are appended here, in order,
   * instead of being errors. The array needs room for argc entries. */
  char **pass;
  int *npass;
  /* Non-NULL (with pass): set to how many entries of pass came before
   * "--" (*npass when there is none), so that the caller can tell what
   * was given before it from what follows it. */
  int *pass_dashes;
} gs_flags_opts_t;

/* Parses argv[1..argc) into the struct at `base`, which holds the defaults.
 * Flags take their value as "--flag VALUE" or "--flag=VALUE"; the last of a
 * repeated flag wins. -h/--help, --help-markdown and --version end the
 * parse before any value is applied (*action says which). Values of flags
 * absent from argv come from their .env variable, or the first of their
 * .envs sources, that is set and not empty (precedence: flag, then the
 * sources in order, then the default). Returns 0, or GS_EINVAL with one line in `why` (no program
 * name): an unknown flag, a missing or bad value, a missing required flag, or a table row that does
 * not fit its kind. STR targets borrow argv, environ or the lookup's strings. */
int gs_flags_parse(const gs_flags_t *spec, void *base, int argc, char **argv,
                   const gs_flags_opts_t *opts, gs_flags_action_t *action, char *why,
                   size_t why_len) GS_WARN_UNUSED;

/* Checks every row against its kind (sizes, ranges, names); 0 or GS_EINVAL
 * with the row in `why`. gs_flags_parse runs it first. */
int gs_flags_check_table(const gs_flags_t *spec, char *why, size_t why_len) GS_WARN_UNUSED;

/* Writes --help: usage, the flags with their defaults as `base` holds
 * them (wrapped to 80 columns), --version and --help, then the epilog. */
void gs_flags_help(const gs_flags_t *spec, const void *base, FILE *out);

/* Writes the flag reference table (markdown): | flag | default | meaning |,
 * one row per flag. */
void gs_flags_markdown(const gs_flags_t *spec, const void *base, FILE *out);

/* Answers what the command line asked for instead of running: --help,
 * --help-markdown, or --version ("PROG VERSION", VERSION given by the
 * caller), on stdout. True when it answered and the program should exit 0;
 * false for GS_FLAGS_RUN. */
bool gs_flags_answer(const gs_flags_t *spec, const void *base, gs_flags_action_t action,
                     const char *version);

/* A program's parse, whole: gs_flags_parse, a usage error printed to
 * stderr as "PROG: why", then gs_flags_answer. Returns 0 to run, -1 when
 * it answered (--help, --version: exit 0), 2 on a usage error. */
int gs_flags_main(const gs_flags_t *spec, void *base, int argc, char **argv,
                  const gs_flags_opts_t *opts, const char *version);

/* Where flag `name` got its value, from the `sources` gs_flags_parse
 * filled: "flag", a variable's name, or NULL (the default, or no such
 * flag). */
const char *gs_flags_source(const gs_flags_t *spec, const char *const *sources, const char *name);

/* Writes every flag's resolved value and where it came from (the
 * `sources` that gs_flags_parse filled through `opts`), one line each, for
 * --print-config; a row's sources that are set but lost to an earlier one
 * are named after it. Secret values are never written. */
void gs_flags_print_config(const gs_flags_t *spec, const void *base, const gs_flags_opts_t *opts,
                           FILE *out);

/* The default of `flag` as shown (its .def, or the target's value as
 * text: "10MiB", "5m", "0.05", ":7070", "none", "off"), into buf. */
void gs_flags_show_default(const gs_flag_t *flag, const void *base, char *buf, size_t len);

#endif
