/* progress_cost: what saying where a rank is costs, per operation
 * (docs/design.md, "Seeing what holds a job up"). A training run with the
 * instrumentation on and off differs by less than this machine's noise
 * between runs (±5-10 %), so bench/hang_inject.py also counts the
 * operations a real step makes and multiplies them by these times:
 *
 *   phase   gs_engine_phase() to a new phase (the training thread, a few
 *           times a step), less the same call with --no-progress
 *   gauge   a send wait's begin and end marks with their two clock reads
 *           (the comm thread, once per sleep with bytes to send)
 *   ioctl   ioctl(SIOCOUTQNSD) on a connected TCP socket (the comm thread,
 *           once per sleep: whether bytes wait to leave)
 *
 * One line per operation: "NAME NS ns". */
#include <arpa/inet.h>
#include <gradsync/engine.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "comm.h"

#define ROUNDS 5 /* the fastest round of these counts: the least disturbed */

static gs_engine_t *engine(bool no_progress)
{
  gs_engine_config_t cfg;

  gs_engine_config_defaults(&cfg);
  cfg.no_progress = no_progress;
  return gs_engine_new(&cfg);
}

/* ns per gs_engine_phase() that changes the phase. */
static double phase_ns(gs_engine_t *e, uint64_t n)
{
  uint64_t t0 = gs_now_ns();

  for (uint64_t i = 0; i < n; i++)
    gs_engine_phase(e, (i & 1) ? GS_PHASE_COMPUTE : GS_PHASE_DATA);
  return (double)(gs_now_ns() - t0) / (double)n;
}

static double gauge_ns(gs_comm_gauge_t *g, uint64_t n)
{
  uint64_t t0 = gs_now_ns();

  for (uint64_t i = 0; i < n; i++) {
    gs_comm_gauge_wait_begin(g, gs_now_ns());
    gs_comm_gauge_wait_end(g, gs_now_ns());
  }
  return (double)(gs_now_ns() - t0) / (double)n;
}

static double ioctl_ns(int fd, uint64_t n)
{
  uint64_t t0 = gs_now_ns();
  int unsent = 0;

  for (uint64_t i = 0; i < n; i++)
    if (ioctl(fd, SIOCOUTQNSD, &unsent) != 0)
      return -1;
  return (double)(gs_now_ns() - t0) / (double)n;
}

/* A TCP connection over loopback: its client end, or -1. */
static int loopback_connection(int *listener, int *server)
{
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  int c;

  *listener = socket(AF_INET, SOCK_STREAM, 0);
  if (*listener < 0 || bind(*listener, (struct sockaddr *)&a, sizeof(a)) || listen(*listener, 1) ||
      getsockname(*listener, (struct sockaddr *)&a, &len))
    return -1;
  c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof(a)))
    return -1;
  *server = accept(*listener, NULL, NULL);
  return *server < 0 ? -1 : c;
}

static double fastest(double a, double b)
{
  return a < b ? a : b;
}

int main(int argc, char **argv)
{
  uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
  gs_engine_t *on = engine(false), *off = engine(true);
  gs_comm_gauge_t gauge;
  double phase = 1e9, gauge_t = 1e9, io = 1e9;
  int listener = -1, server = -1, fd;

  if (argc > 2 || n == 0 || (argc > 1 && !strcmp(argv[1], "--help"))) {
    fprintf(stderr, "usage: progress_cost [ITERATIONS (default 2000000)]\n");
    return argc > 1 && !strcmp(argv[1], "--help") ? 0 : 2;
  }
  memset(&gauge, 0, sizeof(gauge));
  fd = loopback_connection(&listener, &server);
  if (!on || !off || fd < 0) {
    fprintf(stderr, "progress_cost: cannot make an engine or a loopback connection\n");
    return 1;
  }
  for (int r = 0; r < ROUNDS; r++) {
    phase = fastest(phase, phase_ns(on, n) - phase_ns(off, n));
    gauge_t = fastest(gauge_t, gauge_ns(&gauge, n));
    io = fastest(io, ioctl_ns(fd, n / 10));
  }
  printf("phase %.1f ns\ngauge %.1f ns\nioctl %.1f ns\n", phase, gauge_t, io);
  close(fd);
  close(server);
  close(listener);
  gs_engine_free(on);
  gs_engine_free(off);
  return io < 0 ? 1 : 0;
}
