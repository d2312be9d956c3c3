/* Jobs by name in O(1): every RPC names its job, and a coordinator may
 * hold many (20,000 one-shot Joins once made each lookup walk them all).
 * A chained hash table that grows and shrinks with the jobs; it owns no
 * job. */
#ifndef GS_JOB_INDEX_H
#define GS_JOB_INDEX_H

#include <stdint.h>

#include "error.h"

typedef struct gs_job gs_job_t;

typedef struct gs_job_index {
  gs_job_t **buckets; /* chained through gs_job.hnext */
  uint32_t nbuckets;  /* a power of two, or 0 before the first insert */
  uint32_t count;
} gs_job_index_t;

/* The job called `name`, or NULL. */
gs_job_t *gs__job_index_find(const gs_job_index_t *ix, const char *name);
/* Adds `job` (whose name is not in the index yet). */
int gs__job_index_insert(gs_job_index_t *ix, gs_job_t *job) GS_WARN_UNUSED;
/* Removes `job` if it is there. */
void gs__job_index_remove(gs_job_index_t *ix, gs_job_t *job);
void gs__job_index_free(gs_job_index_t *ix);

#endif
