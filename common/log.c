/* Log lines: `2026-01-02T03:04:05.678Z INFO coordinator [job/3] message`. */
#include "log.h"

#include "error.h"
#include "escape.h"

#include <ctype.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void gs_log(const gs_log_t *log, gs_log_level_t level, const char *job, long rank, const char *fmt,
            ...)
{
  FILE *out = log && log->out ? log->out : stderr;
  char line[2048], stamp[32], msg[2048], safe_job[160];
  struct timeval tv;
  struct tm tm;
  va_list ap;
  int n;

  if (log && level > log->level)
    return;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  n = snprintf(line, sizeof(line), "%s.%03ldZ %s %s ", stamp, (long)tv.tv_usec / 1000,
               level_names[level], log && log->component ? log->component : "gradsync");
  if (job)
    gs_escape(job, safe_job, sizeof(safe_job));
  if (job && rank >= 0)
    n += snprintf(line + n, sizeof(line) - n, "[%s/%ld] ", safe_job, rank);
  else if (job)
    n += snprintf(line + n, sizeof(line) - n, "[%s] ", safe_job);
  else
    n += snprintf(line + n, sizeof(line) - n, "[-] ");
  /* Messages carry strings from the wire and from files: escaped here, in
   * one place, so no caller can forge a line (a newline in a method name). */
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (n < (int)sizeof(line))
    gs_escape(msg, line + n, sizeof(line) - n);
  /* One fputs per line so lines from several threads never interleave. */
  n = strlen(line);
  if (n < (int)sizeof(line) - 1) {
    line[n] = '\n';
    line[n + 1] = '\0';
  } else {
    line[sizeof(line) - 2] = '\n';
  }
  fputs(line, out);
  fflush(out);
}

int gs_log_level_parse(const char *s, gs_log_level_t *out)
{
  for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
    if (strcasecmp(s, level_names[i]) == 0) {
      *out = (gs_log_level_t)i;
      return 0;
    }
  }
  if (strcasecmp(s, "warning") == 0) {
    *out = GS_LOG_WARN;
    return 0;
  }
  return GS_EINVAL;
}

int gs_log_level_flag_parse(const char *value, void *target, char *expect, size_t expect_len)
{
  int err = gs_log_level_parse(value, target);

  if (err)
    snprintf(expect, expect_len, "error, warn, info or debug");
  return err;
}

void gs_log_level_flag_show(const void *target, char *buf, size_t len)
{
  const char *name = level_names[*(const gs_log_level_t *)target];
  size_t i;

  if (len == 0)
    return;
  for (i = 0; i + 1 < len && name[i]; i++)
    buf[i] = (char)tolower((unsigned char)name[i]);
  buf[i] = '\0';
}
