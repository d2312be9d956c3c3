/* Parsers for command-line values: sizes, durations, addresses, integers.
 * Pure functions of their input string; they return 0 or GS_EINVAL/GS_ERANGE
 * and write the result only on success. */
#ifndef GS_PARSE_H
#define GS_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* "4096", "64KiB", "10MiB", "1GiB", "10MB" (powers of 1000 for kB/MB/GB,
 * of 1024 for KiB/MiB/GiB, "B" or nothing for bytes). Whole numbers only;
 * GS_ERANGE when the value does not fit in 64 bits. */
int gs_parse_size(const char *s, uint64_t *bytes) GS_WARN_UNUSED;

/* "250ms", "5s", "2m", "1h", "1.5s" into milliseconds. A unit is required
 * (a bare "10" is GS_EINVAL: seconds or milliseconds would be a guess). */
int gs_parse_duration_ms(const char *s, uint64_t *ms) GS_WARN_UNUSED;

/* "host:port", ":port" (host becomes "0.0.0.0"), "[v6addr]:port".
 * Port 0..65535 (0 means any free port). `host` gets a NUL-terminated copy;
 * GS_EINVAL if it does not fit in host_len. */
int gs_parse_addr(const char *s, char *host, size_t host_len, uint16_t *port) GS_WARN_UNUSED;

/* A coordinator address that is a node agent's socket on this host:
 * "unix:/path" (gradsync-relay). */
#define GS_UNIX_PREFIX "unix:"
/* gs_parse_addr, or "unix:/absolute/path", which `host` gets whole (the
 * prefix kept, port 0): where an agent reaches its coordinator. */
int gs_parse_endpoint(const char *s, char *host, size_t host_len, uint16_t *port) GS_WARN_UNUSED;

/* The index of `s` in names[0 .. n) (an enum's names, in its order), or
 * -1 (also for NULL); and names[v], or "unknown" past the table. */
int gs_name_index(const char *s, const char *const *names, size_t n);
const char *gs_name_of(size_t v, const char *const *names, size_t n);

/* Defines `int PARSE(const char *s, TYPE *out)` (0, or GS_EINVAL for a
 * name not in the array NAMES) and `const char *NAME(TYPE v)` for an enum
 * whose values index NAMES. */
#define GS_DEFINE_ENUM_NAMES(PARSE, NAME, TYPE, NAMES)                                             \
  int PARSE(const char *s, TYPE *out)                                                              \
  {                                                                                                \
    int i = gs_name_index(s, NAMES, sizeof(NAMES) / sizeof((NAMES)[0]));                           \
                                                                                                   \
    if (i < 0)                                                                                     \
      return GS_EINVAL;                                                                            \
    *out = (TYPE)i;                                                                                \
    return 0;                                                                                      \
  }                                                                                                \
  const char *NAME(TYPE v)                                                                         \
  {                                                                                                \
    return gs_name_of((size_t)v, NAMES, sizeof(NAMES) / sizeof((NAMES)[0]));                       \
  }

/* A decimal integer in [min, max] with nothing after it. */
int gs_parse_long(const char *s, long min, long max, long *out) GS_WARN_UNUSED;

/* "PORT" or "FIRST-LAST" (1..65535, FIRST <= LAST) into *first, *last. */
int gs_parse_port_range(const char *s, uint16_t *first, uint16_t *last) GS_WARN_UNUSED;

/* A world size: "N" (a fixed world: *min = 0, *max = N) or "MIN:MAX"
 * (elastic: 1 <= MIN <= MAX), every number at most `limit`. */
int gs_parse_world_range(const char *s, uint32_t limit, uint32_t *min,
                         uint32_t *max) GS_WARN_UNUSED;

/* Whether the host of "host:port", "[v6]:port" or a bare host is a
 * loopback address (127.0.0.0/8, ::1, ::ffff:127.x, "localhost"): one a
 * peer on another machine cannot reach. */
bool gs_addr_is_loopback(const char *addr);

#endif
