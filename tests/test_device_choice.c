/* gradsync-agent's device choice (agent/trainer/device_choice.h) as a
 * pure function: every case a machine could present, without a GPU. */
#include <check.h>
#include <string.h>

#include "device_choice.h"
#include "runner.h"

static gs_device_choice_t choose(const char *device, int gpu, bool built, int visible,
                                 const char *cvd, uint32_t local_world, uint32_t local_rank)
{
  gs_device_env_t env = {
      .device = device,
      .gpu = gpu,
      .cuda_built = built,
      .visible = visible,
      .cuda_visible_devices = cvd,
      .local_world = local_world,
      .local_rank = local_rank,
  };
  gs_device_choice_t c;

  gs_device_choose(&env, &c);
  return c;
}

#define CHOSEN(c, dev, index, warned, text)                                                        \
  do {                                                                                             \
    ck_assert_str_eq((c).name, dev);                                                               \
    ck_assert_int_eq((c).gpu, index);                                                              \
    ck_assert_int_eq((c).warn, warned);                                                            \
    ck_assert_msg(strstr((c).reason, text), "reason: %s", (c).reason);                             \
  } while (0)

START_TEST(visible_device_lists_are_counted)
{
  ck_assert_uint_eq(gs_cuda_visible_count(NULL), 0);
  ck_assert_uint_eq(gs_cuda_visible_count(""), 0);
  ck_assert_uint_eq(gs_cuda_visible_count("0"), 1);
  ck_assert_uint_eq(gs_cuda_visible_count("2,3"), 2);
  ck_assert_uint_eq(gs_cuda_visible_count("GPU-8f1e,MIG-2a"), 2);
  ck_assert_uint_eq(gs_cuda_visible_count("1,"), 1);
}
END_TEST

/* The bug of issue 12: one GPU per process (SLURM --gpus-per-task=1, a
 * pod per rank) with LOCAL_WORLD_SIZE > 1 fell back to the cpu. */
START_TEST(a_gpu_of_its_own_is_trusted)
{
  gs_device_choice_t c = choose("auto", -1, true, 1, "3", 4, 2);

  CHOSEN(c, "cuda", 0, false, "CUDA_VISIBLE_DEVICES='3' gives this process one GPU of its own");
  c = choose("auto", -1, true, 1, "0", 8, 7); /* cgroups renumber every task's GPU to 0 */
  CHOSEN(c, "cuda", 0, false, "one GPU of its own");
}
END_TEST

/* gradsync-run hands every rank the same list: one GPU in it is shared by
 * all of them, not each one's own; a wrapper that gives a rank another list
 * is trusted again. */
START_TEST(the_launchers_shared_list_is_not_a_gpu_of_its_own)
{
  gs_device_env_t env = {.device = "auto",
                         .gpu = -1,
                         .cuda_built = true,
                         .visible = 1,
                         .cuda_visible_devices = "0",
                         .launcher_cuda_visible_devices = "0",
                         .local_world = 2,
                         .local_rank = 1};
  gs_device_choice_t c;

  gs_device_choose(&env, &c);
  CHOSEN(c, "cpu", 0, true, "2 ranks on this machine (LOCAL_WORLD_SIZE) but 1 GPU(s) visible");
  env.cuda_visible_devices = "1"; /* a per-rank wrapper's own list */
  gs_device_choose(&env, &c);
  CHOSEN(c, "cuda", 0, false, "CUDA_VISIBLE_DEVICES='1' gives this process one GPU of its own");
}
END_TEST

/* Ranks that would share GPUs fall back to the cpu, loudly. */
START_TEST(shared_gpus_fall_back_with_a_warning)
{
  gs_device_choice_t c = choose("auto", -1, true, 1, NULL, 4, 1);

  CHOSEN(c, "cpu", 0, true, "4 ranks on this machine (LOCAL_WORLD_SIZE) but 1 GPU(s) visible");
  c = choose("auto", -1, true, 2, "0,1", 4, 3);
  CHOSEN(c, "cpu", 0, true, "NCCL needs a GPU per rank");
  c = choose("auto", -1, true, 1, "0,7", 2, 0); /* CUDA stopped at an invalid entry */
  CHOSEN(c, "cpu", 0, true, "give each rank one GPU of its own");
}
END_TEST

/* No GPU at all is the normal cpu case, not a warning (gradsync-run says
 * once which device the ranks use): a machine without one, or every GPU
 * hidden on purpose. A list naming GPUs that are not there is a mistake. */
START_TEST(no_gpu_is_no_warning)
{
  gs_device_choice_t c = choose("auto", -1, true, 0, NULL, 0, 0);

  CHOSEN(c, "cpu", 0, false, "no GPU is visible to this process; training on the cpu");
  c = choose("auto", -1, true, 0, NULL, 4, 3);
  CHOSEN(c, "cpu", 0, false, "no GPU is visible to this process; training on the cpu");
  c = choose("auto", -1, true, 0, "", 1, 0);
  CHOSEN(c, "cpu", 0, false, "(CUDA_VISIBLE_DEVICES='' hides them)");
  c = choose("auto", -1, true, 0, "-1", 2, 1);
  CHOSEN(c, "cpu", 0, false, "(CUDA_VISIBLE_DEVICES='-1' hides them)");
  c = choose("auto", -1, true, 0, "3", 1, 0);
  CHOSEN(c, "cpu", 0, true, "CUDA_VISIBLE_DEVICES='3' names GPUs, but none is visible");
  c = choose("auto", -1, true, 0, "GPU-8f1e", 2, 1);
  CHOSEN(c, "cpu", 0, true, "no such GPU, or no NVIDIA driver");
}
END_TEST

/* Enough GPUs: local rank r takes GPU r mod visible, or --gpu. Without
 * CUDA in the build, auto is the cpu and nothing to warn about. */
START_TEST(enough_gpus_are_shared_out)
{
  gs_device_choice_t c = choose("auto", -1, true, 4, NULL, 4, 3);

  CHOSEN(c, "cuda", 3, false, "4 GPU(s) visible, GPU 3 for local rank 3");
  c = choose("auto", -1, true, 2, NULL, 0, 5); /* LOCAL_WORLD_SIZE unknown */
  CHOSEN(c, "cuda", 1, false, "GPU 1 for local rank 5");
  c = choose("auto", 2, true, 4, NULL, 2, 0);
  CHOSEN(c, "cuda", 2, false, "GPU 2");
  c = choose("auto", -1, false, 0, "0", 4, 1);
  CHOSEN(c, "cpu", 0, false, "this build has no CUDA");
}
END_TEST

/* --device cpu and cuda are obeyed whatever the machine. */
START_TEST(explicit_devices_are_obeyed)
{
  gs_device_choice_t c = choose("cuda", -1, true, 2, NULL, 4, 3);

  CHOSEN(c, "cuda", 1, false, "--device cuda");
  c = choose("cuda", 0, true, 1, NULL, 2, 1);
  CHOSEN(c, "cuda", 0, false, "--device cuda");
  c = choose("cpu", -1, true, 8, NULL, 1, 0);
  CHOSEN(c, "cpu", 0, false, "--device cpu");
}
END_TEST

static Suite *device_choice_suite(void)
{
  const gs_test_case_t cases[] = {
      {"visible_count", visible_device_lists_are_counted},
      {"own_gpu", a_gpu_of_its_own_is_trusted},
      {"launcher_list", the_launchers_shared_list_is_not_a_gpu_of_its_own},
      {"shared", shared_gpus_fall_back_with_a_warning},
      {"no_gpu", no_gpu_is_no_warning},
      {"enough", enough_gpus_are_shared_out},
      {"explicit", explicit_devices_are_obeyed},
  };

  return GS_TEST_SUITE_OF("device_choice", cases, 0, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {device_choice_suite}};
