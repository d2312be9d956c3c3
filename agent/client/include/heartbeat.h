/* The heartbeat thread: every interval it sends the rank's latest progress
 * to the coordinator on its own connection and keeps the latest directives.
 * When the coordinator aborts the generation (or cannot be reached for
 * longer than the grace period), it calls `on_abort` once, from the
 * heartbeat thread, so the owner can abort its collectives. Through a
 * shorter outage training goes on (the ranks watch each other through
 * their sockets and collective deadlines), and a restarted coordinator is
 * told the job again: every rank re-registers, with the broadcast period
 * in effect, and rank 0 publishes the pack list again. */
#ifndef GS_HEARTBEAT_H
#define GS_HEARTBEAT_H

#include <stdbool.h>
#include <stdint.h>

#include <gradsync/engine.h>

#include "client.h"
#include "error.h"

/* What the rank reports (gs_progress_t, public in gradsync/engine.h) is
 * written by the training thread and read by the heartbeat thread. */

/* The coordinator's directives as the last reply carried them. */
typedef struct gs_directives {
  bool valid; /* false until the first reply */
  int32_t bcast_period;
  uint64_t broadcast_seq;
  uint64_t checkpoint_seq;
  bool stop;
  uint64_t regroup_seq; /* elastic: agents wait to join; the ranks regroup */
  uint64_t trace_seq;   /* record the next trace_steps steps (engine/trace.c) */
  uint32_t trace_steps;
  float lr_scale;          /* every group's lr times this (1 when unset) */
  uint64_t coordinator_id; /* the sequence numbers count per coordinator process */
} gs_directives_t;

typedef struct gs_heartbeat_config {
  gs_client_config_t client; /* a connection of its own */
  uint64_t generation;
  uint32_t rank;
  uint32_t world_size;  /* the generation's (an elastic one may be below the job's largest) */
  uint32_t interval_ms; /* from the JoinResponse */
  uint32_t timeout_ms;  /* the coordinator's heartbeat timeout */
  uint64_t grace_ms;    /* unreachable for this long: abort (0: timeout_ms) */
  const char *session;  /* the rank's session (copied); a re-registration presents it */
  /* `generation`: the config's, so an owner that moved on to another
   * generation can tell a late call for the old one. */
  void (*on_abort)(void *arg, uint64_t generation, const char *reason);
  void *arg;
  /* The rank's Join, sent again with rejoin_generation/rejoin_rank when the
   * coordinator no longer knows the rank (it restarted: it keeps soft state
   * only, and re-registering rebuilds the job). NULL: never re-register. */
  const gradsync_JoinRequest *rejoin;
  /* Fills where the rank is at the moment a heartbeat leaves (phase,
   * collectives done, ...), from the heartbeat thread; `where_arg` is its
   * argument. NULL: heartbeats carry no Progress. */
  void (*where)(void *where_arg, gradsync_Progress *out);
  void *where_arg;
} gs_heartbeat_config_t;

typedef struct gs_heartbeat gs_heartbeat_t;

/* Starts the thread (the first heartbeat is sent at once). NULL with the
 * reason logged on failure. Stop and free with gs_heartbeat_stop. */
gs_heartbeat_t *gs_heartbeat_start(const gs_heartbeat_config_t *cfg);

/* What the coordinator said, in its last reply, the job waits on ("" while
 * it is not stalled), copied to out. */
void gs_heartbeat_waiting_on(gs_heartbeat_t *hb, char *out, size_t len);

/* While the coordinator does not answer this rank's heartbeats: the
 * monotonic ms at which the rank gives up on it (the grace's end, when
 * on_abort fires); 0 while it answers, and after the abort. */
uint64_t gs_heartbeat_gives_up_at(gs_heartbeat_t *hb);

/* Publishes the latest progress (copied under the lock). */
void gs_heartbeat_report(gs_heartbeat_t *hb, const gs_progress_t *p);

/* Copies the latest directives. */
void gs_heartbeat_directives(gs_heartbeat_t *hb, gs_directives_t *out);

/* The broadcast period and lr scale now in effect (a re-registration
 * reports them, so a restarted coordinator keeps an operator's settings). */
void gs_heartbeat_set_in_effect(gs_heartbeat_t *hb, int32_t period, float lr_scale);

/* Rank 0, once the pack list is agreed: what to publish again after a
 * re-registration. Borrowed; must outlive the heartbeat. */
void gs_heartbeat_set_packlist(gs_heartbeat_t *hb, const gs_packlist_t *list,
                               const gs_param_desc_t *params, uint32_t n);

/* Whether on_abort has fired, with the reason copied to `why`. */
bool gs_heartbeat_aborted(gs_heartbeat_t *hb, char *why, size_t len);

/* Whether the abort was this rank's own decision (the coordinator was
 * unreachable past the grace, or refused its re-registration) rather than
 * the coordinator's. */
bool gs_heartbeat_gave_up(gs_heartbeat_t *hb);

/* Stops the thread promptly (it never sleeps through a stop), joins it, and
 * frees it. NULL is a no-op. */
void gs_heartbeat_stop(gs_heartbeat_t *hb);

/* The owner leaves this heartbeat's generation (it joins the next one):
 * the heartbeat goes on beating, so that the coordinator does not count
 * the rank lost before its next Join counts it back, but never again
 * re-registers the generation after a coordinator restart. Waits out a
 * re-registration in flight. */
void gs_heartbeat_forgo_rejoin(gs_heartbeat_t *hb);

#endif
