/* The optimizer's parameter groups, owned by groups.c: the SGD settings'
 * unless a front end added its own. Other files of the engine reach them
 * through the functions below. */
#ifndef GS_ENGINE_GROUPS_H
#define GS_ENGINE_GROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h>

#include "error.h"
#include "optim.h"

typedef struct engine_groups {
  gs_optim_group_t *list;     /* count of them, room for cap */
  gs_optim_group_t *resolved; /* list resolved for the step (lr scheduled and scaled) */
  float *mult;                /* the scheduled groups' lr multipliers */
  uint32_t count, cap;
  bool from_front_end; /* gs_engine_add_group replaced the SGD settings' */
} engine_groups_t;

/* The SGD settings' groups (at new), and their memory; the group a newly
 * registered parameter joins; the check at start; the state buffers the
 * optimizer needs; the groups resolved for `step` (1-based) with the
 * step's constants in `out`; the value of the Join setting that holds a
 * front end's groups (false without any). */
int gs__engine_groups_init(gs_engine_t *e) GS_WARN_UNUSED;
void gs__engine_groups_free(gs_engine_t *e);
uint32_t gs__engine_default_group(const gs_engine_t *e, bool is_bias);
int gs__engine_groups_check(gs_engine_t *e) GS_WARN_UNUSED;
uint32_t gs__engine_state_count(const gs_engine_t *e);
void gs__engine_resolve_groups(gs_engine_t *e, uint64_t step, gs_optim_step_t *out);
bool gs__engine_groups_setting(const gs_engine_t *e, char *value, size_t len);

#endif
