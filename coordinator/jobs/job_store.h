/* What a generation of a job stores for its ranks: small blobs (Publish,
 * Fetch), the pack list, and the requests parked until these exist. It
 * knows nothing of generations or members: the caller checks that a
 * request speaks for the running generation before it gets here. */
#ifndef GS_JOB_STORE_H
#define GS_JOB_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "buf.h"
#include "log.h"
#include "mem_budget.h"
#include "responder.h"

typedef struct gs_pack_summary {
  bool published;
  uint32_t packs;
  uint32_t params;
  uint64_t bytes;
  uint64_t threshold_bytes;
  uint64_t largest_pack_bytes;
} gs_pack_summary_t;

typedef struct gs_blob {
  struct gs_blob *next;  /* every blob, newest first */
  struct gs_blob *hnext; /* its bucket of the store's index */
  char key[128];
  size_t len;
  uint8_t value[];
} gs_blob_t;

/* A Fetch or FetchPackList parked until its data exists or its deadline. */
typedef struct gs_waiter {
  struct gs_waiter *next;
  gs_method_t method;
  uint64_t peer;
  uint64_t request_id;
  uint64_t generation;
  uint64_t deadline_ms;
  char key[128];
} gs_waiter_t;

/* What each stored blob or pack list costs besides its bytes: malloc's
 * header and rounding. */
#define GS_STORE_ALLOC_OVERHEAD 32

typedef struct gs_job_store {
  gs_responder_t *responder;
  const gs_log_t *log;
  const char *job;      /* the job's name, for messages */
  gs_mem_budget_t *mem; /* borrowed; NULL: nothing counted */
  size_t counted;       /* what the blobs and pack list hold, as counted in mem */
  gs_blob_t *blobs;
  uint32_t blob_count;
  /* The blobs by key (a trace asks for each rank's part: a 1,024-rank
   * job's walked the list a million times); nbuckets a power of two. */
  gs_blob_t **buckets;
  uint32_t nbuckets;
  gs_buf_t pack_list_body; /* encoded FetchPackListResponse */
  gs_pack_summary_t pack_summary;
  gs_waiter_t *waiters;
} gs_job_store_t;

/* The blob stored under `key`, or NULL. */
const gs_blob_t *gs__store_find(const gs_job_store_t *s, const char *key);

/* An empty store answering through `r`; `log`, `job` and `mem` (the
 * budget its blobs and pack list count in, or NULL) are borrowed. */
void gs__store_init(gs_job_store_t *s, gs_responder_t *r, const gs_log_t *log, const char *job,
                    gs_mem_budget_t *mem);

/* The RPCs, for a request already checked to name the running generation.
 * Each answers now, or parks the call until its data or deadline. A
 * Publish or PublishPackList whose data would pass the budget's share for
 * stored data is refused (RESOURCE_EXHAUSTED). */
void gs__store_publish(gs_job_store_t *s, const gs_call_t *call,
                       const gradsync_PublishRequest *req);
void gs__store_fetch(gs_job_store_t *s, const gs_call_t *call, const gradsync_FetchRequest *req);
/* `body` is the FetchPackListResponse every fetch gets, encoded once. */
void gs__store_publish_pack_list(gs_job_store_t *s, const gs_call_t *call, uint64_t generation,
                                 const gs_buf_t *body, const gs_pack_summary_t *summary);
void gs__store_fetch_pack_list(gs_job_store_t *s, const gs_call_t *call, uint64_t generation);

/* Answers every parked request with `err` and `msg`. */
void gs__store_fail_waiters(gs_job_store_t *s, int err, const char *msg);
/* Answers parked requests whose deadline has passed. */
void gs__store_sweep(gs_job_store_t *s, uint64_t now);
/* Gives the blobs and the pack list back (to the budget too) as soon as
 * their generation ends: no request can fetch them any more, since each
 * must name the running generation. The pack list's summary stays, for
 * /status, and so do parked requests. */
void gs__store_drop(gs_job_store_t *s);
/* Drops the blobs, the pack list and its summary, and any parked request
 * (answered ABORTED), when a new generation starts or the job is freed. */
void gs__store_reset(gs_job_store_t *s);

#endif
