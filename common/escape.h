/* Strings that came off the wire (method, job and node names) are shown to
 * people in log lines: a newline in one would forge a line. One function
 * makes any string safe to print on one line. */
#ifndef GS_ESCAPE_H
#define GS_ESCAPE_H

#include <stddef.h>

/* Copies `in` into out[0..out_len) with every control byte (below 0x20,
 * 0x7f) and backslash written as `\xNN` (`\\`), truncating to fit; always
 * NUL-terminates when out_len > 0. Returns `out`. */
char *gs_escape(const char *in, char *out, size_t out_len);

#endif
