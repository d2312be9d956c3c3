/* The coordinator client's RPC methods: each builds its request, makes one
 * gs_client_call and checks what came back before the caller sees it. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "clock.h"
#include "lr_scale.h"
#include "pb_array.h"
#include "wire.h"

/* Copies the client's job name into a request (kept when the client has none). */
static int put_job(gs_client_t *cl, char *dst, size_t cap)
{
  if (!cl->job[0])
    return 0;
  if (strlen(cl->job) >= cap) {
    gs__client_set_err(cl, "job name '%s' is longer than %zu bytes", cl->job, cap - 1);
    return GS_EINVAL;
  }
  memcpy(dst, cl->job, strlen(cl->job) + 1);
  return 0;
}

/* Checks a string for a bounded request field. */
static int check_len(gs_client_t *cl, const char *what, const char *s, size_t cap)
{
  if (strlen(s) < cap)
    return 0;
  gs__client_set_err(cl, "%s '%.40s...' is longer than %zu bytes", what, s, cap - 1);
  return GS_EINVAL;
}

/* Fills a join result from the reply: peers land at their rank's index. */
static int join_result(gs_client_t *cl, const gradsync_JoinResponse *resp,
                       const gs_pb_array_t *peers, gs_join_result_t *out)
{
  const gradsync_Peer *p = peers->items;

  if (resp->world_size == 0 || resp->rank >= resp->world_size) {
    gs__client_set_err(cl, "coordinator %s answered Join with rank %u of world size %u", cl->addr,
                       resp->rank, resp->world_size);
    return GS_EPROTO;
  }
  out->peers = calloc(resp->world_size, sizeof(*out->peers));
  if (!out->peers) {
    gs__client_set_err(cl, "no memory for %u peers", resp->world_size);
    return GS_ENOMEM;
  }
  for (uint32_t r = 0; r < resp->world_size; r++)
    out->peers[r].rank = r;
  for (size_t i = 0; i < peers->count; i++) {
    gs_peer_t *dst;

    if (p[i].rank >= resp->world_size) {
      gs__client_set_err(cl, "coordinator %s listed peer rank %u in a world of %u", cl->addr,
                         p[i].rank, resp->world_size);
      gs_join_result_free(out);
      return GS_EPROTO;
    }
    dst = &out->peers[p[i].rank];
    snprintf(dst->node, sizeof(dst->node), "%s", p[i].node);
    dst->local_rank = p[i].local_rank;
    snprintf(dst->device, sizeof(dst->device), "%s", p[i].device);
    snprintf(dst->comm_addr, sizeof(dst->comm_addr), "%s", p[i].comm_addr);
  }
  out->rank = resp->rank;
  out->world_size = resp->world_size;
  out->generation = resp->generation;
  out->bcast_period = resp->bcast_period;
  out->heartbeat_interval_ms = resp->heartbeat_interval_ms;
  out->heartbeat_timeout_ms = resp->heartbeat_timeout_ms;
  snprintf(out->session, sizeof(out->session), "%s", resp->session);
  if (resp->resume_state && resp->state_rank >= resp->world_size) {
    gs__client_set_err(cl, "coordinator %s named state rank %u in a world of %u", cl->addr,
                       resp->state_rank, resp->world_size);
    gs_join_result_free(out);
    return GS_EPROTO;
  }
  out->resume_state = resp->resume_state;
  out->state_rank = resp->state_rank;
  out->state_step = resp->state_step;
  snprintf(out->regroup_reason, sizeof(out->regroup_reason), "%s", resp->regroup_reason);
  out->broadcast_seq = resp->directives.broadcast_seq;
  out->checkpoint_seq = resp->directives.checkpoint_seq;
  out->trace_seq = resp->directives.trace_seq;
  out->regroup_seq = resp->directives.regroup_seq;
  out->lr_scale = gs_lr_scale_or_one(resp->directives.lr_scale);
  out->coordinator_id = resp->coordinator_id;
  return 0;
}

int gs_client_join(gs_client_t *cl, gradsync_JoinRequest *req, uint64_t timeout_ms,
                   gs_join_result_t *out)
{
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gs_pb_array_t peers;
  int err;

  memset(out, 0, sizeof(*out));
  err = put_job(cl, req->job, sizeof(req->job));
  if (err)
    return err;
  gs_pb_array_init(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer),
                   req->world_size ? req->world_size : 1);
  gs_pb_array_bind_decode(&resp.peers, &peers);
  gs__client_waiting(cl, "the other ranks of job %s (world %u)", req->job, req->world_size);
  err = gs_client_call(cl, GS_METHOD_JOIN, gradsync_JoinRequest_fields, req,
                       gradsync_JoinResponse_fields, &resp, gs__client_wait_for(timeout_ms),
                       timeout_ms);
  if (!err)
    err = join_result(cl, &resp, &peers, out);
  if (!err)
    gs_client_set_session(cl, out->session); /* this client acts for the rank now */
  gs_pb_array_free(&peers);
  return err;
}

void gs_join_result_free(gs_join_result_t *r)
{
  if (!r)
    return;
  free(r->peers);
  memset(r, 0, sizeof(*r));
}

int gs_client_publish(gs_client_t *cl, uint64_t generation, const char *key, const void *value,
                      size_t len, uint64_t timeout_ms)
{
  gradsync_PublishRequest *req = calloc(1, sizeof(*req));
  gradsync_PublishResponse resp = gradsync_PublishResponse_init_zero;
  int err;

  if (!req) {
    gs__client_set_err(cl, "no memory to publish '%s'", key);
    return GS_ENOMEM;
  }
  err = put_job(cl, req->job, sizeof(req->job));
  if (!err)
    err = check_len(cl, "blob key", key, sizeof(req->key));
  if (!err && len > sizeof(req->value.bytes)) {
    gs__client_set_err(cl, "blob '%s' is %zu bytes; the limit is %zu", key, len,
                       sizeof(req->value.bytes));
    err = GS_EINVAL;
  }
  if (err)
    goto out_free_req;
  req->generation = generation;
  snprintf(req->key, sizeof(req->key), "%s", key);
  if (len)
    memcpy(req->value.bytes, value, len);
  req->value.size = (pb_size_t)len;
  err = gs_client_call(cl, GS_METHOD_PUBLISH, gradsync_PublishRequest_fields, req,
                       gradsync_PublishResponse_fields, &resp, 0, timeout_ms);
out_free_req:
  free(req);
  return err;
}

int gs_client_fetch(gs_client_t *cl, uint64_t generation, const char *key, void *value, size_t cap,
                    size_t *len, uint64_t timeout_ms)
{
  gradsync_FetchRequest req = gradsync_FetchRequest_init_zero;
  gradsync_FetchResponse *resp = calloc(1, sizeof(*resp));
  int err;

  if (!resp) {
    gs__client_set_err(cl, "no memory to fetch '%s'", key);
    return GS_ENOMEM;
  }
  err = put_job(cl, req.job, sizeof(req.job));
  if (!err)
    err = check_len(cl, "blob key", key, sizeof(req.key));
  if (err)
    goto out_free_resp;
  req.generation = generation;
  snprintf(req.key, sizeof(req.key), "%s", key);
  gs__client_waiting(cl, "blob '%s' of job %s (generation %llu) from rank 0", key, cl->job,
                     (unsigned long long)generation);
  err = gs_client_call(cl, GS_METHOD_FETCH, gradsync_FetchRequest_fields, &req,
                       gradsync_FetchResponse_fields, resp, gs__client_wait_for(timeout_ms),
                       timeout_ms);
  if (err)
    goto out_free_resp;
  *len = resp->value.size;
  if (resp->value.size > cap) {
    gs__client_set_err(cl, "blob '%s' is %u bytes; the buffer holds %zu", key,
                       (unsigned)resp->value.size, cap);
    err = GS_ERANGE;
    goto out_free_resp;
  }
  if (resp->value.size)
    memcpy(value, resp->value.bytes, resp->value.size);
out_free_resp:
  free(resp);
  return err;
}

/* The wire form of the params: ParamInfo structs (caller frees). */
static int param_infos(gs_client_t *cl, const gs_param_desc_t *params, uint32_t n,
                       gradsync_ParamInfo **out)
{
  gradsync_ParamInfo *info = calloc(n ? n : 1, sizeof(*info));

  if (!info) {
    gs__client_set_err(cl, "no memory for %u params", n);
    return GS_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (check_len(cl, "param name", params[i].name, sizeof(info[i].name))) {
      free(info);
      return GS_EINVAL;
    }
    snprintf(info[i].name, sizeof(info[i].name), "%s", params[i].name);
    info[i].elements = params[i].elements;
    info[i].dtype = (gradsync_DType)params[i].dtype;
  }
  *out = info;
  return 0;
}

int gs_client_publish_packlist(gs_client_t *cl, uint64_t generation, uint32_t rank,
                               const gs_packlist_t *list, const gs_param_desc_t *params, uint32_t n,
                               uint64_t timeout_ms)
{
  gradsync_PublishPackListRequest req = gradsync_PublishPackListRequest_init_zero;
  gradsync_PublishPackListResponse resp = gradsync_PublishPackListResponse_init_zero;
  gs_pb_array_t infos, sizes, order;
  gradsync_ParamInfo *info;
  char why[256];
  int err;

  err = put_job(cl, req.job, sizeof(req.job));
  if (err)
    return err;
  if (gs_packlist_validate(list, params, n, why, sizeof(why))) {
    gs__client_set_err(cl, "refusing to publish an invalid pack list: %s", why);
    return GS_EINVAL;
  }
  err = param_infos(cl, params, n, &info);
  if (err)
    return err;
  req.generation = generation;
  req.rank = rank;
  req.has_pack_list = true;
  req.pack_list.threshold_bytes = list->threshold_bytes;
  gs_pb_array_view(&infos, gradsync_ParamInfo_fields, sizeof(*info), info, n);
  gs_pb_array_view(&sizes, NULL, sizeof(uint32_t), list->pack_sizes, list->pack_count);
  gs_pb_array_view(&order, NULL, sizeof(uint32_t), list->order, list->param_count);
  gs_pb_array_bind_encode(&req.pack_list.params, &infos);
  gs_pb_array_bind_encode(&req.pack_list.pack_sizes, &sizes);
  gs_pb_array_bind_encode(&req.pack_list.pack_params, &order);
  err = gs_client_call(cl, GS_METHOD_PUBLISH_PACK_LIST, gradsync_PublishPackListRequest_fields,
                       &req, gradsync_PublishPackListResponse_fields, &resp, 0, timeout_ms);
  free(info);
  return err;
}

void gs_client_params_free(gs_param_desc_t *params, uint32_t n)
{
  if (!params)
    return;
  for (uint32_t i = 0; i < n; i++)
    free((char *)params[i].name);
  free(params);
}

/* Turns the decoded wire arrays into a checked pack list and params; the
 * list takes over the index arrays. */
static int unpack_list(gs_client_t *cl, uint64_t threshold, gs_pb_array_t *infos,
                       gs_pb_array_t *sizes, gs_pb_array_t *order, gs_packlist_t *list,
                       gs_param_desc_t **params, uint32_t *n)
{
  const gradsync_ParamInfo *info = infos->items;
  uint32_t count = (uint32_t)infos->count;
  gs_param_desc_t *descs = calloc(count ? count : 1, sizeof(*descs));
  gs_packlist_t l = {
      .threshold_bytes = threshold,
      .param_count = (uint32_t)order->count,
      .pack_count = (uint32_t)sizes->count,
      .pack_sizes = sizes->items,
      .order = order->items,
  };
  char why[256];

  if (!descs)
    goto out_nomem;
  for (uint32_t i = 0; i < count; i++) {
    descs[i] = (gs_param_desc_t){strdup(info[i].name), info[i].elements, (gs_dtype_t)info[i].dtype};
    if (!descs[i].name) {
      gs_client_params_free(descs, i);
      goto out_nomem;
    }
  }
  if (gs_packlist_validate(&l, descs, count, why, sizeof(why))) {
    gs__client_set_err(cl, "coordinator %s sent an invalid pack list: %s", cl->addr, why);
    gs_client_params_free(descs, count);
    return GS_EPROTO;
  }
  *list = l;
  sizes->items = order->items = NULL;
  *params = descs;
  *n = count;
  return 0;

out_nomem:
  gs__client_set_err(cl, "no memory for a pack list of %u params", count);
  return GS_ENOMEM;
}

int gs_client_fetch_packlist(gs_client_t *cl, uint64_t generation, gs_packlist_t *list,
                             gs_param_desc_t **params, uint32_t *n, uint64_t timeout_ms)
{
  gradsync_FetchPackListRequest req = gradsync_FetchPackListRequest_init_zero;
  gradsync_FetchPackListResponse resp = gradsync_FetchPackListResponse_init_zero;
  gs_pb_array_t infos, sizes, order;
  int err;

  err = put_job(cl, req.job, sizeof(req.job));
  if (err)
    return err;
  req.generation = generation;
  gs_pb_array_init(&infos, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo),
                   GS_CLIENT_MAX_PARAMS);
  gs_pb_array_init(&sizes, NULL, sizeof(uint32_t), GS_CLIENT_MAX_PARAMS);
  gs_pb_array_init(&order, NULL, sizeof(uint32_t), GS_CLIENT_MAX_PARAMS);
  gs_pb_array_bind_decode(&resp.pack_list.params, &infos);
  gs_pb_array_bind_decode(&resp.pack_list.pack_sizes, &sizes);
  gs_pb_array_bind_decode(&resp.pack_list.pack_params, &order);
  gs__client_waiting(cl, "rank 0's pack list of job %s (generation %llu)", cl->job,
                     (unsigned long long)generation);
  err = gs_client_call(cl, GS_METHOD_FETCH_PACK_LIST, gradsync_FetchPackListRequest_fields, &req,
                       gradsync_FetchPackListResponse_fields, &resp,
                       gs__client_wait_for(timeout_ms), timeout_ms);
  if (!err && !resp.has_pack_list) {
    gs__client_set_err(cl, "coordinator %s answered FetchPackList without a pack list", cl->addr);
    err = GS_EPROTO;
  }
  if (!err)
    err = unpack_list(cl, resp.pack_list.threshold_bytes, &infos, &sizes, &order, list, params, n);
  gs_pb_array_free(&infos);
  gs_pb_array_free(&sizes);
  gs_pb_array_free(&order);
  return err;
}

int gs_client_heartbeat(gs_client_t *cl, const gradsync_HeartbeatRequest *req,
                        gradsync_HeartbeatResponse *resp, uint64_t timeout_ms)
{
  gradsync_HeartbeatRequest r = *req;
  int err = put_job(cl, r.job, sizeof(r.job));

  if (err)
    return err;
  *resp = (gradsync_HeartbeatResponse)gradsync_HeartbeatResponse_init_zero;
  return gs_client_call(cl, GS_METHOD_HEARTBEAT, gradsync_HeartbeatRequest_fields, &r,
                        gradsync_HeartbeatResponse_fields, resp, 0, timeout_ms);
}

#define LEAVE_RETRY_MS 100u

/* Whether a Leave that failed so may work a little later: a coordinator
 * that restarted knows the job only once the rank's heartbeat thread has
 * re-registered it (NOT_FOUND, or FAILED_PRECONDITION for a generation it
 * has not rebuilt yet), and one shutting down or overloaded answers
 * UNAVAILABLE. The rank's last word is worth its whole deadline. */
static bool leave_again(int err)
{
  return err == GS_ENOTFOUND || err == GS_EPRECOND || err == GS_EUNAVAIL || err == GS_ECLOSED ||
         err == GS_EIO;
}

int gs_client_leave(gs_client_t *cl, uint64_t generation, uint32_t rank, bool finished,
                    const char *reason, uint64_t timeout_ms)
{
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;
  gradsync_LeaveResponse resp = gradsync_LeaveResponse_init_zero;
  int err = put_job(cl, req.job, sizeof(req.job));
  uint64_t deadline;

  if (err)
    return err;
  req.generation = generation;
  req.rank = rank;
  req.finished = finished;
  snprintf(req.reason, sizeof(req.reason), "%s", reason ? reason : ""); /* truncation is fine */
  deadline = gs_now_ms() + timeout_ms;
  for (;;) {
    uint64_t now = gs_now_ms();

    err = gs_client_call(cl, GS_METHOD_LEAVE, gradsync_LeaveRequest_fields, &req,
                         gradsync_LeaveResponse_fields, &resp, 0,
                         deadline > now ? deadline - now : 1);
    now = gs_now_ms();
    if (!leave_again(err) || now + LEAVE_RETRY_MS >= deadline)
      return err;
    gs_log(cl->log, GS_LOG_DEBUG, cl->job, (int)rank, "Leave: %s; trying again", cl->err);
    poll(NULL, 0, LEAVE_RETRY_MS);
  }
}
