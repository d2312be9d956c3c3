/* Jobs: the state machine of one training job on the coordinator.
 *
 *   WAITING --(world_size agents joined)--> RUNNING (generation g)
 *   RUNNING --(a rank lost or failed)--> WAITING (g aborted; next Join opens g+1)
 *   RUNNING --(every rank left, finished)--> FINISHED
 *
 * Everything here is soft state, rebuilt from agents re-registering. */
#ifndef GS_JOB_H
#define GS_JOB_H

#include "coord.h"

typedef enum gs_job_state {
  GS_JOB_WAITING = 0,
  GS_JOB_RUNNING,
  GS_JOB_FINISHED,
} gs_job_state_t;

typedef enum gs_member_state {
  GS_MEMBER_WAITING = 0, /* in a rendezvous */
  GS_MEMBER_RUNNING,
  GS_MEMBER_LEFT,
  GS_MEMBER_LOST,
} gs_member_state_t;

struct gs_member {
  gs_job_t *job;
  gs_conn_ref_t conn;
  gs_member_state_t state;
  uint64_t generation;
  uint32_t rank;
  uint64_t join_seq;        /* arrival order in the rendezvous */
  uint32_t waiting_index;   /* position in job->waiting, while WAITING */
  uint64_t join_request_id; /* the parked Join, while WAITING */
  uint64_t join_deadline_ms;
  gradsync_JoinRequest req; /* node, local_rank, device, signature, ... */
  /* Latest heartbeat. Running members are also on the job's heartbeat
   * list, oldest heartbeat first, so the silence check looks at one. */
  uint64_t last_heartbeat_ms;
  gs_member_t *hb_prev, *hb_next;
  bool hb_linked;
  uint64_t step;
  float loss, samples_per_sec, compute_ms, comm_wait_ms;
};

typedef struct gs_blob {
  struct gs_blob *next;
  char key[128];
  size_t len;
  uint8_t value[];
} gs_blob_t;

/* A Fetch or FetchPackList parked until its data exists or its deadline. */
typedef struct gs_waiter {
  struct gs_waiter *next;
  gs_method_t method;
  gs_conn_ref_t conn;
  uint64_t request_id;
  uint64_t generation;
  uint64_t deadline_ms;
  char key[128];
} gs_waiter_t;

typedef struct gs_pack_summary {
  bool published;
  uint32_t packs;
  uint32_t params;
  uint64_t bytes;
  uint64_t threshold_bytes;
  uint64_t largest_pack_bytes;
} gs_pack_summary_t;

struct gs_job {
  gs_job_t *next;
  struct gs_coord *coord;
  char name[128];
  gs_job_state_t state;
  uint64_t generation; /* the latest completed rendezvous; 0: none yet */
  uint32_t world_size; /* of the running generation */

  /* The rendezvous being gathered (state WAITING). */
  gs_member_t **waiting;
  uint32_t waiting_count, waiting_cap, waiting_world_size;
  uint64_t rendezvous_deadline_ms;
  uint64_t next_join_deadline_ms; /* no waiting Join expires before this */
  uint64_t join_seq;

  /* The running (or last) generation, indexed by rank; entries may be NULL
   * after a coordinator restart until every rank re-registered. */
  gs_member_t **ranks;
  gradsync_Peer *peers; /* rank order, for Join replies */
  uint64_t started_ms;
  uint64_t finished_ms; /* when it became FINISHED: forgotten after cfg.job_retention_ms */
  uint32_t ranks_left; /* members in state LEFT */
  /* Running members by last heartbeat, oldest first (see gs_member). */
  gs_member_t *hb_oldest, *hb_newest;

  gs_blob_t *blobs; /* of the current generation */
  uint32_t blob_count;
  gs_buf_t pack_list_body; /* encoded FetchPackListResponse */
  gs_pack_summary_t pack_summary;
  gs_waiter_t *waiters;

  /* Directives for the heartbeat replies. */
  int32_t bcast_period;
  bool bcast_period_overridden; /* set by the control endpoint */
  uint64_t broadcast_seq, checkpoint_seq;
  bool stop;
  /* The encoded reply to a heartbeat that needs no abort: the same for
   * every rank until a directive changes, so it is built once. */
  gs_buf_t hb_reply;
  gradsync_Directives hb_reply_for;
  bool hb_reply_valid;

  uint64_t aborted_generation;
  char abort_reason[256];
};

/* The job called `name`, or NULL. */
gs_job_t *gs__job_find(struct gs_coord *c, const char *name);

/* RPC entry points (rpc.c decodes and checks the request first). Each
 * replies to the call now or parks it. */
void gs__job_join(const gs_call_t *call, const gradsync_JoinRequest *req);
void gs__job_publish(const gs_call_t *call, const gradsync_PublishRequest *req);
void gs__job_fetch(const gs_call_t *call, const gradsync_FetchRequest *req);
void gs__job_publish_pack_list(const gs_call_t *call, const gradsync_PublishPackListRequest *req,
                               const gs_buf_t *pack_list_bytes, const gs_pack_summary_t *summary);
void gs__job_fetch_pack_list(const gs_call_t *call, const gradsync_FetchPackListRequest *req);
void gs__job_heartbeat(const gs_call_t *call, const gradsync_HeartbeatRequest *req);
void gs__job_leave(const gs_call_t *call, const gradsync_LeaveRequest *req);

/* The connection a member joined on has closed. */
void gs__job_conn_closed(gs_conn_t *conn);
/* Deadlines, heartbeat silences and rendezvous timeouts. */
void gs__jobs_sweep(struct gs_coord *c, uint64_t now);
/* Aborts the running generation of `job`, telling every rank. */
void gs__job_abort(gs_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees every job (at shutdown). */
void gs__jobs_free(struct gs_coord *c);

const char *gs__job_state_name(gs_job_state_t s);
const char *gs__member_state_name(gs_member_state_t s);

#endif
