/* gradsync-run's flags (one table, common/flags.h, with the environment
 * sources of agent/launch/launch_env.h) and the programs it starts.
 * Arguments that are no launcher flag go to every agent, or are the
 * command to run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "launcher.h"

#define STR(x) #x
#define XSTR(x) STR(x)

/* The flags, one row each; --help and the flag reference are made from them
 * and the defaults set_defaults() writes. Kept out of clang-format so each
 * flag stays one block of a few lines. */
#define CFG(member) GS_FLAG_AT(gs_run_config_t, member)
#define GIVEN(member) GS_FLAG_GIVEN(gs_run_config_t, member)
/* A launcher setting of its own, not a scheduler's: only gradsync's name. */
static const char *const max_restarts_envs[] = {"GRADSYNC_MAX_RESTARTS", NULL};
static const char *const min_ranks_envs[] = {"GRADSYNC_MIN_RANKS", NULL};
/* clang-format off */
static const gs_flag_t flag_rows[] = {
  {.name = "--nproc", .alias = "--nproc-per-node", .kind = GS_FLAG_INT, CFG(nproc), .min = 1,
   .max = GS_RUN_MAX_NPROC, .required = true, .envs = gs_launch_nproc_envs, .metavar = "N",
   .help = "agents on this node, 1.." XSTR(GS_RUN_MAX_NPROC),
   .doc = "agents (ranks) on this node, 1.." XSTR(GS_RUN_MAX_NPROC) "; `$SLURM_GPUS_ON_NODE`: "
          "one per GPU SLURM gave the node"},
  {.name = "--nnodes", .kind = GS_FLAG_INT, CFG(nnodes), .min = 1, .max = GS_RUN_MAX_NNODES,
   GIVEN(have_nnodes), .envs = gs_launch_nnodes_envs, .metavar = "N",
   .help = "nodes in the job (each runs gradsync-run with the same job settings)",
   .doc = "nodes in the job (world size: N × `--nproc-per-node`); more than 1 needs "
          "`--coordinator`"},
  {.name = "--node-rank", .kind = GS_FLAG_INT, CFG(node_rank), .min = 0,
   .max = GS_RUN_MAX_NNODES - 1, GIVEN(have_node_rank), .envs = gs_launch_node_rank_envs,
   .metavar = "I", .help = "this node's index, 0..N-1",
   .doc = "this node's index, below `--nnodes`: a fixed world's agents are ranks "
          "I × `--nproc-per-node` + local rank (`$RANK`); unset on several nodes, or elastic: "
          "ranks are ordered by `--node`, then local rank"},
  {.name = "--coordinator", .kind = GS_FLAG_ADDR, CFG(coord_host),
   GS_FLAG_PORT_AT(gs_run_config_t, coord_port), .min = 1, GIVEN(join),
   .envs = gs_launch_coordinator_envs, .metavar = "HOST:PORT", .def = "none: start one here",
   .help = "join this coordinator's RPC address instead of starting one",
   .doc = "join the coordinator at this RPC address (the multi-node form) instead of starting "
          "one; `$MASTER_ADDR` with port `$GRADSYNC_COORDINATOR_PORT` or 7070"},
  /* The agents' limits: refused here rather than by every rank. */
  {.name = "--job", .kind = GS_FLAG_STR, CFG(job), .min = 1, .max = 127,
   .envs = gs_launch_job_envs, .metavar = "NAME", .help = "job name",
   .doc = "job name at the coordinator (`$SLURM_JOB_ID` as `slurm-ID`)"},
  {.name = "--node", .kind = GS_FLAG_STR, CFG(node), .min = 1, .max = 255,
   .envs = gs_launch_node_envs, .metavar = "NAME", .def = "host name",
   .help = "this node's name, passed to the agents",
   .doc = "this node's name, passed to the agents (distinct per node)"},
  {.name = "--http", .kind = GS_FLAG_ADDR, CFG(http_host),
   GS_FLAG_PORT_AT(gs_run_config_t, http_port), GIVEN(have_http), .metavar = "HOST:PORT",
   .help = "HTTP address of the coordinator it starts (port 0: any free port)",
   .doc = "the HTTP address of the coordinator it starts (port 0: any free port; the status URL "
          "is printed)"},
  {.name = "--token", .kind = GS_FLAG_STR, CFG(token), .min = 1, .max = GS_RUN_TOKEN_MAX,
   .secret = true, .metavar = "TOKEN", .def = "`$GRADSYNC_TOKEN`",
   .help = "shared secret; handed to the coordinator and agents in $GRADSYNC_TOKEN",
   .doc = "shared secret, handed to coordinator and agents through the environment, never on "
          "a command line"},
  {.name = "--grace", .kind = GS_FLAG_DURATION, CFG(grace_ms), .metavar = "DUR",
   .help = "wait this long after SIGTERM before SIGKILL when stopping",
   .doc = "how long stopping ranks get after SIGTERM before SIGKILL"},
  {.name = "--max-restarts", .kind = GS_FLAG_INT, CFG(max_restarts), .min = 0,
   .max = GS_RUN_MAX_RESTARTS, .envs = max_restarts_envs, .metavar = "K",
   .help = "start a failed rank again, up to K times per local rank (0: a failure stops the "
           "run)",
   .doc = "start a rank that failed (non-zero exit or killed) again with the same command, up "
          "to K times per local rank, after 1 s doubling to 30 s; 0: the first failure stops the "
          "others. The coordinator it starts is never restarted"},
  {.name = "--min-ranks", .kind = GS_FLAG_INT, CFG(min_ranks), .min = 0, .max = GS_RUN_MAX_WORLD,
   .envs = min_ranks_envs, .metavar = "M",
   .help = "elastic: the job goes on while at least M ranks remain (0: a fixed world)",
   .doc = "make the job elastic: the ranks get `--world-size M:N` (N: the world), a rank that "
          "fails for good no longer stops the others, which go on while at least M remain, and "
          "a rank `--max-restarts` starts again rejoins at a step boundary ([elastic "
          "training](docs/guide/elastic.md)); 0: a fixed world"},
  {.name = "--node-agent", .kind = GS_FLAG_BOOL, CFG(node_agent),
   .help = "the ranks reach the coordinator through one node agent (gradsync-relay) for this "
           "node: one connection, batched Joins and heartbeats",
   .doc = "start a node agent (`gradsync-relay`) for this node's ranks: they reach the "
          "coordinator through it on a Unix socket, and it speaks for them all on one "
          "connection, their Joins and heartbeats batched into one frame each (for many nodes: "
          "[node agents](docs/guide/deployment.md#node-agents))"},
  {.name = "--node-agent-restarts", .kind = GS_FLAG_INT, CFG(node_agent_restarts), .min = 0,
   .max = GS_RUN_MAX_RESTARTS, .metavar = "K",
   .help = "start a node agent that died again, up to K times (0: its death stops the ranks)",
   .doc = "with `--node-agent`: a node agent that dies while the ranks run is started again "
          "on the same socket, up to K times; the coordinator has lost the node's ranks (a "
          "fixed job fails, an elastic one goes on without them), and they rejoin through the "
          "new one within their `--coordinator-grace`. 0: its death stops the ranks"},
  {.name = "--coordinator-bin", .kind = GS_FLAG_STR, CFG(coord_flag), .metavar = "PATH",
   .def = "next to `gradsync-run`", .help = "coordinator program",
   .doc = "the coordinator program to start"},
  {.name = "--agent-bin", .kind = GS_FLAG_STR, CFG(agent_flag), .metavar = "PATH",
   .def = "next to `gradsync-run`", .help = "agent program",
   .doc = "the agent program to start"},
  {.name = "--relay-bin", .kind = GS_FLAG_STR, CFG(relay_flag), .metavar = "PATH",
   .def = "next to `gradsync-run`", .help = "node agent program (--node-agent)",
   .doc = "the node agent program `--node-agent` starts"},
  {.name = "--print-config", .kind = GS_FLAG_BOOL, CFG(print_config),
   .help = "print each setting, its value and where it came from, then exit",
   .doc = "print each setting, its value and its source (flag, variable or default; never the "
          "token), the world size and the mode, then exit 0"},
};
/* clang-format on */

static const gs_flags_t flags = {
    .prog = "gradsync-run",
    .usage = "usage: gradsync-run --nproc N [options] [coordinator flags] [--] [agent flags...]\n"
             "       gradsync-run --nnodes N --node-rank I --coordinator HOST:PORT\n"
             "                    --nproc-per-node K [options] [--] [agent flags | command]\n"
             "\n"
             "Starts a gradsync coordinator on this machine and N agents joined to it, and\n"
             "prints each line they write prefixed with \"[rank i] \" (\"[coordinator] \").\n"
             "With --coordinator it starts only this node's K agents, joined to that\n"
             "coordinator (\"[local rank i] \"): run it on each of the N nodes.\n"
             "When one rank fails the others are stopped; with --max-restarts K it is\n"
             "started again instead (same command and environment, K times per local rank,\n"
             "after a wait of 1 s doubling to 30 s) until its slot has no restarts left.\n"
             "Exit status: 0 when every rank finished (exited 0); the failing rank's status\n"
             "(1..125) or 1 when one failed; 128+N when stopped by signal N.\n"
             "\n",
    .epilog = "Flags of gradsync-coordinator (listed below) given before \"--\" go to the\n"
              "coordinator it starts; a bad value is refused before anything starts.\n"
              "Every other argument, and everything after \"--\", goes to each agent unchanged,\n"
              "after --coordinator H:P --job NAME --world-size N --local-rank i (and --node\n"
              "NAME when given). When the first of them is not a flag, it is a program to run\n"
              "instead of gradsync-agent, with no flags added. Either gets in its environment\n"
              "GRADSYNC_COORDINATOR, GRADSYNC_JOB, GRADSYNC_WORLD_SIZE, GRADSYNC_LOCAL_RANK,\n"
              "GRADSYNC_NODE (when known), GRADSYNC_NNODES, GRADSYNC_NODE_RANK, LOCAL_RANK,\n"
              "WORLD_SIZE and LOCAL_WORLD_SIZE; a program run from a build tree also gets\n"
              "that tree's Python package first on PYTHONPATH. With fewer GPUs than --nproc\n"
              "agents pick the cpu device unless told --device. TLS flags for the agents\n"
              "(--tls-ca, --tls-cert, --tls-key) are for the --coordinator form: the\n"
              "coordinator gradsync-run starts itself has no TLS.\n"
              "Flags left out are read from the environment: GRADSYNC_* first, then the\n"
              "scheduler's (SLURM, torchrun, Kubeflow, a Kubernetes Indexed Job).\n"
              "SIGINT, SIGTERM and SIGHUP stop the agents with SIGTERM, then the coordinator;\n"
              "a SIGINT while stopping kills everything at once.\n",
    .flags = flag_rows,
    .count = sizeof(flag_rows) / sizeof(flag_rows[0]),
};

static void set_defaults(gs_run_config_t *cfg)
{
  cfg->nnodes = 1;
  cfg->job = "local";
  snprintf(cfg->http_host, sizeof(cfg->http_host), "127.0.0.1");
  cfg->http_port = 0;
  cfg->grace_ms = 10000;
  cfg->node_agent_restarts = 3;
}

/* Agent flags the launcher sets itself: passing them again would override it. */
static bool is_reserved(const char *arg)
{
  static const char *const reserved[] = {"--coordinator", "--job",  "--world-size",
                                         "--local-rank",  "--node", "--rank"};

  for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
    size_t n = strlen(reserved[i]);

    if (strncmp(arg, reserved[i], n) == 0 && (arg[n] == '\0' || arg[n] == '='))
      return true;
  }
  return false;
}

/* Puts the token in $GRADSYNC_TOKEN for the children and blanks it in our
 * own argv so it does not show in /proc/PID/cmdline. */
static int take_token(char *token)
{
  if (setenv("GRADSYNC_TOKEN", token, 1) != 0) {
    fprintf(stderr, "gradsync-run: cannot set GRADSYNC_TOKEN: %s\n", strerror(errno));
    return 1;
  }
  memset(token, 'x', strlen(token));
  return 0;
}

/* Where row `name` got its value, for messages: " (from $VAR)" or "". */
static const char *from(const char *const *sources, const char *name, char *buf, size_t len)
{
  const char *source = gs_flags_source(&flags, sources, name);

  buf[0] = '\0';
  if (source && strcmp(source, "flag") != 0)
    snprintf(buf, len, " (from $%s)", source);
  return buf;
}

/* The settings must fit together: a node rank below the node count, one
 * coordinator for several nodes, a world the agents accept. */
static int check_fit(const gs_run_config_t *cfg, const char *const *sources)
{
  char a[80], b[80];

  if (cfg->node_rank >= cfg->nnodes) {
    fprintf(stderr, "gradsync-run: --node-rank %ld%s must be below --nnodes %ld%s\n",
            cfg->node_rank, from(sources, "--node-rank", a, sizeof(a)), cfg->nnodes,
            from(sources, "--nnodes", b, sizeof(b)));
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->nnodes > 1 && !cfg->join) {
    fprintf(stderr,
            "gradsync-run: --nnodes %ld%s needs --coordinator HOST:PORT: the nodes join one "
            "coordinator (start gradsync-coordinator first; without --coordinator gradsync-run "
            "starts its own, for this node alone)\n",
            cfg->nnodes, from(sources, "--nnodes", a, sizeof(a)));
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->world > GS_RUN_MAX_WORLD) {
    fprintf(stderr, "gradsync-run: --nnodes %ld x --nproc-per-node %ld is %ld ranks; at most %d\n",
            cfg->nnodes, cfg->nproc, cfg->world, GS_RUN_MAX_WORLD);
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->min_ranks > cfg->world) {
    fprintf(stderr, "gradsync-run: --min-ranks %ld%s is above the world size %ld\n", cfg->min_ranks,
            from(sources, "--min-ranks", a, sizeof(a)), cfg->world);
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->join && cfg->have_http) {
    fprintf(stderr, "gradsync-run: --http is for the coordinator gradsync-run starts; with "
                    "--coordinator it runs elsewhere (its own --http)\n");
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->join && !cfg->coord_host[0]) {
    fprintf(stderr, "gradsync-run: --coordinator needs a host: HOST:PORT\n");
    return GS_RUN_USAGE_ERR;
  }
  return 0;
}

/* Agent flags the launcher sets itself may not be passed again; a command
 * gets no flags, so anything goes. */
static int check_pass(gs_run_config_t *cfg)
{
  cfg->command = cfg->npass > 0 && cfg->pass[0][0] != '-';
  for (int i = 0; !cfg->command && i < cfg->npass; i++) {
    if (is_reserved(cfg->pass[i])) {
      fprintf(stderr, "gradsync-run: agent flag '%s' is set by the launcher (see --help)\n",
              cfg->pass[i]);
      return GS_RUN_USAGE_ERR;
    }
  }
  return 0;
}

/* With a node agent the agents' TLS flags (--tls-ca FILE, --tls-cert=FILE,
 * ...) are the node agent's: it speaks TLS to the coordinator, and the
 * ranks reach it on a plain Unix socket. */
static void move_tls_flags(gs_run_config_t *cfg)
{
  int keep = 0;

  for (int i = 0; i < cfg->npass; i++) {
    const char *a = cfg->pass[i];
    bool tls = !cfg->command && !strncmp(a, "--tls-", 6);
    int n = tls && !strchr(a, '=') && i + 1 < cfg->npass ? 2 : 1; /* with its value */

    /* Three flags with their values fill relay_tls; more stay the agents'. */
    tls = tls && cfg->nrelay_tls + n <= (int)(sizeof(cfg->relay_tls) / sizeof(cfg->relay_tls[0]));

    for (int k = 0; k < n; k++) {
      if (tls)
        cfg->relay_tls[cfg->nrelay_tls++] = cfg->pass[i + k];
      else
        cfg->pass[keep++] = cfg->pass[i + k];
    }
    i += n - 1;
  }
  cfg->npass = keep;
}

/* The coordinator gradsync-run starts listens on loopback without TLS:
 * TLS settings for the agents would only make every rank fail against
 * it, so they are refused up front (they pass through to agents that
 * join a coordinator with --coordinator, or to their node agent). */
static int check_tls(gs_run_config_t *cfg)
{
  /* The agents' variables, and the coordinator's, which the coordinator
   * gradsync-run starts would inherit. */
  static const char *const vars[] = {"GRADSYNC_TLS_CA",         "GRADSYNC_TLS_CERT",
                                     "GRADSYNC_TLS_KEY",        "GRADSYNC_TLS_SERVER_CERT",
                                     "GRADSYNC_TLS_SERVER_KEY", "GRADSYNC_TLS_CLIENT_CA"};
  static const char standalone[] = "the coordinator gradsync-run starts listens on loopback "
                                   "without TLS; TLS is for agents joining a coordinator started "
                                   "with --tls-cert (--coordinator HOST:PORT)";
  const char *why = standalone;

  if (cfg->join) {
    if (cfg->node_agent)
      move_tls_flags(cfg);
    return 0;
  }
  for (int i = 0; !cfg->command && i < cfg->npass; i++) {
    if (!strncmp(cfg->pass[i], "--tls-", 6)) {
      fprintf(stderr, "gradsync-run: agent flag '%s': %s\n", cfg->pass[i], why);
      return GS_RUN_USAGE_ERR;
    }
  }
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char *v = getenv(vars[i]);

    if (v && v[0]) {
      fprintf(stderr, "gradsync-run: $%s is set: %s\n", vars[i], why);
      return GS_RUN_USAGE_ERR;
    }
  }
  return 0;
}

/* --print-config: the table's rows, then what follows from them. */
static void print_config(const gs_run_config_t *cfg, const gs_flags_opts_t *opts,
                         gs_launch_env_t *le)
{
  gs_flags_print_config(&flags, cfg, opts, stdout);
  printf("world size: %ld (%ld node%s x %ld)\n", cfg->world, cfg->nnodes,
         cfg->nnodes == 1 ? "" : "s", cfg->nproc);
  if (cfg->join)
    printf("mode: join the coordinator at %s\n", cfg->rpc);
  else
    printf("mode: start a coordinator on this machine\n");
  if (cfg->npass)
    printf("runs: %s\n", cfg->command ? cfg->pass[0] : "gradsync-agent");
  if (cfg->ncoord) {
    printf("coordinator flags:");
    for (int i = 0; i < cfg->ncoord; i++)
      printf(" %s", cfg->coord_args[i]);
    printf("\n");
  }
  gs_launch_env_run_notes(le, stdout);
}

/* What the table parse leaves to code: --help/--version (cfg still holds
 * the defaults then), the world size and the coordinator's address, the
 * checks, the grace period as text for messages, the token. */
static int after_parse(gs_run_config_t *cfg, gs_flags_action_t action, const gs_flags_opts_t *opts,
                       gs_launch_env_t *le)
{
  int rc;

  if (gs_flags_answer(&flags, cfg, action, GS_VERSION)) {
    if (action == GS_FLAGS_HELP)
      gs__run_help_coord_flags(stdout);
    return -1;
  }
  cfg->world = cfg->nnodes * cfg->nproc;
  if (cfg->join)
    snprintf(cfg->rpc, sizeof(cfg->rpc), strchr(cfg->coord_host, ':') ? "[%s]:%u" : "%s:%u",
             cfg->coord_host, cfg->coord_port);
  rc = gs__run_take_coord_flags(cfg);
  if (!rc)
    rc = check_pass(cfg);
  if (!rc)
    rc = gs__run_check_misplaced(cfg);
  if (!rc)
    rc = check_tls(cfg);
  if (rc)
    return rc;
  if (cfg->print_config) {
    print_config(cfg, opts, le);
    return -1;
  }
  rc = check_fit(cfg, opts->sources);
  if (rc)
    return rc;
  for (size_t i = 0; i < flags.count; i++)
    if (!strcmp(flag_rows[i].name, "--grace"))
      gs_flags_show_default(&flag_rows[i], cfg, cfg->grace_text, sizeof(cfg->grace_text));
  return cfg->token ? take_token(cfg->token) : 0;
}

int gs__run_parse_args(int argc, char **argv, gs_run_config_t *cfg)
{
  const char *sources[sizeof(flag_rows) / sizeof(flag_rows[0])];
  gs_flags_opts_t opts = {.lookup = gs_launch_env_lookup,
                          .ctx = &cfg->env,
                          .sources = sources,
                          .npass = &cfg->npass,
                          .pass_dashes = &cfg->pass_dashes};
  gs_flags_action_t action;
  char why[512];

  set_defaults(cfg);
  gs_launch_env_init(&cfg->env, getenv);
  cfg->pass = calloc((size_t)argc, sizeof(*cfg->pass));
  cfg->coord_args = calloc((size_t)argc, sizeof(*cfg->coord_args));
  if (!cfg->pass || !cfg->coord_args) {
    fprintf(stderr, "gradsync-run: out of memory\n");
    return 1;
  }
  opts.pass = cfg->pass;
  if (gs_flags_parse(&flags, cfg, argc, argv, &opts, &action, why, sizeof(why))) {
    fprintf(stderr, "%s: %s\n", flags.prog, why);
    return GS_RUN_USAGE_ERR;
  }
  return after_parse(cfg, action, &opts, &cfg->env);
}

/* Fills `out` with the program to run: the flag's value, or `name` in the
 * launcher's own directory; fails with a message if it cannot be executed. */
static int resolve_bin(const char *flag_value, const char *flag, const char *name, char *out,
                       size_t len)
{
  char self[PATH_MAX];
  ssize_t n;
  char *slash;
  int len_needed;

  if (flag_value) {
    len_needed = snprintf(out, len, "%s", flag_value);
  } else {
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
      fprintf(stderr, "gradsync-run: cannot read /proc/self/exe to find %s: %s (use %s PATH)\n",
              name, strerror(errno), flag);
      return 1;
    }
    self[n] = '\0';
    slash = strrchr(self, '/');
    if (slash)
      *slash = '\0';
    len_needed = snprintf(out, len, "%s/%s", self, name);
  }
  if (len_needed < 0 || (size_t)len_needed >= len) {
    fprintf(stderr, "gradsync-run: path of %s is too long (over %zu bytes)\n", name, len - 1);
    return 1;
  }
  if (access(out, X_OK) != 0 && flag_value) {
    fprintf(stderr, "gradsync-run: cannot execute %s '%s' (from %s): %s\n", name, out, flag,
            strerror(errno));
    return 1;
  }
  if (access(out, X_OK) != 0) {
    fprintf(stderr,
            "gradsync-run: cannot execute %s '%s': %s (install it next to gradsync-run or "
            "pass %s PATH)\n",
            name, out, strerror(errno), flag);
    return 1;
  }
  return 0;
}

/* The programs this run starts: the coordinator unless it joins one, the
 * agent unless it runs a command (found in $PATH when it starts). */
/* BIN/../python when it holds the gradsync package (gradsync-run run from
 * a build tree), so that `gradsync-run -- python3 train.py` imports the
 * package built beside it with no PYTHONPATH to set. */
static void find_python_dir(gs_run_config_t *cfg)
{
  char self[PATH_MAX], probe[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  char *slash;

  cfg->python_dir[0] = '\0';
  if (n <= 0)
    return;
  self[n] = '\0';
  slash = strrchr(self, '/');
  if (!slash)
    return;
  *slash = '\0';
  slash = strrchr(self, '/');
  if (!slash)
    return;
  *slash = '\0'; /* the folder above bin/ */
  snprintf(probe, sizeof(probe), "%s/python/gradsync/__init__.py", self);
  if (access(probe, R_OK) != 0)
    return;
  /* The return value checked (not only the length above): GCC's
   * -Wformat-truncation in the Debug (ASan) build wants it used. */
  n = snprintf(cfg->python_dir, sizeof(cfg->python_dir), "%s/python", self);
  if (n < 0 || (size_t)n >= sizeof(cfg->python_dir))
    cfg->python_dir[0] = '\0';
}

int gs__run_resolve_bins(gs_run_config_t *cfg)
{
  find_python_dir(cfg);
  if (!cfg->join && resolve_bin(cfg->coord_flag, "--coordinator-bin", "gradsync-coordinator",
                                cfg->coord_bin, sizeof(cfg->coord_bin)))
    return 1;
  if (!cfg->command && resolve_bin(cfg->agent_flag, "--agent-bin", "gradsync-agent", cfg->agent_bin,
                                   sizeof(cfg->agent_bin)))
    return 1;
  if (cfg->node_agent && resolve_bin(cfg->relay_flag, "--relay-bin", "gradsync-relay",
                                     cfg->relay_bin, sizeof(cfg->relay_bin)))
    return 1;
  return 0;
}
