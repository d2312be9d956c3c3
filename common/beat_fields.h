/* What a rank reports in its heartbeat, listed once. Every layer that
 * carries a heartbeat generates its part from this table: the node agent's
 * NodeHeartbeat columns and their encoding (node_beats.[ch]), the agent's
 * copy of its figures into the request (agent/client/heartbeat.c), the
 * coordinator's beat and member record (coordinator/jobs/job.h) and the
 * copies into them (jobs.c, heartbeat.c), the numbers of /jobs/NAME's
 * ranks (jobs/status.c), and the dashboard's columns (served as
 * /ui/beat_fields.js by http_ui.c). Adding a field is a line here (and in
 * gradsync.proto, HeartbeatRequest or its Progress plus a column of
 * NodeHeartbeatRequest), its producer, and its reader (docs/design.md,
 * "The heartbeat table").
 *
 * XX(name, ctype, part, member, newer, label, format):
 *   name    the field of HeartbeatRequest (or of its Progress), the column
 *           of NodeHeartbeatRequest, the coordinator's member field and
 *           the key in /jobs/NAME's ranks: one name everywhere;
 *   ctype   its C type, which is also the column's width;
 *   part    SENDER: who sends it, set by the heartbeat thread;
 *           REPORT: the step's figures (gs_progress_t, gs_engine_report);
 *           WHERE:  in Progress, where the rank is (gs__engine_where); sent
 *                   and kept only with has_progress;
 *   member  NONE: the coordinator does not keep it as sent;
 *           COPY: the member record keeps the latest as sent, and
 *                 /jobs/NAME shows it as a number under its name;
 *           OWN:  the member record has the field, and heartbeat.c and
 *                 status.c keep and show it their own way;
 *   newer   1: a node agent older than the column leaves it empty, and
 *           the coordinator reads zeros;
 *   label, format  the dashboard's column for it ("": none); format is a
 *           key of app.js's FORMATS. */
#ifndef GS_BEAT_FIELDS_H
#define GS_BEAT_FIELDS_H

/* clang-format off */
#define GS_BEAT_FIELDS(XX)                                                                         \
  /* name            ctype     part    member newer label          format */                       \
  XX(generation,       uint64_t, SENDER, NONE, 0, "",              "")                             \
  XX(rank,             uint32_t, SENDER, NONE, 0, "",              "")                             \
  XX(has_progress,     bool,     SENDER, OWN,  0, "",              "")                             \
  XX(step,             uint64_t, REPORT, COPY, 0, "step",          "int")                          \
  XX(loss,             float,    REPORT, COPY, 0, "loss",          "sig")                          \
  XX(samples_per_sec,  float,    REPORT, COPY, 0, "samples/s",     "num")                          \
  XX(compute_ms,       float,    REPORT, COPY, 0, "compute ms",    "num2")                         \
  XX(comm_wait_ms,     float,    REPORT, COPY, 0, "comm wait ms",  "num2")                         \
  /* a name, with the pack it waits for (status.c); its start (heartbeat.c) */                     \
  XX(phase,            uint32_t, WHERE,  OWN,  0, "",              "")                             \
  XX(pack,             uint32_t, WHERE,  OWN,  0, "",              "")                             \
  XX(phase_ms,         uint32_t, WHERE,  NONE, 0, "",              "")                             \
  XX(collectives_done, uint64_t, WHERE,  COPY, 0, "",              "")                             \
  /* smoothed over a few heartbeats (heartbeat.c) */                                               \
  XX(send_wait,        float,    WHERE,  OWN,  0, "send wait",     "pct")                          \
  XX(device_waits,     uint32_t, WHERE,  COPY, 1, "",              "")                             \
  XX(comm_waits,       uint32_t, WHERE,  COPY, 1, "",              "")                             \
  XX(state_bytes,      uint64_t, WHERE,  COPY, 1, "",              "")
/* clang-format on */

typedef enum gs_beat_part { GS_BEAT_SENDER, GS_BEAT_REPORT, GS_BEAT_WHERE } gs_beat_part_t;

/* Field `name` of part `part` in a HeartbeatRequest `req`. */
#define GS_BEAT_IN_REQUEST(req, part, name) GS_BEAT_IN_##part(req).name
#define GS_BEAT_IN_SENDER(req) (req)
#define GS_BEAT_IN_REPORT(req) (req)
#define GS_BEAT_IN_WHERE(req) (req).progress

/* A struct's field for each entry kept by the coordinator's member. */
#define GS_BEAT_MEMBER_FIELD(name, ctype, part, member, ...)                                       \
  GS_BEAT_MEMBER_FIELD_##member(ctype, name)
#define GS_BEAT_MEMBER_FIELD_NONE(ctype, name)
#define GS_BEAT_MEMBER_FIELD_COPY(ctype, name) ctype name;
#define GS_BEAT_MEMBER_FIELD_OWN(ctype, name) ctype name;

/* A struct's field for every entry. */
#define GS_BEAT_FIELD(name, ctype, ...) ctype name;

#endif
