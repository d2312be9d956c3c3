/* Tokens: the shared secret and the job tokens derived from it (auth.h). */
#include "auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>

/* Prefixed to the job name before the HMAC: a job token is then no HMAC
 * another use of the same secret could produce. */
static const char job_label[] = "gradsync job token v1:";

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

int gs__job_token(const char *secret, const char *job, char out[GS_JOB_TOKEN_LEN + 1])
{
  unsigned char msg[sizeof(job_label) + 256], mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  size_t label = sizeof(job_label) - 1, n = strlen(job);

  if (!secret[0] || n > sizeof(msg) - label)
    return -1;
  memcpy(msg, job_label, label);
  memcpy(msg + label, job, n);
  if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, label + n, mac, &mac_len) ||
      mac_len * 2 != GS_JOB_TOKEN_LEN)
    return -1;
  for (unsigned int i = 0; i < mac_len; i++)
    snprintf(out + 2 * i, 3, "%02x", mac[i]);
  return 0;
}

bool gs__job_token_ok(const char *secret, const char *job, const char *given)
{
  char want[GS_JOB_TOKEN_LEN + 1];

  return secret[0] && gs__job_token(secret, job, want) == 0 && gs__token_ok(want, given);
}
