/* See escape.h. */
#include "escape.h"

#include <stdio.h>

char *gs_escape(const char *in, char *out, size_t out_len)
{
  size_t at = 0;

  if (out_len == 0)
    return out;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    char esc[5];
    size_t n = 1;

    if (*p < 0x20 || *p == 0x7f)
      n = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *p);
    else if (*p == '\\')
      n = (size_t)snprintf(esc, sizeof(esc), "\\\\");
    else
      esc[0] = (char)*p;
    if (at + n >= out_len)
      break;
    for (size_t i = 0; i < n; i++)
      out[at++] = esc[i];
  }
  out[at] = '\0';
  return out;
}
