#include "net.h"

#include <stdio.h>

void gs_tcp_peer_name(const uv_tcp_t *tcp, char *out, size_t len)
{
  struct sockaddr_storage ss;
  char ip[INET6_ADDRSTRLEN] = "?";
  int sslen = sizeof(ss);

  snprintf(out, len, "?");
  if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &sslen))
    return;
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
    snprintf(out, len, "[%s]:%u", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
  } else {
    uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
    snprintf(out, len, "%s:%u", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
  }
}
