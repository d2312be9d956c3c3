/* Blobs and the pack list of the running generation, and the Fetch /
 * FetchPackList requests parked until they are published. */
#include "job_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

#define MAX_BLOBS_PER_JOB 1024

void gs__store_init(gs_job_store_t *s, gs_responder_t *r, const gs_log_t *log, const char *job,
                    gs_mem_budget_t *mem)
{
  memset(s, 0, sizeof(*s));
  s->responder = r;
  s->log = log;
  s->job = job;
  s->mem = mem;
}

/* Whether `n` more bytes may be stored; if not, the call is answered
 * RESOURCE_EXHAUSTED, naming the budget and what `what` needed. */
static bool may_store(gs_job_store_t *s, const gs_call_t *call, size_t n, const char *what)
{
  if (!s->mem || gs_mem_budget_store_fits(s->mem, n))
    return true;
  gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_ELIMIT,
                    "%s of job %s (%zu bytes) would pass what jobs may store (%zu of %zu bytes "
                    "held, a quarter of --max-memory); it is given back when their generations "
                    "end",
                    what, s->job, n, s->mem->stored, s->mem->stored_max);
  return false;
}

/* The store holds `add` bytes more and `sub` fewer. */
static void count(gs_job_store_t *s, size_t add, size_t sub)
{
  s->counted += add;
  s->counted -= sub;
  if (s->mem)
    gs_mem_budget_store(s->mem, add, sub);
}

const gs_blob_t *gs__store_find(const gs_job_store_t *s, const char *key)
{
  if (!s->nbuckets)
    return NULL;
  for (const gs_blob_t *b = s->buckets[gs_fnv1a_str(GS_FNV1A_SEED, key) & (s->nbuckets - 1)]; b;
       b = b->hnext) {
    if (strcmp(b->key, key) == 0)
      return b;
  }
  return NULL;
}

/* The index's room for `n` blobs (one a bucket on average), counted with
 * the blobs; 0, or GS_ENOMEM. */
static int index_room(gs_job_store_t *s, uint32_t n)
{
  uint32_t size = s->nbuckets ? s->nbuckets : 16;
  gs_blob_t **b;

  while (size < n)
    size *= 2;
  if (size == s->nbuckets)
    return 0;
  b = calloc(size, sizeof(*b));
  if (!b)
    return GS_ENOMEM;
  for (gs_blob_t *blob = s->blobs; blob; blob = blob->next) {
    uint32_t at = gs_fnv1a_str(GS_FNV1A_SEED, blob->key) & (size - 1);

    blob->hnext = b[at];
    b[at] = blob;
  }
  free(s->buckets);
  count(s, size * sizeof(*b), s->nbuckets * sizeof(*b));
  s->buckets = b;
  s->nbuckets = size;
  return 0;
}

static gs_blob_t *find_blob(gs_job_store_t *s, const char *key)
{
  return (gs_blob_t *)gs__store_find(s, key);
}

static void reply_blob(gs_job_store_t *s, uint64_t peer, uint64_t request_id, const gs_blob_t *b)
{
  gradsync_FetchResponse *resp = calloc(1, sizeof(*resp));

  if (!resp) {
    gs__respond_error(s->responder, peer, GS_METHOD_FETCH, request_id, GS_ENOMEM, "out of memory");
    return;
  }
  resp->value.size = (pb_size_t)b->len;
  memcpy(resp->value.bytes, b->value, b->len);
  gs__respond(s->responder, peer, GS_METHOD_FETCH, request_id, gradsync_FetchResponse_fields, resp);
  free(resp);
}

static void park(gs_job_store_t *s, const gs_call_t *call, uint64_t generation, const char *key)
{
  gs_waiter_t *w = calloc(1, sizeof(*w));

  if (!w) {
    gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_ENOMEM,
                      "out of memory");
    return;
  }
  w->method = call->method;
  w->peer = call->peer->id;
  w->request_id = call->request_id;
  w->generation = generation;
  w->deadline_ms = call->deadline_ms;
  snprintf(w->key, sizeof(w->key), "%s", key);
  w->next = s->waiters;
  s->waiters = w;
  s->responder->park(s->responder, w->peer);
}

/* Answers the parked requests of `method` (and `key`, for a Fetch). */
static void wake(gs_job_store_t *s, gs_method_t method, const char *key)
{
  gs_waiter_t **pp = &s->waiters;

  while (*pp) {
    gs_waiter_t *w = *pp;

    if (w->method != method || (key && strcmp(w->key, key) != 0)) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    s->responder->unpark(s->responder, w->peer);
    if (method == GS_METHOD_FETCH)
      reply_blob(s, w->peer, w->request_id, find_blob(s, key));
    else
      gs__respond_bytes(s->responder, w->peer, method, w->request_id, s->pack_list_body.data,
                        s->pack_list_body.len);
    free(w);
  }
}

/* Stores a new blob; 0, or an error already answered. */
static int add_blob(gs_job_store_t *s, const gs_call_t *call, const gradsync_PublishRequest *req)
{
  size_t cost = sizeof(gs_blob_t) + req->value.size + GS_STORE_ALLOC_OVERHEAD;
  gs_blob_t *b;
  uint32_t at;

  if (s->blob_count >= MAX_BLOBS_PER_JOB) {
    gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_ELIMIT,
                      "job %s already holds %u blobs", s->job, s->blob_count);
    return GS_ELIMIT;
  }
  if (!may_store(s, call, cost, "the blob"))
    return GS_ELIMIT;
  b = malloc(sizeof(*b) + req->value.size);
  if (!b || index_room(s, s->blob_count + 1)) {
    free(b);
    gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_ENOMEM,
                      "out of memory");
    return GS_ENOMEM;
  }
  snprintf(b->key, sizeof(b->key), "%s", req->key);
  b->len = req->value.size;
  memcpy(b->value, req->value.bytes, b->len);
  b->next = s->blobs;
  s->blobs = b;
  at = gs_fnv1a_str(GS_FNV1A_SEED, b->key) & (s->nbuckets - 1);
  b->hnext = s->buckets[at];
  s->buckets[at] = b;
  s->blob_count++;
  count(s, cost, 0);
  return 0;
}

void gs__store_publish(gs_job_store_t *s, const gs_call_t *call, const gradsync_PublishRequest *req)
{
  gs_blob_t *b = find_blob(s, req->key);

  if (b && (b->len != req->value.size || memcmp(b->value, req->value.bytes, b->len))) {
    gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_EEXIST,
                      "blob '%s' of generation %llu already holds a different value", req->key,
                      (unsigned long long)req->generation);
    return;
  }
  if (!b && add_blob(s, call, req))
    return;
  gs__respond(s->responder, call->peer->id, call->method, call->request_id,
              gradsync_PublishResponse_fields,
              &(gradsync_PublishResponse)gradsync_PublishResponse_init_zero);
  wake(s, GS_METHOD_FETCH, req->key);
}

void gs__store_fetch(gs_job_store_t *s, const gs_call_t *call, const gradsync_FetchRequest *req)
{
  gs_blob_t *b = find_blob(s, req->key);

  if (b)
    reply_blob(s, call->peer->id, call->request_id, b);
  else
    park(s, call, req->generation, req->key);
}

void gs__store_publish_pack_list(gs_job_store_t *s, const gs_call_t *call, uint64_t generation,
                                 const gs_buf_t *body, const gs_pack_summary_t *summary)
{
  static const gradsync_PublishPackListResponse ok = gradsync_PublishPackListResponse_init_zero;
  uint8_t *copy;

  if (s->pack_summary.published) {
    if (s->pack_list_body.len == body->len &&
        memcmp(s->pack_list_body.data, body->data, body->len) == 0)
      gs__respond(s->responder, call->peer->id, call->method, call->request_id,
                  gradsync_PublishPackListResponse_fields, &ok);
    else
      gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_EEXIST,
                        "generation %llu already has a different pack list",
                        (unsigned long long)generation);
    return;
  }
  if (!may_store(s, call, body->len + GS_STORE_ALLOC_OVERHEAD, "the pack list"))
    return;
  copy = malloc(body->len ? body->len : 1); /* its exact size: it never grows */
  if (!copy) {
    gs__respond_error(s->responder, call->peer->id, call->method, call->request_id, GS_ENOMEM,
                      "out of memory");
    return;
  }
  if (body->len)
    memcpy(copy, body->data, body->len);
  gs_buf_free(&s->pack_list_body);
  s->pack_list_body = (gs_buf_t){.data = copy, .len = body->len, .cap = body->len};
  count(s, body->len + GS_STORE_ALLOC_OVERHEAD, 0);
  s->pack_summary = *summary;
  gs_log(s->log, GS_LOG_INFO, s->job, 0,
         "pack list published: %u params in %u packs, %llu bytes (threshold %llu)", summary->params,
         summary->packs, (unsigned long long)summary->bytes,
         (unsigned long long)summary->threshold_bytes);
  gs__respond(s->responder, call->peer->id, call->method, call->request_id,
              gradsync_PublishPackListResponse_fields, &ok);
  wake(s, GS_METHOD_FETCH_PACK_LIST, NULL);
}

void gs__store_fetch_pack_list(gs_job_store_t *s, const gs_call_t *call, uint64_t generation)
{
  if (s->pack_summary.published)
    gs__respond_bytes(s->responder, call->peer->id, call->method, call->request_id,
                      s->pack_list_body.data, s->pack_list_body.len);
  else
    park(s, call, generation, "");
}

void gs__store_fail_waiters(gs_job_store_t *s, int err, const char *msg)
{
  while (s->waiters) {
    gs_waiter_t *w = s->waiters;

    s->waiters = w->next;
    s->responder->unpark(s->responder, w->peer);
    gs__respond_error(s->responder, w->peer, w->method, w->request_id, err, "%s", msg);
    free(w);
  }
}

void gs__store_sweep(gs_job_store_t *s, uint64_t now)
{
  gs_waiter_t **pp = &s->waiters;

  while (*pp) {
    gs_waiter_t *w = *pp;

    if (now < w->deadline_ms) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    s->responder->unpark(s->responder, w->peer);
    if (w->method == GS_METHOD_FETCH)
      gs__respond_error(s->responder, w->peer, w->method, w->request_id, GS_ETIMEDOUT,
                        "blob '%s' of generation %llu was not published before the deadline",
                        w->key, (unsigned long long)w->generation);
    else
      gs__respond_error(s->responder, w->peer, w->method, w->request_id, GS_ETIMEDOUT,
                        "the pack list of generation %llu was not published before the deadline",
                        (unsigned long long)w->generation);
    free(w);
  }
}

void gs__store_drop(gs_job_store_t *s)
{
  while (s->blobs) {
    gs_blob_t *b = s->blobs;

    s->blobs = b->next;
    free(b);
  }
  s->blob_count = 0;
  free(s->buckets);
  s->buckets = NULL;
  s->nbuckets = 0;
  gs_buf_free(&s->pack_list_body);
  count(s, 0, s->counted);
}

void gs__store_reset(gs_job_store_t *s)
{
  gs__store_fail_waiters(s, GS_EABORTED, "the generation ended");
  gs__store_drop(s);
  memset(&s->pack_summary, 0, sizeof(s->pack_summary));
}
