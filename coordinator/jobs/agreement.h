/* What the members of a rendezvous must agree on before a generation
 * starts, each compared with the reference member (rank 0, or the first
 * member in rank order that takes part in the comparison), in this order
 * (the first difference found is the one reported):
 *
 *   - the kind of device, what comes before ':' in JoinRequest.device
 *     (members that name one): cpu and cuda ranks cannot share a backend;
 *   - the settings (members that send any; older clients send none): the
 *     values that decide the collective sequence and the arithmetic, by
 *     name, whatever their order;
 *   - the model signature (every member; a missing one counts as zeros).
 *
 * Pure functions of the members: rendezvous.c answers the Joins. */
#ifndef GS_AGREEMENT_H
#define GS_AGREEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "job.h"

/* The first disagreement found. */
typedef struct gs_disagreement {
  uint32_t comparison; /* which of the comparisons above */
  uint32_t ref, bad;   /* positions (ranks) of the reference and the first that differs */
  char message[1600];  /* names both members and the first difference */
} gs_disagreement_t;

/* Whether a Join's settings (req->settings.arg, see jobs.h) have valid,
 * unique names, so that comparing by name means something; writes what is
 * wrong to `why`. */
bool gs__settings_valid(const gradsync_JoinRequest *req, char *why, size_t len);
/* Keeps a copy of a Join's settings in the member (freed with it); false
 * when out of memory. */
bool gs__settings_take(gs_member_t *m, const gradsync_JoinRequest *req);

/* Compares the `n` members, in rank order; fills `d` and returns true at
 * the first disagreement, false when they all agree. */
bool gs__agreement_find(gs_member_t *const *m, uint32_t n, const char *job, gs_disagreement_t *d);
/* Whether member i differs from the reference in d's comparison (so is
 * one to blame); false for the reference and the members before it. */
bool gs__agreement_differs(const gs_disagreement_t *d, gs_member_t *const *m, uint32_t i);
/* Compares a new agent `m` with `ref`, a member of the generation that
 * runs (the same comparisons, in the same order); writes the first
 * difference to `msg` and returns true when there is one. */
bool gs__agreement_newcomer(const gs_member_t *m, const gs_member_t *ref, const char *job,
                            char *msg, size_t len);

#endif
