#include "why.h"

#include <signal.h>
#include <stdio.h>

void gs_set_whyv(char *why, size_t why_len, const char *fmt, va_list ap)
{
  if (why && why_len > 0)
    vsnprintf(why, why_len, fmt, ap);
}

void gs_set_why(char *why, size_t why_len, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs_set_whyv(why, why_len, fmt, ap);
  va_end(ap);
}

int gs_why(int err, char *why, size_t why_len, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs_set_whyv(why, why_len, fmt, ap);
  va_end(ap);
  return err;
}

const char *gs_signal_name(int sig)
{
  return sig == SIGTERM  ? "SIGTERM"
         : sig == SIGINT ? "SIGINT"
         : sig == SIGHUP ? "SIGHUP"
                         : "a signal";
}
