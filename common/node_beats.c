/* A NodeHeartbeat's columns (see node_beats.h). */
#include "node_beats.h"

#include <stdio.h>
#include <string.h>

#include "wire.h"

/* Each column's array and its callback field in the message, in one
 * table so that encoding and decoding cannot disagree. */
static void columns(gs_node_beats_t *b, pb_callback_t *field[GS_NODE_BEATS_COLUMNS])
{
  gradsync_NodeHeartbeatRequest *m = &b->msg;
  struct {
    pb_callback_t *field;
    void *items;
    size_t width;
  } t[GS_NODE_BEATS_COLUMNS] = {
      {&m->slot, b->slot, 4},
      {&m->rank, b->rank, 4},
      {&m->generation, b->generation, 8},
      {&m->step, b->step, 8},
      {&m->loss, b->loss, 4},
      {&m->samples_per_sec, b->samples_per_sec, 4},
      {&m->compute_ms, b->compute_ms, 4},
      {&m->comm_wait_ms, b->comm_wait_ms, 4},
      {&m->has_progress, b->has_progress, 1},
      {&m->phase, b->phase, 4},
      {&m->pack, b->pack, 4},
      {&m->phase_ms, b->phase_ms, 4},
      {&m->collectives_done, b->collectives_done, 8},
      {&m->send_wait, b->send_wait, 4},
      {&m->news_seen, b->news_seen, 8},
      {&m->device_waits, b->device_waits, 4},
      {&m->comm_waits, b->comm_waits, 4},
      {&m->state_bytes, b->state_bytes, 8},
  };

  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++) {
    b->columns[i] = (gs_pb_column_t){
        .items = t[i].items, .width = t[i].width, .max = GS_NODE_BEATS_MAX, .count = b->count};
    field[i] = t[i].field;
  }
}

void gs_node_beats_reset(gs_node_beats_t *b, const char *job)
{
  /* Counts only: the arrays (30 KB) are written before they are read. */
  b->count = 0;
  b->msg.sessions_count = 0;
  snprintf(b->msg.job, sizeof(b->msg.job), "%s", job);
}

int gs_node_beats_add(gs_node_beats_t *b, uint32_t slot, const gradsync_HeartbeatRequest *req,
                      uint64_t news_seen, const char *session)
{
  uint32_t i = b->count;
  gradsync_SlotSession *s;

  if (i >= GS_NODE_BEATS_MAX)
    return GS_ERANGE;
  if (session[0]) {
    s = &b->msg.sessions[b->msg.sessions_count++];
    s->slot = slot;
    snprintf(s->session, sizeof(s->session), "%s", session);
  }
  b->slot[i] = slot;
  b->rank[i] = req->rank;
  b->generation[i] = req->generation;
  b->step[i] = req->step;
  b->loss[i] = req->loss;
  b->samples_per_sec[i] = req->samples_per_sec;
  b->compute_ms[i] = req->compute_ms;
  b->comm_wait_ms[i] = req->comm_wait_ms;
  b->has_progress[i] = req->has_progress;
  b->phase[i] = (uint32_t)req->progress.phase;
  b->pack[i] = req->progress.pack;
  b->phase_ms[i] = req->progress.phase_ms;
  b->collectives_done[i] = req->progress.collectives_done;
  b->send_wait[i] = req->progress.send_wait;
  b->news_seen[i] = news_seen;
  b->device_waits[i] = req->progress.device_waits;
  b->comm_waits[i] = req->progress.comm_waits;
  b->state_bytes[i] = req->progress.state_bytes;
  b->count = i + 1;
  return 0;
}

int gs_node_beats_encode_frame(gs_node_beats_t *b, gs_buf_t *out, const gradsync_Envelope *env,
                               size_t max_payload)
{
  pb_callback_t *field[GS_NODE_BEATS_COLUMNS];

  columns(b, field);
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++)
    gs_pb_column_bind_encode(field[i], &b->columns[i]);
  return gs_wire_encode_frame(out, env, gradsync_NodeHeartbeatRequest_fields, &b->msg, max_payload);
}

int gs_node_beats_decode(gs_node_beats_t *b, const uint8_t *data, size_t len, char *why,
                         size_t why_len)
{
  pb_callback_t *field[GS_NODE_BEATS_COLUMNS];
  int err;

  b->count = 0;
  /* The message's fields that are not columns, at their defaults (the
   * sessions' array is 10 KB: only its count). */
  b->msg.job[0] = '\0';
  b->msg.sessions_count = 0;
  columns(b, field);
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++)
    gs_pb_column_bind_decode(field[i], &b->columns[i]);
  err = gs_wire_decode_into_defaults(data, len, gradsync_NodeHeartbeatRequest_fields, &b->msg, why,
                                     why_len);
  if (err)
    return err;
  b->count = (uint32_t)b->columns[0].count; /* the slots */
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++) {
    bool newer = i >= GS_NODE_BEATS_COLUMNS - GS_NODE_BEATS_NEWER_COLUMNS;

    if (newer && b->columns[i].count == 0) { /* an older node agent: zeros */
      memset(b->columns[i].items, 0, b->count * b->columns[i].width);
      continue;
    }
    if (b->columns[i].count != b->count) {
      if (why)
        snprintf(why, why_len, "the columns of a NodeHeartbeat differ in length");
      return GS_EPROTO;
    }
  }
  return 0;
}

const char *gs_node_beats_session(const gs_node_beats_t *b, uint32_t slot)
{
  for (pb_size_t i = 0; i < b->msg.sessions_count; i++)
    if (b->msg.sessions[i].slot == slot)
      return b->msg.sessions[i].session;
  return "";
}
