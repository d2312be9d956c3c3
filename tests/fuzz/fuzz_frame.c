/* Frames and Envelopes as the coordinator reads them off a socket: the
 * input is a byte stream cut into frames (common/frame.c); every whole
 * payload is decoded as an Envelope (common/wire.c), and one that decodes
 * is encoded again and must decode to the same fields. */
#include <string.h>

#include "frame.h"
#include "fuzz.h"
#include "wire.h"

#define MAX_PAYLOAD 4096

static void round_trip(const gradsync_Envelope *env, const gs_buf_t *body)
{
  gradsync_Envelope again;
  gs_buf_t frame = {0}, body2 = {0};
  const uint8_t *payload;
  size_t payload_len;
  char why[128];
  gs_method_t m;

  if (gs_method_from_path(env->method, &m))
    GS_FUZZ_CHECK(strcmp(gs_method_path(m), env->method) == 0);
  if (gs_wire_encode_frame_bytes(&frame, env, body->data, body->len, 1u << 20) != 0)
    goto out;
  GS_FUZZ_CHECK(gs_frame_parse(frame.data, frame.len, 1u << 20, &payload, &payload_len) ==
                (long)frame.len);
  GS_FUZZ_CHECK(gs_wire_decode_envelope(payload, payload_len, &again, &body2, why, sizeof(why)) ==
                0);
  GS_FUZZ_CHECK(strcmp(again.method, env->method) == 0);
  GS_FUZZ_CHECK(strcmp(again.token, env->token) == 0);
  GS_FUZZ_CHECK(again.request_id == env->request_id && again.timeout_ms == env->timeout_ms);
  GS_FUZZ_CHECK(body2.len == body->len &&
                (!body->len || !memcmp(body2.data, body->data, body->len)));
out:
  gs_buf_free(&frame);
  gs_buf_free(&body2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  while (size > 0) {
    const uint8_t *payload;
    size_t payload_len;
    long used = gs_frame_parse(data, size, MAX_PAYLOAD, &payload, &payload_len);
    gradsync_Envelope env;
    gs_buf_t body = {0};
    char why[128];

    if (used <= 0) /* partial (wait for more) or oversized (close) */
      break;
    GS_FUZZ_CHECK((size_t)used <= size && payload_len == (size_t)used - GS_FRAME_HEADER_BYTES);
    GS_FUZZ_CHECK(payload == data + GS_FRAME_HEADER_BYTES);
    if (gs_wire_decode_envelope(payload, payload_len, &env, &body, why, sizeof(why)) == 0)
      round_trip(&env, &body);
    else
      GS_FUZZ_CHECK(why[0] != '\0');
    gs_buf_free(&body);
    data += used;
    size -= (size_t)used;
  }
  return 0;
}
