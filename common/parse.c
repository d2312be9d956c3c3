/* Parsers for command-line values. Each is a pure function of a
 * NUL-terminated string: it looks at no byte past the NUL, accepts no
 * whitespace, sign or trailing junk, and writes its result only on success. */
#include "parse.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <strings.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>

struct unit {
  const char *suffix;
  uint64_t scale;
};

/* Size suffixes: kB/MB/GB are decimal, KiB/MiB/GiB binary (IEC). "KB" is
 * accepted as the common spelling of "kB". */
static const struct unit size_units[] = {
    {"", 1},
    {"B", 1},
    {"kB", 1000ULL},
    {"KB", 1000ULL},
    {"MB", 1000ULL * 1000},
    {"GB", 1000ULL * 1000 * 1000},
    {"KiB", 1ULL << 10},
    {"MiB", 1ULL << 20},
    {"GiB", 1ULL << 30},
};

/* Duration units, scaled to milliseconds. */
static const struct unit duration_units[] = {
    {"ms", 1},
    {"s", 1000ULL},
    {"m", 60ULL * 1000},
    {"h", 60ULL * 60 * 1000},
};

static bool is_digit(char c)
{
  return c >= '0' && c <= '9';
}

/* Reads the run of decimal digits at *sp into *val and advances *sp past
 * it. GS_EINVAL when there is no digit, GS_ERANGE when the run does not
 * fit in 64 bits (the whole run is still consumed, so junk is not hidden
 * behind an overflow). */
static int read_digits(const char **sp, uint64_t *val)
{
  const char *s = *sp;
  uint64_t v = 0;
  bool overflow = false;

  if (!is_digit(*s))
    return GS_EINVAL;
  for (; is_digit(*s); s++) {
    unsigned d = (unsigned)(*s - '0');

    if (v > (UINT64_MAX - d) / 10)
      overflow = true;
    else
      v = v * 10 + d;
  }
  *sp = s;
  *val = v;
  return overflow ? GS_ERANGE : 0;
}

/* Finds the unit whose suffix is exactly `s`, or NULL. */
static const struct unit *find_unit(const struct unit *units, size_t count, const char *s)
{
  size_t i;

  for (i = 0; i < count; i++) {
    if (strcmp(units[i].suffix, s) == 0)
      return &units[i];
  }
  return NULL;
}

int gs_parse_size(const char *s, uint64_t *bytes)
{
  const struct unit *unit;
  uint64_t n;
  int err;

  if (!s)
    return GS_EINVAL;
  err = read_digits(&s, &n);
  unit = find_unit(size_units, sizeof(size_units) / sizeof(size_units[0]), s);
  /* Junk outranks overflow: "99999999999999999999x" is not a number. */
  if (!unit)
    return GS_EINVAL;
  if (err)
    return err;
  if (n > UINT64_MAX / unit->scale)
    return GS_ERANGE;
  *bytes = n * unit->scale;
  return 0;
}

/* Reads the digits after a decimal point as frac / 10^digits, ignoring
 * trailing zeros. More than 9 significant digits cannot be a whole number
 * of milliseconds for any unit we know, so they are GS_EINVAL. */
static int read_fraction(const char **sp, uint64_t *frac, uint64_t *denom)
{
  const char *s = *sp, *end = s;
  uint64_t f = 0, d = 1;

  while (is_digit(*end))
    end++;
  if (end == s)
    return GS_EINVAL;
  *sp = end;
  while (end > s && end[-1] == '0')
    end--;
  if (end - s > 9)
    return GS_EINVAL;
  for (; s < end; s++) {
    f = f * 10 + (uint64_t)(*s - '0');
    d *= 10;
  }
  *frac = f;
  *denom = d;
  return 0;
}

/* A fraction that is not a whole number of milliseconds ("1.5ms",
 * "0.0001s") is GS_EINVAL rather than silently rounded. */
int gs_parse_duration_ms(const char *s, uint64_t *ms)
{
  const struct unit *unit;
  uint64_t whole, frac = 0, denom = 1, total;
  int range_err, err;

  if (!s)
    return GS_EINVAL;
  range_err = read_digits(&s, &whole);
  if (range_err == GS_EINVAL)
    return GS_EINVAL;
  if (*s == '.') {
    s++;
    err = read_fraction(&s, &frac, &denom);
    if (err)
      return err;
  }
  unit = find_unit(duration_units, sizeof(duration_units) / sizeof(duration_units[0]), s);
  if (!unit)
    return GS_EINVAL;
  if (range_err)
    return range_err;
  /* frac < 10^9 and scale <= 3.6e6, so the product fits in 64 bits. */
  if ((frac * unit->scale) % denom != 0)
    return GS_EINVAL;
  if (whole > UINT64_MAX / unit->scale)
    return GS_ERANGE;
  total = whole * unit->scale;
  if (total > UINT64_MAX - frac * unit->scale / denom)
    return GS_ERANGE;
  *ms = total + frac * unit->scale / denom;
  return 0;
}

/* Parses the port after the colon: 0..65535, digits only. */
static int parse_port(const char *s, uint16_t *port)
{
  uint64_t v;
  int err = read_digits(&s, &v);

  if (err == GS_EINVAL || *s != '\0')
    return GS_EINVAL;
  if (err || v > 65535)
    return GS_ERANGE;
  *port = (uint16_t)v;
  return 0;
}

/* Splits `s` into the host (start and length, not NUL-terminated) and the
 * text after the separating colon. A bracketed host is an IPv6 literal; an
 * unbracketed one may hold no colon or bracket, so "::1:80" is refused
 * rather than guessed at. */
static int split_addr(const char *s, const char **host, size_t *host_n, const char **port)
{
  const char *end;

  if (s[0] == '[') {
    end = strchr(s, ']');
    if (!end || end == s + 1 || end[1] != ':')
      return GS_EINVAL;
    *host = s + 1;
    *host_n = (size_t)(end - s - 1);
    *port = end + 2;
    return 0;
  }
  end = strchr(s, ':');
  if (!end)
    return GS_EINVAL;
  *host = s;
  *host_n = (size_t)(end - s);
  if (memchr(s, '[', *host_n) || memchr(s, ']', *host_n))
    return GS_EINVAL;
  *port = end + 1;
  return 0;
}

int gs_parse_addr(const char *s, char *host, size_t host_len, uint16_t *port)
{
  const char *h, *p;
  size_t hn;
  uint16_t pv;
  int err;

  if (!s || !host)
    return GS_EINVAL;
  err = split_addr(s, &h, &hn, &p);
  if (err)
    return err;
  err = parse_port(p, &pv);
  if (err)
    return err;
  if (hn == 0) {
    h = "0.0.0.0";
    hn = strlen(h);
  }
  if (hn >= host_len)
    return GS_EINVAL;
  memcpy(host, h, hn);
  host[hn] = '\0';
  *port = pv;
  return 0;
}

int gs_parse_endpoint(const char *s, char *host, size_t host_len, uint16_t *port)
{
  size_t n = s ? strlen(s) : 0, pre = strlen(GS_UNIX_PREFIX);

  if (!s || strncmp(s, GS_UNIX_PREFIX, pre))
    return gs_parse_addr(s, host, host_len, port);
  /* sun_path holds 108 bytes with its NUL. */
  if (s[pre] != '/' || n >= host_len || n - pre >= 108)
    return GS_EINVAL;
  memcpy(host, s, n + 1);
  *port = 0;
  return 0;
}

/* Applies the sign to a magnitude already known to fit in 64 bits;
 * GS_ERANGE when the result is not a long. LONG_MIN's magnitude is one
 * more than LONG_MAX's. */
static int signed_long(bool neg, uint64_t mag, long *v)
{
  if (!neg) {
    if (mag > (uint64_t)LONG_MAX)
      return GS_ERANGE;
    *v = (long)mag;
    return 0;
  }
  if (mag > (uint64_t)LONG_MAX + 1)
    return GS_ERANGE;
  *v = mag == (uint64_t)LONG_MAX + 1 ? LONG_MIN : -(long)mag;
  return 0;
}

int gs_name_index(const char *s, const char *const *names, size_t n)
{
  for (size_t i = 0; s && i < n; i++)
    if (names[i] && strcmp(s, names[i]) == 0)
      return (int)i;
  return -1;
}

const char *gs_name_of(size_t v, const char *const *names, size_t n)
{
  return v < n && names[v] ? names[v] : "unknown";
}

/* Parsed by hand rather than with strtol, which would accept leading
 * whitespace and a '+'. A value outside [min, max] is GS_ERANGE. */
int gs_parse_long(const char *s, long min, long max, long *out)
{
  uint64_t mag;
  long v;
  bool neg;
  int err;

  if (!s)
    return GS_EINVAL;
  neg = *s == '-';
  if (neg)
    s++;
  err = read_digits(&s, &mag);
  if (err == GS_EINVAL || *s != '\0')
    return GS_EINVAL;
  if (err || signed_long(neg, mag, &v) || v < min || v > max)
    return GS_ERANGE;
  *out = v;
  return 0;
}

int gs_parse_port_range(const char *s, uint16_t *first, uint16_t *last)
{
  const char *dash = s ? strchr(s, '-') : NULL;
  char head[8];
  long a, b;
  int err;

  if (!s)
    return GS_EINVAL;
  if (!dash) {
    err = gs_parse_long(s, 1, 65535, &a);
    b = a;
  } else {
    if ((size_t)(dash - s) >= sizeof(head))
      return GS_EINVAL;
    memcpy(head, s, (size_t)(dash - s));
    head[dash - s] = '\0';
    err = gs_parse_long(head, 1, 65535, &a);
    if (!err)
      err = gs_parse_long(dash + 1, 1, 65535, &b);
  }
  if (err)
    return err;
  if (a > b)
    return GS_ERANGE;
  *first = (uint16_t)a;
  *last = (uint16_t)b;
  return 0;
}

int gs_parse_world_range(const char *s, uint32_t limit, uint32_t *min, uint32_t *max)
{
  const char *colon = s ? strchr(s, ':') : NULL;
  char head[16];
  long a = 0, b;
  int err;

  if (!s)
    return GS_EINVAL;
  if (colon) {
    if ((size_t)(colon - s) >= sizeof(head))
      return GS_EINVAL;
    memcpy(head, s, (size_t)(colon - s));
    head[colon - s] = '\0';
    err = gs_parse_long(head, 1, limit, &a);
    if (err)
      return err;
  }
  err = gs_parse_long(colon ? colon + 1 : s, 1, limit, &b);
  if (err)
    return err;
  if (a > b)
    return GS_ERANGE;
  *min = (uint32_t)a;
  *max = (uint32_t)b;
  return 0;
}

bool gs_addr_is_loopback(const char *addr)
{
  char host[64];
  const char *end, *colon = strrchr(addr, ':');
  unsigned char v4[4];
  struct in6_addr v6;
  size_t n;

  if (addr[0] == '[') { /* "[v6]" or "[v6]:port" */
    end = strchr(addr, ']');
    if (!end)
      return false;
    addr++;
  } else {
    /* one colon: "host:port"; none, or several (a bare v6 address): all host */
    end = colon && strchr(addr, ':') == colon ? colon : addr + strlen(addr);
  }
  n = (size_t)(end - addr);
  if (n == 0 || n >= sizeof(host))
    return false;
  memcpy(host, addr, n);
  host[n] = '\0';
  if (inet_pton(AF_INET, host, v4) == 1)
    return v4[0] == 127;
  if (inet_pton(AF_INET6, host, &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  return !strcasecmp(host, "localhost");
}
