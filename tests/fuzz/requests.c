/* Request decoding as coordinator/rpc.c does it (see requests.h). */
#include "requests.h"

#include "rpc_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const pb_msgdesc_t *fuzz_request_fields(gs_method_t m)
{
  static const pb_msgdesc_t *const fields[GS_METHOD_COUNT] = {
      [GS_METHOD_JOIN] = gradsync_JoinRequest_fields,
      [GS_METHOD_PUBLISH] = gradsync_PublishRequest_fields,
      [GS_METHOD_FETCH] = gradsync_FetchRequest_fields,
      [GS_METHOD_PUBLISH_PACK_LIST] = gradsync_PublishPackListRequest_fields,
      [GS_METHOD_FETCH_PACK_LIST] = gradsync_FetchPackListRequest_fields,
      [GS_METHOD_HEARTBEAT] = gradsync_HeartbeatRequest_fields,
      [GS_METHOD_LEAVE] = gradsync_LeaveRequest_fields,
  };

  return m < GS_METHOD_COUNT ? fields[m] : NULL; /* Batch, NodeHeartbeat: lists */
}

int fuzz_request_decode(fuzz_request_t *rq, gs_method_t m, const uint8_t *data, size_t len)
{
  char why[128];

  memset(rq, 0, sizeof(*rq));
  rq->method = m;
  gs_pb_array_init(&rq->settings, gradsync_Setting_fields, sizeof(gradsync_Setting),
                   FUZZ_MAX_SETTINGS);
  gs_pb_array_init(&rq->params, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo),
                   FUZZ_MAX_PARAMS);
  gs_pb_array_init(&rq->sizes, NULL, sizeof(uint32_t), FUZZ_MAX_PARAMS);
  gs_pb_array_init(&rq->order, NULL, sizeof(uint32_t), FUZZ_MAX_PARAMS);
  if (m == GS_METHOD_JOIN)
    gs_pb_array_bind_decode(&rq->u.join.settings, &rq->settings);
  if (m == GS_METHOD_PUBLISH_PACK_LIST) {
    gs_pb_array_bind_decode(&rq->u.publish_pack_list.pack_list.params, &rq->params);
    gs_pb_array_bind_decode(&rq->u.publish_pack_list.pack_list.pack_sizes, &rq->sizes);
    gs_pb_array_bind_decode(&rq->u.publish_pack_list.pack_list.pack_params, &rq->order);
  }
  if (!fuzz_request_fields(m))
    return GS_EINVAL;
  return gs_wire_decode(data, len, fuzz_request_fields(m), &rq->u, why, sizeof(why));
}

void fuzz_request_bind_encode(fuzz_request_t *rq)
{
  if (rq->method == GS_METHOD_JOIN)
    gs_pb_array_bind_encode(&rq->u.join.settings, &rq->settings);
  if (rq->method == GS_METHOD_PUBLISH_PACK_LIST) {
    gs_pb_array_bind_encode(&rq->u.publish_pack_list.pack_list.params, &rq->params);
    gs_pb_array_bind_encode(&rq->u.publish_pack_list.pack_list.pack_sizes, &rq->sizes);
    gs_pb_array_bind_encode(&rq->u.publish_pack_list.pack_list.pack_params, &rq->order);
  }
}

void fuzz_request_free(fuzz_request_t *rq)
{
  gs_pb_array_free(&rq->settings);
  gs_pb_array_free(&rq->params);
  gs_pb_array_free(&rq->sizes);
  gs_pb_array_free(&rq->order);
}

const char *fuzz_request_job(const fuzz_request_t *rq)
{
  switch (rq->method) {
  case GS_METHOD_JOIN:
    return rq->u.join.job;
  case GS_METHOD_PUBLISH:
    return rq->u.publish.job;
  case GS_METHOD_FETCH:
    return rq->u.fetch.job;
  case GS_METHOD_PUBLISH_PACK_LIST:
    return rq->u.publish_pack_list.job;
  case GS_METHOD_FETCH_PACK_LIST:
    return rq->u.fetch_pack_list.job;
  case GS_METHOD_HEARTBEAT:
    return rq->u.heartbeat.job;
  default:
    return rq->u.leave.job;
  }
}

int fuzz_pack_list_check(fuzz_request_t *rq, gs_buf_t *body, gs_pack_summary_t *sum, char *why,
                         size_t why_len)
{
  /* The request's own arrays, seen as rpc.c's: the check is rpc.c's. */
  gs_pack_list_arrays_t a = {rq->params, rq->sizes, rq->order};

  return gs__pack_list_check(&rq->u.publish_pack_list.pack_list, &a, body, sum, why, why_len);
}
