/* The optimizer's parameter groups. Without a front end's groups the
 * engine makes them from its SGD settings (the trainer's flags): weights
 * at the scheduled lr, biases with the bias rules, and one group per
 * distinct custom rule (gs_engine_param_rule), each a multiple of the
 * scheduled lr. A front end's groups (gs_engine_add_group) replace those
 * and carry their own lr, which a scheduler changes between steps. Every
 * step resolves the groups' lr once (resolve), and the fused kernels read
 * the result. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "groups.h"

#include "engine_internal.h"
#include "why.h"

#define GROUP_WEIGHTS 0
#define GROUP_BIASES 1

/* Appends a group (and its lr multiplier); its index or a negative code. */
static int append(gs_engine_t *e, const gs_optim_group_t *g, float mult)
{
  if (e->groups.count == e->groups.cap) {
    uint32_t cap = e->groups.cap ? 2 * e->groups.cap : 4;
    gs_optim_group_t *groups = realloc(e->groups.list, cap * sizeof(*groups));
    gs_optim_group_t *resolved;
    float *mults;

    if (!groups)
      return GS_ENOMEM;
    e->groups.list = groups;
    resolved = realloc(e->groups.resolved, cap * sizeof(*resolved));
    if (!resolved)
      return GS_ENOMEM;
    e->groups.resolved = resolved;
    mults = realloc(e->groups.mult, cap * sizeof(*mults));
    if (!mults)
      return GS_ENOMEM;
    e->groups.mult = mults;
    e->groups.cap = cap;
  }
  e->groups.list[e->groups.count] = *g;
  e->groups.mult[e->groups.count] = mult;
  return (int)e->groups.count++;
}

/* A group of the SGD settings with weight decay `wd`. */
static gs_optim_group_t scheduled_group(const gs_engine_t *e, float wd)
{
  gs_optim_group_t g;

  gs_optim_group_default(e->cfg.optim, &g);
  g.lr = e->cfg.sgd.lr;
  g.weight_decay = wd;
  g.momentum = e->cfg.sgd.momentum;
  g.nesterov = e->cfg.sgd.nesterov;
  return g;
}

int gs__engine_groups_init(gs_engine_t *e)
{
  gs_optim_group_t weights = scheduled_group(e, e->cfg.sgd.weight_decay);
  gs_optim_group_t biases = scheduled_group(e, e->cfg.sgd.bias_wd);

  if (append(e, &weights, 1.0f) != GROUP_WEIGHTS ||
      append(e, &biases, e->cfg.sgd.bias_lr_mult) != GROUP_BIASES)
    return GS_ENOMEM;
  return 0;
}

void gs__engine_groups_free(gs_engine_t *e)
{
  free(e->groups.list);
  free(e->groups.resolved);
  free(e->groups.mult);
}

uint32_t gs__engine_default_group(const gs_engine_t *e, bool is_bias)
{
  return !e->groups.from_front_end && is_bias ? GROUP_BIASES : GROUP_WEIGHTS;
}

/* Refuses a change once the packs exist; the reason in e->error. */
static int before_start(gs_engine_t *e, const char *what)
{
  if (!e->packs.packs)
    return 0;
  gs_set_why(e->error, sizeof(e->error), "%s: the engine has started", what);
  return GS_EINVAL;
}

int gs_engine_param_rule(gs_engine_t *e, uint32_t i, float lr_mult, float weight_decay)
{
  gs_optim_group_t g;
  int at = -1;

  if (before_start(e, "gs_engine_param_rule"))
    return GS_EINVAL;
  if (e->groups.from_front_end || i >= e->packs.nparams || !isfinite(lr_mult) ||
      !isfinite(weight_decay) || lr_mult < 0 || weight_decay < 0) {
    gs_set_why(e->error, sizeof(e->error),
               "cannot give parameter %u LR multiplier %g and weight decay %g: %s", i,
               (double)lr_mult, (double)weight_decay,
               e->groups.from_front_end ? "the engine has parameter groups (gs_engine_param_group)"
               : i >= e->packs.nparams  ? "no such parameter"
                                        : "each must be finite and not negative");
    return GS_EINVAL;
  }
  for (uint32_t k = GROUP_BIASES + 1; k < e->groups.count && at < 0; k++)
    if (e->groups.mult[k] == lr_mult && e->groups.list[k].weight_decay == weight_decay)
      at = (int)k;
  if (at < 0) {
    g = scheduled_group(e, weight_decay);
    at = append(e, &g, lr_mult);
  }
  if (at < 0)
    return at;
  return gs_packs_set_group(&e->packs, i, (uint32_t)at);
}

/* Checks a group for this engine's optimizer; the reason in e->error. */
static int check_group(gs_engine_t *e, const gs_optim_group_t *g, const char *what)
{
  char why[200];

  if (!gs_optim_group_check(e->cfg.optim, g, why, sizeof(why)))
    return 0;
  gs_set_why(e->error, sizeof(e->error), "%s: %s: %s", what, gs_optim_kind_name(e->cfg.optim), why);
  return GS_EINVAL;
}

int gs_engine_add_group(gs_engine_t *e, const gs_optim_group_t *g)
{
  if (before_start(e, "gs_engine_add_group") || check_group(e, g, "gs_engine_add_group"))
    return GS_EINVAL;
  if (!e->groups.from_front_end) {
    /* The front end's groups replace the SGD settings' (and their rules). */
    e->groups.from_front_end = true;
    e->groups.count = 0;
    for (uint32_t i = 0; i < e->packs.nparams; i++)
      e->packs.group_of[i] = 0;
  }
  return append(e, g, 1.0f);
}

int gs_engine_param_group(gs_engine_t *e, uint32_t i, uint32_t group)
{
  if (before_start(e, "gs_engine_param_group"))
    return GS_EINVAL;
  if (!e->groups.from_front_end || group >= e->groups.count || i >= e->packs.nparams) {
    gs_set_why(e->error, sizeof(e->error), "cannot put parameter %u in group %u: %s", i, group,
               !e->groups.from_front_end  ? "no group was added (gs_engine_add_group)"
               : group >= e->groups.count ? "no such group"
                                          : "no such parameter");
    return GS_EINVAL;
  }
  return gs_packs_set_group(&e->packs, i, group);
}

int gs_engine_set_group(gs_engine_t *e, uint32_t group, const gs_optim_group_t *g)
{
  if (group >= e->groups.count || !e->groups.from_front_end) {
    gs_set_why(e->error, sizeof(e->error), "gs_engine_set_group: no group %u", group);
    return GS_EINVAL;
  }
  if (check_group(e, g, "gs_engine_set_group"))
    return GS_EINVAL;
  if (e->packs.packs && g->amsgrad != e->groups.list[group].amsgrad &&
      e->cfg.optim != GS_OPTIM_SGD) {
    gs_set_why(e->error, sizeof(e->error),
               "gs_engine_set_group: amsgrad cannot change once the engine has started");
    return GS_EINVAL;
  }
  e->groups.list[group] = *g;
  return 0;
}

int gs__engine_groups_check(gs_engine_t *e)
{
  for (uint32_t k = 0; k < e->groups.count; k++)
    if (check_group(e, &e->groups.list[k], "parameter group"))
      return GS_EINVAL;
  return 0;
}

uint32_t gs__engine_state_count(const gs_engine_t *e)
{
  return gs_optim_state_count(e->cfg.optim, e->groups.list, e->groups.count);
}

float gs_engine_lr_factor(const gs_engine_t *e)
{
  return e->lr_scale * e->operator_lr_scale;
}

void gs__engine_resolve_groups(gs_engine_t *e, uint64_t step, gs_optim_step_t *out)
{
  float scheduled = e->groups.from_front_end ? 1.0f : gs_sgd_lr(&e->cfg.sgd, step - 1);

  for (uint32_t k = 0; k < e->groups.count; k++) {
    e->groups.resolved[k] = e->groups.list[k];
    e->groups.resolved[k].lr =
        (e->groups.from_front_end ? e->groups.list[k].lr : scheduled * e->groups.mult[k]) *
        gs_engine_lr_factor(e);
  }
  *out = (gs_optim_step_t){
      .kind = e->cfg.optim,
      .groups = e->groups.resolved,
      .ngroups = e->groups.count,
      .t = e->optim_steps + 1,
      .grad_scale = (float)e->grad_scale,
  };
}

/* The front end's groups as a setting's value: every rank must start with
 * the same (a CRC of each group's values and the parameters in it). */
bool gs__engine_groups_setting(const gs_engine_t *e, char *value, size_t len)
{
  uLong crc = crc32(0L, Z_NULL, 0);

  if (!e->groups.from_front_end)
    return false;
  for (uint32_t k = 0; k < e->groups.count; k++) {
    char text[256];
    const gs_optim_group_t *g = &e->groups.list[k];
    int n = snprintf(text, sizeof(text), "%.17g %.17g %d %.17g %.17g %d %.17g %.17g %.17g %d;",
                     g->lr, g->weight_decay, g->maximize, g->momentum, g->dampening, g->nesterov,
                     g->beta1, g->beta2, g->eps, g->amsgrad);

    crc = crc32(crc, (const Bytef *)text, (uInt)n);
  }
  crc = crc32(crc, (const Bytef *)e->packs.group_of, (uInt)(e->packs.nparams * sizeof(uint32_t)));
  snprintf(value, len, "%u/%08lx", e->groups.count, (unsigned long)crc);
  return true;
}

uint32_t gs_engine_state_count(const gs_engine_t *e)
{
  return e->packs.nstate;
}

float *gs_engine_state(const gs_engine_t *e, uint32_t i, uint32_t slot)
{
  const gs_pack_t *pk;
  size_t at;

  if (!e->packs.packs || i >= e->packs.nparams || slot >= e->packs.nstate)
    return NULL;
  pk = &e->packs.packs[e->packs.pack_of[i]];
  at = e->packs.offset_of[i];
  if (gs__engine_full_state_assembled(e))
    return gs__engine_state_of(e, e->packs.pack_of[i], slot) + at;
  if (at < pk->win[0].off || at + e->packs.params[i].elements > pk->win[0].off + pk->win[0].len)
    return NULL; /* sharded: not wholly this rank's */
  return pk->win[0].state[slot] + (at - pk->win[0].off);
}

uint64_t gs_engine_optim_steps(const gs_engine_t *e)
{
  return e->optim_steps;
}

void gs_engine_set_optim_steps(gs_engine_t *e, uint64_t steps)
{
  e->optim_steps = steps;
}
