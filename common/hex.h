/* Bytes as lowercase hex and back: how a binary id (NCCL's unique id)
 * travels on a command line between a parent and the ranks it starts. */
#ifndef GS_HEX_H
#define GS_HEX_H

#include <stdbool.h>
#include <stddef.h>

/* Writes 2 * len hex digits and a NUL to out (2 * len + 1 bytes). */
void gs_hex_encode(const void *bytes, size_t len, char *out);

/* Decodes a whole string of hex digit pairs into out (at most cap bytes)
 * and its size into *len; false (nothing promised in out) when it is
 * empty, of odd length, longer than cap bytes or not hex. */
bool gs_hex_decode(const char *hex, void *out, size_t cap, size_t *len);

#endif
