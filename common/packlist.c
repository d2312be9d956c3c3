/* The parameter pack list: computing it from the parameter descriptions,
 * and checking one received from the wire before any buffer is sized by it. */
#include "packlist.h"
#include "why.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

size_t gs_dtype_size(gs_dtype_t dtype)
{
  switch (dtype) {
  case GS_DTYPE_FLOAT32:
    return 4;
  case GS_DTYPE_FLOAT16:
  case GS_DTYPE_BFLOAT16:
    return 2;
  case GS_DTYPE_FLOAT64:
    return 8;
  }
  return 0;
}

const char *gs_dtype_name(gs_dtype_t dtype)
{
  switch (dtype) {
  case GS_DTYPE_FLOAT32:
    return "float32";
  case GS_DTYPE_FLOAT16:
    return "float16";
  case GS_DTYPE_BFLOAT16:
    return "bfloat16";
  case GS_DTYPE_FLOAT64:
    return "float64";
  }
  return "unknown";
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* A parameter's size in bytes. Element counts come off the wire, so the
 * product saturates instead of wrapping: a huge parameter then compares as
 * over any threshold, which is what it is. */
static uint64_t param_bytes(const gs_param_desc_t *p)
{
  uint64_t size = gs_dtype_size(p->dtype);

  if (size && p->elements > UINT64_MAX / size)
    return UINT64_MAX;
  return p->elements * size;
}

static const char *param_name(const gs_param_desc_t *p)
{
  return p->name ? p->name : "?";
}

/* Pack `i` may run past the order array only in a list not yet validated;
 * the count is clamped so that even then nothing past it is read. */
uint64_t gs_packlist_pack_bytes(const gs_packlist_t *list, const gs_param_desc_t *params,
                                uint32_t first, uint32_t count)
{
  uint64_t bytes = 0;
  uint32_t i;

  if (first > list->param_count)
    return 0;
  if (count > list->param_count - first)
    count = list->param_count - first;
  for (i = first; i < first + count; i++)
    bytes = add_sat(bytes, param_bytes(&params[list->order[i]]));
  return bytes;
}

/* True when param `p` cannot join the open pack. Threshold 0 means packing
 * is off: one param per pack, even for params of zero bytes. */
static bool starts_pack(const gs_param_desc_t *p, gs_dtype_t dtype, uint64_t bytes,
                        uint64_t threshold)
{
  return threshold == 0 || p->dtype != dtype || add_sat(bytes, param_bytes(p)) > threshold;
}

/* Fills `order` and `sizes` (both with room for n entries) walking the
 * params from last to first, and returns the number of packs. */
static uint32_t fill_packs(const gs_param_desc_t *params, uint32_t n, uint64_t threshold,
                           uint32_t *order, uint32_t *sizes)
{
  uint32_t packs = 0, k = 0, i = n;
  uint64_t bytes = 0;
  gs_dtype_t dtype = GS_DTYPE_FLOAT32;

  while (i-- > 0) {
    const gs_param_desc_t *p = &params[i];

    if (packs == 0 || starts_pack(p, dtype, bytes, threshold)) {
      sizes[packs++] = 0;
      bytes = 0;
      dtype = p->dtype;
    }
    sizes[packs - 1]++;
    bytes = add_sat(bytes, param_bytes(p));
    order[k++] = i;
  }
  return packs;
}

int gs_packlist_compute(const gs_param_desc_t *params, uint32_t n, uint64_t threshold_bytes,
                        gs_packlist_t *out)
{
  uint32_t *order = NULL, *sizes = NULL;
  uint32_t i, packs = 0;

  for (i = 0; i < n; i++) {
    if (gs_dtype_size(params[i].dtype) == 0)
      return GS_EINVAL;
  }
  if (n > 0) {
    order = malloc(sizeof(*order) * n);
    if (!order)
      goto out_nomem;
    sizes = malloc(sizeof(*sizes) * n);
    if (!sizes)
      goto out_free_order;
    packs = fill_packs(params, n, threshold_bytes, order, sizes);
  }
  out->threshold_bytes = threshold_bytes;
  out->param_count = n;
  out->pack_count = packs;
  out->pack_sizes = sizes;
  out->order = order;
  return 0;

out_free_order:
  free(order);
out_nomem:
  return GS_ENOMEM;
}

void gs_packlist_free(gs_packlist_t *list)
{
  free(list->pack_sizes);
  free(list->order);
  list->threshold_bytes = 0;
  list->param_count = 0;
  list->pack_count = 0;
  list->pack_sizes = NULL;
  list->order = NULL;
}

/* Checks the shape alone: arrays present, no empty pack, and pack sizes
 * that cover the order array exactly, so the walk that follows stays
 * inside it. */
static int check_shape(const gs_packlist_t *list, char *why, size_t why_len)
{
  uint64_t sum = 0;
  uint32_t i;

  if (list->pack_count > 0 && !list->pack_sizes)
    return gs_why(GS_EINVAL, why, why_len, "pack_count is %" PRIu32 " but pack_sizes is missing",
                  list->pack_count);
  if (list->param_count > 0 && !list->order)
    return gs_why(GS_EINVAL, why, why_len, "param_count is %" PRIu32 " but order is missing",
                  list->param_count);
  for (i = 0; i < list->pack_count; i++) {
    if (list->pack_sizes[i] == 0)
      return gs_why(GS_EINVAL, why, why_len, "pack %" PRIu32 " is empty", i);
    sum += list->pack_sizes[i];
  }
  if (sum != list->param_count)
    return gs_why(GS_EINVAL, why, why_len,
                  "pack sizes add up to %" PRIu64 ", but %" PRIu32 " params", sum,
                  list->param_count);
  return 0;
}

/* What the per-pack checks share while one list is validated. `seen[i]` is
 * the pack param i was found in, or UINT32_MAX. */
struct validation {
  const gs_packlist_t *list;
  const gs_param_desc_t *params;
  uint32_t n;
  uint32_t *seen;
  char *why;
  size_t why_len;
};

/* Checks entry `j` of the order array, in pack `pack` whose first param is
 * `head`: index in range, seen for the first time, a known dtype, and the
 * same dtype as the head's. */
static int check_entry(struct validation *v, uint32_t pack, uint32_t j, uint32_t head)
{
  uint32_t idx = v->list->order[j];
  const gs_param_desc_t *p, *h;

  if (idx >= v->n)
    return gs_why(GS_EINVAL, v->why, v->why_len,
                  "index %" PRIu32 " out of range (%" PRIu32 " params)", idx, v->n);
  p = &v->params[idx];
  if (v->seen[idx] != UINT32_MAX)
    return gs_why(GS_EINVAL, v->why, v->why_len,
                  "param %" PRIu32 " (%s) appears in pack %" PRIu32 " and pack %" PRIu32, idx,
                  param_name(p), v->seen[idx], pack);
  v->seen[idx] = pack;
  if (gs_dtype_size(p->dtype) == 0)
    return gs_why(GS_EINVAL, v->why, v->why_len, "param %" PRIu32 " (%s) has unknown dtype %d", idx,
                  param_name(p), (int)p->dtype);
  h = &v->params[head]; /* in range: the head was checked first */
  if (p->dtype != h->dtype)
    return gs_why(GS_EINVAL, v->why, v->why_len,
                  "pack %" PRIu32 " mixes %s (param %" PRIu32 " %s) and %s"
                  " (param %" PRIu32 " %s)",
                  pack, gs_dtype_name(h->dtype), head, param_name(h), gs_dtype_name(p->dtype), idx,
                  param_name(p));
  return 0;
}

/* Checks every entry of pack `pack`, which starts at `first` in the order
 * array, then its size against the threshold; a pack of one param may be
 * over it. */
static int check_pack(struct validation *v, uint32_t pack, uint32_t first)
{
  uint32_t count = v->list->pack_sizes[pack], head = v->list->order[first], j;
  uint64_t bytes;
  int err;

  for (j = first; j < first + count; j++) {
    err = check_entry(v, pack, j, head);
    if (err)
      return err;
  }
  bytes = gs_packlist_pack_bytes(v->list, v->params, first, count);
  if (count > 1 && bytes > v->list->threshold_bytes)
    return gs_why(GS_EINVAL, v->why, v->why_len,
                  "pack %" PRIu32 " holds %" PRIu32 " params totalling %" PRIu64
                  " bytes, over the threshold of %" PRIu64,
                  pack, count, bytes, v->list->threshold_bytes);
  return 0;
}

/* After every pack passed, a param still unseen is one the list left out
 * (possible when the list orders fewer params than there are). */
static int check_all_seen(const struct validation *v)
{
  uint32_t i;

  for (i = 0; i < v->n; i++) {
    if (v->seen[i] == UINT32_MAX)
      return gs_why(GS_EINVAL, v->why, v->why_len, "param %" PRIu32 " (%s) is in no pack", i,
                    param_name(&v->params[i]));
  }
  return 0;
}

/* Checks in the order the problems are reported: shape, then each pack in
 * turn, then params left out. The one allocation (which pack each param
 * was seen in) keeps the check linear in the number of params; failing it
 * is GS_ENOMEM, not a verdict on the list. */
int gs_packlist_validate(const gs_packlist_t *list, const gs_param_desc_t *params, uint32_t n,
                         char *why, size_t why_len)
{
  struct validation v = {list, params, n, NULL, why, why_len};
  uint32_t pack, first = 0, i;
  int err;

  if (!list)
    return gs_why(GS_EINVAL, why, why_len, "no pack list");
  err = check_shape(list, why, why_len);
  if (err)
    return err;
  if (n > 0) {
    v.seen = malloc(sizeof(*v.seen) * n);
    if (!v.seen) {
      gs_why(GS_EINVAL, why, why_len, "out of memory checking %" PRIu32 " params", n);
      return GS_ENOMEM;
    }
  }
  for (i = 0; i < n; i++)
    v.seen[i] = UINT32_MAX;
  for (pack = 0; pack < list->pack_count; pack++) {
    err = check_pack(&v, pack, first);
    if (err)
      goto out_free_seen;
    first += list->pack_sizes[pack];
  }
  err = check_all_seen(&v);

out_free_seen:
  free(v.seen);
  return err;
}
