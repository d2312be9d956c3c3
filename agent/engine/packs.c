/* The parameter registry and the pack buffers that store the parameters. */
#include "packs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "invariant.h"

#define PACK_ALIGN 64 /* a cache line: lets the optimizer and reduce loops vectorize cleanly */

void gs_packs_init(gs_packs_t *p)
{
  memset(p, 0, sizeof(*p));
}

void gs_packs_free(gs_packs_t *p)
{
  for (uint32_t i = 0; p->packs && i < p->list.pack_count; i++) {
    gs_device_free(p->dev, p->packs[i].params);
    gs_device_free(p->dev, p->packs[i].grads);
    for (uint32_t w = 0; w < GS_PACK_WINDOWS; w++) {
      for (uint32_t k = 0; k < GS_OPTIM_MAX_STATE; k++)
        gs_device_free(p->dev, p->packs[i].win[w].state[k]);
      free(p->packs[i].win[w].segs);
    }
    gs_device_free(p->dev, p->packs[i].wire);
    free(p->packs[i].segs);
  }
  free(p->packs);
  for (uint32_t i = 0; i < p->nparams; i++)
    free((char *)p->params[i].name);
  free(p->params);
  free(p->rules);
  free(p->group_of);
  free(p->pack_of);
  free(p->offset_of);
  gs_packlist_free(&p->list);
  memset(p, 0, sizeof(*p));
}

int gs_packs_register(gs_packs_t *p, const char *name, uint64_t elements, bool is_bias)
{
  char *copy;

  if (!name || !*name || elements == 0 || p->packs)
    return GS_EINVAL;
  for (uint32_t i = 0; i < p->nparams; i++)
    if (strcmp(p->params[i].name, name) == 0)
      return GS_EEXIST;
  if (p->nparams == p->cap) {
    uint32_t cap = p->cap ? 2 * p->cap : 16;
    gs_param_desc_t *params = realloc(p->params, cap * sizeof(*params));
    gs_param_rule_t *rules;
    uint32_t *groups;

    if (!params)
      return GS_ENOMEM;
    p->params = params;
    rules = realloc(p->rules, cap * sizeof(*rules));
    if (!rules)
      return GS_ENOMEM;
    p->rules = rules;
    groups = realloc(p->group_of, cap * sizeof(*groups));
    if (!groups)
      return GS_ENOMEM;
    p->group_of = groups;
    p->cap = cap;
  }
  copy = strdup(name);
  if (!copy)
    return GS_ENOMEM;
  p->params[p->nparams] = (gs_param_desc_t){copy, elements, GS_DTYPE_FLOAT32};
  p->rules[p->nparams] = (gs_param_rule_t){.is_bias = is_bias};
  p->group_of[p->nparams] = 0;
  return (int)p->nparams++;
}

int gs_packs_set_group(gs_packs_t *p, uint32_t i, uint32_t group)
{
  if (i >= p->nparams || p->packs)
    return GS_EINVAL;
  p->group_of[i] = group;
  return 0;
}

void gs_packs_signature(const gs_packs_t *p, gradsync_ModelSignature *sig)
{
  uint64_t shapes = GS_FNV1A64_SEED, dtypes = GS_FNV1A64_SEED, total = 0;

  for (uint32_t i = 0; i < p->nparams; i++) {
    uint32_t dt = p->params[i].dtype;

    shapes = gs_fnv1a64(shapes, &p->params[i].elements, sizeof(p->params[i].elements));
    dtypes = gs_fnv1a64(dtypes, &dt, sizeof(dt));
    total += p->params[i].elements;
  }
  sig->param_count = p->nparams;
  sig->total_elements = total;
  sig->shapes_hash = shapes;
  sig->dtypes_hash = dtypes;
}

/* Whether the list's params are exactly ours (a list from a rank with another
 * model must be refused before any buffer is sized by it). */
static int check_params(const gs_packs_t *p, const gs_param_desc_t *lp, uint32_t n, char *why,
                        size_t why_len)
{
  if (n != p->nparams) {
    snprintf(why, why_len, "the pack list has %u params, this model has %u", n, p->nparams);
    return GS_EINVAL;
  }
  for (uint32_t i = 0; i < n; i++) {
    const gs_param_desc_t *a = &p->params[i], *b = &lp[i];

    if (strcmp(a->name, b->name ? b->name : "") != 0 || a->elements != b->elements ||
        a->dtype != b->dtype) {
      snprintf(why, why_len,
               "param %u differs: the pack list has '%s' (%llu x %s), this model '%s' (%llu x %s)",
               i, b->name ? b->name : "?", (unsigned long long)b->elements, gs_dtype_name(b->dtype),
               a->name, (unsigned long long)a->elements, gs_dtype_name(a->dtype));
      return GS_EINVAL;
    }
  }
  return 0;
}

/* Zeroed device memory for n floats, rounded up to whole cache lines. */
static float *alloc_floats(gs_packs_t *p, size_t n)
{
  size_t bytes = (n * sizeof(float) + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN;

  return gs_device_alloc(p->dev, bytes ? bytes : PACK_ALIGN);
}

/* Allocates pack k's buffers and segment table; `at` is its first entry in order[]. */
static int build_pack(gs_packs_t *p, uint32_t k, uint32_t at, size_t extra, bool sharded)
{
  gs_pack_t *pk = &p->packs[k];
  size_t off = 0;

  pk->first = at;
  pk->nparams = p->list.pack_sizes[k];
  GS_ASSERT(at + pk->nparams <= p->nparams); /* the pack list was checked against the model */
  pk->segs = calloc(pk->nparams, sizeof(*pk->segs));
  if (!pk->segs)
    return GS_ENOMEM;
  for (uint32_t j = 0; j < pk->nparams; j++) {
    uint32_t i = p->list.order[at + j];

    GS_ASSERT(i < p->nparams);
    p->pack_of[i] = k;
    p->offset_of[i] = off;
    pk->segs[j] = (gs_optim_segment_t){off, p->params[i].elements, p->group_of[i]};
    off += p->params[i].elements;
  }
  pk->elements = off;
  pk->extra = extra;
  pk->params = alloc_floats(p, off + p->pad);
  pk->grads = alloc_floats(p, off + p->pad + extra);
  if (!pk->params || !pk->grads)
    return GS_ENOMEM;
  if (p->wire != GS_DTYPE_FLOAT32) {
    pk->wire = (uint16_t *)alloc_floats(p, (off + p->pad + 1) / 2);
    if (!pk->wire)
      return GS_ENOMEM;
  }
  return sharded ? 0 : gs_packs_set_window(p, k, GS_WINDOW_OWN, 0, off);
}

int gs_packs_set_window(gs_packs_t *p, uint32_t k, uint32_t w, size_t off, size_t len)
{
  gs_pack_t *pk = &p->packs[k];
  gs_pack_window_t *win = &pk->win[w];
  gs_optim_segment_t *segs;
  uint32_t n = 0;

  if (w >= GS_PACK_WINDOWS || off > pk->elements || len > pk->elements - off)
    return GS_EINVAL;
  if (win->segs && win->off == off && win->len == len)
    return 0;
  segs = calloc(pk->nparams ? pk->nparams : 1, sizeof(*segs));
  if (!segs)
    return GS_ENOMEM;
  for (uint32_t j = 0; j < pk->nparams; j++) { /* each segment's part in the window */
    size_t lo = pk->segs[j].offset > off ? pk->segs[j].offset : off;
    size_t hi = pk->segs[j].offset + pk->segs[j].count;

    hi = hi < off + len ? hi : off + len;
    if (lo < hi)
      segs[n++] = (gs_optim_segment_t){lo - off, hi - lo, pk->segs[j].group};
  }
  for (uint32_t s = 0; s < GS_OPTIM_MAX_STATE; s++) {
    gs_device_free(p->dev, win->state[s]);
    win->state[s] = NULL;
  }
  free(win->segs);
  *win = (gs_pack_window_t){.off = off, .len = len, .segs = segs, .nseg = n};
  for (uint32_t s = 0; s < p->nstate; s++) {
    win->state[s] = alloc_floats(p, len);
    if (!win->state[s])
      return GS_ENOMEM;
  }
  return 0;
}

uint64_t gs_packs_state_bytes(const gs_packs_t *p)
{
  uint64_t bytes = 0;

  for (uint32_t k = 0; p->packs && k < p->list.pack_count; k++)
    for (uint32_t w = 0; w < GS_PACK_WINDOWS; w++)
      bytes += (uint64_t)p->packs[k].win[w].len * p->nstate * sizeof(float);
  return bytes;
}

int gs_packs_build(gs_packs_t *p, gs_device_t *dev, gs_packlist_t *list,
                   const gs_param_desc_t *list_params, uint32_t list_nparams,
                   const gs_packs_layout_t *layout, char *why, size_t why_len)
{
  uint32_t at = 0, last;
  int err;

  err = check_params(p, list_params, list_nparams, why, why_len);
  if (err == 0)
    err = gs_packlist_validate(list, p->params, p->nparams, why, why_len);
  if (err) {
    gs_packlist_free(list);
    return err;
  }
  p->dev = dev;
  p->nstate = layout->nstate;
  p->wire = layout->wire;
  p->pad = layout->pad;
  p->list = *list;
  memset(list, 0, sizeof(*list));
  p->packs = calloc(p->list.pack_count ? p->list.pack_count : 1, sizeof(*p->packs));
  p->pack_of = calloc(p->nparams ? p->nparams : 1, sizeof(*p->pack_of));
  p->offset_of = calloc(p->nparams ? p->nparams : 1, sizeof(*p->offset_of));
  if (!p->packs || !p->pack_of || !p->offset_of)
    goto out_nomem;
  last = p->nparams ? 0 : UINT32_MAX;
  for (uint32_t k = 0; k < p->list.pack_count; k++) {
    bool holds_first = false;

    for (uint32_t j = 0; j < p->list.pack_sizes[k]; j++)
      holds_first |= p->list.order[at + j] == last;
    if (build_pack(p, k, at, holds_first ? layout->extra : 0, layout->sharded))
      goto out_nomem;
    at += p->list.pack_sizes[k];
  }
  return 0;

out_nomem:
  snprintf(why, why_len, "out of memory allocating the packs");
  return GS_ENOMEM;
}

/* Param i's place in its pack: inside it (the offsets were cut from it). */
static size_t param_at(const gs_packs_t *p, uint32_t i)
{
  GS_ASSERT(i < p->nparams &&
            p->offset_of[i] + p->params[i].elements <= p->packs[p->pack_of[i]].elements);
  return p->offset_of[i];
}

float *gs_packs_param(const gs_packs_t *p, uint32_t i)
{
  return p->packs[p->pack_of[i]].params + param_at(p, i);
}

float *gs_packs_grad(const gs_packs_t *p, uint32_t i)
{
  return p->packs[p->pack_of[i]].grads + param_at(p, i);
}

uint32_t gs_packs_last(const gs_packs_t *p)
{
  return p->pack_of[0];
}

uint64_t gs_packs_layout_hash(const gs_packs_t *p)
{
  uint64_t h =
      gs_fnv1a64(GS_FNV1A64_SEED, &p->list.threshold_bytes, sizeof(p->list.threshold_bytes));

  for (uint32_t k = 0; k < p->list.pack_count; k++) {
    const gs_pack_t *pk = &p->packs[k];

    h = gs_fnv1a64(h, &pk->nparams, sizeof(pk->nparams));
    for (uint32_t j = 0; j < pk->nparams; j++) {
      const gs_param_desc_t *d = &p->params[p->list.order[pk->first + j]];
      uint32_t dt = d->dtype;

      h = gs_fnv1a64(h, d->name, strlen(d->name) + 1);
      h = gs_fnv1a64(h, &d->elements, sizeof(d->elements));
      h = gs_fnv1a64(h, &dt, sizeof(dt));
    }
  }
  return h;
}
