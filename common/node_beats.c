/* A NodeHeartbeat's columns (see node_beats.h). */
#include "node_beats.h"

#include <stdio.h>
#include <string.h>

#include "wire.h"

/* Each column's array and its callback field in the message (the slots
 * first: they count the beats), in one table so that encoding and
 * decoding cannot disagree; `newer`: which ones may come empty. */
static void columns(gs_node_beats_t *b, pb_callback_t *field[GS_NODE_BEATS_COLUMNS],
                    bool newer[GS_NODE_BEATS_COLUMNS])
{
  gradsync_NodeHeartbeatRequest *m = &b->msg;
  struct {
    pb_callback_t *field;
    void *items;
    size_t width;
    bool newer;
  } t[GS_NODE_BEATS_COLUMNS] = {{&m->slot, b->slot, sizeof(b->slot[0]), false},
                                {&m->news_seen, b->news_seen, sizeof(b->news_seen[0]), false},
#define COLUMN(name, ctype, part, member, is_newer, ...)                                           \
  {&m->name, b->name, sizeof(ctype), is_newer},
                                GS_BEAT_FIELDS(COLUMN)
#undef COLUMN
  };

  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++) {
    b->columns[i] = (gs_pb_column_t){
        .items = t[i].items, .width = t[i].width, .max = GS_NODE_BEATS_MAX, .count = b->count};
    field[i] = t[i].field;
    newer[i] = t[i].newer;
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
  b->news_seen[i] = news_seen;
#define ADD(name, ctype, part, ...) b->name[i] = (ctype)GS_BEAT_IN_REQUEST(*req, part, name);
  GS_BEAT_FIELDS(ADD)
#undef ADD
  b->count = i + 1;
  return 0;
}

int gs_node_beats_encode_frame(gs_node_beats_t *b, gs_buf_t *out, const gradsync_Envelope *env,
                               size_t max_payload)
{
  pb_callback_t *field[GS_NODE_BEATS_COLUMNS];
  bool newer[GS_NODE_BEATS_COLUMNS];

  columns(b, field, newer);
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++)
    gs_pb_column_bind_encode(field[i], &b->columns[i]);
  return gs_wire_encode_frame(out, env, gradsync_NodeHeartbeatRequest_fields, &b->msg, max_payload);
}

int gs_node_beats_decode(gs_node_beats_t *b, const uint8_t *data, size_t len, char *why,
                         size_t why_len)
{
  pb_callback_t *field[GS_NODE_BEATS_COLUMNS];
  bool newer[GS_NODE_BEATS_COLUMNS];
  int err;

  b->count = 0;
  /* The message's fields that are not columns, at their defaults (the
   * sessions' array is 10 KB: only its count). */
  b->msg.job[0] = '\0';
  b->msg.sessions_count = 0;
  columns(b, field, newer);
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++)
    gs_pb_column_bind_decode(field[i], &b->columns[i]);
  err = gs_wire_decode_into_defaults(data, len, gradsync_NodeHeartbeatRequest_fields, &b->msg, why,
                                     why_len);
  if (err)
    return err;
  b->count = (uint32_t)b->columns[0].count; /* the slots */
  for (int i = 0; i < GS_NODE_BEATS_COLUMNS; i++) {
    if (newer[i] && b->columns[i].count == 0) { /* an older node agent: zeros */
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
