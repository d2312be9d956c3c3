/* Logging: one line per event, `time level component [job/rank] message`.
 * A gs_log_t is owned by whoever owns the component's state (no globals). */
#ifndef GS_LOG_H
#define GS_LOG_H

#include <stddef.h>
#include <stdio.h>

typedef enum gs_log_level {
  GS_LOG_ERROR = 0,
  GS_LOG_WARN,
  GS_LOG_INFO,
  GS_LOG_DEBUG,
} gs_log_level_t;

typedef struct gs_log {
  gs_log_level_t level;
  FILE *out;             /* stderr when NULL */
  const char *component; /* "coordinator", "agent", ... */
} gs_log_t;

/* Writes one line if `level` is enabled. `job` may be NULL and `rank` < 0
 * when the event belongs to no job or rank. Never log secrets. */
void gs_log(const gs_log_t *log, gs_log_level_t level, const char *job, long rank, const char *fmt,
            ...) __attribute__((format(printf, 5, 6)));

/* Parses "error", "warn" (or "warning"), "info" or "debug", in any case. */
int gs_log_level_parse(const char *s, gs_log_level_t *out) __attribute__((warn_unused_result));

/* The --log-level row of a flag table (common/flags.h, GS_FLAG_CUSTOM):
 * parses into the gs_log_level_t at `target`, and shows it. */
int gs_log_level_flag_parse(const char *value, void *target, char *expect, size_t expect_len);
void gs_log_level_flag_show(const void *target, char *buf, size_t len);

#define GS_LOG_ERR(log, ...) gs_log((log), GS_LOG_ERROR, NULL, -1, __VA_ARGS__)
#define GS_LOG_WARNING(log, ...) gs_log((log), GS_LOG_WARN, NULL, -1, __VA_ARGS__)
#define GS_LOG_INF(log, ...) gs_log((log), GS_LOG_INFO, NULL, -1, __VA_ARGS__)
#define GS_LOG_DBG(log, ...) gs_log((log), GS_LOG_DEBUG, NULL, -1, __VA_ARGS__)

#endif
