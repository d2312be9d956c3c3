/* Scheduler variables into gradsync-agent flag values (launch_env.h). */
#include "launch_env.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

/* torchrun's WORLD_SIZE counts processes, as --world-size does (a
 * PyTorchJob that starts one agent per pod, without torchrun, is read the
 * same way). PET_* are torchrun's own arguments as Kubeflow Trainer sets
 * them. SLURM_NTASKS counts tasks, one agent each. */
const char *const gs_launch_coordinator_envs[] = {"GRADSYNC_COORDINATOR", "MASTER_ADDR",
                                                  "PET_MASTER_ADDR", NULL};
const char *const gs_launch_job_envs[] = {"GRADSYNC_JOB", "SLURM_JOB_ID", NULL};
const char *const gs_launch_world_size_envs[] = {
    "GRADSYNC_WORLD_SIZE", "WORLD_SIZE", "PET_NNODES*PET_NPROC_PER_NODE", "SLURM_NTASKS", NULL};
const char *const gs_launch_local_rank_envs[] = {"GRADSYNC_LOCAL_RANK", "LOCAL_RANK",
                                                 "SLURM_LOCALID", NULL};
const char *const gs_launch_node_envs[] = {"GRADSYNC_NODE", "SLURMD_NODENAME", NULL};

void gs_launch_env_init(gs_launch_env_t *le, gs_launch_getenv_fn getenv)
{
  memset(le, 0, sizeof(*le));
  le->getenv = getenv;
}

/* name's value, or NULL when unset or empty. */
static const char *get(const gs_launch_env_t *le, const char *name)
{
  const char *v = le->getenv(name);

  return v && *v ? v : NULL;
}

/* "HOST:PORT" from a torch master address; an IPv6 literal in brackets. */
static const char *coordinator(gs_launch_env_t *le, const char *addr_var)
{
  const char *host = get(le, addr_var), *port = get(le, "GRADSYNC_COORDINATOR_PORT");
  bool v6 = host && strchr(host, ':');

  if (!host)
    return NULL;
  snprintf(le->coord, sizeof(le->coord), "%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "",
           port ? port : GS_LAUNCH_COORD_PORT);
  return le->coord;
}

/* $PET_NNODES × $PET_NPROC_PER_NODE when both are plain counts. */
static const char *pet_world(gs_launch_env_t *le)
{
  const char *nodes = get(le, "PET_NNODES"), *nproc = get(le, "PET_NPROC_PER_NODE");
  long n, p;

  if (!nodes || !nproc || gs_parse_long(nodes, 1, 1 << 20, &n) ||
      gs_parse_long(nproc, 1, 1 << 20, &p))
    return NULL;
  snprintf(le->world, sizeof(le->world), "%ld", n * p);
  return le->world;
}

const char *gs_launch_env_lookup(void *ctx, const char *name)
{
  gs_launch_env_t *le = ctx;
  const char *v;

  if (!strcmp(name, "MASTER_ADDR") || !strcmp(name, "PET_MASTER_ADDR"))
    return coordinator(le, name);
  if (!strcmp(name, "PET_NNODES*PET_NPROC_PER_NODE"))
    return pet_world(le);
  if (!strcmp(name, "SLURM_JOB_ID")) {
    v = get(le, name);
    if (!v)
      return NULL;
    snprintf(le->job, sizeof(le->job), "slurm-%s", v);
    return le->job;
  }
  return get(le, name);
}

/* Set variables gradsync reads no value from, and why. */
static const struct {
  const char *name, *why;
} ignored[] = {
    {"RANK", "gradsync numbers ranks itself, by --node then --local-rank"},
    {"SLURM_PROCID", "gradsync numbers ranks itself, by --node then --local-rank"},
    {"PET_NODE_RANK", "gradsync numbers ranks itself, by --node then --local-rank"},
    {"SLURM_NODEID", "gradsync numbers ranks itself, by --node then --local-rank"},
    {"MASTER_PORT", "torch's store port; the coordinator's is $GRADSYNC_COORDINATOR_PORT or 7070"},
    {"PET_MASTER_PORT",
     "torch's store port; the coordinator's is $GRADSYNC_COORDINATOR_PORT or 7070"},
};

void gs_launch_env_notes(gs_launch_env_t *le, FILE *out)
{
  for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
    const char *v = get(le, ignored[i].name);

    if (v)
      fprintf(out, "ignored: $%s=%s (%s)\n", ignored[i].name, v, ignored[i].why);
  }
}
