/* Faults the MLP agent can inject into itself (--inject-fault), so that
 * tests and bench/hang_inject.sh can make one rank of a job hang or
 * straggle the way a real one does: a data loader that stops answering,
 * a rank slower than the others. */
#ifndef GS_FAULTS_H
#define GS_FAULTS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gs_fault_kind {
  GS_FAULT_NONE,
  GS_FAULT_DATA_HANG,
  GS_FAULT_STRAGGLER
} gs_fault_kind_t;

typedef struct gs_fault {
  gs_fault_kind_t kind;
  uint32_t rank;
  uint64_t step;        /* data-hang: the step whose batch hangs */
  uint64_t duration_ms; /* data-hang: how long */
  char until[256];      /* data-hang: "": for duration_ms; else until this file exists */
  double factor;        /* straggler: its compute takes this many times as long */
} gs_fault_t;

/* "data-hang:RANK:STEP[:DURATION]" (DURATION defaults to 1 h; an
 * absolute path instead: until that file exists, so that a test holds a
 * rank on an event rather than for a time) or "straggler:RANK[:FACTOR]"
 * (FACTOR defaults to 2, from 1 to 100). On an error, what was expected
 * is in `expect`. */
int gs_fault_parse(const char *s, gs_fault_t *out, char *expect, size_t expect_len);
/* Writes the spec back (for --print-config). */
void gs_fault_show(const gs_fault_t *f, char *buf, size_t len);

/* The data phase of `step` on `rank`: sleeps as a data-hang says, until
 * *stop is set (a SIGTERM's flag; may be NULL). */
void gs_fault_data(const gs_fault_t *f, uint32_t rank, uint64_t step, volatile sig_atomic_t *stop);
/* After `compute_ms` of compute on `rank`: a straggler sleeps as much
 * again times (factor - 1). */
void gs_fault_compute(const gs_fault_t *f, uint32_t rank, double compute_ms);

#endif
