/* Checkpoint files (format: docs/checkpoint.md).
 *
 * A checkpoint is the training position (step, epoch, RNG state, in-epoch
 * sample offset, optimizer steps), the hash of the pack layout it was
 * taken with, and a list of float32 buffers (the engine writes each pack's
 * params, then its optimizer state buffers), all covered by a CRC-32. Saving writes
 * DIR/.ckpt-STEP.tmp, fsyncs it, renames it to DIR/ckpt-STEP.gsck (STEP
 * zero-padded to 12 digits) and fsyncs DIR, so a crash leaves either the
 * old set of files or the new one, never a torn file under the final name.
 * Loading takes the newest file that passes every check; torn or corrupt
 * files are skipped with a warning. */
#ifndef GS_CHECKPOINT_H
#define GS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "log.h"

typedef struct gs_ckpt_buffer {
  float *data;
  uint64_t count; /* elements */
} gs_ckpt_buffer_t;

typedef struct gs_ckpt_state {
  /* The position: step, epoch, rng_state and `sample` (below, last: the
   * fields before it kept their order when version 4 added it). */
  uint64_t step; /* steps completed */
  uint64_t epoch;
  uint64_t rng_state;
  uint64_t layout_hash;
  uint32_t nbuf;
  gs_ckpt_buffer_t *bufs; /* nbuf buffers (owned by the caller) */
  /* The layout in words ("layers 784,256,10"), borrowed, at most
   * GS_CKPT_DESC_MAX bytes; or NULL. Saving stores it (format version 2;
   * NULL writes version 1); loading names it next to the file's when the
   * file's layout differs. */
  const char *desc;
  /* The ranks training when it was written. Saving: not 0 stores it and
   * `sample` (format version 4, after the description, "" when desc is
   * NULL). Loading: the file's, 0 for a file of version 1 or 2. */
  uint32_t world_size;
  /* Examples of the current epoch trained on, over all ranks; 0 in files
   * before version 4. Saving stores it with the world size (format
   * version 4), so only when world_size is not 0. */
  uint64_t sample;
  /* Loading: the file's format version (so a caller tells a version-4
   * sample of 0 from one the file did not store). */
  uint32_t version;
  /* Updates the optimizer applied (Adam's bias correction counts them; a
   * skipped step does not): stored with the world size (version 5);
   * loading a file before it gives `step`. */
  uint64_t optim_steps;
  /* A front end's own bytes (its model's buffers, an optimizer's state of
   * its own), version 6, after the optimizer steps. Saving writes
   * `extra_len` bytes from `extra` (may be NULL when 0) whenever it writes
   * a world size. Loading fills them: malloc'd, the caller frees `extra`
   * (NULL and 0 for a file before version 6). */
  void *extra;
  uint64_t extra_len;
} gs_ckpt_state_t;

#define GS_CKPT_DESC_MAX 4096

/* Writes a checkpoint of `st` into `dir` (created if missing), then removes
 * all but the newest `keep` checkpoints (keep 0: remove none). `path` (may
 * be NULL) gets the file written. Errors name the file and the failing call. */
int gs_checkpoint_save(const char *dir, const gs_ckpt_state_t *st, uint32_t keep, char *path,
                       size_t path_len, char *why, size_t why_len) GS_WARN_UNUSED;

/* Checks that checkpoints can be written into `dir`: creates it (and its
 * parents) when missing and creates and removes a probe file in it
 * (mkstemp: safe from concurrent callers). Errors
 * name the path and the failing call ("/ckpt: mkdir: Permission denied"). */
int gs_checkpoint_dir_check(const char *dir, char *why, size_t why_len) GS_WARN_UNUSED;

/* Loads the newest valid checkpoint in `dir` into `st`, whose layout_hash,
 * nbuf and buffer counts say what is expected (a file whose layout hash or
 * buffer list differs is refused with a warning naming the difference, as
 * is a torn or corrupt file; the next older one is tried). On success fills
 * step, epoch, rng_state, world_size, sample and the buffers; `path` gets
 * the file.
 * GS_ENOTFOUND when no valid checkpoint exists (`why` says how many were
 * skipped); GS_EPRECOND when none loads and at least one good file is of
 * another layout (`why` is the newest such file's reason: a different
 * model, not a missing checkpoint). */
int gs_checkpoint_load_latest(const char *dir, gs_ckpt_state_t *st, const gs_log_t *log, char *path,
                              size_t path_len, char *why, size_t why_len) GS_WARN_UNUSED;

/* Loads exactly one file (the same checks). */
int gs_checkpoint_load_file(const char *path, gs_ckpt_state_t *st, char *why,
                            size_t why_len) GS_WARN_UNUSED;

#endif
