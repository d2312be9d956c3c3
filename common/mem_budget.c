/* The memory budget shared by the coordinator's layers (mem_budget.h). */
#include "mem_budget.h"

void gs_mem_budget_init(gs_mem_budget_t *b, size_t max)
{
  *b = (gs_mem_budget_t){.max = max, .stored_max = max / GS_MEM_STORED_SHARE};
}

bool gs_mem_budget_store_fits(const gs_mem_budget_t *b, size_t n)
{
  return b->stored + n <= b->stored_max && b->used + n <= b->max;
}

void gs_mem_budget_store(gs_mem_budget_t *b, size_t add, size_t sub)
{
  b->stored += add;
  b->stored -= sub;
  b->used += add;
  b->used -= sub;
}
