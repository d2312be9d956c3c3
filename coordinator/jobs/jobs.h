/* The jobs layer's entry points: every job of the service by name, the
 * RPCs after rpc.c decoded and checked them, connection closes, the
 * periodic sweep, and control requests. Nothing here touches a socket:
 * answers go through the responder given to gs__jobs_init, time comes in
 * with each call, so tests drive it all with no sockets and their own clock. */
#ifndef GS_JOBS_H
#define GS_JOBS_H

#include "job.h"
#include "node_beats.h"

/* Starts an empty registry; `r` must outlive it. */
void gs__jobs_init(gs_jobs_t *jobs, const gs_jobs_config_t *cfg, gs_responder_t *r);
/* Frees every job without answering anyone (at shutdown). */
void gs__jobs_free(gs_jobs_t *jobs);

/* The job called `name`, or NULL. */
gs_job_t *gs__jobs_find(gs_jobs_t *jobs, const char *name);

/* The RPCs (rpc.c decoded the body and checked the job name). Each answers
 * the call now or parks it. */
/* A Join's `req->settings.arg` is NULL (none sent) or the gs_pb_array_t of
 * gradsync_Setting its settings were decoded into (borrowed). */
void gs__jobs_join(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_JoinRequest *req);
void gs__jobs_publish(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_PublishRequest *req);
void gs__jobs_fetch(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_FetchRequest *req);
/* `body` (the encoded FetchPackListResponse) and `summary` come from the
 * list rpc.c validated. */
void gs__jobs_publish_pack_list(gs_jobs_t *jobs, const gs_call_t *call, const char *job,
                                uint64_t generation, uint32_t rank, const gs_buf_t *body,
                                const gs_pack_summary_t *summary);
void gs__jobs_fetch_pack_list(gs_jobs_t *jobs, const gs_call_t *call,
                              const gradsync_FetchPackListRequest *req);
void gs__jobs_heartbeat(gs_jobs_t *jobs, const gs_call_t *call,
                        const gradsync_HeartbeatRequest *req);
/* Beat i of a NodeHeartbeat's columns, as the jobs layer reads a heartbeat. */
gs_beat_t gs__jobs_beat_of(const gs_node_beats_t *q, uint32_t i);
/* A node agent's beats for ranks of job `job`, each a heartbeat of its
 * slot answered only with news (proto/README.md, "NodeHeartbeat"). */
void gs__jobs_node_heartbeat(gs_jobs_t *jobs, const char *job, const gs_node_beat_t *beats,
                             uint32_t n);
void gs__jobs_leave(gs_jobs_t *jobs, const gs_call_t *call, const gradsync_LeaveRequest *req);

/* `peer`'s connection closed at `now`: a member bound to it leaves its
 * rendezvous or is lost; just after the coordinator's own stall, a
 * running one is only untied and has the heartbeat timeout to come back
 * or leave. The peer may be freed once this returns. */
void gs__jobs_peer_closed(gs_jobs_t *jobs, gs_peer_t *peer, uint64_t now);

/* Deadlines, heartbeat silences, rendezvous timeouts and retention, at `now`. */
void gs__jobs_sweep(gs_jobs_t *jobs, uint64_t now);

/* What the control endpoint may change. */
typedef enum gs_job_action {
  GS_JOB_ACTION_NONE = 0,
  GS_JOB_ACTION_BROADCAST,
  GS_JOB_ACTION_CHECKPOINT,
  GS_JOB_ACTION_STOP,
} gs_job_action_t;

/* Whether the job's rank 0 (of the running or last generation) said at
 * Join that it writes no checkpoints, so a checkpoint request would be
 * acted on by nobody. False when it said it does, said nothing (an older
 * agent), or no rank 0 is known yet. */
bool gs__jobs_checkpoints_off(const gs_job_t *job);

/* What one control request asks. */
typedef struct gs_job_control {
  bool set_period;
  int32_t period;
  bool set_lr_scale;
  float lr_scale; /* gs_lr_scale_valid */
  gs_job_action_t action;
} gs_job_control_t;

/* Applies a control request; every rank sees it in its next heartbeat
 * reply. */
void gs__jobs_control(gs_job_t *job, const gs_job_control_t *c);
/* Asks every rank of `job` to record its next `steps` steps (the
 * trace_seq directive, trace.h); returns the request's number. */
uint64_t gs__jobs_trace(gs_job_t *job, uint32_t steps);

#endif
