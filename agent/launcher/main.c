/* gradsync-run: the launcher (like `torchrun --standalone`, or torchrun's
 * multi-node form with --coordinator). It starts a coordinator on a free
 * port and N agents pointed at it (or, joining a coordinator that runs
 * elsewhere, only this node's agents), forwards their output
 * line by line with a "[rank i] " prefix, forwards stop signals, and stops
 * every process when one rank fails. Children never outlive it: each runs in
 * its own process group (so a terminal's Ctrl-C reaches only the launcher,
 * which stops the agents before the coordinator), gets PR_SET_PDEATHSIG and
 * is reaped; as a subreaper it also kills what the children leave behind.
 * Launcher messages ("gradsync-run: ...") go to stderr. See launcher.h for
 * the files and their layers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "clock.h"
#include "error.h"
#include "launcher.h"

/* A child with no process yet; its streams report lines to gs__run_on_line. */
static void child_init(gs_run_t *r, gs_run_child_t *c, int rank)
{
  c->run = r;
  c->rank = rank;
  if (rank == GS_RUN_COORD_RANK)
    snprintf(c->name, sizeof(c->name), "coordinator");
  else if (rank == GS_RUN_NODE_AGENT_RANK)
    snprintf(c->name, sizeof(c->name), "node agent");
  else if (r->cfg.join) /* the global rank is the coordinator's to give */
    snprintf(c->name, sizeof(c->name), "local rank %d", rank);
  else
    snprintf(c->name, sizeof(c->name), "rank %d", rank);
  snprintf(c->prefix, sizeof(c->prefix), "[%s] ", c->name);
  gs__run_stream_init(&c->out, gs__run_on_line, c);
  gs__run_stream_init(&c->err, gs__run_on_line, c);
}

/* Joining a coordinator that runs elsewhere: says so and starts this
 * node's ranks at once. */
static int join(gs_run_t *r)
{
  const gs_run_config_t *cfg = &r->cfg;

  if (cfg->command)
    gs__run_say("node %ld of %ld: %ld cop%s of %s joining %s as job %s", cfg->node_rank,
                cfg->nnodes, cfg->nproc, cfg->nproc == 1 ? "y" : "ies", cfg->pass[0], cfg->rpc,
                cfg->job);
  else
    gs__run_say("node %ld of %ld: %ld agent%s joining %s as job %s", cfg->node_rank, cfg->nnodes,
                cfg->nproc, cfg->nproc == 1 ? "" : "s", cfg->rpc, cfg->job);
  if (cfg->node_agent) /* the ranks start once it listens */
    return gs__run_start_node_agent(r);
  gs__run_start_agents(r);
  return 0;
}

/* Sets up and starts the coordinator (or, joining one, the ranks); on
 * failure nothing is left running. */
static int start(gs_run_t *r)
{
  char world[24], http[300];
  /* The job's size is known: the coordinator need not size itself (its
   * open-file limit) for the default maximum. Then the coordinator flags
   * gradsync-run was given (coord_args.c), which never set these. */
  char *argv[7 + GS_RUN_MAX_COORD_ARGS + 1] = {
      r->cfg.coord_bin, "--listen", "127.0.0.1:0", "--http", http, "--max-world-size", world};
  int rc;

  for (int i = 0; i < r->cfg.ncoord; i++)
    argv[7 + i] = r->cfg.coord_args[i];
  snprintf(world, sizeof(world), "%ld", r->cfg.nproc);
  /* An IPv6 host needs its brackets back. */
  snprintf(http, sizeof(http), strchr(r->cfg.http_host, ':') ? "[%s]:%u" : "%s:%u",
           r->cfg.http_host, r->cfg.http_port);
  r->agents = calloc((size_t)r->cfg.nproc, sizeof(*r->agents));
  if (!r->agents) {
    gs__run_say("out of memory for %ld ranks", r->cfg.nproc);
    return GS_ENOMEM;
  }
  for (long i = 0; i < r->cfg.nproc; i++)
    child_init(r, &r->agents[i], (int)i);
  r->devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (r->devnull < 0) {
    gs__run_say("cannot open /dev/null: %s", strerror(errno));
    return GS_EIO;
  }
  rc = gs__run_raise_nofile(r);
  if (rc)
    return rc;
  r->gpus = gs__run_count_gpus(); /* before any child or signal handling */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    gs__run_say("cannot become a subreaper (%s): processes the ranks leave behind may survive",
                strerror(errno));
  rc = gs__run_setup_signals(r);
  if (rc) {
    gs__run_say("cannot set up signal handling: %s", gs_strerror(rc));
    return rc;
  }
  if (r->cfg.join)
    return join(r);
  rc = gs__run_spawn(r, &r->coord, argv);
  if (rc)
    return rc;
  r->ready_deadline = gs_now_ms() + GS_RUN_READY_MS;
  return 0;
}

int main(int argc, char **argv)
{
  char restarts[48], ranks[64];
  gs_run_t r;
  int rc;

  memset(&r, 0, sizeof(r));
  r.sigfd = r.devnull = -1;
  child_init(&r, &r.coord, GS_RUN_COORD_RANK);
  child_init(&r, &r.relay, GS_RUN_NODE_AGENT_RANK);
  r.self = getpid();
  if (gs__run_open_std_fds() != 0)
    return 1;
  rc = gs__run_parse_args(argc, argv, &r.cfg);
  if (rc)
    goto out_free_args;
  if (gs__run_resolve_bins(&r.cfg)) {
    rc = 1;
    goto out_free_args;
  }
  if (start(&r) != 0) {
    rc = 1;
    goto out_close;
  }
  if (gs__run_loop(&r) != 0) {
    gs__run_kill_and_reap_all(&r);
    gs__run_fail(&r, 1);
  }
  gs__run_reap_adopted(r.self);
  rc = r.exit_code;
  snprintf(restarts, sizeof(restarts), " after %ld restart%s", r.restarts,
           r.restarts == 1 ? "" : "s");
  if (r.restarts == 0)
    restarts[0] = '\0';
  /* An elastic job that lost ranks on the way finished with the others. */
  if (r.lost)
    snprintf(ranks, sizeof(ranks), "%ld of %ld", r.cfg.nproc - r.lost, r.cfg.nproc);
  else
    snprintf(ranks, sizeof(ranks), "%s %ld", r.cfg.nproc == 1 && r.cfg.join ? "the" : "all",
             r.cfg.nproc);
  if (rc == 0 && r.cfg.join)
    gs__run_say("%s local rank%s of node %ld finished%s", ranks, r.cfg.nproc == 1 ? "" : "s",
                r.cfg.node_rank, restarts);
  else if (rc == 0)
    gs__run_say("%s ranks finished%s", ranks, restarts);
out_close:
  gs__run_node_agent_cleanup(&r);
  if (r.sigfd >= 0)
    close(r.sigfd);
  if (r.devnull >= 0)
    close(r.devnull);
  free(r.agents);
out_free_args:
  free(r.cfg.pass);
  free(r.cfg.coord_args);
  return rc < 0 ? 0 : rc;
}
