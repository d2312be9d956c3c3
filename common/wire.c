#include "wire.h"

#include <pb_decode.h>
#include <pb_encode.h>
#include <stdio.h>
#include <string.h>

#include "frame.h"

static const char *const method_names[] = {
#define GS__METHOD_NAME(id, name) #name,
    GS_METHOD_MAP(GS__METHOD_NAME)
#undef GS__METHOD_NAME
};

static const char *const method_paths[] = {
#define GS__METHOD_PATH(id, name) GS_METHOD_PREFIX #name,
    GS_METHOD_MAP(GS__METHOD_PATH)
#undef GS__METHOD_PATH
};

/* Every method path must fit the Envelope's method field. */
#define GS__METHOD_FITS(id, name)                                                                  \
  _Static_assert(sizeof(GS_METHOD_PREFIX #name) <= sizeof(((gradsync_Envelope *)0)->method),       \
                 "method path " #name " must fit gradsync.Envelope.method");
GS_METHOD_MAP(GS__METHOD_FITS)
#undef GS__METHOD_FITS

const char *gs_method_name(gs_method_t m)
{
  return m < GS_METHOD_COUNT ? method_names[m] : "?";
}

const char *gs_method_path(gs_method_t m)
{
  return m < GS_METHOD_COUNT ? method_paths[m] : "";
}

bool gs_method_from_path(const char *path, gs_method_t *m)
{
  for (int i = 0; i < GS_METHOD_COUNT; i++) {
    if (strcmp(path, method_paths[i]) == 0) {
      *m = (gs_method_t)i;
      return true;
    }
  }
  return false;
}

struct body_ref {
  const pb_msgdesc_t *fields;
  const void *msg;
  const uint8_t *bytes; /* already encoded body, when fields is NULL */
  size_t len;
};

/* A bytes field holding a message has the same encoding as a submessage. */
static int encode_frame(gs_buf_t *out, const gradsync_Envelope *env, struct body_ref *ref,
                        size_t max_payload);

static bool encode_body(pb_ostream_t *stream, const pb_field_t *field, void *const *arg)
{
  const struct body_ref *ref = *arg;

  if (ref->fields && ref->msg)
    return pb_encode_tag_for_field(stream, field) &&
           pb_encode_submessage(stream, ref->fields, ref->msg);
  if (ref->bytes)
    return pb_encode_tag_for_field(stream, field) && pb_encode_string(stream, ref->bytes, ref->len);
  return true;
}

int gs_wire_encode_frame(gs_buf_t *out, const gradsync_Envelope *env,
                         const pb_msgdesc_t *body_fields, const void *body, size_t max_payload)
{
  struct body_ref ref = {body_fields, body, NULL, 0};

  return encode_frame(out, env, &ref, max_payload);
}

int gs_wire_encode_frame_bytes(gs_buf_t *out, const gradsync_Envelope *env, const uint8_t *body,
                               size_t body_len, size_t max_payload)
{
  struct body_ref ref = {NULL, NULL, body, body_len};

  return encode_frame(out, env, &ref, max_payload);
}

/* Appends `env` with its body, after a header: a frame's (4-byte length)
 * or a batch entry's (field 1's tag and a varint length). */
static int encode_envelope(gs_buf_t *out, const gradsync_Envelope *env, struct body_ref *ref,
                           size_t max_payload, bool as_batch_entry)
{
  gradsync_Envelope e = *env;
  uint8_t head[16];
  size_t size, head_len = GS_FRAME_HEADER_BYTES;
  pb_ostream_t stream;
  int err;

  e.body.funcs.encode = encode_body;
  e.body.arg = ref;
  if (!pb_get_encoded_size(&size, gradsync_Envelope_fields, &e))
    return GS_EPROTO;
  if (size > max_payload || size > UINT32_MAX)
    return GS_ETOOBIG;
  if (as_batch_entry) {
    stream = pb_ostream_from_buffer(head, sizeof(head));
    if (!pb_encode_tag(&stream, PB_WT_STRING, 1) || !pb_encode_varint(&stream, size))
      return GS_EPROTO;
    head_len = stream.bytes_written;
  } else {
    gs_frame_put_header(head, (uint32_t)size);
  }
  err = gs_buf_reserve(out, head_len + size);
  if (err)
    return err;
  memcpy(out->data + out->len, head, head_len);
  stream = pb_ostream_from_buffer(out->data + out->len + head_len, size);
  if (!pb_encode(&stream, gradsync_Envelope_fields, &e))
    return GS_EPROTO;
  out->len += head_len + size;
  return 0;
}

static int encode_frame(gs_buf_t *out, const gradsync_Envelope *env, struct body_ref *ref,
                        size_t max_payload)
{
  return encode_envelope(out, env, ref, max_payload, false);
}

int gs_wire_encode_batch_entry(gs_buf_t *out, const gradsync_Envelope *env, const uint8_t *body,
                               size_t body_len, size_t max_payload)
{
  struct body_ref ref = {NULL, NULL, body, body_len};

  return encode_envelope(out, env, &ref, max_payload, true);
}

bool gs_wire_batch_next(const uint8_t *data, size_t len, size_t *off, const uint8_t **entry,
                        size_t *entry_len, bool *bad)
{
  pb_istream_t s;
  pb_wire_type_t type;
  uint32_t tag;
  uint64_t n;
  bool eof;

  *bad = false;
  if (*off >= len)
    return false;
  s = pb_istream_from_buffer(data + *off, len - *off);
  if (!pb_decode_tag(&s, &type, &tag, &eof) || tag != 1 || type != PB_WT_STRING ||
      !pb_decode_varint(&s, &n) || n > s.bytes_left) {
    *bad = true;
    return false;
  }
  *entry = data + len - s.bytes_left;
  *entry_len = (size_t)n;
  *off = len - s.bytes_left + (size_t)n;
  return true;
}

static bool decode_body(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
  gs_buf_t *body = *arg;
  size_t n = stream->bytes_left;

  (void)field;
  body->len = 0;
  if (gs_buf_reserve(body, n ? n : 1))
    PB_RETURN_ERROR(stream, "out of memory");
  if (!pb_read(stream, body->data, n))
    return false;
  body->len = n;
  return true;
}

int gs_wire_decode_envelope(const uint8_t *payload, size_t len, gradsync_Envelope *env,
                            gs_buf_t *body, char *why, size_t why_len)
{
  memset(env, 0, sizeof(*env));
  body->len = 0;
  env->body.funcs.decode = decode_body;
  env->body.arg = body;
  return gs_wire_decode_into_defaults(payload, len, gradsync_Envelope_fields, env, why, why_len);
}

/* pb_decode_ex with `flags`; nanopb's reason in why. */
static int decode(const uint8_t *data, size_t len, const pb_msgdesc_t *fields, void *msg,
                  unsigned flags, char *why, size_t why_len)
{
  pb_istream_t stream = pb_istream_from_buffer(data, len);

  if (pb_decode_ex(&stream, fields, msg, flags))
    return 0;
  if (why)
    snprintf(why, why_len, "%s", PB_GET_ERROR(&stream));
  return GS_EPROTO;
}

int gs_wire_decode(const uint8_t *data, size_t len, const pb_msgdesc_t *fields, void *msg,
                   char *why, size_t why_len)
{
  return decode(data, len, fields, msg, 0, why, why_len);
}

int gs_wire_decode_into_defaults(const uint8_t *data, size_t len, const pb_msgdesc_t *fields,
                                 void *msg, char *why, size_t why_len)
{
  return decode(data, len, fields, msg, PB_DECODE_NOINIT, why, why_len);
}

int gs_wire_encode(gs_buf_t *out, const pb_msgdesc_t *fields, const void *msg)
{
  size_t size;
  pb_ostream_t stream;
  int err;

  if (!pb_get_encoded_size(&size, fields, msg))
    return GS_EPROTO;
  /* An empty message encodes to nothing; an unused buffer's data is NULL,
   * and NULL + 0 is undefined (UBSan reports it; fuzz_messages found it). */
  if (size == 0)
    return 0;
  err = gs_buf_reserve(out, size);
  if (err)
    return err;
  stream = pb_ostream_from_buffer(out->data + out->len, size);
  if (!pb_encode(&stream, fields, msg))
    return GS_EPROTO;
  out->len += size;
  return 0;
}
