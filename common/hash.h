/* FNV-1a (32-bit) over a NUL-terminated string: the hash of the
 * coordinator's tables keyed by short names (jobs, blob keys, addresses).
 * Header-only: it sits in their lookups. */
#ifndef GS_HASH_H
#define GS_HASH_H

#include <stdint.h>

#define GS_FNV1A_SEED 2166136261u

/* Continues the hash `h` (GS_FNV1A_SEED to start) over `s`. */
static inline uint32_t gs_fnv1a_str(uint32_t h, const char *s)
{
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h;
}

#endif
