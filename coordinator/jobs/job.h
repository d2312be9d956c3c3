/* Jobs: the state machine of one training job on the coordinator, its
 * members, and the context every job lives in (gs_jobs_t).
 *
 *   WAITING --(world_size agents joined)--> RUNNING (generation g)
 *   RUNNING --(a rank lost or left failing)--> FAILED (g aborted, with the reason)
 *   RUNNING --(every rank left, finished)--> FINISHED
 *   FAILED, FINISHED --(a Join)--> WAITING (the next rendezvous opens g+1)
 *   WAITING --(its rendezvous emptied: timeout, refusal)--> what it was
 *     before: FAILED or FINISHED, or WAITING for a job that never ran
 *
 * Everything here is soft state, rebuilt from agents re-registering. The
 * jobs layer answers through a responder (responder.h) and never sees a
 * connection; time comes in with each call (gs_call_t.now_ms) or sweep. */
#ifndef GS_JOB_H
#define GS_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "beat_fields.h"
#include "claims.h"
#include "buf.h"
#include "curve.h"
#include "job_index.h"
#include "job_store.h"
#include "list.h"
#include "log.h"
#include "ratelimit.h"
#include "responder.h"
#include "waiting.h"

typedef struct gs_job gs_job_t;
typedef struct gs_trace_doc gs_trace_doc_t; /* trace.h */

/* How many settings one Join may carry (JoinRequest.settings): the RPC
 * layer's decode refuses more. */
#define GS_JOB_MAX_SETTINGS 64
/* After a coordinator restart, how long past the heartbeat timeout the
 * ranks of an adopted generation have to re-register by default (their
 * redial backoff is at most about 6 s): --reregister-slack. */
#define GS_REREGISTER_SLACK_MS 15000

typedef struct gs_jobs_config {
  uint64_t heartbeat_interval_ms; /* told to agents at Join */
  uint64_t heartbeat_timeout_ms;  /* silence that marks a rank lost */
  uint64_t rendezvous_timeout_ms; /* from a rendezvous' first Join */
  uint64_t job_retention_ms;      /* a job that ran and rests is forgotten this long after */
  uint64_t stall_timeout_ms;      /* a running job's step still this long: stalled; 0 never */
  uint64_t reregister_slack_ms;   /* see GS_REREGISTER_SLACK_MS; 0: that */
  uint32_t max_world_size;
  /* The largest world one job may gather through ranks' own connections
   * (0: max_world_size): a rank holds two connections once it trains
   * (its Join's and its heartbeats'), so a larger job could not run, and
   * one job token's parked Joins leave the rest of --max-connections to
   * other jobs. Ranks behind node agents hold none of their own. */
  uint32_t max_job_world;
  uint32_t max_jobs;       /* jobs held at once (--max-jobs) */
  uint64_t coordinator_id; /* sent in heartbeat replies: lets agents notice a restart */
  /* Borrowed: the memory budget (--max-memory) blobs and pack lists are
   * counted in; NULL: they are not counted (tests). */
  gs_mem_budget_t *mem;
  const gs_log_t *log; /* borrowed */
} gs_jobs_config_t;

typedef struct gs_jobs_stats {
  uint64_t ranks_lost;
  uint64_t generations_aborted;
  uint64_t regroups;         /* elastic generations that continued an earlier one */
  uint64_t regroup_ms_total; /* from each earlier generation's end to the next one's start */
} gs_jobs_stats_t;

/* Every job of the service, and what they share. */
typedef struct gs_jobs {
  gs_jobs_config_t cfg;
  gs_responder_t *responder; /* borrowed */
  gs_job_t *jobs;            /* every job, newest first: for the status views */
  gs_job_index_t index;      /* the same jobs by name */
  uint32_t job_count;
  uint64_t jobs_created;      /* ever: the latest job's serial */
  gs_ratelimit_t job_cap_log; /* Joins refused at --max-jobs are logged, not each one */
  /* Jobs the sweep saw at rest (nothing in progress), in the order it saw
   * them: at --max-jobs the first makes room for a new one. */
  gs_list_t resting;
  uint64_t forgotten_for_room; /* jobs forgotten so (logged at a bounded rate) */
  /* Merged traces replies hold after their job let go (trace.c). */
  gs_list_t trace_orphans;
  /* When the next slice of any trace's rendering may start: a slice is
   * followed by as long without one, however many requests ask. */
  uint64_t trace_next_slice_ns;
  gs_jobs_stats_t stats;
  /* Bumped by every change /status could show (its cache key); a
   * heartbeat's progress bumps `progress` instead (http_routes.c lets a
   * large page lag it a little). */
  uint64_t version, progress;
  /* Heartbeat reply bodies built so far: each one's `news` number. */
  uint64_t hb_replies_built;
  /* The latest time an entry point was given. */
  uint64_t now_ms;
  /* The sweep's latest run; after a gap in it (the coordinator's own loop
   * stopped or starved), until stall_until_ms, a running rank whose
   * connection closes is not lost at once (gs__jobs_peer_closed, jobs.c
   * after_own_stall). */
  uint64_t swept_ms, stall_until_ms;
} gs_jobs_t;

/* One rank's heartbeat as the jobs layer reads it: what a Heartbeat's
 * request says, or one entry of a node agent's NodeHeartbeat columns;
 * every field of the table (beat_fields.h), then a direct one's own. */
typedef struct gs_beat {
  GS_BEAT_FIELDS(GS_BEAT_FIELD)
  uint64_t clock_sent_us, clock_replied_us; /* 0: no sample */
  uint32_t wait_ms;                         /* long poll (not a node agent's) */
} gs_beat_t;

/* A member's agent's clock, written by trace.c: coordinator µs = agent
 * µs + offset_us, from the heartbeat round trip with the shortest time
 * (rtt_us); the network round trip of its latest heartbeat; and that
 * heartbeat's arrival and reply on the coordinator's clock (µs). */
typedef struct gs_member_clock {
  int64_t offset_us;
  uint64_t rtt_us;
  uint32_t beat_rtt_ms;
  bool synced;
  uint64_t arrived_us, replied_us;
} gs_member_clock_t;

/* A member's heartbeat that waits for news (long poll), written by
 * heartbeat.c (job.c lets go of it with the member): on the job's wait
 * list, in arrival order, which is the order its waits end; a node
 * agent's beat holds the news `seen` (its wait has no end). */
typedef struct gs_member_poll {
  gs_list_t node;
  uint64_t peer, request, until_ms;
  uint64_t seen;
} gs_member_poll_t;

/* A beat of a NodeHeartbeat: the call of its slot (news_only), its beat. */
typedef struct gs_node_beat {
  gs_call_t call;
  gs_beat_t beat;
} gs_node_beat_t;

typedef enum gs_job_state {
  GS_JOB_WAITING = 0,
  GS_JOB_RUNNING,
  GS_JOB_FINISHED,
  GS_JOB_FAILED, /* its generation was aborted and no rendezvous is gathering */
} gs_job_state_t;

typedef enum gs_member_state {
  GS_MEMBER_WAITING = 0, /* in a rendezvous */
  GS_MEMBER_RUNNING,
  GS_MEMBER_LEFT,
  GS_MEMBER_LOST,
} gs_member_state_t;

struct gs_member {
  gs_job_t *job;
  /* The connection whose loss loses this rank: the one it joined on, then
   * the one its heartbeats come on (see gs__heartbeat). NULL once closed. */
  gs_peer_t *peer;
  gs_member_state_t state;
  uint64_t generation;
  uint32_t rank;
  uint64_t join_seq;        /* arrival order in the rendezvous */
  uint32_t waiting_index;   /* position in job->waiting, while WAITING */
  uint64_t join_request_id; /* the parked Join, while WAITING */
  uint64_t join_deadline_ms;
  gradsync_JoinRequest req; /* node, local_rank, device, signature, ... (no settings) */
  char session[48];         /* "RANK.hex": issued when its generation starts (session.h) */
  /* Its Join's settings, compared with rank 0's at the rendezvous: packed
   * "name\0value\0" pairs in the order sent; NULL when it sent none. */
  char *settings;
  size_t settings_len;
  uint32_t settings_count;
  size_t counted; /* what it holds, as counted in the budget's members part */
  /* Latest heartbeat. Running members are also on the job's heartbeat
   * list, oldest heartbeat first, so the silence check looks at one. */
  uint64_t last_heartbeat_ms;
  gs_list_t hb_node;
  bool heartbeats_seen; /* its heartbeats tied it to `peer` (see gs__heartbeat) */
  /* What its heartbeats say (beat_fields.h: the fields kept; waiting.c
   * reads where it is). The phase's start is on the coordinator's clock
   * (arrival minus phase_ms); the send wait is the share of the time its
   * sends waited, over the last few heartbeats. */
  GS_BEAT_FIELDS(GS_BEAT_MEMBER_FIELD)
  uint64_t phase_start_ms;
  float step_ms; /* compute + comm wait per step, over the last few heartbeats */
  gs_member_clock_t clock;
  /* Elastic: it came back for the next generation (regroup.c), so its old
   * connections closing loses nothing. */
  bool regrouped;
  gs_member_poll_t poll;
};

/* One generation of a job, for /jobs/NAME: when it started, its world,
 * and how it ended (time lost: from its end to the next one's start). */
#define GS_JOB_HISTORY 16
typedef struct gs_generation_record {
  uint64_t generation;
  uint32_t world_size;
  uint64_t started_ms, ended_ms;
  bool ended;
  uint64_t start_step;  /* the step it continued from (elastic) */
  uint64_t lost_ms;     /* the gap before it, after the previous one ended */
  char end_reason[256]; /* what ended it first */
  char lost[256];       /* elastic: the ranks lost as it ended */
} gs_generation_record_t;

/* The rendezvous a job gathers (state WAITING), rendezvous.c's (job.c
 * lets go of it with the job); others ask how many joined and for which
 * world through gs__rendezvous_joined and _world. */
typedef struct gs_rendezvous {
  gs_member_t **waiting;
  uint32_t count, cap, world_size;
  gs_claims_t claims; /* the waiting members by (node, local_rank) */
  uint64_t deadline_ms;
  uint64_t next_join_deadline_ms; /* no waiting Join expires before this */
  uint64_t next_progress_log_ms;  /* when the sweep next logs who it waits for */
  uint64_t join_seq;
} gs_rendezvous_t;

/* The encoded reply to a heartbeat that needs no abort, heartbeat.c's:
 * the same for every rank until a directive changes, so it is built once
 * (job.c lets go of it with the job). */
typedef struct gs_job_beat_reply {
  gs_buf_t body;
  gradsync_Directives directives; /* what it says */
  bool valid;
  uint64_t held_version; /* the held verdict's version it carries */
  uint64_t news;         /* its `news` */
  bool current;          /* known current: beats of one NodeHeartbeat are being taken */
} gs_job_beat_reply_t;

/* What holds the ranks up, waiting.c's: its verdict (status.c shows it),
 * when it last looked, the latest heartbeat of a rank held in a
 * collective, and a count of its verdicts' changes (the heartbeat reply
 * carries the verdict). */
typedef struct gs_job_held {
  gs_waiting_on_t on;
  uint64_t checked_ms;
  uint64_t beat_ms;
  uint64_t version;
} gs_job_held_t;

struct gs_job {
  gs_job_t *next, *prev; /* gs_jobs.jobs */
  gs_job_t *hnext;       /* its bucket in gs_jobs.index */
  gs_jobs_t *jobs;
  char name[128];
  /* Its place in creation order, from 1, never reused: /status pages
   * continue after a serial, which stays right as jobs come and go. */
  uint64_t serial;
  gs_job_state_t state;
  uint64_t generation; /* the latest completed rendezvous; 0: none yet */
  uint32_t world_size; /* of the running generation */

  gs_rendezvous_t rdv; /* the rendezvous being gathered (state WAITING) */

  /* The running (or last) generation, indexed by rank; entries may be NULL
   * after a coordinator restart until every rank re-registered. */
  gs_member_t **ranks;
  gradsync_Peer *peers; /* rank order, for Join replies */
  uint64_t started_ms;
  /* A generation adopted from re-registrations (a coordinator restart):
   * its places still empty at this time (the heartbeat timeout and
   * GS_REREGISTER_SLACK_MS after the first) are lost ranks. 0: none. */
  uint64_t reregister_deadline_ms;
  uint64_t finished_ms; /* when it became FINISHED: forgotten after cfg.job_retention_ms */
  /* When the sweep first saw it with nothing in progress (no rendezvous
   * gathering, no parked call, not running): a rendezvous that timed out
   * or a failed generation nobody rejoined is forgotten after
   * cfg.job_retention_ms from then, like a finished job. */
  uint64_t resting_since_ms;
  bool resting;
  gs_list_t rest_node; /* on gs_jobs.resting while `resting` */
  uint32_t ranks_left; /* members in state LEFT */
  /* Running members by last heartbeat, oldest first (see gs_member). */
  gs_list_t hb_list;
  /* Heartbeats waiting for news, oldest first; `news` grows with every
   * change they wait for (a generation's end, a directive), `news_told`
   * is the value they were last answered at. */
  gs_list_t wait_list;
  gs_list_t node_waits; /* node agents' beats, waiting only for news */
  uint64_t news, news_told;
  uint64_t last_hb_sweep_ms; /* the liveness sweep's last run (0: never) */

  gs_job_store_t store; /* blobs and pack list of the current generation */

  /* Directives for the heartbeat replies. */
  int32_t bcast_period;
  bool bcast_period_overridden; /* set by the control endpoint */
  float lr_scale;               /* the operator's (control endpoint), 1 by default */
  uint64_t broadcast_seq, checkpoint_seq;
  bool stop;
  gs_job_beat_reply_t hb_reply;

  uint64_t aborted_generation;
  char abort_reason[256];

  /* Stall detection: the highest step any rank reported in this
   * generation and when it last grew (kept by each heartbeat in O(1)); the
   * sweep flags the job stalled when that is over cfg.stall_timeout_ms ago. */
  uint64_t step_max;
  uint64_t step_advanced_ms;
  bool stalled;
  gs_job_held_t held;
  /* The latest step-timeline request (trace.c): its number, its steps, the
   * generation asked. */
  uint64_t trace_seq;
  uint32_t trace_steps;
  uint64_t trace_generation;
  gs_trace_doc_t *trace_doc;            /* the latest merged document (trace.h); NULL: none */
  struct gs_trace_render *trace_render; /* the one being rendered (trace.c); NULL: none */
  /* Elastic membership (regroup.c): world_min > 0 makes the job elastic,
   * of world_min..world_max ranks. */
  uint32_t world_min, world_max;
  bool regrouping;           /* its generation ended; the survivors are coming back */
  uint32_t regroup_pending;  /* members of that generation neither back nor lost */
  uint64_t regroup_deadline; /* pending members not back by then are lost */
  uint64_t regroup_seq;      /* directive: agents wait to join the running generation */
  uint64_t last_join_ms;     /* the latest Join of the rendezvous (settling) */
  /* Where the next generation takes its state from (set as it starts). */
  bool resume_state;
  uint32_t state_rank;
  uint64_t state_step;
  /* The latest generations, a ring of up to GS_JOB_HISTORY (history.c),
   * grown as generations start: most jobs run one, and a ring of 16 in
   * every job made each cost 10 KB. NULL until the first. */
  gs_generation_record_t *history;
  uint32_t history_count, history_cap;
  gs_curve_t curve;  /* loss and samples/s over the run (curve.c) */
  uint64_t regroups; /* generations that continued an earlier one */
  uint64_t regroup_ms_total;
};

const char *gs__job_state_name(gs_job_state_t s);
const char *gs__member_state_name(gs_member_state_t s);

/* A new job (not yet in jobs->jobs); NULL when out of memory. */
gs_job_t *gs__job_new(gs_jobs_t *jobs, const char *name);
/* Frees the ranks, the store and the job; the rendezvous must be empty. */
void gs__job_free(gs_job_t *job);

/* A member for `req`, bound to the caller's connection, counted in the
 * budget's members part; NULL when out of memory. Free with
 * gs__member_free. */
gs_member_t *gs__member_new(gs_job_t *job, const gs_call_t *call, const gradsync_JoinRequest *req);
void gs__member_free(gs_member_t *m);
/* What a member costs in the budget, its settings aside. */
#define GS_MEMBER_COST (sizeof(gs_member_t) + GS_STORE_ALLOC_OVERHEAD)
/* The member holds `add` more bytes (its settings). */
void gs__member_count(gs_member_t *m, size_t add);
/* Makes `peer` the connection whose loss loses `m`. */
void gs__member_bind(gs_member_t *m, gs_peer_t *peer);
void gs__member_unbind(gs_member_t *m);
/* Whether m is a survivor of an elastic generation that ended, which the
 * next rendezvous still waits for (regroup.h); gs__member_lost counts it
 * out. */
bool gs__member_pending(const gs_member_t *m);
/* Whether a member still takes part in its job. */
bool gs__member_active(const gs_member_t *m);
/* The member is lost: the generation is aborted. */
void gs__member_lost(gs_member_t *m, const char *how);

/* The heartbeat list (see gs_member): a heartbeat at `now` moves `m` to
 * its end; O(1) whatever the world size. */
void gs__hb_touch(gs_member_t *m, uint64_t now);
void gs__hb_unlink(gs_member_t *m);

/* Frees the members of the last generation. */
void gs__job_free_ranks(gs_job_t *job);
/* The state of a job with no rendezvous gathering: what its last
 * generation became (WAITING when it never ran). */
gs_job_state_t gs__job_resting_state(const gs_job_t *job);
/* A generation starts at `now`: its step and stall clock start afresh. */
void gs__job_stall_reset(gs_job_t *job, uint64_t now);
/* Fills job->peers[r] from job->ranks[r]. */
void gs__job_fill_peer(gs_job_t *job, uint32_t r);
/* The job's directives, as heartbeat and Join replies carry them. */
gradsync_Directives gs__job_directives(const gs_job_t *job);
/* Answers a member's Join with its rank and peers. */
void gs__job_reply_join(gs_job_t *job, const gs_member_t *m, uint64_t request_id);
/* Aborts the running generation of `job`; every rank learns it from its
 * next heartbeat, and parked calls are answered ABORTED. An elastic job
 * starts gathering its survivors (regroup.c). */
void gs__job_abort(gs_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, for a generation that ends without a failure when not
 * `failed` (an elastic regroup every rank agreed to). */
void gs__job_end(gs_job_t *job, bool failed, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The member a heartbeat or leave speaks for; answers NOT_FOUND and
 * returns NULL when the generation or rank is unknown. */
gs_member_t *gs__job_find_member(gs_job_t *job, const gs_call_t *call, uint64_t generation,
                                 uint32_t rank);
/* A Leave: the rank is done (finished) or failed (aborts the generation). */
void gs__job_leave(gs_job_t *job, const gs_call_t *call, const gradsync_LeaveRequest *req);

/* The agents waiting in `job`'s rendezvous, and the world it gathers. */
static inline uint32_t gs__rendezvous_joined(const gs_job_t *job)
{
  return job->rdv.count;
}

static inline uint32_t gs__rendezvous_world(const gs_job_t *job)
{
  return job->rdv.world_size;
}

#endif
