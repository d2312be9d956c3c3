/* The shared-secret check for RPCs and the control endpoint. */
#ifndef GS_AUTH_H
#define GS_AUTH_H

#include <stdbool.h>

/* Whether `given` (may be NULL) matches `want` ("" accepts anything), in
 * constant time. */
bool gs__token_ok(const char *want, const char *given);

#endif
