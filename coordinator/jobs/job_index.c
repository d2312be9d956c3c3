/* See job_index.h. */
#include "job_index.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "job.h"

/* Job names are short and come from a safe alphabet. */
static uint32_t hash_name(const char *name)
{
  return gs_fnv1a_str(GS_FNV1A_SEED, name);
}

gs_job_t *gs__job_index_find(const gs_job_index_t *ix, const char *name)
{
  if (!ix->nbuckets)
    return NULL;
  for (gs_job_t *j = ix->buckets[hash_name(name) & (ix->nbuckets - 1)]; j; j = j->hnext) {
    if (strcmp(j->name, name) == 0)
      return j;
  }
  return NULL;
}

/* The smallest table: what a coordinator with a few jobs keeps. */
#define MIN_BUCKETS 64

/* Moves every job into a table of `n` buckets (a power of two). */
static int rehash(gs_job_index_t *ix, uint32_t n)
{
  gs_job_t **b = calloc(n, sizeof(*b));

  if (!b)
    return GS_ENOMEM;
  for (uint32_t i = 0; i < ix->nbuckets; i++) {
    for (gs_job_t *j = ix->buckets[i], *next; j; j = next) {
      uint32_t at = hash_name(j->name) & (n - 1);

      next = j->hnext;
      j->hnext = b[at];
      b[at] = j;
    }
  }
  free(ix->buckets);
  ix->buckets = b;
  ix->nbuckets = n;
  return 0;
}

int gs__job_index_insert(gs_job_index_t *ix, gs_job_t *job)
{
  uint32_t at;

  /* Doubled at one job per bucket on average. */
  if (ix->count >= ix->nbuckets) {
    int err = rehash(ix, ix->nbuckets ? ix->nbuckets * 2 : MIN_BUCKETS);

    if (err)
      return err;
  }
  at = hash_name(job->name) & (ix->nbuckets - 1);
  job->hnext = ix->buckets[at];
  ix->buckets[at] = job;
  ix->count++;
  return 0;
}

void gs__job_index_remove(gs_job_index_t *ix, gs_job_t *job)
{
  if (!ix->nbuckets)
    return;
  for (gs_job_t **at = &ix->buckets[hash_name(job->name) & (ix->nbuckets - 1)]; *at;
       at = &(*at)->hnext) {
    if (*at == job) {
      *at = job->hnext;
      job->hnext = NULL;
      ix->count--;
      break;
    }
  }
  /* Halved at a quarter full, so a flood of jobs, once forgotten, leaves
   * no table behind it (and the halving and doubling points lie apart).
   * Out of memory, the table stays as it is, which is still right. */
  if (ix->nbuckets > MIN_BUCKETS && ix->count < ix->nbuckets / 4)
    (void)rehash(ix, ix->nbuckets / 2);
}

void gs__job_index_free(gs_job_index_t *ix)
{
  free(ix->buckets);
  ix->buckets = NULL;
  ix->nbuckets = 0;
  ix->count = 0;
}
