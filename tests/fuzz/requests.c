/* Request decoding as coordinator/rpc.c does it (see requests.h). */
#include "requests.h"

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

  return fields[m];
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
  const gradsync_PackList *pl = &rq->u.publish_pack_list.pack_list;
  const gradsync_ParamInfo *info = rq->params.items;
  uint32_t n = (uint32_t)rq->params.count, first = 0;
  gs_param_desc_t *descs = calloc(n ? n : 1, sizeof(*descs));
  gs_packlist_t list = {
      .threshold_bytes = pl->threshold_bytes,
      .param_count = (uint32_t)rq->order.count,
      .pack_count = (uint32_t)rq->sizes.count,
      .pack_sizes = rq->sizes.items,
      .order = rq->order.items,
  };
  gradsync_FetchPackListResponse resp = gradsync_FetchPackListResponse_init_zero;
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
  gs_pb_array_bind_encode(&resp.pack_list.params, &rq->params);
  gs_pb_array_bind_encode(&resp.pack_list.pack_sizes, &rq->sizes);
  gs_pb_array_bind_encode(&resp.pack_list.pack_params, &rq->order);
  err = gs_wire_encode(body, gradsync_FetchPackListResponse_fields, &resp);
  if (err)
    snprintf(why, why_len, "cannot encode the pack list: %s", gs_strerror(err));
out_free:
  free(descs);
  return err;
}
