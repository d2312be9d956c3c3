/* The parameter pack list: which parameters share one allreduce buffer.
 *
 * Parameters are registered in forward order; gradients become ready in
 * reverse order during backward, so packs are formed walking the parameters
 * from last to first: consecutive parameters of one dtype go into a pack
 * until adding the next would pass `threshold_bytes`. A parameter larger
 * than the threshold gets a pack of its own. The layout mirrors the wire
 * message (proto PackList): pack i is the `pack_sizes[i]` entries of `order`
 * that follow the previous packs'. */
#ifndef GS_PACKLIST_H
#define GS_PACKLIST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum gs_dtype {
  GS_DTYPE_FLOAT32 = 0, /* values match proto DType */
  GS_DTYPE_FLOAT16 = 1,
  GS_DTYPE_BFLOAT16 = 2,
  GS_DTYPE_FLOAT64 = 3,
} gs_dtype_t;

/* Bytes per element, 0 for an unknown dtype. */
size_t gs_dtype_size(gs_dtype_t dtype);
/* "float32", ...; "unknown" otherwise. */
const char *gs_dtype_name(gs_dtype_t dtype);

typedef struct gs_param_desc {
  const char *name;
  uint64_t elements;
  gs_dtype_t dtype;
} gs_param_desc_t;

typedef struct gs_packlist {
  uint64_t threshold_bytes;
  uint32_t param_count; /* entries in `order` */
  uint32_t pack_count;  /* entries in `pack_sizes` */
  uint32_t *pack_sizes; /* params per pack */
  uint32_t *order;      /* param indices, pack after pack */
} gs_packlist_t;

/* Computes the pack list of `n` params. On success `out` owns two arrays;
 * the caller frees them with gs_packlist_free. GS_EINVAL for an unknown
 * dtype, GS_ENOMEM. n == 0 gives an empty list. */
int gs_packlist_compute(const gs_param_desc_t *params, uint32_t n, uint64_t threshold_bytes,
                        gs_packlist_t *out) GS_WARN_UNUSED;

/* Checks a pack list (typically received from the wire) against the params
 * it claims to pack: every pack non-empty, every index in range and used
 * exactly once, one dtype per pack, and no pack of more than one param over
 * the threshold. Returns 0 or GS_EINVAL with a sentence naming the first
 * problem in `why` (which may be NULL). */
int gs_packlist_validate(const gs_packlist_t *list, const gs_param_desc_t *params, uint32_t n,
                         char *why, size_t why_len) GS_WARN_UNUSED;

/* Bytes of pack `i`'s params, given the offset of its first entry in
 * `order` (the sum of the previous pack_sizes). */
uint64_t gs_packlist_pack_bytes(const gs_packlist_t *list, const gs_param_desc_t *params,
                                uint32_t first, uint32_t count);

/* Frees what gs_packlist_compute allocated and zeroes the struct. */
void gs_packlist_free(gs_packlist_t *list);

#endif
