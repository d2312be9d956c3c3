#include "net.h"

#include <stdio.h>
#include <string.h>

#define LISTEN_BACKLOG 1024

int gs_err_from_uv(int uverr)
{
  if (uverr == UV_EOF)
    return GS_ECLOSED;
  if (uverr == UV_ETIMEDOUT)
    return GS_ETIMEDOUT;
  /* libuv codes on Unix are negated errno values. */
  return uverr < 0 ? gs_err_from_errno(-uverr) : GS_OK;
}

static uint16_t port_of(const struct sockaddr_storage *ss)
{
  if (ss->ss_family == AF_INET6)
    return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
  return ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

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
    snprintf(out, len, "[%s]:%u", ip, port_of(&ss));
  } else {
    uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
    snprintf(out, len, "%s:%u", ip, port_of(&ss));
  }
}

int gs_tcp_listen(uv_tcp_t *tcp, const char *host, uint16_t port, uv_connection_cb on_connection,
                  const gs_log_t *log, const char *what)
{
  struct sockaddr_storage addr;
  int err;

  if (strchr(host, ':'))
    err = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
  else
    err = uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
  if (err) {
    gs_log(log, GS_LOG_ERROR, NULL, -1, "%s: bad listen address %s: %s", what, host,
           uv_strerror(err));
    return GS_EINVAL;
  }
  err = uv_tcp_bind(tcp, (struct sockaddr *)&addr, 0);
  if (!err)
    err = uv_listen((uv_stream_t *)tcp, LISTEN_BACKLOG, on_connection);
  if (err) {
    gs_log(log, GS_LOG_ERROR, NULL, -1, "%s: cannot listen on %s:%u: %s", what, host, port,
           uv_strerror(err));
    return gs_err_from_uv(err);
  }
  return 0;
}

uint16_t gs_tcp_local_port(const uv_tcp_t *tcp)
{
  struct sockaddr_storage ss;
  int len = sizeof(ss);

  if (uv_tcp_getsockname(tcp, (struct sockaddr *)&ss, &len))
    return 0;
  return port_of(&ss);
}
