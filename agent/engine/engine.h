/* The sync engine: what a training program links to train data-parallel.
 *
 * It joins the job through the coordinator, builds the packs that store the
 * parameters (pack list from rank 0), connects the collective backend, and
 * then, step by step, overlaps each pack's gradient allreduce with the rest
 * of backward (a comm thread takes packs off a queue as their last gradient
 * is reported), runs the fused SGD step of each pack once its allreduce is
 * done, and carries the control vector: a few floats appended to the grads
 * of the pack reduced last, so every rank reads the same decisions (stop,
 * new broadcast period, broadcast now, checkpoint now, non-finite loss) at
 * the same step with no extra round trip.
 *
 * Usage: new -> register (forward order) -> start -> bind the model's
 * tensors to gs_engine_param/grad -> initialise params -> sync_initial ->
 * per step: forward, begin_step(loss), backward calling grad_ready for each
 * param, end_step -> finish -> free. Not thread-safe: one training thread. */
#ifndef GS_ENGINE_H
#define GS_ENGINE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "client.h"
#include "comm.h"
#include "device.h"
#include "error.h"
#include "heartbeat.h"
#include "log.h"
#include "sgd.h"

typedef struct gs_engine_config {
  gs_client_config_t coord; /* coordinator address, token, job, log */
  uint32_t world_size;
  char node[256]; /* this machine (ranks sort by node, then local_rank) */
  uint32_t local_rank;
  gs_device_t *dev;    /* where params, grads and momentum live (not owned) */
  char device[64];     /* "cpu", "cuda:0" (shown in status) */
  char backend[16];    /* "host" (cpu device) or "nccl" (cuda device) */
  char comm_host[256]; /* address the backend listens on and peers dial */
  uint64_t pack_threshold;
  gs_reduce_op_t reduce;
  gs_sgd_config_t sgd;
  int32_t bcast_period;       /* -1 never, 0 once at start, P after every P-th step */
  const char *checkpoint_dir; /* NULL: no checkpoints */
  uint64_t checkpoint_every;  /* steps; 0: only when asked */
  uint32_t checkpoint_keep;
  bool resume;
  uint64_t join_timeout_ms;         /* waiting for the other ranks */
  uint64_t rpc_timeout_ms;          /* any other coordinator call */
  uint64_t comm_timeout_ms;         /* no progress inside a collective */
  volatile sig_atomic_t *term_flag; /* set by the owner's SIGTERM handler; may be NULL */
  const gs_log_t *log;
} gs_engine_config_t;

/* Where training stands; checkpoints store it. */
typedef struct gs_position {
  uint64_t step; /* steps completed */
  uint64_t epoch;
  uint64_t rng_state;
} gs_position_t;

/* What end_step decided (identically on every rank). */
typedef struct gs_step_result {
  bool stop;             /* stop after this step */
  char stop_reason[160]; /* why, when stop */
  int32_t bcast_period;  /* in effect from the next step */
  bool period_changed;   /* the coordinator changed it at this step */
  bool broadcast;        /* params were broadcast from rank 0 after this step */
  bool checkpoint;       /* a checkpoint was taken after this step */
  double comm_wait_ms;   /* time end_step waited for allreduces */
  double optimizer_ms;   /* time end_step spent in (or waiting for) SGD */
} gs_step_result_t;

typedef struct gs_engine gs_engine_t;

/* Copies the config. NULL on allocation failure. */
gs_engine_t *gs_engine_new(const gs_engine_config_t *cfg);
/* Stops the threads, closes connections and frees (NULL is a no-op). */
void gs_engine_free(gs_engine_t *e);

/* The reason for the last failure, for the user. */
const char *gs_engine_error(const gs_engine_t *e);

/* Registers a float32 parameter, in forward order. Returns its index or a
 * negative GS_E* code. */
int gs_engine_register(gs_engine_t *e, const char *name, uint64_t elements, bool is_bias);

/* Joins the job, agrees on the pack list, allocates the packs, connects the
 * ranks and starts the heartbeat. */
int gs_engine_start(gs_engine_t *e) GS_WARN_UNUSED;

uint32_t gs_engine_rank(const gs_engine_t *e);
uint32_t gs_engine_world_size(const gs_engine_t *e);
uint64_t gs_engine_generation(const gs_engine_t *e);
uint32_t gs_engine_pack_count(const gs_engine_t *e);
int32_t gs_engine_bcast_period(const gs_engine_t *e);

/* Views of parameter i and its gradient in the packs (after start; device
 * memory of cfg.dev). */
float *gs_engine_param(const gs_engine_t *e, uint32_t i);
float *gs_engine_grad(const gs_engine_t *e, uint32_t i);

/* Makes every rank start from the same state: with --resume rank 0 loads
 * the newest valid checkpoint and broadcasts params, momentum and position
 * (`pos` is overwritten); otherwise, unless the broadcast period is -1,
 * rank 0's params are broadcast. */
int gs_engine_sync_initial(gs_engine_t *e, gs_position_t *pos) GS_WARN_UNUSED;

/* After forward, before backward: `loss` is this rank's loss (a non-finite
 * one stops every rank at this step), `after` the position once this step
 * is done (what a checkpoint at its end records). */
void gs_engine_begin_step(gs_engine_t *e, float loss, const gs_position_t *after);

/* Backward reports parameter i's gradient as final (a gs_grad_ready_fn:
 * `engine` is the gs_engine_t). The pack's allreduce starts when its last
 * gradient is in. */
void gs_engine_grad_ready(void *engine, uint32_t i);

/* Waits for every pack's allreduce, applies SGD pack by pack as each is
 * done, then acts on the control vector. Errors (a parameter without a
 * gradient, a non-finite loss on any rank, a failed or aborted collective)
 * are returned with gs_engine_error saying what happened. */
int gs_engine_end_step(gs_engine_t *e, gs_step_result_t *out) GS_WARN_UNUSED;

/* Sums `n` floats over all ranks in place (metrics such as validation
 * accuracy). Not during a step. */
int gs_engine_allreduce_sum(gs_engine_t *e, float *buf, size_t n) GS_WARN_UNUSED;

/* Rank 0 writes a checkpoint of the current params and momentum at `pos`
 * (no-op elsewhere, and without a checkpoint dir). */
int gs_engine_checkpoint(gs_engine_t *e, const gs_position_t *pos) GS_WARN_UNUSED;

/* Progress for the coordinator (sent with the next heartbeat). */
void gs_engine_report(gs_engine_t *e, const gs_progress_t *p);

/* Leaves the job (finished or failed, with a reason), stops the heartbeat
 * and closes the collective connections. */
void gs_engine_finish(gs_engine_t *e, bool finished, const char *reason);

#endif
