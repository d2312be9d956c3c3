/* The real coordinator's RPC port: frames split or batched, bad input,
 * idle and unknown calls, node agents speaking for their ranks by slot,
 * heartbeats tied to their connection (coord_calls.h). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "coord_calls.h"
#include "harness.h"
#include "node_beats.h"
#include "runner.h"

START_TEST(bad_input_never_harms_the_service)
{
  th_client_t a, b, c, d, e;
  gradsync_Envelope env;
  gradsync_HeartbeatResponse hb;
  static const uint8_t huge[] = {0x7f, 0xff, 0xff, 0xff};
  static const char garbage[] = "GET / HTTP/1.1\r\n\r\n";
  /* A frame holding an Envelope whose field 1 claims 100 bytes but has 2. */
  static const uint8_t bad_env[] = {0, 0, 0, 4, 0x0a, 100, 'a', 'b'};
  char msg[256];

  /* Connections idle far longer than the test waits: what closes one here
   * is the bad input alone (a loaded machine can starve the test between
   * two calls, or through the 300 heartbeats below, past a short one). */
  th_coord_start(&coord, "--idle-timeout", "600s", "--max-frame", "64KiB", NULL);
  /* Oversized frame: an error reply, then the connection is closed. */
  th_connect(&a, coord.rpc_port);
  th_send_raw(&a, huge, sizeof(huge));
  ck_assert_int_eq(th_recv(&a, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 8);
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  th_close(&a);
  /* HTTP sent to the RPC port reads as an oversized frame too. */
  th_connect(&a, coord.rpc_port);
  th_send_raw(&a, garbage, strlen(garbage));
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  th_close(&a);
  /* An undecodable envelope. */
  th_connect(&b, coord.rpc_port);
  th_send_raw(&b, bad_env, sizeof(bad_env));
  ck_assert_int_eq(th_recv(&b, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  ck_assert(th_closed_by_peer(&b, TH_WAIT_MS));
  th_close(&b);
  /* Unknown method and an undecodable body: error replies, connection kept. */
  th_connect(&c, coord.rpc_port);
  ck_assert_int_eq(th_call(&c, "Dance", NULL, NULL, NULL, NULL, msg, sizeof(msg)), 12);
  ck_assert_ptr_nonnull(strstr(msg, "unknown method"));
  {
    gradsync_PublishRequest junk = gradsync_PublishRequest_init_zero;

    /* A Publish body sent as a Heartbeat: field 4 is bytes there, a uint64 here. */
    snprintf(junk.job, sizeof(junk.job), "x");
    junk.value.size = 3;
    ck_assert_int_eq(th_call(&c, "Heartbeat", gradsync_PublishRequest_fields, &junk, NULL, NULL,
                             msg, sizeof(msg)),
                     3);
  }
  /* Unknown job. */
  ck_assert_int_eq(heartbeat(&c, "ghost", 1, 0, 1, &hb), 5);
  th_close(&c);
  /* Many connections at once, then the service still answers. */
  {
    enum { N = 300 };
    th_client_t many[N];

    for (int i = 0; i < N; i++)
      th_connect(&many[i], coord.rpc_port);
    for (int i = 0; i < N; i++) {
      ck_assert_int_eq(heartbeat(&many[i], "ghost", 1, 0, 1, &hb), 5);
      th_close(&many[i]);
    }
  }
  th_connect(&c, coord.rpc_port);
  {
    gradsync_JoinRequest req = th_join_request("after", 1, "n", 0);
    gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;

    ck_assert_int_eq(th_call(&c, "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp, NULL, 0),
                     OK);
  }
  th_close(&c);
  stop_and_check();
  /* Silence is what closes these two, at a short idle timeout. */
  th_coord_start(&coord, "--idle-timeout", "500ms", NULL);
  /* A truncated frame followed by silence: closed by the idle timeout. */
  th_connect(&d, coord.rpc_port);
  th_send_raw(&d, bad_env, 5);
  ck_assert(th_closed_by_peer(&d, TH_WAIT_MS));
  th_close(&d);
  /* A client that connects and sends nothing. */
  th_connect(&e, coord.rpc_port);
  ck_assert(th_closed_by_peer(&e, TH_WAIT_MS));
  th_close(&e);
  stop_and_check();
}
END_TEST

/* Frames are cut the same whether they come several per read or one byte
 * per read (whole frames are dispatched from the shared read buffer, the
 * rest waits in the connection's own). */
START_TEST(frames_split_or_batched_are_all_answered)
{
  th_client_t cl;
  gradsync_JoinResponse resp[1] = {0};
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero;
  gradsync_HeartbeatResponse got;
  gradsync_Envelope env;
  gs_buf_t frames = {0};

  th_coord_start(&coord, NULL);
  join_all(&cl, resp, false, NULL, 1, "sp");
  snprintf(hb.job, sizeof(hb.job), "sp");
  hb.generation = 1;
  for (uint64_t step = 1; step <= 3; step++) {
    gradsync_Envelope req = gradsync_Envelope_init_zero;

    snprintf(req.method, sizeof(req.method), GS_METHOD_PREFIX "Heartbeat");
    snprintf(req.session, sizeof(req.session), "%s", cl.session);
    req.request_id = 100 + step;
    hb.step = step;
    ck_assert_int_eq(
        gs_wire_encode_frame(&frames, &req, gradsync_HeartbeatRequest_fields, &hb, SIZE_MAX), 0);
  }
  /* Two whole frames and the first byte of the third in one write... */
  th_send_raw(&cl, frames.data, frames.len * 2 / 3 + 1);
  /* ...then the rest of the third one byte at a time. */
  for (size_t i = frames.len * 2 / 3 + 1; i < frames.len; i++) {
    th_send_raw(&cl, frames.data + i, 1);
    usleep(1000);
  }
  for (uint64_t id = 101; id <= 103; id++) {
    memset(&got, 0, sizeof(got));
    ck_assert_int_eq(th_recv(&cl, &env, gradsync_HeartbeatResponse_fields, &got, TH_WAIT_MS), 0);
    ck_assert_int_eq(env.status, OK);
    ck_assert_uint_eq(env.request_id, id);
    ck_assert(!got.abort);
  }
  gs_buf_free(&frames);
  th_close(&cl);
  stop_and_check();
}
END_TEST

/* A connection whose Join waits for the world is not idle, however long it
 * waits; once answered, the idle clock runs again. The idle timeout is a
 * second, so that a loaded machine does not starve the test past it
 * between b's connect and its Join. */
START_TEST(parked_join_outlives_idle_timeout)
{
  th_client_t a, b;
  gradsync_JoinRequest req = th_join_request("idle", 2, "n0", 0);
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Envelope env;

  th_coord_start(&coord, "--idle-timeout", "1s", NULL);
  th_connect(&a, coord.rpc_port);
  th_send(&a, "Join", 0, gradsync_JoinRequest_fields, &req);
  free(th_http_wait(coord.http_port, "/status", "\"rendezvous\":{\"joined\":1,"));
  ck_assert(!th_closed_by_peer(&a, 3000));
  th_connect(&b, coord.rpc_port);
  req = th_join_request("idle", 2, "n0", 1);
  th_send(&b, "Join", 0, gradsync_JoinRequest_fields, &req);
  ck_assert_int_eq(th_recv(&a, &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, OK);
  ck_assert_int_eq(th_recv(&b, &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, OK);
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  ck_assert(th_closed_by_peer(&b, TH_WAIT_MS));
  th_close(&a);
  th_close(&b);
  stop_and_check();
}
END_TEST

/* A reply carries the method of its request (proto/README.md), also when
 * the method is unknown: a client matching replies by method and id can
 * tell what was refused. */
START_TEST(unknown_method_is_echoed)
{
  th_client_t a;
  gradsync_Envelope env;
  uint64_t id;

  th_coord_start(&coord, NULL);
  th_connect(&a, coord.rpc_port);
  id = th_send(&a, "Dance", 0, NULL, NULL);
  ck_assert_int_eq(th_recv(&a, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 12);
  ck_assert_uint_eq(env.request_id, id);
  ck_assert_str_eq(env.method, GS_METHOD_PREFIX "Dance");
  ck_assert_ptr_nonnull(strstr(env.message, "unknown method"));
  /* On a node agent's slot, the answer goes back on that slot (the node
   * agent hands it to its rank), also for a Batch, which is slot 0's. */
  for (int i = 0; i < 2; i++) {
    gradsync_Envelope call = gradsync_Envelope_init_zero;
    gs_buf_t frame = {0};

    snprintf(call.method, sizeof(call.method), GS_METHOD_PREFIX "%s", i ? "Batch" : "Dance");
    call.request_id = 77 + i;
    call.slot = 5;
    ck_assert_int_eq(gs_wire_encode_frame(&frame, &call, NULL, NULL, SIZE_MAX), 0);
    th_send_raw(&a, frame.data, frame.len);
    gs_buf_free(&frame);
    ck_assert_int_eq(th_recv(&a, &env, NULL, NULL, TH_WAIT_MS), 0);
    ck_assert_uint_eq(env.request_id, 77 + i);
    ck_assert_uint_eq(env.slot, 5);
    ck_assert_ptr_nonnull(strstr(env.message, i ? "the connection's own call" : "unknown method"));
  }
  th_close(&a);
  stop_and_check();
}
END_TEST

/* Sends one call for `slot` of a node agent's connection, on its own
 * (no Batch); returns its request id. */
static uint64_t send_for_slot(th_client_t *cl, uint32_t slot, const char *session,
                              const char *method, const pb_msgdesc_t *fields, const void *msg)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_buf_t frame = {0};

  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "%s", method);
  env.request_id = cl->next_id++;
  env.slot = slot;
  snprintf(env.session, sizeof(env.session), "%s", session);
  ck_assert_int_eq(gs_wire_encode_frame(&frame, &env, fields, msg, SIZE_MAX), 0);
  th_send_raw(cl, frame.data, frame.len);
  gs_buf_free(&frame);
  return env.request_id;
}

/* Waits for the reply to Batch `id` and splits it: its n replies. */
static void recv_batch(th_client_t *cl, uint64_t id, gradsync_Envelope *replies, gs_buf_t *bodies,
                       int n)
{
  gradsync_Envelope env;
  gs_buf_t body = {0};

  ck_assert_int_eq(th_recv_body(cl, &env, &body, TH_WAIT_MS), 0);
  ck_assert_str_eq(env.method, GS_METHOD_PREFIX "Batch");
  ck_assert_uint_eq(env.request_id, id);
  ck_assert_msg(env.status == OK, "Batch: %s", env.message);
  ck_assert_int_eq(th_batch_replies(&body, replies, bodies, n), n);
  gs_buf_free(&body);
}

/* A node agent (proto/README.md "Node agents"): one connection speaks for
 * three ranks of node "n" by slot, beside a rank connected directly (a
 * mixed job). The node's Joins, sent as one Batch, are answered in one
 * reply once the rendezvous is complete, in the calls' order and each
 * with its slot; its heartbeats likewise; a call for one slot on its own
 * is answered with the slot. When the node agent's connection closes,
 * its ranks are lost with it and the job says why. */
START_TEST(node_agent_speaks_for_its_ranks)
{
  th_client_t node, direct;
  gs_buf_t batch = {0}, bodies[3] = {{0}};
  gradsync_Envelope env, replies[3];
  gradsync_JoinResponse resp[3], dresp = {0};
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero;
  gradsync_HeartbeatResponse hbr;
  uint64_t ids[3], id;
  char why[128], *body;

  th_coord_start(&coord, NULL);
  th_connect(&node, coord.rpc_port);
  th_connect(&direct, coord.rpc_port);
  for (uint32_t s = 1; s <= 3; s++) {
    gradsync_JoinRequest req = th_join_request("nj", 4, "n", s - 1);

    ids[s - 1] = th_batch_add(&node, &batch, s, NULL, "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  id = th_batch_send(&node, &batch);
  {
    gradsync_JoinRequest req = th_join_request("nj", 4, "z", 0); /* after node "n": rank 3 */

    ck_assert_int_eq(th_call(&direct, "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &dresp, NULL, 0),
                     OK);
  }
  ck_assert_uint_eq(dresp.rank, 3);
  recv_batch(&node, id, replies, bodies, 3);
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert_uint_eq(replies[i].slot, i + 1);
    ck_assert_uint_eq(replies[i].request_id, ids[i]);
    ck_assert_str_eq(replies[i].method, GS_METHOD_PREFIX "Join");
    ck_assert_msg(replies[i].status == OK, "slot %u: %s", i + 1, replies[i].message);
    resp[i] = (gradsync_JoinResponse)gradsync_JoinResponse_init_zero;
    ck_assert_int_eq(gs_wire_decode(bodies[i].data, bodies[i].len, gradsync_JoinResponse_fields,
                                    &resp[i], why, sizeof(why)),
                     0);
    ck_assert_uint_eq(resp[i].rank, i);
    ck_assert_uint_eq(resp[i].generation, 1);
    gs_buf_free(&bodies[i]);
  }
  /* One heartbeat each, in one Batch, each acting with its rank's session. */
  snprintf(hb.job, sizeof(hb.job), "nj");
  hb.generation = 1;
  for (uint32_t i = 0; i < 3; i++) {
    hb.rank = i;
    hb.step = 7;
    ids[i] = th_batch_add(&node, &batch, i + 1, resp[i].session, "Heartbeat", 0,
                          gradsync_HeartbeatRequest_fields, &hb);
  }
  id = th_batch_send(&node, &batch);
  recv_batch(&node, id, replies, bodies, 3);
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert_uint_eq(replies[i].slot, i + 1);
    ck_assert_msg(replies[i].status == OK, "slot %u: %s", i + 1, replies[i].message);
    memset(&hbr, 0, sizeof(hbr));
    ck_assert_int_eq(gs_wire_decode(bodies[i].data, bodies[i].len,
                                    gradsync_HeartbeatResponse_fields, &hbr, why, sizeof(why)),
                     0);
    ck_assert(!hbr.abort);
    gs_buf_free(&bodies[i]);
  }
  /* A call for one slot on its own; a wrong session is that slot's error. */
  hb.rank = 1;
  id = send_for_slot(&node, 2, resp[1].session, "Heartbeat", gradsync_HeartbeatRequest_fields, &hb);
  ck_assert_int_eq(th_recv(&node, &env, gradsync_HeartbeatResponse_fields, &hbr, TH_WAIT_MS), 0);
  ck_assert_uint_eq(env.request_id, id);
  ck_assert_uint_eq(env.slot, 2);
  ck_assert_int_eq(env.status, OK);
  id = send_for_slot(&node, 2, resp[0].session, "Heartbeat", gradsync_HeartbeatRequest_fields, &hb);
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_uint_eq(env.slot, 2);
  ck_assert_int_eq(env.status, 7); /* PERMISSION_DENIED */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/nj", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"step\":7"), "%s", body);
  free(body);
  /* The node agent goes: its three ranks are lost, the direct one told. */
  th_close(&node);
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS;;) {
    ck_assert_int_eq(heartbeat(&direct, "nj", 1, 3, 1, &hbr), OK);
    if (hbr.abort || gs_now_ms() > deadline)
      break;
    usleep(10000);
  }
  ck_assert(hbr.abort);
  ck_assert_msg(strstr(hbr.abort_reason, "its node agent's connection closed"), "%s",
                hbr.abort_reason);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/nj", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "its node agent's connection closed"), "%s", body);
  free(body);
  th_close(&direct);
  stop_and_check();
}
END_TEST

/* What a Batch may not hold is answered in its place, call by call,
 * while the rest of the batch is served: an unknown method, a request id
 * its slot awaits already, a slot past 255, a Batch inside; a Batch
 * itself must be the connection's own (slot 0) and hold 1 to 1024 calls. */
START_TEST(node_agent_batch_errors)
{
  th_client_t node, direct;
  gs_buf_t batch = {0}, bodies[5] = {{0}};
  gradsync_Envelope env, replies[5];
  gradsync_JoinRequest req = th_join_request("ej", 2, "n", 0);
  gradsync_JoinResponse dresp = {0};
  uint64_t first, id;
  int status[5];

  th_coord_start(&coord, NULL);
  th_connect(&node, coord.rpc_port);
  th_connect(&direct, coord.rpc_port);
  first = th_batch_add(&node, &batch, 1, NULL, "Join", 0, gradsync_JoinRequest_fields, &req);
  th_batch_add(&node, &batch, 2, NULL, "Dance", 0, gradsync_JoinRequest_fields, &req);
  node.next_id = first; /* the same slot and request id as the Join, which waits */
  th_batch_add(&node, &batch, 1, NULL, "Join", 0, gradsync_JoinRequest_fields, &req);
  th_batch_add(&node, &batch, 300, NULL, "Join", 0, gradsync_JoinRequest_fields, &req);
  th_batch_add(&node, &batch, 3, NULL, "Batch", 0, gradsync_JoinRequest_fields, &req);
  id = th_batch_send(&node, &batch);
  req = th_join_request("ej", 2, "z", 0);
  ck_assert_int_eq(th_call(&direct, "Join", gradsync_JoinRequest_fields, &req,
                           gradsync_JoinResponse_fields, &dresp, NULL, 0),
                   OK);
  recv_batch(&node, id, replies, bodies, 5);
  for (int i = 0; i < 5; i++) {
    status[i] = replies[i].status;
    gs_buf_free(&bodies[i]);
  }
  ck_assert_int_eq(status[0], OK);
  ck_assert_int_eq(status[1], 12); /* UNIMPLEMENTED */
  ck_assert_msg(strstr(replies[1].message, "unknown method"), "%s", replies[1].message);
  ck_assert_int_eq(status[2], 3); /* INVALID_ARGUMENT */
  ck_assert_msg(strstr(replies[2].message, "already awaits"), "%s", replies[2].message);
  ck_assert_int_eq(status[3], 3);
  ck_assert_msg(strstr(replies[3].message, "slots are 1 to 255"), "%s", replies[3].message);
  ck_assert_int_eq(status[4], 3);
  ck_assert_msg(strstr(replies[4].message, "cannot hold a Batch"), "%s", replies[4].message);
  /* An empty Batch, and one sent for a slot. */
  th_batch_send(&node, &batch);
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  ck_assert_msg(strstr(env.message, "1 to 1024 calls"), "%s", env.message);
  send_for_slot(&node, 1, "", "Batch", NULL, NULL);
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  th_close(&node);
  th_close(&direct);
  stop_and_check();
}
END_TEST

/* Sends the NodeHeartbeat of `n` ranks' beats, rank i on slot slots[i]
 * with news news[i] and session sessions[i]; returns its request id. */
static uint64_t send_node_beats(th_client_t *cl, const gradsync_HeartbeatRequest *beats,
                                const uint32_t *slots, const uint64_t *news,
                                const char *const *sessions, int n)
{
  gradsync_Envelope env = gradsync_Envelope_init_zero;
  gs_node_beats_t *q = calloc(1, sizeof(*q));
  gs_buf_t frame = {0};

  ck_assert_ptr_nonnull(q);
  gs_node_beats_reset(q, beats[0].job);
  for (int i = 0; i < n; i++)
    ck_assert_int_eq(gs_node_beats_add(q, slots[i], &beats[i], news[i], sessions[i]), 0);
  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "NodeHeartbeat");
  env.request_id = cl->next_id++;
  ck_assert_int_eq(gs_node_beats_encode_frame(q, &frame, &env, SIZE_MAX), 0);
  th_send_raw(cl, frame.data, frame.len);
  gs_buf_free(&frame);
  free(q);
  return env.request_id;
}

/* The next frame: a Heartbeat reply for a slot (its body decoded). */
static uint32_t recv_slot_news(th_client_t *cl, uint64_t request_id,
                               gradsync_HeartbeatResponse *resp)
{
  gradsync_Envelope env;

  memset(resp, 0, sizeof(*resp));
  ck_assert_int_eq(th_recv(cl, &env, gradsync_HeartbeatResponse_fields, resp, TH_WAIT_MS), 0);
  ck_assert_str_eq(env.method, GS_METHOD_PREFIX "Heartbeat");
  ck_assert_uint_eq(env.request_id, request_id);
  ck_assert_msg(env.status == OK, "slot %u: %s", env.slot, env.message);
  return env.slot;
}

/* A NodeHeartbeat (proto/README.md): a node's beats in one message, each
 * slot answered only with news. Two ranks joined on slots 1 and 2 beat on
 * slots 3 and 4 (as agents heartbeat on a connection of their own): the
 * first beats, with sessions, are answered with a numbered reply each;
 * the next, without sessions and showing that number, get nothing (the
 * next frame is a probe's reply) yet count (the job's step); a changed
 * directive reaches both slots at once. A beat without a session on a
 * slot its rank never beat from is refused; one for slot 300, a body that
 * is not beats and a NodeHeartbeat inside a Batch are errors. */
START_TEST(node_heartbeat_answers_only_news)
{
  th_client_t node;
  gs_buf_t batch = {0}, bodies[2] = {{0}};
  gradsync_Envelope env, replies[2];
  gradsync_JoinResponse resp[2];
  gradsync_HeartbeatRequest beats[2] = {gradsync_HeartbeatRequest_init_zero,
                                        gradsync_HeartbeatRequest_init_zero};
  gradsync_HeartbeatResponse hbr;
  uint32_t slots[2] = {3, 4};
  uint64_t id, news = 0, probe, seen[2] = {0, 0};
  const char *sessions[2], *none[2] = {"", ""};
  char why[128], *body;

  th_coord_start(&coord, NULL);
  th_connect(&node, coord.rpc_port);
  for (uint32_t s = 1; s <= 2; s++) {
    gradsync_JoinRequest req = th_join_request("nh", 2, "n", s - 1);

    th_batch_add(&node, &batch, s, NULL, "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  recv_batch(&node, th_batch_send(&node, &batch), replies, bodies, 2);
  for (int i = 0; i < 2; i++) {
    resp[i] = (gradsync_JoinResponse)gradsync_JoinResponse_init_zero;
    ck_assert_int_eq(gs_wire_decode(bodies[i].data, bodies[i].len, gradsync_JoinResponse_fields,
                                    &resp[i], why, sizeof(why)),
                     0);
    gs_buf_free(&bodies[i]);
    snprintf(beats[i].job, sizeof(beats[i].job), "nh");
    beats[i].generation = 1;
    beats[i].rank = resp[i].rank;
    beats[i].step = 5;
    sessions[i] = resp[i].session;
  }
  /* First beats: each slot hears its reply, numbered alike. */
  id = send_node_beats(&node, beats, slots, seen, sessions, 2);
  for (int i = 0; i < 2; i++) {
    uint32_t slot = recv_slot_news(&node, id, &hbr);

    ck_assert(slot == 3 || slot == 4);
    ck_assert(!hbr.abort);
    ck_assert_uint_ge(hbr.news, 2);
    ck_assert(news == 0 || news == hbr.news);
    news = hbr.news;
  }
  /* Beats that hold that reply: no answer, but they count. */
  for (int i = 0; i < 2; i++) {
    seen[i] = news;
    beats[i].step = 6;
  }
  id = send_node_beats(&node, beats, slots, seen, none, 2);
  probe = send_for_slot(&node, 1, resp[0].session, "Heartbeat", gradsync_HeartbeatRequest_fields,
                        &beats[0]);
  ck_assert_int_eq(th_recv(&node, &env, gradsync_HeartbeatResponse_fields, &hbr, TH_WAIT_MS), 0);
  ck_assert_msg(env.request_id == probe, "a beat without news was answered (request %llu)",
                (unsigned long long)env.request_id);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/nh", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"step\":6"), "%s", body);
  free(body);
  /* News: both waiting slots hear it, on the last NodeHeartbeat's id. */
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/nh/control", NULL, "{\"lr_scale\": 0.5}", &body),
      200);
  free(body);
  for (int i = 0; i < 2; i++) {
    recv_slot_news(&node, id, &hbr);
    ck_assert(hbr.directives.lr_scale == 0.5f);
    ck_assert_uint_ne(hbr.news, news);
  }
  /* No session, on a slot that never carried the rank's heartbeats. */
  slots[0] = 1;
  send_node_beats(&node, beats, slots, seen, none, 1);
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_uint_eq(env.slot, 1);
  ck_assert_int_eq(env.status, 7); /* PERMISSION_DENIED */
  slots[0] = 300;
  send_node_beats(&node, beats, slots, seen, none, 1);
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  ck_assert_msg(strstr(env.message, "slots are 1 to 255"), "%s", env.message);
  {
    static const uint8_t not_beats[] = {0x15, 1, 2, 3}; /* 3 bytes of a 4-byte column */

    env = (gradsync_Envelope)gradsync_Envelope_init_zero;
    snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "NodeHeartbeat");
    env.request_id = node.next_id++;
    ck_assert_int_eq(
        gs_wire_encode_frame_bytes(&batch, &env, not_beats, sizeof(not_beats), SIZE_MAX), 0);
    th_send_raw(&node, batch.data, batch.len);
    batch.len = 0;
  }
  ck_assert_int_eq(th_recv(&node, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  ck_assert_msg(strstr(env.message, "cannot decode NodeHeartbeatRequest"), "%s", env.message);
  th_batch_add(&node, &batch, 0, NULL, "NodeHeartbeat", 0, gradsync_HeartbeatRequest_fields,
               &beats[1]); /* the body does not matter: refused unread */
  recv_batch(&node, th_batch_send(&node, &batch), replies, bodies, 1);
  gs_buf_free(&bodies[0]);
  ck_assert_int_eq(replies[0].status, 3);
  ck_assert_msg(strstr(replies[0].message, "cannot hold a NodeHeartbeat"), "%s",
                replies[0].message);
  th_close(&node);
  stop_and_check();
}
END_TEST

/* An agent joins on one connection and heartbeats on another (its
 * heartbeat thread's own): the rank's first heartbeat ties it to that
 * connection. Closing the Join connection then loses nothing; a heartbeat
 * for the rank from a third connection is refused (FAILED_PRECONDITION)
 * and takes nothing over; closing the heartbeat connection loses the rank. */
START_TEST(heartbeats_tie_a_rank_to_their_connection)
{
  th_client_t cl[2], hb_conn, intruder;
  char msg[256];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "hc");
  /* Rank 0's heartbeat (with its session) on the connection where rank 1
   * joined and has not heartbeated yet: that connection is rank 1's. */
  {
    gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;
    char own[sizeof(cl[1].session)];

    snprintf(own, sizeof(own), "%s", cl[1].session);
    snprintf(cl[1].session, sizeof(cl[1].session), "%s", cl[0].session);
    snprintf(req.job, sizeof(req.job), "hc");
    req.generation = 1;
    req.rank = resp[0].rank;
    ck_assert_int_eq(th_call(&cl[1], "Heartbeat", gradsync_HeartbeatRequest_fields, &req, NULL,
                             NULL, msg, sizeof(msg)),
                     9);
    ck_assert_msg(strstr(msg, "this connection belongs to rank"), "%s", msg);
    snprintf(cl[1].session, sizeof(cl[1].session), "%s", own);
  }
  th_connect(&hb_conn, coord.rpc_port);
  snprintf(hb_conn.session, sizeof(hb_conn.session), "%s", cl[0].session);
  ck_assert_int_eq(heartbeat(&hb_conn, "hc", 1, resp[0].rank, 1, &hb), OK);
  ck_assert(!hb.abort);
  th_close(&cl[0]);
  /* Once the coordinator has seen the close (3 connections, then 2). */
  free(th_http_wait(coord.http_port, "/status", "\"connections\":2,"));
  ck_assert_int_eq(heartbeat(&cl[1], "hc", 1, resp[1].rank, 1, &hb), OK);
  ck_assert(!hb.abort);
  ck_assert_int_eq(heartbeat(&hb_conn, "hc", 1, resp[0].rank, 2, &hb), OK);
  ck_assert(!hb.abort);
  th_connect(&intruder, coord.rpc_port);
  snprintf(intruder.session, sizeof(intruder.session), "%s", hb_conn.session); /* even so */
  {
    gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

    snprintf(req.job, sizeof(req.job), "hc");
    req.generation = 1;
    req.rank = resp[0].rank;
    ck_assert_int_eq(th_call(&intruder, "Heartbeat", gradsync_HeartbeatRequest_fields, &req, NULL,
                             NULL, msg, sizeof(msg)),
                     9);
    ck_assert_ptr_nonnull(strstr(msg, "another connection"));
  }
  th_close(&intruder);
  free(th_http_wait(coord.http_port, "/status", "\"connections\":2,"));
  ck_assert_int_eq(heartbeat(&cl[1], "hc", 1, resp[1].rank, 2, &hb), OK);
  ck_assert(!hb.abort);
  th_close(&hb_conn);
  /* Heartbeats go on until the coordinator has seen that close. */
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS;;) {
    ck_assert_int_eq(heartbeat(&cl[1], "hc", 1, resp[1].rank, 2, &hb), OK);
    if (hb.abort || gs_now_ms() > deadline)
      break;
    usleep(10000);
  }
  ck_assert(hb.abort);
  ck_assert_ptr_nonnull(strstr(hb.abort_reason, "connection closed"));
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

static Suite *coordinator_wire_suite(void)
{
  const gs_test_case_t cases[] = {
      {"bad_input", bad_input_never_harms_the_service},
      {"framing", frames_split_or_batched_are_all_answered},
      {"idle_parked", parked_join_outlives_idle_timeout},
      {"unknown_method", unknown_method_is_echoed},
      {"node_agent", node_agent_speaks_for_its_ranks},
      {"node_agent_errors", node_agent_batch_errors},
      {"node_heartbeat", node_heartbeat_answers_only_news},
      {"heartbeat_connection", heartbeats_tie_a_rank_to_their_connection},
  };

  return GS_TEST_SUITE_OF("coordinator_wire", cases, 60, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {coordinator_wire_suite}};
