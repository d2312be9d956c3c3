/* The control vector: a few floats appended to the gradients of the pack
 * reduced last, so the one allreduce every step already does also carries
 * the step's decisions, and every rank reads the same sums at the same
 * step (stop, new broadcast period, new lr scale, broadcast now, checkpoint
 * now, regroup, SIGTERM, non-finite loss) with no extra round trip.
 *
 * Layout: fixed slots, then one bit per rank for a non-finite loss, 16
 * ranks per float (sums of distinct powers of two below 2^24 are exact in
 * float32, and the allreduce is always a sum). Only rank 0 writes the
 * coordinator's requests, so their sums are rank 0's values.
 *
 * Two slots check that the ranks are in step: every rank adds its step
 * count and its count of collectives issued before the step, each modulo
 * GS_CTL_SEQ_MOD, so the sums are world x (count mod 256) exactly when
 * every rank agrees. A rank that skipped a step, ran a collective the
 * others did not (its packs were then summed with the wrong partners), or
 * whose control vector met another pack's gradients fails the check. The
 * sums stay below 2^24, so exact in float32, for worlds up to
 * GS_CTL_CHECK_MAX_WORLD ranks whatever the order of summation.
 *
 * Encoding and decoding are pure functions of their arguments: no engine,
 * no I/O (tests/test_control.c). */
#ifndef GS_CONTROL_H
#define GS_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
  GS_CTL_STOP = 0,   /* rank 0: the coordinator asked to stop */
  GS_CTL_PERIOD,     /* rank 0: new broadcast period + 2 (0: no change) */
  GS_CTL_BROADCAST,  /* rank 0: broadcast params now */
  GS_CTL_CHECKPOINT, /* rank 0: checkpoint now */
  GS_CTL_TERM,       /* every rank: 1 if it got SIGTERM */
  GS_CTL_NONFINITE,  /* every rank: 1 if its loss is NaN or Inf */
  GS_CTL_STEP,       /* every rank: steps begun since start, mod GS_CTL_SEQ_MOD */
  GS_CTL_SEQ,        /* every rank: collectives issued before this step, mod GS_CTL_SEQ_MOD */
  GS_CTL_REGROUP,    /* rank 0: elastic jobs: agents wait to join; regroup after this step */
  GS_CTL_LR_SCALE,   /* rank 0: the operator's new lr scale (0: no change) */
  GS_CTL_FIXED,      /* the first per-rank bit slot */
};
#define GS_CTL_RANKS_PER_SLOT 16
#define GS_CTL_PERIOD_MAX (1 << 23) /* keeps period + 2 exact in a float */
#define GS_CTL_SEQ_MOD 256u
/* 65536 x 255 < 2^24: every partial sum of the check slots is exact. */
#define GS_CTL_CHECK_MAX_WORLD 65536u

/* What one rank contributes to a step's vector. */
typedef struct gs_control_local {
  uint32_t rank;
  /* Rank 0 only (other ranks leave them false): the coordinator's requests. */
  bool stop;
  bool set_period; /* `period` is a new broadcast period */
  int32_t period;  /* -1 .. GS_CTL_PERIOD_MAX - 1; others are not sent */
  bool broadcast;
  bool checkpoint;
  bool regroup;
  bool set_lr_scale; /* `lr_scale` is a new one (gs_lr_scale_valid; others are not sent) */
  float lr_scale;
  /* Every rank. */
  bool term;            /* SIGTERM arrived */
  bool nonfinite;       /* this rank's loss is NaN or infinite */
  uint64_t step;        /* steps this rank has begun before this one */
  uint64_t collectives; /* collectives this rank issued before this step */
} gs_control_local_t;

/* What the summed vector says: the same on every rank. */
typedef struct gs_control {
  bool stop;           /* the coordinator asked every rank to stop */
  bool term;           /* some rank got SIGTERM */
  bool period_changed; /* `period` is the new broadcast period */
  int32_t period;
  bool broadcast;
  bool checkpoint;
  bool regroup;          /* every rank regroups after this step (elastic) */
  bool lr_scale_changed; /* `lr_scale` is the new one */
  float lr_scale;
  bool nonfinite; /* some rank's loss is not finite (gs_control_rank_nonfinite says which) */
} gs_control_t;

/* Floats in the vector of a job of `world_size` ranks. */
size_t gs_control_len(uint32_t world_size);

/* Writes one rank's contribution into v[0 .. n) (n = gs_control_len), all
 * other slots zero. */
void gs_control_encode(const gs_control_local_t *in, float *v, size_t n);

/* Where rank `rank`'s non-finite loss goes in a vector of n floats: it
 * adds 1 to v[*i] and *w to v[*j] (*j is n when the vector has no room
 * for its bit), as gs_control_encode does; what a device writes when it
 * learns the loss after the rest was encoded. */
void gs_control_nonfinite_at(uint32_t rank, size_t n, uint32_t *i, uint32_t *j, float *w);

/* Reads the vector summed over the ranks. */
void gs_control_decode(const float *v, size_t n, gs_control_t *out);

/* Checks the summed vector's step and collective counts against this
 * rank's own (`mine`, as encoded) in a job of `world` ranks: 0 when they
 * agree, GS_EPROTO with the problem named in `why` when some rank is at
 * another step or ran another number of collectives. Always 0 above
 * GS_CTL_CHECK_MAX_WORLD ranks, where the sums are no longer exact. */
int gs_control_check(const float *v, size_t n, const gs_control_local_t *mine, uint32_t world,
                     char *why, size_t why_len);

/* Whether rank `rank`'s non-finite bit is set in the summed vector. */
bool gs_control_rank_nonfinite(const float *v, size_t n, uint32_t rank);

#endif
