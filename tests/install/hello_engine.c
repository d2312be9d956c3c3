/* A tiny program built against an installed libgradsync, as an outside
 * user would build one (tests/test_install.sh):
 *
 *   cc hello_engine.c $(pkg-config --cflags --libs gradsync)
 *
 * Each rank fits y = 1 x0 + 2 x1 + 3 x2 + 4 x3 + 5 by least squares on its
 * own examples, the engine averaging the gradients across ranks, and prints
 * the final parameters, which must be the same on every rank.
 *
 * usage: hello_engine HOST PORT LOCAL_RANK */
#include <gradsync/engine.h>
#include <stdio.h>
#include <stdlib.h>

#define FEATURES 4
#define BATCH 8
#define STEPS 300

/* A small LCG: examples differ per rank and step, reproducibly. */
static float next_uniform(uint64_t *s)
{
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

/* One step's loss and gradients of the mean squared error on this rank's
 * batch. */
static float batch_grads(const float *w, float b, uint64_t *rng, float *gw, float *gb)
{
  float loss = 0.0f;

  for (int j = 0; j < FEATURES; j++)
    gw[j] = 0.0f;
  *gb = 0.0f;
  for (int i = 0; i < BATCH; i++) {
    float x[FEATURES], y = 5.0f, pred = b, err;

    for (int j = 0; j < FEATURES; j++) {
      x[j] = next_uniform(rng);
      y += (float)(j + 1) * x[j];
      pred += w[j] * x[j];
    }
    err = pred - y;
    loss += err * err / BATCH;
    for (int j = 0; j < FEATURES; j++)
      gw[j] += 2.0f * err * x[j] / BATCH;
    *gb += 2.0f * err / BATCH;
  }
  return loss;
}

static int fail(gs_engine_t *e, const char *what, int err)
{
  fprintf(stderr, "hello_engine: %s: %s (%s)\n", what, gs_engine_error(e), gs_engine_strerror(err));
  gs_engine_finish(e, false, what);
  gs_engine_free(e);
  return 1;
}

int main(int argc, char **argv)
{
  gs_engine_config_t cfg;
  gs_position_t pos = {0};
  gs_step_result_t res;
  gs_engine_t *e;
  uint64_t rng;
  float *w, *b, loss = 0.0f;
  int err;

  if (argc != 4) {
    fprintf(stderr, "usage: hello_engine HOST PORT LOCAL_RANK\n");
    return 2;
  }
  gs_engine_config_defaults(&cfg);
  snprintf(cfg.coord.host, sizeof(cfg.coord.host), "%s", argv[1]);
  cfg.coord.port = (uint16_t)atoi(argv[2]);
  cfg.coord.job = "hello";
  cfg.world_size = 2;
  cfg.local_rank = (uint32_t)atoi(argv[3]);
  snprintf(cfg.node, sizeof(cfg.node), "hello");
  cfg.sgd.lr = 0.1f;
  cfg.sgd.momentum = 0.0f;
  cfg.sgd.weight_decay = cfg.sgd.bias_wd = 0.0f;
  /* Generous: the test runs on machines busy with other things. */
  cfg.join_timeout_ms = cfg.rpc_timeout_ms = cfg.comm_timeout_ms = 300000;
  e = gs_engine_new(&cfg);
  if (!e)
    return 1;
  if (gs_engine_register(e, "w", FEATURES, false) < 0 || gs_engine_register(e, "b", 1, true) < 0)
    return fail(e, "register", -1);
  if ((err = gs_engine_start(e)))
    return fail(e, "start", err);
  w = gs_engine_param(e, 0); /* the cpu device: host memory, zeroed */
  b = gs_engine_param(e, 1);
  if ((err = gs_engine_sync_initial(e, &pos)))
    return fail(e, "sync_initial", err);
  rng = 1000 + gs_engine_rank(e);
  for (uint64_t s = 0; s < STEPS; s++) {
    gs_position_t after = {.step = s + 1, .rng_state = rng};

    loss = batch_grads(w, *b, &rng, gs_engine_grad(e, 0), gs_engine_grad(e, 1));
    gs_engine_begin_step(e, loss, &after);
    gs_engine_grad_ready(e, 1);
    gs_engine_grad_ready(e, 0);
    if ((err = gs_engine_end_step(e, &res)))
      return fail(e, "step", err);
  }
  printf("rank %u of %u: loss %.4f\n", gs_engine_rank(e), gs_engine_world_size(e), loss);
  printf("params %.6f %.6f %.6f %.6f %.6f\n", w[0], w[1], w[2], w[3], *b);
  gs_engine_finish(e, true, "done");
  gs_engine_free(e);
  return 0;
}
