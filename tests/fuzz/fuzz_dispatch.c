/* The coordinator's dispatch, in-process: a fresh jobs layer (coordinator/
 * jobs/) per input, driven the way coordinator/rpc.c drives it, by up to
 * eight fake peers on a clock the input moves. The input is a list of
 * records, each `op peer len_hi len_lo` then `len` bytes:
 *   op % 4 == 0: the bytes are a frame payload (an Envelope) from `peer`;
 *                its body is decoded and handed to the jobs entry points;
 *   op % 4 == 1: `peer`'s connection closes (it comes back as a new one);
 *   op % 4 == 2: the clock moves by the bytes (big-endian ms), then a sweep;
 *   op % 4 == 3: a control request (bytes: period, action) on the job the
 *                bytes after them name.
 * A NodeHeartbeat's beats are calls of fake peers too (its slots modulo
 * eight). Every reply is encoded as rpc.c would send it, and parked calls must be
 * unparked exactly once while its connection is open. State is reset between inputs so that a saved
 * crash input replays the same way on its own. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "jobs.h"
#include "node_beats.h"
#include "requests.h"
#include "rpc_checks.h"

#define PEERS 8

typedef struct fuzz_world {
  gs_responder_t responder;
  gs_jobs_t jobs;
  gs_peer_t peers[PEERS];
  char names[PEERS][16];
  int parked[PEERS * 256 + 1]; /* by peer id */
  bool closed[PEERS * 256 + 1];
  uint64_t next_id;
  uint64_t now;
  gs_buf_t scratch;
} fuzz_world_t;

static void on_reply(gs_responder_t *r, const gs_reply_t *rep)
{
  fuzz_world_t *w = GS_CONTAINER_OF(r, fuzz_world_t, responder);
  gradsync_Envelope env = gradsync_Envelope_init_zero;

  GS_FUZZ_CHECK(rep->to > 0 && rep->to < w->next_id);
  GS_FUZZ_CHECK(rep->method < GS_METHOD_COUNT);
  w->scratch.len = 0;
  snprintf(env.method, sizeof(env.method), "%s", gs_method_path(rep->method));
  env.request_id = rep->request_id;
  if (rep->err) {
    GS_FUZZ_CHECK(rep->message != NULL);
    GS_FUZZ_CHECK(gs_wire_encode_frame(&w->scratch, &env, NULL, NULL, 1u << 22) == 0);
  } else if (rep->body) {
    GS_FUZZ_CHECK(
        gs_wire_encode_frame_bytes(&w->scratch, &env, rep->body, rep->body_len, 1u << 22) == 0);
  } else {
    GS_FUZZ_CHECK(rep->fields != NULL);
    GS_FUZZ_CHECK(gs_wire_encode_frame(&w->scratch, &env, rep->fields, rep->msg, 1u << 22) == 0);
  }
}

static void on_park(gs_responder_t *r, uint64_t peer)
{
  fuzz_world_t *w = GS_CONTAINER_OF(r, fuzz_world_t, responder);

  GS_FUZZ_CHECK(peer > 0 && peer < w->next_id && !w->closed[peer]);
  w->parked[peer]++;
}

static void on_unpark(gs_responder_t *r, uint64_t peer)
{
  fuzz_world_t *w = GS_CONTAINER_OF(r, fuzz_world_t, responder);

  GS_FUZZ_CHECK(peer > 0 && peer < w->next_id);
  if (w->closed[peer]) /* rpc.c finds no connection and ignores it */
    return;
  GS_FUZZ_CHECK(w->parked[peer] > 0);
  w->parked[peer]--;
}

static void dispatch(fuzz_world_t *w, gs_peer_t *peer, const gs_call_t *call, fuzz_request_t *rq)
{
  gs_jobs_t *jobs = &w->jobs;

  switch (call->method) {
  case GS_METHOD_JOIN:
    gs__jobs_join(jobs, call, &rq->u.join);
    break;
  case GS_METHOD_PUBLISH:
    gs__jobs_publish(jobs, call, &rq->u.publish);
    break;
  case GS_METHOD_FETCH:
    gs__jobs_fetch(jobs, call, &rq->u.fetch);
    break;
  case GS_METHOD_PUBLISH_PACK_LIST: {
    const gradsync_PublishPackListRequest *req = &rq->u.publish_pack_list;
    gs_pack_summary_t sum;
    gs_buf_t body = {0};
    char why[256];

    if (req->has_pack_list && fuzz_pack_list_check(rq, &body, &sum, why, sizeof(why)) == 0)
      gs__jobs_publish_pack_list(jobs, call, req->job, req->generation, req->rank, &body, &sum);
    gs_buf_free(&body);
    break;
  }
  case GS_METHOD_FETCH_PACK_LIST:
    gs__jobs_fetch_pack_list(jobs, call, &rq->u.fetch_pack_list);
    break;
  case GS_METHOD_HEARTBEAT:
    gs__jobs_heartbeat(jobs, call, &rq->u.heartbeat);
    break;
  default:
    gs__jobs_leave(jobs, call, &rq->u.leave);
  }
  (void)peer;
}

/* A NodeHeartbeat, as rpc.c hands one to the jobs layer: each beat a
 * call of its slot, which is one of the fake peers here (slot % PEERS),
 * so node beats and direct calls meet on the same members. */
static void node_beats(fuzz_world_t *w, const gs_call_t *call, const gs_buf_t *body)
{
  static gs_node_beats_t q;
  static gs_node_beat_t beats[GS_NODE_BEATS_MAX];
  static char sessions[GS_NODE_BEATS_MAX][48];
  uint32_t n = 0;

  if (gs_node_beats_decode(&q, body->data, body->len, NULL, 0) || !gs__job_name_ok(q.msg.job))
    return;
  for (uint32_t i = 0; i < q.count; i++) {
    gs_peer_t *peer = &w->peers[q.slot[i] % PEERS];
    const char *session = gs_node_beats_session(&q, q.slot[i]);

    /* As for a direct call: the member's session unless the beat has one. */
    snprintf(sessions[n], sizeof(sessions[n]), "%s",
             session[0] || !peer->member || q.slot[i] & 0x80 ? session : peer->member->session);
    beats[n].call = *call;
    beats[n].call.method = GS_METHOD_HEARTBEAT;
    beats[n].call.peer = peer;
    beats[n].call.session = sessions[n];
    beats[n].call.news_only = true;
    beats[n].call.news_seen = q.news_seen[i];
    beats[n++].beat = gs__jobs_beat_of(&q, i);
  }
  gs__jobs_node_heartbeat(&w->jobs, q.msg.job, beats, n);
}

/* One frame payload from `peer`, as gs__rpc_on_frame takes it. */
static void on_frame(fuzz_world_t *w, gs_peer_t *peer, const uint8_t *payload, size_t len)
{
  gs_call_t call = {.peer = peer, .now_ms = w->now};
  gradsync_Envelope env;
  gs_buf_t body = {0};
  fuzz_request_t rq;
  char why[128];

  if (gs_wire_decode_envelope(payload, len, &env, &body, why, sizeof(why)) ||
      !gs_method_from_path(env.method, &call.method))
    goto out;
  call.request_id = env.request_id;
  call.deadline_ms = w->now + (env.timeout_ms ? env.timeout_ms : 30000);
  /* The envelope's session, or else the one this connection's member was
   * given: an input need not guess 128 random bits to go past the check.
   * Copied, as rpc.c's is (the envelope's): the call may free the member. */
  if (!env.session[0] && peer->member)
    snprintf(env.session, sizeof(env.session), "%s", peer->member->session);
  call.session = env.session;
  if (call.method == GS_METHOD_NODE_HEARTBEAT) {
    node_beats(w, &call, &body);
    goto out;
  }
  if (fuzz_request_decode(&rq, call.method, body.data, body.len) == 0 &&
      gs__job_name_ok(fuzz_request_job(&rq)))
    dispatch(w, peer, &call, &rq);
  fuzz_request_free(&rq);
out:
  gs_buf_free(&body);
}

/* A new connection in slot i; false when the ids ran out (the input ends). */
static bool new_peer(fuzz_world_t *w, uint32_t i)
{
  if (w->next_id >= sizeof(w->parked) / sizeof(w->parked[0]))
    return false;
  w->peers[i] = (gs_peer_t){.id = w->next_id++, .name = w->names[i]};
  return true;
}

static void control(fuzz_world_t *w, const uint8_t *b, size_t len)
{
  char name[128];
  gs_job_t *job;

  if (len < 2)
    return;
  snprintf(name, sizeof(name), "%.*s", (int)(len - 2 < 127 ? len - 2 : 127), (const char *)b + 2);
  job = gs__jobs_find(&w->jobs, name);
  if (job)
    gs__jobs_control(job, &(gs_job_control_t){.set_period = b[0] != 0xff,
                                              .period = (int32_t)b[0] - 1,
                                              .set_lr_scale = b[1] >= 0x80,
                                              .lr_scale = (float)(b[1] & 0x7f) / 16.0f + 0.0625f,
                                              .action = (gs_job_action_t)(b[1] % 4)});
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static fuzz_world_t w; /* large: kept off the stack; reset below */
  static const gs_log_t quiet = {.level = GS_LOG_ERROR, .component = "fuzz"};
  gs_jobs_config_t cfg = {
      .heartbeat_interval_ms = 1000,
      .heartbeat_timeout_ms = 10000,
      .rendezvous_timeout_ms = 60000,
      .job_retention_ms = 5000,
      .stall_timeout_ms = 20000,
      .max_world_size = 64,
      .max_jobs = 64,
      .coordinator_id = 0xc0ffee,
      .log = &quiet,
  };

  memset(&w, 0, sizeof(w));
  w.responder = (gs_responder_t){.reply = on_reply, .park = on_park, .unpark = on_unpark};
  w.next_id = 1;
  for (uint32_t i = 0; i < PEERS; i++) {
    snprintf(w.names[i], sizeof(w.names[i]), "peer%u", i);
    (void)new_peer(&w, i);
  }
  gs__jobs_init(&w.jobs, &cfg, &w.responder);
  while (size >= 4) {
    uint8_t op = data[0] % 4;
    gs_peer_t *peer = &w.peers[data[1] % PEERS];
    size_t len = (size_t)data[2] << 8 | data[3];

    data += 4;
    size -= 4;
    len = len < size ? len : size;
    if (op == 0) {
      on_frame(&w, peer, data, len);
    } else if (op == 1) {
      gs__jobs_peer_closed(&w.jobs, peer, w.jobs.now_ms);
      /* Its calls went with the connection (conn.c drops its park count). */
      w.closed[peer->id] = true;
      if (!new_peer(&w, (uint32_t)(peer - w.peers)))
        break;
    } else if (op == 2) {
      for (size_t i = 0; i < len && i < 4; i++)
        w.now += (uint64_t)data[i] << (8 * (len < 4 ? len - 1 - i : 3 - i));
      gs__jobs_sweep(&w.jobs, w.now);
    } else {
      control(&w, data, len);
    }
    data += len;
    size -= len;
  }
  /* A day later every deadline has passed: nothing may still be parked. */
  gs__jobs_sweep(&w.jobs, w.now + 86400000);
  for (uint64_t id = 1; id < w.next_id; id++)
    GS_FUZZ_CHECK(w.closed[id] || w.parked[id] == 0);
  for (uint32_t i = 0; i < PEERS; i++)
    gs__jobs_peer_closed(&w.jobs, &w.peers[i], w.jobs.now_ms);
  gs__jobs_free(&w.jobs);
  gs_buf_free(&w.scratch);
  return 0;
}
