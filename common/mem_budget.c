/* The memory budget shared by the coordinator's layers (mem_budget.h). */
#include "mem_budget.h"

#include "invariant.h"

void gs_mem_budget_init(gs_mem_budget_t *b, size_t max)
{
  *b = (gs_mem_budget_t){.max = max,
                         .stored_max = max / GS_MEM_STORED_SHARE,
                         .members_max = max / GS_MEM_MEMBERS_SHARE};
}

/* Whether n more bytes fit a part holding `held` of `held_max`, and the whole. */
static bool part_fits(const gs_mem_budget_t *b, size_t held, size_t held_max, size_t n)
{
  return held + n <= held_max && b->used + n <= b->max;
}

void gs_mem_budget_hold(gs_mem_budget_t *b, size_t add, size_t sub)
{
  GS_ASSERT(sub <= b->used + add); /* never more back than was counted */
  b->used += add;
  b->used -= sub;
  if (b->used > b->peak)
    b->peak = b->used;
}

bool gs_mem_budget_store_fits(const gs_mem_budget_t *b, size_t n)
{
  return part_fits(b, b->stored, b->stored_max, n);
}

bool gs_mem_budget_members_fit(const gs_mem_budget_t *b, size_t n)
{
  return part_fits(b, b->members, b->members_max, n);
}

void gs_mem_budget_members(gs_mem_budget_t *b, size_t add, size_t sub)
{
  GS_ASSERT(sub <= b->members + add);
  b->members += add;
  b->members -= sub;
  gs_mem_budget_hold(b, add, sub);
}

void gs_mem_budget_store(gs_mem_budget_t *b, size_t add, size_t sub)
{
  GS_ASSERT(sub <= b->stored + add);
  b->stored += add;
  b->stored -= sub;
  gs_mem_budget_hold(b, add, sub);
}
