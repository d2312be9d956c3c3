/* Blobs and the pack list of the running generation, and the Fetch /
 * FetchPackList requests parked until they are published. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_store.h"

#define MAX_BLOBS_PER_JOB 1024

/* The job of a request, checked to be running `generation`; replies with
 * the reason and returns NULL otherwise. */
static gs_job_t *running_job(const gs_call_t *call, const char *name, uint64_t generation)
{
  struct gs_coord *c = call->conn->coord;
  gs_job_t *job = gs__job_find(c, name);
  int code = GS_GRPC_FAILED_PRECONDITION;
  char msg[400];

  if (!job) {
    code = GS_GRPC_NOT_FOUND;
    snprintf(msg, sizeof(msg), "no job named %s", name);
  } else if (generation == job->aborted_generation && generation) {
    code = GS_GRPC_ABORTED;
    snprintf(msg, sizeof(msg), "generation %llu of job %s was aborted: %s",
             (unsigned long long)generation, name, job->abort_reason);
  } else if (generation < job->generation) {
    code = GS_GRPC_ABORTED;
    snprintf(msg, sizeof(msg), "generation %llu of job %s was superseded by %llu",
             (unsigned long long)generation, name, (unsigned long long)job->generation);
  } else if (generation != job->generation || job->state == GS_JOB_WAITING) {
    snprintf(msg, sizeof(msg),
             "job %s is not running generation %llu (it is %s at generation %llu)", name,
             (unsigned long long)generation, gs__job_state_name(job->state),
             (unsigned long long)job->generation);
  } else {
    return job;
  }
  gs__reply_error(c, call->conn->ref, call->method, call->request_id, code, "%s", msg);
  return NULL;
}

static gs_blob_t *find_blob(gs_job_t *job, const char *key)
{
  for (gs_blob_t *b = job->blobs; b; b = b->next) {
    if (strcmp(b->key, key) == 0)
      return b;
  }
  return NULL;
}

static void reply_blob(struct gs_coord *c, gs_conn_ref_t ref, uint64_t request_id,
                       const gs_blob_t *b)
{
  gradsync_FetchResponse *resp = calloc(1, sizeof(*resp));

  if (!resp) {
    gs__reply_error(c, ref, GS_METHOD_FETCH, request_id, GS_GRPC_RESOURCE_EXHAUSTED,
                    "out of memory");
    return;
  }
  resp->value.size = (pb_size_t)b->len;
  memcpy(resp->value.bytes, b->value, b->len);
  gs__reply(c, ref, GS_METHOD_FETCH, request_id, gradsync_FetchResponse_fields, resp);
  free(resp);
}

static void park(const gs_call_t *call, gs_job_t *job, uint64_t generation, const char *key)
{
  gs_waiter_t *w = calloc(1, sizeof(*w));

  if (!w) {
    gs__reply_error(job->coord, call->conn->ref, call->method, call->request_id,
                    GS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->method = call->method;
  w->conn = call->conn->ref;
  w->request_id = call->request_id;
  w->generation = generation;
  w->deadline_ms = call->deadline_ms;
  snprintf(w->key, sizeof(w->key), "%s", key);
  w->next = job->waiters;
  job->waiters = w;
  gs__conn_park(job->coord, w->conn);
}

/* Answers the parked requests that `done` says are satisfied. */
static void wake(gs_job_t *job, gs_method_t method, const char *key)
{
  struct gs_coord *c = job->coord;
  gs_waiter_t **pp = &job->waiters;

  while (*pp) {
    gs_waiter_t *w = *pp;

    if (w->method != method || (key && strcmp(w->key, key) != 0)) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    gs__conn_unpark(c, w->conn);
    if (method == GS_METHOD_FETCH)
      reply_blob(c, w->conn, w->request_id, find_blob(job, key));
    else
      gs__reply_bytes(c, w->conn, method, w->request_id, job->pack_list_body.data,
                      job->pack_list_body.len);
    free(w);
  }
}

void gs__job_publish(const gs_call_t *call, const gradsync_PublishRequest *req)
{
  struct gs_coord *c = call->conn->coord;
  gs_job_t *job = running_job(call, req->job, req->generation);
  gs_blob_t *b;

  if (!job)
    return;
  b = find_blob(job, req->key);
  if (b && (b->len != req->value.size || memcmp(b->value, req->value.bytes, b->len))) {
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_ALREADY_EXISTS,
                    "blob '%s' of generation %llu already holds a different value", req->key,
                    (unsigned long long)req->generation);
    return;
  }
  if (!b) {
    if (job->blob_count >= MAX_BLOBS_PER_JOB) {
      gs__reply_error(c, call->conn->ref, call->method, call->request_id,
                      GS_GRPC_RESOURCE_EXHAUSTED, "job %s already holds %u blobs", job->name,
                      job->blob_count);
      return;
    }
    b = malloc(sizeof(*b) + req->value.size);
    if (!b) {
      gs__reply_error(c, call->conn->ref, call->method, call->request_id,
                      GS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    snprintf(b->key, sizeof(b->key), "%s", req->key);
    b->len = req->value.size;
    memcpy(b->value, req->value.bytes, b->len);
    b->next = job->blobs;
    job->blobs = b;
    job->blob_count++;
  }
  gs__reply(c, call->conn->ref, call->method, call->request_id, gradsync_PublishResponse_fields,
            &(gradsync_PublishResponse)gradsync_PublishResponse_init_zero);
  wake(job, GS_METHOD_FETCH, req->key);
}

void gs__job_fetch(const gs_call_t *call, const gradsync_FetchRequest *req)
{
  gs_job_t *job = running_job(call, req->job, req->generation);
  gs_blob_t *b;

  if (!job)
    return;
  b = find_blob(job, req->key);
  if (b)
    reply_blob(job->coord, call->conn->ref, call->request_id, b);
  else
    park(call, job, req->generation, req->key);
}

void gs__job_publish_pack_list(const gs_call_t *call, const gradsync_PublishPackListRequest *req,
                               const gs_buf_t *body, const gs_pack_summary_t *summary)
{
  struct gs_coord *c = call->conn->coord;
  gs_job_t *job = running_job(call, req->job, req->generation);
  const gs_member_t *r0;

  if (!job)
    return;
  r0 = job->ranks[0];
  if (req->rank != 0) {
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_PERMISSION_DENIED,
                    "only rank 0 publishes the pack list (got rank %u)", req->rank);
    return;
  }
  if (r0 && r0->req.has_model_signature && r0->req.model_signature.param_count != summary->params) {
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_INVALID_ARGUMENT,
                    "the pack list has %u params but rank 0 joined with a model of %u",
                    summary->params, r0->req.model_signature.param_count);
    return;
  }
  if (job->pack_summary.published) {
    bool same = job->pack_list_body.len == body->len &&
                memcmp(job->pack_list_body.data, body->data, body->len) == 0;

    if (same)
      gs__reply(c, call->conn->ref, call->method, call->request_id,
                gradsync_PublishPackListResponse_fields,
                &(gradsync_PublishPackListResponse)gradsync_PublishPackListResponse_init_zero);
    else
      gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_ALREADY_EXISTS,
                      "generation %llu already has a different pack list",
                      (unsigned long long)req->generation);
    return;
  }
  job->pack_list_body.len = 0;
  if (gs_buf_append(&job->pack_list_body, body->data, body->len)) {
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_RESOURCE_EXHAUSTED,
                    "out of memory");
    return;
  }
  job->pack_summary = *summary;
  gs_log(&c->cfg.log, GS_LOG_INFO, job->name, 0,
         "pack list published: %u params in %u packs, %llu bytes (threshold %llu)", summary->params,
         summary->packs, (unsigned long long)summary->bytes,
         (unsigned long long)summary->threshold_bytes);
  gs__reply(c, call->conn->ref, call->method, call->request_id,
            gradsync_PublishPackListResponse_fields,
            &(gradsync_PublishPackListResponse)gradsync_PublishPackListResponse_init_zero);
  wake(job, GS_METHOD_FETCH_PACK_LIST, NULL);
}

void gs__job_fetch_pack_list(const gs_call_t *call, const gradsync_FetchPackListRequest *req)
{
  gs_job_t *job = running_job(call, req->job, req->generation);

  if (!job)
    return;
  if (job->pack_summary.published)
    gs__reply_bytes(job->coord, call->conn->ref, call->method, call->request_id,
                    job->pack_list_body.data, job->pack_list_body.len);
  else
    park(call, job, req->generation, "");
}

void gs__job_store_fail_waiters(gs_job_t *job, int code, const char *msg)
{
  while (job->waiters) {
    gs_waiter_t *w = job->waiters;

    job->waiters = w->next;
    gs__conn_unpark(job->coord, w->conn);
    gs__reply_error(job->coord, w->conn, w->method, w->request_id, code, "%s", msg);
    free(w);
  }
}

void gs__job_store_sweep(gs_job_t *job, uint64_t now)
{
  gs_waiter_t **pp = &job->waiters;

  while (*pp) {
    gs_waiter_t *w = *pp;

    if (now < w->deadline_ms) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    gs__conn_unpark(job->coord, w->conn);
    if (w->method == GS_METHOD_FETCH)
      gs__reply_error(job->coord, w->conn, w->method, w->request_id, GS_GRPC_DEADLINE_EXCEEDED,
                      "blob '%s' of generation %llu was not published before the deadline", w->key,
                      (unsigned long long)w->generation);
    else
      gs__reply_error(job->coord, w->conn, w->method, w->request_id, GS_GRPC_DEADLINE_EXCEEDED,
                      "the pack list of generation %llu was not published before the deadline",
                      (unsigned long long)w->generation);
    free(w);
  }
}

void gs__job_store_reset(gs_job_t *job)
{
  gs__job_store_fail_waiters(job, GS_GRPC_ABORTED, "the generation ended");
  while (job->blobs) {
    gs_blob_t *b = job->blobs;

    job->blobs = b->next;
    free(b);
  }
  job->blob_count = 0;
  gs_buf_free(&job->pack_list_body);
  memset(&job->pack_summary, 0, sizeof(job->pack_summary));
}
