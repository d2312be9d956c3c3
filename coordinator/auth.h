/* Who a token opens: the coordinator's token (--token) opens everything;
 * a job token, derived from it for one job name, opens that job only (its
 * RPCs, its control endpoint, its status). An operator hands each team
 * the token of its job (`gradsync-coordinator token --job NAME`). */
#ifndef GS_AUTH_H
#define GS_AUTH_H

#include <stdbool.h>

#define GS_JOB_TOKEN_LEN 64 /* hex digits of an HMAC-SHA256 */

/* Whether `given` (may be NULL) matches `want` ("" accepts anything), in
 * constant time. */
bool gs__token_ok(const char *want, const char *given);

/* The token of job `job` under the coordinator's `secret`: HMAC-SHA256 of
 * the job name (with a fixed label, so it is no other HMAC of ours), as 64
 * lowercase hex digits in out. 0, or -1 when the secret is empty or the
 * HMAC fails. */
int gs__job_token(const char *secret, const char *job, char out[GS_JOB_TOKEN_LEN + 1]);

/* Whether `given` is job `job`'s token under `secret` (constant time). */
bool gs__job_token_ok(const char *secret, const char *job, const char *given);

#endif
