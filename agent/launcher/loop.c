/* The event loop: one poll over a signalfd and every child's pipes. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "error.h"
#include "launcher.h"

/* Reads every pending signal from the signalfd, then reaps (SIGCHLD may be
 * merged, so it always looks). */
static void handle_signals(gs_run_t *r)
{
  struct signalfd_siginfo si;
  ssize_t n;

  for (;;) {
    n = read(r->sigfd, &si, sizeof(si));
    if (n < 0 && errno == EINTR)
      continue;
    if (n != (ssize_t)sizeof(si))
      break;
    if (si.ssi_signo != SIGCHLD)
      gs__run_on_stop_signal(r, (int)si.ssi_signo);
  }
  gs__run_reap(r);
}

/* Appends c's open pipes to the poll set. */
static void add_child_fds(gs_run_child_t *c, struct pollfd *p, gs_run_stream_t **which, int *n)
{
  gs_run_stream_t *s[2] = {&c->out, &c->err};

  for (int k = 0; k < 2; k++) {
    if (s[k]->fd < 0)
      continue;
    p[*n] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
    which[*n] = s[k];
    (*n)++;
  }
}

/* The event loop: one poll over the signalfd and every child's pipes, until
 * every child is reaped and its output forwarded. */
int gs__run_loop(gs_run_t *r)
{
  size_t cap = 2 * ((size_t)r->cfg.nproc + 2) + 1;
  struct pollfd *p = calloc(cap, sizeof(*p));
  gs_run_stream_t **which = calloc(cap, sizeof(*which));
  int n, rc = 0;

  if (!p || !which) {
    rc = GS_ENOMEM;
    goto out_free;
  }
  for (;;) {
    n = 0;
    p[n++] = (struct pollfd){.fd = r->sigfd, .events = POLLIN};
    add_child_fds(&r->coord, p, which, &n);
    add_child_fds(&r->relay, p, which, &n);
    for (long i = 0; i < r->cfg.nproc; i++)
      add_child_fds(&r->agents[i], p, which, &n);
    /* Done once every child is reaped and its pipes are closed. */
    if (r->phase == GS_RUN_DONE && n == 1)
      break;
    if (poll(p, (nfds_t)n, gs__run_next_timeout(r)) < 0 && errno != EINTR) {
      rc = gs_err_from_errno(errno);
      gs__run_say("poll failed: %s", strerror(errno));
      break;
    }
    if (p[0].revents)
      handle_signals(r);
    for (int k = 1; k < n; k++) {
      /* A stream closed by handle_signals no longer has this fd. */
      if (p[k].revents && which[k]->fd == p[k].fd)
        gs__run_stream_pump(which[k]);
    }
    gs__run_check_deadlines(r);
    gs__run_start_due_restarts(r);
  }
out_free:
  free(which);
  free(p);
  return rc;
}

/* Blocks the signals the loop reads from a signalfd (children restore the
 * original mask) and ignores SIGPIPE from a closed stdout. */
int gs__run_setup_signals(gs_run_t *r)
{
  sigset_t set;

  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &set, &r->orig_mask) != 0)
    return gs_err_from_errno(errno);
  signal(SIGPIPE, SIG_IGN);
  r->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (r->sigfd < 0)
    return gs_err_from_errno(errno);
  return 0;
}
