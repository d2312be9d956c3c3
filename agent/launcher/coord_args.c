/* gradsync-coordinator's flags given to gradsync-run: before "--" they go
 * to the coordinator gradsync-run starts, parsed with the coordinator's
 * own table (common/coord_config/coord_flags.c), so that gradsync-run
 * accepts exactly what the coordinator does and refuses a bad value before
 * anything starts. Anywhere else they are refused, saying whose flag it
 * is and where it belongs. */
#include <stdio.h>
#include <string.h>

#include "coord_flags.h"
#include "launcher.h"

/* Coordinator flags that gradsync-agent has too: they stay with the
 * agents, and --log-level goes to the coordinator gradsync-run starts as
 * well (--token is gradsync-run's own before "--"). The
 * coordinator_flags case of tests/test_agent.py holds this list to both
 * programs' tables. */
static const char *const shared_with_agents[] = {"--log-level", "--tls-cert", "--tls-key",
                                                 "--token", NULL};

/* Coordinator flags gradsync-run sets itself, and why. */
static const struct {
  const char *name, *why;
} set_by_run[] = {
    {"--listen", "loopback, a free port the agents are told"},
    {"--max-world-size", "the world of this run"},
    {"--http", "gradsync-run's own --http, before \"--\""},
};

static bool listed(const char *const *list, const char *name)
{
  for (; *list; list++)
    if (!strcmp(*list, name))
      return true;
  return false;
}

/* The coordinator's row for `arg` ("--name" or "--name=value"), or NULL. */
static const gs_flag_t *coord_row(const char *arg)
{
  const gs_flags_t *spec = gs_coord_flags();
  size_t n = strcspn(arg, "=");

  if (strncmp(arg, "--", 2) != 0)
    return NULL;
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];

    if (f->kind == GS_FLAG_SECTION)
      continue;
    if ((strlen(f->name) == n && !strncmp(f->name, arg, n)) ||
        (f->alias && strlen(f->alias) == n && !strncmp(f->alias, arg, n)))
      return f;
  }
  return NULL;
}

/* Whether `arg`, of row f, takes the next argument as its value. */
static bool takes_next(const gs_flag_t *f, const char *arg)
{
  return f->kind != GS_FLAG_BOOL && !strchr(arg, '=') && !(f->kind == GS_FLAG_ENUM && f->bare);
}

/* Refuses a coordinator flag (of none but the coordinator) before "--"
 * that gradsync-run cannot hand on: it starts no coordinator, sets the
 * flag itself, or starts one without TLS. */
static int refuse(const gs_run_config_t *cfg, const gs_flag_t *f)
{
  if (cfg->join) {
    fprintf(stderr,
            "gradsync-run: %s is a flag of gradsync-coordinator, and with --coordinator %s "
            "gradsync-run starts no coordinator: give it to the gradsync-coordinator serving "
            "%s\n",
            f->name, cfg->rpc, cfg->rpc);
    return GS_RUN_USAGE_ERR;
  }
  for (size_t i = 0; i < sizeof(set_by_run) / sizeof(set_by_run[0]); i++) {
    if (!strcmp(f->name, set_by_run[i].name)) {
      fprintf(stderr,
              "gradsync-run: %s of gradsync-coordinator is set by gradsync-run for the "
              "coordinator it starts (%s)\n",
              f->name, set_by_run[i].why);
      return GS_RUN_USAGE_ERR;
    }
  }
  if (!strncmp(f->name, "--tls-", 6)) {
    fprintf(stderr,
            "gradsync-run: %s of gradsync-coordinator: the coordinator gradsync-run starts "
            "listens on loopback without TLS; TLS is for a coordinator started on its own "
            "(gradsync-run --coordinator HOST:PORT)\n",
            f->name);
    return GS_RUN_USAGE_ERR;
  }
  return 0;
}

/* Appends `n` arguments from `from` to the coordinator's. */
static void to_coordinator(gs_run_config_t *cfg, char **from, int n)
{
  for (int k = 0; k < n; k++)
    cfg->coord_args[cfg->ncoord++] = from[k];
}

/* The coordinator's flags, parsed as the coordinator will (into a scratch
 * config): a bad value is refused now, naming the flag. */
static int check_values(const gs_run_config_t *cfg)
{
  char *argv[GS_RUN_MAX_COORD_ARGS + 2];
  gs_coord_config_t scratch;
  gs_flags_action_t action;
  char why[512];

  if (cfg->ncoord > GS_RUN_MAX_COORD_ARGS) {
    fprintf(stderr, "gradsync-run: more than %d arguments for the coordinator\n",
            GS_RUN_MAX_COORD_ARGS);
    return GS_RUN_USAGE_ERR;
  }
  argv[0] = "gradsync-coordinator";
  for (int i = 0; i < cfg->ncoord; i++)
    argv[i + 1] = cfg->coord_args[i];
  argv[cfg->ncoord + 1] = NULL;
  gs_coord_config_defaults(&scratch);
  if (gs_flags_parse(gs_coord_flags(), &scratch, cfg->ncoord + 1, argv, NULL, &action, why,
                     sizeof(why))) {
    fprintf(stderr, "gradsync-run: %s (a flag of gradsync-coordinator)\n", why);
    return GS_RUN_USAGE_ERR;
  }
  return 0;
}

/* Whether the ranks run a command, not gradsync-agent: past the
 * coordinator's flags (and the ones it shares with the agents) comes a
 * plain argument, before "--" or right after it. */
static bool runs_command(const gs_run_config_t *cfg)
{
  int i = 0;

  while (i < cfg->pass_dashes) {
    const gs_flag_t *f = coord_row(cfg->pass[i]);

    if (!f)
      break;
    i += takes_next(f, cfg->pass[i]) && i + 1 < cfg->pass_dashes ? 2 : 1;
  }
  return i < cfg->npass && cfg->pass[i][0] != '-';
}

/* Moves the coordinator's flags among pass[0..pass_dashes) into
 * coord_args. The scan stops where a command begins (a plain argument
 * before any agent flag: what follows is the command's own); a value that
 * follows an agent flag is the agent's. --log-level before a command is
 * the coordinator's alone (there is no agent to take it). */
int gs__run_take_coord_flags(gs_run_config_t *cfg)
{
  bool agent_flag = false, command = runs_command(cfg);
  int keep = 0, i, rc;

  for (i = 0; i < cfg->pass_dashes; i++) {
    char *a = cfg->pass[i];
    const gs_flag_t *f = coord_row(a);
    int n = f && takes_next(f, a) && i + 1 < cfg->pass_dashes ? 2 : 1;
    bool shared = f && listed(shared_with_agents, f->name);

    if (!f && a[0] != '-' && !agent_flag)
      break; /* a command and its arguments */
    if (f && !shared) {
      rc = refuse(cfg, f);
      if (rc)
        return rc;
      to_coordinator(cfg, &cfg->pass[i], n);
      i += n - 1;
      continue;
    }
    if (shared && !strcmp(f->name, "--log-level") && (command || !cfg->join)) {
      if (!cfg->join)
        to_coordinator(cfg, &cfg->pass[i], n);
      if (command) {
        i += n - 1;
        continue;
      }
    }
    agent_flag = agent_flag || a[0] == '-';
    for (int k = 0; k < n; k++)
      cfg->pass[keep++] = cfg->pass[i + k];
    i += n - 1;
  }
  /* The rest stays as it was, after what was kept. */
  memmove(&cfg->pass[keep], &cfg->pass[i], (size_t)(cfg->npass - i) * sizeof(cfg->pass[0]));
  cfg->pass_dashes -= i - keep;
  cfg->npass -= i - keep;
  return cfg->ncoord ? check_values(cfg) : 0;
}

/* Refuses a flag of the coordinator alone among the agents' arguments
 * after "--" (a command's are its own): each agent would refuse it. */
int gs__run_check_misplaced(const gs_run_config_t *cfg)
{
  for (int i = cfg->pass_dashes; !cfg->command && i < cfg->npass; i++) {
    const gs_flag_t *f = coord_row(cfg->pass[i]);

    if (!f || listed(shared_with_agents, f->name))
      continue;
    if (cfg->join)
      fprintf(stderr,
              "gradsync-run: %s is a flag of gradsync-coordinator, not of gradsync-agent; with "
              "--coordinator %s gradsync-run starts no coordinator: give it to the "
              "gradsync-coordinator serving %s\n",
              f->name, cfg->rpc, cfg->rpc);
    else
      fprintf(stderr,
              "gradsync-run: %s is a flag of gradsync-coordinator, not of gradsync-agent: put it "
              "before \"--\", and gradsync-run hands it to the coordinator it starts\n",
              f->name);
    return GS_RUN_USAGE_ERR;
  }
  return 0;
}

/* --help's list of the coordinator flags gradsync-run takes, from the
 * coordinator's table, wrapped to 80 columns. */
void gs__run_help_coord_flags(FILE *out)
{
  const gs_flags_t *spec = gs_coord_flags();
  size_t col = 0;

  fputs("\nCoordinator flags (gradsync-coordinator --help says what each does), before\n"
        "\"--\", for the coordinator gradsync-run starts; refused with --coordinator:\n",
        out);
  for (size_t i = 0; i < spec->count; i++) {
    const gs_flag_t *f = &spec->flags[i];
    size_t len;
    bool own = false;

    if (f->kind == GS_FLAG_SECTION || !strncmp(f->name, "--tls-", 6) ||
        (listed(shared_with_agents, f->name) && strcmp(f->name, "--log-level") != 0))
      continue;
    for (size_t k = 0; k < sizeof(set_by_run) / sizeof(set_by_run[0]); k++)
      own = own || !strcmp(f->name, set_by_run[k].name);
    if (own)
      continue;
    len = strlen(f->name);
    if (col && col + 2 + len > 79) {
      fputs(",\n", out);
      col = 0;
    } else if (col) {
      fputs(", ", out);
      col += 2;
    }
    if (!col) {
      fputs("  ", out);
      col = 2;
    }
    fputs(f->name, out);
    col += len;
  }
  fputs(col ? "\n" : "", out);
  fputs("(--log-level goes to the agents as well.)\n", out);
}
