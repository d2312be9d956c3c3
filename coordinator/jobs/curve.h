/* A job's curve: its loss and samples/s over the whole run, for the
 * dashboard, which opened mid-run would otherwise show only what it saw.
 * Bounded: at most GS_CURVE_POINTS points, one per interval while the job
 * steps; each time it fills, every other point goes and the interval
 * doubles, so the points stay evenly spaced over the run. Grown as it
 * fills and counted in --max-memory's members part; when the budget has
 * no room it thins instead of growing. */
#ifndef GS_CURVE_H
#define GS_CURVE_H

#include <stdint.h>

#define GS_CURVE_POINTS 1024
#define GS_CURVE_FIRST_INTERVAL_MS 1000
/* The ranks a point is taken from, spread over a larger world: a pass
 * over 100,000 members each second cost the coordinator's loop about one
 * percent of a core. */
#define GS_CURVE_SAMPLE_RANKS 1024

typedef struct gs_curve_point {
  uint64_t step;         /* the job's highest step */
  float loss;            /* the running ranks' mean (of GS_CURVE_SAMPLE_RANKS at most) */
  float samples_per_sec; /* theirs, summed (scaled to the world from the sample) */
} gs_curve_point_t;

typedef struct gs_curve {
  gs_curve_point_t *points;
  uint32_t count, cap;
  uint64_t interval_ms; /* between points; 0 until the first */
  uint64_t last_ms;     /* when the last point was taken */
} gs_curve_t;

struct gs_job;
struct cJSON;

/* Takes a point at `now` when the job runs, has stepped since the last
 * point and an interval has passed (the jobs' sweep calls it). */
void gs__curve_sample(struct gs_job *job, uint64_t now);
/* Gives the points back (to the budget too). */
void gs__curve_free(struct gs_job *job);
/* {"interval_s": S, "points": [[step, loss, samples_per_sec], ...]},
 * oldest first; NULL when out of memory. */
struct cJSON *gs__curve_json(const gs_curve_t *c);

#endif
