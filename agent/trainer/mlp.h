/* The reference model: a multilayer perceptron, fully connected layers with
 * ReLU between them and softmax cross-entropy on top, on a compute device
 * (device.h for memory and streams, kernels.h for the layers: OpenBLAS on
 * the CPU, cuBLAS and CUDA kernels on a GPU); the model never branches on
 * which.
 *
 * The model does not own its parameters or gradients: the sync engine's
 * packs do, and the model gets views into them (gs_mlp_bind). Parameters in
 * forward order: fc1.weight [out x in], fc1.bias [out], fc2.weight, ...
 * Activations are batch-major: x is [batch x in]. Every pointer the model
 * takes (parameters, gradients, inputs, labels) is device memory. */
#ifndef GS_MLP_H
#define GS_MLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h> /* gs_grad_ready_fn */

#include "device.h"
#include "error.h"
#include "packlist.h"

typedef struct gs_mlp gs_mlp_t;

/* `sizes` are the layer widths, input first ("784,256,128,10": n = 4, at
 * least 2). Scratch for activations is sized for `max_batch` examples, on
 * `dev` (which must outlive the model). NULL with the reason in `why` on
 * bad sizes or allocation failure. */
gs_mlp_t *gs_mlp_new(gs_device_t *dev, const uint32_t *sizes, uint32_t n, uint32_t max_batch,
                     char *why, size_t why_len);
void gs_mlp_free(gs_mlp_t *m);

/* Parses "784,256,128,10" into at most `cap` widths. GS_EINVAL with a reason. */
int gs_mlp_parse_layers(const char *s, uint32_t *sizes, uint32_t cap, uint32_t *n, char *why,
                        size_t why_len) GS_WARN_UNUSED;

/* Number of parameter tensors (2 per layer) and the description of each, in
 * forward order (names "fc1.weight", "fc1.bias", ...; the name is owned by
 * the model). */
uint32_t gs_mlp_param_count(const gs_mlp_t *m);
gs_param_desc_t gs_mlp_param_desc(const gs_mlp_t *m, uint32_t i);
/* True for the bias tensors (1-D), which get the bias LR multiplier and decay. */
bool gs_mlp_param_is_bias(const gs_mlp_t *m, uint32_t i);

/* Points parameter i and its gradient at storage of param_desc(i).elements
 * floats each. Every parameter must be bound before use. */
void gs_mlp_bind(gs_mlp_t *m, uint32_t i, float *param, float *grad);

/* Fills the bound parameters as PyTorch's nn.Linear does by default
 * (Kaiming-uniform with a = sqrt(5): weights and biases uniform in
 * +-1/sqrt(fan_in)), from a generator seeded with `seed`: the same values on
 * every rank and every run. */
int gs_mlp_init_params(gs_mlp_t *m, uint64_t seed) GS_WARN_UNUSED;

/* The model's inputs from images stored as bytes: x[i] = pixels[i] / 255
 * for `n` values (device memory both), queued on the model's device. A
 * batch then crosses to the device in a quarter of the bytes. */
void gs_mlp_inputs_from_pixels(gs_mlp_t *m, const uint8_t *pixels, float *x, size_t n);

/* Forward pass on `batch` <= max_batch examples, keeping the activations for
 * backward. Returns the mean softmax cross-entropy loss over the batch
 * (NaN on a bad batch size or a device error); *correct gets the number of
 * argmax hits (NULL to skip). Waits for the device to read the loss. */
float gs_mlp_forward(gs_mlp_t *m, const float *x, const uint8_t *y, uint32_t batch,
                     uint32_t *correct);

/* The same, queued without a wait: device memory that holds, once the
 * queued work has run, the loss summed over the batch and the number of
 * argmax hits (two floats, valid until the next forward), or NULL on a bad
 * batch size or a device error. A training step hands the sum's verdict
 * to the engine on the device and reads it back with the step's copies. */
const float *gs_mlp_forward_queued(gs_mlp_t *m, const float *x, const uint8_t *y, uint32_t batch);

/* Backward pass for the last forward: writes (overwrites) every bound
 * gradient with d(mean loss)/d(param), last layer first, and calls
 * `ready(arg, i)` for each parameter right after its gradient is written
 * and it is no longer read by the rest of backward (NULL: no calls). */
void gs_mlp_backward(gs_mlp_t *m, const float *x, gs_grad_ready_fn ready, void *arg);

#endif
