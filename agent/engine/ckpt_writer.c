/* The checkpoint writer thread (see ckpt_writer.h). */
#include "ckpt_writer.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "why.h"

static void free_state(gs_ckpt_state_t *st)
{
  for (uint32_t i = 0; st->bufs && i < st->nbuf; i++)
    free(st->bufs[i].data);
  free(st->bufs);
  st->bufs = NULL;
  free(st->extra);
  st->extra = NULL;
}

static void *writer_main(void *arg)
{
  gs_ckpt_writer_t *w = arg;
  char path[4096], why[512];
  int err;

  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->busy && !w->quit)
      pthread_cond_wait(&w->cv, &w->mu);
    if (!w->busy)
      break;
    pthread_mutex_unlock(&w->mu);
    /* The state is the writer's while busy: no lock around the I/O. */
    err = gs_checkpoint_save(w->dir, &w->st, w->keep, path, sizeof(path), why, sizeof(why));
    pthread_mutex_lock(&w->mu);
    w->failures = err ? w->failures + 1 : 0;
    if (err && w->failures < w->max_failures)
      gs_log(w->log, GS_LOG_WARN, w->job, 0,
             "checkpoint at step %" PRIu64 " failed (%" PRIu32 " of %" PRIu32
             " allowed in a row; training goes on, the next checkpoint tries again): %s",
             w->st.step, w->failures, w->max_failures, why);
    else if (err)
      gs_log(w->log, GS_LOG_ERROR, w->job, 0,
             "checkpoint at step %" PRIu64 " failed (%" PRIu32 " in a row): %s", w->st.step,
             w->failures, why);
    else
      gs_log(w->log, GS_LOG_INFO, w->job, 0, "checkpoint: step %" PRIu64 " -> %s", w->st.step,
             path);
    w->err = err;
    w->err_step = w->st.step;
    if (err)
      memcpy(w->why, why, sizeof(w->why));
    free_state(&w->st);
    w->busy = false;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

void gs__ckpt_writer_init(gs_ckpt_writer_t *w, const char *dir, uint32_t keep,
                          uint32_t max_failures, const gs_log_t *log, const char *job)
{
  memset(w, 0, sizeof(*w));
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->dir = dir;
  w->keep = keep;
  w->max_failures = max_failures ? max_failures : 1;
  w->log = log;
  w->job = job;
}

/* Waits (locked) for the write in flight; the last write's error, which is
 * then cleared so that it is reported once. Unless `last`, a failure is
 * reported only when it makes max_failures in a row (it was logged). */
static int wait_idle(gs_ckpt_writer_t *w, bool last, char *why, size_t why_len)
{
  int err;

  while (w->busy)
    pthread_cond_wait(&w->cv, &w->mu);
  err = w->err;
  w->err = 0;
  if (!err || (!last && w->failures < w->max_failures))
    return 0;
  if (w->failures > 1)
    gs_set_why(why, why_len, "checkpoint at step %" PRIu64 " failed, %" PRIu32 " in a row: %s",
               w->err_step, w->failures, w->why);
  else
    gs_set_why(why, why_len, "checkpoint at step %" PRIu64 " failed: %s", w->err_step, w->why);
  return err;
}

/* Starts the thread (locked) unless it runs. */
static int start_locked(gs_ckpt_writer_t *w, char *why, size_t why_len)
{
  if (w->started)
    return 0;
  if (pthread_create(&w->thread, NULL, writer_main, w) != 0)
    return gs_why(GS_ENOMEM, why, why_len, "cannot start the checkpoint writer thread");
  pthread_setname_np(w->thread, "gs-ckpt"); /* a name in top and gdb; failure is harmless */
  w->started = true;
  return 0;
}

int gs__ckpt_writer_start(gs_ckpt_writer_t *w, char *why, size_t why_len)
{
  int err;

  pthread_mutex_lock(&w->mu);
  err = start_locked(w, why, why_len);
  pthread_mutex_unlock(&w->mu);
  return err;
}

int gs__ckpt_writer_submit(gs_ckpt_writer_t *w, gs_ckpt_state_t *st, char *why, size_t why_len)
{
  int err;

  pthread_mutex_lock(&w->mu);
  err = wait_idle(w, false, why, why_len);
  if (!err)
    err = start_locked(w, why, why_len);
  if (err) {
    pthread_mutex_unlock(&w->mu);
    free_state(st);
    return err;
  }
  w->st = *st;
  st->bufs = NULL;
  st->extra = NULL;
  w->busy = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int gs__ckpt_writer_wait(gs_ckpt_writer_t *w, char *why, size_t why_len)
{
  int err;

  pthread_mutex_lock(&w->mu);
  err = wait_idle(w, true, why, why_len);
  pthread_mutex_unlock(&w->mu);
  return err;
}

void gs__ckpt_writer_stop(gs_ckpt_writer_t *w)
{
  pthread_mutex_lock(&w->mu);
  while (w->busy)
    pthread_cond_wait(&w->cv, &w->mu);
  w->quit = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->started)
    pthread_join(w->thread, NULL);
  w->started = false;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}
