/* The coordinator through real sockets: the real binary runs as a child
 * process on free ports; each test starts its own and checks that it
 * exits cleanly (under ASan that includes no leaks). */
#include <cJSON.h>
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "harness.h"
#include "node_beats.h"

#define OK 0

static th_coord_t coord;

static void stop_and_check(void)
{
  ck_assert_int_eq(th_coord_stop(&coord), 0);
}

/* Joins n clients of `job` (agent i claims node k/4, local_rank k%4 with
 * k = (7i+3) mod n, so arrival order differs from rank order) and returns
 * each client's JoinResponse in resp[i], with its peers in arrs[i]. */
static void join_all(th_client_t *cl, gradsync_JoinResponse *resp, bool with_peers,
                     gs_pb_array_t *arrs, uint32_t n, const char *job)
{
  for (uint32_t i = 0; i < n; i++) {
    char node[32];
    /* Arrival order differs from rank order on purpose. */
    uint32_t k = (i * 7 + 3) % n;
    gradsync_JoinRequest req;

    snprintf(node, sizeof(node), "node%02u", k / 4);
    req = th_join_request(job, n, node, k % 4);
    th_connect(&cl[i], coord.rpc_port);
    th_send(&cl[i], "Join", 0, gradsync_JoinRequest_fields, &req);
  }
  for (uint32_t i = 0; i < n; i++) {
    gradsync_Envelope env;

    memset(&resp[i], 0, sizeof(resp[i]));
    if (with_peers) {
      gs_pb_array_init(&arrs[i], gradsync_Peer_fields, sizeof(gradsync_Peer), 64);
      gs_pb_array_bind_decode(&resp[i].peers, &arrs[i]);
    }
    ck_assert_int_eq(th_recv(&cl[i], &env, gradsync_JoinResponse_fields, &resp[i], TH_WAIT_MS), 0);
    ck_assert_msg(env.status == OK, "join %u: %s", i, env.message);
  }
}

/* Every one of the n ranks of generation 1 of `job` leaves, finished, and
 * closes its connection. */
static void leave_finished(th_client_t *cl, const gradsync_JoinResponse *resp, uint32_t n,
                           const char *job)
{
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;

  snprintf(lv.job, sizeof(lv.job), "%s", job);
  lv.generation = 1;
  lv.finished = true;
  for (uint32_t i = 0; i < n; i++) {
    lv.rank = resp[i].rank;
    ck_assert_int_eq(
        th_call(&cl[i], "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0), OK);
    th_close(&cl[i]);
  }
}

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

static void start_world(th_client_t *cl, uint32_t n, const char *job)
{
  gradsync_JoinResponse resp[8] = {0};

  join_all(cl, resp, false, NULL, n, job);
  for (uint32_t i = 0; i < n; i++)
    ck_assert_uint_eq(resp[i].generation, 1);
}

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

static int heartbeat(th_client_t *cl, const char *job, uint64_t gen, uint32_t rank, uint64_t step,
                     gradsync_HeartbeatResponse *resp)
{
  gradsync_HeartbeatRequest hb = gradsync_HeartbeatRequest_init_zero;

  snprintf(hb.job, sizeof(hb.job), "%s", job);
  hb.generation = gen;
  hb.rank = rank;
  hb.step = step;
  hb.loss = 0.5f;
  hb.samples_per_sec = 1000;
  hb.compute_ms = 10 + rank;
  hb.comm_wait_ms = 1;
  memset(resp, 0, sizeof(*resp));
  return th_call(cl, "Heartbeat", gradsync_HeartbeatRequest_fields, &hb,
                 gradsync_HeartbeatResponse_fields, resp, NULL, 0);
}

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

START_TEST(status_json_field_by_field)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  cJSON *doc, *jobs, *job, *ranks, *r1, *summary;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "s");
  for (uint32_t i = 0; i < 2; i++)
    ck_assert_int_eq(heartbeat(&cl[i], "s", 1, resp[i].rank, 42, &hb), OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_ptr_nonnull(doc);
  ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "jobs")->valueint,
                   1);
  jobs = cJSON_GetObjectItem(doc, "jobs");
  ck_assert_int_eq(cJSON_GetArraySize(jobs), 1);
  job = cJSON_GetArrayItem(jobs, 0);
  ck_assert_str_eq(cJSON_GetObjectItem(job, "name")->valuestring, "s");
  ck_assert_str_eq(cJSON_GetObjectItem(job, "state")->valuestring, "running");
  ck_assert_str_eq(cJSON_GetObjectItem(job, "reason")->valuestring, "");
  ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(job, "stalled")));
  ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(job, "stalled_ranks")), 0);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "generation")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "world_size")->valueint, 2);
  ck_assert_int_eq(cJSON_GetObjectItem(job, "bcast_period")->valueint, 0);
  ck_assert(cJSON_IsNull(cJSON_GetObjectItem(job, "pack_list")));
  ck_assert_double_eq(cJSON_GetObjectItem(job, "samples_per_sec")->valuedouble, 2000);
  /* The summary view: counts and ranges, no per-rank list. */
  ck_assert_ptr_null(cJSON_GetObjectItem(job, "ranks"));
  ck_assert_int_eq(cJSON_GetObjectItem(job, "straggler_count")->valueint, 0);
  summary = cJSON_GetObjectItem(job, "rank_summary");
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "running")->valueint, 2);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "lost")->valueint, 0);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_min")->valueint, 42);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_max")->valueint, 42);
  /* Seconds since the heartbeats just sent: small, but a loaded machine
   * can take a while between the two calls. */
  ck_assert_double_lt(cJSON_GetObjectItem(summary, "oldest_heartbeat_s")->valuedouble,
                      TH_WAIT_MS / 1000.0);
  cJSON_Delete(doc);
  free(body);
  /* ?ranks=1 adds every rank. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status?ranks=1", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  ck_assert_ptr_nonnull(doc);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  ranks = cJSON_GetObjectItem(job, "ranks");
  ck_assert_int_eq(cJSON_GetArraySize(ranks), 2);
  r1 = cJSON_GetArrayItem(ranks, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "rank")->valueint, 1);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "node")->valuestring, "node00");
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "local_rank")->valueint, 1);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "device")->valuestring, "cpu");
  ck_assert_int_eq(cJSON_GetObjectItem(r1, "step")->valueint, 42);
  ck_assert_double_eq(cJSON_GetObjectItem(r1, "loss")->valuedouble, 0.5);
  ck_assert_double_eq(cJSON_GetObjectItem(r1, "samples_per_sec")->valuedouble, 1000);
  ck_assert_double_lt(cJSON_GetObjectItem(r1, "last_heartbeat_s")->valuedouble,
                      TH_WAIT_MS / 1000.0);
  ck_assert_str_eq(cJSON_GetObjectItem(r1, "state")->valuestring, "running");
  cJSON_Delete(doc);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/nope", NULL, NULL, &body), 404);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/nothing", NULL, NULL, &body), 404);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "DELETE", "/status", NULL, NULL, &body), 405);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/healthz", NULL, NULL, &body), 200);
  ck_assert_str_eq(body, "{\"status\":\"ok\"}");
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

START_TEST(metrics_text)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "m");
  ck_assert_int_eq(heartbeat(&cl[0], "m", 1, resp[0].rank, 7, &hb), OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/metrics", NULL, NULL, &body), 200);
  ck_assert_ptr_nonnull(strstr(body, "# TYPE gradsync_jobs gauge\ngradsync_jobs 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_rpc_requests_total{method=\"Join\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_rpc_requests_total{method=\"Heartbeat\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_world_size{job=\"m\"} 2\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_running{job=\"m\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_state{job=\"m\",state=\"running\"} 1\n"));
  ck_assert_ptr_nonnull(strstr(body, "gradsync_job_stalled{job=\"m\"} 0\n"));
  {
    char line[64];

    snprintf(line, sizeof(line), "gradsync_rank_step{job=\"m\",rank=\"%u\"} 7\n", resp[0].rank);
    ck_assert_ptr_nonnull(strstr(body, line));
  }
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
  stop_and_check();
}
END_TEST

/* The control body is read strictly: a field given twice (which copy
 * would win?) or a string holding a NUL (where would it end?) is a 400,
 * and nothing is applied; an escaped backslash before "u0000" is text. */
START_TEST(control_body_is_read_strictly)
{
  th_client_t cl;
  gradsync_JoinResponse resp = {0};
  gradsync_HeartbeatResponse hb;
  const struct {
    const char *body, *error;
  } bad[] = {
      {"{\"action\": \"broadcast\", \"action\": \"stop\"}", "field 'action' is given twice"},
      {"{\"bcast_period\": 5, \"bcast_period\": 7}", "field 'bcast_period' is given twice"},
      {"{\"action\": \"stop\\u0000\"}", "holds a NUL"},
      {"{\"action\\u0000x\": \"stop\"}", "holds a NUL"},
      {"{\"action\": \"stop\\\\u0000\"}", "action must be"},
      {"{\"lr_scale\": 0}", "lr_scale must be a number above 0 and at most 1000"},
      {"{\"lr_scale\": -0.5}", "lr_scale must be"},
      {"{\"lr_scale\": 1001}", "lr_scale must be"},
      {"{\"lr_scale\": 1e-50}", "lr_scale must be"}, /* 0 as a float */
      {"{\"lr_scale\": \"0.5\"}", "lr_scale must be"},
      {"{\"lr_scale\": 0.5, \"lr_scale\": 2}", "field 'lr_scale' is given twice"},
      {"{\"lr\": 0.5}", "unknown field 'lr'"},
      {"{}", "nothing to do"},
      /* Two requests in one body: neither applied, not the first alone. */
      {"{\"action\":\"broadcast\"}{\"action\":\"stop\"}", "with nothing after it"},
      {"{\"action\":\"broadcast\"} x", "with nothing after it"},
  };
  char *body;

  th_coord_start(&coord, NULL);
  th_connect(&cl, coord.rpc_port);
  {
    gradsync_JoinRequest req = th_join_request("c", 1, "n", 0);

    ck_assert_int_eq(th_call(&cl, "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp, NULL, 0),
                     OK);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control", NULL, bad[i].body, &body),
                     400);
    ck_assert_msg(strstr(body, bad[i].error), "%s: %s", bad[i].body, body);
    free(body);
  }
  ck_assert_int_eq(heartbeat(&cl, "c", 1, 0, 1, &hb), OK);
  ck_assert(!hb.directives.stop);
  ck_assert_uint_eq(hb.directives.broadcast_seq, 0);
  ck_assert_float_eq(hb.directives.lr_scale, 1.0f);
  /* A good one is applied, shown in the job's JSON and in /metrics. */
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/c/control", NULL, "{\"lr_scale\": 0.5} \r\n", &body),
      200);
  ck_assert_msg(strstr(body, "\"lr_scale\":0.5"), "%s", body);
  free(body);
  ck_assert_int_eq(heartbeat(&cl, "c", 1, 0, 1, &hb), OK);
  ck_assert_float_eq(hb.directives.lr_scale, 0.5f);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/c", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"lr_scale\":0.5"), "%s", body);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/metrics", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "gradsync_job_lr_scale{job=\"c\"} 0.5\n"), "%s", body);
  free(body);
  th_close(&cl);
}
END_TEST

START_TEST(control_endpoint_needs_token_and_reaches_heartbeats)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  char *body;

  th_coord_start(&coord, "--token", "tok", NULL);
  th_connect(&cl[0], coord.rpc_port);
  cl[0].token = "tok";
  {
    gradsync_JoinRequest req = th_join_request("c", 1, "n", 0);

    ck_assert_int_eq(th_call(&cl[0], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp[0], NULL, 0),
                     OK);
  }
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/c/control", NULL, "{\"bcast_period\": 5}", &body),
      401);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer nope\r\n", "{\"bcast_period\": 5}", &body),
                   401);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Basic tok\r\n", "{\"bcast_period\": 5}", &body),
                   401);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearertok\r\n", "{\"bcast_period\": 5}", &body),
                   401);
  free(body);
  /* RFC 7235: the scheme is case-insensitive, and may be followed by several spaces. */
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: bearer  tok\r\n", "{\"bcast_period\": 5}", &body),
                   200);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer tok\r\n", "{\"bcast_period\": 5", &body),
                   400);
  ck_assert_ptr_nonnull(strstr(body, "\"error\""));
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer tok\r\n", "{\"bcast_period\": -2}", &body),
                   400);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer tok\r\n", "{\"action\": \"dance\"}", &body),
                   400);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/c/control", NULL, NULL, &body), 405);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/zz/control",
                           "Authorization: Bearer tok\r\n", "{\"action\": \"stop\"}", &body),
                   404);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer tok\r\n",
                           "{\"bcast_period\": 5, \"action\": \"checkpoint\"}", &body),
                   200);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/c/control",
                           "Authorization: Bearer tok\r\n", "{\"action\": \"stop\"}", &body),
                   200);
  free(body);
  ck_assert_int_eq(heartbeat(&cl[0], "c", 1, 0, 1, &hb), OK);
  ck_assert_int_eq(hb.directives.bcast_period, 5);
  ck_assert_uint_eq(hb.directives.checkpoint_seq, 1);
  /* A job whose rank 0 said it has no checkpoint dir: a checkpoint request
   * is refused (409, nothing applied); other control still works. */
  th_connect(&cl[1], coord.rpc_port);
  cl[1].token = "tok";
  {
    gradsync_JoinRequest req = th_join_request("nock", 1, "n", 0);
    gradsync_HeartbeatResponse hb2;

    req.checkpoints = gradsync_Checkpoints_CHECKPOINTS_OFF;
    ck_assert_int_eq(th_call(&cl[1], "Join", gradsync_JoinRequest_fields, &req,
                             gradsync_JoinResponse_fields, &resp[1], NULL, 0),
                     OK);
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/nock/control",
                             "Authorization: Bearer tok\r\n",
                             "{\"bcast_period\": 9, \"action\": \"checkpoint\"}", &body),
                     409);
    ck_assert_msg(strstr(body, "job 'nock' takes no checkpoints"), "%s", body);
    free(body);
    ck_assert_int_eq(th_http(coord.http_port, "POST", "/jobs/nock/control",
                             "Authorization: Bearer tok\r\n", "{\"action\": \"broadcast\"}", &body),
                     200);
    free(body);
    ck_assert_int_eq(heartbeat(&cl[1], "nock", 1, 0, 1, &hb2), OK);
    ck_assert_uint_eq(hb2.directives.checkpoint_seq, 0);
    ck_assert_int_ne(hb2.directives.bcast_period, 9);
    ck_assert_uint_eq(hb2.directives.broadcast_seq, 1);
    th_close(&cl[1]);
  }
  ck_assert_uint_eq(hb.directives.broadcast_seq, 0);
  ck_assert(hb.directives.stop);
  ck_assert_uint_ne(hb.coordinator_id, 0);
  th_close(&cl[0]);
  stop_and_check();
}
END_TEST

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

/* The summary /status is cached between changes: every RPC, control
 * request or connection change must show in the next read. */
START_TEST(status_summary_follows_every_change)
{
  th_client_t cl[2];
  gradsync_JoinResponse resp[2] = {0};
  gradsync_HeartbeatResponse hb;
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;
  cJSON *doc, *job, *summary;
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 2, "c");
  for (uint64_t step = 42; step <= 44; step++) {
    for (uint32_t i = 0; i < 2; i++)
      ck_assert_int_eq(heartbeat(&cl[i], "c", 1, resp[i].rank, step, &hb), OK);
    ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
    doc = cJSON_Parse(body);
    job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
    summary = cJSON_GetObjectItem(job, "rank_summary");
    ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_min")->valueint, (int)step);
    ck_assert_int_eq(cJSON_GetObjectItem(summary, "step_max")->valueint, (int)step);
    cJSON_Delete(doc);
    free(body);
  }
  ck_assert_int_eq(
      th_http(coord.http_port, "POST", "/jobs/c/control", NULL, "{\"bcast_period\": 7}", &body),
      200);
  free(body);
  snprintf(lv.job, sizeof(lv.job), "c");
  lv.generation = 1;
  lv.rank = resp[0].rank;
  lv.finished = true;
  ck_assert_int_eq(th_call(&cl[0], "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0),
                   OK);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  summary = cJSON_GetObjectItem(job, "rank_summary");
  ck_assert_int_eq(cJSON_GetObjectItem(job, "bcast_period")->valueint, 7);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "left")->valueint, 1);
  ck_assert_int_eq(cJSON_GetObjectItem(summary, "running")->valueint, 1);
  ck_assert_int_eq(
      cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "connections")->valueint, 2);
  cJSON_Delete(doc);
  free(body);
  th_close(&cl[0]);
  th_close(&cl[1]);
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

/* /jobs/NAME lists a page of ranks (1,000 unless asked): ranks_from and
 * ranks_limit choose it, and ranks_page.next is the next page's path. */
START_TEST(job_ranks_are_paged)
{
  th_client_t cl[5];
  gradsync_JoinResponse resp[5];
  char *body;

  th_coord_start(&coord, NULL);
  join_all(cl, resp, false, NULL, 5, "pg");
  ck_assert_int_eq(
      th_http(coord.http_port, "GET", "/jobs/pg?ranks_from=1&ranks_limit=2", NULL, NULL, &body),
      200);
  ck_assert_msg(strstr(body, "\"ranks\":[{\"rank\":1,") && strstr(body, "{\"rank\":2,") &&
                    !strstr(body, "{\"rank\":3,") && !strstr(body, "{\"rank\":0,"),
                "%s", body);
  ck_assert_msg(strstr(body, "\"ranks_page\":{\"from\":1,\"limit\":2,\"listed\":2,"
                             "\"next\":\"/jobs/pg?ranks_from=3&ranks_limit=2\"}"),
                "%s", body);
  free(body);
  ck_assert_int_eq(
      th_http(coord.http_port, "GET", "/jobs/pg?ranks_from=3&ranks_limit=2", NULL, NULL, &body),
      200);
  ck_assert_msg(strstr(body, "\"listed\":2,\"next\":null"), "%s", body);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/pg?ranks_from=9", NULL, NULL, &body),
                   200);
  ck_assert_msg(strstr(body, "\"ranks\":[],") && strstr(body, "\"listed\":0,\"next\":null"), "%s",
                body);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/pg", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"ranks_page\":{\"from\":0,\"limit\":1000,\"listed\":5,"), "%s",
                body);
  free(body);
  /* The job without its ranks: no next page, which would be this one. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/pg?ranks_limit=0", NULL, NULL, &body),
                   200);
  ck_assert_msg(strstr(body, "\"ranks\":[],") && strstr(body, "\"listed\":0,\"next\":null"), "%s",
                body);
  free(body);
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/jobs/pg?ranks_limit=10001", NULL, NULL, &body),
                   400);
  ck_assert_msg(strstr(body, "ranks_limit must be"), "%s", body);
  free(body);
  for (int i = 0; i < 5; i++)
    th_close(&cl[i]);
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

/* One agent runs job `name` as a world of one on `cl` and leaves it
 * finished, which unties it: its next Join may be for another job. */
static void run_one_job(th_client_t *cl, const char *name)
{
  gradsync_JoinRequest req = th_join_request(name, 1, "n0", 0);
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gradsync_LeaveRequest lv = gradsync_LeaveRequest_init_zero;
  char msg[256];

  ck_assert_msg(th_call(cl, "Join", gradsync_JoinRequest_fields, &req, gradsync_JoinResponse_fields,
                        &resp, msg, sizeof(msg)) == OK,
                "join %s: %s", name, msg);
  snprintf(lv.job, sizeof(lv.job), "%s", name);
  lv.generation = resp.generation;
  lv.finished = true;
  ck_assert_int_eq(th_call(cl, "Leave", gradsync_LeaveRequest_fields, &lv, NULL, NULL, NULL, 0),
                   OK);
}

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

/* The next page's path of a /status document ("" on the last page). */
static void next_page(const cJSON *doc, char *path, size_t len)
{
  const cJSON *next = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "page"), "next");

  ck_assert(cJSON_IsString(next) || cJSON_IsNull(next));
  snprintf(path, len, "%s", cJSON_IsString(next) ? next->valuestring : "");
}

/* GET /status is a page of jobs, newest first: 100 unless ?limit=N (at
 * most 1000), with the total and the path of the next page, which holds
 * every job once even when jobs start while a client pages (issue 23,
 * item 7: 50,000 jobs made /status 27.7 MB and 1.4 s). */
START_TEST(status_is_paged)
{
  enum { JOBS = 105 };
  static const char *const refused[] = {"/status?limit=0", "/status?limit=1001", "/status?limit=5x",
                                        "/status?after=x", "/status?after=0"};
  th_client_t cl;
  bool seen[JOBS + 1] = {false};
  uint32_t pages = 0, shown = 0, newest = JOBS;
  char name[16], path[128], *body;
  cJSON *doc, *jobs, *page, *job;

  th_coord_start(&coord, NULL);
  th_connect(&cl, coord.rpc_port);
  for (uint32_t i = 0; i < JOBS; i++) {
    snprintf(name, sizeof(name), "p%03u", i);
    run_one_job(&cl, name);
  }
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status", NULL, NULL, &body), 200);
  doc = cJSON_Parse(body);
  jobs = cJSON_GetObjectItem(doc, "jobs");
  page = cJSON_GetObjectItem(doc, "page");
  ck_assert_int_eq(cJSON_GetArraySize(jobs), 100);
  ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(jobs, 0), "name")->valuestring, "p104");
  ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(jobs, 99), "name")->valuestring, "p005");
  ck_assert_int_eq(cJSON_GetObjectItem(page, "total")->valueint, JOBS);
  ck_assert_int_eq(cJSON_GetObjectItem(page, "limit")->valueint, 100);
  ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "coordinator"), "jobs")->valueint,
                   JOBS);
  next_page(doc, path, sizeof(path));
  ck_assert_str_ne(path, "");
  cJSON_Delete(doc);
  free(body);
  /* Pages of 7, a job started after the first: every job once, in order. */
  for (snprintf(path, sizeof(path), "/status?limit=7"); path[0]; pages++) {
    ck_assert_int_eq(th_http(coord.http_port, "GET", path, NULL, NULL, &body), 200);
    doc = cJSON_Parse(body);
    ck_assert_ptr_nonnull(doc);
    ck_assert_int_le(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "jobs")), 7);
    cJSON_ArrayForEach(job, cJSON_GetObjectItem(doc, "jobs"))
    {
      uint32_t i = (uint32_t)atoi(cJSON_GetObjectItem(job, "name")->valuestring + 1);

      ck_assert_uint_lt(i, newest);
      ck_assert(!seen[i]);
      seen[i] = true;
      newest = i;
      shown++;
    }
    next_page(doc, path, sizeof(path));
    cJSON_Delete(doc);
    free(body);
    if (pages == 0)
      run_one_job(&cl, "p105");
  }
  ck_assert_uint_eq(shown, JOBS);
  ck_assert_uint_eq(pages, JOBS / 7);
  /* The per-rank view pages the same way, and its next page keeps it. */
  ck_assert_int_eq(th_http(coord.http_port, "GET", "/status?ranks=1&limit=1", NULL, NULL, &body),
                   200);
  doc = cJSON_Parse(body);
  job = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "jobs"), 0);
  ck_assert_str_eq(cJSON_GetObjectItem(job, "name")->valuestring, "p105");
  ck_assert_ptr_nonnull(cJSON_GetObjectItem(job, "ranks"));
  next_page(doc, path, sizeof(path));
  ck_assert_ptr_nonnull(strstr(path, "ranks=1"));
  cJSON_Delete(doc);
  free(body);
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    ck_assert_msg(th_http(coord.http_port, "GET", refused[i], NULL, NULL, &body) == 400, "%s: %s",
                  refused[i], body);
    free(body);
  }
  th_close(&cl);
  stop_and_check();
}
END_TEST

static Suite *coordinator_suite(void)
{
  Suite *s = suite_create("coordinator");
  struct {
    const char *name;
    const TTest *test;
  } cases[] = {
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
      {"status", status_json_field_by_field},
      {"metrics", metrics_text},
      {"control", control_endpoint_needs_token_and_reaches_heartbeats},
      {"control_strict", control_body_is_read_strictly},
      {"bad_input", bad_input_never_harms_the_service},
      {"restart", agents_rebuild_state_after_restart},
      {"restart_lost", adopted_generation_loses_ranks_that_never_reregister},
      {"leave", leaving_ranks_finish_the_job},
      {"job_retention", finished_job_is_forgotten_after_retention},
      {"status_fresh", status_summary_follows_every_change},
      {"framing", frames_split_or_batched_are_all_answered},
      {"idle_parked", parked_join_outlives_idle_timeout},
      {"rendezvous_disconnect", waiting_agent_that_disconnects_is_replaced},
      {"unknown_method", unknown_method_is_echoed},
      {"node_agent", node_agent_speaks_for_its_ranks},
      {"job_ranks_paged", job_ranks_are_paged},
      {"node_agent_errors", node_agent_batch_errors},
      {"node_heartbeat", node_heartbeat_answers_only_news},
      {"heartbeat_connection", heartbeats_tie_a_rank_to_their_connection},
      {"job_cap", job_cap_refuses_new_jobs},
      {"never_started", never_started_job_is_forgotten_at_once},
      {"status_pages", status_is_paged},
  };

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    TCase *tc = tcase_create(cases[i].name);

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, cases[i].test);
    suite_add_tcase(s, tc);
  }
  return s;
}

int main(void)
{
  SRunner *sr = srunner_create(coordinator_suite());
  int failed;

  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
