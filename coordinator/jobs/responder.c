/* Conveniences over a responder's reply function. */
#include "responder.h"

#include <stdarg.h>
#include <stdio.h>

void gs__respond(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id,
                 const pb_msgdesc_t *fields, const void *msg)
{
  gs_reply_t rep = {.to = to, .method = m, .request_id = request_id, .fields = fields, .msg = msg};

  r->reply(r, &rep);
}

void gs__respond_bytes(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id,
                       const uint8_t *body, size_t len)
{
  gs_reply_t rep = {.to = to, .method = m, .request_id = request_id, .body = body, .body_len = len};

  r->reply(r, &rep);
}

void gs__respond_error(gs_responder_t *r, uint64_t to, gs_method_t m, uint64_t request_id, int err,
                       const char *fmt, ...)
{
  /* As long as gradsync.Envelope.message holds. */
  char text[sizeof(((gradsync_Envelope *)0)->message)];
  gs_reply_t rep = {.to = to, .method = m, .request_id = request_id, .err = err, .message = text};
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  r->reply(r, &rep);
}
