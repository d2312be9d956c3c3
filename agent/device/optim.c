/* The fused optimizers over a pack (optim.h), and the public helpers of
 * their configuration: names, torch's defaults, the checks torch.optim
 * makes. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "optim.h"
#include "parse.h"
#include "vectorize.h"

static const char *const kind_names[] = {
    [GS_OPTIM_SGD] = "sgd",
    [GS_OPTIM_ADAM] = "adam",
    [GS_OPTIM_ADAMW] = "adamw",
    [GS_OPTIM_NONE] = "none",
};

static const char *const nonfinite_names[] = {
    [GS_NONFINITE_STOP] = "stop",
    [GS_NONFINITE_SKIP] = "skip",
    [GS_NONFINITE_OFF] = "off",
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

GS_DEFINE_ENUM_NAMES(gs_optim_kind_parse, gs_optim_kind_name, gs_optim_kind_t, kind_names)
GS_DEFINE_ENUM_NAMES(gs_nonfinite_parse, gs_nonfinite_name, gs_nonfinite_t, nonfinite_names)

void gs_optim_group_default(gs_optim_kind_t kind, gs_optim_group_t *g)
{
  *g = (gs_optim_group_t){
      .lr = 1e-3,
      .weight_decay = kind == GS_OPTIM_ADAMW ? 1e-2 : 0.0,
      .beta1 = 0.9,
      .beta2 = 0.999,
      .eps = 1e-8,
  };
}

static int reject(char *why, size_t why_len, const char *what, double value)
{
  if (why && why_len)
    snprintf(why, why_len, "%s (got %g)", what, value);
  return GS_EINVAL;
}

static bool non_negative(double v)
{
  return isfinite(v) && v >= 0.0;
}

int gs_optim_group_check(gs_optim_kind_t kind, const gs_optim_group_t *g, char *why, size_t why_len)
{
  if ((size_t)kind >= COUNT(kind_names))
    return reject(why, why_len, "unknown optimizer", (double)kind);
  if (kind == GS_OPTIM_NONE) /* the caller's optimizer reads its own */
    return 0;
  if (!non_negative(g->lr))
    return reject(why, why_len, "lr must be a finite number >= 0", g->lr);
  if (!non_negative(g->weight_decay))
    return reject(why, why_len, "weight_decay must be a finite number >= 0", g->weight_decay);
  if (kind == GS_OPTIM_SGD) {
    if (!(g->momentum >= 0.0 && g->momentum < 1.0))
      return reject(why, why_len, "momentum must be in [0, 1)", g->momentum);
    if (!(g->dampening >= 0.0 && g->dampening <= 1.0))
      return reject(why, why_len, "dampening must be in [0, 1]", g->dampening);
    if (g->nesterov && (g->momentum <= 0.0 || g->dampening != 0.0))
      return reject(why, why_len, "nesterov needs momentum > 0 and dampening 0; momentum",
                    g->momentum);
    return 0;
  }
  if (!(g->beta1 >= 0.0 && g->beta1 < 1.0))
    return reject(why, why_len, "betas[0] must be in [0, 1)", g->beta1);
  if (!(g->beta2 >= 0.0 && g->beta2 < 1.0))
    return reject(why, why_len, "betas[1] must be in [0, 1)", g->beta2);
  if (!non_negative(g->eps))
    return reject(why, why_len, "eps must be a finite number >= 0", g->eps);
  return 0;
}

uint32_t gs_optim_state_count(gs_optim_kind_t kind, const gs_optim_group_t *groups,
                              uint32_t ngroups)
{
  if (kind == GS_OPTIM_SGD)
    return 1;
  if (kind == GS_OPTIM_NONE)
    return 0;
  for (uint32_t i = 0; i < ngroups; i++)
    if (groups[i].amsgrad)
      return 3;
  return 2;
}

void gs_optim_coef(const gs_optim_step_t *s, const gs_optim_group_t *g, gs_optim_coef_t *out)
{
  double t = (double)(s->t ? s->t : 1);
  bool first = s->t <= 1, decoupled = s->kind == GS_OPTIM_ADAMW;

  *out = (gs_optim_coef_t){
      .scale = g->maximize ? -s->grad_scale : s->grad_scale,
      .lr = (float)g->lr,
      .mom = (float)g->momentum,
      .wd = decoupled ? 0.0f : (float)g->weight_decay,
      /* The first step's buffer is d itself: buf is 0 there, and keep 1. */
      .m = first ? 0.0f : (float)g->momentum,
      .keep = first ? 1.0f : (float)(1.0 - g->dampening),
      .decay = decoupled ? (float)(1.0 - g->lr * g->weight_decay) : 1.0f,
      .b1 = (float)g->beta1,
      .c1 = (float)(1.0 - g->beta1),
      .b2 = (float)g->beta2,
      .c2 = (float)(1.0 - g->beta2),
      .eps = (float)g->eps,
      .nesterov = g->nesterov,
      .amsgrad = g->amsgrad,
  };
  if (s->kind != GS_OPTIM_SGD) {
    out->neg_step = (float)(-g->lr / (1.0 - pow(g->beta1, t)));
    out->bc2_sqrt = (float)sqrt(1.0 - pow(g->beta2, t));
  }
}

/* ---- SGD ---------------------------------------------------------------- */

/* Plain SGD (momentum 0) over one segment. */
GS_WIDE static void sgd_plain(float *restrict p, const float *restrict g, size_t n,
                              gs_optim_coef_t c)
{
  for (size_t i = 0; i < n; i++)
    p[i] -= c.lr * (g[i] * c.scale + c.wd * p[i]);
}

/* Heavy-ball momentum: buf = m * buf + keep * d; p -= lr * buf. */
GS_WIDE static void sgd_momentum(float *restrict p, const float *restrict g, float *restrict buf,
                                 size_t n, gs_optim_coef_t c)
{
  for (size_t i = 0; i < n; i++) {
    float b = c.m * buf[i] + c.keep * (g[i] * c.scale + c.wd * p[i]);

    buf[i] = b;
    p[i] -= c.lr * b;
  }
}

/* Nesterov momentum (dampening 0): buf = m * buf + d; p -= lr * (d + mom * buf). */
GS_WIDE static void sgd_nesterov(float *restrict p, const float *restrict g, float *restrict buf,
                                 size_t n, gs_optim_coef_t c)
{
  for (size_t i = 0; i < n; i++) {
    float d = g[i] * c.scale + c.wd * p[i];
    float b = c.m * buf[i] + d;

    buf[i] = b;
    p[i] -= c.lr * (d + c.mom * b);
  }
}

/* ---- Adam, AdamW -------------------------------------------------------- */

/* One element; with amsgrad the running maximum of v stands for v in the
 * denominator. AdamW's c.wd is 0 and Adam's c.decay 1. */
#define ADAM_ELEMENT(i, AMS)                                                                       \
  do {                                                                                             \
    float gi = g[i] * c.scale + c.wd * p[i], vi;                                                   \
                                                                                                   \
    p[i] *= c.decay;                                                                               \
    m[i] = m[i] * c.b1 + c.c1 * gi;                                                                \
    vi = v[i] * c.b2 + c.c2 * gi * gi;                                                             \
    v[i] = vi;                                                                                     \
    if (AMS) {                                                                                     \
      vi = vmax[i] > vi ? vmax[i] : vi;                                                            \
      vmax[i] = vi;                                                                                \
    }                                                                                              \
    p[i] += c.neg_step * (m[i] / (sqrtf(vi) / c.bc2_sqrt + c.eps));                                \
  } while (0)

/* optim.c builds with -fno-math-errno (device/CMakeLists.txt): sqrtf of a
 * value >= 0 never sets errno, and a call that might would keep the
 * vectorizer off the loop (an optimize attribute does not reach the
 * target clones). */
GS_WIDE static void adam_plain(float *restrict p, const float *restrict g, float *restrict m,
                               float *restrict v, size_t n, gs_optim_coef_t c)
{
  float *vmax = NULL; /* unused: AMS is 0 */

  (void)vmax;
  for (size_t i = 0; i < n; i++)
    ADAM_ELEMENT(i, 0);
}

GS_WIDE static void adam_amsgrad(float *restrict p, const float *restrict g, float *restrict m,
                                 float *restrict v, float *restrict vmax, size_t n,
                                 gs_optim_coef_t c)
{
  for (size_t i = 0; i < n; i++)
    ADAM_ELEMENT(i, 1);
}

void gs_optim_step_pack(const gs_optim_step_t *s, const gs_optim_segment_t *segs, uint32_t nseg,
                        float *param, const float *grad, float *const *state)
{
  for (uint32_t k = 0; s->kind != GS_OPTIM_NONE && k < nseg; k++) {
    const gs_optim_group_t *g = &s->groups[segs[k].group];
    size_t off = segs[k].offset, n = segs[k].count;
    float *p = param + off;
    const float *gr = grad + off;
    gs_optim_coef_t c;

    gs_optim_coef(s, g, &c);
    if (s->kind != GS_OPTIM_SGD && c.amsgrad && state[2])
      adam_amsgrad(p, gr, state[0] + off, state[1] + off, state[2] + off, n, c);
    else if (s->kind != GS_OPTIM_SGD)
      adam_plain(p, gr, state[0] + off, state[1] + off, n, c);
    else if (c.mom == 0.0f)
      sgd_plain(p, gr, n, c);
    else if (c.nesterov)
      sgd_nesterov(p, gr, state[0] + off, n, c);
    else
      sgd_momentum(p, gr, state[0] + off, n, c);
  }
}

bool gs_optim_gate_open(const gs_optim_step_t *s, gs_optim_step_t *out)
{
  const gs_optim_gate_t *g = &s->gate;

  if ((g->skip && *g->skip != 0.0f) || (g->veto && *g->veto != 0.0f))
    return false;
  *out = *s;
  if (g->factor)
    out->grad_scale *= *g->factor;
  return true;
}

GS_WIDE void gs_optim_scale(float *restrict x, size_t n, float factor)
{
  for (size_t i = 0; i < n; i++)
    x[i] *= factor;
}

/* ---- non-finite gradients ------------------------------------------------ */

#define SCAN 4096 /* elements summed before looking: the common case is one flag test per block */

/* x - x is 0 for every finite x and NaN for NaN and the infinities: an
 * integer OR over the comparisons, which the vectorizer takes (a float
 * sum it would not reorder). */
GS_WIDE static bool block_finite(const float *restrict g, size_t n)
{
  int bad = 0;

  for (size_t i = 0; i < n; i++)
    bad |= (g[i] - g[i]) != 0.0f;
  return !bad;
}

size_t gs_optim_first_nonfinite(const float *g, size_t n)
{
  for (size_t at = 0; at < n; at += SCAN) {
    size_t len = n - at < SCAN ? n - at : SCAN;

    if (block_finite(g + at, len))
      continue;
    for (size_t i = at; i < at + len; i++)
      if (!isfinite(g[i]))
        return i;
  }
  return n;
}
