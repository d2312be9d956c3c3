/* Which of this host's addresses its route to another host leaves from:
 * the address a rank gives its peers when nothing says otherwise (a host
 * whose peers reach the coordinator the way it does reaches them the same
 * way). Shared by the agent and gradsync-run (for a node agent's ranks). */
#ifndef GS_ROUTE_H
#define GS_ROUTE_H

#include <stddef.h>

/* The numeric source address of the route to `host` into addr; a
 * connected UDP socket finds it and sends nothing. GS_ENOTFOUND when the
 * host does not resolve or has no route. */
int gs_route_source(const char *host, char *addr, size_t len);

#endif
