/* 16-bit floats on the CPU: bfloat16 and IEEE half (float16), to and from
 * float32, rounding to nearest even (what torch and CUDA do), by bit
 * manipulation so that any C compiler builds them (clang 14 has no
 * _Float16 on x86). NaN stays NaN (quiet), an overflow becomes an
 * infinity, float16's subnormals are kept. Header-only: the loops that
 * call them (the host ring's reduction, the CPU device's conversions)
 * inline and vectorize them. */
#ifndef GS_HALF_H
#define GS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t gs__f32_bits(float f)
{
  uint32_t x;

  memcpy(&x, &f, sizeof(x));
  return x;
}

static inline float gs__bits_f32(uint32_t x)
{
  float f;

  memcpy(&f, &x, sizeof(f));
  return f;
}

/* All ones when `c`, else zero: the selections below are masks, not
 * branches, so that the conversion loops vectorize (GCC will not turn a
 * branch around floating-point work into a select). */
static inline uint32_t gs__mask(int c)
{
  return 0u - (uint32_t)(c != 0);
}

static inline uint32_t gs__pick(int c, uint32_t a, uint32_t b)
{
  return (a & gs__mask(c)) | (b & ~gs__mask(c));
}

static inline float gs_bf16_to_f32(uint16_t h)
{
  return gs__bits_f32((uint32_t)h << 16);
}

static inline uint16_t gs_f32_to_bf16(float f)
{
  uint32_t x = gs__f32_bits(f);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, nan = (x >> 16) | 0x40u;

  /* A NaN stays a quiet NaN: rounding could make it an infinity. */
  return (uint16_t)gs__pick((x & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

static inline float gs_f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t normal = ((e + 112u) << 23) | (m << 13), special = 0x7f800000u | (m << 13);
  uint32_t subnormal = gs__f32_bits((float)m * 0x1p-24f); /* or zero */

  return gs__bits_f32(sign | gs__pick(e == 0x1f, special, gs__pick(e != 0, normal, subnormal)));
}

static inline uint16_t gs_f32_to_f16(float f)
{
  uint32_t x = gs__f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  /* Rebias the exponent (127 -> 15) and round the 13 dropped bits. */
  uint32_t normal = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
  /* Below float16's smallest normal: adding 0.5 leaves the value's
   * multiple of 2^-24 (float16's subnormal step) in the low mantissa
   * bits, rounded to nearest even by the FPU. */
  uint32_t subnormal = gs__f32_bits(gs__bits_f32(ax) + 0.5f) - 0x3f000000u;
  uint32_t special = 0x7c00u | (gs__mask(ax > 0x7f800000u) & 0x200u); /* infinity, quiet NaN */
  uint32_t r = gs__pick(ax < 0x38800000u, subnormal, normal);

  r = gs__pick(ax >= 0x477ff000u, 0x7c00u, r); /* 65520 and above round to infinity */
  r = gs__pick(ax >= 0x7f800000u, special, r);
  return (uint16_t)(sign | r);
}

#endif
