/* The parameter registry and the packs that store the parameters.
 *
 * Parameters are registered in forward order. Once the pack list is known
 * (computed on rank 0, fetched by the others), every pack gets contiguous
 * float32 buffers on the compute device: params, grads and the
 * optimizer's state (momentum; Adam's two or three moments) of its
 * window (the whole pack, or this rank's shard of it). A
 * parameter's tensors are views at its offset in its pack, so the allreduce runs in
 * place on a pack's grad buffer and nothing is ever concatenated or split.
 * The grad buffer of the pack reduced last may carry extra trailing floats
 * (the engine's control vector) that ride in the same allreduce. */
#ifndef GS_PACKS_H
#define GS_PACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "device.h"
#include "gradsync.pb.h"
#include "packlist.h"
#include "optim.h"

/* Elements of a pack this rank updates and keeps optimizer state for:
 * the whole pack, or a shard of it (sharded optimizer state); `segs` are
 * the pack's segments cut to it, their offsets from `off`. */
typedef struct gs_pack_window {
  size_t off, len;
  gs_optim_segment_t *segs;
  uint32_t nseg;
  float *state[GS_OPTIM_MAX_STATE]; /* nstate of them (gs_packs_t), `len` each */
} gs_pack_window_t;

/* A pack's windows: this rank's own, and (sharded in an elastic job) a
 * copy of the previous rank's, which this rank updates too so that a
 * lost rank's state survives it (len 0 otherwise). */
enum { GS_WINDOW_OWN, GS_WINDOW_COPY, GS_PACK_WINDOWS };

typedef struct gs_pack {
  float *params, *grads; /* `elements` each, + `pad` (gs_packs_layout_t); grads: + `extra` */
  uint16_t *wire;        /* the grads as they travel when that is a 16-bit float, else NULL */
  size_t elements;
  size_t extra;             /* trailing floats after the grads (the control vector) */
  uint32_t first, nparams;  /* its entries in the pack list's order[] */
  gs_optim_segment_t *segs; /* one per param, in order[] order */
  uint32_t pending;         /* grads not yet ready this step */
  gs_pack_window_t win[GS_PACK_WINDOWS];
} gs_pack_t;

/* What a parameter is besides its size (the bias rules of the SGD
 * settings treat biases apart). */
typedef struct gs_param_rule {
  bool is_bias;
} gs_param_rule_t;

typedef struct gs_packs {
  gs_device_t *dev;        /* where the pack buffers live (not owned) */
  gs_param_desc_t *params; /* registered, forward order; names owned */
  gs_param_rule_t *rules;
  uint32_t *group_of; /* param index -> its optimizer group (default 0) */
  uint32_t nparams, cap;
  uint32_t nstate; /* optimizer state buffers per pack */
  gs_dtype_t wire; /* what the grads travel in (GS_DTYPE_FLOAT32: as they are) */
  size_t pad;      /* gs_packs_layout_t's */
  gs_packlist_t list;
  gs_pack_t *packs;  /* list.pack_count */
  uint32_t *pack_of; /* param index -> pack index */
  size_t *offset_of; /* param index -> element offset in its pack */
} gs_packs_t;

void gs_packs_init(gs_packs_t *p);
/* Frees every buffer and the registry. */
void gs_packs_free(gs_packs_t *p);

/* Registers a float32 parameter of `elements` (> 0) elements; returns its
 * index (>= 0) or a negative GS_E* code (GS_EEXIST for a repeated name). */
int gs_packs_register(gs_packs_t *p, const char *name, uint64_t elements, bool is_bias);
/* Puts parameter i in optimizer group `group` (before the packs are built;
 * the engine owns the groups); GS_EINVAL for no such parameter. */
int gs_packs_set_group(gs_packs_t *p, uint32_t i, uint32_t group);

/* The Join model signature of the registered params. */
void gs_packs_signature(const gs_packs_t *p, gradsync_ModelSignature *sig);

/* How the buffers of the packs are made: the pack reduced last gets
 * `extra` trailing grad floats; every pack's params, grads and wire
 * buffer `pad` more elements (room for a backend's equal shards); with a
 * 16-bit `wire` dtype each pack gets a buffer of its grads in it (not the
 * extra); `nstate` optimizer state buffers per pack, made for the whole
 * pack unless `sharded` (then gs_packs_set_window makes them). */
typedef struct gs_packs_layout {
  size_t extra, pad;
  uint32_t nstate;
  gs_dtype_t wire;
  bool sharded;
} gs_packs_layout_t;

/* Adopts `list` (ownership moves into `p`), checks it against the
 * registered params (a list built for other params names the first
 * difference in `why`), and allocates the buffers on `dev` (which must
 * outlive `p`), zeroed, as `layout` says. */
int gs_packs_build(gs_packs_t *p, gs_device_t *dev, gs_packlist_t *list,
                   const gs_param_desc_t *list_params, uint32_t list_nparams,
                   const gs_packs_layout_t *layout, char *why, size_t why_len) GS_WARN_UNUSED;

/* Makes elements [off, off + len) of pack k its window `w` (GS_WINDOW_*):
 * the window's optimizer state is then its own, zeroed (unless the window
 * is unchanged). */
int gs_packs_set_window(gs_packs_t *p, uint32_t k, uint32_t w, size_t off,
                        size_t len) GS_WARN_UNUSED;

/* The bytes of optimizer state this rank holds (every pack's windows). */
uint64_t gs_packs_state_bytes(const gs_packs_t *p);

/* Views of parameter i (after build; device memory). */
float *gs_packs_param(const gs_packs_t *p, uint32_t i);
float *gs_packs_grad(const gs_packs_t *p, uint32_t i);

/* The pack reduced last in a step: the one holding parameter 0 (the first
 * in forward order, whose gradient backward produces last). */
uint32_t gs_packs_last(const gs_packs_t *p);

/* FNV-1a 64 over the threshold, and every pack's params (names, element
 * counts, dtypes) in order: equal hashes mean interchangeable storage. */
uint64_t gs_packs_layout_hash(const gs_packs_t *p);

#endif
