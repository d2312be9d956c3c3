/* What the coordinator shows people: the status JSON and Prometheus text. */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include <cJSON.h>

#include "buf.h"
#include "job.h"

/* One job as JSON (caller frees with cJSON_Delete); NULL when out of memory.
 * The summary (counts, step range, stragglers, ...) is always there; the
 * per-rank list only `with_ranks`: it grows with the world size. */
cJSON *gs__job_json(const gs_job_t *job, uint64_t now, bool with_ranks);
/* The whole service as JSON (caller frees with cJSON_Delete). */
cJSON *gs__status_json(const struct gs_coord *c, bool with_ranks);
/* Appends the Prometheus text exposition of every metric to `out`. */
int gs__metrics_text(const struct gs_coord *c, gs_buf_t *out) GS_WARN_UNUSED;

#endif
