/* What the coordinator shows people: the status JSON and Prometheus text. */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include <cJSON.h>

#include "buf.h"
#include "job.h"

/* One job as JSON (caller frees with cJSON_Delete); NULL when out of memory. */
cJSON *gs__job_json(const gs_job_t *job, uint64_t now);
/* The whole service as JSON (caller frees with cJSON_Delete). */
cJSON *gs__status_json(const struct gs_coord *c);
/* Appends the Prometheus text exposition of every metric to `out`. */
int gs__metrics_text(const struct gs_coord *c, gs_buf_t *out) GS_WARN_UNUSED;

#endif
