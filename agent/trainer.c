/* The reference trainer: an MLP on Fashion-MNIST through the sync engine. */
#include "trainer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idx.h"
#include "mlp.h"
#include "sampler.h"

typedef struct trainer {
  const gs_trainer_config_t *cfg;
  const gs_log_t *log;
  const char *job;
  gs_dataset_t train, test;
  gs_mlp_t *mlp;
  gs_engine_t *engine;
  gs_sampler_t sampler;
  float *xb;
  uint8_t *yb;
  uint32_t rank, world;
  uint64_t steps_per_epoch, total_steps;
  /* Progress since the last line. */
  double start_ms, window_ms, window_comm_ms, last_line_ms;
  uint64_t window_steps;
  float last_loss;
} trainer_t;

static double now_ms(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Copies the examples `idx` into one contiguous batch. */
static void gather(trainer_t *t, const gs_dataset_t *ds, const uint32_t *idx, uint32_t n)
{
  for (uint32_t i = 0; i < n; i++) {
    memcpy(t->xb + (size_t)i * ds->features, ds->x + (size_t)idx[i] * ds->features,
           ds->features * sizeof(float));
    t->yb[i] = ds->y[idx[i]];
  }
}

/* One training step: forward, backward with each gradient handed to the
 * engine as it is ready (its pack's allreduce overlaps the rest of
 * backward), then the engine's per-pack SGD and control decisions. */
static int train_step(trainer_t *t, uint32_t step_in_epoch, const gs_position_t *after,
                      gs_step_result_t *res)
{
  const uint32_t *idx = gs_sampler_batch(&t->sampler, step_in_epoch);
  float loss;

  gather(t, &t->train, idx, t->cfg->batch);
  loss = gs_mlp_forward(t->mlp, t->xb, t->yb, t->cfg->batch, NULL);
  gs_engine_begin_step(t->engine, loss, after);
  gs_mlp_backward(t->mlp, t->xb, gs_engine_grad_ready, t->engine);
  t->last_loss = loss;
  return gs_engine_end_step(t->engine, res);
}

/* One validation step: forward only over `n` examples; adds the summed
 * loss and the correct count to sums[0] and sums[1]. */
static void val_step(trainer_t *t, const gs_dataset_t *ds, const uint32_t *idx, uint32_t n,
                     float sums[3])
{
  uint32_t correct = 0;
  float loss;

  gather(t, ds, idx, n);
  loss = gs_mlp_forward(t->mlp, t->xb, t->yb, n, &correct);
  sums[0] += loss * n;
  sums[1] += correct;
  sums[2] += n;
}

/* Evaluates on the test split, rank r taking examples r, r+W, ...; the
 * sums are then added across ranks so every rank knows the accuracy. */
static int evaluate(trainer_t *t, float *accuracy, float *loss)
{
  uint32_t idx[4096], n = 0, cap = t->cfg->batch < 4096 ? t->cfg->batch : 4096;
  float sums[3] = {0, 0, 0};
  int err;

  for (uint32_t i = t->rank; i < t->test.count; i += t->world) {
    idx[n++] = i;
    if (n == cap) {
      val_step(t, &t->test, idx, n, sums);
      n = 0;
    }
  }
  if (n)
    val_step(t, &t->test, idx, n, sums);
  err = gs_engine_allreduce_sum(t->engine, sums, 3);
  if (err)
    return err;
  *accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  return 0;
}

/* Prints a progress line (rank 0) and reports to the coordinator. */
static void progress(trainer_t *t, uint64_t step, uint64_t epoch, bool force)
{
  double now = now_ms(), dt = now - t->last_line_ms;
  double sps = dt > 0 ? t->window_steps * (double)t->cfg->batch * t->world * 1e3 / dt : 0;
  double comm_pct = t->window_ms > 0 ? 100.0 * t->window_comm_ms / t->window_ms : 0;
  gs_progress_t p = {
      .step = step,
      .loss = t->last_loss,
      .samples_per_sec = (float)sps,
      .compute_ms =
          t->window_steps ? (float)((t->window_ms - t->window_comm_ms) / t->window_steps) : 0,
      .comm_wait_ms = t->window_steps ? (float)(t->window_comm_ms / t->window_steps) : 0,
  };

  gs_engine_report(t->engine, &p);
  if (!force && dt < (double)t->cfg->log_interval_ms)
    return;
  if (t->rank == 0 && t->window_steps)
    printf("step %" PRIu64 "/%" PRIu64 " epoch %" PRIu64 " loss %.4f samples/s %.0f "
           "comm-wait %.1f%%\n",
           step, t->total_steps, epoch + 1, t->last_loss, sps, comm_pct);
  fflush(stdout);
  t->last_line_ms = now;
  t->window_ms = t->window_comm_ms = 0;
  t->window_steps = 0;
}

static int load_data(trainer_t *t)
{
  char why[1024];

  if (gs_dataset_load(t->cfg->data_dir, "train", &t->train, why, sizeof(why)) ||
      gs_dataset_load(t->cfg->data_dir, "t10k", &t->test, why, sizeof(why))) {
    fprintf(stderr, "gradsync-agent: error: %s\n", why);
    return GS_EINVAL;
  }
  if (t->train.features != t->cfg->layers[0] || t->test.features != t->cfg->layers[0] ||
      t->train.classes > t->cfg->layers[t->cfg->nlayers - 1]) {
    fprintf(stderr,
            "gradsync-agent: error: --layers %u,...,%u does not fit the data in %s "
            "(%u features, %u classes)\n",
            t->cfg->layers[0], t->cfg->layers[t->cfg->nlayers - 1], t->cfg->data_dir,
            t->train.features, t->train.classes);
    return GS_EINVAL;
  }
  return 0;
}

/* Builds the model on the engine's packs: register, start (join + packs),
 * bind the views, initialise from the seed, then agree on a start state. */
static int setup(trainer_t *t, gs_position_t *pos)
{
  const gs_trainer_config_t *c = t->cfg;
  uint32_t eval_batch = c->batch > 4096 ? c->batch : 4096;
  char why[512];
  int err;

  gs_engine_config_t ec = c->engine;

  /* A cosine schedule over epochs needs the step count, known once the data is. */
  if (ec.sgd.schedule == GS_LR_COSINE && ec.sgd.total_steps == 0)
    ec.sgd.total_steps =
        c->steps ? c->steps : c->epochs * (t->train.count / (c->batch * ec.world_size));
  t->mlp = gs_mlp_new(c->layers, c->nlayers, eval_batch, why, sizeof(why));
  t->engine = gs_engine_new(&ec);
  t->xb = malloc((size_t)eval_batch * c->layers[0] * sizeof(float));
  t->yb = malloc(eval_batch);
  if (!t->mlp || !t->engine || !t->xb || !t->yb) {
    fprintf(stderr, "gradsync-agent: error: %s\n", t->mlp ? "out of memory" : why);
    return GS_ENOMEM;
  }
  for (uint32_t i = 0; i < gs_mlp_param_count(t->mlp); i++) {
    gs_param_desc_t d = gs_mlp_param_desc(t->mlp, i);

    if (gs_engine_register(t->engine, d.name, d.elements, gs_mlp_param_is_bias(t->mlp, i)) < 0)
      return GS_EINVAL;
  }
  err = gs_engine_start(t->engine);
  if (err)
    return err;
  t->rank = gs_engine_rank(t->engine);
  t->world = gs_engine_world_size(t->engine);
  for (uint32_t i = 0; i < gs_mlp_param_count(t->mlp); i++)
    gs_mlp_bind(t->mlp, i, gs_engine_param(t->engine, i), gs_engine_grad(t->engine, i));
  gs_mlp_init_params(t->mlp, c->seed);
  err = gs_sampler_init(&t->sampler, t->train.count, c->batch, t->rank, t->world, c->seed,
                        c->shuffle);
  if (err) {
    fprintf(stderr,
            "gradsync-agent: error: --batch %u on %u ranks needs %u training examples per "
            "step; %s has %u\n",
            c->batch, t->world, c->batch * t->world, c->data_dir, t->train.count);
    return err;
  }
  t->steps_per_epoch = gs_sampler_steps_per_epoch(&t->sampler);
  t->total_steps = c->steps ? c->steps : c->epochs * t->steps_per_epoch;
  *pos = (gs_position_t){0, 0, c->seed};
  return gs_engine_sync_initial(t->engine, pos);
}

static int validate(trainer_t *t, uint64_t epoch)
{
  float acc, loss;
  int err = evaluate(t, &acc, &loss);

  if (!err && t->rank == 0)
    printf("epoch %" PRIu64 " validation: accuracy %.4f loss %.4f (%u test examples)\n", epoch, acc,
           loss, t->test.count);
  return err;
}

/* The training loop, from `pos` to the last step or a stop; *done gets
 * the steps completed. */
static int train(trainer_t *t, gs_position_t pos, uint64_t *done)
{
  gs_step_result_t res;
  int err;

  t->start_ms = t->last_line_ms = now_ms();
  for (uint64_t s = pos.step; s < t->total_steps; s++) {
    uint64_t epoch = s / t->steps_per_epoch;
    gs_position_t after = {s + 1, (s + 1) / t->steps_per_epoch, t->cfg->seed};
    double t0 = now_ms();

    gs_sampler_set_epoch(&t->sampler, epoch);
    err = train_step(t, (uint32_t)(s % t->steps_per_epoch), &after, &res);
    if (err)
      return err;
    *done = s + 1;
    t->window_ms += now_ms() - t0;
    t->window_comm_ms += res.comm_wait_ms;
    t->window_steps++;
    progress(t, s + 1, epoch, false);
    if (res.stop) {
      if (t->rank == 0)
        printf("stopped after step %" PRIu64 ": %s\n", s + 1, res.stop_reason);
      return 0;
    }
    if (t->cfg->validate && (s + 1) % t->steps_per_epoch == 0) {
      err = validate(t, epoch + 1);
      if (err)
        return err;
    }
  }
  progress(t, t->total_steps, (t->total_steps - 1) / t->steps_per_epoch, true);
  return 0;
}

static void summary(trainer_t *t, uint64_t first_step, uint64_t last_step)
{
  double secs = (now_ms() - t->start_ms) / 1e3;
  double samples = (double)(last_step - first_step) * t->cfg->batch * t->world;
  float acc = 0, loss = 0;

  if (evaluate(t, &acc, &loss))
    return;
  if (t->rank == 0)
    printf("final: test accuracy %.4f, test loss %.4f, %.0f samples/s over %u ranks, %.1f s\n", acc,
           loss, secs > 0 ? samples / secs : 0, t->world, secs);
}

static void trainer_free(trainer_t *t)
{
  gs_engine_free(t->engine);
  gs_mlp_free(t->mlp);
  gs_sampler_free(&t->sampler);
  gs_dataset_free(&t->train);
  gs_dataset_free(&t->test);
  free(t->xb);
  free(t->yb);
}

int gs_trainer_run(const gs_trainer_config_t *cfg)
{
  trainer_t t = {.cfg = cfg, .log = cfg->engine.log, .job = cfg->engine.coord.job};
  gs_position_t pos;
  int err;

  err = load_data(&t);
  if (!err)
    err = setup(&t, &pos);
  if (!err) {
    if (pos.step && t.rank == 0)
      printf("resumed at step %" PRIu64 " (epoch %" PRIu64 ")\n", pos.step, pos.epoch + 1);
    uint64_t done = pos.step;

    err = train(&t, pos, &done);
    if (!err)
      summary(&t, pos.step, done);
  }
  if (err && t.engine)
    fprintf(stderr, "gradsync-agent: error: %s\n", gs_engine_error(t.engine));
  fflush(stdout);
  if (t.engine)
    gs_engine_finish(t.engine, err == 0, err ? gs_engine_error(t.engine) : "finished");
  trainer_free(&t);
  return err;
}
