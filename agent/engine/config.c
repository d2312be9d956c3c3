/* The engine's public configuration: its defaults, and the settings sent
 * at Join for the coordinator to compare across ranks (gradsync/engine.h,
 * proto/README.md). */
#include <gradsync/engine.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_internal.h"
#include "parse.h"
#include "why.h"

static const char *const decide_names[] = {
    [GS_DECIDE_NOW] = "now",
    [GS_DECIDE_LATE] = "late",
};

GS_DEFINE_ENUM_NAMES(gs_decide_parse, gs_decide_name, gs_decide_t, decide_names)

void gs_engine_config_defaults(gs_engine_config_t *cfg)
{
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->coord.host, sizeof(cfg->coord.host), "127.0.0.1");
  cfg->coord.job = "local";
  cfg->world_size = 1;
  if (gethostname(cfg->node, sizeof(cfg->node)) != 0 || !cfg->node[0])
    snprintf(cfg->node, sizeof(cfg->node), "localhost");
  cfg->node[sizeof(cfg->node) - 1] = '\0'; /* gethostname may truncate without one */
  snprintf(cfg->device, sizeof(cfg->device), "cpu");
  snprintf(cfg->backend, sizeof(cfg->backend), "host");
  cfg->host_tcp_only = getenv("GRADSYNC_HOST_SHM") && !strcmp(getenv("GRADSYNC_HOST_SHM"), "0");
  cfg->pack_threshold = 10 << 20;
  cfg->reduce = GS_REDUCE_MEAN;
  gs_sgd_config_default(&cfg->sgd);
  cfg->bcast_period = 0;
  cfg->checkpoint_keep = 3;
  cfg->checkpoint_failures = 3;
  cfg->join_timeout_ms = 5 * 60 * 1000;
  cfg->rpc_timeout_ms = 30 * 1000;
  cfg->comm_timeout_ms = 2 * 60 * 1000;
  cfg->connect_timeout_ms = 15 * 1000;
  cfg->coordinator_grace_ms = 10 * 60 * 1000;
  cfg->rejoin_timeout_ms = 5 * 60 * 1000;
}

static bool setting_name_ok(const char *s)
{
  size_t n = strlen(s);

  if (n == 0 || n >= sizeof(((gradsync_Setting *)0)->name))
    return false;
  for (; *s; s++) {
    if (!isalnum((unsigned char)*s) && !strchr("._-", *s))
      return false;
  }
  return true;
}

static bool setting_exists(const gs_engine_t *e, const char *name)
{
  const gradsync_Setting *s = e->member.settings.items;

  for (size_t i = 0; i < e->member.settings.count; i++) {
    if (!strcmp(s[i].name, name))
      return true;
  }
  return false;
}

int gs_engine_add_setting(gs_engine_t *e, const char *name, const char *value)
{
  gradsync_Setting s = gradsync_Setting_init_zero;
  int err;

  if (!e->member.settings.item_size)
    gs_pb_array_init(&e->member.settings, gradsync_Setting_fields, sizeof(gradsync_Setting),
                     GS_ENGINE_MAX_SETTINGS);
  if (e->member.joined)
    err = GS_EPRECOND;
  else if (!name || !value || !setting_name_ok(name) || strlen(value) >= sizeof(s.value))
    err = GS_EINVAL;
  else if (setting_exists(e, name))
    err = GS_EEXIST;
  else {
    snprintf(s.name, sizeof(s.name), "%s", name);
    snprintf(s.value, sizeof(s.value), "%s", value);
    err = gs_pb_array_push(&e->member.settings, &s);
  }
  if (err)
    gs_set_why(e->error, sizeof(e->error), "cannot add setting '%s': %s%s", name ? name : "?",
               gs_strerror(err),
               err == GS_EINVAL   ? " (names: 1-63 of [A-Za-z0-9._-]; values: up to 127 bytes)"
               : err == GS_EEXIST ? " (added twice, or one of the engine's own)"
                                  : "");
  return err;
}

/* Adds one of the engine's own settings, formatted like printf. */
__attribute__((format(printf, 3, 4))) static int own(gs_engine_t *e, const char *name,
                                                     const char *fmt, ...)
{
  char value[sizeof(((gradsync_Setting *)0)->value)];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(value, sizeof(value), fmt, ap);
  va_end(ap);
  return gs_engine_add_setting(e, name, value);
}

static const char *const elastic_lr_names[] = {"keep", "linear"};
static const char *const grad_dtype_names[] = {
    [GS_GRAD_FP32] = "fp32", [GS_GRAD_BF16] = "bf16", [GS_GRAD_FP16] = "fp16"};

GS_DEFINE_ENUM_NAMES(gs_elastic_lr_parse, gs_elastic_lr_name, gs_elastic_lr_t, elastic_lr_names)
GS_DEFINE_ENUM_NAMES(gs_grad_dtype_parse, gs_grad_dtype_name, gs_grad_dtype_t, grad_dtype_names)

gs_dtype_t gs__engine_wire_dtype(const gs_engine_t *e)
{
  return e->cfg.grad_dtype == GS_GRAD_BF16   ? GS_DTYPE_BFLOAT16
         : e->cfg.grad_dtype == GS_GRAD_FP16 ? GS_DTYPE_FLOAT16
                                             : GS_DTYPE_FLOAT32;
}

/* Floats as "%.9g": nine digits tell every float apart, so two ranks whose
 * values print alike do the same arithmetic. Only the settings a schedule
 * uses are sent: a gamma without a step schedule changes nothing. */
int gs__engine_add_own_settings(gs_engine_t *e)
{
  const gs_sgd_config_t *c = &e->cfg.sgd;
  char groups[64];
  int err = own(e, "backend", "%s", e->cfg.backend);

  err = err ? err : own(e, "reduce", "%s", gs_reduce_op_name(e->cfg.reduce));
  err = err ? err : own(e, "pack-threshold", "%" PRIu64, e->cfg.pack_threshold);
  if (e->cfg.world_min) /* it scales the LR */
    err = err ? err : own(e, "elastic-lr", "%s", gs_elastic_lr_name(e->cfg.elastic_lr));
  err = err ? err : own(e, "optimizer", "%s", gs_optim_kind_name(e->cfg.optim));
  err = err ? err : own(e, "nonfinite", "%s", gs_nonfinite_name(e->cfg.nonfinite));
  err = err ? err : own(e, "decide", "%s", gs_decide_name(e->cfg.decide));
  err = err ? err : own(e, "grad-dtype", "%s", gs_grad_dtype_name(e->cfg.grad_dtype));
  /* Only when on: a job of an older build agrees without it. A sharded
   * checkpoint is taken by every rank together: all have them, or none. */
  if (e->cfg.shard_optimizer) {
    err = err ? err : own(e, "shard-optimizer", "true");
    err = err ? err : own(e, "checkpoints", "%s", e->cfg.checkpoint_dir ? "on" : "off");
  }
  if (gs__engine_groups_setting(e, groups, sizeof(groups)))
    err = err ? err : own(e, "optim-groups", "%s", groups);
  err = err ? err : own(e, "lr", "%.9g", c->lr);
  err = err ? err : own(e, "momentum", "%.9g", c->momentum);
  err = err ? err : own(e, "weight-decay", "%.9g", c->weight_decay);
  err = err ? err : own(e, "nesterov", "%s", c->nesterov ? "true" : "false");
  err = err ? err : own(e, "bias-lr-mult", "%.9g", c->bias_lr_mult);
  err = err ? err : own(e, "bias-wd", "%.9g", c->bias_wd);
  err = err ? err : own(e, "warmup-steps", "%" PRIu64, c->warmup_steps);
  if (c->warmup_steps)
    err = err ? err : own(e, "warmup-factor", "%.9g", c->warmup_factor);
  err = err ? err : own(e, "schedule", "%s", gs_lr_schedule_name(c->schedule));
  if (c->schedule == GS_LR_STEP) {
    err = err ? err : own(e, "lr-step-size", "%" PRIu64, c->step_size);
    err = err ? err : own(e, "lr-gamma", "%.9g", c->gamma);
  }
  if (c->schedule == GS_LR_COSINE)
    err = err ? err : own(e, "lr-total-steps", "%" PRIu64, c->total_steps);
  return err;
}
