/* Where the other ranks reach this one: the listening address and the
 * address they dial, from the engine's comm_* settings (docs/design.md,
 * "Choosing the peer address"). */
#include <stdio.h>
#include <string.h>

#include "engine_internal.h"
#include "netif.h"
#include "parse.h"
#include "route.h"
#include "why.h"

/* The address to use when none is given: comm_iface's, or this host's on
 * its route to the coordinator (a host whose peers reach the coordinator
 * the way it does reaches them the same way). */
static int own_address(const gs_engine_config_t *cfg, char *addr, size_t len, char *why,
                       size_t why_len)
{
  if (cfg->comm_iface[0])
    return gs_netif_address(cfg->comm_iface, addr, len, why, why_len);
  /* Behind a node agent the route to the coordinator is the agent's: this
   * host's loopback unless --comm-iface names the interface. */
  if (!strncmp(cfg->coord.host, GS_UNIX_PREFIX, strlen(GS_UNIX_PREFIX)) ||
      gs_route_source(cfg->coord.host, addr, len))
    snprintf(addr, len, "127.0.0.1"); /* no route: Join will say so */
  return 0;
}

int gs__engine_listen(gs_engine_t *e, char *addr, size_t addr_len)
{
  const gs_engine_config_t *cfg = &e->cfg;
  char own[256] = "";
  gs_comm_endpoint_t ep = {.bind = cfg->comm_bind,
                           .advertise = cfg->comm_advertise,
                           .port_min = cfg->comm_ports.first,
                           .port_max = cfg->comm_ports.last};
  int err = 0;

  if (!cfg->comm_bind[0] || (gs_netif_is_wildcard(cfg->comm_bind) && !cfg->comm_advertise[0]))
    err = own_address(cfg, own, sizeof(own), e->error, sizeof(e->error));
  if (err)
    return err;
  if (!cfg->comm_bind[0])
    ep.bind = own;
  else if (!cfg->comm_advertise[0] && gs_netif_is_wildcard(cfg->comm_bind))
    ep.advertise = own;
  err = gs_comm_listen(e->comm, &ep, addr, addr_len);
  if (err) {
    gs_set_why(e->error, sizeof(e->error), "cannot listen for peers: %s",
               gs_comm_why(e->comm)[0] ? gs_comm_why(e->comm) : gs_strerror(err));
    return err;
  }
  if (addr[0] && ep.bind == own)
    gs_log(cfg->log, GS_LOG_INFO, cfg->coord.job, -1, "peers dial this agent at %s", addr);
  else if (addr[0])
    gs_log(cfg->log, GS_LOG_INFO, cfg->coord.job, -1,
           "peers dial this agent at %s (listening on %s)", addr, ep.bind);
  return 0;
}
