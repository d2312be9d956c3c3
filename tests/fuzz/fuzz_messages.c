/* Every request message: the first input byte picks the method, the rest
 * is its body, decoded as the coordinator's RPC layer decodes it (a
 * Batch's and a NodeHeartbeat's, entry by entry). A body
 * that decodes is encoded again (gs_wire_encode), and that encoding must
 * decode and re-encode to the same bytes; a PublishPackList also goes
 * through the pack list check the coordinator runs before storing it. */
#include <string.h>

#include "fuzz.h"
#include "requests.h"
#include "frame.h"
#include "node_beats.h"

static void re_encode(fuzz_request_t *rq)
{
  gs_buf_t once = {0}, twice = {0};
  fuzz_request_t again;

  fuzz_request_bind_encode(rq);
  GS_FUZZ_CHECK(gs_wire_encode(&once, fuzz_request_fields(rq->method), &rq->u) == 0);
  GS_FUZZ_CHECK(fuzz_request_decode(&again, rq->method, once.data, once.len) == 0);
  fuzz_request_bind_encode(&again);
  GS_FUZZ_CHECK(gs_wire_encode(&twice, fuzz_request_fields(rq->method), &again.u) == 0);
  GS_FUZZ_CHECK(once.len == twice.len && (!once.len || !memcmp(once.data, twice.data, once.len)));
  fuzz_request_free(&again);
  gs_buf_free(&once);
  gs_buf_free(&twice);
}

/* A Batch's body, as the coordinator's RPC layer walks it: each entry
 * within the body, after the last, and each an Envelope or not. */
static void walk_batch(const uint8_t *data, size_t len)
{
  const uint8_t *entry;
  size_t off = 0, elen, last = 0;
  gs_buf_t body = {0};
  gradsync_Envelope env;
  bool bad;

  while (gs_wire_batch_next(data, len, &off, &entry, &elen, &bad)) {
    GS_FUZZ_CHECK(entry >= data + last && entry + elen == data + off && off <= len);
    last = off;
    if (gs_wire_decode_envelope(entry, elen, &env, &body, NULL, 0) == 0)
      GS_FUZZ_CHECK(strlen(env.method) < sizeof(env.method));
  }
  GS_FUZZ_CHECK(bad || off >= len);
  gs_buf_free(&body);
}

/* A NodeHeartbeat's columns: decoded, every column as long as the slots'
 * and within bounds; encoded and decoded again, the same beats. */
static void node_beats(const uint8_t *data, size_t len)
{
  static gs_node_beats_t once, again; /* 40 KB each */
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_buf_t frame = {0}, body = {0};
  const uint8_t *payload;
  size_t plen;

  if (gs_node_beats_decode(&once, data, len, NULL, 0))
    return;
  GS_FUZZ_CHECK(once.count <= GS_NODE_BEATS_MAX && once.msg.sessions_count <= GS_NODE_BEATS_MAX);
  GS_FUZZ_CHECK(gs_node_beats_encode_frame(&once, &frame, &env, SIZE_MAX) == 0);
  GS_FUZZ_CHECK(gs_frame_parse(frame.data, frame.len, SIZE_MAX, &payload, &plen) > 0);
  GS_FUZZ_CHECK(gs_wire_decode_envelope(payload, plen, &env, &body, NULL, 0) == 0);
  GS_FUZZ_CHECK(gs_node_beats_decode(&again, body.data, body.len, NULL, 0) == 0);
  GS_FUZZ_CHECK(again.count == once.count && !strcmp(again.msg.job, once.msg.job) &&
                again.msg.sessions_count == once.msg.sessions_count);
  GS_FUZZ_CHECK(!memcmp(again.step, once.step, once.count * sizeof(once.step[0])) &&
                !memcmp(again.slot, once.slot, once.count * sizeof(once.slot[0])) &&
                !memcmp(again.news_seen, once.news_seen, once.count * sizeof(once.news_seen[0])));
  gs_buf_free(&frame);
  gs_buf_free(&body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  fuzz_request_t rq;
  gs_method_t m;

  if (size < 1)
    return 0;
  m = (gs_method_t)(data[0] % GS_METHOD_COUNT);
  if (m == GS_METHOD_BATCH) {
    walk_batch(data + 1, size - 1);
    return 0;
  }
  if (m == GS_METHOD_NODE_HEARTBEAT) {
    node_beats(data + 1, size - 1);
    return 0;
  }
  if (fuzz_request_decode(&rq, m, data + 1, size - 1) == 0) {
    if (m == GS_METHOD_PUBLISH_PACK_LIST) {
      gs_pack_summary_t sum;
      gs_buf_t body = {0};
      char why[256];

      if (fuzz_pack_list_check(&rq, &body, &sum, why, sizeof(why)) == 0)
        GS_FUZZ_CHECK(sum.params == rq.params.count && sum.packs == rq.sizes.count);
      gs_buf_free(&body);
    }
    re_encode(&rq);
  }
  fuzz_request_free(&rq);
  return 0;
}
