/* gradsync-run's flags (one table, common/flags.h) and the programs it
 * starts. Arguments that are no launcher flag go to every agent. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "launcher.h"

#define STR(x) #x
#define XSTR(x) STR(x)

/* The flags, one row each; --help and the README table are made from them
 * and the defaults set_defaults() writes. Kept out of clang-format so each
 * flag stays one block of a few lines. */
#define CFG(member) GS_FLAG_AT(gs_run_config_t, member)
/* clang-format off */
static const gs_flag_t flag_rows[] = {
  {.name = "--nproc", .kind = GS_FLAG_INT, CFG(nproc), .min = 1, .max = GS_RUN_MAX_NPROC,
   .required = true, .metavar = "N", .help = "number of agents, 1.." XSTR(GS_RUN_MAX_NPROC),
   .doc = "number of agents (ranks), 1.." XSTR(GS_RUN_MAX_NPROC)},
  /* The agents' limit: refused here rather than by every rank. */
  {.name = "--job", .kind = GS_FLAG_STR, CFG(job), .min = 1, .max = 127, .metavar = "NAME",
   .help = "job name", .doc = "job name at the coordinator"},
  {.name = "--http", .kind = GS_FLAG_ADDR, CFG(http_host),
   GS_FLAG_PORT_AT(gs_run_config_t, http_port), .metavar = "HOST:PORT",
   .help = "coordinator HTTP address (port 0: any free port)",
   .doc = "the coordinator's HTTP address (port 0: any free port; the status URL is printed)"},
  {.name = "--token", .kind = GS_FLAG_STR, CFG(token), .min = 1, .max = GS_RUN_TOKEN_MAX,
   .secret = true, .metavar = "TOKEN", .def = "`$GRADSYNC_TOKEN`",
   .help = "shared secret; handed to the coordinator and agents in $GRADSYNC_TOKEN",
   .doc = "shared secret, handed to coordinator and agents through the environment, never on "
          "a command line"},
  {.name = "--grace", .kind = GS_FLAG_DURATION, CFG(grace_ms), .metavar = "DUR",
   .help = "wait this long after SIGTERM before SIGKILL when stopping",
   .doc = "how long stopping ranks get after SIGTERM before SIGKILL"},
  {.name = "--coordinator-bin", .kind = GS_FLAG_STR, CFG(coord_flag), .metavar = "PATH",
   .def = "next to `gradsync-run`", .help = "coordinator program",
   .doc = "the coordinator program to start"},
  {.name = "--agent-bin", .kind = GS_FLAG_STR, CFG(agent_flag), .metavar = "PATH",
   .def = "next to `gradsync-run`", .help = "agent program",
   .doc = "the agent program to start"},
};
/* clang-format on */

static const gs_flags_t flags = {
    .prog = "gradsync-run",
    .usage = "usage: gradsync-run --nproc N [options] [--] [agent flags...]\n"
             "\n"
             "Starts a gradsync coordinator on this machine and N agents joined to it, and\n"
             "prints each line they write prefixed with \"[rank i] \" (\"[coordinator] \").\n"
             "When one rank fails the others are stopped. Exit status: 0 when every rank\n"
             "finished; the failing rank's status (1..125) or 1 when one failed; 128+N when\n"
             "stopped by signal N.\n"
             "\n",
    .epilog = "Every other argument, and everything after \"--\", goes to each agent unchanged,\n"
              "after --coordinator H:P --job NAME --world-size N --local-rank i. Agents also\n"
              "get LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE in their environment; with\n"
              "fewer GPUs than --nproc they pick the cpu device unless told --device.\n"
              "SIGINT, SIGTERM and SIGHUP stop the agents with SIGTERM, then the coordinator;\n"
              "a SIGINT while stopping kills everything at once.\n",
    .flags = flag_rows,
    .count = sizeof(flag_rows) / sizeof(flag_rows[0]),
};

static void set_defaults(gs_run_config_t *cfg)
{
  cfg->job = "local";
  snprintf(cfg->http_host, sizeof(cfg->http_host), "127.0.0.1");
  cfg->http_port = 0;
  cfg->grace_ms = 10000;
}

/* Agent flags the launcher sets itself: passing them again would override it. */
static bool is_reserved(const char *arg)
{
  static const char *const reserved[] = {"--coordinator", "--job", "--world-size", "--local-rank"};

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

/* What the table parse leaves to code: --help/--version (cfg still holds
 * the defaults then), the agent flags the launcher sets itself, the
 * grace period as text for messages, the token. */
static int after_parse(gs_run_config_t *cfg, gs_flags_action_t action)
{
  if (gs_flags_answer(&flags, cfg, action, GS_VERSION))
    return -1;
  for (int i = 0; i < cfg->npass; i++) {
    if (is_reserved(cfg->pass[i])) {
      fprintf(stderr, "gradsync-run: agent flag '%s' is set by the launcher (see --help)\n",
              cfg->pass[i]);
      return GS_RUN_USAGE_ERR;
    }
  }
  for (size_t i = 0; i < flags.count; i++)
    if (!strcmp(flag_rows[i].name, "--grace"))
      gs_flags_show_default(&flag_rows[i], cfg, cfg->grace_text, sizeof(cfg->grace_text));
  return cfg->token ? take_token(cfg->token) : 0;
}

int gs__run_parse_args(int argc, char **argv, gs_run_config_t *cfg)
{
  gs_flags_opts_t opts = {.pass = NULL, .npass = &cfg->npass};
  gs_flags_action_t action;
  char why[512];

  set_defaults(cfg);
  cfg->pass = calloc((size_t)argc, sizeof(*cfg->pass));
  if (!cfg->pass) {
    fprintf(stderr, "gradsync-run: out of memory\n");
    return 1;
  }
  opts.pass = cfg->pass;
  if (gs_flags_parse(&flags, cfg, argc, argv, &opts, &action, why, sizeof(why))) {
    fprintf(stderr, "%s: %s\n", flags.prog, why);
    return GS_RUN_USAGE_ERR;
  }
  return after_parse(cfg, action);
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

int gs__run_resolve_bins(gs_run_config_t *cfg)
{
  return resolve_bin(cfg->coord_flag, "--coordinator-bin", "gradsync-coordinator", cfg->coord_bin,
                     sizeof(cfg->coord_bin)) ||
                 resolve_bin(cfg->agent_flag, "--agent-bin", "gradsync-agent", cfg->agent_bin,
                             sizeof(cfg->agent_bin))
             ? 1
             : 0;
}
