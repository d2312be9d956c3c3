/* The shared-secret check for RPCs and the control endpoint. */
#include "auth.h"

#include <string.h>

bool gs__token_ok(const char *want, const char *given)
{
  size_t want_len = strlen(want), given_len = given ? strlen(given) : 0;
  unsigned char diff = 0;

  if (want_len == 0)
    return true;
  /* Compare every byte of the expected token whatever `given` holds, so the
   * time taken does not tell how much of it was right. */
  for (size_t i = 0; i < want_len; i++)
    diff |= (unsigned char)want[i] ^ (unsigned char)(i < given_len ? given[i] : 0);
  return diff == 0 && given_len == want_len;
}
