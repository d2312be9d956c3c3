/* Rank 0 writes checkpoints on a thread of its own, so that its disk
 * (a slow or network file system, an fsync) never holds the other ranks
 * in their next collective until their --comm-timeout. The training thread
 * takes a snapshot of the packs (a copy, since training goes on changing
 * them) and hands it over; one write is in flight at a time. A failed
 * write (a full or read-only disk) is a warning and the next checkpoint
 * tries again: only `max_failures` failures in a row are reported, at the
 * next checkpoint; the final wait reports the last write's failure. A
 * failed write leaves the older checkpoints as they were. */
#ifndef GS_CKPT_WRITER_H
#define GS_CKPT_WRITER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "error.h"
#include "log.h"

typedef struct gs_ckpt_writer {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  bool started, quit;
  /* The write handed over and not yet done; owned by the writer until done. */
  bool busy;
  gs_ckpt_state_t st;
  /* What the writer needs, borrowed from the engine's config. */
  const char *dir;
  uint32_t keep;
  const gs_log_t *log;
  const char *job;
  uint32_t max_failures; /* failed writes in a row that end training (at least 1) */
  uint32_t failures;     /* failed writes in a row so far */
  /* The result of the last write: 0 or its error, with the reason. */
  int err;
  uint64_t err_step;
  char why[512];
} gs_ckpt_writer_t;

void gs__ckpt_writer_init(gs_ckpt_writer_t *w, const char *dir, uint32_t keep,
                          uint32_t max_failures, const gs_log_t *log, const char *job);

/* Starts the thread (named "gs-ckpt") now rather than at the first
 * submit; GS_ENOMEM if it cannot start. */
int gs__ckpt_writer_start(gs_ckpt_writer_t *w, char *why, size_t why_len) GS_WARN_UNUSED;

/* Waits for the write in flight, then hands `st` over (the writer frees
 * its buffers, the array and its extra bytes, whatever happens). Returns the previous
 * write's error if it was the max_failures-th failure in a row (st is then
 * freed unwritten), GS_ENOMEM if the thread cannot start, else 0. */
int gs__ckpt_writer_submit(gs_ckpt_writer_t *w, gs_ckpt_state_t *st, char *why,
                           size_t why_len) GS_WARN_UNUSED;

/* Waits until no write is in flight; the last write's error, if it failed
 * (however few failed before it: nothing comes after it to try again). */
int gs__ckpt_writer_wait(gs_ckpt_writer_t *w, char *why, size_t why_len) GS_WARN_UNUSED;

/* Waits for the write in flight and stops the thread. */
void gs__ckpt_writer_stop(gs_ckpt_writer_t *w);

#endif
