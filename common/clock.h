/* The one monotonic clock of the project: intervals, deadlines and rates
 * are measured on CLOCK_MONOTONIC, which never jumps with wall-clock
 * changes. (The coordinator's loop keeps libuv's cached loop time instead:
 * one clock read per loop iteration, not per event.) */
#ifndef GS_CLOCK_H
#define GS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Whole milliseconds since an arbitrary fixed point. */
static inline uint64_t gs_now_ms(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Nanoseconds (for spin budgets of a few microseconds). */
static inline uint64_t gs_now_ns(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Fractional milliseconds (for timing sub-millisecond work). */
static inline double gs_now_ms_f(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif
