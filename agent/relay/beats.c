/* The node's heartbeats (see relay_internal.h): each rank's answered here
 * from the last reply the coordinator sent for its slot, and all of them
 * sent up as one NodeHeartbeat (proto/README.md, "NodeHeartbeat"). */
#include <stdio.h>
#include <string.h>

#include "relay_internal.h"

/* The node's beats due: one NodeHeartbeat per job and token they belong
 * to (one, as a rule), under that token, each beat with the news its slot
 * holds, and the rank's session until the slot holds a reply without an
 * abort. */
void gs__relay_beats_flush(gs_relay_t *r)
{
  gs_node_beats_t *q = &r->node_beats;
  gradsync_Envelope env = gradsync_Envelope_init_zero;

  snprintf(env.method, sizeof(env.method), "%s", gs_method_path(GS_METHOD_NODE_HEARTBEAT));
  while (r->beats_due) {
    q->msg.job[0] = '\0';
    for (uint32_t s = 1; s <= MAX_SLOT; s++) {
      local_t *l = r->slots[s];

      if (!l || !l->beat_due ||
          (q->msg.job[0] && (strcmp(q->msg.job, l->beat.job) || strcmp(env.token, l->token))))
        continue;
      if (!q->msg.job[0]) {
        gs_node_beats_reset(q, l->beat.job);
        snprintf(env.token, sizeof(env.token), "%s", l->token);
      }
      if (gs_node_beats_add(q, l->slot, &l->beat, l->news, l->bound ? "" : l->session))
        break; /* cannot happen: a beat per slot */
      l->beat_due = false;
      r->beats_due--;
    }
    env.request_id = BATCH_ID_BASE + ++r->batch_seq;
    r->out.len = 0;
    if (r->up_ready && (gs_node_beats_encode_frame(q, &r->out, &env, UP_FRAME_MAX) ||
                        !gs__relay_send_up(r, r->out.data, r->out.len)))
      gs_log(r->cfg.log, GS_LOG_WARN, NULL, -1,
             "relay: cannot send the node's heartbeats upstream");
  }
}

/* Answers l's parked heartbeat with `env` and its body. */
static void answer_beat(local_t *l, const gradsync_Envelope *env, const gs_buf_t *body)
{
  gradsync_Envelope e = *env;

  e.request_id = l->parked_id;
  e.slot = 0;
  l->parked = false;
  gs__relay_send_frame(l->r, (uv_stream_t *)&l->pipe, &e, body->data, body->len);
}

static void answer_held(local_t *l)
{
  l->given_seq = l->held_seq;
  answer_beat(l, &l->held, &l->held_body);
}

/* The node's tick: every parked heartbeat that has a reply gets it now,
 * so the ranks' next heartbeats come together and go up as one. */
static void on_tick(uv_timer_t *t)
{
  gs_relay_t *r = t->data;

  for (uint32_t s = 1; s <= MAX_SLOT; s++)
    if (r->slots[s] && r->slots[s]->parked && r->slots[s]->held_seq)
      answer_held(r->slots[s]);
}

/* A rank's heartbeat: kept for the next NodeHeartbeat, and answered from
 * the slot's last reply when the rank has not had it (or asked not to
 * wait), else parked until the tick or news. False when it goes up alone
 * (the coordinator answers it on its slot): it does not decode, or its
 * token is not one the coordinator took (then its reply tells). */
bool gs__relay_beat(gs_relay_t *r, local_t *l, const gradsync_Envelope *env, const gs_buf_t *body)
{
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  if (!gs__relay_token_good(r, env->token)) {
    gs__relay_token_check(l, env);
    return false;
  }
  if (gs_wire_decode(body->data, body->len, gradsync_HeartbeatRequest_fields, &req, NULL, 0))
    return false;
  snprintf(l->token, sizeof(l->token), "%s", env->token);
  if (l->held_seq && req.generation != l->beat.generation)
    l->held_seq = l->given_seq = l->news = 0, l->bound = false; /* the slot starts afresh */
  snprintf(l->session, sizeof(l->session), "%s", env->session);
  l->beat = req;
  l->parked = true;
  l->parked_id = env->request_id;
  if (l->held_seq && (l->given_seq != l->held_seq || !req.wait_ms))
    answer_held(l);
  else if (req.wait_ms && !uv_is_active((uv_handle_t *)&r->tick))
    uv_timer_start(&r->tick, on_tick, req.wait_ms, 0);
  if (!l->beat_due) {
    l->beat_due = true;
    r->beats_due++;
  }
  if (r->beats_due >= r->cfg.ranks)
    gs__relay_beats_flush(r);
  else
    gs__relay_flush_soon(r);
  return true;
}

/* The coordinator's reply for a slot's beat (news, or an error): a reply
 * is held for the rank's heartbeats, an error only passed on. Either goes
 * to the parked heartbeat at once. */
void gs__relay_beat_news(local_t *l, const gradsync_Envelope *env, const gs_buf_t *body)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;

  if (env->status ||
      gs_wire_decode(body->data, body->len, gradsync_HeartbeatResponse_fields, &resp, NULL, 0)) {
    if (l->parked)
      answer_beat(l, env, body);
    return;
  }
  l->held_body.len = 0;
  if (gs_buf_append(&l->held_body, body->data, body->len))
    return;
  l->held = *env;
  l->held_seq++;
  l->news = resp.news;
  l->bound = !resp.abort;
  if (l->parked)
    answer_held(l);
}
