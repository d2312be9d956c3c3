/* The optimizers the engine runs fused over a pack: one pass over a pack's
 * contiguous params, reduced gradients and state, with torch.optim's
 * arithmetic (PyTorch 1.13's single-tensor loops), in float32. Per
 * element, with g the summed gradient times grad_scale (negated when the
 * group maximizes) and t the step number (1 on the first step):
 *
 *   SGD:   d = g + wd * p
 *          buf = t == 1 ? d : momentum * buf + (1 - dampening) * d
 *          d = nesterov ? d + momentum * buf : buf    (momentum 0: d)
 *          p = p - lr * d
 *   Adam:  g = g + wd * p                   (AdamW instead: p = p * (1 - lr * wd))
 *          m = beta1 * m + (1 - beta1) * g
 *          v = beta2 * v + (1 - beta2) * g * g
 *          vmax = max(vmax, v)              (amsgrad; then vmax stands for v below)
 *          p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * The types the engine's configuration uses (gs_optim_kind_t,
 * gs_optim_group_t) are public (gradsync/engine.h). */
#ifndef GS_OPTIM_H
#define GS_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h>

/* A run of elements of one pack in one parameter group (one parameter tensor). */
typedef struct gs_optim_segment {
  size_t offset, count;
  uint32_t group;
} gs_optim_segment_t;

/* One step's settings besides the buffers: the groups as they are at this
 * step (lr resolved: schedule and elastic scaling applied), the step
 * number, and the factor that makes the summed gradients the ones to use
 * (1 / world for a mean). The gate holds what only the device knows when
 * the update is queued, read when it runs (device memory; NULL: none), so
 * that no host waits for it: the update does nothing when *skip or *veto
 * is not 0 (the sums are not finite; a loss scaler's found_inf), and the
 * gradients are multiplied by *factor (clipping's coefficient). */
typedef struct gs_optim_gate {
  const float *skip, *veto, *factor;
} gs_optim_gate_t;

typedef struct gs_optim_step {
  gs_optim_kind_t kind;
  const gs_optim_group_t *groups;
  uint32_t ngroups;
  uint64_t t;
  float grad_scale;
  gs_optim_gate_t gate;
} gs_optim_step_t;

/* A group's constants at one step, as both the CPU loops and the CUDA
 * kernel use them: the bias corrections computed once, in double, as
 * torch does, then rounded to float. */
typedef struct gs_optim_coef {
  float scale;  /* grad_scale, negated to maximize */
  float lr, wd; /* SGD: lr; SGD and Adam: wd added to the gradient (AdamW: 0) */
  float mom;    /* SGD: momentum */
  float m,
      keep; /* SGD: the buffer's factors: momentum and 1 - dampening, 0 and 1 on the first step */
  float decay;          /* AdamW: 1 - lr * wd; else 1 */
  float b1, c1, b2, c2; /* Adam: beta1, 1 - beta1, beta2, 1 - beta2 */
  float neg_step;       /* Adam: -lr / (1 - beta1^t) */
  float bc2_sqrt;       /* Adam: sqrt(1 - beta2^t) */
  float eps;
  bool nesterov, amsgrad;
} gs_optim_coef_t;

void gs_optim_coef(const gs_optim_step_t *s, const gs_optim_group_t *g, gs_optim_coef_t *out);

/* State buffers per element the optimizer needs: SGD 1 (the momentum
 * buffer), Adam and AdamW 2, 3 when a group uses amsgrad, none 0. */
uint32_t gs_optim_state_count(gs_optim_kind_t kind, const gs_optim_group_t *groups,
                              uint32_t ngroups);

/* Updates a pack: `state` holds gs_optim_state_count buffers of the
 * pack's length. The gate is the caller's to apply (host memory here: see
 * gs_optim_gate_open). */
void gs_optim_step_pack(const gs_optim_step_t *s, const gs_optim_segment_t *segs, uint32_t nseg,
                        float *param, const float *grad, float *const *state);

/* The gate read on the host (the cpu device, whose device memory is host
 * memory): false when the update is skipped; else `out` is `s` with the
 * gate's factor folded into grad_scale. */
bool gs_optim_gate_open(const gs_optim_step_t *s, gs_optim_step_t *out);

/* x[0..n) *= factor. */
void gs_optim_scale(float *x, size_t n, float factor);

/* The index of the first NaN or infinity among g[0..n), or n when every
 * value is finite: one fast pass, then a search only where one is found. */
size_t gs_optim_first_nonfinite(const float *g, size_t n);

#endif
