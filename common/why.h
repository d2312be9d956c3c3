/* The `why` convention: a function that can fail takes (char *why, size_t
 * why_len) and writes one line saying what went wrong, for its caller to
 * log or show. These make each failure path a single statement. */
#ifndef GS_WHY_H
#define GS_WHY_H

#include <stdarg.h>
#include <stddef.h>

/* Formats the reason into `why` when the caller gave a buffer (why may be
 * NULL, or why_len 0). */
void gs_set_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gs_set_whyv(char *why, size_t why_len, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* The same, returning `err` (a negative GS_E* code): `return gs_why(...)`. */
int gs_why(int err, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "SIGTERM", "SIGINT", "SIGHUP", or "a signal": for "interrupted by ...". */
const char *gs_signal_name(int sig);

#endif
