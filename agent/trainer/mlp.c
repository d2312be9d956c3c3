/* The reference model: a multilayer perceptron on a compute device (see
 * mlp.h).
 *
 * Layer l (0-based here, "fc<l+1>" to the user) maps [batch x in] to
 * [batch x out] with W [out x in] and b [out]: h = act(x W^T + b), ReLU on
 * every layer but the last, whose output is the logits. All scratch (each
 * layer's output and the gradient with respect to it) is allocated once,
 * for max_batch, so forward and backward never allocate. */
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"
#include "why.h"
#include "rng.h"

#include "kernels.h"

#define MLP_MAX_WIDTHS 16
#define MLP_MAX_WIDTH 1000000u
#define MLP_ALIGN_FLOATS 16 /* scratch buffers start on 64-byte boundaries */

typedef struct mlp_layer {
  uint32_t in, out;
  float *w, *b;   /* bound parameter views */
  float *gw, *gb; /* bound gradient views */
  float *h;       /* [max_batch x out]: the output (post-ReLU; logits on top) */
  float *dh;      /* [max_batch x out]: d(loss)/d(pre-activation) */
  char wname[24], bname[24];
} mlp_layer_t;

struct gs_mlp {
  uint32_t nlayers, max_batch;
  uint32_t batch; /* of the last successful forward; 0 when there is none */
  gs_device_t *dev;
  gs_kernels_t *kn; /* the layer kernels for dev's kind */
  float *scratch;   /* device memory holding every layer's h and dh */
  float *stats;     /* device: summed loss and correct count of the last forward */
  mlp_layer_t layer[MLP_MAX_WIDTHS - 1];
};

/* Checks the widths and batch size gs_mlp_new accepts. */
static int check_shape(const uint32_t *sizes, uint32_t n, uint32_t max_batch, char *why,
                       size_t why_len)
{
  uint32_t i;

  if (!sizes || n < 2 || n > MLP_MAX_WIDTHS) {
    gs_set_why(why, why_len, "an MLP needs 2 to %d layer widths (input first), got %u",
               MLP_MAX_WIDTHS, sizes ? n : 0);
    return GS_EINVAL;
  }
  for (i = 0; i < n; i++) {
    if (sizes[i] < 1 || sizes[i] > MLP_MAX_WIDTH) {
      gs_set_why(why, why_len, "layer width %u (entry %u) is outside 1..%u", sizes[i], i + 1,
                 MLP_MAX_WIDTH);
      return GS_EINVAL;
    }
  }
  if (max_batch < 1 || max_batch > INT_MAX) {
    gs_set_why(why, why_len, "batch size %u is outside 1..%d", max_batch, INT_MAX);
    return GS_EINVAL;
  }
  return 0;
}

/* Floats of one scratch buffer of `rows` x `cols`, rounded up to keep the
 * next one aligned; false on overflow. */
static bool buffer_floats(size_t rows, size_t cols, size_t *out)
{
  size_t f;

  if (__builtin_mul_overflow(rows, cols, &f) || f > SIZE_MAX - MLP_ALIGN_FLOATS)
    return false;
  *out = (f + MLP_ALIGN_FLOATS - 1) / MLP_ALIGN_FLOATS * MLP_ALIGN_FLOATS;
  return true;
}

/* Allocates every layer's h and dh for max_batch rows in one block. */
static int alloc_scratch(gs_mlp_t *m, char *why, size_t why_len)
{
  size_t total = 0, each, bytes;
  float *at;
  uint32_t l;
  void *mem;

  for (l = 0; l < m->nlayers; l++) {
    if (!buffer_floats(m->max_batch, m->layer[l].out, &each) ||
        __builtin_add_overflow(total, each, &total) || __builtin_add_overflow(total, each, &total))
      goto out_too_big;
  }
  if (__builtin_add_overflow(total, MLP_ALIGN_FLOATS, &total) || /* + the stats */
      __builtin_mul_overflow(total, sizeof(float), &bytes))
    goto out_too_big;
  mem = gs_device_alloc(m->dev, bytes);
  if (!mem) {
    gs_set_why(why, why_len, "cannot allocate %zu bytes of activation scratch for batch %u", bytes,
               m->max_batch);
    return GS_ENOMEM;
  }
  m->scratch = mem;
  at = m->scratch;
  for (l = 0; l < m->nlayers; l++) {
    buffer_floats(m->max_batch, m->layer[l].out, &each);
    m->layer[l].h = at;
    m->layer[l].dh = at + each;
    at += 2 * each;
  }
  m->stats = at;
  return 0;

out_too_big:
  gs_set_why(why, why_len,
             "the activation scratch for batch %u does not fit in memory (size overflows)",
             m->max_batch);
  return GS_ENOMEM;
}

gs_mlp_t *gs_mlp_new(gs_device_t *dev, const uint32_t *sizes, uint32_t n, uint32_t max_batch,
                     char *why, size_t why_len)
{
  gs_mlp_t *m;
  uint32_t l;

  if (check_shape(sizes, n, max_batch, why, why_len))
    return NULL;
  m = calloc(1, sizeof(*m));
  if (!m) {
    gs_set_why(why, why_len, "cannot allocate the MLP (%zu bytes)", sizeof(*m));
    return NULL;
  }
  m->dev = dev;
  m->nlayers = n - 1;
  m->max_batch = max_batch;
  for (l = 0; l < m->nlayers; l++) {
    m->layer[l].in = sizes[l];
    m->layer[l].out = sizes[l + 1];
    snprintf(m->layer[l].wname, sizeof(m->layer[l].wname), "fc%u.weight", l + 1);
    snprintf(m->layer[l].bname, sizeof(m->layer[l].bname), "fc%u.bias", l + 1);
  }
  m->kn = gs_kernels_new(dev, why, why_len);
  if (!m->kn)
    goto out_free_model;
  if (alloc_scratch(m, why, why_len))
    goto out_free_kernels;
  return m;

out_free_kernels:
  gs_kernels_free(m->kn);
out_free_model:
  free(m);
  return NULL;
}

void gs_mlp_free(gs_mlp_t *m)
{
  if (!m)
    return;
  gs_device_free(m->dev, m->scratch);
  gs_kernels_free(m->kn);
  free(m);
}

/* Parses one width at *p, a run of decimal digits ending at ',' or the end;
 * advances *p past it. Values past the limit saturate to limit + 1. */
static int parse_width(const char **p, uint32_t *out)
{
  const char *s = *p;
  uint32_t v = 0;

  if (*s < '0' || *s > '9')
    return GS_EINVAL;
  for (; *s >= '0' && *s <= '9'; s++) {
    v = v * 10 + (uint32_t)(*s - '0');
    if (v > MLP_MAX_WIDTH)
      v = MLP_MAX_WIDTH + 1;
  }
  if (*s != ',' && *s != '\0')
    return GS_EINVAL;
  *p = s;
  *out = v;
  return 0;
}

int gs_mlp_parse_layers(const char *s, uint32_t *sizes, uint32_t cap, uint32_t *n, char *why,
                        size_t why_len)
{
  uint32_t tmp[MLP_MAX_WIDTHS], count = 0, limit = cap < MLP_MAX_WIDTHS ? cap : MLP_MAX_WIDTHS;
  const char *p = s;

  if (!s || !*s) {
    gs_set_why(why, why_len, "the layer list is empty: expected widths such as 784,256,128,10");
    return GS_EINVAL;
  }
  for (;;) {
    uint32_t v;

    if (parse_width(&p, &v)) {
      gs_set_why(why, why_len, "layer list \"%.64s\": entry %u is not a whole number", s,
                 count + 1);
      return GS_EINVAL;
    }
    if (v < 1 || v > MLP_MAX_WIDTH) {
      gs_set_why(why, why_len, "layer list \"%.64s\": entry %u is outside 1..%u", s, count + 1,
                 MLP_MAX_WIDTH);
      return GS_EINVAL;
    }
    if (count == limit) {
      gs_set_why(why, why_len, "layer list \"%.64s\" has more than %u widths", s, limit);
      return GS_EINVAL;
    }
    tmp[count++] = v;
    if (*p == '\0')
      break;
    p++; /* the comma */
  }
  if (count < 2) {
    gs_set_why(why, why_len, "layer list \"%.64s\" needs at least 2 widths (input and output)", s);
    return GS_EINVAL;
  }
  memcpy(sizes, tmp, count * sizeof(tmp[0]));
  *n = count;
  return 0;
}

uint32_t gs_mlp_param_count(const gs_mlp_t *m)
{
  return 2 * m->nlayers;
}

gs_param_desc_t gs_mlp_param_desc(const gs_mlp_t *m, uint32_t i)
{
  const mlp_layer_t *ly;

  if (i >= gs_mlp_param_count(m))
    return (gs_param_desc_t){NULL, 0, GS_DTYPE_FLOAT32};
  ly = &m->layer[i / 2];
  if (i % 2)
    return (gs_param_desc_t){ly->bname, ly->out, GS_DTYPE_FLOAT32};
  return (gs_param_desc_t){ly->wname, (uint64_t)ly->out * ly->in, GS_DTYPE_FLOAT32};
}

bool gs_mlp_param_is_bias(const gs_mlp_t *m, uint32_t i)
{
  return i < gs_mlp_param_count(m) && i % 2 == 1;
}

void gs_mlp_bind(gs_mlp_t *m, uint32_t i, float *param, float *grad)
{
  mlp_layer_t *ly;

  if (i >= gs_mlp_param_count(m))
    return;
  ly = &m->layer[i / 2];
  if (i % 2) {
    ly->b = param;
    ly->gb = grad;
  } else {
    ly->w = param;
    ly->gw = grad;
  }
}

/* Draws `n` values uniform in [-bound, bound) into p. */
static void fill_uniform(uint64_t *state, float *p, uint64_t n, double bound)
{
  uint64_t k;

  for (k = 0; k < n; k++) {
    double u = (double)(gs_splitmix64(state) >> 40) * 0x1p-24;

    p[k] = (float)(bound * (2.0 * u - 1.0));
  }
}

/* Draws each tensor on the host and uploads it (the draws of an unbound
 * tensor are still taken, so later tensors get the same values). */
int gs_mlp_init_params(gs_mlp_t *m, uint64_t seed)
{
  uint64_t state = seed, most = 0;
  uint32_t l;
  float *host;
  int err = 0;

  for (l = 0; l < m->nlayers; l++)
    if ((uint64_t)m->layer[l].out * m->layer[l].in > most)
      most = (uint64_t)m->layer[l].out * m->layer[l].in;
  host = gs_device_host_alloc(m->dev, most * sizeof(float));
  if (!host)
    return GS_ENOMEM;
  for (l = 0; l < m->nlayers && !err; l++) {
    mlp_layer_t *ly = &m->layer[l];
    double bound = 1.0 / sqrt((double)ly->in);
    uint64_t nw = (uint64_t)ly->out * ly->in;

    fill_uniform(&state, host, nw, bound);
    if (ly->w)
      err = gs_device_upload(m->dev, ly->w, host, nw * sizeof(float));
    if (!err)
      err = gs_device_sync(m->dev); /* host is reused for the next tensor */
    fill_uniform(&state, host, ly->out, bound);
    if (!err && ly->b)
      err = gs_device_upload(m->dev, ly->b, host, ly->out * sizeof(float));
    if (!err)
      err = gs_device_sync(m->dev);
  }
  gs_device_host_free(m->dev, host);
  return err;
}

void gs_mlp_inputs_from_pixels(gs_mlp_t *m, const uint8_t *pixels, float *x, size_t n)
{
  gs_kernels_pixels(m->kn, pixels, x, n);
}

/* True when every parameter and gradient is bound. */
static bool all_bound(const gs_mlp_t *m)
{
  uint32_t l;

  for (l = 0; l < m->nlayers; l++) {
    const mlp_layer_t *ly = &m->layer[l];

    if (!ly->w || !ly->b || !ly->gw || !ly->gb)
      return false;
  }
  return true;
}

const float *gs_mlp_forward_queued(gs_mlp_t *m, const float *x, const uint8_t *y, uint32_t batch)
{
  mlp_layer_t *top = &m->layer[m->nlayers - 1];
  const float *in = x;
  uint32_t l;

  m->batch = 0;
  if (batch == 0 || batch > m->max_batch || !all_bound(m))
    return NULL;
  for (l = 0; l < m->nlayers; l++) {
    mlp_layer_t *ly = &m->layer[l];

    gs_kernels_linear_forward(m->kn, in, ly->w, ly->b, ly->h, batch, ly->out, ly->in,
                              l + 1 < m->nlayers);
    in = ly->h;
  }
  if (gs_device_zero(m->dev, m->stats, 2 * sizeof(float)))
    return NULL;
  gs_kernels_softmax_xent(m->kn, top->h, y, top->dh, batch, top->out, m->stats);
  m->batch = batch;
  return m->stats;
}

float gs_mlp_forward(gs_mlp_t *m, const float *x, const uint8_t *y, uint32_t batch,
                     uint32_t *correct)
{
  const float *queued = gs_mlp_forward_queued(m, x, y, batch);
  float stats[2];

  if (correct)
    *correct = 0;
  if (!queued || gs_device_download(m->dev, stats, queued, sizeof(stats))) {
    m->batch = 0;
    return NAN;
  }
  if (correct)
    *correct = (uint32_t)stats[1];
  return stats[0] / (float)batch;
}

/* Without a forward to differentiate, every bound gradient is zero (and
 * announced, so a caller waiting on the callbacks is not left hanging). */
static void zero_grads(gs_mlp_t *m, gs_grad_ready_fn ready, void *arg)
{
  uint32_t l = m->nlayers;

  while (l-- > 0) {
    mlp_layer_t *ly = &m->layer[l];

    if (ly->gw && gs_device_zero(m->dev, ly->gw, (size_t)ly->out * ly->in * sizeof(float)))
      GS_LOG_ERR(m->dev->log, "mlp: cannot zero the gradient of %s", ly->wname);
    if (ly->gb && gs_device_zero(m->dev, ly->gb, ly->out * sizeof(float)))
      GS_LOG_ERR(m->dev->log, "mlp: cannot zero the gradient of %s", ly->bname);
    if (ready) {
      ready(arg, 2 * l);
      ready(arg, 2 * l + 1);
    }
  }
}

/* Walks the layers top down; layer l's weight and bias are announced
 * (weight first) once the gradient of its input has been computed from W,
 * after which backward reads neither the parameters nor the gradients of
 * that layer again. On a device with a queue, "announced" means queued. */
void gs_mlp_backward(gs_mlp_t *m, const float *x, gs_grad_ready_fn ready, void *arg)
{
  uint32_t l = m->nlayers, batch = m->batch;

  if (batch == 0) {
    zero_grads(m, ready, arg);
    return;
  }
  while (l-- > 0) {
    mlp_layer_t *ly = &m->layer[l];
    const float *in = l ? m->layer[l - 1].h : x;

    gs_kernels_linear_backward(m->kn, in, ly->w, ly->dh, ly->gw, ly->gb,
                               l ? m->layer[l - 1].dh : NULL, batch, ly->out, ly->in);
    if (ready) {
      ready(arg, 2 * l);
      ready(arg, 2 * l + 1);
    }
  }
}
