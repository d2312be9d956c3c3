/* The body of POST /jobs/NAME/control, read strictly into what it asks:
 * {"bcast_period": N, "lr_scale": X, "action": "broadcast"|"checkpoint"|"stop"},
 * any of them, at least one. A field given twice, an unknown field, a
 * value out of range or a string holding a NUL is refused, never guessed
 * at (which copy wins, or where a string ends, is not ours to decide for
 * a request that stops a job). Pure: no job, no I/O. */
#ifndef GS_CONTROL_BODY_H
#define GS_CONTROL_BODY_H

#include <stdbool.h>
#include <stddef.h>

#include "jobs.h"

/* True with *out filled; false with the reason (a 400's words) in `why`. */
bool gs__control_body_parse(const char *body, size_t len, gs_job_control_t *out, char *why,
                            size_t why_len);

#endif
