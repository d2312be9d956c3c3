/* gradsync-agent: flags, signals, then the reference trainer. */
#include <cblas.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "launch_env.h"
#include "mlp.h"
#include "parse.h"
#include "trainer.h"

/* Set to the signal's number by SIGTERM/SIGINT; the engine turns it into
 * a stop every rank takes at the same step, and ends its waits for the
 * coordinator with it. A second signal exits at once. */
static volatile sig_atomic_t term_requested;

/* A stop request. A SIGINT after one ends the agent at once (Ctrl-C
 * twice); a SIGTERM again is the same request: schedulers send it twice
 * (slurmstepd signals every process of a step, and gradsync-run forwards
 * its own), and the stop must still write its checkpoint. */
static void on_term(int sig)
{
  if (term_requested && sig == SIGINT)
    _exit(128 + sig);
  if (!term_requested)
    term_requested = sig;
}

/* --comm-port: "PORT" or "FIRST-LAST". */
static int parse_port_range(const char *value, void *target, char *expect, size_t len)
{
  gs_port_range_t *r = target;
  int err = gs_parse_port_range(value, &r->first, &r->last);

  if (err)
    snprintf(expect, len, "a port or a range FIRST-LAST, 1..65535");
  return err;
}

static void show_port_range(const void *target, char *buf, size_t len)
{
  const gs_port_range_t *r = target;

  if (!r->first)
    snprintf(buf, len, "any free port");
  else if (r->first == r->last)
    snprintf(buf, len, "%u", r->first);
  else
    snprintf(buf, len, "%u-%u", r->first, r->last);
}

typedef struct flags {
  gs_trainer_config_t t;
  gs_log_t log;
  bool have_coord, have_world, have_reduce, have_bias_wd, print_config;
  uint8_t resume; /* resume_modes: off, on, auto */
  long threads;
  gs_launch_env_t env; /* scheduler variables; --job may borrow its string */
} flags_t;

/* --layers: the MLP's widths, parsed by the model itself. */
static int parse_layers(const char *v, void *target, char *expect, size_t expect_len)
{
  gs_trainer_config_t *t = target;

  return gs_mlp_parse_layers(v, t->layers, GS_TRAINER_MAX_LAYERS, &t->nlayers, expect, expect_len);
}

static void show_layers(const void *target, char *buf, size_t len)
{
  const gs_trainer_config_t *t = target;
  size_t used = 0;

  buf[0] = '\0';
  for (uint32_t i = 0; i < t->nlayers && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%u", i ? "," : "", t->layers[i]);
}

/* --inject-fault: a fault this agent injects into itself (faults.h). */
static int parse_fault(const char *v, void *target, char *expect, size_t expect_len)
{
  return gs_fault_parse(v, target, expect, expect_len);
}

static void show_fault(const void *target, char *buf, size_t len)
{
  gs_fault_show(target, buf, len);
}

/* --world-size: N, or MIN:MAX for an elastic job. */
static int parse_world(const char *v, void *target, char *expect, size_t expect_len)
{
  gs_engine_config_t *e = target;
  int err = gs_parse_world_range(v, 65536, &e->world_min, &e->world_size);

  if (err)
    snprintf(expect, expect_len, "N or MIN:MAX (elastic), 1 <= MIN <= MAX <= 65536");
  return err;
}

static void show_world(const void *target, char *buf, size_t len)
{
  const gs_engine_config_t *e = target;

  if (e->world_min)
    snprintf(buf, len, "%u:%u", e->world_min, e->world_size);
  else
    snprintf(buf, len, "%u", e->world_size);
}

static const char *const devices[] = {"cpu", "cuda", "auto", NULL};
static const char *const elastic_lrs[] = {"keep", "linear", NULL};
static const char *const backends[] = {"host", "nccl", "auto", NULL};
static const char *const reduce_ops[] = {"sum", "mean", NULL};
static const char *const schedules[] = {"constant", "step", "cosine", NULL};
static const char *const resume_modes[] = {"off", "on", "auto", NULL};
static const char *const optimizers[] = {"sgd", "adam", "adamw",
                                         NULL}; /* not "none": nothing applies its own */
static const char *const nonfinites[] = {"stop", "skip", "off", NULL};
static const char *const decides[] = {"now", "late", NULL};
static const char *const grad_dtypes[] = {"fp32", "bf16", "fp16", NULL};
_Static_assert(GS_GRAD_FP32 == 0 && GS_GRAD_BF16 == 1 && GS_GRAD_FP16 == 2,
               "grad_dtypes follows gs_grad_dtype_t");
_Static_assert(GS_OPTIM_SGD == 0 && GS_OPTIM_ADAM == 1 && GS_OPTIM_ADAMW == 2,
               "optimizers follows gs_optim_kind_t");
_Static_assert(GS_NONFINITE_STOP == 0 && GS_NONFINITE_SKIP == 1 && GS_NONFINITE_OFF == 2,
               "nonfinites follows gs_nonfinite_t");
_Static_assert(GS_DECIDE_NOW == 0 && GS_DECIDE_LATE == 1, "decides follows gs_decide_t");
_Static_assert(GS_REDUCE_SUM == 0 && GS_REDUCE_MEAN == 1, "reduce_ops follows gs_reduce_op_t");
_Static_assert(GS_ELASTIC_LR_KEEP == 0 && GS_ELASTIC_LR_LINEAR == 1,
               "elastic_lrs follows gs_elastic_lr_t");
_Static_assert(GS_LR_CONSTANT == 0 && GS_LR_STEP == 1 && GS_LR_COSINE == 2,
               "schedules follows gs_lr_schedule_t");

/* The flags, one row each (common/flags.h): --help and the flag reference
 * are made from these rows and the defaults defaults() sets. Kept out of
 * clang-format so each flag stays one block of a few lines. */
#define F(member) GS_FLAG_AT(flags_t, member)
#define E(member) GS_FLAG_AT(flags_t, t.engine.member)
#define SGD(member) GS_FLAG_AT(flags_t, t.engine.sgd.member)
/* clang-format off */
static const gs_flag_t flag_rows[] = {
  GS_FLAG_HEADING("Job:"),
  {.name = "--coordinator", .kind = GS_FLAG_ADDR, E(coord.host),
   GS_FLAG_PORT_AT(flags_t, t.engine.coord.port), .min = 1, GS_FLAG_GIVEN(flags_t, have_coord),
   .unix_ok = true, .envs = gs_launch_coordinator_envs, .metavar = "HOST:PORT", .def = "required",
   .help = "the coordinator's RPC address (unix:PATH: a node agent's socket, gradsync-relay)",
   .doc = "the coordinator's RPC address; `$MASTER_ADDR` with port `$GRADSYNC_COORDINATOR_PORT` "
          "or 7070 (`$MASTER_PORT` is torch's store port, not ours)"},
  {.name = "--job", .kind = GS_FLAG_STR, E(coord.job), .min = 1, .max = 127,
   .envs = gs_launch_job_envs, .metavar = "NAME", .help = "job name",
   .doc = "job name (`$SLURM_JOB_ID` as `slurm-ID`)"},
  {.name = "--world-size", .kind = GS_FLAG_CUSTOM, GS_FLAG_AT(flags_t, t.engine),
   .parse = parse_world, .show = show_world, GS_FLAG_GIVEN(flags_t, have_world), .envs = gs_launch_world_size_envs,
   .metavar = "N|MIN:MAX", .def = "required",
   .help = "number of ranks (processes) in the job; MIN:MAX makes it elastic",
   .doc = "ranks (processes) in the job; `MIN:MAX` makes it elastic: a lost rank costs the "
          "step in flight and the others go on while at least MIN remain, new agents join at a "
          "step boundary up to MAX ([elastic training](docs/guide/elastic.md))"},
  {.name = "--rejoin-timeout", .kind = GS_FLAG_DURATION, E(rejoin_timeout_ms), .umin = 1,
   .metavar = "DUR", .help = "elastic: how long a regroup waits for MIN ranks",
   .doc = "elastic jobs: how long a regroup waits for at least MIN ranks before the job fails"},
  {.name = "--elastic-lr", .kind = GS_FLAG_ENUM, E(elastic_lr), .names = elastic_lrs,
   .help = "elastic: keep the LR, or scale it linearly with the world (LR × world / MAX)",
   .doc = "elastic jobs: `keep` the LR whatever the world, or `linear`: LR × world / MAX, so the "
          "LR follows the global batch (Goyal et al.; with `--reduce mean` each rank keeps its "
          "batch, so the global batch changes with the world)"},
  {.name = "--local-rank", .kind = GS_FLAG_INT, E(local_rank), .min = 0, .max = 1 << 20,
   .envs = gs_launch_local_rank_envs, .metavar = "I", .help = "this agent's index on its node",
   .doc = "this agent's index on its node"},
  {.name = "--rank", .kind = GS_FLAG_INT, E(rank), .min = 0, .max = 65535,
   GS_FLAG_GIVEN(flags_t, t.engine.has_rank),
   .envs = gs_launch_rank_envs, .metavar = "R", .def = "none: by --node, then --local-rank",
   .help = "the rank its launcher numbered this agent (a fixed world)",
   .doc = "the rank its launcher numbered this agent in a fixed world (`gradsync-run`, torchrun "
          "and srun's one agent per task set it): the coordinator gives it that rank, so a "
          "script knows it before the Join. Without it ranks are ordered by `--node`, then "
          "`--local-rank`. An elastic job ignores `$RANK` (its ranks change as the world does)"},
  {.name = "--node", .kind = GS_FLAG_STRBUF, E(node), .envs = gs_launch_node_envs,
   .metavar = "NAME", .def = "host name", .help = "this machine's name"},
  {.name = "--token", .kind = GS_FLAG_STR, E(coord.token), .secret = true,
   .env = "GRADSYNC_TOKEN", .metavar = "TOKEN", .def = "`$GRADSYNC_TOKEN`",
   .help = "the coordinator's shared secret"},
  {.name = "--tls-ca", .kind = GS_FLAG_STR, E(coord.tls_ca), .min = 1, .env = "GRADSYNC_TLS_CA",
   .metavar = "FILE", .def = "`$GRADSYNC_TLS_CA`; none: plaintext",
   .help = "speak TLS to the coordinator, verifying its certificate with this CA (PEM)",
   .doc = "speak TLS to the coordinator (one started with `--tls-cert`) and verify its "
          "certificate with this CA (PEM), including the host name or IP address of "
          "`--coordinator`"},
  {.name = "--tls-cert", .kind = GS_FLAG_STR, E(coord.tls_cert), .min = 1,
   .env = "GRADSYNC_TLS_CERT", .metavar = "FILE", .def = "`$GRADSYNC_TLS_CERT`",
   .help = "this agent's certificate (PEM), for a coordinator with --tls-client-ca",
   .doc = "this agent's certificate (PEM), for a coordinator started with `--tls-client-ca` "
          "(mutual TLS); with `--tls-key` and `--tls-ca`"},
  {.name = "--tls-key", .kind = GS_FLAG_STR, E(coord.tls_key), .min = 1,
   .env = "GRADSYNC_TLS_KEY", .metavar = "FILE", .def = "`$GRADSYNC_TLS_KEY`",
   .help = "the private key of --tls-cert (PEM)", .doc = "the private key of `--tls-cert` (PEM)"},
  {.name = "--device", .kind = GS_FLAG_STRBUF, F(t.device), .names = devices,
   .help = "compute device: cuda when a GPU is visible and this build has CUDA, else cpu",
   .doc = "compute device: `cuda` (cuBLAS + our kernels) when the build has CUDA and a GPU is "
          "visible, else `cpu` (OpenBLAS); `auto` also picks `cpu` (with a warning) when "
          "`LOCAL_WORLD_SIZE` (set by `gradsync-run`) exceeds the GPUs visible, since NCCL needs "
          "a GPU per rank, unless `CUDA_VISIBLE_DEVICES` gives the process one GPU of its own"},
  {.name = "--gpu", .kind = GS_FLAG_INT, F(t.gpu), .min = 0, .max = 1023, .metavar = "N",
   .def = "local rank mod GPUs visible", .help = "which GPU",
   .doc = "which GPU (`CUDA_VISIBLE_DEVICES` numbering)"},
  {.name = "--backend", .kind = GS_FLAG_STRBUF, E(backend), .names = backends,
   .help = "collective backend: host (TCP ring between agents, cpu device), nccl (cuda "
           "device) or auto (follows the device)",
   .doc = "collective backend: `host` (ring reduce-scatter + allgather over TCP, host memory: "
          "the `cpu` device; two ranks on one machine pass their bytes through a shared-memory "
          "pipe instead, unless `GRADSYNC_HOST_SHM=0`) or `nccl` (in place on GPU memory: the "
          "`cuda` device); `auto` follows the device, and a mismatched pair is refused before "
          "training"},
  GS_FLAG_HEADING("Sync:"),
  {.name = "--reduce", .kind = GS_FLAG_ENUM, E(reduce), .names = reduce_ops,
   GS_FLAG_GIVEN(flags_t, have_reduce), .def = "required when N > 1",
   .help = "how gradients combine across ranks",
   .doc = "`mean` averages the ranks' gradients (N ranks × batch b then equal one rank × batch "
          "N·b); `sum` adds them"},
  {.name = "--grad-dtype", .kind = GS_FLAG_ENUM, E(grad_dtype), .names = grad_dtypes,
   .metavar = "TYPE", .help = "what the gradients travel in: fp32, bf16 or fp16",
   .doc = "what the gradients travel in: `fp32` (default), or half the bytes as `bf16` or "
          "`fp16`, added in float32 at every step of the reduction (the parameters, the update "
          "and its state stay float32)"},
  {.name = "--shard-optimizer", .kind = GS_FLAG_BOOL, E(shard_optimizer),
   .help = "shard the optimizer state over the ranks (ZeRO-1)",
   .doc = "shard the optimizer state over the ranks (ZeRO-1 over the packs): each pack's "
          "gradients are reduce-scattered, each rank updates and keeps the state of its shard "
          "only (1/N of it), and the updated parameters are allgathered: the same bytes as an "
          "allreduce of `fp32` gradients; every rank takes part in each checkpoint. With "
          "`--world-size MIN:MAX` each rank also keeps a copy of the previous rank's shard "
          "(2/N of the state, 1/N of the gradients' bytes more a step): a lost rank's state "
          "survives on the next one, and the survivors reshard it"},
  {.name = "--pack-threshold", .kind = GS_FLAG_SIZE, E(pack_threshold), .umin = 1,
   .metavar = "SIZE", .help = "largest gradient pack",
   .doc = "largest gradient pack (one allreduce)"},
  {.name = "--bcast-period", .kind = GS_FLAG_INT, E(bcast_period), .min = -1,
   .max = (1 << 23) - 1, .metavar = "P",
   .help = "broadcast params from rank 0: 0 once at start, P > 0 also after every P-th step, "
           "-1 never",
   .doc = "broadcast params from rank 0: `0` once at start, `P > 0` also after every P-th step, "
          "`-1` never; the control endpoint can change it while training"},
  {.name = "--checkpoint-dir", .kind = GS_FLAG_STR, E(checkpoint_dir), .metavar = "DIR",
   .help = "where rank 0 writes checkpoints",
   .doc = "where rank 0 writes checkpoints ([format](docs/checkpoint.md))"},
  {.name = "--checkpoint-every", .kind = GS_FLAG_INT, E(checkpoint_every), .min = 0,
   .max = 1L << 40, .metavar = "N", .help = "checkpoint every N steps (0: at the end and on demand)",
   .doc = "checkpoint every N steps (also at the last step, on stop, and on demand from the "
          "control endpoint)"},
  {.name = "--checkpoint-keep", .kind = GS_FLAG_INT, E(checkpoint_keep), .min = 0,
   .max = 1000000, .metavar = "K", .help = "checkpoints kept"},
  {.name = "--checkpoint-failures", .kind = GS_FLAG_INT, E(checkpoint_failures), .min = 1,
   .max = 1000000, .metavar = "N",
   .help = "failed checkpoint writes in a row that end the job (fewer: a warning, and the next "
           "checkpoint tries again)",
   .doc = "failed checkpoint writes in a row (a full or read-only disk) that end the job; fewer "
          "are warnings, training goes on and the next checkpoint tries again, and the older "
          "checkpoints stay as they were (the final checkpoint must succeed)"},
  {.name = "--save-model", .kind = GS_FLAG_STR, F(t.save_model), .metavar = "PATH",
   .help = "at the end rank 0 writes the trained parameters here (safetensors)",
   .doc = "at the end rank 0 writes the trained parameters here as named tensors in the "
          "safetensors layout, loadable into a PyTorch `nn.Sequential` "
          "([format](docs/model-format.md))"},
  {.name = "--resume", .kind = GS_FLAG_ENUM, F(resume), .names = resume_modes, .bare = "on",
   .help = "start from the newest valid checkpoint in `--checkpoint-dir`; none is an error, "
           "unless =auto (then start fresh)",
   .doc = "start from the newest valid checkpoint in `--checkpoint-dir` (torn or corrupt files "
          "are skipped with a warning); none is an error, and so is one of other `--layers` "
          "(naming both); `--resume=auto` starts fresh when there is none"},
  GS_FLAG_HEADING("Optimizer (PyTorch semantics):"),
  {.name = "--optimizer", .kind = GS_FLAG_ENUM, E(optim), .names = optimizers,
   .metavar = "NAME", .help = "sgd, adam or adamw",
   .doc = "`sgd`, `adam` or `adamw`, torch.optim's arithmetic, fused over the packs, with the "
          "LR, weight decay, schedule and bias rules below (Adam's betas 0.9 and 0.999, eps "
          "1e-8; `--momentum` and `--nesterov` are SGD's)"},
  {.name = "--nonfinite", .kind = GS_FLAG_ENUM, E(nonfinite), .names = nonfinites,
   .metavar = "WHAT", .help = "a step whose summed gradients hold NaN or infinity: stop, skip or off",
   .doc = "a step whose summed gradients hold NaN or infinity is never applied: `stop` ends "
          "training there, `skip` skips it on every rank and goes on, `off` checks nothing (the "
          "updates then overlap the last allreduces)"},
  {.name = "--decide", .kind = GS_FLAG_ENUM, E(decide), .names = decides, .metavar = "WHEN",
   .help = "when a step's decisions are taken: now or late",
   .doc = "when the host takes a step's decisions (its non-finite verdict, a stop, a "
          "checkpoint): `now`, at its end, waiting for the device once a step; `late`, at the "
          "next step's end, so that the host never waits for the device in a steady step (a "
          "stop then comes a step later, at the same state; every rank passes the same; a "
          "fixed world only)"},
  {.name = "--lr", .kind = GS_FLAG_DOUBLE, SGD(lr), .metavar = "LR",
   .help = "base learning rate"},
  {.name = "--momentum", .kind = GS_FLAG_DOUBLE, SGD(momentum), .metavar = "M",
   .help = "momentum (0: plain SGD)",
   .doc = "momentum, PyTorch semantics (`buf = m·buf + g + wd·p`; `p -= lr·buf`)"},
  {.name = "--weight-decay", .kind = GS_FLAG_DOUBLE, SGD(weight_decay), .metavar = "WD",
   .help = "L2 weight decay"},
  {.name = "--nesterov", .kind = GS_FLAG_BOOL, SGD(nesterov), .help = "Nesterov momentum"},
  {.name = "--bias-lr-mult", .kind = GS_FLAG_DOUBLE, SGD(bias_lr_mult), .metavar = "X",
   .help = "LR multiplier of biases (Detectron: 2)"},
  {.name = "--bias-wd", .kind = GS_FLAG_DOUBLE, SGD(bias_wd), GS_FLAG_GIVEN(flags_t, have_bias_wd),
   .metavar = "WD", .def = "`--weight-decay`", .help = "weight decay of biases (Detectron: 0)"},
  {.name = "--warmup-steps", .kind = GS_FLAG_INT, SGD(warmup_steps), .min = 0, .max = 1L << 40,
   .metavar = "N", .help = "linear warmup from `--warmup-factor` × LR to LR over N steps"},
  /* 1/3 as Detectron; "%g" would show the float as 0.333333. */
  {.name = "--warmup-factor", .kind = GS_FLAG_DOUBLE, SGD(warmup_factor), .metavar = "F",
   .def = "`1/3`", .help = "the warmup's first LR as a fraction of LR"},
  {.name = "--schedule", .kind = GS_FLAG_ENUM, SGD(schedule), .names = schedules,
   .metavar = "NAME", .help = "constant, step or cosine",
   .doc = "`constant`, `step` (× `--lr-gamma` every `--lr-step-size` steps) or `cosine` (to 0 "
          "at the last step)"},
  {.name = "--lr-step-size", .kind = GS_FLAG_INT, SGD(step_size), .min = 1, .max = 1L << 40,
   .metavar = "N", .def = "none",
   .help = "step schedule: multiply the LR by `--lr-gamma` every N steps"},
  {.name = "--lr-gamma", .kind = GS_FLAG_DOUBLE, SGD(gamma), .metavar = "G",
   .help = "step schedule: the factor"},
  GS_FLAG_HEADING("Model and data:"),
  {.name = "--layers", .kind = GS_FLAG_CUSTOM, F(t), .parse = parse_layers, .show = show_layers,
   .metavar = "W0,...,WL", .help = "MLP widths",
   .doc = "MLP widths (ReLU between layers, softmax cross-entropy)"},
  {.name = "--data", .kind = GS_FLAG_STR, F(t.data_dir), .metavar = "DIR",
   .help = "IDX files, gzip or plain",
   .doc = "IDX files `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`: regular files "
          "only (a FIFO is refused, not waited on), at most 512 MiB each once inflated; a "
          ".gz is inflated as it streams, so a gzip bomb is refused at the limit without "
          "holding it"},
  {.name = "--batch", .kind = GS_FLAG_INT, F(t.batch), .min = 1, .max = 1 << 20, .metavar = "B",
   .help = "examples per rank per step"},
  {.name = "--epochs", .kind = GS_FLAG_INT, F(t.epochs), .min = 1, .max = 1000000,
   .metavar = "E", .help = "how long to train"},
  {.name = "--steps", .kind = GS_FLAG_INT, F(t.steps), .min = 1, .max = 1L << 40, .metavar = "S",
   .def = "none", .help = "stop after S steps in all (overrides `--epochs`)"},
  {.name = "--seed", .kind = GS_FLAG_INT, F(t.seed), .min = 0, .max = LONG_MAX, .metavar = "S",
   .help = "init and shuffle seed, identical on every rank"},
  {.name = "--no-shuffle", .kind = GS_FLAG_BOOL, .negate = true, F(t.shuffle),
   .help = "visit the examples in file order (exact reproducibility)"},
  {.name = "--no-validate", .kind = GS_FLAG_BOOL, .negate = true, F(t.validate),
   .help = "skip the validation pass at each epoch end"},
  {.name = "--threads", .kind = GS_FLAG_INT, F(threads), .min = 1, .max = 1024, .metavar = "N",
   .help = "OpenBLAS threads per agent"},
  GS_FLAG_HEADING("Network between the ranks:"),
  {.name = "--comm-iface", .kind = GS_FLAG_STRBUF, E(comm_iface), .env = "GRADSYNC_COMM_IFACE",
   .metavar = "NAME", .def = "the interface toward the coordinator",
   .help = "network interface whose address the ranks use to reach this one",
   .doc = "network interface whose address the other ranks dial (like `NCCL_SOCKET_IFNAME`; "
          "also points NCCL there)"},
  {.name = "--comm-bind", .kind = GS_FLAG_STRBUF, E(comm_bind), .env = "GRADSYNC_COMM_BIND",
   .metavar = "ADDR", .def = "`--comm-iface`'s address",
   .help = "address to listen on for the other ranks (0.0.0.0: every interface)",
   .doc = "address to listen on for the other ranks (`0.0.0.0`: every interface, then "
          "`--comm-advertise` or the default says what peers dial)"},
  {.name = "--comm-advertise", .kind = GS_FLAG_STRBUF, E(comm_advertise),
   .env = "GRADSYNC_COMM_ADVERTISE", .metavar = "HOST[:PORT]", .def = "the bound address",
   .help = "address the other ranks dial, when it differs from the bound one (NAT)",
   .doc = "address the other ranks dial when it is not the bound one (a NAT'd container: "
          "the host's address and the published port)"},
  {.name = "--comm-port", .kind = GS_FLAG_CUSTOM, E(comm_ports), .parse = parse_port_range,
   .show = show_port_range, .env = "GRADSYNC_COMM_PORT", .metavar = "PORT|FIRST-LAST",
   .help = "port, or range whose first free port, to listen on (firewalls)",
   .doc = "port to listen on, or a range whose first free port is taken (for firewalls and "
          "NetworkPolicies)"},
  {.name = "--connect-timeout", .kind = GS_FLAG_DURATION, E(connect_timeout_ms), .umin = 1,
   .metavar = "DUR", .help = "the ranks' connections not formed within this long is an error",
   .doc = "the ranks' connections not formed within this long is an error naming both ranks, "
          "the address and the likely cause"},
  GS_FLAG_HEADING("Timeouts and output:"),
  {.name = "--join-timeout", .kind = GS_FLAG_DURATION, E(join_timeout_ms), .metavar = "DUR",
   .help = "wait for the other ranks to join"},
  {.name = "--rpc-timeout", .kind = GS_FLAG_DURATION, E(rpc_timeout_ms), .metavar = "DUR",
   .help = "any other coordinator call"},
  {.name = "--coordinator-grace", .kind = GS_FLAG_DURATION, E(coordinator_grace_ms),
   .metavar = "DUR", .env = "GRADSYNC_COORDINATOR_GRACE",
   .help = "train on through a coordinator outage this long, then stop",
   .doc = "how long the ranks train on while the coordinator is unreachable (they re-register "
          "when it is back); past it, training ends. Below the coordinator's --heartbeat-timeout it "
          "is raised to it, with a warning. A rank's last call, its Leave, waits as long for a "
          "coordinator that does not answer (2 s at least)"},
  {.name = "--comm-timeout", .kind = GS_FLAG_DURATION, E(comm_timeout_ms), .metavar = "DUR",
   .help = "no progress in a collective", .doc = "no progress inside a collective is an error"},
  {.name = "--inject-fault", .kind = GS_FLAG_CUSTOM, F(t.fault), .parse = parse_fault,
   .show = show_fault, .metavar = "SPEC", .def = "none",
   .help = "make one rank hang or straggle (tests)",
   .doc = "make one rank of the job misbehave, to see how the coordinator names it: "
          "`data-hang:RANK:STEP[:DURATION]` (rank RANK's data loading sleeps DURATION, or until "
          "the file DURATION names exists when it is an absolute path, default "
          "1h, before step STEP) or `straggler:RANK[:FACTOR]` (rank RANK computes FACTOR times "
          "as long, default 2)"},
  {.name = "--no-progress", .kind = GS_FLAG_BOOL, E(no_progress),
   .help = "heartbeats without this rank's phase (measuring its cost)",
   .doc = "heartbeats say nothing of where this rank is (its phase, how long its sends wait), "
          "so the coordinator cannot name it when it holds the job up; for measuring what "
          "saying it costs (`bench/hang_inject.sh`)"},
  {.name = "--log-interval", .kind = GS_FLAG_DURATION, F(t.log_interval_ms), .metavar = "DUR",
   .help = "progress line period", .doc = "progress line period (rank 0)"},
  {.name = "--log-level", .kind = GS_FLAG_CUSTOM, F(log.level),
   .parse = gs_log_level_flag_parse, .show = gs_log_level_flag_show,
   .metavar = "LEVEL", .help = "error, warn, info or debug",
   .doc = "`error`, `warn`, `info`, `debug`"},
  {.name = "--print-config", .kind = GS_FLAG_BOOL, F(print_config),
   .help = "print each setting, its value and where it came from (flag, variable, default), "
           "then exit",
   .doc = "print each setting, its value and where it came from (flag, variable or default; "
          "never the token's value), then exit 0 without checking that they fit together"},
};
/* clang-format on */

static const gs_flags_t flags = {
    .prog = "gradsync-agent",
    .usage = "usage: gradsync-agent --coordinator HOST:PORT --world-size N [options]\n"
             "\n"
             "One data-parallel rank: joins the job at the coordinator, trains the reference MLP "
             "on\n"
             "Fashion-MNIST, allreduces gradients in packs with the other ranks, and takes SGD "
             "steps.\n"
             "Most people start agents through gradsync-run (one machine) instead.\n"
             "\n",
    .epilog = "Durations take a unit (250ms, 5s, 2m); sizes take B, KiB, MiB, GiB.\n"
              "Precedence: a flag, then its GRADSYNC_* variable, then the scheduler's (torchrun,\n"
              "Kubeflow, SLURM); --print-config shows what was resolved and from where.\n"
              "SIGTERM or SIGINT: every rank stops at the same step (and checkpoints if it "
              "can).\n",
    .flags = flag_rows,
    .count = sizeof(flag_rows) / sizeof(flag_rows[0]),
};

/* The defaults; the environment ($GRADSYNC_*, the schedulers' variables)
 * comes in through the flag table after the command line. */
static void defaults(flags_t *f)
{
  gs_engine_config_t *e = &f->t.engine;
  const char *lws = getenv("LOCAL_WORLD_SIZE");
  long v;

  memset(f, 0, sizeof(*f));
  gs_engine_config_defaults(e);
  f->log = (gs_log_t){GS_LOG_INFO, stderr, "agent"};
  e->coord.log = &f->log;
  e->log = &f->log;
  if (lws && gs_parse_long(lws, 1, 1 << 20, &v) == 0)
    f->t.local_world = (uint32_t)v;
  snprintf(e->backend, sizeof(e->backend), "auto");
  snprintf(f->t.device, sizeof(f->t.device), "auto");
  f->t.gpu = -1;
  f->t.nlayers = 4;
  memcpy(f->t.layers, (uint32_t[]){784, 256, 128, 10}, 4 * sizeof(uint32_t));
  f->t.data_dir = "/usr/share/datasets/fashion-mnist";
  f->t.batch = 64;
  f->t.epochs = 3;
  f->t.seed = 1;
  f->t.shuffle = true;
  f->t.validate = true;
  f->t.log_interval_ms = 2000;
  f->threads = 1;
}

/* A name the table accepts but this build cannot run (cuda, nccl). */
static int not_built(const char *flag, const char *v, const char *expect)
{
  fprintf(stderr, "gradsync-agent: invalid value '%s' for %s: expected %s\n", v, flag, expect);
  return 2;
}

/* Cross-flag checks once every flag is known. */
static int finish_flags(flags_t *f, const char *const *sources)
{
  gs_engine_config_t *e = &f->t.engine;
  const char *rank_source = gs_flags_source(&flags, sources, "--rank");
  bool rank_flag = rank_source && !strcmp(rank_source, "flag");

  if (!gs_device_cuda_built() && !strcmp(f->t.device, "cuda"))
    return not_built("--device", f->t.device, "cpu or auto (this build has no CUDA)");
  if (!gs_device_cuda_built() && !strcmp(e->backend, "nccl"))
    return not_built("--backend", e->backend,
                     "host or auto (this build has no CUDA, hence no nccl)");
  if (!e->coord.host[0])
    snprintf(e->coord.host, sizeof(e->coord.host), "127.0.0.1");
  if (!f->have_coord || !f->have_world) {
    fprintf(stderr, "gradsync-agent: --coordinator and --world-size are required "
                    "(try gradsync-run --nproc N to start a local job)\n");
    return 2;
  }
  if (e->has_rank && e->world_min) {
    if (rank_flag) {
      fprintf(stderr, "gradsync-agent: --rank is for a fixed world: an elastic job numbers its "
                      "ranks at each regroup\n");
      return 2;
    }
    e->has_rank = false; /* torchrun's elastic $RANK: the coordinator's numbering holds */
  }
  if (e->has_rank && e->rank >= e->world_size) {
    fprintf(stderr, "gradsync-agent: --rank %u%s%s%s is not below --world-size %u\n", e->rank,
            rank_flag ? "" : " (from $", rank_flag ? "" : rank_source, rank_flag ? "" : ")",
            e->world_size);
    return 2;
  }
  if (e->world_size > 1 && !f->have_reduce) {
    fprintf(stderr, "gradsync-agent: --reduce sum|mean is required with --world-size > 1 "
                    "(mean averages the ranks' gradients; sum adds them)\n");
    return 2;
  }
  if (!f->have_bias_wd)
    e->sgd.bias_wd = e->sgd.weight_decay;
  if (e->sgd.schedule == GS_LR_COSINE && e->sgd.total_steps == 0)
    e->sgd.total_steps = f->t.steps; /* with --epochs the trainer knows it only later */
  {
    gs_sgd_config_t sgd = e->sgd;
    char why[256];

    if (sgd.schedule == GS_LR_COSINE && sgd.total_steps == 0)
      sgd.total_steps = 1; /* known once the data is loaded */
    if (gs_sgd_config_check(&sgd, why, sizeof(why))) {
      fprintf(stderr, "gradsync-agent: %s\n", why);
      return 2;
    }
  }
  e->resume = f->resume != 0;
  e->resume_auto = f->resume == 2;
  if (e->resume && !e->checkpoint_dir) {
    fprintf(stderr, "gradsync-agent: --resume needs --checkpoint-dir\n");
    return 2;
  }
  return 0;
}

/* Parses the command line, then the environment, into f; returns 0 to
 * run, or an exit status (-1: exit 0). */
static int parse_flags(int argc, char **argv, flags_t *f)
{
  const char *sources[sizeof(flag_rows) / sizeof(flag_rows[0])];
  gs_flags_opts_t opts = {.lookup = gs_launch_env_lookup, .ctx = &f->env, .sources = sources};
  char version[128];
  int rc;

  gs_launch_env_init(&f->env, getenv);
  snprintf(version, sizeof(version), "%s (devices: %s; backends: %s)", GS_VERSION,
           gs_device_cuda_built() ? "cpu, cuda" : "cpu",
           gs_device_cuda_built() ? "host, nccl" : "host");
  rc = gs_flags_main(&flags, f, argc, argv, &opts, version);
  if (rc)
    return rc;
  if (f->print_config) {
    gs_flags_print_config(&flags, f, &opts, stdout);
    gs_launch_env_notes(&f->env, stdout);
    return -1;
  }
  return finish_flags(f, sources);
}

int main(int argc, char **argv)
{
  flags_t f;
  struct sigaction sa = {.sa_handler = on_term};
  int err;

  defaults(&f);
  err = parse_flags(argc, argv, &f);
  if (err)
    return err < 0 ? 0 : err;
  openblas_set_num_threads((int)f.threads);
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  f.t.engine.term_flag = &term_requested;
  err = gs_trainer_run(&f.t);
  /* A signal that ended a wait exits as the shell reports a signal; one
   * that stopped training at a step is a clean stop. */
  if (err && term_requested)
    return 128 + term_requested;
  return err ? 1 : 0;
}
