/* FNV-1a: 32-bit over a NUL-terminated string (the hash of the
 * coordinator's tables keyed by short names: jobs, blob keys, addresses),
 * 64-bit over bytes (a layout's signature, the state the ranks compare,
 * which tests recompute from a checkpoint). Header-only: it sits in
 * their lookups. */
#ifndef GS_HASH_H
#define GS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define GS_FNV1A_SEED 2166136261u

/* Continues the hash `h` (GS_FNV1A_SEED to start) over `s`. */
static inline uint32_t gs_fnv1a_str(uint32_t h, const char *s)
{
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h;
}

#define GS_FNV1A64_SEED 0xcbf29ce484222325ull

/* Continues the 64-bit hash `h` (GS_FNV1A64_SEED to start) over `len` bytes. */
static inline uint64_t gs_fnv1a64(uint64_t h, const void *data, size_t len)
{
  const unsigned char *b = data;

  for (size_t i = 0; i < len; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

#endif
