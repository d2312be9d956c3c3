/* gradsync-agent: flags, signals, then the reference trainer. */
#include <arpa/inet.h>
#include <cblas.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mlp.h"
#include "parse.h"
#include "trainer.h"

static void usage(FILE *out)
{
  fprintf(
      out,
      "usage: gradsync-agent --coordinator HOST:PORT --world-size N [options]\n"
      "\n"
      "One data-parallel rank: joins the job at the coordinator, trains the reference MLP on\n"
      "Fashion-MNIST, allreduces gradients in packs with the other ranks, and takes SGD steps.\n"
      "Most people start agents through gradsync-run (one machine) instead.\n"
      "\n"
      "Job:\n"
      "  --coordinator HOST:PORT   the coordinator's RPC address (required)\n"
      "  --job NAME                job name (default: local)\n"
      "  --world-size N            number of ranks in the job (required)\n"
      "  --local-rank I            this agent's index on its node (default: $LOCAL_RANK or 0)\n"
      "  --node NAME               this machine's name (default: the host name)\n"
      "  --token TOKEN             the coordinator's shared secret (default: $GRADSYNC_TOKEN)\n"
      "  --comm-host ADDR          address peers reach this agent on (default: this host's\n"
      "                            address toward the coordinator)\n"
      "  --device NAME             compute device: cpu, cuda or auto (default auto: cuda when\n"
      "                            a GPU is visible and this build has CUDA, else cpu)\n"
      "  --gpu N                   which GPU (default: the local rank modulo the GPUs visible)\n"
      "  --backend NAME            collective backend: host (TCP ring between agents, cpu\n"
      "                            device), nccl (cuda device) or auto (default: follows the\n"
      "                            device)\n"
      "Sync:\n"
      "  --reduce sum|mean         how gradients combine across ranks (required when N > 1)\n"
      "  --pack-threshold SIZE     largest gradient pack (default 10MiB)\n"
      "  --bcast-period P          broadcast params from rank 0: 0 once at start (default),\n"
      "                            P > 0 also after every P-th step, -1 never\n"
      "  --checkpoint-dir DIR      where rank 0 writes checkpoints (default: none)\n"
      "  --checkpoint-every N      checkpoint every N steps (default 0: at stop and on demand)\n"
      "  --checkpoint-keep K       checkpoints kept (default 3)\n"
      "  --resume                  start from the newest valid checkpoint in --checkpoint-dir\n"
      "Optimizer (SGD, PyTorch semantics):\n"
      "  --lr LR                   base learning rate (default 0.05)\n"
      "  --momentum M              default 0.9 (0: plain SGD)\n"
      "  --weight-decay WD         default 5e-4\n"
      "  --nesterov                Nesterov momentum\n"
      "  --bias-lr-mult X          LR multiplier of biases (default 1; Detectron uses 2)\n"
      "  --bias-wd WD              weight decay of biases (default: --weight-decay; Detectron 0)\n"
      "  --warmup-steps N          linear warmup from --warmup-factor * LR (default 0)\n"
      "  --warmup-factor F         default 0.333\n"
      "  --schedule NAME           constant (default), step or cosine\n"
      "  --lr-step-size N          step schedule: multiply the LR by --lr-gamma every N steps\n"
      "  --lr-gamma G              default 0.1\n"
      "Model and data:\n"
      "  --layers W0,W1,...,WL     MLP widths (default 784,256,128,10)\n"
      "  --data DIR                IDX files, gzip or plain (default\n"
      "                            /usr/share/datasets/fashion-mnist)\n"
      "  --batch B                 examples per rank per step (default 64)\n"
      "  --epochs E                default 3\n"
      "  --steps S                 stop after S steps in all (overrides --epochs)\n"
      "  --seed S                  init and shuffle seed, identical on every rank (default 1)\n"
      "  --no-shuffle              visit the examples in file order (exact reproducibility)\n"
      "  --no-validate             skip the validation pass at each epoch end\n"
      "  --threads N               OpenBLAS threads per agent (default 1)\n"
      "Timeouts and output:\n"
      "  --join-timeout DUR        wait for the other ranks to join (default 5m)\n"
      "  --rpc-timeout DUR         any other coordinator call (default 30s)\n"
      "  --comm-timeout DUR        no progress in a collective (default 2m)\n"
      "  --log-interval DUR        progress line period (default 2s)\n"
      "  --log-level LEVEL         error, warn, info or debug (default info)\n"
      "  --version                 print the version and exit\n"
      "  -h, --help                print this help and exit\n"
      "\n"
      "Durations take a unit (250ms, 5s, 2m); sizes take B, KiB, MiB, GiB.\n"
      "SIGTERM or SIGINT: every rank stops at the same step (and checkpoints if it can).\n");
}

enum {
  OPT_COORD = 256,
  OPT_JOB,
  OPT_WORLD,
  OPT_LOCAL_RANK,
  OPT_NODE,
  OPT_TOKEN,
  OPT_COMM_HOST,
  OPT_BACKEND,
  OPT_DEVICE,
  OPT_GPU,
  OPT_REDUCE,
  OPT_PACK,
  OPT_BCAST,
  OPT_CKPT_DIR,
  OPT_CKPT_EVERY,
  OPT_CKPT_KEEP,
  OPT_RESUME,
  OPT_LR,
  OPT_MOMENTUM,
  OPT_WD,
  OPT_NESTEROV,
  OPT_BIAS_LR,
  OPT_BIAS_WD,
  OPT_WARMUP,
  OPT_WARMUP_FACTOR,
  OPT_SCHEDULE,
  OPT_STEP_SIZE,
  OPT_GAMMA,
  OPT_LAYERS,
  OPT_DATA,
  OPT_BATCH,
  OPT_EPOCHS,
  OPT_STEPS,
  OPT_SEED,
  OPT_NO_SHUFFLE,
  OPT_NO_VALIDATE,
  OPT_THREADS,
  OPT_JOIN_TIMEOUT,
  OPT_RPC_TIMEOUT,
  OPT_COMM_TIMEOUT,
  OPT_LOG_INTERVAL,
  OPT_LOG_LEVEL,
  OPT_VERSION,
};

static const struct option options[] = {
    {"coordinator", required_argument, NULL, OPT_COORD},
    {"job", required_argument, NULL, OPT_JOB},
    {"world-size", required_argument, NULL, OPT_WORLD},
    {"local-rank", required_argument, NULL, OPT_LOCAL_RANK},
    {"node", required_argument, NULL, OPT_NODE},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"comm-host", required_argument, NULL, OPT_COMM_HOST},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"gpu", required_argument, NULL, OPT_GPU},
    {"reduce", required_argument, NULL, OPT_REDUCE},
    {"pack-threshold", required_argument, NULL, OPT_PACK},
    {"bcast-period", required_argument, NULL, OPT_BCAST},
    {"checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR},
    {"checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY},
    {"checkpoint-keep", required_argument, NULL, OPT_CKPT_KEEP},
    {"resume", no_argument, NULL, OPT_RESUME},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"nesterov", no_argument, NULL, OPT_NESTEROV},
    {"bias-lr-mult", required_argument, NULL, OPT_BIAS_LR},
    {"bias-wd", required_argument, NULL, OPT_BIAS_WD},
    {"warmup-steps", required_argument, NULL, OPT_WARMUP},
    {"warmup-factor", required_argument, NULL, OPT_WARMUP_FACTOR},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"lr-step-size", required_argument, NULL, OPT_STEP_SIZE},
    {"lr-gamma", required_argument, NULL, OPT_GAMMA},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"data", required_argument, NULL, OPT_DATA},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"no-shuffle", no_argument, NULL, OPT_NO_SHUFFLE},
    {"no-validate", no_argument, NULL, OPT_NO_VALIDATE},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"join-timeout", required_argument, NULL, OPT_JOIN_TIMEOUT},
    {"rpc-timeout", required_argument, NULL, OPT_RPC_TIMEOUT},
    {"comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT},
    {"log-interval", required_argument, NULL, OPT_LOG_INTERVAL},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Set by SIGTERM/SIGINT; the engine turns it into a stop every rank takes
 * at the same step. A second signal exits at once. */
static volatile sig_atomic_t term_requested;

static void on_term(int sig)
{
  if (term_requested)
    _exit(128 + sig);
  term_requested = 1;
}

static int bad(const char *flag, const char *value, const char *expect)
{
  fprintf(stderr, "gradsync-agent: invalid value '%s' for --%s: expected %s\n", value, flag,
          expect);
  return 2;
}

static int long_flag(const char *flag, const char *v, long min, long max, long *out)
{
  char expect[96];

  if (gs_parse_long(v, min, max, out) == 0)
    return 0;
  snprintf(expect, sizeof(expect), "an integer from %ld to %ld", min, max);
  return bad(flag, v, expect);
}

static int float_flag(const char *flag, const char *v, float *out)
{
  char *end;
  double d = strtod(v, &end);

  if (end == v || *end || !isfinite(d))
    return bad(flag, v, "a number");
  *out = (float)d;
  return 0;
}

static int duration_flag(const char *flag, const char *v, uint64_t *ms)
{
  return gs_parse_duration_ms(v, ms) ? bad(flag, v, "a duration such as 500ms, 30s or 2m") : 0;
}

/* The address of this host on the route to the coordinator (a connected
 * UDP socket sends nothing), so peers on other nodes can dial us. */
static void default_comm_host(const char *coord_host, char *out, size_t len)
{
  struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  int fd = -1;

  snprintf(out, len, "127.0.0.1");
  if (getaddrinfo(coord_host, "9", &hints, &ai) || !ai)
    return;
  fd = socket(ai->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
      getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
    snprintf(out, len, "127.0.0.1");
  if (fd >= 0)
    close(fd);
  freeaddrinfo(ai);
}

typedef struct flags {
  gs_trainer_config_t t;
  gs_log_t log;
  bool have_coord, have_world, have_reduce, have_bias_wd, have_comm_host;
  long threads;
} flags_t;

static void defaults(flags_t *f)
{
  gs_engine_config_t *e = &f->t.engine;
  const char *lr = getenv("LOCAL_RANK");
  long v;

  memset(f, 0, sizeof(*f));
  f->log = (gs_log_t){GS_LOG_INFO, stderr, "agent"};
  e->coord.job = "local";
  e->coord.token = getenv("GRADSYNC_TOKEN");
  e->coord.log = &f->log;
  e->log = &f->log;
  if (lr && gs_parse_long(lr, 0, 1 << 20, &v) == 0)
    e->local_rank = (uint32_t)v;
  lr = getenv("LOCAL_WORLD_SIZE");
  if (lr && gs_parse_long(lr, 1, 1 << 20, &v) == 0)
    f->t.local_world = (uint32_t)v;
  if (gethostname(e->node, sizeof(e->node)) != 0)
    snprintf(e->node, sizeof(e->node), "localhost");
  snprintf(e->backend, sizeof(e->backend), "auto");
  snprintf(f->t.device, sizeof(f->t.device), "auto");
  f->t.gpu = -1;
  e->pack_threshold = 10 << 20;
  e->reduce = GS_REDUCE_MEAN;
  gs_sgd_config_default(&e->sgd);
  e->checkpoint_keep = 3;
  e->join_timeout_ms = 5 * 60 * 1000;
  e->rpc_timeout_ms = 30 * 1000;
  e->comm_timeout_ms = 2 * 60 * 1000;
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

/* Applies one option; returns 0, or 2 after printing what is wrong. */
static int apply(flags_t *f, int opt, const char *v)
{
  gs_engine_config_t *e = &f->t.engine;
  char why[256];
  uint16_t port;
  long n;
  int err = 0;

  switch (opt) {
  case OPT_COORD:
    if (gs_parse_addr(v, e->coord.host, sizeof(e->coord.host), &port) || port == 0)
      return bad("coordinator", v, "HOST:PORT");
    e->coord.port = port;
    f->have_coord = true;
    if (!e->coord.host[0])
      snprintf(e->coord.host, sizeof(e->coord.host), "127.0.0.1");
    break;
  case OPT_JOB:
    if (!*v || strlen(v) > 127)
      return bad("job", v, "a name of 1 to 127 characters");
    e->coord.job = v;
    break;
  case OPT_WORLD:
    err = long_flag("world-size", v, 1, 65536, &n);
    e->world_size = (uint32_t)n;
    f->have_world = true;
    break;
  case OPT_LOCAL_RANK:
    err = long_flag("local-rank", v, 0, 1 << 20, &n);
    e->local_rank = (uint32_t)n;
    break;
  case OPT_NODE:
    snprintf(e->node, sizeof(e->node), "%s", v);
    break;
  case OPT_TOKEN:
    e->coord.token = v;
    break;
  case OPT_COMM_HOST:
    snprintf(e->comm_host, sizeof(e->comm_host), "%s", v);
    f->have_comm_host = true;
    break;
  case OPT_BACKEND:
    if (strcmp(v, "host") != 0 && strcmp(v, "auto") != 0 &&
        (strcmp(v, "nccl") != 0 || !gs_device_cuda_built()))
      return bad("backend", v,
                 gs_device_cuda_built() ? "host, nccl or auto"
                                        : "host or auto (this build has no CUDA, hence no nccl)");
    snprintf(e->backend, sizeof(e->backend), "%s", v);
    break;
  case OPT_DEVICE:
    if (strcmp(v, "cpu") != 0 && strcmp(v, "auto") != 0 &&
        (strcmp(v, "cuda") != 0 || !gs_device_cuda_built()))
      return bad("device", v,
                 gs_device_cuda_built() ? "cpu, cuda or auto"
                                        : "cpu or auto (this build has no CUDA)");
    snprintf(f->t.device, sizeof(f->t.device), "%s", v);
    break;
  case OPT_GPU:
    err = long_flag("gpu", v, 0, 1023, &n);
    f->t.gpu = (int)n;
    break;
  case OPT_REDUCE:
    if (gs_reduce_op_parse(v, &e->reduce))
      return bad("reduce", v, "sum or mean");
    f->have_reduce = true;
    break;
  case OPT_PACK:
    if (gs_parse_size(v, &e->pack_threshold) || e->pack_threshold == 0)
      return bad("pack-threshold", v, "a size such as 10MiB");
    break;
  case OPT_BCAST:
    err = long_flag("bcast-period", v, -1, (1 << 23) - 1, &n);
    e->bcast_period = (int32_t)n;
    break;
  case OPT_CKPT_DIR:
    e->checkpoint_dir = v;
    break;
  case OPT_CKPT_EVERY:
    err = long_flag("checkpoint-every", v, 0, 1L << 40, &n);
    e->checkpoint_every = (uint64_t)n;
    break;
  case OPT_CKPT_KEEP:
    err = long_flag("checkpoint-keep", v, 0, 1000000, &n);
    e->checkpoint_keep = (uint32_t)n;
    break;
  case OPT_RESUME:
    e->resume = true;
    break;
  case OPT_LR:
    return float_flag("lr", v, &e->sgd.lr);
  case OPT_MOMENTUM:
    return float_flag("momentum", v, &e->sgd.momentum);
  case OPT_WD:
    return float_flag("weight-decay", v, &e->sgd.weight_decay);
  case OPT_NESTEROV:
    e->sgd.nesterov = true;
    break;
  case OPT_BIAS_LR:
    return float_flag("bias-lr-mult", v, &e->sgd.bias_lr_mult);
  case OPT_BIAS_WD:
    f->have_bias_wd = true;
    return float_flag("bias-wd", v, &e->sgd.bias_wd);
  case OPT_WARMUP:
    err = long_flag("warmup-steps", v, 0, 1L << 40, &n);
    e->sgd.warmup_steps = (uint64_t)n;
    break;
  case OPT_WARMUP_FACTOR:
    return float_flag("warmup-factor", v, &e->sgd.warmup_factor);
  case OPT_SCHEDULE:
    if (gs_lr_schedule_parse(v, &e->sgd.schedule))
      return bad("schedule", v, "constant, step or cosine");
    break;
  case OPT_STEP_SIZE:
    err = long_flag("lr-step-size", v, 1, 1L << 40, &n);
    e->sgd.step_size = (uint64_t)n;
    break;
  case OPT_GAMMA:
    return float_flag("lr-gamma", v, &e->sgd.gamma);
  case OPT_LAYERS:
    if (gs_mlp_parse_layers(v, f->t.layers, GS_TRAINER_MAX_LAYERS, &f->t.nlayers, why, sizeof(why)))
      return bad("layers", v, why);
    break;
  case OPT_DATA:
    f->t.data_dir = v;
    break;
  case OPT_BATCH:
    err = long_flag("batch", v, 1, 1 << 20, &n);
    f->t.batch = (uint32_t)n;
    break;
  case OPT_EPOCHS:
    err = long_flag("epochs", v, 1, 1000000, &n);
    f->t.epochs = (uint64_t)n;
    break;
  case OPT_STEPS:
    err = long_flag("steps", v, 1, 1L << 40, &n);
    f->t.steps = (uint64_t)n;
    break;
  case OPT_SEED:
    err = long_flag("seed", v, 0, LONG_MAX, &n);
    f->t.seed = (uint64_t)n;
    break;
  case OPT_NO_SHUFFLE:
    f->t.shuffle = false;
    break;
  case OPT_NO_VALIDATE:
    f->t.validate = false;
    break;
  case OPT_THREADS:
    err = long_flag("threads", v, 1, 1024, &f->threads);
    break;
  case OPT_JOIN_TIMEOUT:
    return duration_flag("join-timeout", v, &e->join_timeout_ms);
  case OPT_RPC_TIMEOUT:
    return duration_flag("rpc-timeout", v, &e->rpc_timeout_ms);
  case OPT_COMM_TIMEOUT:
    return duration_flag("comm-timeout", v, &e->comm_timeout_ms);
  case OPT_LOG_INTERVAL:
    return duration_flag("log-interval", v, &f->t.log_interval_ms);
  case OPT_LOG_LEVEL:
    if (gs_log_level_parse(v, &f->log.level))
      return bad("log-level", v, "error, warn, info or debug");
    break;
  }
  return err;
}

/* Cross-flag checks once every flag is known. */
static int finish_flags(flags_t *f)
{
  gs_engine_config_t *e = &f->t.engine;

  if (!f->have_coord || !f->have_world) {
    fprintf(stderr, "gradsync-agent: --coordinator and --world-size are required "
                    "(try gradsync-run --nproc N to start a local job)\n");
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
  if (e->resume && !e->checkpoint_dir) {
    fprintf(stderr, "gradsync-agent: --resume needs --checkpoint-dir\n");
    return 2;
  }
  if (!f->have_comm_host)
    default_comm_host(e->coord.host, e->comm_host, sizeof(e->comm_host));
  return 0;
}

int main(int argc, char **argv)
{
  flags_t f;
  struct sigaction sa = {.sa_handler = on_term};
  int opt, err = 0;

  defaults(&f);
  while (!err && (opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    if (opt == 'h') {
      usage(stdout);
      return 0;
    }
    if (opt == OPT_VERSION) {
      printf("gradsync-agent %s (devices: %s; backends: %s)\n", GS_VERSION,
             gs_device_cuda_built() ? "cpu, cuda" : "cpu",
             gs_device_cuda_built() ? "host, nccl" : "host");
      return 0;
    }
    if (opt == '?')
      return 2;
    err = apply(&f, opt, optarg);
  }
  if (!err && optind < argc) {
    fprintf(stderr, "gradsync-agent: unexpected argument '%s' (see --help)\n", argv[optind]);
    err = 2;
  }
  if (err || (err = finish_flags(&f)))
    return err;
  openblas_set_num_threads((int)f.threads);
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  f.t.engine.term_flag = &term_requested;
  return gs_trainer_run(&f.t) ? 1 : 0;
}
