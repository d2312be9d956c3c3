#include "frame.h"

#include "byteorder.h"

long gs_frame_parse(const uint8_t *buf, size_t len, size_t max_payload, const uint8_t **payload,
                    size_t *payload_len)
{
  uint32_t n;

  if (len < GS_FRAME_HEADER_BYTES)
    return 0;
  n = gs_load_be32(buf);
  if (n > max_payload)
    return GS_ETOOBIG;
  if (len - GS_FRAME_HEADER_BYTES < n)
    return 0;
  *payload = buf + GS_FRAME_HEADER_BYTES;
  *payload_len = n;
  return (long)n + GS_FRAME_HEADER_BYTES;
}

void gs_frame_put_header(uint8_t header[GS_FRAME_HEADER_BYTES], uint32_t payload_len)
{
  gs_store_be32(header, payload_len);
}
