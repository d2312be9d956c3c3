/* Scheduler variables into gradsync-agent and gradsync-run flag values
 * (launch_env.h). */
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
const char *const gs_launch_rank_envs[] = {"GRADSYNC_RANK", "RANK", "SLURM_PROCID", NULL};
const char *const gs_launch_node_envs[] = {"GRADSYNC_NODE", "SLURMD_NODENAME", NULL};

/* A Kubernetes Indexed Job numbers its pods 0..completions-1 in
 * $JOB_COMPLETION_INDEX: with one pod per node that is the node rank.
 * SLURM's per-node count is the GPUs it gave the node, one agent each:
 * $SLURM_NTASKS_PER_NODE counts gradsync-run tasks, not agents. */
const char *const gs_launch_nnodes_envs[] = {"GRADSYNC_NNODES", "SLURM_NNODES", "PET_NNODES", NULL};
const char *const gs_launch_node_rank_envs[] = {"GRADSYNC_NODE_RANK", "SLURM_NODEID",
                                                "PET_NODE_RANK", "JOB_COMPLETION_INDEX", NULL};
const char *const gs_launch_nproc_envs[] = {"GRADSYNC_NPROC_PER_NODE", "PET_NPROC_PER_NODE",
                                            "SLURM_GPUS_ON_NODE", NULL};

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

/* Set variables a program reads no value from, and why. */
typedef struct ignored {
  const char *name, *why;
} ignored_t;

#define NODE_RANK "the agent's own rank is $RANK; the node's is gradsync-run's"
#define STORE_PORT "torch's store port; the coordinator's is $GRADSYNC_COORDINATOR_PORT or 7070"
#define RUN_SETS "gradsync-run sets each agent's"
#define RUN_WORLD "the world size is --nnodes x --nproc-per-node"

static const ignored_t agent_ignores[] = {
    {"PET_NODE_RANK", NODE_RANK},
    {"SLURM_NODEID", NODE_RANK},
    {"MASTER_PORT", STORE_PORT},
    {"PET_MASTER_PORT", STORE_PORT},
    {NULL, NULL},
};

static const ignored_t run_ignores[] = {
    {"RANK", RUN_SETS},
    {"SLURM_PROCID", RUN_SETS},
    {"LOCAL_RANK", RUN_SETS},
    {"SLURM_LOCALID", RUN_SETS},
    {"WORLD_SIZE", RUN_WORLD},
    {"SLURM_NTASKS", RUN_WORLD},
    {"SLURM_NTASKS_PER_NODE", "counts gradsync-run tasks, not agents; see --nproc-per-node"},
    {"MASTER_PORT", STORE_PORT},
    {"PET_MASTER_PORT", STORE_PORT},
    {NULL, NULL},
};

static void notes(gs_launch_env_t *le, const ignored_t *list, FILE *out)
{
  for (; list->name; list++) {
    const char *v = get(le, list->name);

    if (v)
      fprintf(out, "ignored: $%s=%s (%s)\n", list->name, v, list->why);
  }
}

void gs_launch_env_notes(gs_launch_env_t *le, FILE *out)
{
  notes(le, agent_ignores, out);
}

void gs_launch_env_run_notes(gs_launch_env_t *le, FILE *out)
{
  notes(le, run_ignores, out);
}
