/* Which device gradsync-agent trains on (see device_choice.h). */
#include "device_choice.h"

#include <stdio.h>
#include <string.h>

uint32_t gs_cuda_visible_count(const char *list)
{
  uint32_t n = 0;

  if (!list)
    return 0;
  while (*list) {
    size_t len = strcspn(list, ",");

    n += len > 0;
    list += len;
    list += *list == ',';
  }
  return n;
}

/* The GPU of local rank r when --gpu does not say. */
static int default_gpu(const gs_device_env_t *env)
{
  if (env->gpu >= 0)
    return env->gpu;
  return env->visible > 0 ? (int)(env->local_rank % (uint32_t)env->visible) : 0;
}

/* The cpu; `warn`: the user can expect a GPU here, and should act. */
static void choose_cpu(gs_device_choice_t *out, bool warn, const char *why)
{
  out->name = "cpu";
  out->gpu = 0;
  out->warn = warn;
  snprintf(out->reason, sizeof(out->reason), "%s", why);
}

/* No GPU is visible. Unset, empty or "-1" (the usual way to hide them
 * all), CUDA_VISIBLE_DEVICES says nothing against it: a machine without a
 * GPU (or driver), or every GPU hidden on purpose; the cpu is the normal
 * choice, and gradsync-run says so once for all ranks. A list that names
 * GPUs the process cannot see is a mistake (a wrong index, a missing
 * driver) worth a warning. */
static void choose_cpu_no_gpu(const char *cvd, gs_device_choice_t *out)
{
  char why[320];

  if (!cvd || !cvd[0] || cvd[0] == '-') {
    snprintf(why, sizeof(why),
             "--device auto: no GPU is visible to this process%s%s%s; training on the cpu",
             cvd ? " (CUDA_VISIBLE_DEVICES='" : "", cvd ? cvd : "", cvd ? "' hides them)" : "");
    choose_cpu(out, false, why);
    return;
  }
  snprintf(why, sizeof(why),
           "--device auto: CUDA_VISIBLE_DEVICES='%s' names GPUs, but none is visible to this "
           "process (no such GPU, or no NVIDIA driver); training on the cpu",
           cvd);
  choose_cpu(out, true, why);
}

void gs_device_choose(const gs_device_env_t *env, gs_device_choice_t *out)
{
  const char *cvd = env->cuda_visible_devices;
  uint32_t listed = gs_cuda_visible_count(cvd);
  const char *shared = env->launcher_cuda_visible_devices;
  bool own_gpu = cvd && env->visible == 1 && listed == 1 && !(shared && strcmp(shared, cvd) == 0);
  char why[320];

  memset(out, 0, sizeof(*out));
  if (strcmp(env->device, "auto") != 0) {
    bool cuda = strcmp(env->device, "cuda") == 0;

    out->name = cuda ? "cuda" : "cpu";
    out->gpu = cuda ? default_gpu(env) : 0;
    snprintf(out->reason, sizeof(out->reason), "--device %s", env->device);
  } else if (!env->cuda_built) {
    choose_cpu(out, false, "--device auto: this build has no CUDA");
  } else if (env->visible <= 0) {
    choose_cpu_no_gpu(cvd, out);
  } else if (env->local_world > (uint32_t)env->visible && !own_gpu) {
    snprintf(why, sizeof(why),
             "--device auto: %u ranks on this machine (LOCAL_WORLD_SIZE) but %d GPU(s) visible "
             "to each, and NCCL needs a GPU per rank; training on the cpu (give each rank one "
             "GPU of its own in CUDA_VISIBLE_DEVICES, or pass --device cuda)",
             env->local_world, env->visible);
    choose_cpu(out, true, why);
  } else {
    out->name = "cuda";
    out->gpu = own_gpu && env->gpu < 0 ? 0 : default_gpu(env);
    if (own_gpu)
      snprintf(out->reason, sizeof(out->reason),
               "--device auto: CUDA_VISIBLE_DEVICES='%s' gives this process one GPU of its own",
               cvd);
    else
      snprintf(out->reason, sizeof(out->reason),
               "--device auto: %d GPU(s) visible, GPU %d for local rank %u", env->visible, out->gpu,
               env->local_rank);
  }
}
