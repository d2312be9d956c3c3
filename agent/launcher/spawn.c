/* Starting children and signalling them. Each child runs in its own
 * process group with its output on two pipes, dies with the launcher
 * (PR_SET_PDEATHSIG), and gets back the signal mask and open-file limit the
 * launcher had. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "launcher.h"

/* Makes sure fds 0..2 are open, so that no pipe lands on them. */
int gs__run_open_std_fds(void)
{
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0)
      continue;
    if (open("/dev/null", O_RDWR) != fd)
      return GS_EIO;
  }
  return 0;
}

/* Raises the soft limit on open files to fit two pipes per child (the
 * children get the original limit back); fails if the hard limit is lower. */
int gs__run_raise_nofile(gs_run_t *r)
{
  rlim_t need = (rlim_t)(2 * r->cfg.nproc + 64);
  struct rlimit lim;

  if (getrlimit(RLIMIT_NOFILE, &r->orig_nofile) != 0)
    return 0;
  lim = r->orig_nofile;
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need)
    return 0;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need) {
    gs__run_say("--nproc %ld needs about %lu open files but the limit is %lu; raise it (ulimit -n)",
                r->cfg.nproc, (unsigned long)need, (unsigned long)lim.rlim_max);
    return GS_ERANGE;
  }
  lim.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    gs__run_say("cannot raise the open-file limit to %lu: %s", (unsigned long)need,
                strerror(errno));
    return gs_err_from_errno(errno);
  }
  r->nofile_raised = true;
  return 0;
}

/* setenv of a number. */
static void setenv_long(const char *name, long v)
{
  char num[24];

  snprintf(num, sizeof(num), "%ld", v);
  setenv(name, num, 1);
}

/* The world size the ranks get: "N", or "MIN:N" for an elastic job. */
static const char *world_text(const gs_run_config_t *cfg, char *buf, size_t len)
{
  if (cfg->min_ranks)
    snprintf(buf, len, "%ld:%ld", cfg->min_ranks, cfg->world);
  else
    snprintf(buf, len, "%ld", cfg->world);
  return buf;
}

/* $name becomes dir, then what it held. */
static void prepend_path(const char *name, const char *dir)
{
  const char *old = getenv(name);
  char value[2 * PATH_MAX + 2];

  if (!old || !*old)
    setenv(name, dir, 1);
  else if ((size_t)snprintf(value, sizeof(value), "%s:%s", dir, old) < sizeof(value))
    setenv(name, value, 1);
}

/* The rank local rank c has, as torchrun numbers a fixed world: node rank
 * x ranks per node + local rank; -1 when the job is elastic (its ranks
 * change) or this node's rank is unknown. */
static long global_rank(const gs_run_config_t *cfg, const gs_run_child_t *c)
{
  if (cfg->min_ranks || (cfg->nnodes > 1 && !cfg->have_node_rank))
    return -1;
  return cfg->node_rank * cfg->nproc + c->rank;
}

/* In the forked child of rank c: the job in the environment, in gradsync's
 * names (which the agent, and a command, read before any scheduler's) and
 * torchrun's. */
static void rank_env(const gs_run_t *r, const gs_run_child_t *c)
{
  const gs_run_config_t *cfg = &r->cfg;
  long rank = global_rank(cfg, c);
  char text[48];

  if (rank >= 0) {
    setenv_long("RANK", rank);
    setenv_long("GRADSYNC_RANK", rank);
  } else { /* the coordinator numbers the ranks; srun's task id is this launcher's */
    unsetenv("RANK");
    unsetenv("GRADSYNC_RANK");
    unsetenv("SLURM_PROCID");
  }
  setenv_long("LOCAL_RANK", c->rank);
  setenv_long("WORLD_SIZE", cfg->world);
  setenv_long("LOCAL_WORLD_SIZE", cfg->nproc);
  setenv_long("GRADSYNC_LOCAL_RANK", c->rank);
  setenv("GRADSYNC_WORLD_SIZE", world_text(cfg, text, sizeof(text)), 1);
  setenv_long("GRADSYNC_NNODES", cfg->nnodes);
  setenv_long("GRADSYNC_NODE_RANK", cfg->node_rank);
  setenv("GRADSYNC_COORDINATOR", r->rank_rpc[0] ? r->rank_rpc : cfg->rpc, 1);
  /* Behind a node agent a rank cannot route to the coordinator itself:
   * it listens where this host reaches the coordinator from. */
  if (r->rank_bind[0] && !getenv("GRADSYNC_COMM_IFACE") && !getenv("GRADSYNC_COMM_BIND") &&
      !getenv("GRADSYNC_COMM_ADVERTISE"))
    setenv("GRADSYNC_COMM_BIND", r->rank_bind, 1);
  setenv("GRADSYNC_JOB", cfg->job, 1);
  if (cfg->node)
    setenv("GRADSYNC_NODE", cfg->node, 1);
  if (cfg->command && cfg->python_dir[0])
    prepend_path("PYTHONPATH", cfg->python_dir);
  /* The node agent speaks TLS to the coordinator; its socket is plain. */
  if (cfg->node_agent) {
    unsetenv("GRADSYNC_TLS_CA");
    unsetenv("GRADSYNC_TLS_CERT");
    unsetenv("GRADSYNC_TLS_KEY");
  }
  /* Every rank inherits the same GPU list: say so, so that an agent
   * seeing one GPU does not take it for a GPU of its own (a wrapper
   * given as --agent-bin may still hand each rank its own list). */
  if (getenv("CUDA_VISIBLE_DEVICES"))
    setenv("GRADSYNC_RUN_CUDA_VISIBLE_DEVICES", getenv("CUDA_VISIBLE_DEVICES"), 1);
  else
    unsetenv("GRADSYNC_RUN_CUDA_VISIBLE_DEVICES");
}

/* In the forked child: ties its life to the launcher, moves it to its own
 * process group, wires stdin to /dev/null and stdout/stderr to the pipes,
 * restores the signal mask and runs argv (a command: searched in $PATH);
 * exits 127 if it cannot. */
static void __attribute__((noreturn))
child_exec(const gs_run_t *r, const gs_run_child_t *c, char *const argv[], int out_fd, int err_fd)
{
  char msg[PATH_MAX + 128];
  int n, err;

  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != r->self)
    _exit(127);
  setpgid(0, 0);
  if (dup2(r->devnull, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
    _exit(127);
  if (c->rank >= 0)
    rank_env(r, c);
  signal(SIGPIPE, SIG_DFL);
  if (r->nofile_raised)
    setrlimit(RLIMIT_NOFILE, &r->orig_nofile);
  sigprocmask(SIG_SETMASK, &r->orig_mask, NULL);
  if (c->rank >= 0 && r->cfg.command)
    execvp(argv[0], argv);
  else
    execv(argv[0], argv);
  err = errno;
  n = snprintf(msg, sizeof(msg), "gradsync-run: cannot execute %s: %s%s\n", argv[0], strerror(err),
               err == ENOENT && access(argv[0], F_OK) == 0 ? " (is its #! interpreter missing?)"
                                                           : "");
  gs__run_write_all(2, msg, n < (int)sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
  _exit(127);
}

/* Reports why child c could not be started and returns the error. */
static int spawn_error(const gs_run_child_t *c, char *const argv[], const char *call)
{
  int err = errno;

  if (c->rank >= 0)
    gs__run_say("cannot start rank %d (%s): %s: %s", c->rank, argv[0], call, strerror(err));
  else
    gs__run_say("cannot start the coordinator (%s): %s: %s", argv[0], call, strerror(err));
  return gs_err_from_errno(err);
}

/* Starts argv as child c with its output on two new pipes; says why not. */
int gs__run_spawn(gs_run_t *r, gs_run_child_t *c, char *const argv[])
{
  int out[2], err[2], rc;
  pid_t pid;

  if (pipe2(out, O_CLOEXEC) != 0)
    return spawn_error(c, argv, "pipe");
  if (pipe2(err, O_CLOEXEC) != 0) {
    rc = spawn_error(c, argv, "pipe");
    goto out_close_out;
  }
  pid = fork();
  if (pid < 0) {
    rc = spawn_error(c, argv, "fork");
    goto out_close_err;
  }
  if (pid == 0)
    child_exec(r, c, argv, out[1], err[1]);
  setpgid(pid, pid); /* the child does it too; whichever runs first wins */
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  c->pid = pid;
  c->running = true;
  c->started = gs_now_ms();
  gs__run_stream_open(&c->out, out[0], 1);
  gs__run_stream_open(&c->err, err[0], 2);
  return 0;

out_close_err:
  close(err[0]);
  close(err[1]);
out_close_out:
  close(out[0]);
  close(out[1]);
  return rc;
}

/* The numbers in a rank's argv; the caller's, as long as the argv. */
struct rank_numbers {
  char world[48], rank[24];
};

/* The argv local rank c runs (allocated; the caller frees it): the agent
 * with the job flags before the pass-through ones, or the command alone. */
static char **rank_argv(gs_run_t *r, const gs_run_child_t *c, struct rank_numbers *num)
{
  char **argv = calloc((size_t)r->cfg.npass + 12, sizeof(*argv));
  int k = 0;

  if (!argv)
    return NULL;
  world_text(&r->cfg, num->world, sizeof(num->world));
  snprintf(num->rank, sizeof(num->rank), "%d", c->rank);
  if (!r->cfg.command) {
    argv[k++] = r->cfg.agent_bin;
    argv[k++] = "--coordinator";
    argv[k++] = r->rank_rpc[0] ? r->rank_rpc : r->cfg.rpc;
    argv[k++] = "--job";
    argv[k++] = (char *)r->cfg.job;
    argv[k++] = "--world-size";
    argv[k++] = num->world;
    argv[k++] = "--local-rank";
    argv[k++] = num->rank;
    if (r->cfg.node) {
      argv[k++] = "--node";
      argv[k++] = (char *)r->cfg.node;
    }
  }
  memcpy(argv + k, r->cfg.pass, (size_t)r->cfg.npass * sizeof(*argv));
  return argv;
}

/* Starts local rank c (its first start or a restart: the same argv and
 * environment every time) and counts it running; says why not. */
int gs__run_spawn_rank(gs_run_t *r, gs_run_child_t *c)
{
  struct rank_numbers num;
  char **argv = rank_argv(r, c, &num);
  int rc;

  if (!argv) {
    gs__run_say("out of memory starting %s", c->name);
    return GS_ENOMEM;
  }
  rc = gs__run_spawn(r, c, argv);
  free(argv);
  if (rc == 0)
    r->agents_running++;
  return rc;
}

/* Sends sig to child c's whole process group (its own children too). */
void gs__run_signal_child(gs_run_child_t *c, int sig)
{
  if (!c->running)
    return;
  if (kill(-c->pid, sig) != 0 && errno == ESRCH)
    kill(c->pid, sig);
}
