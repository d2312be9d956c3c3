/* Writing float32 tensors in the safetensors layout (docs/model-format.md):
 * an 8-byte little-endian header length, a JSON header naming each tensor
 * with its dtype, shape and byte range, then the raw data. Written to a
 * temporary file beside the target, fsynced and renamed into place, so a
 * reader sees the old file or the whole new one. */
#ifndef GS_SAFETENSORS_H
#define GS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define GS_ST_MAX_DIMS 4

/* One tensor: a name, a shape and `data` in host memory (borrowed), as
 * many floats as the shape's product. */
typedef struct gs_st_tensor {
  const char *name;
  uint32_t ndims;
  uint64_t shape[GS_ST_MAX_DIMS];
  const float *data;
} gs_st_tensor_t;

/* One "__metadata__" entry; safetensors allows string values only. */
typedef struct gs_st_meta {
  const char *key, *value;
} gs_st_meta_t;

/* Writes the `n` tensors, in the order given, and the metadata to `path`.
 * GS_EINVAL for a bad tensor (no name, a name given twice, 0 or more than
 * GS_ST_MAX_DIMS dims), a converted errno with `why` naming the path and
 * the failing call otherwise; the temporary file is removed on failure. */
int gs_safetensors_write(const char *path, const gs_st_tensor_t *t, size_t n,
                         const gs_st_meta_t *meta, size_t nmeta, char *why,
                         size_t why_len) GS_WARN_UNUSED;

#endif
