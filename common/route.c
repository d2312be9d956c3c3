/* The source address of this host's route to another (see route.h). */
#include "route.h"

#include <netdb.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"

int gs_route_source(const char *host, char *addr, size_t len)
{
  struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  int fd = -1, err = GS_ENOTFOUND;

  if (getaddrinfo(host, "9", &hints, &ai) || !ai)
    return GS_ENOTFOUND;
  /* A connected UDP socket picks the source address of the route and
   * sends nothing. */
  fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
      getnameinfo((struct sockaddr *)&ss, sl, addr, (socklen_t)len, NULL, 0, NI_NUMERICHOST) == 0)
    err = 0;
  if (fd >= 0)
    close(fd);
  freeaddrinfo(ai);
  return err;
}
