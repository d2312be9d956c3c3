/* IDX files (the MNIST format), gzip-compressed or plain, and the
 * Fashion-MNIST dataset made of four of them.
 *
 * IDX: magic 0x00 0x00 type ndims (type 0x08 = unsigned byte), then ndims
 * big-endian uint32 dimensions, then the data, row-major. The parser is a
 * pure function of the bytes; every dimension is checked against the bytes
 * actually present. */
#ifndef GS_IDX_H
#define GS_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct gs_idx {
  uint32_t ndims;
  uint32_t dims[4];
  uint8_t *data; /* dims[0] * ... * dims[ndims-1] bytes */
} gs_idx_t;

/* Parses an (uncompressed) IDX image of `len` bytes; only unsigned-byte data
 * with 1..4 dims. On success `out->data` is a copy the caller frees with
 * gs_idx_free. GS_EINVAL with the reason in `why` otherwise. */
int gs_idx_parse(const uint8_t *bytes, size_t len, gs_idx_t *out, char *why,
                 size_t why_len) GS_WARN_UNUSED;

/* Reads and parses a regular file (anything else, a FIFO say, is refused
 * without waiting on it), inflating it when it starts with the gzip magic.
 * The file is streamed: memory is the image plus a chunk, and an image
 * over 512 MiB is refused by its header or as it inflates past the limit.
 * Errors name the file: "FILE: no such file", "FILE: not an IDX file (...)". */
int gs_idx_load(const char *path, gs_idx_t *out, char *why, size_t why_len) GS_WARN_UNUSED;

void gs_idx_free(gs_idx_t *idx);

/* One split of an image-classification dataset, the images as the file
 * holds them (a byte per pixel; the model scales them to [0, 1] on its
 * device, gs_mlp_inputs_from_pixels). */
typedef struct gs_dataset {
  uint32_t count;    /* examples */
  uint32_t features; /* rows * cols */
  uint32_t classes;  /* 1 + the largest label */
  uint32_t max_at;   /* the index of the first example with the largest label */
  uint8_t *pixels;   /* count * features, row-major */
  uint8_t *y;        /* count labels */
  char *labels_path; /* the label file it came from (owned) */
} gs_dataset_t;

/* Loads `split` ("train" or "t10k") from DIR: DIR/SPLIT-images-idx3-ubyte
 * and DIR/SPLIT-labels-idx1-ubyte, each with or without a ".gz" suffix (the
 * first that exists). Checks that image and label counts agree and, unless
 * `features` is 0, that an image has `features` pixels (GS_EPRECOND, before
 * the inputs are made). Errors name the file. Free with gs_dataset_free. */
int gs_dataset_load(const char *dir, const char *split, uint32_t features, gs_dataset_t *out,
                    char *why, size_t why_len) GS_WARN_UNUSED;

/* Checks that every label of `ds` is below `classes` (a model's outputs);
 * GS_EINVAL with `why` naming the label value, its file and index, and the
 * number of classes otherwise. */
int gs_dataset_check_labels(const gs_dataset_t *ds, uint32_t classes, char *why,
                            size_t why_len) GS_WARN_UNUSED;

void gs_dataset_free(gs_dataset_t *ds);

#endif
