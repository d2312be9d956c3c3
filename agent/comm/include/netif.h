/* This host's network interfaces, as the backends and the engine choose
 * the address a rank listens on and the peers dial (docs/design.md,
 * "Choosing the peer address"). */
#ifndef GS_NETIF_H
#define GS_NETIF_H

#include <stdbool.h>
#include <stddef.h>

/* Whether a numeric address means every interface ("0.0.0.0", "::",
 * "[::]"). */
bool gs_netif_is_wildcard(const char *addr);

/* The name of the interface that holds numeric address `host`, into
 * name; false for a host name, a wildcard address or no such interface. */
bool gs_netif_of_address(const char *host, char *name, size_t len);

/* The numeric address of interface `iface` (its first IPv4 address, else
 * its first IPv6 address that is not link-local), into addr. 0, or
 * GS_ENOTFOUND with a reason naming the interfaces this host has. */
int gs_netif_address(const char *iface, char *addr, size_t len, char *why, size_t why_len);

#endif
