/* What the children say and do: their lines (the coordinator's address
 * starts the agents, or the start does when joining one), and their
 * exits, reaped in order. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "clock.h"
#include "launcher.h"
#include "relay.h"

/* Starts this node's agents (or commands) once the coordinator's RPC
 * address is in cfg.rpc. */
void gs__run_start_agents(gs_run_t *r)
{
  r->phase = GS_RUN_RUNNING;
  gs__run_say_devices(r);
  for (long i = 0; i < r->cfg.nproc; i++) {
    if (gs__run_spawn_rank(r, &r->agents[i]) != 0) {
      gs__run_fail(r, 1);
      gs__run_begin_stop(r);
      return;
    }
  }
}

/* Recognises the coordinator's "listening" line, announces the addresses
 * and starts the agents; false for any other line. */
static bool coordinator_ready(gs_run_t *r, const char *data, size_t len)
{
  char line[640], rpc[300], http[300], host[300], shown[310];
  const char *colon;

  if (len >= sizeof(line))
    return false;
  memcpy(line, data, len);
  line[len] = '\0';
  if (sscanf(line, "gradsync-coordinator listening rpc=%299s http=%299s", rpc, http) != 2)
    return false;
  colon = strrchr(http, ':');
  if (!colon)
    return false;
  snprintf(host, sizeof(host), "%.*s", (int)(colon - http), http);
  /* A wildcard address is reachable on loopback; IPv6 needs brackets. */
  if (!strcmp(host, "0.0.0.0") || host[0] == '\0')
    snprintf(shown, sizeof(shown), "127.0.0.1");
  else if (!strcmp(host, "::"))
    snprintf(shown, sizeof(shown), "[::1]");
  else if (strchr(host, ':') && host[0] != '[')
    snprintf(shown, sizeof(shown), "[%s]", host);
  else
    snprintf(shown, sizeof(shown), "%s", host);
  gs__run_say("coordinator rpc=%s, status at http://%s%s/status", rpc, shown, colon);
  r->ready_deadline = 0;
  snprintf(r->cfg.rpc, sizeof(r->cfg.rpc), "%s", rpc);
  if (!r->cfg.node_agent)
    gs__run_start_agents(r);
  else if (gs__run_start_node_agent(r)) {
    gs__run_fail(r, 1);
    gs__run_begin_stop(r);
  }
  return true;
}

/* A stream's line callback: one complete line (or a piece of an overlong
 * one) from a child, forwarded with its prefix in one write. The
 * coordinator's first "listening" line starts the agents instead. */
void gs__run_on_line(gs_run_stream_t *s, const char *data, size_t len)
{
  gs_run_child_t *c = s->data;
  gs_run_t *r = c->run;
  char line[sizeof(c->prefix) + GS_RUN_LINE_MAX + 1];

  if (c == &r->coord && s == &c->out && r->phase == GS_RUN_STARTING &&
      coordinator_ready(r, data, len))
    return;
  if (c == &r->relay && s == &c->out && r->phase == GS_RUN_STARTING &&
      gs__run_node_agent_ready(r, data, len)) {
    gs__run_start_agents(r);
    return;
  }
  gs__run_write_all(s->out_fd, line, gs_run_prefix_line(line, sizeof(line), c->prefix, data, len));
}

/* After c was reaped: forwards what its pipes already hold, so that it
 * comes before the exit message, and gives them GS_RUN_DRAIN_MS to reach EOF
 * (gs__run_check_deadlines closes them then: a process that escaped the child's
 * group may hold them open). */
static void drain_child(gs_run_child_t *c)
{
  for (int k = 0; k < 64 && c->out.fd >= 0 && gs__run_stream_pump(&c->out); k++)
    ;
  for (int k = 0; k < 64 && c->err.fd >= 0 && gs__run_stream_pump(&c->err); k++)
    ;
  c->drain_deadline = gs_now_ms() + GS_RUN_DRAIN_MS;
}

/* The coordinator or the node agent was reaped: a failure unless we were
 * stopping it. When the node agent goes, this node's ranks have lost their
 * way to the coordinator, which has lost them (an elastic job's other
 * nodes go on without them): it is started again for them to rejoin
 * through (--node-agent-restarts), else they stop, as they do without a
 * coordinator. */
static void on_service_exit(gs_run_t *r, const gs_run_child_t *c, int status)
{
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  char how[80];

  gs__run_describe_status(status, how, sizeof(how));
  if (r->phase == GS_RUN_STARTING) {
    gs__run_say("%s %s before it was ready (its output is above)", c->name, how);
    gs__run_fail(r, 1);
  } else if (c == &r->relay && r->phase == GS_RUN_RUNNING && r->agents_running > 0) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == GS_RELAY_EXIT_FATAL)
      gs__run_say("%s %s: it cannot speak to the coordinator (its reason is above), nor would "
                  "a restart",
                  c->name, how);
    else if (gs__run_restart_node_agent(r, how))
      return;
    gs__run_say("stopping the ranks");
    gs__run_fail(r, 1);
  } else if (r->phase == GS_RUN_RUNNING || r->phase == GS_RUN_STOP_AGENTS) {
    gs__run_say("%s %s while ranks were running", c->name, how);
    if (r->phase == GS_RUN_RUNNING && r->agents_running > 0)
      gs__run_say("stopping the ranks");
    gs__run_fail(r, 1);
  } else if (!ok) {
    gs__run_say("%s %s", c->name, how);
  }
  gs__run_begin_stop(r);
}

/* Rank c was reaped: one that finished is done; one that failed is
 * restarted while its slot has restarts left (--max-restarts), else it
 * stops the others and sets the exit status. */
static void on_agent_exit(gs_run_t *r, gs_run_child_t *c, int status)
{
  char how[80];

  r->agents_running--;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    r->finished++;
    /* The job is done: a rank started now would open a new rendezvous. */
    if (r->cfg.min_ranks)
      gs__run_drop_restarts(r, "the elastic job finished");
    gs__run_advance(r);
    return;
  }
  gs__run_describe_status(status, how, sizeof(how));
  if (r->phase != GS_RUN_RUNNING) {
    gs__run_say("%s %s", c->name, how);
    gs__run_advance(r);
    return;
  }
  if (!(r->cfg.min_ranks && r->finished) && gs__run_restart_later(r, c, how))
    return;
  /* An elastic job goes on without it (the coordinator and the ranks
   * decide whether enough remain; the last rank's end decides the run's). */
  if (r->cfg.min_ranks && (r->agents_running + r->agents_pending > 0 || r->finished > 0)) {
    r->lost++;
    gs__run_say("the elastic job goes on without %s", c->name);
    gs__run_advance(r);
    return;
  }
  gs__run_fail(r, WIFEXITED(status) && WEXITSTATUS(status) <= 125 ? WEXITSTATUS(status) : 1);
  if (r->agents_running > 0)
    gs__run_say("stopping the other ranks");
  gs__run_begin_stop(r);
}

static gs_run_child_t *find_child(gs_run_t *r, pid_t pid)
{
  if (r->coord.running && r->coord.pid == pid)
    return &r->coord;
  if (r->relay.running && r->relay.pid == pid)
    return &r->relay;
  for (long i = 0; i < r->cfg.nproc; i++)
    if (r->agents[i].running && r->agents[i].pid == pid)
      return &r->agents[i];
  return NULL;
}

/* Reaps every exited child. While it is still a zombie its process group id
 * cannot be reused, so what it left running in its group is killed first. */
void gs__run_reap(gs_run_t *r)
{
  gs_run_child_t *c;
  siginfo_t si;
  int status;

  for (;;) {
    memset(&si, 0, sizeof(si));
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    if (si.si_pid == 0)
      return;
    c = find_child(r, si.si_pid);
    if (c)
      kill(-c->pid, SIGKILL);
    while (waitpid(si.si_pid, &status, 0) < 0 && errno == EINTR)
      ;
    if (!c)
      continue;
    c->running = false;
    drain_child(c);
    if (c == &r->coord || c == &r->relay)
      on_service_exit(r, c, status);
    else
      on_agent_exit(r, c, status);
  }
}

/* Last resort when the loop cannot run: SIGKILL every child and reap it. */
void gs__run_kill_and_reap_all(gs_run_t *r)
{
  gs__run_kill_everything(r);
  while (r->coord.running || r->relay.running || r->agents_running > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    gs_run_child_t *c;

    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    c = find_child(r, pid);
    if (!c)
      continue;
    c->running = false;
    if (c != &r->coord && c != &r->relay)
      r->agents_running--;
    gs__run_stream_close(&c->out);
    gs__run_stream_close(&c->err);
  }
}
