/* libgradsync: the sync engine, what a training program links to train
 * data-parallel with gradsync.
 *
 * It joins the job through the coordinator, builds the packs that store the
 * parameters (pack list from rank 0), connects the collective backend, and
 * then, step by step, overlaps each pack's gradient allreduce with the rest
 * of backward (a comm thread takes packs off a queue as their last gradient
 * is reported), runs the fused optimizer step of each pack (SGD, Adam or
 * AdamW, torch.optim's arithmetic, per parameter group) once its gradients
 * are reduced and found finite, and carries the control vector: a few floats appended to the grads
 * of the pack reduced last, so every rank reads the same decisions (stop,
 * new broadcast period, broadcast now, checkpoint now, non-finite loss) at
 * the same step with no extra round trip.
 *
 * Usage: config_defaults -> set the fields -> new -> register (forward
 * order) -> start -> bind the model's tensors to gs_engine_param/grad ->
 * initialise params -> sync_initial -> per step: forward, begin_step(loss),
 * backward calling grad_ready for each param, end_step -> finish -> free.
 * Not thread-safe: one training thread.
 *
 * Errors: functions that act return 0 or a negative code of gradsync's
 * error table; gs_engine_strerror names one, and gs_engine_error says what
 * went wrong in words. This header is self-contained: C11 and standard
 * headers only; build with `pkg-config --cflags --libs gradsync`. */
#ifndef GRADSYNC_ENGINE_H
#define GRADSYNC_ENGINE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libgradsync exports (everything else in it is hidden). */
#if defined(__GNUC__)
#define GS_ENGINE_API __attribute__((visibility("default")))
#define GS_ENGINE_WARN_UNUSED __attribute__((warn_unused_result))
#else
#define GS_ENGINE_API
#define GS_ENGINE_WARN_UNUSED
#endif

/* ---- opaque types ------------------------------------------------------ */

typedef struct gs_engine gs_engine_t;
/* A log sink and a compute device of gradsync's own programs (the
 * reference trainer passes its own); other programs leave them NULL. */
struct gs_log;
struct gs_device;

/* ---- configuration ----------------------------------------------------- */

/* How gradients combine across ranks. */
typedef enum gs_reduce_op {
  GS_REDUCE_SUM = 0,
  GS_REDUCE_MEAN, /* the sum divided by the world size */
} gs_reduce_op_t;

typedef enum gs_lr_schedule {
  GS_LR_CONSTANT = 0,
  GS_LR_STEP,   /* lr * gamma^floor(step / step_size) */
  GS_LR_COSINE, /* lr * (1 + cos(pi * step / total_steps)) / 2 */
} gs_lr_schedule_t;

/* SGD with momentum and weight decay, PyTorch's semantics (torch.optim.SGD
 * with dampening 0), plus Detectron's per-parameter rules (bias LR
 * multiplier and bias weight decay) and a learning-rate schedule. */
typedef struct gs_sgd_config {
  float lr;              /* base learning rate (default 0.05) */
  float momentum;        /* default 0.9 */
  float weight_decay;    /* default 5e-4 */
  bool nesterov;         /* needs momentum > 0 */
  float bias_lr_mult;    /* LR multiplier of biases (default 1; Detectron 2) */
  float bias_wd;         /* weight decay of biases (default: weight_decay; Detectron 0) */
  uint64_t warmup_steps; /* linear warmup from warmup_factor * lr (default 0) */
  float warmup_factor;   /* default 1/3, as Detectron */
  gs_lr_schedule_t schedule;
  uint64_t step_size;   /* GS_LR_STEP */
  float gamma;          /* GS_LR_STEP, default 0.1 */
  uint64_t total_steps; /* GS_LR_COSINE */
} gs_sgd_config_t;

/* The optimizers the engine runs fused over the packs, with torch.optim's
 * arithmetic (SGD, Adam, AdamW of PyTorch 1.13 and later). */
typedef enum gs_optim_kind {
  GS_OPTIM_SGD = 0,
  GS_OPTIM_ADAM,
  GS_OPTIM_ADAMW,
  /* No update: the caller applies its own optimizer to the reduced
   * gradients between gs_engine_synchronize and end_step. */
  GS_OPTIM_NONE,
} gs_optim_kind_t;

/* One parameter group's hyperparameters, as torch.optim's param_groups
 * hold them. A front end adds its groups before start
 * (gs_engine_add_group) and may change them between steps
 * (gs_engine_set_group), as a learning-rate scheduler does; the engine
 * reads them at every step. Fields of the other optimizers are ignored. */
typedef struct gs_optim_group {
  /* Doubles, as torch holds them (Python floats): 1 - beta2 of a float
   * beta2 would differ from torch's by 1e-5 relative. */
  double lr;
  double weight_decay; /* SGD, Adam: L2 added to the gradient; AdamW: decoupled */
  bool maximize;       /* ascend: the gradient's sign flipped */
  double momentum;     /* SGD */
  double dampening;    /* SGD (not applied to the first step's buffer, as torch) */
  bool nesterov;       /* SGD: needs momentum > 0 and dampening 0 */
  double beta1, beta2; /* Adam, AdamW */
  double eps;          /* Adam, AdamW */
  bool amsgrad;        /* Adam, AdamW: fixed once the engine has started */
} gs_optim_group_t;

/* What an engine does when a step's summed gradients hold NaN or an
 * infinity (in any parameter; checked before any of the step is applied). */
typedef enum gs_nonfinite {
  GS_NONFINITE_STOP = 0, /* the step is not applied; every rank stops at it (default) */
  GS_NONFINITE_SKIP,     /* the step is not applied; every rank goes on (loss scaling) */
  GS_NONFINITE_OFF,      /* not checked: each pack's update is applied as its sum arrives */
} gs_nonfinite_t;

/* When the host takes a step's decisions (its non-finite verdict, a stop,
 * a checkpoint, a broadcast the coordinator asked for; docs/design.md,
 * "Decisions, now or a step later"). The update of a non-finite step is
 * skipped on the device either way. */
typedef enum gs_decide {
  /* At the step's own end_step: the host waits for the device once a step
   * (the default). */
  GS_DECIDE_NOW = 0,
  /* At the next step's end_step, before its update is queued: the host
   * never waits for the device in a steady step, and a step's result says
   * what became of the step before it (a step that acts, a periodic
   * checkpoint or broadcast or a request, decides on itself too). A stop
   * at a non-finite step comes one step later, with neither update
   * applied. A fixed world only: an elastic job decides now. */
  GS_DECIDE_LATE,
} gs_decide_t;

/* What a pack's gradients travel in (the allreduce): float32, or half the
 * bytes as bfloat16 or float16, added in float32 at every step of the
 * reduction; the packs, the update and the parameters stay float32. */
typedef enum gs_grad_dtype {
  GS_GRAD_FP32 = 0, /* default */
  GS_GRAD_BF16,
  GS_GRAD_FP16,
} gs_grad_dtype_t;

/* Where the coordinator is and which job to join. */
/* Ports `first`..`last`, both included; {0, 0}: any free port. */
typedef struct gs_port_range {
  uint16_t first, last;
} gs_port_range_t;

typedef struct gs_engine_coord {
  char host[256];           /* address (default "127.0.0.1") */
  uint16_t port;            /* its RPC port (required) */
  const char *token;        /* shared secret or NULL; copied by gs_engine_new; never logged */
  const char *job;          /* job name (default "local"); copied by gs_engine_new */
  const struct gs_log *log; /* borrowed; NULL: the engine's log */
  /* TLS to a coordinator started with --tls-cert (paths to PEM files,
   * copied by gs_engine_new; NULL: none). tls_ca turns TLS on: the CA
   * that signed the coordinator's certificate, which must name `host`
   * (its DNS name, or its IP address in subjectAltName). tls_cert and
   * tls_key: this rank's certificate and key, for a coordinator that
   * demands one (--tls-client-ca). The files are read by gs_engine_start,
   * which fails naming the file when one is unusable. */
  const char *tls_ca;
  const char *tls_cert;
  const char *tls_key;
} gs_engine_coord_t;

/* Elastic jobs: what the learning rate does when the world changes. */
typedef enum gs_elastic_lr {
  GS_ELASTIC_LR_KEEP = 0, /* the same lr at any world size */
  GS_ELASTIC_LR_LINEAR,   /* lr x world / world_size (the largest world): the lr follows the
                             global batch (Goyal et al.), as with --reduce mean it grows with the
                             world */
} gs_elastic_lr_t;

/* Everything gs_engine_new needs. Start from gs_engine_config_defaults.
 * gs_engine_new copies the struct and every string it points to; the
 * pointers marked "borrowed" must outlive the engine. */
typedef struct gs_engine_config {
  gs_engine_coord_t coord;
  uint32_t world_size; /* ranks in the job (default 1); elastic: the most */
  /* Elastic jobs (docs/design.md, "Elastic membership"): 0 (default) is a
   * fixed world of world_size ranks, where a lost rank ends the job;
   * 1..world_size makes the job elastic: a lost rank costs the step in
   * flight, and the others go on (end_step's `regrouped`) as long as
   * world_min remain; new agents join at a step boundary. */
  uint32_t world_min;
  uint64_t rejoin_timeout_ms; /* elastic: how long a regroup waits for world_min (default 5 min) */
  gs_elastic_lr_t elastic_lr;
  char node[256]; /* this machine (ranks sort by node, then local_rank; default: host name) */
  uint32_t local_rank;
  /* A fixed world's rank as the launcher numbered it (torchrun's: node
   * rank x ranks per node + local rank), with has_rank: the Join asks for
   * it, and an answer with another fails the Join. Without (default), and
   * in an elastic job: the coordinator orders the ranks by node, then
   * local_rank. */
  bool has_rank;
  uint32_t rank;
  /* Where params, grads and momentum live: borrowed when not NULL (a
   * device gradsync's own trainer opened); NULL: the engine opens the
   * device named by `device` ("cpu", "cuda" or "cuda:N") and closes it in
   * gs_engine_free. */
  struct gs_device *dev;
  char device[64]; /* "cpu" (default), "cuda:0" (also shown in status) */
  /* With a cuda device the engine opens: the stream (a cudaStream_t,
   * borrowed; cudaStreamLegacy for the default stream) to queue its device
   * work on, the framework's current stream, so the framework's kernels
   * and the engine's (SGD, the allreduces' ordering) need no events
   * between them. NULL: a stream of the engine's own. */
  void *cuda_stream;
  char backend[16]; /* "host" (default; cpu device) or "nccl" (cuda device) */
  /* host backend: every link on TCP, none through shared memory between
   * ranks on one machine (default: $GRADSYNC_HOST_SHM=0, else false). */
  bool host_tcp_only;
  /* Where the other ranks reach this one (host backend; nccl: which
   * interface NCCL's sockets use). Default: this host's address on its
   * route to the coordinator. */
  char comm_iface[64];        /* "": none; else use this interface's address */
  char comm_bind[256];        /* address to listen on ("0.0.0.0": every interface); "": the above */
  char comm_advertise[256];   /* "host" or "host:port" peers dial (NAT); "": the bound address */
  gs_port_range_t comm_ports; /* ports to listen on, the first free one ({0, 0}: any) */
  uint64_t pack_threshold;    /* largest gradient pack in bytes (default 10 MiB) */
  gs_reduce_op_t reduce;      /* default GS_REDUCE_MEAN */
  gs_sgd_config_t sgd;
  /* The optimizer (default SGD, configured by `sgd`, its schedule and bias
   * rules). Adam and AdamW need parameter groups (gs_engine_add_group);
   * SGD may have them too, and then the groups, not `sgd`, say what it
   * does. */
  gs_optim_kind_t optim;
  gs_nonfinite_t nonfinite;
  gs_decide_t decide;         /* default GS_DECIDE_NOW; every rank the same (a Join setting) */
  gs_grad_dtype_t grad_dtype; /* default GS_GRAD_FP32 */
  /* Sharded optimizer state (ZeRO-1 over the packs): each pack's
   * gradients are reduce-scattered, each rank updates and keeps the
   * optimizer state of its shard only (1/world of it), and the updated
   * params are allgathered; the same bytes on the wire as an allreduce
   * with float32 grads. Default false; every rank the same (a Join
   * setting). In an elastic world each rank also keeps (and updates) a
   * copy of the previous rank's shard, so that a lost rank's state
   * survives on the next one: 2/world of the state, and 1/world of the
   * gradients' bytes more a step. */
  bool shard_optimizer;
  int32_t bcast_period;       /* -1 never, 0 once at start (default), P after every P-th step */
  const char *checkpoint_dir; /* NULL: no checkpoints; copied by gs_engine_new */
  uint64_t checkpoint_every;  /* steps; 0: only when asked (default) */
  uint32_t checkpoint_keep;   /* default 3 */
  /* Failed checkpoint writes in a row (a full or read-only disk) that end
   * training; fewer are warnings, and the next checkpoint tries again
   * (default 3; 1: the first failure ends it). */
  uint32_t checkpoint_failures;
  /* A front end's own bytes in every checkpoint (its model's buffers, an
   * optimizer state of its own): called by rank 0 on the training thread
   * as it takes one; returns malloc'd bytes the engine frees (NULL: none),
   * their length in *len. After a resume rank 0 finds them with
   * gs_engine_resumed_extra. */
  void *(*checkpoint_extra)(void *arg, size_t *len);
  void *checkpoint_extra_arg;
  /* Start from the newest valid checkpoint: none is an error (so is one of
   * another layout), unless resume_auto, which starts fresh when there is
   * none (not when there is one of another layout). */
  bool resume;
  bool resume_auto;
  uint64_t join_timeout_ms; /* waiting for the other ranks (default 5 min) */
  uint64_t rpc_timeout_ms;  /* any other coordinator call (default 30 s) */
  uint64_t comm_timeout_ms; /* no progress inside a collective (default 2 min) */
  /* Heartbeats say nothing of where the rank is (its phase, send wait):
   * the coordinator cannot name it when it holds a job up. For measuring
   * what that costs (bench/hang_inject.sh); default false. */
  bool no_progress;
  uint64_t connect_timeout_ms; /* the ranks' connections not formed (default 15 s) */
  /* The coordinator unreachable for this long ends training (default 10
   * min); through a shorter outage the ranks train on, re-register when it
   * is back, and it takes the job up again. At most the heartbeat
   * timeout: the old behaviour, abort as soon as it is unreachable. */
  uint64_t coordinator_grace_ms;
  /* Set (to the signal's number) by the owner's SIGTERM/SIGINT handler:
   * during training every rank stops at the same step; during start the
   * waits for the coordinator (Join, the pack list, the comm id) end
   * within 100 ms with an error naming the signal. Borrowed; may be NULL. */
  volatile sig_atomic_t *term_flag;
  const struct gs_log *log; /* borrowed; NULL: info and above to stderr */
  /* A front end that learns the loss only after backward (a framework's
   * loss.backward(), then optimizer.step(loss)) lets the engine drive the
   * step: the first gradient reported outside a step begins one (the
   * position after it: one step more, `sample` advanced by
   * gs_engine_set_batch's batch times the world), the last pack's
   * allreduce, which carries the loss's verdict, waits for
   * gs_engine_set_loss_at (or end_step), and end_step reports the rank's
   * progress itself (gs_engine_report). Default false: the caller begins
   * each step with gs_engine_begin_step and reports. */
  bool driven;
  /* driven: a parameter that got no gradient in a step counts as a zero
   * gradient (DDP's find_unused_parameters); default false: the step
   * fails naming it. */
  bool zero_missing_grads;
} gs_engine_config_t;

/* Fills `cfg` with the defaults above (port and world size still to set). */
GS_ENGINE_API void gs_engine_config_defaults(gs_engine_config_t *cfg);

/* The SGD defaults of gs_sgd_config_t. */
GS_ENGINE_API void gs_sgd_config_default(gs_sgd_config_t *c);
/* A negative code with a reason in `why` for nonsense (negative lr or
 * decay, momentum outside [0, 1), nesterov without momentum, a step
 * schedule without step_size, ...). */
GS_ENGINE_API int gs_sgd_config_check(const gs_sgd_config_t *c, char *why,
                                      size_t why_len) GS_ENGINE_WARN_UNUSED;
/* "constant", "step" or "cosine"; "sum" or "mean". */
GS_ENGINE_API int gs_lr_schedule_parse(const char *s, gs_lr_schedule_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_lr_schedule_name(gs_lr_schedule_t s);
GS_ENGINE_API int gs_reduce_op_parse(const char *s, gs_reduce_op_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_reduce_op_name(gs_reduce_op_t op);
/* "keep" or "linear". */
GS_ENGINE_API int gs_elastic_lr_parse(const char *s, gs_elastic_lr_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_elastic_lr_name(gs_elastic_lr_t v);
/* "sgd", "adam", "adamw" or "none". */
GS_ENGINE_API int gs_optim_kind_parse(const char *s, gs_optim_kind_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_optim_kind_name(gs_optim_kind_t k);
/* "stop", "skip" or "off". */
GS_ENGINE_API int gs_nonfinite_parse(const char *s, gs_nonfinite_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_nonfinite_name(gs_nonfinite_t v);
GS_ENGINE_API int gs_decide_parse(const char *s, gs_decide_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_decide_name(gs_decide_t v);
/* "fp32", "bf16" or "fp16". */
GS_ENGINE_API int gs_grad_dtype_parse(const char *s, gs_grad_dtype_t *out) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API const char *gs_grad_dtype_name(gs_grad_dtype_t v);
/* torch.optim's defaults for `kind` (lr 1e-3; Adam, AdamW: betas 0.9,
 * 0.999, eps 1e-8; AdamW: weight decay 1e-2). */
GS_ENGINE_API void gs_optim_group_default(gs_optim_kind_t kind, gs_optim_group_t *g);
/* A negative code with the reason in `why` for what torch.optim refuses
 * (a negative lr, eps or decay, betas outside [0, 1), nesterov without
 * momentum or with dampening, ...). */
GS_ENGINE_API int gs_optim_group_check(gs_optim_kind_t kind, const gs_optim_group_t *g, char *why,
                                       size_t why_len) GS_ENGINE_WARN_UNUSED;

/* ---- training ---------------------------------------------------------- */

/* Where training stands; checkpoints store it. */
typedef struct gs_position {
  uint64_t step; /* steps completed */
  uint64_t epoch;
  uint64_t rng_state;
  /* Examples of `epoch` trained on, over all ranks: where its data goes
   * on when the world size changes (elastic jobs). GS_POSITION_SAMPLE_UNKNOWN
   * after resuming a checkpoint written before it was stored (format 3):
   * the front end derives it from the step. */
  uint64_t sample;
} gs_position_t;
#define GS_POSITION_SAMPLE_UNKNOWN UINT64_MAX

/* What end_step decided (identically on every rank). */
typedef struct gs_step_result {
  bool stop;             /* stop after this step */
  char stop_reason[160]; /* why, when stop */
  int32_t bcast_period;  /* in effect from the next step */
  bool period_changed;   /* the coordinator changed it at this step */
  /* The operator's lr scale (POST /jobs/NAME/control {"lr_scale": x}),
   * in effect from the next step's update: every group's lr times it. */
  float lr_scale;
  bool lr_scale_changed; /* the coordinator changed it at this step */
  bool broadcast;        /* params were broadcast from rank 0 after this step */
  bool checkpoint;       /* a checkpoint was taken after this step */
  /* A rank's loss, or the summed gradients, held NaN or an infinity: the
   * step was not applied. With GS_NONFINITE_STOP (and for a loss) end_step
   * failed with stop set and stop_reason naming the step and the ranks or
   * the first parameter; with GS_NONFINITE_SKIP `skipped` is set instead
   * and training goes on. */
  bool nonfinite;
  bool skipped;
  /* Elastic jobs: the world changed (a rank was lost, or new ones joined)
   * and this rank goes on as gs_engine_rank() of gs_engine_world_size().
   * Training continues from `resume`, the position every rank now holds
   * (the step in flight was discarded unless it completed everywhere it
   * could): the front end moves its position and its data sharding there. */
  bool regrouped;
  gs_position_t resume;
  double detect_ms;    /* regrouped: from the failed step's start to noticing the failure */
  double regroup_ms;   /* regrouped: from noticing to the state shared in the new world */
  double comm_wait_ms; /* time end_step waited for allreduces */
  double optimizer_ms; /* time end_step spent in (or waiting for) SGD */
  /* How often the training thread blocked since the previous step's
   * end_step (the front end's calls between steps included): on the
   * device, a stream or event synchronization that left it with nothing
   * queued (a wait for an older step while this one's work is queued
   * behind it keeps the device busy, and is not counted) and a
   * device-to-host copy waited for; for the comm thread, a pack's
   * allreduce not yet done. A steady step on the cpu makes no device
   * wait; on a GPU one a step deciding now (cfg.decide), none late. */
  uint32_t device_syncs, device_reads, comm_waits;
  /* The optimizer state this rank holds, in bytes: every parameter's, or
   * with shard_optimizer its shard's. */
  uint64_t state_bytes;
} gs_step_result_t;

/* What the rank reports to the coordinator (sent with the next heartbeat). */
typedef struct gs_progress {
  uint64_t step;
  float loss;
  float samples_per_sec;
  float compute_ms;   /* per step, recent average */
  float comm_wait_ms; /* per step, recent average */
} gs_progress_t;

/* What the rank is doing, sent with every heartbeat so that the
 * coordinator can name the rank a stalled job waits on, and for how long.
 * The engine sets the phases of its own calls (allreduce, optimizer,
 * checkpoint, sync; compute from begin_step; data once end_step returns);
 * a front end says when its forward starts (GS_PHASE_COMPUTE) and may say
 * when it loads data. */
typedef enum gs_phase {
  GS_PHASE_IDLE,       /* not training: joining, regrouping, finished */
  GS_PHASE_DATA,       /* between steps: the next batch, the script's own work */
  GS_PHASE_COMPUTE,    /* forward and backward */
  GS_PHASE_ALLREDUCE,  /* waiting for a pack's allreduce */
  GS_PHASE_OPTIMIZER,  /* the update */
  GS_PHASE_CHECKPOINT, /* taking a checkpoint */
  GS_PHASE_SYNC        /* a collective outside the step */
} gs_phase_t;

/* Called by a model's backward as each parameter's gradient becomes final
 * (gs_engine_grad_ready is one, with the engine as `arg`). */
typedef void (*gs_grad_ready_fn)(void *arg, uint32_t param_index);

/* Copies the config and its strings. NULL on allocation failure. */
GS_ENGINE_API gs_engine_t *gs_engine_new(const gs_engine_config_t *cfg);
/* Stops the threads, closes connections (and a device the engine opened)
 * and frees (NULL is a no-op). */
GS_ENGINE_API void gs_engine_free(gs_engine_t *e);

/* The reason for the first failure, for the user (owned by the engine). */
GS_ENGINE_API const char *gs_engine_error(const gs_engine_t *e);
/* The name of an error code ("timed out", ...); static storage. */
GS_ENGINE_API const char *gs_engine_strerror(int err);

/* Registers a float32 parameter, in forward order (`name` is copied).
 * Returns its index or a negative code. */
GS_ENGINE_API int gs_engine_register(gs_engine_t *e, const char *name, uint64_t elements,
                                     bool is_bias);

/* Gives parameter i its own learning-rate multiplier and weight decay,
 * instead of the bias rules (bias_lr_mult, bias_wd) or the defaults (1,
 * weight_decay): a front end's parameter groups. Before start; every rank
 * must give the same (add a setting that says so). */
GS_ENGINE_API int gs_engine_param_rule(gs_engine_t *e, uint32_t i, float lr_mult,
                                       float weight_decay) GS_ENGINE_WARN_UNUSED;

/* Parameter groups (torch.optim's param_groups). The first call turns
 * the engine's `sgd` settings off (its schedule and bias rules): from
 * then on the groups say everything, and every parameter is in group 0
 * unless gs_engine_param_group puts it elsewhere. Returns the group's
 * index or a negative code (gs_engine_error says why). Before start; the
 * engine adds a setting of the groups at Join, so every rank must give
 * the same. */
GS_ENGINE_API int gs_engine_add_group(gs_engine_t *e, const gs_optim_group_t *g);
GS_ENGINE_API int gs_engine_param_group(gs_engine_t *e, uint32_t i,
                                        uint32_t group) GS_ENGINE_WARN_UNUSED;
/* Changes a group's hyperparameters from the next step on (a scheduler's
 * lr): between steps, the same on every rank (nothing checks that after
 * Join). amsgrad cannot change after start. */
GS_ENGINE_API int gs_engine_set_group(gs_engine_t *e, uint32_t group,
                                      const gs_optim_group_t *g) GS_ENGINE_WARN_UNUSED;

/* The optimizer's state per parameter, in the packs (after start; device
 * memory): slot 0 is SGD's momentum buffer, or Adam's exp_avg, 1 its
 * exp_avg_sq, 2 its max_exp_avg_sq (amsgrad). NULL for a slot the
 * optimizer does not have, and with shard_optimizer for a parameter not
 * wholly in this rank's shard. */
#define GS_OPTIM_MAX_STATE 3
GS_ENGINE_API uint32_t gs_engine_state_count(const gs_engine_t *e);
GS_ENGINE_API float *gs_engine_state(const gs_engine_t *e, uint32_t i, uint32_t slot);
/* The bytes of optimizer state this rank holds (after start): every
 * parameter's, or with shard_optimizer its shard's. */
GS_ENGINE_API uint64_t gs_engine_state_bytes(const gs_engine_t *e);
/* With shard_optimizer, every parameter's optimizer state assembled on
 * every rank (a collective: every rank calls it, between steps; the whole
 * state's memory until released), so that gs_engine_state gives every
 * parameter's: a consolidated state_dict, or one to load (`empty`: zeroed,
 * not gathered). Released, this rank keeps its shard of what it then
 * holds when `keep` (a loaded state), else its own shard as it was.
 * Without sharding both do nothing. */
GS_ENGINE_API int gs_engine_state_assemble(gs_engine_t *e, bool empty) GS_ENGINE_WARN_UNUSED;
/* Parameter i's elements in this rank's shard (after start): the first
 * one and how many (all of them unsharded; none when its pack's shard
 * lies elsewhere). Where a sharded step leaves the reduced gradients,
 * and the update the rank applies. */
GS_ENGINE_API void gs_engine_window(const gs_engine_t *e, uint32_t i, uint64_t *first,
                                    uint64_t *count);
GS_ENGINE_API int gs_engine_state_release(gs_engine_t *e, bool keep) GS_ENGINE_WARN_UNUSED;
/* Optimizer steps applied (torch's state "step"; a skipped step does not
 * count), and setting it with loaded state (between steps; every rank). */
GS_ENGINE_API uint64_t gs_engine_optim_steps(const gs_engine_t *e);
GS_ENGINE_API void gs_engine_set_optim_steps(gs_engine_t *e, uint64_t steps);

/* The most settings an engine sends at Join, its own included. */
#define GS_ENGINE_MAX_SETTINGS 64

/* Adds a setting that decides this rank's sequence of collectives or its
 * arithmetic (batch size, step count, validation, data size, ...). Every
 * setting is sent at Join, and the coordinator refuses a job whose ranks
 * disagree, naming the setting and both values: a rank with one more
 * collective would hang the job, one with another batch drift silently.
 * Call before start; `name` (1-63 characters of [A-Za-z0-9._-]) and
 * `value` (up to 127 bytes) are copied. The engine adds its own at start
 * (backend, reduce, pack-threshold, optimizer, nonfinite, optim-groups
 * with parameter groups, and the SGD settings: lr, momentum,
 * weight-decay, nesterov, bias-lr-mult, bias-wd, warmup-steps,
 * warmup-factor, schedule, lr-step-size, lr-gamma, lr-total-steps), so a
 * front end must not use those names. A negative code, with
 * gs_engine_error saying why, for a bad name or value, a name already
 * added, one past GS_ENGINE_MAX_SETTINGS, or a call after start. */
GS_ENGINE_API int gs_engine_add_setting(gs_engine_t *e, const char *name,
                                        const char *value) GS_ENGINE_WARN_UNUSED;

/* Describes the model's layout in words for its checkpoints ("layers
 * 784,256,10"; at most 4096 bytes, copied), so that resuming with another
 * model names both layouts. Call before start; without it the engine
 * describes the registered parameters by name and size. */
GS_ENGINE_API int gs_engine_set_layout_desc(gs_engine_t *e, const char *desc) GS_ENGINE_WARN_UNUSED;

/* Joins the job, agrees on the pack list, allocates the packs, connects the
 * ranks. The heartbeat starts right after the Join, so that a slow
 * collective init neither looks like a lost rank nor misses an abort. In
 * an elastic job a world that breaks after the Join (a rank lost as the
 * ranks connect) is joined again in its next generation. */
GS_ENGINE_API int gs_engine_start(gs_engine_t *e) GS_ENGINE_WARN_UNUSED;

GS_ENGINE_API uint32_t gs_engine_rank(const gs_engine_t *e);
/* Elastic jobs: the rank whose state every rank took when this generation
 * started (the lowest at the newest step), e.g. for a front end's
 * unpacked buffers; 0 when the generation started fresh. */
GS_ENGINE_API uint32_t gs_engine_state_rank(const gs_engine_t *e);
/* The position of the state this rank holds: the last step it completed,
 * or after an elastic regroup the position it took with the state (what a
 * front end goes on from when gs_engine_allreduce_sum said the world
 * changed: the state may be a step newer than its own). */
GS_ENGINE_API void gs_engine_position(const gs_engine_t *e, gs_position_t *out);
/* Whether `err` is the "world changed" error of gs_engine_allreduce_sum
 * (an elastic regroup happened during it). */
GS_ENGINE_API bool gs_engine_world_changed(int err);
GS_ENGINE_API uint32_t gs_engine_world_size(const gs_engine_t *e);
GS_ENGINE_API uint64_t gs_engine_generation(const gs_engine_t *e);
GS_ENGINE_API uint32_t gs_engine_pack_count(const gs_engine_t *e);
GS_ENGINE_API int32_t gs_engine_bcast_period(const gs_engine_t *e);
/* What the engine's update multiplies every group's lr by: the operator's
 * lr scale (gs_step_result_t.lr_scale) times elastic_lr's world / world
 * size. A front end whose own optimizer steps (not the engine's) scales
 * its lr by it too. */
GS_ENGINE_API float gs_engine_lr_factor(const gs_engine_t *e);

/* Views of parameter i and its gradient in the packs (after start), in the
 * device's memory: plain host memory on the cpu device. */
GS_ENGINE_API float *gs_engine_param(const gs_engine_t *e, uint32_t i);
GS_ENGINE_API float *gs_engine_grad(const gs_engine_t *e, uint32_t i);
/* The pack parameter i lives in (after start). The last pack of the pack
 * list (gs_engine_pack_count() - 1) carries the control vector, with the
 * loss's verdict: see gs_engine_set_loss. */
GS_ENGINE_API uint32_t gs_engine_param_pack(const gs_engine_t *e, uint32_t i);

/* Makes every rank start from the same state: with resume rank 0 loads
 * the newest valid checkpoint and broadcasts params, momentum and position
 * (`pos` is overwritten); no valid checkpoint is an error unless
 * resume_auto (then it starts fresh and says so); a checkpoint of another
 * layout is an error naming both layouts. Otherwise, unless the broadcast
 * period is -1, rank 0's params are broadcast; every rank takes rank 0's
 * position. A rank that joins an elastic job while it runs takes the state
 * of the rank the coordinator names instead; if the world breaks meanwhile
 * it regroups, and the world size may then differ from start's. */
GS_ENGINE_API int gs_engine_sync_initial(gs_engine_t *e, gs_position_t *pos) GS_ENGINE_WARN_UNUSED;

/* After gs_engine_sync_initial resumed a checkpoint, on rank 0: the bytes
 * checkpoint_extra gave it (owned by the engine, until free); NULL (and 0)
 * elsewhere, or when there were none. */
GS_ENGINE_API const void *gs_engine_resumed_extra(const gs_engine_t *e, size_t *len);

/* After forward, before backward: `loss` is this rank's loss (a non-finite
 * one stops every rank at this step), `after` the position once this step
 * is done (what a checkpoint at its end records). */
GS_ENGINE_API void gs_engine_begin_step(gs_engine_t *e, float loss, const gs_position_t *after);

/* For front ends that know the loss only after backward (a framework's
 * loss.backward() then optimizer.step(loss)): replaces the loss given to
 * begin_step. Call it before reporting the last gradient of the last
 * pack, which carries the verdict on the loss to every rank. */
GS_ENGINE_API void gs_engine_set_loss(gs_engine_t *e, float loss);

/* Driven steps (cfg.driven): the examples per rank of the steps from now
 * on (the position's `sample` advances by batch x world; samples/s), and
 * a new epoch, which starts at sample 0 (the same epoch keeps its sample). */
GS_ENGINE_API void gs_engine_set_batch(gs_engine_t *e, uint64_t batch);
GS_ENGINE_API void gs_engine_set_epoch(gs_engine_t *e, uint64_t epoch);

/* The loss of this step as one float in device memory (host memory on the
 * cpu device), never waited for: its verdict (NaN or an infinity on any
 * rank stops every rank at this step, or skips it, as gs_engine_set_loss's)
 * is written into the control vector on the device, and its value reaches
 * the status page through the step's readback. `loss` must stay valid
 * until end_step. Driven steps: releases the last pack. */
GS_ENGINE_API void gs_engine_set_loss_at(gs_engine_t *e, const float *loss);

/* Backward reports parameter i's gradient as final (a gs_grad_ready_fn:
 * `engine` is the gs_engine_t), in any order. The pack's allreduce starts
 * when its last gradient is in and every pack before it in the pack list
 * has started, so every rank runs the same allreduces in the same order;
 * reporting the last parameters first (backward's order) overlaps most. */
GS_ENGINE_API void gs_engine_grad_ready(void *engine, uint32_t i);

/* Waits for every pack's allreduce, applies SGD pack by pack as each is
 * done, then acts on the control vector. Errors (a parameter without a
 * gradient, a non-finite loss on any rank, a failed or aborted collective,
 * ranks at different steps or with different numbers of collectives) are
 * returned with gs_engine_error saying what happened. After any of them
 * but the non-finite loss the engine refuses every later step, collective
 * and checkpoint with the same error: finish it. */
GS_ENGINE_API int gs_engine_end_step(gs_engine_t *e, gs_step_result_t *out) GS_ENGINE_WARN_UNUSED;

/* Decides the step whose readback is still in flight (GS_DECIDE_LATE:
 * the last step's), waiting for the device: `out` says what became of it,
 * as end_step's result (a stop at a non-finite step fails with
 * GS_ERANGE, the position then the one before it). 0 with `out` zeroed
 * when nothing is in flight (GS_DECIDE_NOW, or decided already). A front
 * end calls it after its last step, and before a checkpoint of its own
 * between steps; gs_engine_finish does so itself (a non-finite last step
 * then fails the rank). */
GS_ENGINE_API int gs_engine_drain(gs_engine_t *e, gs_step_result_t *out) GS_ENGINE_WARN_UNUSED;

/* What gs_engine_synchronize found: the sums hold NaN or an infinity (the
 * update will not be applied; end_step says what happens), or an elastic
 * job regrouped and dropped the step (end_step returns the regroup). */
typedef struct gs_sync_result {
  bool nonfinite;
  bool regrouped;
} gs_sync_result_t;

/* Completes the step's allreduces and the check of the sums without
 * applying the update, for a front end that reads the reduced gradients
 * first (clipping, loss scaling, an optimizer of its own with
 * GS_OPTIM_NONE): with `scale` the sums become the gradients the update
 * uses, in place (times 1/world for a mean: what DDP leaves in a
 * parameter's grad). `out` (may be NULL; filling its `nonfinite` waits
 * for the device) says whether the step may be applied. end_step then
 * applies the update and returns what this one failed with (with the
 * regroup of an elastic job, if one happened here). A no-op outside a step
 * or when already done. */
GS_ENGINE_API int gs_engine_synchronize(gs_engine_t *e, bool scale,
                                        gs_sync_result_t *out) GS_ENGINE_WARN_UNUSED;
/* Whether gs_engine_synchronize's elastic regroup dropped this step (what
 * its result's `regrouped` says, without asking for the verdict). */
GS_ENGINE_API bool gs_engine_step_regrouped(const gs_engine_t *e);

/* Multiplies this step's gradients by `factor` in its update (gradient
 * clipping's coefficient; after gs_engine_synchronize and before
 * end_step). */
GS_ENGINE_API void gs_engine_scale_step(gs_engine_t *e, float factor);

/* The same decided on the device: this step's update is skipped when
 * *flag (device memory: a loss scaler's found_inf after unscaling the
 * sums, alike on every rank) is not 0 when it runs, and the gradients are
 * multiplied by *factor (clipping's clamped coefficient; NULL: 1). The
 * host never waits for either; end_step reports the step `skipped` when
 * the flag was set. Both must stay valid until end_step. */
GS_ENGINE_API void gs_engine_skip_step_at(gs_engine_t *e, const float *flag);
/* Device memory holding the engine's own verdict of this step: not 0 once
 * gs_engine_synchronize found the sums not all finite (cfg.nonfinite stop
 * or skip; 0 with off), alike on every rank: what a loss scaler's
 * found_inf becomes, on the device. NULL before start. */
GS_ENGINE_API float *gs_engine_verdict_at(const gs_engine_t *e);
GS_ENGINE_API void gs_engine_scale_step_at(gs_engine_t *e, const float *factor);

/* This step's update is not applied (a loss scaler found its gradients
 * non-finite): end_step reports it `skipped` (with `nonfinite` when the
 * engine's own check found so too) and neither stops nor counts an
 * optimizer step, whatever cfg.nonfinite says. Every rank must decide
 * alike, so decide from the synchronized sums (after
 * gs_engine_synchronize, before end_step). */
GS_ENGINE_API void gs_engine_skip_step(gs_engine_t *e);

/* Sums `n` floats over all ranks in place (metrics such as validation
 * accuracy); `buf` is host memory. Not during a step. In an elastic job a
 * lost rank makes it regroup and fail with the engine's "world changed"
 * code (gs_engine_strerror: "the world changed (elastic regroup)"): the
 * caller computes its share again as gs_engine_rank() of
 * gs_engine_world_size() and sums again. */
GS_ENGINE_API int gs_engine_allreduce_sum(gs_engine_t *e, float *buf,
                                          size_t n) GS_ENGINE_WARN_UNUSED;

/* Every rank's `bytes` of host memory at `buf` become rank `root`'s (a
 * front end's own state: buffers, a wrapped optimizer's state). Not
 * during a step; elastic jobs as gs_engine_allreduce_sum (the root may be
 * gone: pick it again in the new world). */
GS_ENGINE_API int gs_engine_broadcast(gs_engine_t *e, void *buf, size_t bytes,
                                      uint32_t root) GS_ENGINE_WARN_UNUSED;

/* gs_engine_allreduce_sum and gs_engine_broadcast on device memory (host
 * memory on the cpu device): a framework's tensors summed or broadcast
 * where they are, never copied through the host (BatchNorm buffers
 * before a forward). */
GS_ENGINE_API int gs_engine_allreduce_sum_on_device(gs_engine_t *e, float *buf,
                                                    size_t n) GS_ENGINE_WARN_UNUSED;
GS_ENGINE_API int gs_engine_broadcast_on_device(gs_engine_t *e, void *buf, size_t bytes,
                                                uint32_t root) GS_ENGINE_WARN_UNUSED;

/* Rank 0 takes a checkpoint of the current params and momentum at `pos`
 * (no-op elsewhere, and without a checkpoint dir): it copies them and
 * writes the file on a thread of its own, so that a slow disk never holds
 * the other ranks in their next collective. One write is in flight at a
 * time: this waits for the previous one. A failed write is logged as a
 * warning and training goes on; this returns the previous write's error
 * only when it makes checkpoint_failures failures in a row. The file is
 * complete once gs_engine_checkpoint_wait or gs_engine_finish returns. */
GS_ENGINE_API int gs_engine_checkpoint(gs_engine_t *e,
                                       const gs_position_t *pos) GS_ENGINE_WARN_UNUSED;

/* Waits for the checkpoint being written; its error, if it failed. */
GS_ENGINE_API int gs_engine_checkpoint_wait(gs_engine_t *e) GS_ENGINE_WARN_UNUSED;

/* The front end enters a phase (GS_PHASE_COMPUTE before its forward,
 * GS_PHASE_DATA while it loads a batch). Cheap: call it every step. */
GS_ENGINE_API void gs_engine_phase(gs_engine_t *e, gs_phase_t phase);

/* Progress for the coordinator (copied; sent with the next heartbeat). */
GS_ENGINE_API void gs_engine_report(gs_engine_t *e, const gs_progress_t *p);

/* Leaves the job (finished or failed, with a reason), stops the heartbeat
 * and closes the collective connections. When `finished` and a checkpoint
 * dir is set, rank 0 first checkpoints the position of the last step
 * (unless a checkpoint of that step was taken already), so a run that
 * ends well keeps its model; a failure to write it turns `finished` into
 * a failure (see gs_engine_error). */
GS_ENGINE_API void gs_engine_finish(gs_engine_t *e, bool finished, const char *reason);

#ifdef __cplusplus
}
#endif

#endif
