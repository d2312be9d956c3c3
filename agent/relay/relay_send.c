/* What the node agent's files send with (relay_internal.h): writes on a
 * stream, frames to a rank or up to the coordinator (in TLS when the relay
 * speaks it), the tokens the coordinator took, the batching window. A
 * leaf: relay.c, beats.c and pack_list.c call it, it calls none of them
 * (the window's end is the callback relay.c put in r->on_flush). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay_internal.h"

typedef struct write_req {
  uv_write_t req;
  uint8_t data[];
} write_req_t;

static void on_written(uv_write_t *req, int status)
{
  (void)status; /* a failed write shows up as a read error on the same stream */
  free(req);
}

/* Queues `len` bytes on a stream; false when it cannot (out of memory, or
 * the stream is closing). */
bool gs__relay_write(uv_stream_t *s, const uint8_t *data, size_t len)
{
  write_req_t *w = malloc(sizeof(*w) + len);
  uv_buf_t b;

  if (!w)
    return false;
  memcpy(w->data, data, len);
  b = uv_buf_init((char *)w->data, (unsigned)len);
  if (uv_write(&w->req, s, &b, 1, on_written)) {
    free(w);
    return false;
  }
  return true;
}

/* Sends `env` with the body bytes as one frame on `s` (the coordinator's
 * stream: through its TLS session, when it has one). */
bool gs__relay_send_frame(gs_relay_t *r, uv_stream_t *s, const gradsync_Envelope *env,
                          const uint8_t *body, size_t len)
{
  r->out.len = 0;
  if (gs_wire_encode_frame_bytes(&r->out, env, body, len, UP_FRAME_MAX))
    return false;
  return s == (uv_stream_t *)&r->up ? gs__relay_send_up(r, r->out.data, r->out.len)
                                    : gs__relay_write(s, r->out.data, r->out.len);
}

bool gs__relay_send_up(gs_relay_t *r, const uint8_t *data, size_t len)
{
  if (!r->up_tls)
    return gs__relay_write((uv_stream_t *)&r->up, data, len);
  return gs_tls_output(r->up_tls, data, len) == 0;
}

bool gs__relay_token_good(const gs_relay_t *r, const char *token)
{
  for (uint32_t i = 0; i < r->good_count; i++)
    if (!strcmp(r->good_tokens[i], token))
      return true;
  return false;
}

void gs__relay_token_check(local_t *l, const gradsync_Envelope *env)
{
  snprintf(l->check_token, sizeof(l->check_token), "%s", env->token);
  l->check_id = env->request_id;
  l->checking = true;
}

/* Starts the batching window, if it is not running. */
void gs__relay_flush_soon(gs_relay_t *r)
{
  if (!uv_is_active((uv_handle_t *)&r->flush))
    uv_timer_start(&r->flush, r->on_flush, r->cfg.window_ms, 0);
}
