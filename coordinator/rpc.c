/* RPC dispatch: decode the Envelope, authenticate, decode and check the
 * request, and hand it to the job module. Every failure here gets an error
 * reply naming what was wrong; none can harm another request or job. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "job.h"
#include "packlist.h"
#include "pb_array.h"
#include "wire.h"

#define MAX_PARAMS (1u << 20)

/* Job names appear in URLs and logs: keep them to a safe alphabet. */
static bool job_name_ok(const char *name)
{
  if (!name[0])
    return false;
  for (const char *p = name; *p; p++) {
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
      return false;
  }
  return true;
}

static bool check_job_name(const gs_call_t *call, const char *name)
{
  if (job_name_ok(name))
    return true;
  gs__reply_error(call->conn->coord, call->conn->ref, call->method, call->request_id,
                  GS_GRPC_INVALID_ARGUMENT,
                  "job name '%s' is invalid: use 1-127 letters, digits, '-', '_' or '.'", name);
  return false;
}

static bool decode_body(const gs_call_t *call, const pb_msgdesc_t *fields, void *msg)
{
  char why[128];

  if (gs_wire_decode(call->body, call->body_len, fields, msg, why, sizeof(why)) == 0)
    return true;
  gs_log(&call->conn->coord->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: %s sent an undecodable %s: %s",
         call->conn->peer, gs_method_name(call->method), why);
  gs__reply_error(call->conn->coord, call->conn->ref, call->method, call->request_id,
                  GS_GRPC_INVALID_ARGUMENT, "cannot decode %sRequest: %s",
                  gs_method_name(call->method), why);
  return false;
}

static void on_join(const gs_call_t *call)
{
  gradsync_JoinRequest req = gradsync_JoinRequest_init_zero;

  if (decode_body(call, gradsync_JoinRequest_fields, &req) && check_job_name(call, req.job))
    gs__job_join(call, &req);
}

static void on_publish(const gs_call_t *call)
{
  gradsync_PublishRequest *req = calloc(1, sizeof(*req));

  if (!req) {
    gs__reply_error(call->conn->coord, call->conn->ref, call->method, call->request_id,
                    GS_GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (decode_body(call, gradsync_PublishRequest_fields, req) && check_job_name(call, req->job))
    gs__job_publish(call, req);
  free(req);
}

static void on_fetch(const gs_call_t *call)
{
  gradsync_FetchRequest req = gradsync_FetchRequest_init_zero;

  if (decode_body(call, gradsync_FetchRequest_fields, &req) && check_job_name(call, req.job))
    gs__job_fetch(call, &req);
}

/* The wire arrays of a PackList, and its view as a gs_packlist_t. */
typedef struct pack_list_arrays {
  gs_pb_array_t params, sizes, order;
} pack_list_arrays_t;

static void pack_list_bind(gradsync_PackList *pl, pack_list_arrays_t *a)
{
  gs_pb_array_init(&a->params, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), MAX_PARAMS);
  gs_pb_array_init(&a->sizes, NULL, sizeof(uint32_t), MAX_PARAMS);
  gs_pb_array_init(&a->order, NULL, sizeof(uint32_t), MAX_PARAMS);
  gs_pb_array_bind_decode(&pl->params, &a->params);
  gs_pb_array_bind_decode(&pl->pack_sizes, &a->sizes);
  gs_pb_array_bind_decode(&pl->pack_params, &a->order);
}

static void pack_list_free(pack_list_arrays_t *a)
{
  gs_pb_array_free(&a->params);
  gs_pb_array_free(&a->sizes);
  gs_pb_array_free(&a->order);
}

/* Validates the published list; on success encodes the FetchPackList reply
 * body once, for every rank that will fetch it. */
static int check_pack_list(const gradsync_PackList *pl, pack_list_arrays_t *a, gs_buf_t *body,
                           gs_pack_summary_t *sum, char *why, size_t why_len)
{
  const gradsync_ParamInfo *info = a->params.items;
  uint32_t n = (uint32_t)a->params.count;
  gs_param_desc_t *descs = calloc(n ? n : 1, sizeof(*descs));
  gs_packlist_t list = {
      .threshold_bytes = pl->threshold_bytes,
      .param_count = (uint32_t)a->order.count,
      .pack_count = (uint32_t)a->sizes.count,
      .pack_sizes = a->sizes.items,
      .order = a->order.items,
  };
  gradsync_FetchPackListResponse resp = gradsync_FetchPackListResponse_init_zero;
  uint32_t first = 0;
  int err;

  if (!descs)
    return GS_ENOMEM;
  for (uint32_t i = 0; i < n; i++)
    descs[i] = (gs_param_desc_t){info[i].name, info[i].elements, (gs_dtype_t)info[i].dtype};
  err = gs_packlist_validate(&list, descs, n, why, why_len);
  if (err)
    goto out_free;
  memset(sum, 0, sizeof(*sum));
  sum->published = true;
  sum->packs = list.pack_count;
  sum->params = n;
  sum->threshold_bytes = list.threshold_bytes;
  for (uint32_t p = 0; p < list.pack_count; p++) {
    uint64_t bytes = gs_packlist_pack_bytes(&list, descs, first, list.pack_sizes[p]);

    sum->bytes += bytes;
    if (bytes > sum->largest_pack_bytes)
      sum->largest_pack_bytes = bytes;
    first += list.pack_sizes[p];
  }
  resp.has_pack_list = true;
  resp.pack_list.threshold_bytes = pl->threshold_bytes;
  gs_pb_array_bind_encode(&resp.pack_list.params, &a->params);
  gs_pb_array_bind_encode(&resp.pack_list.pack_sizes, &a->sizes);
  gs_pb_array_bind_encode(&resp.pack_list.pack_params, &a->order);
  err = gs_wire_encode(body, gradsync_FetchPackListResponse_fields, &resp);
  if (err)
    snprintf(why, why_len, "cannot encode the pack list: %s", gs_strerror(err));
out_free:
  free(descs);
  return err;
}

static void on_publish_pack_list(const gs_call_t *call)
{
  struct gs_coord *c = call->conn->coord;
  gradsync_PublishPackListRequest req = gradsync_PublishPackListRequest_init_zero;
  pack_list_arrays_t a;
  gs_pack_summary_t sum;
  gs_buf_t body = {0};
  char why[256];

  pack_list_bind(&req.pack_list, &a);
  if (!decode_body(call, gradsync_PublishPackListRequest_fields, &req) ||
      !check_job_name(call, req.job))
    goto out;
  if (!req.has_pack_list) {
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_INVALID_ARGUMENT,
                    "PublishPackList without a pack_list");
    goto out;
  }
  if (check_pack_list(&req.pack_list, &a, &body, &sum, why, sizeof(why))) {
    gs_log(&c->cfg.log, GS_LOG_WARN, req.job, req.rank, "rpc: invalid pack list: %s", why);
    gs__reply_error(c, call->conn->ref, call->method, call->request_id, GS_GRPC_INVALID_ARGUMENT,
                    "invalid pack list: %s", why);
    goto out;
  }
  gs__job_publish_pack_list(call, &req, &body, &sum);
out:
  gs_buf_free(&body);
  pack_list_free(&a);
}

static void on_fetch_pack_list(const gs_call_t *call)
{
  gradsync_FetchPackListRequest req = gradsync_FetchPackListRequest_init_zero;

  if (decode_body(call, gradsync_FetchPackListRequest_fields, &req) &&
      check_job_name(call, req.job))
    gs__job_fetch_pack_list(call, &req);
}

static void on_heartbeat(const gs_call_t *call)
{
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  if (decode_body(call, gradsync_HeartbeatRequest_fields, &req) && check_job_name(call, req.job))
    gs__job_heartbeat(call, &req);
}

static void on_leave(const gs_call_t *call)
{
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;

  if (decode_body(call, gradsync_LeaveRequest_fields, &req) && check_job_name(call, req.job))
    gs__job_leave(call, &req);
}

static void (*const handlers[GS_METHOD_COUNT])(const gs_call_t *) = {
    [GS_METHOD_JOIN] = on_join,
    [GS_METHOD_PUBLISH] = on_publish,
    [GS_METHOD_FETCH] = on_fetch,
    [GS_METHOD_PUBLISH_PACK_LIST] = on_publish_pack_list,
    [GS_METHOD_FETCH_PACK_LIST] = on_fetch_pack_list,
    [GS_METHOD_HEARTBEAT] = on_heartbeat,
    [GS_METHOD_LEAVE] = on_leave,
};

void gs__rpc_dispatch(gs_conn_t *conn, const uint8_t *payload, size_t len)
{
  struct gs_coord *c = conn->coord;
  gradsync_Envelope env;
  gs_buf_t *body = &c->rbody; /* one request is dispatched at a time */
  gs_call_t call = {.conn = conn};
  char why[128];

  gs__state_changed(c);
  if (gs_wire_decode_envelope(payload, len, &env, body, why, sizeof(why))) {
    c->stats.bad_frames++;
    gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: %s sent an undecodable envelope (%s); closing",
           conn->peer, why);
    gs__conn_fail(conn, GS_GRPC_INVALID_ARGUMENT, "cannot decode Envelope: %s", why);
    goto out;
  }
  if (!gs_method_from_path(env.method, &call.method)) {
    c->stats.bad_frames++;
    gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: %s called unknown method '%s'", conn->peer,
           env.method);
    gs__reply_error(c, conn->ref, GS_METHOD_COUNT, env.request_id, GS_GRPC_UNIMPLEMENTED,
                    "unknown method '%s'", env.method);
    goto out;
  }
  call.request_id = env.request_id;
  call.deadline_ms = gs__now_ms(c) + (env.timeout_ms ? env.timeout_ms : c->cfg.default_wait_ms);
  call.body = body->data;
  call.body_len = body->len;
  c->stats.requests[call.method]++;
  if (!gs__token_ok(c, env.token)) {
    gs_log(&c->cfg.log, GS_LOG_WARN, NULL, -1, "rpc: %s: %s with a %s token", conn->peer,
           gs_method_name(call.method), env.token[0] ? "wrong" : "missing");
    gs__reply_error(c, conn->ref, call.method, call.request_id, GS_GRPC_UNAUTHENTICATED, "%s token",
                    env.token[0] ? "wrong" : "missing");
    goto out;
  }
  handlers[call.method](&call);
out:
  if (body->cap > GS_COORD_KEEP_BUF_BYTES)
    gs_buf_free(body);
}
