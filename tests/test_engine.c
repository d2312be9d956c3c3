/* Tests for the sync engine (agent/engine/) with its real neighbours: the
 * coordinator binary, the host backend over loopback, real threads as ranks.
 * The "model" is a few parameters whose gradients the test writes itself, so
 * every expectation is computed independently of the engine. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gradsync/engine.h>

#include "checkpoint.h"
#include "client.h"
#include "clock.h"
#include "comm.h"
#include "device.h"
#include "half.h"
#include "harness.h"
#include "heartbeat.h"
#include "packs.h"
#include "scratch.h"
#include "runner.h"

#define MAX_WORLD 4
#define NPARAMS 3
static const uint64_t sizes[NPARAMS] = {10, 3, 7}; /* w0, b0 (bias), w1 */

typedef struct rank_run rank_run_t;

/* The order a rank's backward reports its gradients in. */
typedef enum grad_order {
  ORDER_BACKWARD = 0, /* last parameter first, as backward produces them */
  ORDER_MIXED,        /* rank 0 backward, rank 1 forward, rank 2 shuffled anew each step */
} grad_order_t;

/* What a test asks of every rank, and what the ranks saw. */
typedef struct scenario {
  th_coord_t coord;
  char job[64];
  uint32_t world;
  int32_t bcast_period;
  uint64_t max_steps;
  uint32_t skip_param_on_rank; /* UINT32_MAX: none */
  uint32_t nan_rank;           /* UINT32_MAX: none */
  uint32_t nan_step;
  bool nan_grad;    /* the NaN in a gradient of nan_rank's (the loss finite), not in its loss */
  uint64_t skip_at; /* 0: none; else every rank synchronizes step skip_at - 1 and skips it */
  gs_grad_dtype_t grad_dtype;
  bool bcast_bytes; /* after the start: bytes broadcast from the last rank, checked */
  bool perturb;     /* ranks > 0 shift their params after the start */
  bool slow;        /* sleep 2 ms per step */
  const char *checkpoint_dir;
  uint64_t checkpoint_every;
  bool resume;
  uint64_t pack_threshold;  /* 0: 48 bytes (two packs) */
  uint64_t comm_timeout_ms; /* 0: TH_WAIT_MS */
  uint64_t gate_step;       /* 0: none; else every rank waits before it for gate_open */
  int gate_open;            /* atomic */
  grad_order_t order;
  bool start_only;        /* each rank starts and finishes, nothing more */
  bool probe_after_error; /* after a failed step, try a step, a checkpoint and a sum */
  uint32_t engine_ranks;  /* ranks run as engines (the rest by hand); 0: all */
  gs_decide_t decide;
  gs_nonfinite_t nonfinite;
  bool adam;  /* Adam in one group (its bias correction counts the updates) instead of SGD */
  bool shard; /* sharded optimizer state */
  bool grads_by_rank; /* each rank's gradients its own (else the same on every rank) */
  struct rank_run {
    pthread_t thread;
    uint32_t local_rank, rank;
    int err;
    char error[768];
    uint64_t steps;
    uint64_t period_changed_at, stopped_at, skipped_at, lr_changed_at, lr_changes;
    uint64_t optim_steps;
    int32_t period;
    float lr_scale, lr_factor;
    float params[NPARAMS][16];
    float state[2][NPARAMS][16]; /* the optimizer's (assembled when sharded); nstate slots */
    uint32_t nstate;
    gs_position_t start, end;
    uint32_t packs;
    double start_ms;                 /* how long gs_engine_start took */
    int step_err, ckpt_err, sum_err; /* probe_after_error */
    char step_error[768], ckpt_error[768], sum_error[768];
    struct scenario *sc;
  } ranks[MAX_WORLD];
} scenario_t;

static gs_log_t quiet_log = {GS_LOG_WARN, NULL, "test"};

static void scenario_init(scenario_t *sc, const char *job, uint32_t world)
{
  memset(sc, 0, sizeof(*sc));
  snprintf(sc->job, sizeof(sc->job), "%s", job);
  sc->world = world;
  sc->max_steps = 20;
  sc->skip_param_on_rank = UINT32_MAX;
  sc->nan_rank = UINT32_MAX;
  th_coord_start(&sc->coord, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "10s",
                 "--log-level", "warn", NULL);
}

/* The gradient the test feeds: the same on every rank, varying with step. */
static float grad_value(uint64_t step, uint32_t p, uint32_t i)
{
  return 0.01f * (float)((step * 7 + p * 13 + i * 3) % 11) - 0.05f;
}

static void engine_config(scenario_t *sc, gs_engine_config_t *c)
{
  memset(c, 0, sizeof(*c));
  snprintf(c->coord.host, sizeof(c->coord.host), "127.0.0.1");
  c->coord.port = sc->coord.rpc_port;
  c->coord.job = sc->job;
  c->coord.log = &quiet_log;
  c->world_size = sc->world;
  snprintf(c->node, sizeof(c->node), "node");
  snprintf(c->device, sizeof(c->device), "cpu");
  snprintf(c->backend, sizeof(c->backend), "host");
  snprintf(c->comm_bind, sizeof(c->comm_bind), "127.0.0.1");
  c->pack_threshold = sc->pack_threshold ? sc->pack_threshold : 48; /* 48: w1, then b0 + w0 */
  c->reduce = GS_REDUCE_MEAN;
  c->grad_dtype = sc->grad_dtype;
  c->decide = sc->decide;
  c->nonfinite = sc->nonfinite;
  c->optim = sc->adam ? GS_OPTIM_ADAM : GS_OPTIM_SGD;
  c->shard_optimizer = sc->shard;
  gs_sgd_config_default(&c->sgd);
  c->sgd.lr = 0.1f;
  c->sgd.bias_wd = c->sgd.weight_decay;
  c->bcast_period = sc->bcast_period;
  c->checkpoint_dir = sc->checkpoint_dir;
  c->checkpoint_every = sc->checkpoint_every;
  c->checkpoint_keep = 5;
  c->resume = sc->resume;
  c->join_timeout_ms = TH_WAIT_MS;
  c->rpc_timeout_ms = TH_WAIT_MS;
  c->comm_timeout_ms = sc->comm_timeout_ms ? sc->comm_timeout_ms : TH_WAIT_MS;
  c->log = &quiet_log;
}

static uint64_t min_step(scenario_t *sc)
{
  uint64_t m = UINT64_MAX;

  for (uint32_t r = 0; r < sc->world; r++)
    m = sc->ranks[r].steps < m ? sc->ranks[r].steps : m;
  return m;
}

/* The order rank `rank` reports its gradients in at `step` (see grad_order_t). */
static void report_order(const scenario_t *sc, uint32_t rank, uint64_t step, uint32_t *order)
{
  uint64_t x = step * 2654435761u + rank;

  for (uint32_t k = 0; k < NPARAMS; k++)
    order[k] = NPARAMS - 1 - k;
  if (sc->order == ORDER_BACKWARD || rank % 3 == 0)
    return;
  for (uint32_t k = 0; k < NPARAMS; k++)
    order[k] = k;
  for (uint32_t k = NPARAMS - 1; rank % 3 == 2 && k > 0; k--) {
    uint32_t j, t;

    x = x * 6364136223846793005u + 1442695040888963407u;
    j = (uint32_t)((x >> 33) % (k + 1));
    t = order[k], order[k] = order[j], order[j] = t;
  }
}

/* One training step with test gradients, reported in the scenario's order. */
static int fake_step(gs_engine_t *e, rank_run_t *rr, uint64_t step, gs_step_result_t *res)
{
  scenario_t *sc = rr->sc;
  gs_position_t after = {.step = step + 1, .rng_state = 42};
  bool nan = rr->rank == sc->nan_rank && step == sc->nan_step;
  uint32_t order[NPARAMS];

  gs_engine_begin_step(e, nan && !sc->nan_grad ? NAN : 1.0f, &after);
  report_order(sc, rr->rank, step, order);
  for (uint32_t k = 0; k < NPARAMS; k++) {
    uint32_t p = order[k];
    float *g = gs_engine_grad(e, p);

    for (uint32_t i = 0; i < sizes[p]; i++)
      g[i] = grad_value(step, p, i) +
             (sc->grads_by_rank ? 0.003f * (float)(rr->rank + 1) * (float)((i + p) % 5) : 0.0f);
    if (nan && sc->nan_grad && p == 0)
      g[3] = NAN;
    if (!(rr->rank == sc->skip_param_on_rank && p == 1))
      gs_engine_grad_ready(e, p);
  }
  if (step + 1 == sc->skip_at) { /* as a loss scaler: decide from the sums */
    gs_sync_result_t sync;
    int err = gs_engine_synchronize(e, true, &sync);

    if (err)
      return err;
    gs_engine_skip_step(e);
  }
  return gs_engine_end_step(e, res);
}

/* After a failed step: another step, a checkpoint and a metric sum must
 * each be refused with the engine's first failure. */
static void probe_after_error(gs_engine_t *e, rank_run_t *rr, uint64_t step)
{
  gs_position_t pos = {.step = step + 1, .rng_state = 42};
  gs_step_result_t res;
  float sum = 1.0f;

  rr->step_err = fake_step(e, rr, step + 1, &res);
  snprintf(rr->step_error, sizeof(rr->step_error), "%s", gs_engine_error(e));
  rr->ckpt_err = gs_engine_checkpoint(e, &pos);
  snprintf(rr->ckpt_error, sizeof(rr->ckpt_error), "%s", gs_engine_error(e));
  rr->sum_err = gs_engine_allreduce_sum(e, &sum, 1);
  snprintf(rr->sum_error, sizeof(rr->sum_error), "%s", gs_engine_error(e));
}

static void *rank_main(void *arg)
{
  rank_run_t *rr = arg;
  scenario_t *sc = rr->sc;
  gs_engine_config_t cfg;
  gs_engine_t *e;
  gs_position_t pos = {.rng_state = 42};
  gs_step_result_t res;
  double t0;
  int err;

  engine_config(sc, &cfg);
  cfg.local_rank = rr->local_rank;
  cfg.dev = gs_device_open("cpu", 0, &quiet_log, rr->error, sizeof(rr->error));
  ck_assert_msg(cfg.dev, "cpu device: %s", rr->error);
  e = gs_engine_new(&cfg);
  for (uint32_t p = 0; p < NPARAMS; p++) {
    char name[16];

    snprintf(name, sizeof(name), "p%u", p);
    (void)gs_engine_register(e, name, sizes[p], p == 1);
  }
  if (sc->adam) {
    gs_optim_group_t g;

    gs_optim_group_default(GS_OPTIM_ADAM, &g);
    g.lr = 0.01;
    ck_assert_int_eq(gs_engine_add_group(e, &g), 0);
  }
  t0 = gs_now_ms_f();
  err = gs_engine_start(e);
  rr->start_ms = gs_now_ms_f() - t0;
  rr->rank = gs_engine_rank(e);
  if (err || sc->start_only)
    goto out;
  rr->packs = gs_engine_pack_count(e);
  for (uint32_t p = 0; p < NPARAMS; p++)
    for (uint32_t i = 0; i < sizes[p]; i++)
      gs_engine_param(e, p)[i] = (float)(p + 1) * 0.1f * (float)i + (float)rr->rank * 5.0f;
  err = gs_engine_sync_initial(e, &pos);
  if (err)
    goto out;
  rr->start = pos;
  if (sc->bcast_bytes) {
    uint8_t bytes[1001];
    uint32_t root = sc->world - 1;

    for (size_t i = 0; i < sizeof(bytes); i++)
      bytes[i] = (uint8_t)(i * 7 + rr->rank * 31);
    err = gs_engine_broadcast(e, bytes, sizeof(bytes), root);
    for (size_t i = 0; !err && i < sizeof(bytes); i++)
      if (bytes[i] != (uint8_t)(i * 7 + root * 31)) {
        snprintf(rr->error, sizeof(rr->error), "byte %zu is %u, not rank %u's", i, bytes[i], root);
        rr->err = GS_EIO;
        goto out_failed;
      }
    if (!err)
      err = gs_engine_broadcast(e, bytes, sizeof(bytes), sc->world) == GS_EINVAL ? 0 : GS_EIO;
    if (err)
      goto out;
  }
  if (sc->perturb && rr->rank > 0)
    gs_engine_param(e, 0)[0] += 1.0f;
  for (uint64_t s = pos.step; s < sc->max_steps; s++) {
    while (sc->gate_step && s == sc->gate_step &&
           !__atomic_load_n(&sc->gate_open, __ATOMIC_SEQ_CST))
      usleep(1000);
    err = fake_step(e, rr, s, &res);
    if (err && sc->probe_after_error) {
      snprintf(rr->error, sizeof(rr->error), "%s", gs_engine_error(e));
      probe_after_error(e, rr, s);
      rr->err = err;
      goto out_failed;
    }
    if (err == GS_ERANGE) /* a stop at a non-finite step: what it left */
      goto out_params;
    if (err)
      goto out;
    rr->steps = s + 1;
    if (res.skipped)
      rr->skipped_at = s + 1;
    if (res.period_changed && !rr->period_changed_at)
      rr->period_changed_at = s + 1;
    rr->period = res.bcast_period;
    if (res.lr_scale_changed && !rr->lr_changed_at)
      rr->lr_changed_at = s + 1;
    if (res.lr_scale_changed)
      __atomic_add_fetch(&rr->lr_changes, 1, __ATOMIC_SEQ_CST);
    rr->lr_scale = res.lr_scale;
    rr->lr_factor = gs_engine_lr_factor(e);
    if (sc->slow)
      usleep(2000);
    if (res.stop) {
      rr->stopped_at = s + 1;
      break;
    }
  }
  if (!err) /* decide late: the last step's verdict */
    err = gs_engine_drain(e, &res);
out_params:
  for (uint32_t p = 0; p < NPARAMS; p++)
    memcpy(rr->params[p], gs_engine_param(e, p), sizes[p] * sizeof(float));
  rr->nstate = gs_engine_state_count(e);
  if (sc->shard && err != GS_ERANGE)
    err = gs_engine_state_assemble(e, false);
  for (uint32_t k = 0; !err && k < rr->nstate && k < 2; k++)
    for (uint32_t p = 0; p < NPARAMS; p++)
      memcpy(rr->state[k][p], gs_engine_state(e, p, k), sizes[p] * sizeof(float));
  if (sc->shard && !err)
    err = gs_engine_state_release(e, false);
  rr->optim_steps = gs_engine_optim_steps(e);
  gs_engine_position(e, &rr->end);
out:
  rr->err = err;
  if (err)
    snprintf(rr->error, sizeof(rr->error), "%s", gs_engine_error(e));
out_failed:
  gs_engine_finish(e, err == 0, err ? rr->error : "done");
  gs_engine_free(e);
  gs_device_destroy(cfg.dev);
  return NULL;
}

static void run_ranks(scenario_t *sc)
{
  uint32_t n = sc->engine_ranks ? sc->engine_ranks : sc->world;

  for (uint32_t r = 0; r < n; r++) {
    sc->ranks[r].local_rank = r;
    sc->ranks[r].sc = sc;
    ck_assert_int_eq(pthread_create(&sc->ranks[r].thread, NULL, rank_main, &sc->ranks[r]), 0);
  }
}

/* Waits until every rank did `steps` steps; aborts the test if one failed
 * or TH_WAIT_MS passed. */
static void wait_min_step(scenario_t *sc, uint64_t steps)
{
  uint64_t deadline = gs_now_ms() + TH_WAIT_MS;

  while (min_step(sc) < steps) {
    for (uint32_t r = 0; r < sc->world; r++)
      ck_assert_msg(__atomic_load_n(&sc->ranks[r].err, __ATOMIC_SEQ_CST) == 0, "rank %u: %s", r,
                    sc->ranks[r].error);
    ck_assert_msg(gs_now_ms() < deadline, "the ranks did not reach step %llu",
                  (unsigned long long)steps);
    usleep(10000);
  }
}

static void join_ranks(scenario_t *sc)
{
  uint32_t n = sc->engine_ranks ? sc->engine_ranks : sc->world;

  for (uint32_t r = 0; r < n; r++)
    pthread_join(sc->ranks[r].thread, NULL);
  th_coord_stop(&sc->coord);
}

static void expect_ok(scenario_t *sc)
{
  for (uint32_t r = 0; r < sc->world; r++)
    ck_assert_msg(sc->ranks[r].err == 0, "rank %u: %s", r, sc->ranks[r].error);
}

static bool params_equal(const rank_run_t *a, const rank_run_t *b)
{
  for (uint32_t p = 0; p < NPARAMS; p++)
    if (memcmp(a->params[p], b->params[p], sizes[p] * sizeof(float)) != 0)
      return false;
  return true;
}

/* SGD by hand in double, the way PyTorch defines it, for one element;
 * step `skipped` (1-based; 0: none) not applied; each gradient as
 * `wire` rounds it (NULL: float32). */
static double reference_param(double p0, uint32_t p, uint32_t i, uint64_t steps, uint64_t skipped,
                              float (*wire)(float))
{
  double buf = 0, lr = 0.1, m = 0.9, wd = 5e-4, p_ = p0;
  bool first = true;

  for (uint64_t s = 0; s < steps; s++) {
    double d = (wire ? wire(grad_value(s, p, i)) : grad_value(s, p, i)) + wd * p_;

    if (s + 1 == skipped)
      continue;
    buf = first ? d : m * buf + d;
    first = false;
    p_ -= lr * buf;
  }
  return p_;
}

START_TEST(world1_sgd_matches_reference)
{
  scenario_t sc;

  scenario_init(&sc, "w1", 1);
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
  for (uint32_t p = 0; p < NPARAMS; p++)
    for (uint32_t i = 0; i < sizes[p]; i++) {
      double want = reference_param((p + 1) * 0.1 * i, p, i, sc.max_steps, 0, NULL);

      ck_assert_msg(fabs(sc.ranks[0].params[p][i] - want) < 1e-5, "p%u[%u] = %.7f, want %.7f", p, i,
                    sc.ranks[0].params[p][i], want);
    }
}
END_TEST

START_TEST(mean_over_ranks_equals_one_rank)
{
  scenario_t sc;

  scenario_init(&sc, "w3", 3);
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
  /* Every rank fed the same gradients, so the mean is that gradient, and the
   * initial broadcast made rank 0's params everyone's. */
  for (uint32_t r = 1; r < 3; r++)
    ck_assert_msg(params_equal(&sc.ranks[0], &sc.ranks[r]), "rank %u differs", r);
  for (uint32_t i = 0; i < sizes[0]; i++)
    ck_assert(fabs(sc.ranks[1].params[0][i] - reference_param(0.1 * i, 0, i, 20, 0, NULL)) < 1e-5);
}
END_TEST

/* Ranks > 0 perturb a param after the start: the period's broadcast must
 * make them equal again, and period -1 must leave them different. */
static void perturbed(int32_t period, uint64_t steps, bool expect_equal)
{
  scenario_t sc;

  scenario_init(&sc, "bcast", 2);
  sc.bcast_period = period;
  sc.perturb = true;
  sc.max_steps = steps;
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
  ck_assert_msg(params_equal(&sc.ranks[0], &sc.ranks[1]) == expect_equal,
                "period %d after %llu steps: params %s", period, (unsigned long long)steps,
                expect_equal ? "differ" : "are equal");
}

START_TEST(bcast_period_restores_equality)
{
  perturbed(4, 4, true);  /* the boundary at step 4 */
  perturbed(4, 3, false); /* not yet */
  perturbed(-1, 8, false);
  perturbed(0, 8, false); /* 0: only at the start */
}
END_TEST

START_TEST(control_takes_effect_at_the_same_step)
{
  scenario_t sc;
  char *body = NULL;
  int status;

  scenario_init(&sc, "ctl", 3);
  sc.max_steps = 100000;
  sc.slow = true;
  run_ranks(&sc);
  wait_min_step(&sc, 20);
  status = th_http(sc.coord.http_port, "POST", "/jobs/ctl/control", NULL, "{\"bcast_period\": 5}",
                   &body);
  free(body);
  ck_assert_int_eq(status, 200);
  wait_min_step(&sc, 60);
  status =
      th_http(sc.coord.http_port, "POST", "/jobs/ctl/control", NULL, "{\"lr_scale\": 0.25}", &body);
  free(body);
  ck_assert_int_eq(status, 200);
  wait_min_step(&sc, 100);
  status = th_http(sc.coord.http_port, "POST", "/jobs/ctl/control", NULL, "{\"action\": \"stop\"}",
                   &body);
  free(body);
  ck_assert_int_eq(status, 200);
  join_ranks(&sc);
  expect_ok(&sc);
  for (uint32_t r = 0; r < 3; r++) {
    ck_assert_int_eq(sc.ranks[r].period, 5);
    ck_assert_uint_gt(sc.ranks[r].period_changed_at, 20);
    ck_assert_uint_eq(sc.ranks[r].period_changed_at, sc.ranks[0].period_changed_at);
    ck_assert_uint_gt(sc.ranks[r].lr_changed_at, 60);
    ck_assert_uint_eq(sc.ranks[r].lr_changed_at, sc.ranks[0].lr_changed_at);
    ck_assert_float_eq(sc.ranks[r].lr_scale, 0.25f);
    ck_assert_float_eq(sc.ranks[r].lr_factor, 0.25f);
    ck_assert_uint_gt(sc.ranks[r].stopped_at, 100);
    ck_assert_uint_eq(sc.ranks[r].stopped_at, sc.ranks[0].stopped_at);
  }
}
END_TEST

/* The coordinator keeps soft state only: after it is killed and restarted
 * on the same port, the ranks' heartbeats re-register, training never
 * stops, an operator's lr scale set before is kept (the ranks report it),
 * and a directive posted to the new coordinator reaches every rank.
 * The ranks tolerate its silence for the heartbeat timeout, 10 s: a
 * restart on a loaded machine can take seconds. */
START_TEST(coordinator_restart_is_survived)
{
  scenario_t sc;
  char listen[32], *body = NULL;
  uint64_t resumed;
  int status = 0;

  scenario_init(&sc, "restart", 2);
  sc.max_steps = 1000000;
  sc.slow = true;
  run_ranks(&sc);
  wait_min_step(&sc, 20);
  status = th_http(sc.coord.http_port, "POST", "/jobs/restart/control", NULL, "{\"lr_scale\": 0.5}",
                   &body);
  free(body);
  body = NULL;
  ck_assert_int_eq(status, 200);
  status = 0;
  for (uint32_t r = 0; r < 2; r++)
    for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS;
         !__atomic_load_n(&sc.ranks[r].lr_changes, __ATOMIC_SEQ_CST);) {
      ck_assert_msg(gs_now_ms() < deadline, "rank %u never took the lr scale", r);
      usleep(10000);
    }
  th_coord_kill(&sc.coord);
  snprintf(listen, sizeof(listen), "127.0.0.1:%u", sc.coord.rpc_port);
  th_coord_start(&sc.coord, "--listen", listen, "--heartbeat-interval", "100ms",
                 "--heartbeat-timeout", "10s", "--log-level", "warn", NULL);
  resumed = min_step(&sc);
  /* 404 until a rank's heartbeat re-registered the job. */
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS; status != 200 && gs_now_ms() < deadline;) {
    usleep(50000);
    free(body);
    status = th_http(sc.coord.http_port, "POST", "/jobs/restart/control", NULL,
                     "{\"action\": \"stop\"}", &body);
  }
  free(body);
  ck_assert_int_eq(status, 200);
  ck_assert_int_eq(th_http(sc.coord.http_port, "GET", "/jobs/restart", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"lr_scale\":0.5"), "%s", body);
  free(body);
  join_ranks(&sc);
  expect_ok(&sc);
  ck_assert_uint_gt(sc.ranks[0].stopped_at, resumed);
  ck_assert_uint_eq(sc.ranks[0].stopped_at, sc.ranks[1].stopped_at);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_float_eq(sc.ranks[r].lr_factor, 0.5f);
    ck_assert_uint_eq(sc.ranks[r].lr_changes, 1); /* not set back to 1 by the restart */
  }
}
END_TEST

START_TEST(missing_gradient_is_named)
{
  scenario_t sc;

  scenario_init(&sc, "unused", 2);
  sc.skip_param_on_rank = 1;
  run_ranks(&sc);
  join_ranks(&sc);
  ck_assert_int_ne(sc.ranks[1].err, 0);
  ck_assert_msg(strstr(sc.ranks[1].error, "received no gradient ('p1')"), "%s", sc.ranks[1].error);
  ck_assert_int_ne(sc.ranks[0].err, 0); /* the other rank fails too, and does not hang */
}
END_TEST

START_TEST(nonfinite_loss_stops_every_rank)
{
  scenario_t sc;

  scenario_init(&sc, "nan", 3);
  sc.nan_rank = 2;
  sc.nan_step = 5;
  run_ranks(&sc);
  join_ranks(&sc);
  for (uint32_t r = 0; r < 3; r++) {
    ck_assert_int_eq(sc.ranks[r].err, GS_ERANGE);
    ck_assert_msg(strstr(sc.ranks[r].error, "step 6: the loss is NaN or infinite on rank(s) 2"),
                  "rank %u: %s", r, sc.ranks[r].error);
  }
}
END_TEST

/* A step the front end skips after synchronizing (a loss scaler's inf),
 * here with a NaN loss on rank 1 too: not applied, no stop whatever
 * cfg.nonfinite says, no optimizer step counted; training goes on as SGD
 * without that step. */
START_TEST(skipped_step_is_not_applied)
{
  scenario_t sc;

  scenario_init(&sc, "skip", 2);
  sc.skip_at = 6;
  sc.nan_rank = 1;
  sc.nan_step = 5;
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_uint_eq(sc.ranks[r].steps, sc.max_steps);
    ck_assert_uint_eq(sc.ranks[r].skipped_at, 6);
    ck_assert_uint_eq(sc.ranks[r].optim_steps, sc.max_steps - 1);
    for (uint32_t p = 0; p < NPARAMS; p++)
      for (uint32_t i = 0; i < sizes[p]; i++) {
        /* rank 0's start values: the others take them at sync_initial */
        double want = reference_param((p + 1) * 0.1 * i, p, i, sc.max_steps, 6, NULL);

        ck_assert_msg(fabs(sc.ranks[r].params[p][i] - want) < 1e-5,
                      "rank %u p%u[%u] = %.7f, want %.7f", r, p, i, sc.ranks[r].params[p][i], want);
      }
  }
}
END_TEST

/* The mean of three ranks' equal gradient g as it travels in bfloat16 or
 * float16: rounded, summed in rank order with a rounding per step (2g is
 * exact, 3g is not), then scaled by 1/3 in the update. */
static float mean3(float g, float (*widen)(uint16_t), uint16_t (*narrow)(float))
{
  float h = widen(narrow(g));

  return widen(narrow(widen(narrow(h + h)) + h)) * (1.0f / 3.0f);
}

static float mean3_bf16(float g)
{
  return mean3(g, gs_bf16_to_f32, gs_f32_to_bf16);
}

static float mean3_f16(float g)
{
  return mean3(g, gs_f16_to_f32, gs_f32_to_f16);
}

/* Gradients that travel in bfloat16 (_i 0) or float16 (_i 1), three ranks
 * with the same ones: every rank trains on the same rounded mean. The
 * control vector rides along in float32: its in-step counts (3 x the step
 * mod 256) would not survive 16 bits, and the ranks would fail the check. */
START_TEST(half_grads_travel_rounded)
{
  float (*wire)(float) = _i ? mean3_f16 : mean3_bf16;
  double apart = 0;
  scenario_t sc;

  scenario_init(&sc, _i ? "f16" : "bf16", 3);
  sc.grad_dtype = _i ? GS_GRAD_FP16 : GS_GRAD_BF16;
  sc.max_steps = 100; /* 3 x 87 needs 9 bits: bfloat16 would round the in-step counts */
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
  ck_assert(params_equal(&sc.ranks[0], &sc.ranks[1]) && params_equal(&sc.ranks[0], &sc.ranks[2]));
  for (uint32_t p = 0; p < NPARAMS; p++)
    for (uint32_t i = 0; i < sizes[p]; i++) {
      double want = reference_param((p + 1) * 0.1 * i, p, i, sc.max_steps, 0, wire),
             fp32 = reference_param((p + 1) * 0.1 * i, p, i, sc.max_steps, 0, NULL);

      ck_assert_msg(fabs(sc.ranks[0].params[p][i] - want) < 1e-6 * fmax(1.0, fabs(want)),
                    "p%u[%u] = %.9f, want %.9f", p, i, sc.ranks[0].params[p][i], want);
      apart = fmax(apart, fabs(want - fp32));
    }
  ck_assert_msg(apart > 4e-6, "no farther than %g from float32's: not rounded", apart);
}
END_TEST

/* gs_engine_broadcast: host bytes become the root's on every rank; a
 * root past the world is refused. */
START_TEST(bytes_broadcast_from_a_root)
{
  scenario_t sc;

  scenario_init(&sc, "bcast", 3);
  sc.bcast_bytes = true;
  sc.max_steps = 2;
  run_ranks(&sc);
  join_ranks(&sc);
  expect_ok(&sc);
}
END_TEST

START_TEST(checkpoint_resume_is_bit_identical)
{
  char dir[4096];
  scenario_t a, b;
  char cmd[4200];

  ts_mkdtemp(dir, sizeof(dir), "ckpt");
  scenario_init(&a, "ck", 2);
  a.checkpoint_dir = dir;
  a.checkpoint_every = 10;
  a.max_steps = 10;
  run_ranks(&a);
  join_ranks(&a);
  expect_ok(&a);
  scenario_init(&a, "ck", 2); /* the uninterrupted run to step 20, no checkpoints */
  a.max_steps = 20;
  run_ranks(&a);
  join_ranks(&a);
  expect_ok(&a);
  scenario_init(&b, "ck", 2);
  b.checkpoint_dir = dir;
  b.resume = true;
  b.max_steps = 20;
  run_ranks(&b);
  join_ranks(&b);
  expect_ok(&b);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_uint_eq(b.ranks[r].start.step, 10);
    ck_assert_msg(params_equal(&a.ranks[r], &b.ranks[r]), "rank %u: resumed params differ", r);
  }
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Ranks that report their gradients in different orders (forward,
 * backward, shuffled anew each step) issue the same collectives in the
 * same order, and end bit-identical to a run where every rank reports in
 * backward's order. Three packs, one parameter each. */
START_TEST(grad_order_does_not_matter)
{
  scenario_t a, b;

  scenario_init(&a, "order", 3);
  a.pack_threshold = 4;
  run_ranks(&a);
  join_ranks(&a);
  expect_ok(&a);
  ck_assert_uint_eq(a.ranks[0].packs, NPARAMS);
  scenario_init(&b, "order", 3);
  b.pack_threshold = 4;
  b.order = ORDER_MIXED;
  run_ranks(&b);
  join_ranks(&b);
  expect_ok(&b);
  for (uint32_t r = 0; r < 3; r++)
    ck_assert_msg(params_equal(&a.ranks[r], &b.ranks[r]), "rank %u: params differ", r);
  ck_assert(params_equal(&b.ranks[0], &b.ranks[2]));
}
END_TEST

/* After a failed step (rank 1: a missing gradient; rank 0: the allreduce
 * its peer never joined) each engine refuses another step, a checkpoint
 * and a metric sum, naming its first failure, instead of running
 * collectives the other ranks will never match. */
START_TEST(failure_is_sticky)
{
  char dir[4096];
  char cmd[4200];
  scenario_t sc;

  ts_mkdtemp(dir, sizeof(dir), "sticky");
  scenario_init(&sc, "sticky", 2);
  sc.skip_param_on_rank = 1;
  sc.probe_after_error = true;
  sc.checkpoint_dir = dir;
  run_ranks(&sc);
  join_ranks(&sc);
  ck_assert_msg(strstr(sc.ranks[1].error, "received no gradient ('p1')"), "%s", sc.ranks[1].error);
  for (uint32_t r = 0; r < 2; r++) {
    rank_run_t *rr = &sc.ranks[r];

    ck_assert_int_ne(rr->err, 0);
    ck_assert_int_eq(rr->step_err, rr->err);
    ck_assert_int_eq(rr->ckpt_err, rr->err);
    ck_assert_int_eq(rr->sum_err, rr->err);
    ck_assert_msg(
        strstr(rr->step_error, "step 2 refused: the engine stopped at an earlier failure"),
        "rank %u: %s", r, rr->step_error);
    ck_assert_msg(strstr(rr->step_error, rr->error), "rank %u: '%s' does not name '%s'", r,
                  rr->step_error, rr->error);
    ck_assert_msg(strstr(rr->ckpt_error, "checkpoint refused"), "rank %u: %s", r, rr->ckpt_error);
    ck_assert_msg(strstr(rr->sum_error, "allreduce of metrics refused"), "rank %u: %s", r,
                  rr->sum_error);
  }
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A rank built by hand from the engine's parts (client, heartbeat, host
 * comm) that joins like an engine and then takes `delay_ms` before it
 * connects to the ring: an NCCL init that takes seconds. With `fail` it
 * leaves with an error instead of connecting. */
typedef struct slow_rank {
  scenario_t *sc;
  uint32_t delay_ms;
  bool fail;
  pthread_t thread;
  int join_err, init_err;
  bool aborted; /* its heartbeat saw the generation aborted before it connected */
  char why[512];
  double left_at_ms; /* when it left with an error */
} slow_rank_t;

/* Its Join: what the engine sends for the same model. */
static gradsync_JoinRequest slow_rank_join(const scenario_t *sc, const char *comm_addr)
{
  gradsync_JoinRequest req = th_join_request(sc->job, sc->world, "node", sc->world - 1);
  gs_packs_t packs;

  gs_packs_init(&packs);
  for (uint32_t p = 0; p < NPARAMS; p++) {
    char name[16];

    snprintf(name, sizeof(name), "p%u", p);
    ck_assert_int_ge(gs_packs_register(&packs, name, sizes[p], p == 1), 0);
  }
  gs_packs_signature(&packs, &req.model_signature);
  gs_packs_free(&packs);
  snprintf(req.comm_addr, sizeof(req.comm_addr), "%s", comm_addr);
  req.peers = gradsync_PeerSet_PEERS_RING;
  req.bcast_period = sc->bcast_period;
  return req;
}

/* Connects to the ring as rank res->rank. */
static int slow_rank_connect(gs_comm_t *comm, const gs_join_result_t *res)
{
  const char *addrs[MAX_WORLD];
  gs_comm_setup_t setup = {.rank = res->rank,
                           .world_size = res->world_size,
                           .generation = res->generation,
                           .timeout_ms = TH_WAIT_MS,
                           .peer_addrs = addrs};

  for (uint32_t r = 0; r < res->world_size && r < MAX_WORLD; r++)
    addrs[res->peers[r].rank] = res->peers[r].comm_addr;
  return gs_comm_init(comm, &setup);
}

static void *slow_rank_main(void *arg)
{
  slow_rank_t *sr = arg;
  gs_client_config_t cc = {.port = sr->sc->coord.rpc_port, .job = sr->sc->job, .log = &quiet_log};
  gs_comm_t *comm = gs_comm_new("host", &quiet_log);
  gs_join_result_t res = {0};
  gradsync_JoinRequest req;
  gs_heartbeat_t *hb;
  gs_client_t *cl;
  char addr[256];

  snprintf(cc.host, sizeof(cc.host), "127.0.0.1");
  ck_assert_int_eq(
      gs_comm_listen(comm, &(gs_comm_endpoint_t){.bind = "127.0.0.1"}, addr, sizeof(addr)), 0);
  req = slow_rank_join(sr->sc, addr);
  cl = gs_client_new(&cc);
  sr->join_err = gs_client_join(cl, &req, TH_WAIT_MS, &res);
  ck_assert_msg(sr->join_err == 0, "join: %s", gs_client_error(cl));
  hb = gs_heartbeat_start(&(gs_heartbeat_config_t){.client = cc,
                                                   .generation = res.generation,
                                                   .rank = res.rank,
                                                   .interval_ms = res.heartbeat_interval_ms,
                                                   .timeout_ms = res.heartbeat_timeout_ms,
                                                   .session = res.session});
  ck_assert_ptr_nonnull(hb);
  usleep(sr->delay_ms * 1000);
  if (sr->fail) {
    sr->left_at_ms = gs_now_ms_f();
    ck_assert_int_eq(
        gs_client_leave(cl, res.generation, res.rank, false, "init failed on purpose", TH_WAIT_MS),
        0);
  } else {
    sr->aborted = gs_heartbeat_aborted(hb, sr->why, sizeof(sr->why));
    sr->init_err = slow_rank_connect(comm, &res);
    if (!sr->aborted)
      sr->aborted = gs_heartbeat_aborted(hb, sr->why, sizeof(sr->why));
    if (gs_client_leave(cl, res.generation, res.rank, true, "done", TH_WAIT_MS)) {
      /* The engines may have finished the job already: nothing to check. */
    }
  }
  gs_heartbeat_stop(hb);
  gs_comm_destroy(comm);
  gs_join_result_free(&res);
  gs_client_free(cl);
  return NULL;
}

/* World 3: two engines and a rank that connects 5 s after the Join, under
 * a coordinator that declares a rank lost after 2 s without a heartbeat
 * (one every 100 ms: a loaded machine does not starve a heartbeat thread
 * that long). The engines heartbeat while they wait in their connect, so
 * the generation is not aborted and every rank connects. */
START_TEST(heartbeat_runs_during_a_slow_init)
{
  slow_rank_t sr = {.delay_ms = 5000};
  scenario_t sc;

  memset(&sc, 0, sizeof(sc));
  snprintf(sc.job, sizeof(sc.job), "slowinit");
  sc.world = 3;
  sc.engine_ranks = 2;
  sc.start_only = true;
  sr.sc = &sc;
  th_coord_start(&sc.coord, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "2s",
                 "--log-level", "warn", NULL);
  ck_assert_int_eq(pthread_create(&sr.thread, NULL, slow_rank_main, &sr), 0);
  run_ranks(&sc);
  pthread_join(sr.thread, NULL);
  join_ranks(&sc);
  ck_assert_msg(!sr.aborted, "the generation was aborted while a rank initialised: %s", sr.why);
  ck_assert_int_eq(sr.init_err, 0);
  expect_ok(&sc);
  /* Their start began before the rendezvous, the slow rank's delay after it. */
  for (uint32_t r = 0; r < 2; r++)
    ck_assert_msg(sc.ranks[r].start_ms >= sr.delay_ms,
                  "rank %u started in %.0f ms, before the slow rank", r, sc.ranks[r].start_ms);
}
END_TEST

/* The same, but the slow rank fails its init and leaves: the coordinator
 * aborts the generation, and the engines waiting in their connect learn
 * it from their heartbeat and fail at once, naming the cause, instead of
 * waiting out their connect timeout (an hour: one that did would fail the
 * test at its check timeout). */
START_TEST(abort_reaches_a_rank_in_init)
{
  slow_rank_t sr = {.delay_ms = 500, .fail = true};
  scenario_t sc;

  memset(&sc, 0, sizeof(sc));
  snprintf(sc.job, sizeof(sc.job), "initabort");
  sc.world = 3;
  sc.engine_ranks = 2;
  sc.start_only = true;
  sc.comm_timeout_ms = 3600000;
  sr.sc = &sc;
  th_coord_start(&sc.coord, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "3s",
                 "--log-level", "warn", NULL);
  ck_assert_int_eq(pthread_create(&sr.thread, NULL, slow_rank_main, &sr), 0);
  run_ranks(&sc);
  pthread_join(sr.thread, NULL);
  join_ranks(&sc);
  for (uint32_t r = 0; r < 2; r++) {
    rank_run_t *rr = &sc.ranks[r];

    ck_assert_int_eq(rr->err, GS_EABORTED);
    ck_assert_msg(strstr(rr->error, "init failed on purpose"), "rank %u: %s", r, rr->error);
  }
}
END_TEST

/* Holds the thread it runs on (the checkpoint writer, sent SIGUSR1) until
 * the test releases it: a disk that takes seconds, made in-process. */
static volatile sig_atomic_t writer_held, writer_release;

static void hold_writer(int sig)
{
  const struct timespec ms = {0, 1000 * 1000};

  (void)sig;
  writer_held = 1;
  while (!writer_release)
    nanosleep(&ms, NULL);
}

/* The id of this process's thread named `name`, or 0. */
static pid_t thread_named(const char *name)
{
  char path[300], comm[32];
  struct dirent *de;
  pid_t tid = 0;
  DIR *d = opendir("/proc/self/task");

  while (d && !tid && (de = readdir(d))) {
    FILE *f;

    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
    if (de->d_name[0] == '.' || !(f = fopen(path, "r")))
      continue;
    if (fgets(comm, sizeof(comm), f) && !strncmp(comm, name, strlen(name)) &&
        comm[strlen(name)] == '\n')
      tid = (pid_t)atoi(de->d_name);
    fclose(f);
  }
  if (d)
    closedir(d);
  return tid;
}

/* Rank 0's checkpoint I/O does not count against the other ranks' comm
 * timeout: its writer thread is held (a signal handler that waits) from
 * before the first checkpoint, the ranks waiting at step 10 until it is;
 * both then step past the checkpoint (step 50) to their last step, and
 * the writer stays held for three comm timeouts more; released, it writes
 * the file, and rank 0's finish waits for it. The comm timeout is 2 s, one
 * that a loaded machine does not reach by starving a rank between steps. */
START_TEST(checkpoint_io_does_not_hold_the_other_ranks)
{
  char dir[4096], file[4200], cmd[4200];
  struct sigaction sa = {.sa_handler = hold_writer};
  scenario_t sc;
  pid_t tid = 0;

  ts_mkdtemp(dir, sizeof(dir), "slowckpt");
  snprintf(file, sizeof(file), "%s/ckpt-%012d.gsck", dir, 50);
  ck_assert_int_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  scenario_init(&sc, "slowck", 2);
  sc.checkpoint_dir = dir;
  sc.checkpoint_every = 50; /* one checkpoint: after step 50 */
  sc.max_steps = 51;
  sc.slow = true; /* 2 ms a step */
  sc.comm_timeout_ms = 3000;
  sc.gate_step = 10;
  run_ranks(&sc);
  /* The writer starts at the end of gs_engine_start and is held only once
   * both ranks wait at the gate, so idle in its wait for work: held as it
   * started, inside the sanitizer's thread set-up, it held the lock that
   * rank 1's heartbeat thread needed to start, and rank 1 was lost. Looked
   * for every millisecond, not in a spin: on a loaded machine a spinning
   * scan of /proc starved rank 0's first step past the comm timeout. */
  wait_min_step(&sc, sc.gate_step - 1);
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS; !tid && gs_now_ms() < deadline; usleep(1000))
    tid = thread_named("gs-ckpt");
  ck_assert_msg(tid > 0, "no checkpoint writer thread");
  ck_assert_int_eq(syscall(SYS_tgkill, getpid(), tid, SIGUSR1), 0);
  while (!writer_held)
    usleep(1000);
  __atomic_store_n(&sc.gate_open, 1, __ATOMIC_SEQ_CST);
  wait_min_step(&sc, 51);
  usleep(3 * 3000 * 1000); /* the hold itself: three comm timeouts */
  ck_assert_msg(access(file, F_OK) != 0, "the checkpoint was written before the writer was held");
  writer_release = 1;
  join_ranks(&sc);
  expect_ok(&sc); /* neither rank timed out while rank 0's write was held */
  for (uint32_t r = 0; r < 2; r++)
    ck_assert_uint_eq(sc.ranks[r].steps, 51);
  ck_assert_int_eq(access(file, F_OK), 0);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Runs `setup` twice, into `a` and into `b` (its run `vary`d too). */
static void run_pair(scenario_t *a, scenario_t *b, const char *job, uint32_t world,
                     void (*setup)(scenario_t *), void (*vary)(scenario_t *))
{
  char name[64];

  scenario_init(a, job, world);
  setup(a);
  run_ranks(a);
  join_ranks(a);
  snprintf(name, sizeof(name), "%s-b", job);
  scenario_init(b, name, world);
  setup(b);
  vary(b);
  run_ranks(b);
  join_ranks(b);
}

static void decide_late(scenario_t *sc)
{
  sc->decide = GS_DECIDE_LATE;
}

/* Runs `sc` twice, deciding now and late, into `now` and `late`. */
static void run_both(scenario_t *now, scenario_t *late, const char *job, uint32_t world,
                     void (*setup)(scenario_t *))
{
  run_pair(now, late, job, world, setup, decide_late);
}

static void with_broadcasts(scenario_t *sc)
{
  sc->bcast_period = 4; /* a step that must act decides on itself too */
}

/* Late decisions change when the host learns of a step, not what the
 * device computes: a steady run ends with the same bytes. */
START_TEST(late_decisions_match_now)
{
  static scenario_t now, late;

  run_both(&now, &late, "late", 2, with_broadcasts);
  expect_ok(&now);
  expect_ok(&late);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_msg(params_equal(&now.ranks[r], &late.ranks[r]), "rank %u", r);
    ck_assert_uint_eq(late.ranks[r].optim_steps, now.ranks[r].optim_steps);
    ck_assert_uint_eq(late.ranks[r].end.step, now.ranks[r].end.step);
  }
}
END_TEST

static void nan_loss(scenario_t *sc)
{
  sc->nan_rank = 1;
  sc->nan_step = 5;
}

static void nan_grad(scenario_t *sc)
{
  nan_loss(sc);
  sc->nan_grad = true;
}

/* Stops at step 6, decided late: every rank stops a step later, at the
 * state and position decided now gives, with the same words. A NaN loss
 * (its gradients finite): step 6 is applied, step 7's update never
 * queued. A NaN gradient: step 6 is skipped on the device, step 7's never
 * queued; both stop at step 5's state. */
START_TEST(late_nonfinite_stop_comes_a_step_later)
{
  static const struct {
    void (*setup)(scenario_t *);
    const char *words;
    uint64_t end;
  } cases[] = {
      {nan_loss, "step 6: the loss is NaN or infinite on rank(s) 1", 6},
      {nan_grad, "step 6: the summed gradients hold NaN or infinity", 5},
  };
  static scenario_t now, late;

  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    run_both(&now, &late, c ? "latenangrad" : "latenan", 2, cases[c].setup);
    for (uint32_t r = 0; r < 2; r++) {
      ck_assert_int_eq(now.ranks[r].err, GS_ERANGE);
      ck_assert_int_eq(late.ranks[r].err, GS_ERANGE);
      ck_assert_msg(strstr(now.ranks[r].error, cases[c].words), "rank %u: %s", r,
                    now.ranks[r].error);
      ck_assert_msg(strstr(late.ranks[r].error, cases[c].words), "rank %u: %s", r,
                    late.ranks[r].error);
      ck_assert_uint_eq(now.ranks[r].steps, 5);  /* step 6 failed */
      ck_assert_uint_eq(late.ranks[r].steps, 6); /* step 7 failed: it said what became of 6 */
      ck_assert_msg(params_equal(&now.ranks[r], &late.ranks[r]), "case %zu rank %u", c, r);
      ck_assert_uint_eq(now.ranks[r].end.step, cases[c].end);
      ck_assert_uint_eq(late.ranks[r].end.step, cases[c].end);
      ck_assert_uint_eq(late.ranks[r].optim_steps, now.ranks[r].optim_steps);
    }
  }
}
END_TEST

static void adam_skip(scenario_t *sc)
{
  nan_grad(sc);
  sc->adam = true;
  sc->nonfinite = GS_NONFINITE_SKIP;
}

/* nonfinite skip under Adam, decided late: the skipped step is learnt a
 * step later, but before that step's update is queued, so its bias
 * correction counts the updates applied, as decided now: the same bytes. */
START_TEST(late_skip_keeps_the_update_count)
{
  static scenario_t now, late;

  run_both(&now, &late, "lateskip", 2, adam_skip);
  expect_ok(&now);
  expect_ok(&late);
  for (uint32_t r = 0; r < 2; r++) {
    ck_assert_uint_eq(now.ranks[r].skipped_at, 6);
    ck_assert_uint_eq(late.ranks[r].skipped_at, 7);
    ck_assert_uint_eq(now.ranks[r].optim_steps, now.max_steps - 1);
    ck_assert_uint_eq(late.ranks[r].optim_steps, now.ranks[r].optim_steps);
    ck_assert_msg(params_equal(&now.ranks[r], &late.ranks[r]), "rank %u", r);
  }
}
END_TEST

/* ---- sharded optimizer state ------------------------------------------ */

static void shard_on(scenario_t *sc)
{
  sc->shard = true;
}

static void sgd_broadcasts(scenario_t *sc)
{
  sc->bcast_period = 4;
}

static void sgd_bf16(scenario_t *sc)
{
  sc->grad_dtype = GS_GRAD_BF16;
}

static void sgd_late(scenario_t *sc)
{
  sc->decide = GS_DECIDE_LATE;
}

static void sgd_synchronized_skip(scenario_t *sc)
{
  sc->skip_at = 7; /* synchronized (its grads scaled in place), then skipped */
}

static void adam_plain(scenario_t *sc)
{
  sc->adam = true;
}

/* The whole file's bytes (a checkpoint), malloc'd; its length in *len. */
static uint8_t *file_bytes(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  uint8_t *b = malloc(1 << 16);

  ck_assert_msg(f && b, "%s: cannot read", path);
  *len = fread(b, 1, 1 << 16, f);
  ck_assert_msg(*len < (1 << 16), "%s: larger than the test's checkpoints", path);
  fclose(f);
  return b;
}

/* Sharded against unsharded, every rank with its own gradients, at
 * worlds 2, 3 and 4 (shards of 7 and 13 elements: uneven, at 4 one
 * short): the params and the optimizer state (assembled from the shards)
 * on every rank, and the last checkpoints (a sharded job's assembled
 * from the shards), are the same bytes; so are the updates counted. _i:
 * the world and the case. */
static void (*const shard_cases[])(scenario_t *) = {
    sgd_broadcasts, adam_plain, adam_skip, sgd_bf16, sgd_late, sgd_synchronized_skip,
};
#define SHARD_CASES (sizeof(shard_cases) / sizeof(shard_cases[0]))

START_TEST(sharded_state_matches_unsharded)
{
  uint32_t world = 2 + (uint32_t)_i / SHARD_CASES;
  size_t c = (size_t)_i % SHARD_CASES;
  static scenario_t plain, shard;
  char dirs[2][4096], job[64], path[2][4200], cmd[8400];
  uint8_t *bytes[2];
  size_t len[2];

  ts_mkdtemp(dirs[0], sizeof(dirs[0]), "plain");
  ts_mkdtemp(dirs[1], sizeof(dirs[1]), "shard");
  snprintf(job, sizeof(job), "shard%u-%zu", world, c);
  scenario_init(&plain, job, world);
  shard_cases[c](&plain);
  plain.grads_by_rank = true;
  plain.checkpoint_dir = dirs[0];
  run_ranks(&plain);
  join_ranks(&plain);
  scenario_init(&shard, job, world);
  shard_cases[c](&shard);
  shard_on(&shard);
  shard.grads_by_rank = true;
  shard.checkpoint_dir = dirs[1];
  run_ranks(&shard);
  join_ranks(&shard);
  expect_ok(&plain);
  expect_ok(&shard);
  for (uint32_t r = 0; r < world; r++) {
    const rank_run_t *a = &plain.ranks[r], *b = &shard.ranks[r];

    ck_assert_msg(params_equal(&shard.ranks[0], b), "rank %u differs from rank 0", r);
    ck_assert_uint_eq(b->nstate, a->nstate);
    ck_assert_msg(params_equal(a, b), "world %u case %zu rank %u: params differ", world, c, r);
    for (uint32_t p = 0; p < NPARAMS; p++)
      for (uint32_t k = 0; k < a->nstate; k++)
        ck_assert_msg(memcmp(a->state[k][p], b->state[k][p], sizes[p] * sizeof(float)) == 0,
                      "world %u case %zu rank %u: state %u of param %u differs", world, c, r, k, p);
    ck_assert_uint_eq(b->optim_steps, a->optim_steps);
    ck_assert_uint_eq(b->end.step, a->end.step);
  }
  for (int k = 0; k < 2; k++) {
    snprintf(path[k], sizeof(path[k]), "%s/ckpt-%012llu.gsck", dirs[k],
             (unsigned long long)plain.ranks[0].end.step);
    bytes[k] = file_bytes(path[k], &len[k]);
  }
  ck_assert_msg(len[0] == len[1] && memcmp(bytes[0], bytes[1], len[0]) == 0,
                "world %u case %zu: the sharded job's checkpoint differs from the unsharded's",
                world, c);
  for (int k = 0; k < 2; k++) {
    free(bytes[k]);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dirs[k]);
    ck_assert_int_eq(system(cmd), 0);
  }
}
END_TEST

/* A sharded job's checkpoint (written at world 3) resumed sharded at
 * world 2 and unsharded at world 2: both go on as the uninterrupted
 * unsharded run at world 2 does (every rank with the same gradients, so
 * the mean is the same at any world), within float32 rounding of the
 * means. */
START_TEST(sharded_checkpoint_resumes_at_another_world)
{
  char dir[4096], cmd[4200];
  static scenario_t a, b;

  ts_mkdtemp(dir, sizeof(dir), "reshard");
  scenario_init(&a, "reshard", 3);
  a.shard = true;
  a.checkpoint_dir = dir;
  a.max_steps = 10;
  run_ranks(&a);
  join_ranks(&a);
  expect_ok(&a);
  scenario_init(&a, "reshard", 2); /* the uninterrupted run */
  run_ranks(&a);
  join_ranks(&a);
  expect_ok(&a);
  for (int sharded = 0; sharded < 2; sharded++) {
    scenario_init(&b, "reshard", 2);
    b.shard = sharded;
    b.checkpoint_dir = dir;
    b.resume = true;
    run_ranks(&b);
    join_ranks(&b);
    expect_ok(&b);
    for (uint32_t r = 0; r < 2; r++) {
      ck_assert_uint_eq(b.ranks[r].start.step, 10);
      for (uint32_t p = 0; p < NPARAMS; p++)
        for (uint32_t i = 0; i < sizes[p]; i++) {
          double want = a.ranks[r].params[p][i], got = b.ranks[r].params[p][i];

          ck_assert_msg(fabs(got - want) <= 1e-6 * fmax(1.0, fabs(want)),
                        "sharded %d rank %u p%u[%u] = %.9g, want %.9g", sharded, r, p, i, got,
                        want);
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -f %s/ckpt-000000000020.gsck", dir); /* resume from 10 again */
    ck_assert_int_eq(system(cmd), 0);
  }
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *engine_suite(void)
{
  Suite *s = suite_create("engine");
  TCase *tc;

#define ADD(name)                                                                                  \
  tc = tcase_create(#name);                                                                        \
  tcase_set_timeout(tc, 60);                                                                       \
  tcase_add_test(tc, name);                                                                        \
  suite_add_tcase(s, tc)
  ADD(world1_sgd_matches_reference);
  ADD(mean_over_ranks_equals_one_rank);
  ADD(bcast_period_restores_equality);
  ADD(control_takes_effect_at_the_same_step);
  ADD(missing_gradient_is_named);
  ADD(nonfinite_loss_stops_every_rank);
  ADD(skipped_step_is_not_applied);
  ADD(late_decisions_match_now);
  ADD(late_nonfinite_stop_comes_a_step_later);
  ADD(late_skip_keeps_the_update_count);
  ADD(bytes_broadcast_from_a_root);
  tc = tcase_create("half_grads_travel_rounded");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, half_grads_travel_rounded, 0, 2);
  suite_add_tcase(s, tc);
  ADD(checkpoint_resume_is_bit_identical);
  ADD(grad_order_does_not_matter);
  tc = tcase_create("sharded_state_matches_unsharded");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, sharded_state_matches_unsharded, 0, 3 * SHARD_CASES);
  suite_add_tcase(s, tc);
  ADD(sharded_checkpoint_resumes_at_another_world);
  return s;
}

/* What the ranks survive, or how they end, when something else fails or
 * stalls: the coordinator restarting, a failed step, a slow init, an abort
 * in init, rank 0's checkpoint I/O held (its own ctest: these wait out
 * heartbeat and comm timeouts). */
static Suite *engine_faults_suite(void)
{
  const gs_test_case_t cases[] = {
      {"coordinator_restart_is_survived", coordinator_restart_is_survived},
      {"failure_is_sticky", failure_is_sticky},
      {"heartbeat_runs_during_a_slow_init", heartbeat_runs_during_a_slow_init},
      {"abort_reaches_a_rank_in_init", abort_reaches_a_rank_in_init},
      {"checkpoint_io_does_not_hold_the_other_ranks", checkpoint_io_does_not_hold_the_other_ranks},
  };

  return GS_TEST_SUITE_OF("engine_faults", cases, 60, NULL, NULL);
}

const gs_test_binary_t gs_test_binary = {.suites = {engine_suite, engine_faults_suite},
                                         .scratch = "test_engine"};
