/* The launch environment: the variables schedulers already set (torchrun
 * and Kubeflow PyTorchJob, Kubeflow Trainer's PET_*, SLURM, a Kubernetes
 * Indexed Job) translated into the flag values of gradsync-agent and
 * gradsync-run. Each flag table names the sources of each flag in order
 * (GRADSYNC_* first) with the lists below; this module is the lookup
 * gs_flags_parse calls for them (gs_flags_opts_t.lookup), so the tables
 * stay the one place that says which variable feeds which flag.
 *
 * Pure: it reads the environment only through the getenv it is given. */
#ifndef GS_LAUNCH_ENV_H
#define GS_LAUNCH_ENV_H

#include <stdio.h>

/* The coordinator port used with $MASTER_ADDR when $GRADSYNC_COORDINATOR_PORT
 * is unset: gradsync-coordinator's default. $MASTER_PORT is the port of
 * torch's own store (torchrun's rendezvous), not ours. */
#define GS_LAUNCH_COORD_PORT "7070"

typedef char *(*gs_launch_getenv_fn)(const char *name);

/* Where each job setting of gradsync-agent comes from when its flag is
 * absent, in order, the first set winning: gradsync's own name, then the
 * schedulers' (the flag table's .envs). */
extern const char *const gs_launch_coordinator_envs[];
extern const char *const gs_launch_job_envs[];
extern const char *const gs_launch_world_size_envs[];
extern const char *const gs_launch_local_rank_envs[];
/* The rank a launcher numbered the agent in a fixed world: gradsync-run's,
 * torchrun's, or srun's task id when srun starts one agent per task. */
extern const char *const gs_launch_rank_envs[];
extern const char *const gs_launch_node_envs[];

/* gradsync-run's own: nodes in the job, this node's index among them, and
 * agents per node (--nnodes, --node-rank, --nproc-per-node). */
extern const char *const gs_launch_nnodes_envs[];
extern const char *const gs_launch_node_rank_envs[];
extern const char *const gs_launch_nproc_envs[];

/* The lookup's state: the getenv it reads through and the buffers its
 * translated values live in (as long as the struct). */
typedef struct gs_launch_env {
  gs_launch_getenv_fn getenv;
  char coord[320]; /* "$MASTER_ADDR:port" */
  char job[160];   /* "slurm-$SLURM_JOB_ID" */
  char world[24];  /* $PET_NNODES × $PET_NPROC_PER_NODE */
} gs_launch_env_t;

void gs_launch_env_init(gs_launch_env_t *le, gs_launch_getenv_fn getenv);

/* A gs_flags_opts_t.lookup (ctx: a gs_launch_env_t). Returns name's value,
 * translated for the derived sources, or NULL when unset or empty:
 *   MASTER_ADDR, PET_MASTER_ADDR   "HOST:PORT", PORT from
 *                                  $GRADSYNC_COORDINATOR_PORT or 7070
 *   SLURM_JOB_ID                   "slurm-ID" (a job name)
 *   PET_NNODES*PET_NPROC_PER_NODE  their product, when both are plain
 *                                  integers (torchrun also takes "auto",
 *                                  "gpu" and "MIN:MAX" there: unset then)
 * and any other name as getenv gives it. The string lives as long as `ctx`
 * and until the next lookup of the same derived name. */
const char *gs_launch_env_lookup(void *ctx, const char *name);

/* Writes one line for each scheduler variable that is set but that
 * gradsync-agent does not use ($RANK, $SLURM_PROCID, $MASTER_PORT, ...),
 * and why, for --print-config. */
void gs_launch_env_notes(gs_launch_env_t *le, FILE *out);

/* The same for gradsync-run, which reads the node variables the agent
 * ignores and sets the per-process ones itself. */
void gs_launch_env_run_notes(gs_launch_env_t *le, FILE *out);

#endif
