/* The sync engine's state, shared by the files that make it up (one
 * concept each): engine.c (lifecycle: new, start, finish, free),
 * generation.c (entering a generation: Join, heartbeat, pack list,
 * connecting the ranks), step.c (a training step: launching the
 * allreduces as gradients arrive, SGD per pack, acting on the control
 * vector), groups.c (the optimizer's parameter groups), comm_thread.c (the thread that runs
 * blocking collectives, and collectives run at once outside a step), sync.c (state across ranks and
 * time: the initial sync, broadcasts, checkpoints), elastic.c (regroups,
 * and the calls that may regroup: the initial sync, metric sums) and
 * control.c (the control vector's encoding), shard.c (sharded optimizer
 * state: the windows), reshard.c (the sharded state through a regroup),
 * state_check.c (every rank holding the same state). Only these files
 * include it. */
#ifndef GS_ENGINE_INTERNAL_H
#define GS_ENGINE_INTERNAL_H

#include <gradsync/engine.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_writer.h"
#include "client.h"
#include "comm.h"
#include "control.h"
#include "device.h"
#include "comm_thread.h"
#include "error.h"
#include "groups.h"
#include "heartbeat.h"
#include "log.h"
#include "membership.h"
#include "packs.h"
#include "shard.h"
#include "pb_array.h"
#include "optim.h"
#include "sgd.h"

/* A step's reductions, done by gs_engine_synchronize or end_step: whether
 * done this step, their failure, whether the grads were scaled in place,
 * and the times so far. */
typedef struct reduced {
  bool done, scaled;
  int err;
  double waited_ms, optimizer_ms;
} reduced_t;

/* Where the rank is (progress.c): written by the training thread (the
 * phase, the last step's blocking waits) and the comm (its gauge), read
 * by the heartbeat thread, which alone keeps the last two fields. */
typedef struct phase_board {
  _Atomic uint32_t phase; /* gs_phase_t */
  _Atomic uint32_t pack;  /* GS_PHASE_ALLREDUCE: the pack waited for */
  _Atomic uint64_t since_ms;
  _Atomic uint32_t device_waits, comm_waits; /* the last step's (gs_step_result_t) */
  _Atomic uint64_t state_bytes;              /* the optimizer state held (the packs' windows) */
  gs_comm_gauge_t comm;
  uint64_t read_ms, read_send_wait_ns;
} phase_board_t;

/* A step timeline being recorded (trace.c). `on` and the counts are read
 * by whichever thread runs a collective; the rest is the training
 * thread's. */
typedef struct trace_rec {
  _Atomic bool on;
  bool truncated;
  uint64_t coordinator_id, seen_seq, seq;
  uint32_t steps_left;
  uint64_t origin_us, since_us;     /* since_us: the current phase's start */
  gradsync_TraceEvent *main, *comm; /* halves of one allocation */
  _Atomic uint32_t nmain, ncomm;
} trace_rec_t;

/* What the host reads back from the device of a step, in one batch of
 * copies behind the step's work (gs_device_fetch): the control vector's
 * sums, and these floats. */
enum { FETCHED_SKIP, FETCHED_VETO, FETCHED_LOSS, FETCHED_COUNT };

/* A step's readback in flight (decide.c): queued at its end, taken then
 * (decisions now) or at the next step's end (late). */
typedef struct step_flight {
  bool valid;
  uint32_t fence;               /* its device fence */
  uint64_t until;               /* comm tickets below this: its collectives and those before */
  gs_position_t before, after;  /* the position without it, and with it */
  gs_control_local_t mine;      /* what this rank wrote into its control vector */
  bool check, veto, skip_asked; /* what was fetched: the sums' verdict, the front end's flag */
  bool loss;                    /* and a loss handed in as device memory */
  float *ctl;                   /* host (pinned): the control vector's sums (nctl_cap) */
  float *fetched;               /* host (pinned): FETCHED_COUNT floats */
} step_flight_t;

/* A step's inputs that only the device knows (device memory, read when
 * the update runs: gs_engine_set_loss_at, _skip_step_at, _scale_step_at;
 * NULL: none), and a driven step's own state (drive.c, cfg.driven). */
typedef struct step_drive {
  const float *loss_at, *veto_at, *factor_at;
  float *fetched;     /* host memory (pinned): FETCHED_COUNT floats (gs_engine_synchronize's) */
  float loss_seen;    /* the loss of the last step decided (a loss handed in as device memory) */
  bool loss_given;    /* driven: this step's loss is in, the last pack may go */
  uint64_t batch;     /* driven: examples per rank (gs_engine_set_batch) */
  double last_end_ms; /* driven: the previous end_step's end, for samples/s */
} step_drive_t;

/* Blocking waits of the training thread (the step result's counts): for
 * the comm thread (the device counts its own, gs_device_waits_t), and
 * both as they were at the last end_step. */
typedef struct step_waits {
  uint64_t comm;
  uint64_t comm_mark;
  gs_device_waits_t device_mark;
} step_waits_t;

struct gs_engine {
  gs_engine_config_t cfg; /* its strings point at the copies below */
  char *job, *token, *checkpoint_dir;
  char *tls_ca, *tls_cert, *tls_key;
  gs_client_tls_t *tls; /* made from them by start; NULL: plaintext */
  char *layout_desc;    /* gs_engine_set_layout_desc's, or made from the params at start */
  gs_log_t log;         /* cfg.log when the caller gave none */
  bool owns_dev;        /* cfg.dev was opened by start (from cfg.device) */
  char error[768];
  gs_ckpt_writer_t ckpt_writer; /* rank 0's checkpoints, written in the background */
  bool ckpt_taken;              /* a checkpoint was handed to the writer, of step ckpt_step */
  uint64_t ckpt_step;
  gs_packs_t packs;
  engine_shard_t shard; /* sharded optimizer state (shard.h) */
  uint64_t state_hash;  /* the last hash gs__engine_check_same_state agreed on */
  gs_client_t *client;
  gs_heartbeat_t *hb;
  gs_comm_t *comm;
  engine_membership_t member; /* its membership of the job (membership.h) */
  int32_t period;
  double grad_scale;

  engine_groups_t groups;
  uint64_t optim_steps; /* the updates applied (torch's "step") */
  float *skip_dev;      /* device flag: the step's summed gradients are not all finite */
  void *resumed_extra;  /* rank 0: a resumed checkpoint's front end bytes */
  size_t resumed_extra_len;
  reduced_t reduced;
  gs_step_result_t reduced_out; /* what a regroup during gs_engine_synchronize said */
  float step_factor;            /* gs_engine_scale_step's, for this step's update (default 1) */
  bool skip_requested;          /* gs_engine_skip_step's: this step's update is not applied */
  float lr_scale;               /* elastic_lr linear: world / world_size */
  float operator_lr_scale;      /* the coordinator's control (lr_scale), in effect; 1 unset */

  /* Elastic membership (elastic.c). The state every rank of the
   * generation holds at the last step whose SGD it applied in full: what
   * a regroup keeps, and shares from the rank at the newest step. */
  bool has_state;
  gs_position_t committed;
  size_t nctl_cap; /* control vector room: for the largest world */

  /* The comm thread and what it shares with the training thread. */
  comm_thread_t ct;

  /* The first failed collective or broken step (0: none) and its words:
   * the ranks' buffers and the communicator are then in an unknown state,
   * so every later step, collective and checkpoint is refused with it. */
  int failed;
  char failure[768];

  /* The step in progress (training thread only). */
  bool in_step;
  bool *ready; /* per param */
  /* Packs 0 .. nissued-1 are issued. Packs are issued strictly in pack-list
   * order, on every rank the same whatever order backward reports the
   * gradients in: a pack whose gradients are all in waits for the packs
   * before it (see issue_ready() in step.c). */
  uint32_t nissued;
  int64_t repeated_param; /* reported twice in this step, or -1 */
  uint64_t *ticket;       /* per pack: its allreduce's number (stream-ordered backends) */
  int launch_err;         /* the first failure to queue an allreduce this step */
  float *ctl;             /* this rank's control vector, as uploaded: ctl_up[steps begun % 2] */
  float *ctl_up[2];       /* host (pinned): a step's upload may still be queued at the next */
  float *ctl_dev;         /* where it rides: after the grads of the last pack */
  size_t nctl;
  void *aux_dev;               /* device staging for host buffers (stream-ordered), AUX_BYTES */
  gs_control_local_t ctl_mine; /* what this rank wrote, for the in-step check */
  uint64_t steps_begun;        /* begin_step calls since start */
  gs_position_t after;
  double step_start_ms; /* when begin_step was called */
  float loss;
  uint64_t seen_broadcast_seq, seen_checkpoint_seq, coordinator_id;
  uint64_t seen_regroup_seq;     /* rank 0: the regroup directive passed on */
  uint32_t queued_between_steps; /* stream-ordered collectives queued since a sync (QUEUED_...) */
  step_drive_t drive;
  step_waits_t waits;
  /* Steps' readbacks in flight (decide.c): flight[after.step % 2]; late:
   * cfg.decide late in a fixed world, decided at the next step's end. */
  step_flight_t flight[2];
  bool late;
  phase_board_t board;
  trace_rec_t trace;
};

#define AUX_BYTES (1u << 20) /* host buffers reach a device backend in pieces of this */
/* A stream-ordered backend's collectives on device memory between steps
 * (a front end's buffers before its forward) queued without a sync: the
 * next step's sync covers them; past this many, one waits. */
#define QUEUED_BETWEEN_STEPS 8

/* step.c: a driven step (cfg.driven) begun by its first gradient (or by
 * the loss, or end_step, when none came), and its last pack released
 * (with the missing gradients counted as zeros when
 * cfg.zero_missing_grads); the packs whose gradients are all in launched
 * (drive.c calls them once the loss releases the last one). */
void gs__engine_drive_begin(gs_engine_t *e);
void gs__engine_drive_release(gs_engine_t *e);
void gs__engine_issue_ready(gs_engine_t *e);
/* decide.c: a step's readback queued into flight f (fence k); taken
 * (waiting for its fence: counted as a sync when `drains`), its
 * verdicts decided (0; GS_ERANGE for a stop at a non-finite step, the
 * position rolled back when it was not applied; a failure) and its
 * control vector decoded into c; two controls merged, and whether they ask
 * for anything; acting on them after `step`. */
int gs__engine_flight_queue(gs_engine_t *e, step_flight_t *f, uint32_t k) GS_WARN_UNUSED;
int gs__engine_flight_take(gs_engine_t *e, step_flight_t *f, bool drains, gs_control_t *c,
                           gs_step_result_t *out) GS_WARN_UNUSED;
void gs__engine_controls_merge(gs_control_t *into, const gs_control_t *c);
bool gs__engine_controls_act(const gs_control_t *c);
int gs__engine_act(gs_engine_t *e, const gs_control_t *c, uint64_t step, double start_ms,
                   gs_step_result_t *out) GS_WARN_UNUSED;

/* progress.c: a driven step's progress, reported at its end. */
void gs__engine_drive_report(gs_engine_t *e, const gs_step_result_t *r);

/* progress.c: the training thread enters a phase (pack: the allreduce's);
 * the heartbeat thread reads where the rank is. */
void gs__engine_enter(gs_engine_t *e, gs_phase_t phase, uint32_t pack);
gs_phase_t gs__engine_phase_now(const gs_engine_t *e);
void gs__engine_where(void *arg, gradsync_Progress *out);

/* trace.c: the step timeline. gs__trace_now is 0 unless recording (then
 * the monotonic clock in µs); the phase that ends, the collective that
 * ran from start_us, and each step's end (which starts, counts and
 * publishes a recording). */
uint64_t gs__trace_now(const gs_engine_t *e);
void gs__trace_phase_end(gs_engine_t *e, uint32_t phase, uint32_t pack);
void gs__trace_collective(gs_engine_t *e, const comm_job_t *job, uint64_t start_us);
void gs__trace_step_end(gs_engine_t *e);
void gs__trace_joined(gs_engine_t *e);
void gs__trace_free(gs_engine_t *e);

/* comm_thread.c (comm_thread.h): the collectives the comm thread runs. */
int gs__engine_run_job(gs_engine_t *e, const comm_job_t *job);
/* Starts (blocking backend: runs) the allreduces of `count` floats of
 * grads: with a 16-bit `wire` buffer, its first `elements` rounded into it
 * and summed there (float32 at each step), then the rest, the control
 * vector, in float32, whose sums must be exact. Widening the wire's sums
 * back into the grads is the caller's, once they are complete. */
int gs__engine_allreduce_grads(gs_engine_t *e, float *grads, size_t count, uint16_t *wire,
                               size_t elements);
/* The same for a sharded step: the grads reduce-scattered (no control
 * vector rides along), and in an elastic job each shard passed on to the
 * next rank, which keeps a copy of its state; the wire's sums this rank
 * uses (its pack windows) widened back into the grads. */
int gs__engine_scatter_grads(gs_engine_t *e, float *grads, size_t count, uint16_t *wire);
void gs__engine_widen_windows(gs_engine_t *e, const struct gs_pack *pk);
/* shard.c: pack k's fused update queued over each of its windows, read
 * through `gated`'s gate when it runs. */
void gs__engine_update_windows(gs_engine_t *e, uint32_t k, const gs_optim_step_t *gated);
/* A collective of the step run on the training thread once the comm
 * thread is idle (a blocking backend), or queued with the device's later
 * work ordered after it (a stream-ordered one). */
int gs__engine_step_collective(gs_engine_t *e, const comm_job_t *job) GS_WARN_UNUSED;
int gs__engine_comm_failed(gs_engine_t *e, int err, const char *what);
int gs__engine_run_now(gs_engine_t *e, job_op_t op, void *buf, size_t count, bool on_device,
                       uint32_t root, const char *what) GS_WARN_UNUSED;
int gs__engine_fail(gs_engine_t *e, int err);
int gs__engine_refuse(gs_engine_t *e, const char *what);

/* endpoint.c: listens for the other ranks as cfg's comm_* settings say;
 * writes the address they dial (the reason in e->error on failure). */
int gs__engine_listen(gs_engine_t *e, char *addr, size_t addr_len) GS_WARN_UNUSED;

/* cfg.grad_dtype as the dtype the packs' grads travel in. */
gs_dtype_t gs__engine_wire_dtype(const gs_engine_t *e);

/* config.c: adds the engine's own settings to e->member.settings (at join). */
int gs__engine_add_own_settings(gs_engine_t *e) GS_WARN_UNUSED;

/* sync.c: whether a checkpoint of `step` was taken (handed to the writer:
 * ckpt_taken and ckpt_step are sync.c's). */
bool gs__engine_checkpointed(const gs_engine_t *e, uint64_t step);
/* sync.c: params (and optimizer state) of every pack broadcast from `root`. */
int gs__engine_broadcast_packs(gs_engine_t *e, bool state, uint32_t root) GS_WARN_UNUSED;
/* sync.c: every rank takes params, momentum and position from the rank
 * the Join named (join.state_rank) and checks that all now hold the same. */
int gs__engine_share_state(gs_engine_t *e, gs_position_t *pos) GS_WARN_UNUSED;
/* state_check.c: whether every rank holds the params and state this one
 * does (their hash; a failure of the engine, naming it, when not). */
int gs__engine_check_same_state(gs_engine_t *e) GS_WARN_UNUSED;

/* shard.c: whether the optimizer state is sharded; the padding each
 * pack's buffers need for it; each pack's window made this rank's shard
 * (after the ranks connect). The whole state, while assembled: opened
 * empty (to load into), or gathered from the shards (collective); the
 * window's part kept and the whole freed, or only freed; a state
 * buffer, whole while assembled. */
static inline bool gs__engine_sharded(const gs_engine_t *e)
{
  return e->cfg.shard_optimizer;
}
/* In an elastic job each rank also keeps a copy of the previous rank's
 * shard and its state, updated as its owner updates it: a lost rank's
 * state survives on the next one (unless both are lost together). */
static inline bool gs__engine_shard_copies(const gs_engine_t *e)
{
  return e->cfg.shard_optimizer && e->cfg.world_min > 0 && gs__membership_world(&e->member) > 1;
}
size_t gs__engine_shard_pad(const gs_engine_t *e);
int gs__engine_shard(gs_engine_t *e) GS_WARN_UNUSED;
/* shard.c: an elastic regroup's state, sharded: every member's windows
 * brought to the newest step any holds (catching up on its update), the
 * whole params and state assembled from the windows of the ranks that
 * held them (a lost rank's from the next rank's copy), checked alike on
 * every rank, and cut into the new world's windows. */
int gs__engine_reshard(gs_engine_t *e) GS_WARN_UNUSED;
int gs__engine_full_state_open(gs_engine_t *e) GS_WARN_UNUSED;
bool gs__engine_full_state_assembled(const gs_engine_t *e);
int gs__engine_full_state_gather(gs_engine_t *e) GS_WARN_UNUSED;
int gs__engine_full_state_keep(gs_engine_t *e) GS_WARN_UNUSED;
void gs__engine_full_state_close(gs_engine_t *e);
float *gs__engine_state_of(const gs_engine_t *e, uint32_t k, uint32_t s);
/* reshard.c: what a regroup needs of the step in progress: its gates'
 * device room (3 floats, at the first generation); the step whose sums
 * the windows hold; an elastic step's update queued (what gated it kept
 * for a rank that must catch up on it), and its readback taken. */
void gs__engine_shard_gates_at(gs_engine_t *e, float *gates);
void gs__engine_shard_reduced(gs_engine_t *e, uint64_t step);
void gs__engine_shard_keep_update(gs_engine_t *e, bool skip_asked);
void gs__engine_shard_taken(gs_engine_t *e);
/* shard.c: state buffer s of pack k, every rank's shard of it, gathered
 * into `whole` (device memory of the pack's room; collective). */
int gs__engine_gather_slot(gs_engine_t *e, uint32_t k, uint32_t s, float *whole) GS_WARN_UNUSED;

/* generation.c: entering a generation, the steps of start a regroup
 * repeats: a new backend listening (its address in `addr`), the first
 * Join, what follows from a Join's answer, the heartbeat, the pack list,
 * going live (the step's state allocated once, the ranks connected, the
 * comm thread started). */
gs_client_config_t gs__engine_client_config(const gs_engine_t *e);
int gs__engine_open_comm(gs_engine_t *e, char *addr, size_t addr_len) GS_WARN_UNUSED;
int gs__engine_join(gs_engine_t *e, const char *comm_addr) GS_WARN_UNUSED;
void gs__engine_joined(gs_engine_t *e);
void gs__engine_operator_lr_scale(gs_engine_t *e, float scale);
int gs__engine_start_heartbeat(gs_engine_t *e) GS_WARN_UNUSED;
int gs__engine_agree_packlist(gs_engine_t *e) GS_WARN_UNUSED;
int gs__engine_go_live(gs_engine_t *e) GS_WARN_UNUSED;

/* elastic.c: whether the job is elastic; the regroup after a failed step
 * (`why`: this rank's words for it) or one every rank agreed on; fills
 * out's regroup fields. */
static inline bool gs__engine_elastic(const gs_engine_t *e)
{
  return e->cfg.world_min > 0;
}
int gs__engine_regroup(gs_engine_t *e, const char *why, bool planned, double step_start_ms,
                       gs_step_result_t *out) GS_WARN_UNUSED;
/* elastic.c: whether a failure of the world (not of this rank's setup, nor
 * a signal) is worth a regroup. */
bool gs__engine_may_regroup(int err);
/* elastic.c: the generation start joined broke before any rank trained in
 * it: join the next one, without state (gs_engine_sync_initial follows). */
int gs__engine_regroup_before_training(gs_engine_t *e) GS_WARN_UNUSED;
/* sync.c: every rank of a new generation takes one state: the newest one
 * a member brought (share_state), or, when none brought any, the start of
 * the job (a checkpoint rank 0 resumes, else rank 0's position and
 * params). */
int gs__engine_sync_state(gs_engine_t *e, gs_position_t *pos) GS_WARN_UNUSED;

#endif
