/* RPC dispatch: decode the Envelope, authenticate, decode and check the
 * request, and hand it to the jobs layer; encode its answers. Every
 * failure here gets an error reply naming what was wrong; none can harm
 * another request or job. */
#include "rpc.h"

#include <ctype.h>
#include <pb_decode.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "coordinator.h"
#include "link.h"
#include "list.h"
#include "node_beats.h"
#include "packlist.h"
#include "pb_array.h"
#include "rpc_checks.h"
#include "wire.h"

/* Scratch buffers larger than this are freed once used. */
#define KEEP_BUF_BYTES (64 * 1024)

#define RPC_OF(r) GS_CONTAINER_OF(r, gs_rpc_t, responder)

/* Encodes `env` with its body and sends it on `conn`: the one place a
 * frame is built. `last` closes the connection once it is written. The
 * frame is encoded into the one scratch buffer (replies are built one at a
 * time on the loop thread). */
static void send_envelope(gs_rpc_t *rpc, gs_conn_t *conn, const gradsync_Envelope *env,
                          const gs_reply_t *rep, bool last)
{
  gs_buf_t *out = &rpc->wbuf;
  int err;

  out->len = 0;
  if (rep && rep->body)
    err = gs_wire_encode_frame_bytes(out, env, rep->body, rep->body_len, SIZE_MAX);
  else
    err = gs_wire_encode_frame(out, env, rep ? rep->fields : NULL, rep ? rep->msg : NULL, SIZE_MAX);
  if (err) {
    gs_log(rpc->log, GS_LOG_ERROR, NULL, -1, "rpc: cannot encode a reply to %s: %s", conn->s.peer,
           gs_strerror(err));
    gs__conn_close(conn, "encode failed");
  } else if (last) {
    gs__conn_send_last(conn, out->data, out->len);
  } else {
    gs__conn_send(conn, out->data, out->len);
  }
  if (out->cap > KEEP_BUF_BYTES)
    gs_buf_free(out);
}

/* The Envelope of an answer: the method's path (or `path` as the request
 * spelled it), the request id, and the error converted to its gRPC status
 * here, once. */
static void envelope_for(gradsync_Envelope *env, const char *path, uint64_t request_id, int err,
                         const char *message)
{
  memset(env, 0, sizeof(*env));
  snprintf(env->method, sizeof(env->method), "%s", path);
  env->request_id = request_id;
  env->status = gs_err_grpc_code(err);
  if (err && message)
    snprintf(env->message, sizeof(env->message), "%s", message);
}

/* Files an answer as entry `e` of batch `b`; sends the Batch's reply once
 * it was the last one awaited. */
static void answer_entry(gs_rpc_t *rpc, gs_conn_t *conn, gs_batch_t *b, gs_batch_entry_t *e,
                         const gradsync_Envelope *env, const gs_reply_t *rep)
{
  const uint8_t *body = rep ? rep->body : NULL;
  size_t body_len = rep ? rep->body_len : 0;
  gradsync_Envelope done;
  uint64_t request_id;
  int err = 0;

  if (rep && !rep->body && rep->fields) {
    rpc->tmp.len = 0;
    err = gs_wire_encode(&rpc->tmp, rep->fields, rep->msg);
    body = rpc->tmp.data;
    body_len = rpc->tmp.len;
  }
  e->reply.len = 0;
  if (!err)
    err = gs_wire_encode_batch_entry(&e->reply, env, body, body_len, SIZE_MAX);
  if (!err && !gs__link_batch_answered(b, e, &rpc->batch_out, &request_id, &err))
    return; /* others of the batch are still awaited */
  if (err) {
    gs__conn_close(conn, "cannot encode a batched reply");
    return;
  }
  envelope_for(&done, gs_method_path(GS_METHOD_BATCH), request_id, 0, NULL);
  send_envelope(rpc, conn, &done,
                &(gs_reply_t){.body = rpc->batch_out.data, .body_len = rpc->batch_out.len}, false);
  if (rpc->batch_out.cap > KEEP_BUF_BYTES)
    gs_buf_free(&rpc->batch_out);
}

/* An error's Envelope, its message formatted from `fmt`. */
static void error_envelope(gradsync_Envelope *env, const char *path, uint64_t request_id, int err,
                           const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));
static void error_envelope(gradsync_Envelope *env, const char *path, uint64_t request_id, int err,
                           const char *fmt, va_list ap)
{
  envelope_for(env, path, request_id, err, NULL);
  vsnprintf(env->message, sizeof(env->message), fmt, ap);
}

static void reply(gs_responder_t *r, const gs_reply_t *rep)
{
  gs_rpc_t *rpc = RPC_OF(r);
  gs_conn_t *conn = gs__conn_get(rpc->conns, rep->to);
  uint32_t slot = gs__link_slot_of(rep->to);
  gradsync_Envelope env;
  gs_batch_entry_t *e;
  gs_batch_t *b;

  if (rep->err && rep->method < GS_METHOD_COUNT)
    rpc->stats.errors[rep->method]++;
  if (!conn)
    return; /* it closed while the call waited */
  envelope_for(&env, gs_method_path(rep->method), rep->request_id, rep->err, rep->message);
  env.slot = slot;
  e = gs__link_batch_find(conn->data, slot, rep->request_id, &b);
  if (e)
    answer_entry(rpc, conn, b, e, &env, rep->err ? NULL : rep);
  else
    send_envelope(rpc, conn, &env, rep->err ? NULL : rep, false);
}

static void park(gs_responder_t *r, uint64_t peer)
{
  gs_conn_t *conn = gs__conn_get(RPC_OF(r)->conns, peer);

  if (conn)
    gs__conn_park(conn);
}

static void unpark(gs_responder_t *r, uint64_t peer)
{
  gs_conn_t *conn = gs__conn_get(RPC_OF(r)->conns, peer);

  if (conn)
    gs__conn_unpark(conn);
}

/* uv_hrtime is CLOCK_MONOTONIC, the agents' clock on this host too. */
static uint64_t clock_us(gs_responder_t *r)
{
  (void)r;
  return uv_hrtime() / 1000;
}

void gs__rpc_init(gs_rpc_t *rpc, uv_loop_t *loop, gs_conns_t *conns, gs_jobs_t *jobs,
                  const gs_log_t *log, const char *token, uint64_t default_wait_ms)
{
  memset(rpc, 0, sizeof(*rpc));
  rpc->responder =
      (gs_responder_t){.reply = reply, .park = park, .unpark = unpark, .clock_us = clock_us};
  rpc->loop = loop;
  rpc->conns = conns;
  rpc->jobs = jobs;
  rpc->log = log;
  rpc->token = token;
  rpc->default_wait_ms = default_wait_ms;
  rpc->max_params = GS_COORD_DEFAULT_MAX_PARAMS;
}

void gs__rpc_free(gs_rpc_t *rpc)
{
  gs_buf_free(&rpc->wbuf);
  gs_buf_free(&rpc->rbody);
  gs_buf_free(&rpc->ibody);
  gs_buf_free(&rpc->tmp);
  gs_buf_free(&rpc->batch_out);
  free(rpc->node_beats);
}

/* An error answer to a call that never reached the jobs layer. */
static void reply_error(gs_rpc_t *rpc, const gs_call_t *call, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(gs_rpc_t *rpc, const gs_call_t *call, int err, const char *fmt, ...)
{
  char text[sizeof(((gradsync_Envelope *)0)->message)];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  reply(&rpc->responder, &(gs_reply_t){.to = call->peer->id,
                                       .method = call->method,
                                       .request_id = call->request_id,
                                       .err = err,
                                       .message = text});
}

/* A request body as it came, with the call it belongs to. */
typedef struct request {
  gs_call_t call;
  const uint8_t *body;
  size_t body_len;
  /* Not the coordinator's token: a job's, checked against the job the
   * body names before it is decoded, and again (check_job) against the
   * job the decoded request names. NULL: the coordinator's. */
  const char *job_token;
  gs_conn_t *conn;
} request_t;

static void fail_call(gs_rpc_t *rpc, gs_conn_t *conn, const gs_call_t *call, int err,
                      const char *text);

/* A call whose token opens nothing it asks for: one UNAUTHENTICATED reply,
 * then the connection closes, so a client without the token gets nothing
 * more from us however much it pipelines. A node agent's rank (a call on
 * a slot of a connection another call authenticated) is refused alone, on
 * its slot: one rank's stale or wrong token must not lose every rank of
 * the node. Whether a call closes is what the log line says. */
static bool token_closes(const request_t *rq)
{
  return !gs__link_slot_of(rq->call.peer->id) || !rq->conn->authenticated;
}

static void refuse_token(gs_rpc_t *rpc, const request_t *rq, const char *text)
{
  rpc->stats.errors[rq->call.method]++;
  if (token_closes(rq))
    fail_call(rpc, rq->conn, &rq->call, GS_EUNAUTH, text);
  else
    reply_error(rpc, &rq->call, GS_EUNAUTH, "%s", text);
}

/* The job a request names: a valid name, and one its token opens. */
static bool check_job(gs_rpc_t *rpc, const request_t *rq, const char *name)
{
  char text[192];

  if (!gs__job_name_ok(name)) {
    reply_error(rpc, &rq->call, GS_EINVAL,
                "job name '%s' is invalid: use 1-127 letters, digits, '-', '_' or '.'", name);
    return false;
  }
  if (rq->job_token && !gs__job_token_ok(rpc->token, name, rq->job_token)) {
    gs__conn_log(rq->conn, GS_LOG_KIND_RPC_TOKEN, "%s for job %s with a token of no use there%s",
                 gs_method_name(rq->call.method), name,
                 token_closes(rq) ? "; closing" : " (a node agent's slot: refused alone)");
    snprintf(text, sizeof(text), "wrong token (not the coordinator's, not job %s's)", name);
    refuse_token(rpc, rq, text);
    return false;
  }
  if (rq->job_token)
    gs__conn_authenticate(rq->conn);
  return true;
}

/* The job a request body names (field 1 of every request message), read
 * without decoding the rest: a job token is checked before the body costs
 * us anything (a pack list of 100,000 entries takes the loop tens of ms).
 * The first field 1 found is taken; the full decode later must name the
 * same job (check_job again). False when the body names none. */
static bool body_job(const uint8_t *body, size_t len, char *out, size_t cap)
{
  pb_istream_t s = pb_istream_from_buffer(body, len);
  pb_wire_type_t type;
  uint32_t tag, n;
  bool eof;

  while (pb_decode_tag(&s, &type, &tag, &eof)) {
    if (tag != 1 || type != PB_WT_STRING) {
      if (!pb_skip_field(&s, type))
        return false;
      continue;
    }
    if (!pb_decode_varint32(&s, &n) || n >= cap || !pb_read(&s, (pb_byte_t *)out, n))
      return false;
    out[n] = '\0';
    return true;
  }
  return false;
}

/* A job token opens the job the body names, or the call is refused and
 * the connection closed, before the body is decoded. */
static bool check_job_token(gs_rpc_t *rpc, const request_t *rq)
{
  char job[sizeof(((gradsync_JoinRequest *)0)->job)];

  if (!body_job(rq->body, rq->body_len, job, sizeof(job))) {
    gs__conn_log(rq->conn, GS_LOG_KIND_RPC_TOKEN, "%s with a job's token and no job named%s",
                 gs_method_name(rq->call.method),
                 token_closes(rq) ? "; closing" : " (a node agent's slot: refused alone)");
    refuse_token(rpc, rq, "wrong token (a job's token needs the job named in the request)");
    return false;
  }
  return check_job(rpc, rq, job);
}

static bool decode_body(gs_rpc_t *rpc, const request_t *rq, const pb_msgdesc_t *fields, void *msg)
{
  char why[128];

  if (gs_wire_decode(rq->body, rq->body_len, fields, msg, why, sizeof(why)) == 0)
    return true;
  gs__conn_log(gs__conn_get(rpc->conns, rq->call.peer->id), GS_LOG_KIND_RPC_CALL,
               "sent an undecodable %s: %s", gs_method_name(rq->call.method), why);
  reply_error(rpc, &rq->call, GS_EINVAL, "cannot decode %sRequest: %s",
              gs_method_name(rq->call.method), why);
  return false;
}

static void on_join(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_JoinRequest req = gradsync_JoinRequest_init_zero;
  gs_pb_array_t settings; /* the jobs layer reads it through req.settings.arg */

  gs_pb_array_init(&settings, gradsync_Setting_fields, sizeof(gradsync_Setting),
                   GS_JOB_MAX_SETTINGS);
  gs_pb_array_bind_decode(&req.settings, &settings);
  if (decode_body(rpc, rq, gradsync_JoinRequest_fields, &req) && check_job(rpc, rq, req.job))
    gs__jobs_join(rpc->jobs, &rq->call, &req);
  gs_pb_array_free(&settings);
}

static void on_publish(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_PublishRequest *req = calloc(1, sizeof(*req));

  if (!req) {
    reply_error(rpc, &rq->call, GS_ENOMEM, "out of memory");
    return;
  }
  if (decode_body(rpc, rq, gradsync_PublishRequest_fields, req) && check_job(rpc, rq, req->job))
    gs__jobs_publish(rpc->jobs, &rq->call, req);
  free(req);
}

static void on_fetch(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_FetchRequest req = gradsync_FetchRequest_init_zero;

  if (decode_body(rpc, rq, gradsync_FetchRequest_fields, &req) && check_job(rpc, rq, req.job))
    gs__jobs_fetch(rpc->jobs, &rq->call, &req);
}

static void on_publish_pack_list(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_PublishPackListRequest req = gradsync_PublishPackListRequest_init_zero;
  gs_pack_list_arrays_t a;
  gs_pack_summary_t sum;
  gs_buf_t body = {0};
  size_t params;
  char why[256];

  if (!gs__pack_list_count(rq->body, rq->body_len, &params, why, sizeof(why))) {
    gs__conn_log(gs__conn_get(rpc->conns, rq->call.peer->id), GS_LOG_KIND_RPC_CALL,
                 "sent an undecodable PublishPackList: %s", why);
    reply_error(rpc, &rq->call, GS_EINVAL, "cannot decode PublishPackListRequest: %s", why);
    return;
  }
  if (params > rpc->max_params) {
    gs__conn_log(gs__conn_get(rpc->conns, rq->call.peer->id), GS_LOG_KIND_RPC_CALL,
                 "sent a pack list of %zu entries, over --max-params %u; refused", params,
                 rpc->max_params);
    reply_error(rpc, &rq->call, GS_ELIMIT,
                "pack list has %zu entries, more than %u: raise the coordinator's --max-params",
                params, rpc->max_params);
    return;
  }
  /* Storage for exactly the entries counted; pack indices are bounded by
   * the same limit. */
  gs__pack_list_bind(&req.pack_list, &a, rpc->max_params);
  a.params.max_count = params;
  if (!decode_body(rpc, rq, gradsync_PublishPackListRequest_fields, &req) ||
      !check_job(rpc, rq, req.job))
    goto out;
  if (!req.has_pack_list) {
    reply_error(rpc, &rq->call, GS_EINVAL, "PublishPackList without a pack_list");
    goto out;
  }
  if (gs__pack_list_check(&req.pack_list, &a, &body, &sum, why, sizeof(why))) {
    gs_log(rpc->log, GS_LOG_WARN, req.job, req.rank, "rpc: invalid pack list: %s", why);
    reply_error(rpc, &rq->call, GS_EINVAL, "invalid pack list: %s", why);
    goto out;
  }
  gs__jobs_publish_pack_list(rpc->jobs, &rq->call, req.job, req.generation, req.rank, &body, &sum);
out:
  gs_buf_free(&body);
  gs__pack_list_free(&a);
}

static void on_fetch_pack_list(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_FetchPackListRequest req = gradsync_FetchPackListRequest_init_zero;

  if (decode_body(rpc, rq, gradsync_FetchPackListRequest_fields, &req) &&
      check_job(rpc, rq, req.job))
    gs__jobs_fetch_pack_list(rpc->jobs, &rq->call, &req);
}

static void on_heartbeat(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  if (decode_body(rpc, rq, gradsync_HeartbeatRequest_fields, &req) && check_job(rpc, rq, req.job))
    gs__jobs_heartbeat(rpc->jobs, &rq->call, &req);
}

/* A node agent's heartbeats of one interval (proto/README.md,
 * "NodeHeartbeat"): each column entry a heartbeat of its slot, answered
 * only with news. The connection's own call; no reply of its own. */
static void on_node_heartbeat(gs_rpc_t *rpc, const request_t *rq)
{
  gs_node_beats_t *q;
  gs_node_beat_t *beats;
  uint32_t n = 0;
  char why[128];

  if (gs__link_slot_of(rq->call.peer->id)) {
    reply_error(rpc, &rq->call, GS_EINVAL, "a NodeHeartbeat is the connection's own call (slot 0)");
    return;
  }
  if (!rpc->node_beats && !(rpc->node_beats = malloc(sizeof(*rpc->node_beats)))) {
    reply_error(rpc, &rq->call, GS_ENOMEM, "out of memory");
    return;
  }
  q = &rpc->node_beats->columns;
  beats = rpc->node_beats->beats;
  if (gs_node_beats_decode(q, rq->body, rq->body_len, why, sizeof(why))) {
    gs__conn_log(rq->conn, GS_LOG_KIND_RPC_CALL, "sent an undecodable NodeHeartbeat: %s", why);
    reply_error(rpc, &rq->call, GS_EINVAL, "cannot decode NodeHeartbeatRequest: %s", why);
    return;
  }
  if (!check_job(rpc, rq, q->msg.job))
    return;
  for (uint32_t i = 0; i < q->count; i++) {
    gs_node_beat_t *b = &beats[n];

    b->call = rq->call;
    b->call.method = GS_METHOD_HEARTBEAT; /* a slot's answer is a Heartbeat's */
    b->call.peer = q->slot[i] ? gs__link_peer(rq->conn->data, q->slot[i]) : NULL;
    if (!b->call.peer) {
      reply_error(rpc, &rq->call, q->slot[i] > GS_LINK_MAX_SLOT ? GS_EINVAL : GS_ENOMEM,
                  "a beat for slot %u: slots are 1 to %u", q->slot[i], GS_LINK_MAX_SLOT);
      continue;
    }
    b->call.session = gs_node_beats_session(q, q->slot[i]);
    b->call.news_only = true;
    b->call.news_seen = q->news_seen[i];
    b->beat = gs__jobs_beat_of(q, i);
    n++;
  }
  rpc->stats.requests[GS_METHOD_HEARTBEAT] += n;
  gs__jobs_node_heartbeat(rpc->jobs, q->msg.job, beats, n);
}

static void on_leave(gs_rpc_t *rpc, const request_t *rq)
{
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;

  if (decode_body(rpc, rq, gradsync_LeaveRequest_fields, &req) && check_job(rpc, rq, req.job))
    gs__jobs_leave(rpc->jobs, &rq->call, &req);
}

static void (*const handlers[GS_METHOD_COUNT])(gs_rpc_t *, const request_t *) = {
    [GS_METHOD_JOIN] = on_join,
    [GS_METHOD_PUBLISH] = on_publish,
    [GS_METHOD_FETCH] = on_fetch,
    [GS_METHOD_PUBLISH_PACK_LIST] = on_publish_pack_list,
    [GS_METHOD_FETCH_PACK_LIST] = on_fetch_pack_list,
    [GS_METHOD_HEARTBEAT] = on_heartbeat,
    [GS_METHOD_LEAVE] = on_leave,
    [GS_METHOD_NODE_HEARTBEAT] = on_node_heartbeat,
};

int gs__rpc_on_open(void *ctx, gs_conn_t *conn)
{
  (void)ctx;
  conn->data = gs__link_new(conn->id, conn->s.peer);
  return conn->data ? 0 : GS_ENOMEM;
}

bool gs__rpc_is_vacant(void *ctx, const gs_conn_t *conn)
{
  (void)ctx;
  return !conn->data || gs__link_vacant(conn->data);
}

static void peer_closed(void *arg, gs_peer_t *peer)
{
  gs_rpc_t *rpc = arg;

  gs__jobs_peer_closed(rpc->jobs, peer, uv_now(rpc->loop));
}

/* Every rank the connection carried ends with it: a node agent's too. */
void gs__rpc_on_close(void *ctx, gs_conn_t *conn)
{
  gs_rpc_t *rpc = ctx;

  gs__link_each_peer(conn->data, peer_closed, rpc);
  gs__link_free(conn->data);
  conn->data = NULL;
}

/* Answers a frame the stream cannot recover from (request id 0, as there
 * is no request to name) and closes the connection once it is written. */
static void fail_stream(gs_rpc_t *rpc, gs_conn_t *conn, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_stream(gs_rpc_t *rpc, gs_conn_t *conn, int err, const char *fmt, ...)
{
  gradsync_Envelope env;
  va_list ap;

  va_start(ap, fmt);
  error_envelope(&env, "", 0, err, fmt, ap);
  va_end(ap);
  send_envelope(rpc, conn, &env, NULL, true);
}

/* An error answer to a call, then the connection closes once it is
 * written. */
static void fail_call(gs_rpc_t *rpc, gs_conn_t *conn, const gs_call_t *call, int err,
                      const char *text)
{
  gradsync_Envelope env;

  envelope_for(&env, gs_method_path(call->method), call->request_id, err, text);
  send_envelope(rpc, conn, &env, NULL, true);
}

void gs__rpc_on_oversized(void *ctx, gs_conn_t *conn, size_t limit)
{
  gs_rpc_t *rpc = ctx;

  rpc->stats.bad_frames++;
  fail_stream(rpc, conn, GS_ETOOBIG, "frame exceeds the %zu-byte limit", limit);
}

/* An unknown method is answered with the method as the request spelled it
 * (the contract: replies carry the request's method), on the slot it came
 * on (a node agent hands it to that rank). */
static void reply_unknown_method(gs_rpc_t *rpc, gs_conn_t *conn, const gradsync_Envelope *req)
{
  gradsync_Envelope env;
  char text[sizeof(env.message)];

  rpc->stats.bad_frames++;
  gs__conn_log(conn, GS_LOG_KIND_RPC_CALL, "called unknown method '%s'", req->method);
  snprintf(text, sizeof(text), "unknown method '%s'", req->method);
  envelope_for(&env, req->method, req->request_id, GS_EUNIMPL, text);
  env.slot = req->slot <= GS_LINK_MAX_SLOT ? req->slot : 0;
  send_envelope(rpc, conn, &env, NULL, false);
}

/* A call's token: the coordinator's (the connection is authenticated), or
 * perhaps a job's (rq->job_token: checked against the job the body names).
 * Anything else is refused (refuse_token). */
static bool take_token(gs_rpc_t *rpc, request_t *rq, const char *token)
{
  if (gs__token_ok(rpc->token, token)) {
    gs__conn_authenticate(rq->conn);
    return true;
  }
  if (strlen(token) != GS_JOB_TOKEN_LEN) {
    gs__conn_log(rq->conn, GS_LOG_KIND_RPC_TOKEN, "%s with a %s token%s",
                 gs_method_name(rq->call.method), token[0] ? "wrong" : "missing",
                 token_closes(rq) ? "; closing" : " (a node agent's slot: refused alone)");
    refuse_token(rpc, rq, token[0] ? "wrong token" : "missing token");
    return false;
  }
  rq->job_token = token;
  return true;
}

/* One call, of a frame or a batch: authenticated, checked and handed to
 * the jobs layer, for the slot's peer. `body` holds its request. */
static void dispatch(gs_rpc_t *rpc, gs_conn_t *conn, const gradsync_Envelope *env, gs_method_t m,
                     const gs_buf_t *body)
{
  gs_peer_t *self = gs__link_self(conn->data), none;
  request_t rq = {.call = {.peer = gs__link_peer(conn->data, env->slot),
                           .method = m,
                           .now_ms = uv_now(rpc->loop),
                           .request_id = env->request_id,
                           .session = env->session},
                  .conn = conn,
                  .body = body->data,
                  .body_len = body->len};

  rq.call.deadline_ms = rq.call.now_ms + (env->timeout_ms ? env->timeout_ms : rpc->default_wait_ms);
  rpc->stats.requests[m]++;
  if (!rq.call.peer) {
    /* No peer for the slot: the answer is addressed to the slot all the
     * same (a batch awaits it), or past the slots to the connection. */
    none = (gs_peer_t){.id = env->slot > GS_LINK_MAX_SLOT
                                 ? self->id
                                 : self->id | (uint64_t)env->slot << GS_CONN_SLOT_BITS};
    rq.call.peer = &none;
    reply_error(rpc, &rq.call, env->slot > GS_LINK_MAX_SLOT ? GS_EINVAL : GS_ENOMEM,
                "slot %u: slots are 1 to %u (0: the connection's own call)", env->slot,
                GS_LINK_MAX_SLOT);
    return;
  }
  if (!take_token(rpc, &rq, env->token))
    return;
  if (gs__conns_over_budget(rpc->conns)) {
    gs__conn_log(conn, GS_LOG_KIND_RPC_LIMIT,
                 "%s refused: the coordinator's connections and stored blobs hold more than "
                 "their part of --max-memory (%zu bytes)",
                 gs_method_name(m), rpc->conns->mem->max);
    reply_error(rpc, &rq.call, GS_ELIMIT,
                "coordinator memory budget exhausted (--max-memory); try again later");
    return;
  }
  if (rq.job_token && !check_job_token(rpc, &rq))
    return;
  handlers[m](rpc, &rq);
}

/* An answer the RPC layer gives a batched call itself (it never reached
 * the jobs layer). */
static void answer_entry_error(gs_rpc_t *rpc, gs_conn_t *conn, gs_batch_t *b, gs_batch_entry_t *e,
                               const char *method, int err, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void answer_entry_error(gs_rpc_t *rpc, gs_conn_t *conn, gs_batch_t *b, gs_batch_entry_t *e,
                               const char *method, int err, const char *fmt, ...)
{
  gradsync_Envelope env;
  va_list ap;

  va_start(ap, fmt);
  error_envelope(&env, method, e->request_id, err, fmt, ap);
  va_end(ap);
  env.slot = e->slot;
  answer_entry(rpc, conn, b, e, &env, NULL);
}

/* A node agent's Batch: each call dispatched as if it came alone on its
 * slot's connection; the replies are gathered (reply, answer_entry) and go
 * back in one frame once the last is in. */
static void on_batch(gs_rpc_t *rpc, gs_conn_t *conn, const gradsync_Envelope *env,
                     const gs_buf_t *body)
{
  request_t rq = {.call = {.peer = gs__link_self(conn->data),
                           .method = GS_METHOD_BATCH,
                           .request_id = env->request_id},
                  .conn = conn};
  const uint8_t *item;
  size_t off = 0, len;
  uint32_t calls = 0;
  gs_batch_t *b;
  bool bad;

  rpc->stats.requests[GS_METHOD_BATCH]++;
  while (gs_wire_batch_next(body->data, body->len, &off, &item, &len, &bad))
    calls++;
  if (bad || calls == 0 || calls > GS_BATCH_MAX_CALLS || env->slot) {
    gs_peer_t on_slot = {.id = rq.call.peer->id | (uint64_t)env->slot << GS_CONN_SLOT_BITS};

    rpc->stats.bad_frames++;
    if (env->slot && env->slot <= GS_LINK_MAX_SLOT)
      rq.call.peer = &on_slot; /* answered on the slot it came on */
    if (env->slot)
      reply_error(rpc, &rq.call, GS_EINVAL, "a Batch is the connection's own call (slot 0)");
    else if (bad)
      reply_error(rpc, &rq.call, GS_EINVAL, "cannot decode BatchRequest");
    else
      reply_error(rpc, &rq.call, GS_EINVAL, "a Batch holds 1 to %u calls, not %u",
                  GS_BATCH_MAX_CALLS, calls);
    return;
  }
  b = gs__link_batch_open(conn->data, env->request_id, calls);
  if (!b) {
    reply_error(rpc, &rq.call, GS_ENOMEM, "out of memory");
    return;
  }
  off = 0;
  /* A call may end the connection (a wrong token), and its link with it. */
  while (gs__conn_get(rpc->conns, conn->id) &&
         gs_wire_batch_next(body->data, body->len, &off, &item, &len, &bad)) {
    gradsync_Envelope call;
    gs_batch_entry_t *e;
    gs_method_t m;
    char why[128];
    bool dup;

    if (gs_wire_decode_envelope(item, len, &call, &rpc->ibody, why, sizeof(why))) {
      e = gs__link_batch_add(conn->data, b, 0, 0, &dup);
      answer_entry_error(rpc, conn, b, e, "", GS_EINVAL, "cannot decode Envelope: %s", why);
    } else if (e = gs__link_batch_add(conn->data, b, call.slot, call.request_id, &dup), dup) {
      answer_entry_error(rpc, conn, b, e, call.method, GS_EINVAL,
                         "slot %u already awaits a reply to request %llu", call.slot,
                         (unsigned long long)call.request_id);
    } else if (!gs_method_from_path(call.method, &m)) {
      rpc->stats.bad_frames++;
      answer_entry_error(rpc, conn, b, e, call.method, GS_EUNIMPL, "unknown method '%s'",
                         call.method);
    } else if (m == GS_METHOD_BATCH || m == GS_METHOD_NODE_HEARTBEAT) {
      rpc->stats.bad_frames++;
      answer_entry_error(rpc, conn, b, e, call.method, GS_EINVAL, "a Batch cannot hold a %s",
                         gs_method_name(m));
    } else if (call.slot > GS_LINK_MAX_SLOT) {
      answer_entry_error(rpc, conn, b, e, call.method, GS_EINVAL,
                         "slot %u: slots are 1 to %u (0: the connection's own call)", call.slot,
                         GS_LINK_MAX_SLOT);
    } else {
      dispatch(rpc, conn, &call, m, &rpc->ibody);
    }
  }
  if (rpc->ibody.cap > KEEP_BUF_BYTES)
    gs_buf_free(&rpc->ibody);
}

void gs__rpc_on_frame(void *ctx, gs_conn_t *conn, const uint8_t *payload, size_t len)
{
  gs_rpc_t *rpc = ctx;
  gradsync_Envelope env;
  gs_buf_t *body = &rpc->rbody; /* one request is dispatched at a time */
  gs_method_t m;
  char why[128];

  if (gs_wire_decode_envelope(payload, len, &env, body, why, sizeof(why))) {
    rpc->stats.bad_frames++;
    gs__conn_log(conn, GS_LOG_KIND_RPC_FRAME, "sent an undecodable envelope (%s); closing", why);
    fail_stream(rpc, conn, GS_EINVAL, "cannot decode Envelope: %s", why);
  } else if (!gs_method_from_path(env.method, &m)) {
    reply_unknown_method(rpc, conn, &env);
  } else if (m == GS_METHOD_BATCH) {
    on_batch(rpc, conn, &env, body);
  } else {
    dispatch(rpc, conn, &env, m, body);
  }
  if (body->cap > KEEP_BUF_BYTES)
    gs_buf_free(body);
}
