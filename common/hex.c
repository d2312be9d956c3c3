/* Bytes as hex and back (see hex.h). */
#include "hex.h"

#include <string.h>

static int digit_value(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

void gs_hex_encode(const void *bytes, size_t len, char *out)
{
  static const char digits[] = "0123456789abcdef";
  const unsigned char *b = bytes;

  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 0xf];
  }
  out[2 * len] = '\0';
}

bool gs_hex_decode(const char *hex, void *out, size_t cap, size_t *len)
{
  size_t chars = strlen(hex), n = chars / 2;
  unsigned char *b = out;

  if (chars % 2 || n == 0 || n > cap)
    return false;
  for (size_t i = 0; i < n; i++) {
    int hi = digit_value(hex[2 * i]), lo = digit_value(hex[2 * i + 1]);

    if (hi < 0 || lo < 0)
      return false;
    b[i] = (unsigned char)(hi << 4 | lo);
  }
  *len = n;
  return true;
}
