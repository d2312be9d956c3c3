/* A NodeHeartbeat's columns as C arrays (proto/README.md, "NodeHeartbeat"):
 * a node agent adds its ranks' heartbeats and encodes them; the
 * coordinator decodes them and reads beat i from entry i of each array. */
#ifndef GS_NODE_BEATS_H
#define GS_NODE_BEATS_H

#include <stdint.h>

#include "beat_fields.h"
#include "buf.h"
#include "error.h"
#include "gradsync.pb.h"
#include "pb_column.h"

#define GS_NODE_BEATS_MAX 255 /* a beat per slot */
/* The slots and the news each holds, then a column per beat field. */
#define GS_NODE_BEATS_ONE(...) +1
#define GS_NODE_BEATS_COLUMNS (2 GS_BEAT_FIELDS(GS_NODE_BEATS_ONE))

typedef struct gs_node_beats {
  /* The message: its job and sessions; its other fields are the columns
   * below, bound when encoding or decoding. */
  gradsync_NodeHeartbeatRequest msg;
  uint32_t count;
  uint32_t slot[GS_NODE_BEATS_MAX];
  uint64_t news_seen[GS_NODE_BEATS_MAX];
#define GS_NODE_BEATS_ARRAY(name, ctype, ...) ctype name[GS_NODE_BEATS_MAX];
  GS_BEAT_FIELDS(GS_NODE_BEATS_ARRAY)
#undef GS_NODE_BEATS_ARRAY
  gs_pb_column_t columns[GS_NODE_BEATS_COLUMNS];
} gs_node_beats_t;

/* Empties `b` for beats of job `job`. */
void gs_node_beats_reset(gs_node_beats_t *b, const char *job);
/* Adds a rank's heartbeat (its job must be b's): its slot, the news the
 * slot holds (0: none), and the rank's session while it holds none ("":
 * no session needed). GS_ERANGE when b is full. */
int gs_node_beats_add(gs_node_beats_t *b, uint32_t slot, const gradsync_HeartbeatRequest *req,
                      uint64_t news_seen, const char *session) GS_WARN_UNUSED;
/* Appends b as the body of one frame with `env`. */
int gs_node_beats_encode_frame(gs_node_beats_t *b, gs_buf_t *out, const gradsync_Envelope *env,
                               size_t max_payload) GS_WARN_UNUSED;
/* Decodes a NodeHeartbeatRequest into b; fails (nanopb's reason, or
 * columns of unequal length, in `why`) on bytes that are not one. */
int gs_node_beats_decode(gs_node_beats_t *b, const uint8_t *data, size_t len, char *why,
                         size_t why_len) GS_WARN_UNUSED;
/* The session b gives for `slot` ("": none). */
const char *gs_node_beats_session(const gs_node_beats_t *b, uint32_t slot);

#endif
