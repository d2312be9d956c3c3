/* The node agent (--node-agent): gradsync-relay, started for this node's
 * ranks once the coordinator's address is known, on a Unix socket in a
 * private folder; the ranks get "unix:SOCKET" as their coordinator, and
 * (unless the environment names one) the address this host reaches the
 * coordinator from as the one their peers dial. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "launcher.h"
#include "parse.h"
#include "route.h"

#define SOCKET_NAME "node.sock"

/* The coordinator's host, as cfg.rpc spells it ("host:port", "[v6]:port"). */
static void coordinator_host(const gs_run_t *r, char *host, size_t len)
{
  uint16_t port;

  if (gs_parse_addr(r->cfg.rpc, host, len, &port))
    snprintf(host, len, "127.0.0.1");
}

/* Starts gradsync-relay on the socket in r->relay_dir, with the agents'
 * TLS flags (the environment's it reads itself); 0 or an error it said. */
static int spawn_node_agent(gs_run_t *r)
{
  char ranks[16], path[PATH_MAX + 16];
  char *argv[8 + sizeof(r->cfg.relay_tls) / sizeof(r->cfg.relay_tls[0])] = {
      r->cfg.relay_bin, "--coordinator", r->cfg.rpc, "--socket", path, "--ranks", ranks};

  snprintf(path, sizeof(path), "%s/" SOCKET_NAME, r->relay_dir);
  snprintf(ranks, sizeof(ranks), "%ld", r->cfg.nproc);
  memcpy(argv + 7, r->cfg.relay_tls, (size_t)r->cfg.nrelay_tls * sizeof(argv[0]));
  return gs__run_spawn(r, &r->relay, argv);
}

int gs__run_start_node_agent(gs_run_t *r)
{
  char path[PATH_MAX + 16], host[256];
  const char *tmp = getenv("TMPDIR");

  snprintf(r->relay_dir, sizeof(r->relay_dir), "%s/gradsync-node-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(r->relay_dir)) {
    gs__run_say("cannot make a folder for the node agent's socket (%s): %s", r->relay_dir,
                strerror(errno));
    r->relay_dir[0] = '\0';
    return 1;
  }
  snprintf(path, sizeof(path), "%s/" SOCKET_NAME, r->relay_dir);
  if (strlen(path) >= 108) {
    gs__run_say("the node agent's socket path %s is too long for a Unix socket; set TMPDIR to a "
                "shorter folder",
                path);
    return 1;
  }
  coordinator_host(r, host, sizeof(host));
  if (gs_route_source(host, r->rank_bind, sizeof(r->rank_bind)))
    r->rank_bind[0] = '\0';
  r->ready_deadline = 0; /* the node agent's own, from now */
  if (spawn_node_agent(r))
    return 1;
  r->ready_deadline = gs_now_ms() + GS_RUN_READY_MS;
  return 0;
}

bool gs__run_node_agent_ready(gs_run_t *r, const char *line, size_t len)
{
  static const char ready[] = "gradsync-relay listening socket=";
  const char *p = line + sizeof(ready) - 1, *end;

  if (len < sizeof(ready) || strncmp(line, ready, sizeof(ready) - 1))
    return false;
  end = memchr(p, ' ', len - (size_t)(p - line));
  if (!end)
    return false;
  snprintf(r->rank_rpc, sizeof(r->rank_rpc), GS_UNIX_PREFIX "%.*s", (int)(end - p), p);
  r->ready_deadline = 0;
  gs__run_say("node agent: this node's %ld rank%s the coordinator through %s", r->cfg.nproc,
              r->cfg.nproc == 1 ? " reaches" : "s reach", r->rank_rpc);
  return true;
}

/* The coordinator declared the node's ranks lost when the node agent's
 * connection closed (a fixed job fails; an elastic one goes on without
 * them): started again at once, the node agent lets the live ranks redial
 * it within their --coordinator-grace and rejoin the job through it, as
 * ranks a stop (SIGSTOP) evicted rejoin. */
bool gs__run_restart_node_agent(gs_run_t *r, const char *how)
{
  gs_run_child_t *c = &r->relay;

  if (c->restarts >= r->cfg.node_agent_restarts) {
    gs__run_say("%s %s while ranks were running: the coordinator lost this node's ranks%s", c->name,
                how, r->cfg.node_agent_restarts ? "; no restarts left" : "");
    return false;
  }
  c->restarts++;
  gs__run_say("%s %s while ranks were running: the coordinator lost this node's ranks; "
              "starting it again (restart %ld of %ld), for them to rejoin through it",
              c->name, how, c->restarts, r->cfg.node_agent_restarts);
  gs__run_stream_close(&c->out);
  gs__run_stream_close(&c->err);
  if (spawn_node_agent(r)) {
    gs__run_say("cannot start %s again", c->name);
    return false;
  }
  return true;
}

void gs__run_node_agent_cleanup(gs_run_t *r)
{
  char path[PATH_MAX + 16];

  if (!r->relay_dir[0])
    return;
  snprintf(path, sizeof(path), "%s/" SOCKET_NAME, r->relay_dir);
  unlink(path);
  rmdir(r->relay_dir);
}
