/* As PR_SET_CHILD_SUBREAPER, the launcher adopts what its children leave
 * behind (even outside their process groups); at the end it kills and
 * reaps them, so no process outlives the run. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

/* Sends SIGKILL to every live child of ours that is no gs_run_child_t: with
 * PR_SET_CHILD_SUBREAPER, processes our children left behind (even outside
 * their process groups) become ours. */
static void kill_adopted(pid_t self)
{
  char path[64], stat[512], *paren;
  struct dirent *d;
  int fd;
  ssize_t n;
  long ppid;
  DIR *proc;

  proc = opendir("/proc");
  if (!proc)
    return;
  while ((d = readdir(proc)) != NULL) {
    if (d->d_name[0] < '1' || d->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%.16s/stat", d->d_name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    n = read(fd, stat, sizeof(stat) - 1);
    close(fd);
    if (n <= 0)
      continue;
    stat[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold ')' itself. */
    paren = strrchr(stat, ')');
    if (!paren || sscanf(paren + 1, " %*c %ld", &ppid) != 1 || ppid != (long)self)
      continue;
    kill((pid_t)atol(d->d_name), SIGKILL);
  }
  closedir(proc);
}

/* Kills and reaps whatever our children left behind, for up to two
 * seconds (killing one may hand us its own children). */
void gs__run_reap_adopted(pid_t self)
{
  struct timespec tick = {.tv_sec = 0, .tv_nsec = 10 * 1000000};
  int status;
  pid_t pid;

  for (int round = 0; round < 200; round++) {
    kill_adopted(self);
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
      ;
    if (pid < 0 && errno == ECHILD)
      return;
    nanosleep(&tick, NULL);
  }
}
