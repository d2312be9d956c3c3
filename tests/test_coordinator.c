/* The coordinator through real sockets: the real binary runs as a child
 * process on free ports; each test starts its own and checks that it
 * exits cleanly (under ASan that includes no leaks). This file: jobs
 * over RPC (rendezvous, refusals, tokens, blobs, pack lists, heartbeats,
 * aborts, restarts, retention, the job cap); test_coordinator_http.c its
 * HTTP views and control, test_coordinator_wire.c the RPC port's framing,
 * bad input and node agents (the calls they share: coord_calls.h). */
#include <cJSON.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "coord_calls.h"
#include "harness.h"
#include "runner.h"

START_TEST(rendezvous_assigns_sorted_ranks)
{
  uint32_t n = 64;
  th_client_t cl[64];
  gradsync_JoinResponse resp[64] = {0};
  gs_pb_array_t arrs[64];

  th_coord_start(&coord, NULL);
  join_all(cl, resp, true, arrs, n, "big");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t k = (i * 7 + 3) % n;
    const gradsync_Peer *p = arrs[i].items;

    /* node%02u/local_rank sorted: rank = node*4 + local_rank = k. */
    ck_assert_uint_eq(resp[i].rank, k);
    ck_assert_uint_eq(resp[i].world_size, n);
    ck_assert_uint_eq(resp[i].generation, 1);
    ck_assert_uint_eq(resp[i].heartbeat_interval_ms, 1000);
    ck_assert_uint_eq(arrs[i].count, n);
    for (uint32_t r = 0; r < n; r++) {
      char addr[64];

      ck_assert_uint_eq(p[r].rank, r);
      ck_assert_uint_eq(p[r].local_rank, r % 4);
      snprintf(addr, sizeof(addr), "node%02u:%u", r / 4, 9000 + r % 4);
      ck_assert_str_eq(p[r].comm_addr, addr);
    }
    gs_pb_array_free(&arrs[i]);
    th_close(&cl[i]);
  }
  stop_and_check();
}
END_TEST

START_TEST(ring_peers_list_neighbours_only)
{
  th_client_t cl[3];
  gradsync_JoinRequest req;
  gs_pb_array_t arr[3];

  th_coord_start(&coord, NULL);
  for (uint32_t i = 0; i < 3; i++) {
    char node[8];

    snprintf(node, sizeof(node), "n%u", i);
    req = th_join_request("ring", 3, node, 0);
    req.peers = gradsync_PeerSet_PEERS_RING;
    th_connect(&cl[i], coord.rpc_port);
    th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  for (uint32_t i = 0; i < 3; i++) {
    gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
    gradsync_Envelope env;
    const gradsync_Peer *p;

    gs_pb_array_init(&arr[i], gradsync_Peer_fields, sizeof(gradsync_Peer), 8);
    gs_pb_array_bind_decode(&resp.peers, &arr[i]);
    ck_assert_int_eq(th_recv(&cl[i], &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
    ck_assert_int_eq(env.status, OK);
    p = arr[i].items;
    ck_assert_uint_eq(arr[i].count, 2);
    ck_assert_uint_eq(p[0].rank, (resp.rank + 2) % 3);
    ck_assert_uint_eq(p[1].rank, (resp.rank + 1) % 3);
    gs_pb_array_free(&arr[i]);
    th_close(&cl[i]);
  }
  stop_and_check();
}
END_TEST

START_TEST(join_refusals_name_the_difference)
{
  th_client_t a, b, c, d;
  gradsync_JoinRequest req;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Envelope env;
  char msg[512];

  th_coord_start(&coord, NULL);
  th_connect(&a, coord.rpc_port);
  th_connect(&b, coord.rpc_port);
  req = th_join_request("j", 2, "n0", 0);
  th_send(&a, "Join", 0, gradsync_JoinRequest_fields, &req);
  free(th_http_wait(coord.http_port, "/status", "\"rendezvous\":{\"joined\":1,"));
  /* World size disagreement: refused at once. */
  req = th_join_request("j", 3, "n1", 0);
  ck_assert_int_eq(
      th_call(&b, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 3);
  ck_assert_ptr_nonnull(strstr(msg, "world size 3 disagrees with 2"));
  /* Bad input. */
  req = th_join_request("bad name!", 2, "n1", 0);
  ck_assert_int_eq(
      th_call(&b, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 3);
  ck_assert_ptr_nonnull(strstr(msg, "job name"));
  req = th_join_request("j", 0, "n1", 0);
  ck_assert_int_eq(
      th_call(&b, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 3);
  ck_assert_ptr_nonnull(strstr(msg, "world_size 0"));
  /* A duplicate (node, local_rank) is refused at once. */
  req = th_join_request("j", 2, "n0", 0);
  th_send(&b, "Join", 0, gradsync_JoinRequest_fields, &req);
  ck_assert_int_eq(th_recv(&b, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 6);
  ck_assert_ptr_nonnull(strstr(env.message, "local_rank 0 already joined"));
  /* A different model fails the whole rendezvous, for every member. */
  th_connect(&c, coord.rpc_port);
  req = th_join_request("j", 2, "n1", 0);
  req.model_signature.param_count = 8;
  th_send(&c, "Join", 0, gradsync_JoinRequest_fields, &req);
  ck_assert_int_eq(th_recv(&c, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 3);
  ck_assert_ptr_nonnull(strstr(env.message, "param_count 8 vs 6"));
  ck_assert_int_eq(th_recv(&a, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 9);
  ck_assert_ptr_nonnull(strstr(env.message, "unlike rank 0's"));
  /* The job can rendezvous again afterwards, and refuses a join while running. */
  req = th_join_request("j", 2, "n0", 0);
  th_send(&a, "Join", 0, gradsync_JoinRequest_fields, &req);
  req = th_join_request("j", 2, "n1", 0);
  ck_assert_int_eq(th_call(&c, "Join", gradsync_JoinRequest_fields, &req,
                           gradsync_JoinResponse_fields, &resp, NULL, 0),
                   OK);
  ck_assert_uint_eq(resp.rank, 1);
  ck_assert_int_eq(th_recv(&a, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, OK);
  th_connect(&d, coord.rpc_port);
  req = th_join_request("j", 2, "n2", 0);
  ck_assert_int_eq(
      th_call(&d, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 9);
  ck_assert_ptr_nonnull(strstr(msg, "running generation 1"));
  th_close(&a);
  th_close(&b);
  th_close(&c);
  th_close(&d);
  stop_and_check();
}
END_TEST

/* Sends a Join for (node, local_rank) asking for `rank` (-1: none). */
static void join_asking(th_client_t *cl, const char *job, uint32_t world, const char *node,
                        uint32_t local_rank, int rank)
{
  gradsync_JoinRequest req = th_join_request(job, world, node, local_rank);

  req.has_rank = rank >= 0;
  req.rank = rank >= 0 ? (uint32_t)rank : 0;
  th_connect(cl, coord.rpc_port);
  th_send(cl, "Join", 0, gradsync_JoinRequest_fields, &req);
}

/* A member's Join answer: its rank, or the status with `msg` in its text. */
static uint32_t joined_rank(th_client_t *cl)
{
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Envelope env;

  ck_assert_int_eq(th_recv(cl, &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
  ck_assert_msg(env.status == OK, "%s", env.message);
  return resp.rank;
}

static void join_refused(th_client_t *cl, int status, const char *msg)
{
  gradsync_Envelope env;

  ck_assert_int_eq(th_recv(cl, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, status);
  ck_assert_msg(strstr(env.message, msg), "%s", env.message);
}

/* A launcher's numbering (JoinRequest.rank) is the rank each member gets,
 * whatever the node names sort as; members without one fill the rest in
 * (node, local_rank) order. Two asking for one rank fail the rendezvous. */
START_TEST(asked_ranks_are_given)
{
  th_client_t cl[5];

  th_coord_start(&coord, NULL);
  /* Node "zz" is node rank 0, "aa" node rank 1: the names sort the other way. */
  join_asking(&cl[0], "asked", 4, "aa", 1, 3);
  join_asking(&cl[1], "asked", 4, "zz", 0, 0);
  join_asking(&cl[2], "asked", 4, "aa", 0, 2);
  join_asking(&cl[3], "asked", 4, "zz", 1, 1);
  ck_assert_uint_eq(joined_rank(&cl[0]), 3);
  ck_assert_uint_eq(joined_rank(&cl[1]), 0);
  ck_assert_uint_eq(joined_rank(&cl[2]), 2);
  ck_assert_uint_eq(joined_rank(&cl[3]), 1);
  for (int i = 0; i < 4; i++)
    th_close(&cl[i]);
  /* Mixed: asked ranks 0 and 2 hold; the others take 1 and 3 by node. */
  join_asking(&cl[0], "mixed", 4, "c", 0, 2);
  join_asking(&cl[1], "mixed", 4, "b", 0, -1);
  join_asking(&cl[2], "mixed", 4, "d", 0, 0);
  join_asking(&cl[3], "mixed", 4, "a", 0, -1);
  ck_assert_uint_eq(joined_rank(&cl[0]), 2);
  ck_assert_uint_eq(joined_rank(&cl[1]), 3);
  ck_assert_uint_eq(joined_rank(&cl[2]), 0);
  ck_assert_uint_eq(joined_rank(&cl[3]), 1);
  for (int i = 0; i < 4; i++)
    th_close(&cl[i]);
  /* Refused at once: a rank past the world, a rank in an elastic job. */
  join_asking(&cl[0], "bad", 2, "a", 0, 2);
  join_refused(&cl[0], 3, "rank 2 is not below world_size 2");
  th_close(&cl[0]);
  {
    gradsync_JoinRequest req = th_join_request("elastic", 4, "a", 0);

    req.world_min = 2;
    req.has_rank = true;
    th_connect(&cl[0], coord.rpc_port);
    th_send(&cl[0], "Join", 0, gradsync_JoinRequest_fields, &req);
    join_refused(&cl[0], 3, "an elastic job numbers its ranks");
    th_close(&cl[0]);
  }
  /* Two nodes started as one node rank: both asked ranks 0 and 1. The
   * rendezvous fails, naming the clash: INVALID_ARGUMENT to the two that
   * asked for rank 0 (the first clash), FAILED_PRECONDITION to the rest. */
  join_asking(&cl[0], "clash", 4, "a", 0, 0);
  join_asking(&cl[1], "clash", 4, "a", 1, 1);
  join_asking(&cl[2], "clash", 4, "b", 0, 0);
  join_asking(&cl[3], "clash", 4, "b", 1, 1);
  join_refused(&cl[0], 3,
               "node 'a' local_rank 0 and node 'b' local_rank 0 were both started "
               "as rank 0 of job clash");
  join_refused(&cl[2], 3, "both started as rank 0");
  join_refused(&cl[1], 9, "both started as rank 0");
  join_refused(&cl[3], 9, "both started as rank 0");
  for (int i = 0; i < 4; i++)
    th_close(&cl[i]);
  stop_and_check();
}
END_TEST

START_TEST(token_is_required_when_set)
{
  th_client_t a;
  gradsync_JoinRequest req = th_join_request("t", 1, "n0", 0);
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  char msg[256];

  th_coord_start(&coord, "--token", "s3cret", NULL);
  th_connect(&a, coord.rpc_port);
  ck_assert_int_eq(
      th_call(&a, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 16);
  ck_assert_str_eq(msg, "missing token");
  /* One error reply, then the coordinator closes an unauthenticated
   * connection: a client without the token gets nothing more. */
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  th_close(&a);
  th_connect(&a, coord.rpc_port);
  a.token = "s3cre";
  ck_assert_int_eq(
      th_call(&a, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 16);
  ck_assert_str_eq(msg, "wrong token");
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  th_close(&a);
  /* A token shaped like a job's, of no use for the job the body names, is
   * refused before the rest of the body is decoded: this one does not
   * decode (a Publish body sent as a Heartbeat), and the answer is still
   * UNAUTHENTICATED, not a decoding error. */
  th_connect(&a, coord.rpc_port);
  a.token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  {
    gradsync_PublishRequest junk = gradsync_PublishRequest_init_zero;

    snprintf(junk.job, sizeof(junk.job), "t");
    junk.value.size = 3;
    ck_assert_int_eq(th_call(&a, "Heartbeat", gradsync_PublishRequest_fields, &junk, NULL, NULL,
                             msg, sizeof(msg)),
                     16);
    ck_assert_str_eq(msg, "wrong token (not the coordinator's, not job t's)");
  }
  ck_assert(th_closed_by_peer(&a, TH_WAIT_MS));
  th_close(&a);
  th_connect(&a, coord.rpc_port);
  a.token = "s3cret";
  ck_assert_int_eq(th_call(&a, "Join", gradsync_JoinRequest_fields, &req,
                           gradsync_JoinResponse_fields, &resp, NULL, 0),
                   OK);
  th_close(&a);
  stop_and_check();
}
END_TEST

/* One job may gather at most half of --max-connections ranks (each holds
 * two connections once it trains): a larger world is refused at its first
 * Join, and a job that parks all the Joins it may leaves room for
 * another job's agents to connect and start. */
START_TEST(one_job_gathers_at_most_half_the_connections)
{
  th_client_t big, a[9], b[2];
  gradsync_JoinRequest req = th_join_request("big", 64, "n", 0);
  gradsync_JoinResponse resp[2] = {0};
  char msg[256];

  th_coord_start(&coord, "--max-connections", "20", NULL);
  th_connect(&big, coord.rpc_port);
  ck_assert_int_eq(
      th_call(&big, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 8);
  ck_assert_msg(strstr(msg, "world_size 64 is more than one job may gather on this coordinator: "
                            "10, half of --max-connections"),
                "%s", msg);
  /* Behind a node agent the ranks hold no connection each: no such cap. */
  {
    gs_buf_t batch = {0}, body = {0};
    gradsync_Envelope env;

    th_batch_add(&big, &batch, 1, NULL, "Join", 100, gradsync_JoinRequest_fields, &req);
    th_batch_send(&big, &batch);
    ck_assert_int_eq(th_recv_body(&big, &env, &batch, TH_WAIT_MS), 0);
    ck_assert_int_eq(th_batch_replies(&batch, &env, &body, 1), 1);
    ck_assert_msg(env.status == 4, "%s", env.message); /* DEADLINE_EXCEEDED: it waited */
    gs_buf_free(&batch);
    gs_buf_free(&body);
  }
  th_close(&big);
  for (uint32_t i = 0; i < 9; i++) { /* one short of its world of 10: all wait */
    gradsync_JoinRequest r = th_join_request("a", 10, "n", i);

    th_connect(&a[i], coord.rpc_port);
    th_send(&a[i], "Join", 0, gradsync_JoinRequest_fields, &r);
  }
  free(th_http_wait(coord.http_port, "/jobs/a", "\"joined\":9"));
  for (uint32_t i = 0; i < 2; i++) {
    gradsync_JoinRequest r = th_join_request("b", 2, "m", i);

    th_connect(&b[i], coord.rpc_port);
    th_send(&b[i], "Join", 0, gradsync_JoinRequest_fields, &r);
  }
  for (uint32_t i = 0; i < 2; i++) {
    gradsync_Envelope env;

    ck_assert_int_eq(th_recv(&b[i], &env, gradsync_JoinResponse_fields, &resp[i], TH_WAIT_MS), 0);
    ck_assert_int_eq(env.status, OK);
    ck_assert_uint_eq(resp[i].generation, 1);
  }
  for (uint32_t i = 0; i < 9; i++)
    th_close(&a[i]);
  th_close(&b[0]);
  th_close(&b[1]);
  stop_and_check();
}
END_TEST

START_TEST(fetch_waits_for_publish)
{
  th_client_t cl[2];
  gradsync_PublishRequest pub = gradsync_PublishRequest_init_zero;
  gradsync_FetchRequest fetch = gradsync_FetchRequest_init_zero;
  gradsync_FetchResponse got = gradsync_FetchResponse_init_zero;
  gradsync_Envelope env;
  char msg[256];

  th_coord_start(&coord, NULL);
  start_world(cl, 2, "b");
  snprintf(fetch.job, sizeof(fetch.job), "b");
  fetch.generation = 1;
  snprintf(fetch.key, sizeof(fetch.key), "nccl_id");
  th_send(&cl[1], "Fetch", TH_WAIT_MS, gradsync_FetchRequest_fields, &fetch);
  /* The coordinator has it, and has not answered it before the publish. */
  free(th_http_wait(coord.http_port, "/metrics",
                    "gradsync_rpc_requests_total{method=\"Fetch\"} 1\n"));
  ck_assert_int_eq(th_recv(&cl[1], &env, NULL, NULL, 200), -1);
  snprintf(pub.job, sizeof(pub.job), "b");
  pub.generation = 1;
  snprintf(pub.key, sizeof(pub.key), "nccl_id");
  pub.value.size = 128;
  memset(pub.value.bytes, 0xab, 128);
  ck_assert_int_eq(
      th_call(&cl[0], "Publish", gradsync_PublishRequest_fields, &pub, NULL, NULL, NULL, 0), OK);
  ck_assert_int_eq(th_recv(&cl[1], &env, gradsync_FetchResponse_fields, &got, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, OK);
  ck_assert_uint_eq(got.value.size, 128);
  ck_assert_uint_eq(got.value.bytes[127], 0xab);
  /* Publishing a different value under the same key is refused. */
  pub.value.bytes[0] = 1;
  ck_assert_int_eq(th_call(&cl[0], "Publish", gradsync_PublishRequest_fields, &pub, NULL, NULL, msg,
                           sizeof(msg)),
                   6);
  /* A fetch of a blob never published ends at its deadline. */
  snprintf(fetch.key, sizeof(fetch.key), "never");
  th_send(&cl[1], "Fetch", 300, gradsync_FetchRequest_fields, &fetch);
  ck_assert_int_eq(th_recv(&cl[1], &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_int_eq(env.status, 4);
  /* Wrong generation. */
  fetch.generation = 7;
  ck_assert_int_eq(
      th_call(&cl[1], "Fetch", gradsync_FetchRequest_fields, &fetch, NULL, NULL, msg, sizeof(msg)),
      9);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* A pack list request for 3 params, in 2 packs. */
typedef struct pl_fixture {
  gradsync_PublishPackListRequest req;
  gradsync_ParamInfo params[3];
  uint32_t sizes[2], order[3];
  gs_pb_array_t a_params, a_sizes, a_order;
} pl_fixture_t;

static void pl_init(pl_fixture_t *f, uint32_t rank)
{
  static const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight"};
  static const uint64_t elems[] = {100, 10, 200};

  memset(f, 0, sizeof(*f));
  snprintf(f->req.job, sizeof(f->req.job), "p");
  f->req.generation = 1;
  f->req.rank = rank;
  f->req.has_pack_list = true;
  f->req.pack_list.threshold_bytes = 1000;
  for (int i = 0; i < 3; i++) {
    snprintf(f->params[i].name, sizeof(f->params[i].name), "%s", names[i]);
    f->params[i].elements = elems[i];
  }
  f->sizes[0] = 1;
  f->sizes[1] = 2;
  f->order[0] = 2;
  f->order[1] = 1;
  f->order[2] = 0;
  gs_pb_array_view(&f->a_params, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), f->params,
                   3);
  gs_pb_array_view(&f->a_sizes, NULL, sizeof(uint32_t), f->sizes, 2);
  gs_pb_array_view(&f->a_order, NULL, sizeof(uint32_t), f->order, 3);
  gs_pb_array_bind_encode(&f->req.pack_list.params, &f->a_params);
  gs_pb_array_bind_encode(&f->req.pack_list.pack_sizes, &f->a_sizes);
  gs_pb_array_bind_encode(&f->req.pack_list.pack_params, &f->a_order);
}

START_TEST(pack_list_published_by_rank0_reaches_all)
{
  th_client_t cl[2];
  pl_fixture_t f;
  gradsync_FetchPackListRequest fetch = gradsync_FetchPackListRequest_init_zero;
  gradsync_FetchPackListResponse got = gradsync_FetchPackListResponse_init_zero;
  gs_pb_array_t g_params, g_sizes, g_order;
  gradsync_Envelope env;
  char msg[512], *body;
  cJSON *doc, *pl;

  th_coord_start(&coord, NULL);
  {
    gradsync_JoinResponse resp[2] = {0};
    /* The fixture's model has 3 params: join with that signature. */
    for (uint32_t i = 0; i < 2; i++) {
      gradsync_JoinRequest req = th_join_request("p", 2, i ? "b" : "a", 0);

      req.model_signature.param_count = 3;
      th_connect(&cl[i], coord.rpc_port);
      th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
    }
    for (uint32_t i = 0; i < 2; i++) {
      ck_assert_int_eq(th_recv(&cl[i], &env, gradsync_JoinResponse_fields, &resp[i], TH_WAIT_MS),
                       0);
      ck_assert_int_eq(env.status, OK);
      ck_assert_uint_eq(resp[i].rank, i);
    }
  }
  snprintf(fetch.job, sizeof(fetch.job), "p");
  fetch.generation = 1;
  th_send(&cl[1], "FetchPackList", TH_WAIT_MS, gradsync_FetchPackListRequest_fields, &fetch);
  free(th_http_wait(coord.http_port, "/metrics",
                    "gradsync_rpc_requests_total{method=\"FetchPackList\"} 1\n"));
  ck_assert_int_eq(th_recv(&cl[1], &env, NULL, NULL, 200), -1);
  /* Only rank 0 may publish. */
  pl_init(&f, 1);
  ck_assert_int_eq(th_call(&cl[1], "PublishPackList", gradsync_PublishPackListRequest_fields,
                           &f.req, NULL, NULL, msg, sizeof(msg)),
                   7);
  /* An invalid list is refused with the reason. */
  pl_init(&f, 0);
  f.order[2] = 1;
  ck_assert_int_eq(th_call(&cl[0], "PublishPackList", gradsync_PublishPackListRequest_fields,
                           &f.req, NULL, NULL, msg, sizeof(msg)),
                   3);
  ck_assert_ptr_nonnull(strstr(msg, "invalid pack list"));
  pl_init(&f, 0);
  f.req.pack_list.threshold_bytes = 100; /* pack 1 holds 2 params over it */
  ck_assert_int_eq(th_call(&cl[0], "PublishPackList", gradsync_PublishPackListRequest_fields,
                           &f.req, NULL, NULL, msg, sizeof(msg)),
                   3);
  pl_init(&f, 0);
  ck_assert_int_eq(th_call(&cl[0], "PublishPackList", gradsync_PublishPackListRequest_fields,
                           &f.req, NULL, NULL, msg, sizeof(msg)),
                   OK);
  gs_pb_array_init(&g_params, gradsync_ParamInfo_fields, sizeof(gradsync_ParamInfo), 16);
  gs_pb_array_init(&g_sizes, NULL, sizeof(uint32_t), 16);
  gs_pb_array_init(&g_order, NULL, sizeof(uint32_t), 16);
  gs_pb_array_bind_decode(&got.pack_list.params, &g_params);
  gs_pb_array_bind_decode(&got.pack_list.pack_sizes, &g_sizes);
  gs_pb_array_bind_decode(&got.pack_list.pack_params, &g_order);
  ck_assert_int_eq(th_recv(&cl[1], &env, gradsync_FetchPackListResponse_fields, &got, TH_WAIT_MS),
                   0);
  ck_assert_int_eq(env.status, OK);
  ck_assert_uint_eq(got.pack_list.threshold_bytes, 1000);
  ck_assert_uint_eq(g_params.count, 3);
  ck_assert_str_eq(((gradsync_ParamInfo *)g_params.items)[2].name, "fc2.weight");
  ck_assert_uint_eq(g_sizes.count, 2);
  ck_assert_uint_eq(((uint32_t *)g_order.items)[0], 2);
  gs_pb_array_free(&g_params);
  gs_pb_array_free(&g_sizes);
  gs_pb_array_free(&g_order);
  /* Shown in status. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/p", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  pl = cJSON_GetObjectItem(doc, "pack_list");
  ck_assert_int_eq(cJSON_GetObjectItem(pl, "packs")->valueint, 2);
  ck_assert_int_eq(cJSON_GetObjectItem(pl, "params")->valueint, 3);
  ck_assert_int_eq(cJSON_GetObjectItem(pl, "bytes")->valueint, 1240);
  ck_assert_int_eq(cJSON_GetObjectItem(pl, "largest_pack_bytes")->valueint, 800);
  cJSON_Delete(doc);
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* Everyone but one rank keeps heartbeating, every 100 ms: the silent one
 * is lost after 3 s, a timeout that a loaded machine does not reach by
 * starving the test between two heartbeats of the others (at 400 ms it
 * did: the reason named another rank). */
START_TEST(silent_rank_aborts_generation_then_rejoin)
{
  th_client_t cl[3];
  gradsync_JoinResponse resp[3] = {0};
  gradsync_HeartbeatResponse hb;
  uint32_t quiet = 2;

  th_coord_start(&coord, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "3s", NULL);
  join_all(cl, resp, false, NULL, 3, "h");
  for (uint64_t t = 0, deadline = gs_now_ms() + TH_WAIT_MS; gs_now_ms() < deadline; t++) {
    for (uint32_t i = 0; i < 3; i++) {
      if (resp[i].rank == quiet)
        continue;
      ck_assert_int_eq(heartbeat(&cl[i], "h", 1, resp[i].rank, t, &hb), OK);
      if (hb.abort)
        goto aborted;
    }
    usleep(100000);
  }
  ck_abort_msg("the silent rank was never declared lost");
aborted:
  ck_assert_ptr_nonnull(strstr(hb.abort_reason, "rank 2"));
  ck_assert_ptr_nonnull(strstr(hb.abort_reason, "no heartbeat"));
  /* Every other rank hears it too. */
  for (uint32_t i = 0; i < 3; i++) {
    ck_assert_int_eq(heartbeat(&cl[i], "h", 1, resp[i].rank, 99, &hb), OK);
    ck_assert(hb.abort);
  }
  /* A second rendezvous on the same connections starts generation 2. */
  for (uint32_t i = 0; i < 3; i++) {
    char node[32];
    uint32_t k = (i * 7 + 3) % 3;
    gradsync_JoinRequest req;

    snprintf(node, sizeof(node), "node%02u", k / 4);
    req = th_join_request("h", 3, node, k % 4);
    th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  for (uint32_t i = 0; i < 3; i++) {
    gradsync_Envelope env;

    ck_assert_int_eq(th_recv(&cl[i], &env, gradsync_JoinResponse_fields, &resp[i], TH_WAIT_MS), 0);
    ck_assert_msg(env.status == OK, "%s", env.message);
    ck_assert_uint_eq(resp[i].generation, 2);
  }
  ck_assert_int_eq(heartbeat(&cl[0], "h", 2, resp[0].rank, 1, &hb), OK);
  ck_assert(!hb.abort);
  /* The old generation is told it was superseded. */
  ck_assert_int_eq(heartbeat(&cl[0], "h", 1, resp[0].rank, 1, &hb), OK);
  ck_assert(hb.abort);
  ck_assert_ptr_nonnull(strstr(hb.abort_reason, "superseded"));
  for (uint32_t i = 0; i < 3; i++)
    th_close(&cl[i]);
  stop_and_check();
}
END_TEST

START_TEST(dropped_connection_aborts_generation)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  char *body;
  cJSON *doc;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "d");
  th_close(&cl[1]);
  /* Heartbeats go on until the coordinator has seen the close. */
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS;;) {
    ck_assert_int_eq(heartbeat(&cl[0], "d", 1, resp[0].rank, 1, &hb), OK);
    if (hb.abort || gs_now_ms() > deadline)
      break;
    usleep(10000);
  }
  ck_assert(hb.abort);
  ck_assert_ptr_nonnull(strstr(hb.abort_reason, "connection closed"));
  /* The job is failed, with the reason, until agents Join again. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/d", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_ptr_nonnull(doc);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "state")->valuestring, "failed");
  ck_assert_ptr_nonnull(
      strstr(cJSON_GetObjectItem(doc, "reason")->valuestring, "lost: connection closed"));
  cJSON_Delete(doc);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/metrics", NULL, NULL, &body), 200);
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_state{job=\"d\",state=\"failed\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_failed{job=\"d\",reason=\"rank "));
  free(body);
  th_close(&cl[0]);
  stop_and_check();
}
END_TEST

/* A rank that sends its final Leave(finished) and closes its connection at
 * once, without waiting for the answer, is not lost: the other rank goes
 * on, and when it finishes too the job is finished. */
START_TEST(leave_then_close_loses_nothing)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;
  char *body;
  cJSON *doc;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "lc");
  snprintf(lv.job, sizeof(lv.job), "lc");
  lv.generation = 1;
  lv.finished = true;
  lv.rank = resp[0].rank;
  th_send(&cl[0], "Leave", 0, gradsync_LeaveRequest_fields, &lv);
  th_close(&cl[0]);
  /* Once the coordinator took the Leave and saw the close: one rank left,
   * none lost, and the other's heartbeat hears no abort. */
  free(th_http_wait(coord.http_port, "/status", "\"connections\":1,"));
  body = th_http_wait(coord.http_port, "/jobs/lc", "\"left\":1,");
  ck_assert_ptr_nonnull(strstr(body, "\"lost\":0,"));
  free(body);
  ck_assert_int_eq(heartbeat(&cl[1], "lc", 1, resp[1].rank, 1, &hb), OK);
  ck_assert(!hb.abort);
  lv.rank = resp[1].rank;
  for (int i = 0; i < 2; i++) /* a retried Leave is OK */
    ck_assert_int_eq(
        th_call(&cl[1], "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0), OK);
  th_close(&cl[1]);
  body = th_http_wait(coord.http_port, "/jobs/lc", "\"state\":\"finished\"");
  doc = cJSON_Parse(body);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "state")->valuestring, "finished");
  cJSON_Delete(doc);
  free(body);
  stop_and_check();
}
END_TEST

START_TEST(rendezvous_times_out)
{
  th_client_t a;
  gradsync_JoinRequest req = th_join_request("r", 2, "n0", 0);
  char msg[256];

  th_coord_start(&coord, "--rendezvous-timeout", "300ms", NULL);
  th_connect(&a, coord.rpc_port);
  ck_assert_int_eq(
      th_call(&a, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 4);
  ck_assert_ptr_nonnull(strstr(msg, "1 of 2 agents joined"));
  th_close(&a);
  stop_and_check();
}
END_TEST

/* At --max-connections, connections that passed the token check but hold
 * no rank (left open after a call) are closed once idle long enough
 * (--vacant-idle, 10 s by default; 1 s here), to admit a new one: a client
 * cannot hold the port with them. */
START_TEST(vacant_connections_make_room)
{
  th_client_t hold[4], c;
  gradsync_HeartbeatResponse hb;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_JoinRequest req = th_join_request("late", 1, "n", 0);
  bool joined = false;

  th_coord_start(&coord, "--max-connections", "4", "--vacant-idle", "1s", NULL);
  for (int i = 0; i < 4; i++) {
    th_connect(&hold[i], coord.rpc_port);
    ck_assert_int_eq(heartbeat(&hold[i], "ghost", 1, 0, 1, &hb), 5); /* authenticated, no rank */
  }
  /* New connections are refused until the oldest has been idle long
   * enough; then one is closed and the Join is answered. */
  for (uint64_t deadline = gs_now_ms() + 4 * TH_WAIT_MS; !joined && gs_now_ms() < deadline;) {
    gradsync_Envelope env;

    th_connect(&c, coord.rpc_port);
    th_send(&c, "Join", 0, gradsync_JoinRequest_fields, &req);
    joined =
        th_recv(&c, &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS) == 0 && env.status == OK;
    th_close(&c);
    if (!joined)
      usleep(100 * 1000); /* pacing only: the loop ends on the answer */
  }
  ck_assert_msg(joined, "no connection admitted while vacant ones held --max-connections");
  for (int i = 0; i < 4; i++)
    th_close(&hold[i]);
  stop_and_check();
}
END_TEST

START_TEST(agents_rebuild_state_after_restart)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  uint64_t first_id;
  char *body, sessions[2][48];
  cJSON *doc, *job;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "re");
  ck_assert_int_eq(heartbeat(&cl[0], "re", 1, resp[0].rank, 5, &hb), OK);
  first_id = hb.coordinator_id;
  th_coord_kill(&coord);
  th_close(&cl[0]);
  th_close(&cl[1]);
  th_coord_start(&coord, NULL);
  /* A heartbeat to the new coordinator: the job is unknown. The agents
   * keep their sessions across the reconnect. */
  snprintf(sessions[0], sizeof(sessions[0]), "%s", cl[0].session);
  snprintf(sessions[1], sizeof(sessions[1]), "%s", cl[1].session);
  th_connect(&cl[0], coord.rpc_port);
  snprintf(cl[0].session, sizeof(cl[0].session), "%s", sessions[0]);
  ck_assert_int_eq(heartbeat(&cl[0], "re", 1, resp[0].rank, 6, &hb), 5);
  for (uint32_t i = 0; i < 2; i++) {
    gradsync_JoinRequest req = th_join_request("re", 2, "node00", (i * 7 + 3) % 2);
    gradsync_JoinResponse again = gradsync_JoinResponse_init_zero;

    req.rejoin_generation = 1;
    req.rejoin_rank = resp[i].rank;
    if (i) {
      th_connect(&cl[i], coord.rpc_port);
      snprintf(cl[i].session, sizeof(cl[i].session), "%s", sessions[i]);
    }
    ck_assert_int_eq(th_call(&cl[i], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &again, NULL, 0),
                     OK);
    ck_assert_uint_eq(again.rank, resp[i].rank);
    ck_assert_uint_eq(again.generation, 1);
  }
  ck_assert_int_eq(heartbeat(&cl[1], "re", 1, resp[1].rank, 6, &hb), OK);
  ck_assert(!hb.abort);
  ck_assert_uint_ne(hb.coordinator_id, first_id);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/re", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  job = doc;
  ck_assert_str_eq(cJSON_GetObjectItem(job, "state")->valuestring, "running");
  ck_assert_int_eq(cJSON_GetObjectItem(job, "generation")->valueint, 1);
  ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(job, "ranks")), 2);
  cJSON_Delete(doc);
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* A restarted coordinator adopts the generation the re-registrations
 * name, with that generation's world (an elastic job's may be below its
 * largest); a place nobody re-registers for within the heartbeat timeout
 * is a lost rank, and the generation ends instead of running forever.
 * Slack of 1 s past the timeout (15 s by default): these clients
 * re-register at once, and the wait is for the place nobody takes. */
START_TEST(adopted_generation_loses_ranks_that_never_reregister)
{
  th_client_t cl[2];
  gradsync_HeartbeatResponse hb;
  char *body;
  cJSON *doc;

  th_coord_start(&coord, "--heartbeat-timeout", "1s", "--heartbeat-interval", "200ms",
                 "--reregister-slack", "1s", NULL);
  for (uint32_t r = 0; r < 2; r++) {
    gradsync_JoinRequest req = th_join_request("ad", 4, "node00", r);
    gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;

    req.world_min = 2;
    req.rejoin_generation = 5;
    req.rejoin_rank = r;
    req.rejoin_world_size = 3; /* shrunk from 4: rank 2 died meanwhile */
    th_connect(&cl[r], coord.rpc_port);
    snprintf(cl[r].session, sizeof(cl[r].session), "%u.00112233445566778899aabbccddeeff", r);
    if (r == 0) { /* a generation larger than the job's largest is refused */
      req.rejoin_world_size = 5;
      ck_assert_int_eq(th_call(&cl[r], "Join", gradsync_JoinRequest_fields, &req,
                               gradsync_JoinResponse_fields, &resp, NULL, 0),
                       3); /* INVALID_ARGUMENT */
      req.rejoin_world_size = 3;
    }
    ck_assert_int_eq(th_call(&cl[r], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp, NULL, 0),
                     OK);
    ck_assert_uint_eq(resp.world_size, 3);
  }
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/ad", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "world_size")->valueint, 3);
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "world_max")->valueint, 4);
  cJSON_Delete(doc);
  free(body);
  /* Both heartbeat; rank 2's place stays empty past the timeout. */
  do {
    ck_assert_int_eq(heartbeat(&cl[0], "ad", 5, 0, 1, &hb), OK);
    ck_assert_int_eq(heartbeat(&cl[1], "ad", 5, 1, 1, &hb), OK);
    usleep(50 * 1000); /* pacing only: the loop ends on the abort */
  } while (!hb.abort);
  ck_assert_msg(strstr(hb.abort_reason, "1 rank(s) did not re-register within 2 s of the "
                                        "coordinator's restart (2)"),
                "%s", hb.abort_reason);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

START_TEST(leaving_ranks_finish_the_job)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  char *body;
  cJSON *doc;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "f");
  leave_finished(cl, resp, 2, "f");
  body = th_http_wait(coord.http_port, "/jobs/f", "\"state\":\"finished\"");
  doc = cJSON_Parse(body);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "state")->valuestring, "finished");
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "abort_reason")->valuestring, "");
  cJSON_Delete(doc);
  free(body);
  stop_and_check();
}
END_TEST

/* A finished job stays readable for --job-retention, then is forgotten
 * (404), so a long-lived coordinator does not grow with every job; a job
 * still running is kept however long it runs. */
START_TEST(finished_job_is_forgotten_after_retention)
{
  th_client_t cl[2], other[2];
  gradsync_JoinResponse resp[2] = {0}, oresp[2] = {0};
  char *body;

  th_coord_start(&coord, "--job-retention", "300ms", "--heartbeat-timeout", "600s", NULL);
  join_all(other, oresp, false, NULL, 2, "running");
  join_all(cl, resp, false, NULL, 2, "f");
  leave_finished(cl, resp, 2, "f");
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/f", NULL, NULL, &body), 200);
  free(body);
  th_http_wait_code(coord.http_port, "/jobs/f", 404);
  /* The other job is running (no heartbeats needed within its 600 s
   * timeout, however long the wait above took) and stays. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/running", NULL, NULL, &body), 200);
  free(body);
  th_close(&other[0]);
  th_close(&other[1]);
  stop_and_check();
}
END_TEST

/* An agent that disconnects while waiting leaves the rendezvous (the
 * others stay, in whatever order they arrived) and the next one to join
 * takes its place. */
START_TEST(waiting_agent_that_disconnects_is_replaced)
{
  /* Agents n0/0, n0/1, n0/2 wait for a world of 4; n0/1 disconnects; n0/3
   * and n1/0 complete the world. */
  static const struct {
    const char *node;
    uint32_t local_rank;
  } who[5] = {{"n0", 0}, {"n0", 1}, {"n0", 2}, {"n0", 3}, {"n1", 0}};
  static const uint32_t kept[4] = {0, 2, 3, 4};
  th_client_t cl[5];
  gradsync_JoinResponse resp;
  gradsync_Envelope env;
  cJSON *doc, *job;
  char *body;

  th_coord_start(&coord, NULL);
  for (uint32_t i = 0; i < 5; i++) {
    gradsync_JoinRequest req = th_join_request("dc", 4, who[i].node, who[i].local_rank);

    th_connect(&cl[i], coord.rpc_port);
    th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
    if (i == 2) {
      /* All three wait; then the one in the middle of the list goes. */
      free(th_http_wait(coord.http_port, "/status", "\"rendezvous\":{\"joined\":3,"));
      th_close(&cl[1]);
      body = th_http_wait(coord.http_port, "/status", "\"rendezvous\":{\"joined\":2,");
      doc = cJSON_Parse(body);
      job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
      ck_assert_int_eq(
          cJSON_GetObjectItem(cJSON_GetObjectItem(job, "rendezvous"), "joined")->valueint, 2);
      cJSON_Delete(doc);
      free(body);
    }
  }
  /* Ranks follow (node, local_rank): n0/0, n0/2, n0/3, n1/0. */
  for (uint32_t k = 0; k < 4; k++) {
    memset(&resp, 0, sizeof(resp));
    ck_assert_int_eq(th_recv(&cl[kept[k]], &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS),
                     0);
    ck_assert_msg(env.status == OK, "%s", env.message);
    ck_assert_uint_eq(resp.rank, k);
    ck_assert_uint_eq(resp.world_size, 4);
  }
  for (uint32_t k = 0; k < 4; k++)
    th_close(&cl[kept[k]]);
  stop_and_check();
}
END_TEST

/* --max-jobs bounds the jobs a coordinator holds (issue 23, item 7: any
 * client made 5,000 a second, 11 KB each): a Join that would create one
 * more is refused, naming the flag, while the jobs held go on; once one
 * is forgotten, a new job may start. */
START_TEST(job_cap_refuses_new_jobs)
{
  static const char *const names[3] = {"a", "b", "c"};
  th_client_t waiting[3], late, second;
  gradsync_JoinRequest req;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_Envelope env;
  char msg[256], *body;

  th_coord_start(&coord, "--max-jobs", "3", NULL);
  for (uint32_t i = 0; i < 3; i++) {
    req = th_join_request(names[i], 2, "n0", 0);
    th_connect(&waiting[i], coord.rpc_port);
    th_send(&waiting[i], "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  free(th_http_wait(coord.http_port, "/status", "\"jobs\":3}"));
  req = th_join_request("d", 1, "n0", 0);
  th_connect(&late, coord.rpc_port);
  ck_assert_int_eq(
      th_call(&late, "Join", gradsync_JoinRequest_fields, &req, NULL, NULL, msg, sizeof(msg)), 8);
  ck_assert_msg(strstr(msg, "--max-jobs"), "%s", msg);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/d", NULL, NULL, &body), 404);
  free(body);
  /* A job held takes its agents as before: b completes its world. */
  req = th_join_request("b", 2, "n1", 0);
  th_connect(&second, coord.rpc_port);
  th_send(&second, "Join", 0, gradsync_JoinRequest_fields, &req);
  ck_assert_int_eq(th_recv(&second, &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
  ck_assert_msg(env.status == OK, "%s", env.message);
  ck_assert_uint_eq(resp.world_size, 2);
  ck_assert_int_eq(th_recv(&waiting[1], &env, gradsync_JoinResponse_fields, &resp, TH_WAIT_MS), 0);
  ck_assert_msg(env.status == OK, "%s", env.message);
  /* c's only agent goes: c never started, so it is forgotten, which
   * makes room for d. */
  th_close(&waiting[2]);
  th_http_wait_code(coord.http_port, "/jobs/c", 404);
  req = th_join_request("d", 1, "n0", 0);
  ck_assert_msg(th_call(&late, "Join", gradsync_JoinRequest_fields, &req,
                        gradsync_JoinResponse_fields, &resp, msg, sizeof(msg)) == OK,
                "%s", msg);
  th_close(&late);
  th_close(&second);
  th_close(&waiting[0]);
  th_close(&waiting[1]);
  stop_and_check();
}
END_TEST

/* A job that never started is forgotten as soon as nobody waits in it,
 * not --job-retention (1 h) later (issue 23, item 7: abandoned one-shot
 * Joins held 520 MB); a job that ran is kept for its retention. */
START_TEST(never_started_job_is_forgotten_at_once)
{
  th_client_t ran, lonely, gone;
  gradsync_JoinRequest req = th_join_request("lonely", 2, "n0", 0);
  gradsync_Envelope env;
  char *body;

  th_coord_start(&coord, NULL);
  th_connect(&ran, coord.rpc_port);
  run_one_job(&ran, "ran");
  /* Its Join's deadline passes with 1 of 2 agents in. */
  th_connect(&lonely, coord.rpc_port);
  th_send(&lonely, "Join", 300, gradsync_JoinRequest_fields, &req);
  ck_assert_int_eq(th_recv(&lonely, &env, NULL, NULL, TH_WAIT_MS), 0);
  ck_assert_msg(env.status == 4, "%d %s", (int)env.status, env.message);
  th_http_wait_code(coord.http_port, "/jobs/lonely", 404);
  /* Its only agent goes. */
  req = th_join_request("gone", 2, "n0", 0);
  th_connect(&gone, coord.rpc_port);
  th_send(&gone, "Join", 0, gradsync_JoinRequest_fields, &req);
  free(th_http_wait(coord.http_port, "/jobs/gone", "\"joined\":1,"));
  th_close(&gone);
  th_http_wait_code(coord.http_port, "/jobs/gone", 404);
  /* The job that ran stays for its retention. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/ran", NULL, NULL, &body), 200);
  free(body);
  th_close(&lonely);
  th_close(&ran);
  stop_and_check();
}
END_TEST

static Suite *coordinator_suite(void)
{
  const gs_test_case_t cases[] = {
      {"rendezvous", rendezvous_assigns_sorted_ranks},
      {"ring_peers", ring_peers_list_neighbours_only},
      {"refusals", join_refusals_name_the_difference},
      {"asked_ranks", asked_ranks_are_given},
      {"token", token_is_required_when_set},
      {"job_world_cap", one_job_gathers_at_most_half_the_connections},
      {"vacant_connections", vacant_connections_make_room},
      {"blobs", fetch_waits_for_publish},
      {"pack_list", pack_list_published_by_rank0_reaches_all},
      {"heartbeat_timeout", silent_rank_aborts_generation_then_rejoin},
      {"dropped_connection", dropped_connection_aborts_generation},
      {"leave_then_close", leave_then_close_loses_nothing},
      {"rendezvous_timeout", rendezvous_times_out},
      {"restart", agents_rebuild_state_after_restart},
      {"restart_lost", adopted_generation_loses_ranks_that_never_reregister},
      {"leave", leaving_ranks_finish_the_job},
      {"job_retention", finished_job_is_forgotten_after_retention},
      {"rendezvous_disconnect", waiting_agent_that_disconnects_is_replaced},
      {"job_cap", job_cap_refuses_new_jobs},
      {"never_started", never_started_job_is_forgotten_at_once},
  };

  return GS_TEST_SUITE_OF("coordinator", cases, 60, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {coordinator_suite}};
