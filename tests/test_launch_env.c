/* Tests for agent/launch/launch_env.c: scheduler variables translated
 * into gradsync-agent flag values, and the precedence the agent's flag
 * table gives them (flag, then GRADSYNC_*, then the schedulers'), run
 * through gs_flags_parse with a table of the same sources as the agent's. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "launch_env.h"
#include "runner.h"

/* The environment a test gives: name=value pairs, NULL-terminated. */
static const char *const *test_env;

static char *fake_getenv(const char *name)
{
  size_t n = strlen(name);

  for (size_t i = 0; test_env && test_env[i]; i++)
    if (!strncmp(test_env[i], name, n) && test_env[i][n] == '=')
      return (char *)test_env[i] + n + 1;
  return NULL;
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The job settings, as gradsync-agent's table has them. */
typedef struct job {
  char host[256];
  uint16_t port;
  const char *job;
  uint32_t world;
  uint32_t local_rank;
  char node[64];
  int32_t rank;
} job_t;

#define J(m) GS_FLAG_AT(job_t, m)
static const gs_flag_t rows[] = {
    {.name = "--coordinator",
     .kind = GS_FLAG_ADDR,
     J(host),
     GS_FLAG_PORT_AT(job_t, port),
     .min = 1,
     .envs = gs_launch_coordinator_envs},
    {.name = "--job",
     .kind = GS_FLAG_STR,
     J(job),
     .min = 1,
     .max = 127,
     .envs = gs_launch_job_envs},
    {.name = "--world-size",
     .kind = GS_FLAG_INT,
     J(world),
     .min = 1,
     .max = 65536,
     .envs = gs_launch_world_size_envs},
    {.name = "--local-rank",
     .kind = GS_FLAG_INT,
     J(local_rank),
     .min = 0,
     .max = 1 << 20,
     .envs = gs_launch_local_rank_envs},
    {.name = "--node", .kind = GS_FLAG_STRBUF, J(node), .envs = gs_launch_node_envs},
    {.name = "--rank",
     .kind = GS_FLAG_INT,
     J(rank),
     .min = 0,
     .max = 65535,
     .envs = gs_launch_rank_envs},
};
enum { COORD, JOB, WORLD, LOCAL_RANK, NODE, RANK, NROWS };

static const gs_flags_t spec = {.prog = "t", .usage = "", .flags = rows, .count = NROWS};

typedef struct resolved {
  gs_launch_env_t le;
  job_t j;
  const char *sources[NROWS];
  char why[256];
} resolved_t;

/* Parses args against env into r; returns gs_flags_parse's result. */
static int resolve(resolved_t *r, const char *const *env, char **args)
{
  gs_flags_opts_t fo = {.lookup = gs_launch_env_lookup, .ctx = &r->le, .sources = r->sources};
  gs_flags_action_t action;
  char *argv[16];
  int argc = 0;

  test_env = env;
  memset(r, 0, sizeof(*r));
  r->j.job = "local";
  r->j.rank = -1;
  snprintf(r->j.node, sizeof(r->j.node), "host");
  gs_launch_env_init(&r->le, fake_getenv);
  argv[argc++] = "t";
  while (args && *args)
    argv[argc++] = *args++;
  argv[argc] = NULL;
  return gs_flags_parse(&spec, &r->j, argc, argv, &fo, &action, r->why, sizeof(r->why));
}

#define NOARGS ((char *[]){NULL})
#define ARGS(...) ((char *[]){__VA_ARGS__, NULL})

static void expect_source(const resolved_t *r, int row, const char *want)
{
  if (!want)
    ck_assert_msg(!r->sources[row], "%s from %s", rows[row].name, r->sources[row]);
  else
    ck_assert_msg(r->sources[row] && !strcmp(r->sources[row], want), "%s from %s, not %s",
                  rows[row].name, r->sources[row] ? r->sources[row] : "default", want);
}

START_TEST(slurm_only)
{
  resolved_t r;

  ck_assert_int_eq(resolve(&r,
                           ENV("SLURM_JOB_ID=4242", "SLURM_NTASKS=8", "SLURM_LOCALID=3",
                               "SLURM_PROCID=7", "SLURM_NODEID=1", "SLURMD_NODENAME=gpu-07"),
                           NOARGS),
                   0);
  ck_assert_str_eq(r.j.job, "slurm-4242");
  ck_assert_uint_eq(r.j.world, 8);
  ck_assert_uint_eq(r.j.local_rank, 3);
  ck_assert_str_eq(r.j.node, "gpu-07");
  /* SLURM names no coordinator: it stays unset. */
  expect_source(&r, COORD, NULL);
  ck_assert_str_eq(r.j.host, "");
  expect_source(&r, JOB, "SLURM_JOB_ID");
  expect_source(&r, WORLD, "SLURM_NTASKS");
  expect_source(&r, LOCAL_RANK, "SLURM_LOCALID");
  expect_source(&r, NODE, "SLURMD_NODENAME");
  /* srun's task id: the rank when srun starts one agent per task. */
  ck_assert_int_eq(r.j.rank, 7);
  expect_source(&r, RANK, "SLURM_PROCID");
}
END_TEST

START_TEST(torchrun_only)
{
  resolved_t r;

  ck_assert_int_eq(resolve(&r,
                           ENV("MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "WORLD_SIZE=16",
                               "RANK=9", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=8"),
                           NOARGS),
                   0);
  /* MASTER_PORT is torch's store port: the coordinator gets 7070. */
  ck_assert_str_eq(r.j.host, "10.0.0.1");
  ck_assert_uint_eq(r.j.port, 7070);
  ck_assert_uint_eq(r.j.world, 16);
  ck_assert_uint_eq(r.j.local_rank, 1);
  ck_assert_str_eq(r.j.job, "local");
  ck_assert_str_eq(r.j.node, "host");
  expect_source(&r, COORD, "MASTER_ADDR");
  expect_source(&r, WORLD, "WORLD_SIZE");
  expect_source(&r, NODE, NULL);
  ck_assert_int_eq(r.j.rank, 9);
  expect_source(&r, RANK, "RANK");
  /* $GRADSYNC_COORDINATOR_PORT names ours; an IPv6 address is bracketed. */
  ck_assert_int_eq(
      resolve(&r, ENV("MASTER_ADDR=fd00::1", "GRADSYNC_COORDINATOR_PORT=9000"), NOARGS), 0);
  ck_assert_str_eq(r.j.host, "fd00::1");
  ck_assert_uint_eq(r.j.port, 9000);
}
END_TEST

START_TEST(kubeflow_trainer)
{
  resolved_t r;

  ck_assert_int_eq(resolve(&r,
                           ENV("PET_MASTER_ADDR=job-node-0-0.job", "PET_NNODES=2",
                               "PET_NPROC_PER_NODE=4", "PET_NODE_RANK=1"),
                           NOARGS),
                   0);
  ck_assert_str_eq(r.j.host, "job-node-0-0.job");
  ck_assert_uint_eq(r.j.port, 7070);
  ck_assert_uint_eq(r.j.world, 8);
  expect_source(&r, WORLD, "PET_NNODES*PET_NPROC_PER_NODE");
  /* torchrun's "auto" or an elastic "1:4" is no count: no world size. */
  ck_assert_int_eq(resolve(&r, ENV("PET_NNODES=2", "PET_NPROC_PER_NODE=auto"), NOARGS), 0);
  expect_source(&r, WORLD, NULL);
  ck_assert_int_eq(resolve(&r, ENV("PET_NNODES=1:4", "PET_NPROC_PER_NODE=2"), NOARGS), 0);
  expect_source(&r, WORLD, NULL);
}
END_TEST

START_TEST(precedence)
{
  const char *const *all =
      ENV("GRADSYNC_COORDINATOR=coord:7171", "GRADSYNC_JOB=mine", "GRADSYNC_WORLD_SIZE=2",
          "GRADSYNC_LOCAL_RANK=0", "GRADSYNC_NODE=n0", "MASTER_ADDR=10.0.0.1", "WORLD_SIZE=16",
          "LOCAL_RANK=5", "SLURM_JOB_ID=1", "SLURM_NTASKS=8", "SLURM_LOCALID=3",
          "SLURMD_NODENAME=gpu-07", "PET_NNODES=3", "PET_NPROC_PER_NODE=3", "GRADSYNC_RANK=1",
          "RANK=6", "SLURM_PROCID=2");
  resolved_t r;

  /* GRADSYNC_* before every scheduler's variable. */
  ck_assert_int_eq(resolve(&r, all, NOARGS), 0);
  ck_assert_str_eq(r.j.host, "coord");
  ck_assert_uint_eq(r.j.port, 7171);
  ck_assert_str_eq(r.j.job, "mine");
  ck_assert_uint_eq(r.j.world, 2);
  ck_assert_uint_eq(r.j.local_rank, 0);
  ck_assert_str_eq(r.j.node, "n0");
  expect_source(&r, LOCAL_RANK, "GRADSYNC_LOCAL_RANK");
  ck_assert_int_eq(r.j.rank, 1);
  expect_source(&r, RANK, "GRADSYNC_RANK");
  /* The flag before everything. */
  ck_assert_int_eq(resolve(&r, all,
                           ARGS("--coordinator", "h:1", "--job", "j", "--world-size", "4",
                                "--local-rank", "2", "--node", "n", "--rank", "3")),
                   0);
  ck_assert_int_eq(r.j.rank, 3);
  ck_assert_uint_eq(r.j.world, 4);
  ck_assert_uint_eq(r.j.local_rank, 2);
  ck_assert_str_eq(r.j.job, "j");
  for (int i = 0; i < NROWS; i++)
    expect_source(&r, i, "flag");
}
END_TEST

START_TEST(conflicts)
{
  resolved_t r;

  /* torchrun inside a SLURM allocation: torchrun's variables describe the
   * processes it started, so they win over SLURM's; the job name still
   * comes from SLURM, which alone names one. */
  ck_assert_int_eq(resolve(&r,
                           ENV("WORLD_SIZE=16", "LOCAL_RANK=5", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
                               "SLURM_JOB_ID=77", "PET_NNODES=9", "PET_NPROC_PER_NODE=9"),
                           NOARGS),
                   0);
  ck_assert_uint_eq(r.j.world, 16);
  ck_assert_uint_eq(r.j.local_rank, 5);
  ck_assert_str_eq(r.j.job, "slurm-77");
  /* An empty variable counts as unset; a bad one is an error naming it,
   * never silently passed over for the next source. */
  ck_assert_int_eq(
      resolve(&r, ENV("GRADSYNC_WORLD_SIZE=", "WORLD_SIZE=x", "SLURM_NTASKS=2"), NOARGS),
      GS_EINVAL);
  ck_assert_msg(strstr(r.why, "--world-size (from $WORLD_SIZE)"), "%s", r.why);
  ck_assert_int_eq(resolve(&r, ENV("PET_NNODES=65536", "PET_NPROC_PER_NODE=2"), NOARGS), GS_EINVAL);
  ck_assert_msg(strstr(r.why, "(from $PET_NNODES*PET_NPROC_PER_NODE)"), "%s", r.why);
}
END_TEST

/* Renders the notes for env into a string (caller frees): the agent's,
 * or gradsync-run's with `run`. */
static char *notes_of(const char *const *env, bool run)
{
  gs_launch_env_t le;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);

  ck_assert_ptr_nonnull(f);
  test_env = env;
  gs_launch_env_init(&le, fake_getenv);
  if (run)
    gs_launch_env_run_notes(&le, f);
  else
    gs_launch_env_notes(&le, f);
  fclose(f);
  return text;
}

static char *notes(const char *const *env)
{
  return notes_of(env, false);
}

START_TEST(ignored_noted)
{
  char *text = notes(ENV("RANK=3", "SLURM_NODEID=5", "MASTER_PORT=29500", "LOCAL_RANK=1"));

  ck_assert_ptr_nonnull(strstr(text, "ignored: $SLURM_NODEID=5 (the agent's own rank is $RANK"));
  ck_assert_ptr_nonnull(strstr(text, "ignored: $MASTER_PORT=29500 (torch's store port"));
  ck_assert_ptr_null(strstr(text, "$RANK="));
  ck_assert_ptr_null(strstr(text, "LOCAL_RANK"));
  free(text);
  text = notes(ENV("LOCAL_RANK=1"));
  ck_assert_str_eq(text, "");
  free(text);
}
END_TEST

/* gradsync-run reads the node variables the agent ignores, and ignores
 * the per-process ones it sets itself. */
START_TEST(run_ignored_noted)
{
  char *text = notes_of(ENV("SLURM_NODEID=1", "PET_NODE_RANK=1", "SLURM_NTASKS=2",
                            "SLURM_NTASKS_PER_NODE=1", "LOCAL_RANK=0", "SLURM_PROCID=1"),
                        true);

  ck_assert_ptr_null(strstr(text, "SLURM_NODEID"));
  ck_assert_ptr_null(strstr(text, "PET_NODE_RANK"));
  ck_assert_ptr_nonnull(strstr(text, "ignored: $SLURM_NTASKS=2 (the world size is --nnodes"));
  ck_assert_ptr_nonnull(strstr(text, "ignored: $SLURM_NTASKS_PER_NODE=1 (counts gradsync-run"));
  ck_assert_ptr_nonnull(strstr(text, "ignored: $LOCAL_RANK=0 (gradsync-run sets"));
  ck_assert_ptr_nonnull(strstr(text, "ignored: $SLURM_PROCID=1 (gradsync-run sets"));
  free(text);
}
END_TEST

/* The node sources in their order: gradsync's, SLURM's, Kubeflow's, then
 * an Indexed Job's completion index. */
START_TEST(run_node_rank_sources)
{
  static const gs_flag_t run_rows[] = {
      {.name = "--node-rank",
       .kind = GS_FLAG_INT,
       J(world),
       .min = 0,
       .max = 65535,
       .envs = gs_launch_node_rank_envs},
  };
  static const gs_flags_t run_spec = {.prog = "t", .usage = "", .flags = run_rows, .count = 1};
  const char *sources[1];
  gs_flags_opts_t fo = {.sources = sources};
  gs_flags_action_t action;
  gs_launch_env_t le;
  job_t j = {.world = 0};
  char why[256];

  fo.lookup = gs_launch_env_lookup;
  fo.ctx = &le;
  gs_launch_env_init(&le, fake_getenv);
  test_env = ENV("JOB_COMPLETION_INDEX=3");
  ck_assert_int_eq(gs_flags_parse(&run_spec, &j, 1, NOARGS, &fo, &action, why, sizeof(why)), 0);
  ck_assert_uint_eq(j.world, 3);
  ck_assert_str_eq(sources[0], "JOB_COMPLETION_INDEX");
  test_env = ENV("JOB_COMPLETION_INDEX=3", "SLURM_NODEID=2", "GRADSYNC_NODE_RANK=1");
  ck_assert_int_eq(gs_flags_parse(&run_spec, &j, 1, NOARGS, &fo, &action, why, sizeof(why)), 0);
  ck_assert_uint_eq(j.world, 1);
  ck_assert_str_eq(sources[0], "GRADSYNC_NODE_RANK");
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  return tc;
}

static Suite *launch_env_suite(void)
{
  Suite *s = suite_create("launch_env");

  suite_add_tcase(s, tcase("slurm_only", slurm_only));
  suite_add_tcase(s, tcase("torchrun_only", torchrun_only));
  suite_add_tcase(s, tcase("kubeflow_trainer", kubeflow_trainer));
  suite_add_tcase(s, tcase("precedence", precedence));
  suite_add_tcase(s, tcase("conflicts", conflicts));
  suite_add_tcase(s, tcase("ignored_noted", ignored_noted));
  suite_add_tcase(s, tcase("run_ignored_noted", run_ignored_noted));
  suite_add_tcase(s, tcase("run_node_rank_sources", run_node_rank_sources));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {launch_env_suite}};
