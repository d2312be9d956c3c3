/* The launcher's one line about the ranks' device when it can know it for
 * every rank: the CPU, because no GPU is visible (the normal case on a
 * machine without one, so the ranks themselves say it only at INFO) or
 * because this build has no CUDA. With GPUs visible the ranks choose, and
 * each logs its choice. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

#ifdef GS_HAVE_CUDA
#define GS_RUN_CUDA_BUILT true
#else
#define GS_RUN_CUDA_BUILT false
#endif

/* The CUDA driver API, looked up at run time: gradsync-run links no CUDA. */
typedef int (*cu_init_fn)(unsigned int flags);
typedef int (*cu_count_fn)(int *count);

#ifdef GS_HAVE_CUDA
/* The GPUs a CUDA program sees in this environment (CUDA_VISIBLE_DEVICES
 * included), as the ranks' cudaGetDeviceCount will: 0 without a driver or
 * when it fails. Runs in a child process (see gs__run_count_gpus). */
static int count_here(void)
{
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  void *lib;
  cu_init_fn cu_init;
  cu_count_fn cu_count;
  int n = 0;

  if (cvd && (!cvd[0] || cvd[0] == '-'))
    return 0; /* every GPU hidden: no need to ask the driver */
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return 0;
  cu_init = (cu_init_fn)dlsym(lib, "cuInit");
  cu_count = (cu_count_fn)dlsym(lib, "cuDeviceGetCount");
  if (!cu_init || !cu_count || cu_init(0) != 0 || cu_count(&n) != 0)
    n = 0;
  return n;
}

/* In a child, so that the launcher, which outlives every rank, never maps
 * the driver; -1 when it cannot tell. */
int gs__run_count_gpus(void)
{
  int fd[2], n = -1;
  ssize_t got;
  pid_t pid;

  if (pipe2(fd, O_CLOEXEC) != 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    n = count_here();
    _exit(write(fd[1], &n, sizeof(n)) == sizeof(n) ? 0 : 1);
  }
  close(fd[1]);
  if (pid > 0) {
    do
      got = read(fd[0], &n, sizeof(n));
    while (got < 0 && errno == EINTR);
    if (got != sizeof(n))
      n = -1;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
  }
  close(fd[0]);
  return n;
}
#else
/* Without CUDA in the build no rank can use a GPU: nothing to count. */
int gs__run_count_gpus(void)
{
  return -1;
}
#endif

/* The device an agent was told with --device, or "auto": the last of
 * "--device X" and "--device=X" among the agent flags. */
static const char *agent_device(const gs_run_config_t *cfg)
{
  const char *device = "auto";

  for (int i = 0; !cfg->command && i < cfg->npass; i++) {
    if (!strcmp(cfg->pass[i], "--device") && i + 1 < cfg->npass)
      device = cfg->pass[++i];
    else if (!strncmp(cfg->pass[i], "--device=", 9))
      device = cfg->pass[i] + 9;
  }
  return device;
}

/* Why every rank is on the CPU, into buf; false when the launcher cannot
 * know (GPUs visible, a device the agents were told, no count). */
static bool cpu_for_all(const gs_run_config_t *cfg, int gpus, char *buf, size_t len)
{
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");

  if (strcmp(agent_device(cfg), "auto") != 0)
    return false;
  if (!GS_RUN_CUDA_BUILT) {
    snprintf(buf, len, "this build of gradsync has no CUDA");
    return true;
  }
  if (gpus != 0)
    return false;
  if (cvd)
    snprintf(buf, len, "no GPU visible with CUDA_VISIBLE_DEVICES='%s'", cvd);
  else
    snprintf(buf, len, "no GPU visible");
  return true;
}

void gs__run_say_devices(const gs_run_t *r)
{
  const gs_run_config_t *cfg = &r->cfg;
  char why[320], ranks[64];
  const char *local = cfg->join ? "local " : "";

  if (!cpu_for_all(cfg, r->gpus, why, sizeof(why)))
    return;
  if (cfg->nproc == 1)
    snprintf(ranks, sizeof(ranks), "%srank 0 uses", local);
  else
    snprintf(ranks, sizeof(ranks), "%sranks 0-%ld use", local, cfg->nproc - 1);
  gs__run_say("%s the CPU (%s)", ranks, why);
}
