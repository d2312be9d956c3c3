/* Framing, envelopes and repeated fields: the wire layer of common/. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "frame.h"
#include "node_beats.h"
#include "pb_array.h"
#include "wire.h"
#include "runner.h"

/* Copies data so that it ends right before an unreadable page: any read
 * past the end crashes the test. */
static uint8_t *guarded(const void *data, size_t len, void **map, size_t *map_len)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (len + page - 1) / page + 1;
  uint8_t *base =
      mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  ck_assert_ptr_ne(base, MAP_FAILED);
  ck_assert_int_eq(mprotect(base + (pages - 1) * page, page, PROT_NONE), 0);
  *map = base;
  *map_len = pages * page;
  memcpy(base + (pages - 1) * page - len, data, len);
  return base + (pages - 1) * page - len;
}

START_TEST(frame_parse_whole_partial_oversized)
{
  uint8_t buf[16] = {0, 0, 0, 3, 'a', 'b', 'c', 0xff};
  const uint8_t *payload;
  size_t len;

  for (size_t n = 0; n < 7; n++)
    ck_assert_int_eq(gs_frame_parse(buf, n, 100, &payload, &len), 0);
  ck_assert_int_eq(gs_frame_parse(buf, 8, 100, &payload, &len), 7);
  ck_assert_ptr_eq(payload, buf + 4);
  ck_assert_uint_eq(len, 3);
  ck_assert_int_eq(gs_frame_parse(buf, 8, 2, &payload, &len), GS_ETOOBIG);
  gs_frame_put_header(buf, 0x01020304);
  ck_assert_uint_eq(buf[0], 1);
  ck_assert_uint_eq(buf[3], 4);
  ck_assert_int_eq(gs_frame_parse(buf, 4, 1u << 30, &payload, &len), 0);
}
END_TEST

START_TEST(frame_parse_never_reads_past_len)
{
  static const uint8_t frame[] = {0, 0, 0, 2, 'h', 'i'};
  void *map;
  size_t map_len;

  for (size_t n = 0; n <= sizeof(frame); n++) {
    const uint8_t *p = guarded(frame, n, &map, &map_len), *payload;
    size_t len;

    ck_assert_int_eq(gs_frame_parse(p, n, 100, &payload, &len), n == sizeof(frame) ? 6 : 0);
    munmap(map, map_len);
  }
}
END_TEST

START_TEST(envelope_round_trip_with_body)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero, out;
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero, hb2;
  gs_buf_t frame = {0}, body = {0};
  const uint8_t *payload;
  size_t len;
  char why[64];

  strcpy(env.method, GS_METHOD_PREFIX "Heartbeat");
  env.request_id = 1ull << 40;
  env.timeout_ms = 250;
  strcpy(hb.job, "job");
  hb.step = 12345;
  hb.loss = 0.25f;
  ck_assert_int_eq(
      gs_wire_encode_frame(&frame, &env, gradsync_HeartbeatRequest_fields, &hb, 1 << 20), 0);
  ck_assert_int_eq(gs_frame_parse(frame.data, frame.len, 1 << 20, &payload, &len), (long)frame.len);
  ck_assert_int_eq(gs_wire_decode_envelope(payload, len, &out, &body, why, sizeof(why)), 0);
  ck_assert_str_eq(out.method, env.method);
  ck_assert_uint_eq(out.request_id, env.request_id);
  ck_assert_uint_eq(out.timeout_ms, 250);
  memset(&hb2, 0, sizeof(hb2));
  ck_assert_int_eq(
      gs_wire_decode(body.data, body.len, gradsync_HeartbeatRequest_fields, &hb2, why, sizeof(why)),
      0);
  ck_assert_str_eq(hb2.job, "job");
  ck_assert_uint_eq(hb2.step, 12345);
  ck_assert_float_eq(hb2.loss, 0.25f);
  /* Too big for the limit. */
  frame.len = 0;
  ck_assert_int_eq(gs_wire_encode_frame(&frame, &env, gradsync_HeartbeatRequest_fields, &hb, 8),
                   GS_ETOOBIG);
  gs_buf_free(&frame);
  gs_buf_free(&body);
}
END_TEST

/* An empty message encodes to no bytes, into an unused buffer (data NULL:
 * the encoder once did NULL + 0, undefined behaviour that clang's UBSan
 * reports; tests/fuzz/regressions/messages/empty-fetch-request replays
 * it there) and after existing bytes alike. */
START_TEST(wire_encode_empty_message)
{
  gradsync_FetchRequest empty = gradsync_FetchRequest_init_zero;
  gs_buf_t out = {0};

  ck_assert_int_eq(gs_wire_encode(&out, gradsync_FetchRequest_fields, &empty), 0);
  ck_assert_uint_eq(out.len, 0);
  ck_assert_ptr_null(out.data);
  ck_assert_int_eq(gs_buf_append(&out, "x", 1), 0);
  ck_assert_int_eq(gs_wire_encode(&out, gradsync_FetchRequest_fields, &empty), 0);
  ck_assert_uint_eq(out.len, 1);
  gs_buf_free(&out);
}
END_TEST

START_TEST(envelope_decode_rejects_truncation_and_overlong_strings)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero, out;
  gs_buf_t frame = {0}, body = {0};
  char why[64];
  uint8_t bad[600];
  void *map;
  size_t map_len;

  strcpy(env.method, GS_METHOD_PREFIX "Join");
  strcpy(env.message, "a message long enough to be cut");
  ck_assert_int_eq(gs_wire_encode_frame(&frame, &env, NULL, NULL, 1 << 20), 0);
  /* Protobuf has no end marker: a cut between the two fields decodes (as a
   * message without the second), a cut inside a field must not. */
  for (size_t n = 1; n < frame.len - 4; n++) {
    const uint8_t *p = guarded(frame.data + 4, n, &map, &map_len);
    size_t between = 2 + strlen(env.method);

    if (n == between)
      ck_assert_int_eq(gs_wire_decode_envelope(p, n, &out, &body, why, sizeof(why)), 0);
    else
      ck_assert_int_ne(gs_wire_decode_envelope(p, n, &out, &body, why, sizeof(why)), 0);
    munmap(map, map_len);
  }
  /* method is bounded to 63 bytes by gradsync.options. */
  bad[0] = 0x0a;
  bad[1] = 100;
  memset(bad + 2, 'x', 100);
  ck_assert_int_ne(gs_wire_decode_envelope(bad, 102, &out, &body, why, sizeof(why)), 0);
  gs_buf_free(&frame);
  gs_buf_free(&body);
}
END_TEST

START_TEST(pb_array_round_trip_and_bound)
{
  gradsync_PackList pl = gradsync_PackList_init_zero, back = gradsync_PackList_init_zero;
  gradsync_ParamInfo params[3] = {{"w", 1000, gradsync_DType_DTYPE_FLOAT32},
                                  {"b", 10, gradsync_DType_DTYPE_FLOAT16},
                                  {"", 0, gradsync_DType_DTYPE_FLOAT32}};
  uint32_t sizes[2] = {2, 1}, order[3] = {2, 1, 300000};
  gs_pb_array_t a, s, o, ba, bs, bo;
  gs_buf_t buf = {0};
  char why[64];

  gs_pb_array_view(&a, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), params, 3);
  gs_pb_array_view(&s, NULL, sizeof(uint32_t), sizes, 2);
  gs_pb_array_view(&o, NULL, sizeof(uint32_t), order, 3);
  pl.threshold_bytes = 77;
  gs_pb_array_bind_encode(&pl.params, &a);
  gs_pb_array_bind_encode(&pl.pack_sizes, &s);
  gs_pb_array_bind_encode(&pl.pack_params, &o);
  ck_assert_int_eq(gs_wire_encode(&buf, gradsync_PackList_fields, &pl), 0);

  gs_pb_array_init(&ba, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), 3);
  gs_pb_array_init(&bs, NULL, sizeof(uint32_t), 2);
  gs_pb_array_init(&bo, NULL, sizeof(uint32_t), 3);
  gs_pb_array_bind_decode(&back.params, &ba);
  gs_pb_array_bind_decode(&back.pack_sizes, &bs);
  gs_pb_array_bind_decode(&back.pack_params, &bo);
  ck_assert_int_eq(
      gs_wire_decode(buf.data, buf.len, gradsync_PackList_fields, &back, why, sizeof(why)), 0);
  ck_assert_uint_eq(back.threshold_bytes, 77);
  ck_assert_uint_eq(ba.count, 3);
  ck_assert_str_eq(((gradsync_ParamInfo *)ba.items)[1].name, "b");
  ck_assert_uint_eq(((gradsync_ParamInfo *)ba.items)[0].elements, 1000);
  ck_assert_int_eq(((gradsync_ParamInfo *)ba.items)[1].dtype, gradsync_DType_DTYPE_FLOAT16);
  ck_assert_uint_eq(bs.count, 2);
  ck_assert_uint_eq(bo.count, 3);
  ck_assert_uint_eq(((uint32_t *)bo.items)[2], 300000);
  gs_pb_array_free(&ba);
  gs_pb_array_free(&bs);
  gs_pb_array_free(&bo);

  /* One item more than the bound fails the decode. */
  gs_pb_array_init(&ba, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), 2);
  gs_pb_array_init(&bs, NULL, sizeof(uint32_t), 2);
  gs_pb_array_init(&bo, NULL, sizeof(uint32_t), 3);
  ck_assert_int_ne(
      gs_wire_decode(buf.data, buf.len, gradsync_PackList_fields, &back, why, sizeof(why)), 0);
  ck_assert_str_eq(why, "too many repeated items");
  gs_pb_array_free(&ba);
  gs_pb_array_free(&bs);
  gs_pb_array_free(&bo);
  gs_buf_free(&buf);
}
END_TEST

START_TEST(buf_grows_and_consumes)
{
  gs_buf_t b = {0};
  char big[1000];

  memset(big, 'z', sizeof(big));
  ck_assert_int_eq(gs_buf_append(&b, "hello", 5), 0);
  ck_assert_int_eq(gs_buf_append(&b, big, sizeof(big)), 0);
  ck_assert_uint_eq(b.len, 1005);
  gs_buf_consume(&b, 3);
  ck_assert_uint_eq(b.len, 1002);
  ck_assert_int_eq(memcmp(b.data, "lo", 2), 0);
  gs_buf_consume(&b, 5000);
  ck_assert_uint_eq(b.len, 0);
  gs_buf_free(&b);
  ck_assert_ptr_null(b.data);
}
END_TEST

/* Decodes the NodeHeartbeat body of frame `f` into `q`; returns the result. */
static int node_beats_from_frame(const gs_buf_t *f, gs_node_beats_t *q, char *why, size_t len)
{
  const uint8_t *payload;
  gradsync_Envelope env;
  gs_buf_t body = {0};
  size_t plen;
  int err;

  ck_assert_int_gt(gs_frame_parse(f->data, f->len, SIZE_MAX, &payload, &plen), 0);
  ck_assert_int_eq(gs_wire_decode_envelope(payload, plen, &env, &body, NULL, 0), 0);
  err = gs_node_beats_decode(q, body.data, body.len, why, len);
  gs_buf_free(&body);
  return err;
}

/* A NodeHeartbeat's columns: 255 beats (the most a node has) encode and
 * decode to the same values, sessions only for the slots that gave one;
 * a 256th is refused. */
START_TEST(node_beats_round_trip)
{
  static gs_node_beats_t q, back;
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;
  gs_buf_t f = {0};

  gs_node_beats_reset(&q, "big");
  for (uint32_t i = 0; i < GS_NODE_BEATS_MAX; i++) {
    req.rank = 100000 + i;
    req.generation = 3;
    req.step = (uint64_t)1 << 40 | i;
    req.loss = 1.0f / (float)(i + 1);
    req.has_progress = i % 2;
    req.progress.phase = gradsync_Phase_PHASE_ALLREDUCE;
    req.progress.collectives_done = 7 * i;
    req.progress.device_waits = i % 3;
    req.progress.comm_waits = i % 5;
    req.progress.state_bytes = (uint64_t)1 << 33 | i;
    ck_assert_int_eq(gs_node_beats_add(&q, i + 1, &req, 2 + i, i == 4 ? "4.abc" : ""), 0);
  }
  ck_assert_int_eq(gs_node_beats_add(&q, 256, &req, 0, ""), GS_ERANGE);
  ck_assert_int_eq(gs_node_beats_encode_frame(&q, &f, &env, SIZE_MAX), 0);
  ck_assert_int_eq(node_beats_from_frame(&f, &back, NULL, 0), 0);
  ck_assert_str_eq(back.msg.job, "big");
  ck_assert_uint_eq(back.count, GS_NODE_BEATS_MAX);
  for (uint32_t i = 0; i < GS_NODE_BEATS_MAX; i++) {
    ck_assert_uint_eq(back.slot[i], i + 1);
    ck_assert_uint_eq(back.rank[i], 100000 + i);
    ck_assert_uint_eq(back.step[i], (uint64_t)1 << 40 | i);
    ck_assert(back.loss[i] == 1.0f / (float)(i + 1));
    ck_assert_int_eq(back.has_progress[i], i % 2);
    ck_assert_uint_eq(back.phase[i], gradsync_Phase_PHASE_ALLREDUCE);
    ck_assert_uint_eq(back.collectives_done[i], 7 * i);
    ck_assert_uint_eq(back.news_seen[i], 2 + i);
    ck_assert_uint_eq(back.device_waits[i], i % 3);
    ck_assert_uint_eq(back.comm_waits[i], i % 5);
    ck_assert_uint_eq(back.state_bytes[i], (uint64_t)1 << 33 | i);
  }
  ck_assert_str_eq(gs_node_beats_session(&back, 5), "4.abc");
  ck_assert_str_eq(gs_node_beats_session(&back, 6), "");
  /* Decoded into the same struct, a beat without job or sessions leaves
   * none of the last one's (the decode skips nanopb's defaults pass). */
  gs_buf_free(&f);
  f = (gs_buf_t){0};
  gs_node_beats_reset(&q, "");
  ck_assert_int_eq(gs_node_beats_add(&q, 9, &req, 0, ""), 0);
  ck_assert_int_eq(gs_node_beats_encode_frame(&q, &f, &env, SIZE_MAX), 0);
  ck_assert_int_eq(node_beats_from_frame(&f, &back, NULL, 0), 0);
  ck_assert_str_eq(back.msg.job, "");
  ck_assert_uint_eq(back.msg.sessions_count, 0);
  ck_assert_uint_eq(back.count, 1);
  ck_assert_uint_eq(back.slot[0], 9);
  ck_assert_str_eq(gs_node_beats_session(&back, 5), "");
  gs_buf_free(&f);
}
END_TEST

/* A node agent older than the wait columns sends none (they are the
 * last fields, so its message is ours without their 2 x 7 bytes and the
 * state bytes' 11): its beats decode, the waits zeros whatever the
 * struct held before; one older than the state bytes only lacks those. */
START_TEST(node_beats_older_agent)
{
  static gs_node_beats_t q, back;
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;
  const uint8_t *payload;
  gs_buf_t f = {0}, body = {0};
  size_t plen;

  gs_node_beats_reset(&q, "j");
  req.rank = 3;
  req.progress.device_waits = req.progress.comm_waits = 5;
  req.progress.state_bytes = 1234;
  ck_assert_int_eq(gs_node_beats_add(&q, 7, &req, 0, ""), 0);
  ck_assert_int_eq(gs_node_beats_encode_frame(&q, &f, &env, SIZE_MAX), 0);
  ck_assert_int_gt(gs_frame_parse(f.data, f.len, SIZE_MAX, &payload, &plen), 0);
  ck_assert_int_eq(gs_wire_decode_envelope(payload, plen, &env, &body, NULL, 0), 0);
  back.device_waits[0] = back.comm_waits[0] = 9;
  back.state_bytes[0] = 9;
  ck_assert_int_eq(gs_node_beats_decode(&back, body.data, body.len - 25, NULL, 0), 0);
  ck_assert_uint_eq(back.count, 1);
  ck_assert_uint_eq(back.rank[0], 3);
  ck_assert_uint_eq(back.device_waits[0], 0);
  ck_assert_uint_eq(back.comm_waits[0], 0);
  ck_assert_uint_eq(back.state_bytes[0], 0);
  ck_assert_int_eq(gs_node_beats_decode(&back, body.data, body.len - 11, NULL, 0), 0);
  ck_assert_uint_eq(back.comm_waits[0], 5);
  ck_assert_uint_eq(back.state_bytes[0], 0);
  ck_assert_int_eq(gs_node_beats_decode(&back, body.data, body.len, NULL, 0), 0);
  ck_assert_uint_eq(back.device_waits[0], 5);
  ck_assert_uint_eq(back.state_bytes[0], 1234);
  gs_buf_free(&body);
  gs_buf_free(&f);
}
END_TEST

/* What is not a NodeHeartbeat is refused: columns of unequal length, a
 * partial value, a bool column holding 2, more than 255 values. */
START_TEST(node_beats_decode_refuses_bad_columns)
{
  static gs_node_beats_t q;
  static const uint8_t uneven[] = {0x12, 4, 1, 0, 0, 0, 0x12, 4, 2, 0, 0, 0}; /* 2 slots, 0 ranks */
  static const uint8_t partial[] = {0x12, 3, 1, 0, 0};
  static const uint8_t bool2[] = {0x52, 1, 2};
  uint8_t long_col[2 + 3 + 256 * 4] = {0x12, 0x80 | (1024 & 0x7f), 1024 >> 7};
  char why[128];

  ck_assert_int_ne(gs_node_beats_decode(&q, uneven, sizeof(uneven), why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, "differ in length"), "%s", why);
  ck_assert_int_ne(gs_node_beats_decode(&q, partial, sizeof(partial), why, sizeof(why)), 0);
  ck_assert_int_ne(gs_node_beats_decode(&q, bool2, sizeof(bool2), why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, "not 0 or 1"), "%s", why);
  ck_assert_int_ne(gs_node_beats_decode(&q, long_col, 3 + 256 * 4, why, sizeof(why)), 0);
  ck_assert_msg(strstr(why, "column too long"), "%s", why);
}
END_TEST

static Suite *frame_suite(void)
{
  Suite *s = suite_create("frame");
  TCase *tc;

  tc = tcase_create("frame_parse");
  tcase_add_test(tc, frame_parse_whole_partial_oversized);
  tcase_add_test(tc, frame_parse_never_reads_past_len);
  suite_add_tcase(s, tc);
  tc = tcase_create("envelope");
  tcase_add_test(tc, envelope_round_trip_with_body);
  tcase_add_test(tc, envelope_decode_rejects_truncation_and_overlong_strings);
  tcase_add_test(tc, wire_encode_empty_message);
  suite_add_tcase(s, tc);
  tc = tcase_create("pb_array");
  tcase_add_test(tc, pb_array_round_trip_and_bound);
  suite_add_tcase(s, tc);
  tc = tcase_create("node_beats");
  tcase_add_test(tc, node_beats_round_trip);
  tcase_add_test(tc, node_beats_decode_refuses_bad_columns);
  tcase_add_test(tc, node_beats_older_agent);
  suite_add_tcase(s, tc);
  tc = tcase_create("buf");
  tcase_add_test(tc, buf_grows_and_consumes);
  suite_add_tcase(s, tc);
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {frame_suite}};
