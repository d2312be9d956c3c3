/* Injected faults (see faults.h). */
#include "faults.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "parse.h"

#define EXPECT "data-hang:RANK:STEP[:DURATION or /FILE] or straggler:RANK[:FACTOR]"

/* The next ':'-separated field of *s into buf; false when none is left. */
static bool next_field(const char **s, char *buf, size_t len)
{
  const char *end;
  size_t n;

  if (!*s)
    return false;
  end = strchr(*s, ':');
  n = end ? (size_t)(end - *s) : strlen(*s);
  if (n >= len)
    n = len - 1;
  memcpy(buf, *s, n);
  buf[n] = '\0';
  *s = end ? end + 1 : NULL;
  return true;
}

static int parse_fields(const char *s, gs_fault_t *f)
{
  char kind[16], rank[16], third[32], fourth[sizeof(f->until)];
  long v;

  *f = (gs_fault_t){.duration_ms = 3600 * 1000, .factor = 2.0};
  if (!next_field(&s, kind, sizeof(kind)) || !next_field(&s, rank, sizeof(rank)) ||
      gs_parse_long(rank, 0, 1 << 20, &v))
    return GS_EINVAL;
  f->rank = (uint32_t)v;
  if (!strcmp(kind, "data-hang")) {
    f->kind = GS_FAULT_DATA_HANG;
    if (!next_field(&s, third, sizeof(third)) || gs_parse_long(third, 0, 1L << 40, &v))
      return GS_EINVAL;
    f->step = (uint64_t)v;
    if (next_field(&s, fourth, sizeof(fourth))) {
      if (fourth[0] == '/')
        snprintf(f->until, sizeof(f->until), "%s", fourth);
      else if (gs_parse_duration_ms(fourth, &f->duration_ms))
        return GS_EINVAL;
    }
  } else if (!strcmp(kind, "straggler")) {
    f->kind = GS_FAULT_STRAGGLER;
    if (next_field(&s, third, sizeof(third))) {
      char *end;

      f->factor = strtod(third, &end);
      if (*end || !(f->factor >= 1.0 && f->factor <= 100.0))
        return GS_EINVAL;
    }
  } else {
    return GS_EINVAL;
  }
  return s ? GS_EINVAL : 0; /* nothing may follow */
}

int gs_fault_parse(const char *s, gs_fault_t *out, char *expect, size_t expect_len)
{
  int err = parse_fields(s, out);

  if (err)
    snprintf(expect, expect_len, EXPECT);
  return err;
}

void gs_fault_show(const gs_fault_t *f, char *buf, size_t len)
{
  if (f->kind == GS_FAULT_DATA_HANG && f->until[0])
    snprintf(buf, len, "data-hang:%u:%llu:%s", f->rank, (unsigned long long)f->step, f->until);
  else if (f->kind == GS_FAULT_DATA_HANG)
    snprintf(buf, len, "data-hang:%u:%llu:%llums", f->rank, (unsigned long long)f->step,
             (unsigned long long)f->duration_ms);
  else if (f->kind == GS_FAULT_STRAGGLER)
    snprintf(buf, len, "straggler:%u:%g", f->rank, f->factor);
  else
    snprintf(buf, len, "none");
}

static void sleep_ms(double ms)
{
  struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                        .tv_nsec = (long)((ms - (time_t)(ms / 1000) * 1000.0) * 1e6)};

  nanosleep(&ts, NULL);
}

void gs_fault_data(const gs_fault_t *f, uint32_t rank, uint64_t step, volatile sig_atomic_t *stop)
{
  if (f->kind != GS_FAULT_DATA_HANG || f->rank != rank || f->step != step)
    return;
  if (f->until[0]) {
    fprintf(stderr,
            "gradsync-agent: --inject-fault: rank %u's data loader hangs at step %llu "
            "until %s exists\n",
            rank, (unsigned long long)step, f->until);
    while (access(f->until, F_OK) != 0 && !(stop && *stop))
      sleep_ms(20);
    return;
  }
  fprintf(stderr,
          "gradsync-agent: --inject-fault: rank %u's data loader hangs at step %llu for %.0f s\n",
          rank, (unsigned long long)step, f->duration_ms / 1000.0);
  for (uint64_t slept = 0; slept < f->duration_ms && !(stop && *stop); slept += 100)
    sleep_ms(100);
}

void gs_fault_compute(const gs_fault_t *f, uint32_t rank, double compute_ms)
{
  if (f->kind == GS_FAULT_STRAGGLER && f->rank == rank && compute_ms > 0)
    sleep_ms(compute_ms * (f->factor - 1.0));
}
