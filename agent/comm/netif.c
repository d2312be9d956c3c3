/* This host's network interfaces (netif.h). */
#include "netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "why.h"

bool gs_netif_is_wildcard(const char *addr)
{
  return !strcmp(addr, "0.0.0.0") || !strcmp(addr, "::") || !strcmp(addr, "[::]");
}

/* Whether interface address `a` is the address `want` (family `family`,
 * 4 or 16 bytes of `want`). */
static bool same_address(const struct sockaddr *a, int family, const void *want)
{
  if (!a || a->sa_family != family)
    return false;
  if (family == AF_INET)
    return memcmp(&((const struct sockaddr_in *)a)->sin_addr, want, 4) == 0;
  return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, want, 16) == 0;
}

bool gs_netif_of_address(const char *host, char *name, size_t len)
{
  unsigned char addr[16], any[16] = {0};
  int family = strchr(host, ':') ? AF_INET6 : AF_INET;
  struct ifaddrs *list, *i;
  bool found = false;

  if (inet_pton(family, host, addr) != 1 || memcmp(addr, any, family == AF_INET ? 4 : 16) == 0 ||
      getifaddrs(&list) != 0)
    return false;
  for (i = list; i && !found; i = i->ifa_next)
    if (same_address(i->ifa_addr, family, addr))
      found = snprintf(name, len, "%s", i->ifa_name) < (int)len;
  freeifaddrs(list);
  return found;
}

/* Whether `a` is an address a peer can use: IPv4, or IPv6 that is not
 * link-local (those need a scope the peer cannot know). */
static bool usable(const struct sockaddr *a, int family)
{
  if (!a || a->sa_family != family)
    return false;
  return family == AF_INET || !IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* "eth0, lo" (the interfaces that have an address), for messages. */
static void list_interfaces(const struct ifaddrs *list, char *out, size_t len)
{
  size_t n = 0;

  out[0] = '\0';
  for (const struct ifaddrs *i = list; i && n < len; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
      continue;
    if (n && strstr(out, i->ifa_name)) /* one line per name, roughly; a list for humans */
      continue;
    n += (size_t)snprintf(out + n, len - n, "%s%s", n ? ", " : "", i->ifa_name);
  }
}

int gs_netif_address(const char *iface, char *addr, size_t len, char *why, size_t why_len)
{
  static const int families[] = {AF_INET, AF_INET6};
  struct ifaddrs *list;
  char names[256];

  if (getifaddrs(&list) != 0)
    return gs_why(GS_EIO, why, why_len, "cannot list this host's interfaces");
  for (size_t f = 0; f < 2; f++) {
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
      socklen_t sl =
          families[f] == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);

      if (strcmp(i->ifa_name, iface) || !usable(i->ifa_addr, families[f]) ||
          getnameinfo(i->ifa_addr, sl, addr, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
        continue;
      freeifaddrs(list);
      return 0;
    }
  }
  list_interfaces(list, names, sizeof(names));
  freeifaddrs(list);
  return gs_why(GS_ENOTFOUND, why, why_len,
                "interface '%s' has no usable address here (interfaces with one: %s)", iface,
                names[0] ? names : "none");
}
