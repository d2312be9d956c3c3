/* Framing on the RPC stream: a 4-byte big-endian payload length, then the
 * payload (an encoded Envelope). The parser is a pure function of the bytes
 * it is given and never reads past `len`. */
#ifndef GS_FRAME_H
#define GS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define GS_FRAME_HEADER_BYTES 4
#define GS_FRAME_DEFAULT_MAX (4u << 20) /* 4 MiB payload */

/* Looks for one whole frame at the start of buf[0..len). Returns the bytes
 * it occupies (header + payload, > 0) and sets payload/payload_len; returns
 * 0 when more bytes are needed; GS_ETOOBIG when the header announces more
 * than max_payload bytes (the stream cannot be resynchronised: close it). */
long gs_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, const uint8_t **payload,
                    size_t *payload_len);

/* Writes the header for a payload of `payload_len` bytes. */
void gs_frame_put_header(uint8_t header[GS_FRAME_HEADER_BYTES], uint32_t payload_len);

#endif
