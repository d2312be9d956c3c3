/* What the coordinator shows people: the status JSON and Prometheus text,
 * read from the jobs layer and a few numbers of the service around it. */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include <cJSON.h>

#include "buf.h"
#include "job.h"

/* The service's own numbers, gathered by its owner (coordinator.c). */
typedef struct gs_service_info {
  uint64_t uptime_ms;
  uint32_t connections;
  uint32_t unauthenticated;     /* of them, not (yet) past a token check */
  uint64_t memory_bytes;        /* what the connections hold (--max-memory) */
  uint64_t stored_bytes;        /* what the jobs' blobs and pack lists hold (the same) */
  uint64_t unauth_memory_bytes; /* the part the unauthenticated ones hold */
  uint64_t unauth_closed;       /* unauthenticated ones closed or refused for their share */
  uint64_t unauth_throttled;    /* times one was not read for its rate (GS_CONN_UNAUTH_RATE) */
  uint64_t http_memory_bytes;   /* what the HTTP port's replies and held requests hold */
  uint64_t member_bytes;        /* what the jobs' ranks and parked Joins hold */
  const uint64_t *requests;     /* [GS_METHOD_COUNT] */
  const uint64_t *errors;       /* [GS_METHOD_COUNT] */
  uint64_t bad_frames;
} gs_service_info_t;

/* Which jobs a /status page shows: the newest first, from the first
 * created before the job of serial `after` (0: from the newest), at most
 * `limit`. */
typedef struct gs_status_page {
  uint32_t limit;
  uint64_t after;
} gs_status_page_t;

/* Jobs on a page unless the query says (a summary is about 700 bytes),
 * and the most it may ask for: 50,000 jobs made one 27.7 MB document. */
#define GS_STATUS_PAGE_DEFAULT 100
#define GS_STATUS_PAGE_MAX 1000

/* Which of a job's ranks its JSON lists: `limit` from rank `from` on. A
 * job of 100,000 ranks lists 32 MB, which the loop would take a second to
 * build: a page of them at a time. */
typedef struct gs_rank_page {
  uint32_t from;
  uint32_t limit;
} gs_rank_page_t;
#define GS_RANKS_PAGE_DEFAULT 1000
#define GS_RANKS_PAGE_MAX 10000

/* One job as JSON (caller frees with cJSON_Delete); NULL when out of memory.
 * The summary (counts, step range, stragglers, ...) is always there, its
 * lists of ranks cut at SUMMARY_STRAGGLERS; with `ranks`, those lists hold
 * up to GS_RANKS_PAGE_MAX and `ranks` lists the page's ranks, with
 * `ranks_page` ({from, limit, listed, next: the path of the next page or
 * null}). */
cJSON *gs__job_json(const gs_job_t *job, uint64_t now, const gs_rank_page_t *ranks);
/* The service and one page of its jobs as JSON (caller frees with
 * cJSON_Delete), with the total and the path of the next page; with
 * `with_ranks`, each job with the first page of its ranks. */
cJSON *gs__status_json(const gs_jobs_t *jobs, const gs_service_info_t *svc, uint64_t now,
                       bool with_ranks, const gs_status_page_t *page);
/* Appends the Prometheus text exposition of every metric to `out`. */
int gs__metrics_text(const gs_jobs_t *jobs, const gs_service_info_t *svc, uint64_t now,
                     gs_buf_t *out) GS_WARN_UNUSED;

#endif
