/* The reference trainer: an MLP on Fashion-MNIST through the sync engine. */
#include "trainer.h"

#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "device_choice.h"
#include "idx.h"
#include "mlp.h"
#include "safetensors.h"
#include "sampler.h"
#include "clock.h"

/* A batch on its way to the device: its images' bytes and labels gathered
 * into pinned host memory, copied asynchronously (on the CPU device host
 * and device buffers are the same), and scaled there into the model's
 * inputs x. */
typedef struct batch_slot {
  uint8_t *px_host, *px;
  uint8_t *y_host, *y;
  float *x;
  int64_t step; /* the training step it holds, or -1 */
} batch_slot_t;

typedef struct trainer {
  const gs_trainer_config_t *cfg;
  const gs_log_t *log;
  const char *job;
  gs_dataset_t train, test;
  gs_device_t *dev;
  gs_mlp_t *mlp;
  gs_engine_t *engine;
  gs_sampler_t sampler;
  batch_slot_t slot[2]; /* double buffering: the next batch loads while this one computes */
  uint32_t rank, world;
  uint64_t steps_per_epoch, total_steps;
  /* Progress since the last line. */
  double start_ms, window_ms, window_comm_ms, last_line_ms;
  uint64_t window_steps;
  float last_loss;
  float *loss_host; /* pinned: the step's loss sum and hits, fetched without a wait */
  /* Where the time of a step goes, summed over the timed steps. */
  double sum_step_ms, sum_data_ms, sum_comm_ms, sum_opt_ms;
  uint64_t timed_steps, sum_device_waits, sum_comm_waits;
  bool reported;          /* an error was printed: the engine's "no error" need not follow */
  char reported_why[512]; /* what it said, for the coordinator (the Leave's reason) */
} trainer_t;

#define UNTIMED_STEPS 10 /* warm-up steps left out of the timing summary */

/* Prints an error the trainer found itself ("gradsync-agent: error: ..."),
 * so that the engine's error is not printed after it. */
__attribute__((format(printf, 2, 3))) static void report(trainer_t *t, const char *fmt, ...)
{
  va_list ap;

  fputs("gradsync-agent: error: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  va_start(ap, fmt);
  vsnprintf(t->reported_why, sizeof(t->reported_why), fmt, ap);
  va_end(ap);
  t->reported_why[strcspn(t->reported_why, "\n")] = '\0';
  t->reported = true;
}

/* Copies the examples `idx` into slot's host buffers, queues their copy to
 * the device and the scaling of the pixels into the model's inputs. */
static int load_batch(trainer_t *t, batch_slot_t *b, const gs_dataset_t *ds, const uint32_t *idx,
                      uint32_t n)
{
  size_t row = ds->features;
  int err;

  for (uint32_t i = 0; i < n; i++) {
    memcpy(b->px_host + (size_t)i * row, ds->pixels + (size_t)idx[i] * row, row);
    b->y_host[i] = ds->y[idx[i]];
  }
  err = gs_device_upload(t->dev, b->px, b->px_host, n * row);
  if (!err)
    err = gs_device_upload(t->dev, b->y, b->y_host, n);
  if (!err)
    gs_mlp_inputs_from_pixels(t->mlp, b->px, b->x, n * row);
  return err;
}

/* Loads the batch of training step s, at position `at`, into slot s % 2
 * (unless it is there). */
static int load_train_batch(trainer_t *t, uint64_t s, const gs_position_t *at)
{
  batch_slot_t *b = &t->slot[s % 2];
  const uint32_t *idx;
  int err;

  if (b->step == (int64_t)s)
    return 0;
  gs_sampler_set_epoch(&t->sampler, at->epoch);
  idx = gs_sampler_batch_at(&t->sampler, at->sample);
  b->step = -1;
  if (!idx)
    return GS_ERANGE;
  err = load_batch(t, b, &t->train, idx, t->cfg->batch);
  if (!err)
    b->step = (int64_t)s;
  return err;
}

/* Whether training is over at `pos`: --steps steps, or --epochs epochs. */
static bool finished(const trainer_t *t, const gs_position_t *pos)
{
  return t->cfg->steps ? pos->step >= t->cfg->steps : pos->epoch >= t->cfg->epochs;
}

/* The position after one step from `pos`: the next global batch of the
 * epoch, or the next epoch when no whole one is left in this. */
static gs_position_t advance(const trainer_t *t, const gs_position_t *pos)
{
  uint64_t global = (uint64_t)t->cfg->batch * t->world;
  gs_position_t after = {pos->step + 1, pos->epoch, t->cfg->seed, pos->sample + global};

  if (after.sample + global > t->train.count) {
    after.epoch++;
    after.sample = 0;
  }
  return after;
}

/* One training step from `at`: forward, backward with each gradient handed
 * to the engine as it is ready (its pack's allreduce overlaps the rest of
 * backward), the next batch loaded while the device runs backward, then
 * the engine's per-pack SGD and control decisions. */
static int train_step(trainer_t *t, const gs_position_t *at, const gs_position_t *after,
                      gs_step_result_t *res, double *data_ms)
{
  uint64_t s = at->step;
  batch_slot_t *b = &t->slot[s % 2];
  double t0 = gs_now_ms_f(), t1;
  const float *stats;
  int err;

  gs_engine_phase(t->engine, GS_PHASE_DATA);
  gs_fault_data(&t->cfg->fault, t->rank, s, t->cfg->engine.term_flag);
  err = load_train_batch(t, s, at);
  *data_ms = gs_now_ms_f() - t0;
  if (err) {
    report(t, "cannot copy a batch to %s\n", t->dev->label);
    return err;
  }
  gs_engine_phase(t->engine, GS_PHASE_COMPUTE);
  t1 = gs_now_ms_f();
  /* The loss is never waited for: its verdict is taken on the device,
   * and its value comes back with the step's copies (end_step). */
  stats = gs_mlp_forward_queued(t->mlp, b->x, b->y, t->cfg->batch);
  if (stats && gs_device_fetch(t->dev, t->loss_host, stats, 2 * sizeof(float)))
    stats = NULL;
  gs_engine_begin_step(t->engine, stats ? 0.0f : NAN, after);
  if (stats)
    gs_engine_set_loss_at(t->engine, stats);
  gs_mlp_backward(t->mlp, b->x, gs_engine_grad_ready, t->engine);
  gs_fault_compute(&t->cfg->fault, t->rank, gs_now_ms_f() - t1);
  if (!finished(t, after)) {
    t0 = gs_now_ms_f();
    err = load_train_batch(t, s + 1, after);
    *data_ms += gs_now_ms_f() - t0;
    if (err)
      t->slot[(s + 1) % 2].step = -1; /* retried (and reported) at the next step */
  }
  err = gs_engine_end_step(t->engine, res);
  t->last_loss = stats ? t->loss_host[0] / (float)t->cfg->batch : NAN;
  return err;
}

/* Steps in an epoch at the current world, and the estimate of the run's
 * total from `pos` (exact unless the world changes again). */
static void count_steps(trainer_t *t, const gs_position_t *pos)
{
  uint64_t global = (uint64_t)t->cfg->batch * t->world;
  uint64_t left_in_epoch = (t->train.count - pos->sample) / global;

  t->steps_per_epoch = gs_sampler_steps_per_epoch(&t->sampler);
  t->total_steps =
      t->cfg->steps ? t->cfg->steps
      : pos->epoch >= t->cfg->epochs
          ? pos->step
          : pos->step + left_in_epoch + (t->cfg->epochs - pos->epoch - 1) * t->steps_per_epoch;
}

/* The engine regrouped (elastic): this rank's place in the new world and
 * its share of the data from where the epoch stands. */
static int follow_world(trainer_t *t, const gs_position_t *pos)
{
  uint32_t world = gs_engine_world_size(t->engine);

  if (gs_sampler_set_world(&t->sampler, gs_engine_rank(t->engine), world)) {
    report(t, "--batch %u on %u ranks needs %u training examples per step; there are %u\n",
           t->cfg->batch, world, t->cfg->batch * world, t->train.count);
    return GS_EINVAL;
  }
  t->rank = gs_engine_rank(t->engine);
  t->world = world;
  t->slot[0].step = t->slot[1].step = -1;
  count_steps(t, pos);
  return 0;
}

/* One validation step: forward only over `n` examples; adds the summed
 * loss and the correct count to sums[0] and sums[1]. */
static int val_step(trainer_t *t, const gs_dataset_t *ds, const uint32_t *idx, uint32_t n,
                    float sums[3])
{
  batch_slot_t *b = &t->slot[0];
  uint32_t correct = 0;
  float loss;
  int err;

  b->step = -1;
  err = load_batch(t, b, ds, idx, n);
  if (err)
    return err;
  loss = gs_mlp_forward(t->mlp, b->x, b->y, n, &correct);
  sums[0] += loss * n;
  sums[1] += correct;
  sums[2] += n;
  return 0;
}

/* Evaluates on the test split, rank r taking examples r, r+W, ...; the
 * sums are then added across ranks so every rank knows the accuracy. */
static int evaluate_once(trainer_t *t, float *accuracy, float *loss)
{
  uint32_t idx[4096], n = 0, cap = t->cfg->batch < 4096 ? t->cfg->batch : 4096;
  float sums[3] = {0, 0, 0};
  int err = 0;

  for (uint32_t i = t->rank; i < t->test.count && !err; i += t->world) {
    idx[n++] = i;
    if (n == cap) {
      err = val_step(t, &t->test, idx, n, sums);
      n = 0;
    }
  }
  if (n && !err)
    err = val_step(t, &t->test, idx, n, sums);
  if (err) {
    report(t, "cannot copy a test batch to %s\n", t->dev->label);
    return err;
  }
  err = gs_engine_allreduce_sum(t->engine, sums, 3);
  if (err)
    return err;
  *accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  return 0;
}

/* Evaluates. An elastic job that regroups meanwhile skips this one
 * (GS_EREGROUPED), in its new world: some ranks may have finished the sum
 * and gone on to the next step before the loss, and summing again would
 * pair their next step's allreduce with the others' second sum. */
static int evaluate(trainer_t *t, float *accuracy, float *loss, gs_position_t *pos)
{
  int err = evaluate_once(t, accuracy, loss);

  if (err == GS_EREGROUPED) {
    int e2;

    /* The state taken may be a step newer than this rank's: go on from it. */
    gs_engine_position(t->engine, pos);
    e2 = follow_world(t, pos);

    if (e2)
      return e2;
  }
  return err;
}

/* Prints a progress line (rank 0) and reports to the coordinator. */
static void progress(trainer_t *t, uint64_t step, uint64_t epoch, bool force)
{
  double now = gs_now_ms_f(), dt = now - t->last_line_ms;
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

  uint32_t in = t->cfg->layers[0];
  int err;

  err = gs_dataset_load(t->cfg->data_dir, "train", in, &t->train, why, sizeof(why));
  if (!err)
    err = gs_dataset_load(t->cfg->data_dir, "t10k", in, &t->test, why, sizeof(why));
  if (err == GS_EPRECOND) {
    report(t, "--layers %u,...: the model takes %u inputs, but %s\n", in, in, why);
    return GS_EINVAL;
  }
  if (err) {
    report(t, "%s\n", why);
    return GS_EINVAL;
  }
  /* A label the model cannot output is a data error, not a --layers one. */
  if (gs_dataset_check_labels(&t->train, t->cfg->layers[t->cfg->nlayers - 1], why, sizeof(why)) ||
      gs_dataset_check_labels(&t->test, t->cfg->layers[t->cfg->nlayers - 1], why, sizeof(why))) {
    report(t, "%s\n", why);
    return GS_EINVAL;
  }
  return 0;
}

/* Opens the compute device (--device, --gpu; device_choice.h) and picks
 * the backend that works on its memory when --backend is auto. */
static int open_device(trainer_t *t, gs_engine_config_t *ec)
{
  const gs_trainer_config_t *c = t->cfg;
  gs_device_env_t env = {
      .device = c->device,
      .gpu = c->gpu,
      .cuda_built = gs_device_cuda_built(),
      .visible = gs_device_cuda_count(),
      .cuda_visible_devices = getenv("CUDA_VISIBLE_DEVICES"),
      .launcher_cuda_visible_devices = getenv("GRADSYNC_RUN_CUDA_VISIBLE_DEVICES"),
      .local_world = c->local_world,
      .local_rank = ec->local_rank,
  };
  gs_device_choice_t pick;
  char why[256];

  gs_device_choose(&env, &pick);
  if (strcmp(c->device, "auto") == 0)
    gs_log(t->log, pick.warn ? GS_LOG_WARN : GS_LOG_INFO, t->job, -1, "%s", pick.reason);
  t->dev = gs_device_open(pick.name, pick.gpu, t->log, why, sizeof(why));
  if (!t->dev) {
    report(t, "cannot open device '%s': %s\n", c->device, why);
    return GS_EUNAVAIL;
  }
  ec->dev = t->dev;
  snprintf(ec->device, sizeof(ec->device), "%s", t->dev->label);
  if (strcmp(ec->backend, "auto") == 0)
    snprintf(ec->backend, sizeof(ec->backend), "%s", t->dev->host_memory ? "host" : "nccl");
  gs_log(t->log, GS_LOG_INFO, t->job, -1, "device %s, %s backend", t->dev->label, ec->backend);
  return 0;
}

/* Two batch slots of `rows` examples: pinned host and device buffers (one
 * buffer each on the CPU device, where they would be the same memory). */
static int alloc_slots(trainer_t *t, uint32_t rows)
{
  size_t pixels = (size_t)rows * t->cfg->layers[0];

  for (int k = 0; k < 2; k++) {
    batch_slot_t *b = &t->slot[k];

    b->step = -1;
    b->px = gs_device_alloc(t->dev, pixels);
    b->y = gs_device_alloc(t->dev, rows);
    b->x = gs_device_alloc(t->dev, pixels * sizeof(float));
    b->px_host = t->dev->host_memory ? b->px : gs_device_host_alloc(t->dev, pixels);
    b->y_host = t->dev->host_memory ? b->y : gs_device_host_alloc(t->dev, rows);
    if (!b->px || !b->y || !b->x || !b->px_host || !b->y_host) {
      report(t, "cannot allocate batch buffers on %s\n", t->dev->label);
      return GS_ENOMEM;
    }
  }
  t->loss_host = gs_device_host_alloc(t->dev, 2 * sizeof(float));
  if (!t->loss_host) {
    report(t, "cannot allocate the loss's host buffer for %s\n", t->dev->label);
    return GS_ENOMEM;
  }
  return 0;
}

static void free_slots(trainer_t *t)
{
  if (t->dev)
    gs_device_host_free(t->dev, t->loss_host);
  for (int k = 0; t->dev && k < 2; k++) {
    batch_slot_t *b = &t->slot[k];

    if (!t->dev->host_memory) {
      gs_device_host_free(t->dev, b->px_host);
      gs_device_host_free(t->dev, b->y_host);
    }
    gs_device_free(t->dev, b->px);
    gs_device_free(t->dev, b->x);
    gs_device_free(t->dev, b->y);
  }
}

/* One setting for the coordinator to compare across ranks, like printf. */
__attribute__((format(printf, 3, 4))) static int setting(trainer_t *t, const char *name,
                                                         const char *fmt, ...)
{
  char value[128];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(value, sizeof(value), fmt, ap);
  va_end(ap);
  return gs_engine_add_setting(t->engine, name, value); /* gs_trainer_run prints the error */
}

/* What decides this rank's sequence of collectives (steps, epochs and
 * their validation allreduces, all from the data size and the batch) and
 * its arithmetic (batch, seed, shuffling, layers): the coordinator refuses
 * a job whose ranks disagree on any, naming it, instead of letting one
 * hang the others or drift. The engine adds its own (reduce, SGD, ...). */
static int add_settings(trainer_t *t)
{
  const gs_trainer_config_t *c = t->cfg;
  char layers[128];
  size_t used = 0;
  int err;

  for (uint32_t i = 0; i < c->nlayers && used < sizeof(layers); i++)
    used +=
        (size_t)snprintf(layers + used, sizeof(layers) - used, "%s%u", i ? "," : "", c->layers[i]);
  err = setting(t, "batch", "%u", c->batch);
  if (!err && c->steps)
    err = setting(t, "steps", "%" PRIu64, c->steps);
  if (!err && !c->steps)
    err = setting(t, "epochs", "%" PRIu64, c->epochs);
  err = err ? err : setting(t, "validate", "%s", c->validate ? "true" : "false");
  err = err ? err : setting(t, "train-examples", "%u", t->train.count);
  err = err ? err : setting(t, "test-examples", "%u", t->test.count);
  err = err ? err : setting(t, "seed", "%" PRIu64, c->seed);
  err = err ? err : setting(t, "shuffle", "%s", c->shuffle ? "true" : "false");
  /* Too many widths to fit: the model signature still compares the shapes. */
  if (!err && used < sizeof(layers))
    err = setting(t, "layers", "%s", layers);
  return err;
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
  err = open_device(t, &ec);
  if (err)
    return err;
  t->mlp = gs_mlp_new(t->dev, c->layers, c->nlayers, eval_batch, why, sizeof(why));
  t->engine = gs_engine_new(&ec);
  if (!t->mlp || !t->engine) {
    report(t, "%s\n", t->mlp ? "out of memory" : why);
    return GS_ENOMEM;
  }
  err = alloc_slots(t, eval_batch);
  if (err)
    return err;
  for (uint32_t i = 0; i < gs_mlp_param_count(t->mlp); i++) {
    gs_param_desc_t d = gs_mlp_param_desc(t->mlp, i);

    if (gs_engine_register(t->engine, d.name, d.elements, gs_mlp_param_is_bias(t->mlp, i)) < 0)
      return GS_EINVAL;
  }
  err = add_settings(t);
  if (err)
    return err;
  {
    char desc[160];
    size_t used = (size_t)snprintf(desc, sizeof(desc), "layers ");

    for (uint32_t i = 0; i < c->nlayers && used < sizeof(desc); i++)
      used +=
          (size_t)snprintf(desc + used, sizeof(desc) - used, "%s%u", i ? "," : "", c->layers[i]);
    /* Resuming with other --layers names both layouts. */
    err = gs_engine_set_layout_desc(t->engine, desc);
    if (err)
      return err;
  }
  err = gs_engine_start(t->engine);
  if (err)
    return err;
  t->rank = gs_engine_rank(t->engine);
  t->world = gs_engine_world_size(t->engine);
  for (uint32_t i = 0; i < gs_mlp_param_count(t->mlp); i++)
    gs_mlp_bind(t->mlp, i, gs_engine_param(t->engine, i), gs_engine_grad(t->engine, i));
  err = gs_mlp_init_params(t->mlp, c->seed);
  if (err) {
    report(t, "cannot initialise the parameters on %s: %s\n", t->dev->label, gs_strerror(err));
    return err;
  }
  err = gs_sampler_init(&t->sampler, t->train.count, c->batch, t->rank, t->world, c->seed,
                        c->shuffle);
  if (err) {
    report(t,
           "--batch %u on %u ranks needs %u training examples per "
           "step; %s has %u\n",
           c->batch, t->world, c->batch * t->world, c->data_dir, t->train.count);
    return err;
  }
  *pos = (gs_position_t){0, 0, c->seed, 0};
  err = gs_engine_sync_initial(t->engine, pos);
  if (err)
    return err;
  /* An elastic job this rank joined while it ran: its world may differ. */
  err = follow_world(t, pos);
  if (err)
    return err;
  /* A checkpoint from before the sample offset was stored (a fixed world). */
  if (pos->sample == GS_POSITION_SAMPLE_UNKNOWN)
    pos->sample = pos->step > pos->epoch * t->steps_per_epoch
                      ? (pos->step - pos->epoch * t->steps_per_epoch) * c->batch * t->world
                      : 0;
  count_steps(t, pos);
  return 0;
}

static int validate(trainer_t *t, gs_position_t *pos, uint64_t epoch)
{
  float acc, loss;
  int err = evaluate(t, &acc, &loss, pos);

  if (err == GS_EREGROUPED) {
    if (t->rank == 0)
      printf("epoch %" PRIu64 " validation skipped: the world changed during it\n", epoch);
    return 0;
  }
  if (!err && t->rank == 0)
    printf("epoch %" PRIu64 " validation: accuracy %.4f loss %.4f (%u test examples)\n", epoch, acc,
           loss, t->test.count);
  return err;
}

/* The training loop, from `pos` to the last step or a stop; *done gets
 * the steps completed. */
static int train(trainer_t *t, gs_position_t pos, uint64_t *done)
{
  uint64_t timed_from = pos.step + UNTIMED_STEPS;
  gs_step_result_t res;
  int err;

  t->start_ms = t->last_line_ms = gs_now_ms_f();
  while (!finished(t, &pos)) {
    gs_position_t after = advance(t, &pos);
    double t0 = gs_now_ms_f(), data_ms = 0, step_ms;

    err = train_step(t, &pos, &after, &res, &data_ms);
    if (err)
      return err;
    if (res.regrouped) { /* elastic: go on in the new world from where every rank is */
      pos = res.resume;
      *done = pos.step;
      err = follow_world(t, &pos);
      if (err)
        return err;
      if (t->rank == 0)
        printf("world of %u rank%s from step %" PRIu64 " (epoch %" PRIu64 ", example %" PRIu64
               ")\n",
               t->world, t->world == 1 ? "" : "s", pos.step, pos.epoch + 1, pos.sample);
      continue;
    }
    *done = after.step;
    step_ms = gs_now_ms_f() - t0;
    t->window_ms += step_ms;
    t->window_comm_ms += res.comm_wait_ms;
    t->window_steps++;
    if (pos.step >= timed_from) {
      t->sum_step_ms += step_ms;
      t->sum_data_ms += data_ms;
      t->sum_comm_ms += res.comm_wait_ms;
      t->sum_opt_ms += res.optimizer_ms;
      t->sum_device_waits += res.device_syncs + res.device_reads;
      t->sum_comm_waits += res.comm_waits;
      t->timed_steps++;
    }
    progress(t, after.step, pos.epoch, false);
    if (res.stop) {
      if (t->rank == 0)
        printf("stopped after step %" PRIu64 ": %s\n", after.step, res.stop_reason);
      return gs_engine_drain(t->engine, &res);
    }
    if (t->cfg->validate && after.epoch != pos.epoch) {
      err = validate(t, &after, pos.epoch + 1);
      if (err)
        return err;
    }
    pos = after;
  }
  progress(t, pos.step, pos.epoch ? pos.epoch - 1 : 0, true);
  /* --decide late: the last step's verdict, before it is evaluated or saved. */
  return gs_engine_drain(t->engine, &res);
}

static void summary(trainer_t *t, gs_position_t *pos, uint64_t first_step, uint64_t last_step)
{
  double secs = (gs_now_ms_f() - t->start_ms) / 1e3;
  double samples = (double)(last_step - first_step) * t->cfg->batch * t->world;
  float acc = 0, loss = 0;
  int err = evaluate(t, &acc, &loss, pos);

  if (err == GS_EREGROUPED) /* every rank is here: once more, over the new world */
    err = evaluate(t, &acc, &loss, pos);
  if (err)
    return;
  if (t->rank == 0)
    printf("final: test accuracy %.4f, test loss %.4f, %.0f samples/s over %u rank%s, %.1f s\n",
           acc, loss, secs > 0 ? samples / secs : 0, t->world, t->world == 1 ? "" : "s", secs);
  if (t->rank == 0 && t->timed_steps) {
    double n = (double)t->timed_steps, step = t->sum_step_ms / n, data = t->sum_data_ms / n;
    double comm = t->sum_comm_ms / n, opt = t->sum_opt_ms / n;

    printf("timing: step %.3f ms = compute %.3f + data %.3f + comm-wait %.3f + optimizer %.3f ms "
           "(mean of %" PRIu64 " steps on %s; blocking waits per step: device %.2f, comm %.2f)\n",
           step, step - data - comm - opt, data, comm, opt, t->timed_steps, t->dev->label,
           (double)t->sum_device_waits / n, (double)t->sum_comm_waits / n);
  }
  if (t->rank == 0)
    printf("optimizer state: %.3f MiB on rank 0%s\n",
           (double)gs_engine_state_bytes(t->engine) / (1 << 20),
           t->cfg->engine.shard_optimizer ? " (sharded)" : "");
}

/* Rank 0 writes the trained parameters to --save-model as PyTorch's
 * nn.Sequential(Linear, ReLU, Linear, ...) names them ("0.weight",
 * "0.bias", "2.weight", ...): the MLP's weights are [out x in] row-major,
 * as torch's, so the file loads with load_state_dict as it is. */
static int save_model(trainer_t *t, uint64_t step)
{
  const gs_trainer_config_t *c = t->cfg;
  uint32_t n = gs_mlp_param_count(t->mlp);
  gs_st_tensor_t tensors[2 * (GS_TRAINER_MAX_LAYERS - 1)];
  char names[2 * (GS_TRAINER_MAX_LAYERS - 1)][24], layers[192], steps[32], why[1024];
  float *host[2 * (GS_TRAINER_MAX_LAYERS - 1)] = {NULL};
  size_t used = 0;
  int err = 0;

  for (uint32_t i = 0; i < c->nlayers && used < sizeof(layers); i++)
    used +=
        (size_t)snprintf(layers + used, sizeof(layers) - used, "%s%u", i ? "," : "", c->layers[i]);
  snprintf(steps, sizeof(steps), "%" PRIu64, step);
  for (uint32_t i = 0; i < n && !err; i++) {
    gs_param_desc_t d = gs_mlp_param_desc(t->mlp, i);
    uint32_t l = i / 2;

    snprintf(names[i], sizeof(names[i]), "%u.%s", 2 * l, i % 2 ? "bias" : "weight");
    tensors[i] = (gs_st_tensor_t){
        .name = names[i], .ndims = i % 2 ? 1 : 2, .shape = {c->layers[l + 1], c->layers[l]}};
    host[i] = malloc(d.elements * sizeof(float) + 1);
    err = host[i] ? gs_device_download(t->dev, host[i], gs_engine_param(t->engine, i),
                                       d.elements * sizeof(float))
                  : GS_ENOMEM;
    tensors[i].data = host[i];
  }
  if (err)
    report(t, "--save-model %s: cannot copy the parameters from %s: %s\n", c->save_model,
           t->dev->label, gs_strerror(err));
  else {
    gs_st_meta_t meta[] = {{"format", "pt"},
                           {"gradsync.model", "mlp"},
                           {"gradsync.layers", layers},
                           {"gradsync.activation", "relu"},
                           {"gradsync.step", steps}};

    err = gs_safetensors_write(c->save_model, tensors, n, meta, sizeof(meta) / sizeof(meta[0]), why,
                               sizeof(why));
    if (err)
      report(t, "--save-model: %s\n", why);
    else
      gs_log(t->log, GS_LOG_INFO, t->job, 0, "model (layers %s, step %" PRIu64 ") saved to %s",
             layers, step, c->save_model);
  }
  for (uint32_t i = 0; i < n; i++)
    free(host[i]);
  return err;
}

static void trainer_free(trainer_t *t)
{
  gs_engine_free(t->engine);
  gs_mlp_free(t->mlp);
  free_slots(t);
  gs_sampler_free(&t->sampler);
  gs_dataset_free(&t->train);
  gs_dataset_free(&t->test);
  gs_device_destroy(t->dev);
}

/* --save-model's folder must exist and be writable now, not after training. */
static int check_save_model(trainer_t *t)
{
  char dir[PATH_MAX];
  struct stat sb;

  if (!t->cfg->save_model)
    return 0;
  snprintf(dir, sizeof(dir), "%s", t->cfg->save_model);
  if (!*dir || stat(dirname(dir), &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dir, W_OK) != 0) {
    report(t, "--save-model %s: the folder %s %s\n", t->cfg->save_model, dir,
           stat(dir, &sb) != 0 ? "does not exist" : "is not a writable folder");
    return GS_EINVAL;
  }
  return 0;
}

int gs_trainer_run(const gs_trainer_config_t *cfg)
{
  trainer_t t = {.cfg = cfg, .log = cfg->engine.log, .job = cfg->engine.coord.job};
  gs_position_t pos;
  int err;

  err = check_save_model(&t);
  if (!err)
    err = load_data(&t);
  if (!err)
    err = setup(&t, &pos);
  if (!err) {
    if (pos.step && t.rank == 0)
      printf("resumed at step %" PRIu64 " (epoch %" PRIu64 ")\n", pos.step, pos.epoch + 1);
    uint64_t done = pos.step;

    err = train(&t, pos, &done);
    if (!err)
      summary(&t, &pos, pos.step, done);
    if (!err && cfg->save_model && t.rank == 0)
      err = save_model(&t, done);
  }
  if (err && t.engine && !t.reported)
    report(&t, "%s\n", gs_engine_error(t.engine));
  fflush(stdout);
  if (t.engine)
    gs_engine_finish(t.engine, err == 0,
                     !err         ? "finished"
                     : t.reported ? t.reported_why
                                  : gs_engine_error(t.engine));
  trainer_free(&t);
  return err;
}
