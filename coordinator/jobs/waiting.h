/* Seeing what holds a job up: from where each rank says it is (the
 * Progress in its heartbeats), which rank(s) the others wait for, doing
 * what, since when (docs/design.md, "Seeing what holds a job up"). */
#ifndef GS_WAITING_H
#define GS_WAITING_H

#include <stdbool.h>
#include <stdint.h>

struct gs_job;
struct gs_member;

/* Ranks named in full; the count says how many there are in all. */
#define GS_WAITING_MAX_RANKS 8
/* A rank waiting in a collective this long (or three of its recent steps,
 * if longer) is held up: a straggler's neighbours wait less than a step. */
#define GS_WAITING_MIN_MS 500
/* Every rank inside one collective and none behind: only this many times
 * the threshold above names the transport (a large broadcast takes time). */
#define GS_WAITING_TRANSPORT_X 10

typedef enum gs_wait_kind {
  GS_WAIT_NONE = 0,
  GS_WAIT_NO_HEARTBEAT, /* the ranks named are silent: stopped, frozen, cut off */
  GS_WAIT_PHASE,        /* they are alive, in another phase (data, compute, ...) */
  GS_WAIT_SLOW_LINK,    /* they are in the collective, their sends waiting */
  GS_WAIT_TRANSPORT,    /* every rank is in it and none is behind */
  GS_WAIT_STRAGGLER,    /* not a hang: slower ranks (status.c names them) */
} gs_wait_kind_t;

typedef struct gs_waiting_on {
  gs_wait_kind_t kind;
  uint32_t ranks[GS_WAITING_MAX_RANKS];
  uint32_t rank_count;
  uint32_t phase, pack;           /* the first named rank's (last reported) */
  uint32_t waiters;               /* ranks held in the collective */
  uint32_t coll_phase, coll_pack; /* the collective they wait in */
  uint64_t since_ms;              /* when the longest of them started waiting */
  uint64_t named_ms;              /* when this was first named */
  bool warned;                    /* it lasted: logged as a warning */
  char reason[256];
} gs_waiting_on_t;

const char *gs__wait_kind_name(gs_wait_kind_t k);

/* A heartbeat of m's was taken: notes whether it says m is held up. O(1). */
void gs__waiting_note_beat(struct gs_member *m, uint64_t now);
/* Looks at the job's running ranks (O(world), at most four times a
 * second, and only while a recent heartbeat said its rank was held up)
 * and updates job->held.on: names the rank(s) that held-up ranks
 * wait on, or clears it; logs both, and makes the heartbeat replies carry
 * it. */
void gs__waiting_sweep(struct gs_job *job, uint64_t now);
/* When nothing holds the job up: the ranks that make every step slower,
 * into w: the stragglers (compute over `straggler_ratio` times the
 * median), else the owners of slow links. False when there are none. */
bool gs__waiting_slow(const struct gs_job *job, float median_compute, float straggler_ratio,
                      gs_waiting_on_t *w);
/* Forgets the verdict (a new generation, the job's end). */
void gs__waiting_clear(struct gs_job *job);

#endif
