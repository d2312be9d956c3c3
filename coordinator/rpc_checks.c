/* The RPC layer's checks of request contents (rpc_checks.h). */
#include "rpc_checks.h"

#include <ctype.h>
#include <pb_decode.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "packlist.h"
#include "wire.h"

/* Job names appear in URLs and logs: keep them to a safe alphabet. */
bool gs__job_name_ok(const char *name)
{
  if (!name[0])
    return false;
  for (const char *p = name; *p; p++) {
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
      return false;
  }
  return true;
}

/* Each array holds at most `max` entries: decoding fails at the first one
 * past it, so a list costs at most max * (sizeof(ParamInfo) + 8) bytes
 * however its entries were packed on the wire. */
void gs__pack_list_bind(gradsync_PackList *pl, gs_pack_list_arrays_t *a, uint32_t max)
{
  gs_pb_array_init(&a->params, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), max);
  gs_pb_array_init(&a->sizes, NULL, sizeof(uint32_t), max);
  gs_pb_array_init(&a->order, NULL, sizeof(uint32_t), max);
  gs_pb_array_bind_decode(&pl->params, &a->params);
  gs_pb_array_bind_decode(&pl->pack_sizes, &a->sizes);
  gs_pb_array_bind_decode(&pl->pack_params, &a->order);
}

void gs__pack_list_free(gs_pack_list_arrays_t *a)
{
  gs_pb_array_free(&a->params);
  gs_pb_array_free(&a->sizes);
  gs_pb_array_free(&a->order);
}

/* Validates the published list; on success encodes the FetchPackList reply
 * body once, for every rank that will fetch it. */
int gs__pack_list_check(const gradsync_PackList *pl, gs_pack_list_arrays_t *a, gs_buf_t *body,
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

/* Counts one entry of a repeated submessage and skips its bytes. */
static bool count_entry(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
  (void)field;
  (*(size_t *)*arg)++;
  return pb_read(stream, NULL, stream->bytes_left);
}

/* How many params a PublishPackList carries, read without storing any:
 * a 2 MiB list of a million empty entries would cost 300 MB decoded.
 * Returns false (with the reason) for a body that does not decode. */
bool gs__pack_list_count(const uint8_t *data, size_t len, size_t *count, char *why, size_t why_len)
{
  gradsync_PublishPackListRequest req = gradsync_PublishPackListRequest_init_zero;

  *count = 0;
  req.pack_list.params.funcs.decode = count_entry;
  req.pack_list.params.arg = count;
  return gs_wire_decode(data, len, gradsync_PublishPackListRequest_fields, &req, why, why_len) == 0;
}
