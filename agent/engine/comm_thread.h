/* The engine's comm thread, owned by comm_thread.c: the jobs it runs
 * (one per pack, and the collectives run at once outside a step), its
 * queue, and the lock it shares with the training thread and the
 * heartbeat's abort. Other files of the engine reach it through the
 * functions below. */
#ifndef GS_ENGINE_COMM_THREAD_H
#define GS_ENGINE_COMM_THREAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gradsync/engine.h>

#include "comm.h"
#include "error.h"
#include "invariant.h"

/* DEFERRED: the step's last pack, run by the training thread itself when
 * it would otherwise wait for it (see launch()). */
typedef enum job_state { JOB_IDLE = 0, JOB_QUEUED, JOB_DONE, JOB_DEFERRED } job_state_t;

/* A sharded step's packs are reduce-scattered (their grads) and
 * allgathered (their params) instead of allreduced. */
typedef enum job_op { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE_SCATTER, OP_ALLGATHER } job_op_t;

/* One collective for the comm thread. */
typedef struct comm_job {
  job_op_t op;
  void *buf;
  size_t count;  /* floats (allreduce) or bytes (broadcast) */
  uint32_t root; /* broadcast */
  /* A pack's reduction whose grads travel in 16 bits: its wire buffer, and
   * how many of the `count` floats are grads (the rest, the control
   * vector, travels in float32). NULL: `buf` travels as it is. The sums
   * this rank uses (the pack's windows) are widened back into `buf`. */
  uint16_t *wire;
  size_t elements;
  const struct gs_pack *pack; /* sharded: its windows' sums are the ones widened */
  job_state_t state;
  int err;
} comm_job_t;

typedef struct comm_thread {
  pthread_t thread;
  bool running;
  /* Guards the queue, quit and live_generation, and the engine's comm
   * pointer, which the heartbeat's abort reads. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  comm_job_t *jobs; /* one per pack (npacks), from gs__comm_thread_size */
  uint32_t npacks;
  comm_job_t **queue;
  uint32_t qhead, qtail, qcap;
  bool quit;
  /* The generation the engine's comm serves (0: none yet): a heartbeat's
   * abort for another one (the generation an elastic regroup left) is
   * ignored. */
  uint64_t live_generation;
} comm_thread_t;

/* Its lock and condition (at the engine's new), and everything (free). */
void gs__comm_thread_init(comm_thread_t *t);
void gs__comm_thread_free(comm_thread_t *t);
/* Its jobs and queue for `packs` packs, once (the packs never change);
 * GS_ENOMEM when out of memory. */
int gs__comm_thread_size(comm_thread_t *t, uint32_t packs) GS_WARN_UNUSED;
/* Pack k's job; whether `job` is a pack's (its index in *k). Inline: the
 * step asks for a job per pack, and the trace, which the comm thread
 * calls, for the pack of one. */
static inline comm_job_t *gs__comm_thread_job(comm_thread_t *t, uint32_t k)
{
  GS_ASSERT(k < t->npacks);
  return &t->jobs[k];
}

static inline bool gs__comm_thread_pack_of(const comm_thread_t *t, const comm_job_t *job,
                                           uint32_t *k)
{
  if (!t->jobs || job < t->jobs || job >= t->jobs + t->npacks)
    return false;
  *k = (uint32_t)(job - t->jobs);
  return true;
}
/* The engine joined `generation`: a heartbeat's abort of it reaches the
 * engine's comm from now on. */
void gs__comm_thread_live(comm_thread_t *t, uint64_t generation);
/* Stores `comm` in the engine's *slot under the lock (the heartbeat's
 * abort reads it). */
void gs__comm_thread_set_comm(comm_thread_t *t, gs_comm_t **slot, gs_comm_t *comm);
/* The comm thread stopped: takes the engine's comm out of *slot under the
 * lock (the caller destroys it), and empties the queue and the jobs for
 * the next generation. */
gs_comm_t *gs__comm_thread_reset(comm_thread_t *t, gs_comm_t **slot);

/* Starts the comm thread (gs__engine_comm_stop joins it); with `abort`
 * the collective in progress fails first instead of being waited for. */
int gs__engine_comm_start(gs_engine_t *e) GS_WARN_UNUSED;
void gs__engine_comm_stop(gs_engine_t *e, bool abort);
/* Hands a job to the comm thread (with one rank, runs it at once), and
 * waits for it. */
void gs__engine_enqueue(gs_engine_t *e, comm_job_t *job);
int gs__engine_wait_job(gs_engine_t *e, comm_job_t *job);
/* The heartbeat's abort (gs_heartbeat_config_t.on_abort). */
void gs__engine_on_abort(void *arg, uint64_t generation, const char *reason);

#endif
