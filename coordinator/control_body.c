/* The control request's body (see control_body.h). */
#include "control_body.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lr_scale.h"

/* Whether a JSON text holds a NUL: a raw one, or one escaped in a string
 * (\u0000), which cJSON decodes into a C string that ends there:
 * "stop\u0000x" would read as "stop". Walks the strings and their
 * escapes; reads only `len` bytes. */
static bool json_has_nul(const char *text, size_t len)
{
  bool in_string = false;

  for (size_t i = 0; i < len; i++) {
    if (text[i] == '\0') {
      return true; /* a raw one, in a string or not, ends what cJSON reads */
    } else if (text[i] == '"') {
      in_string = !in_string;
    } else if (in_string && text[i] == '\\' && i + 1 < len) {
      if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4))
        return true;
      i++; /* the escaped character: an escaped quote ends no string */
    }
  }
  return false;
}

enum { F_PERIOD, F_LR_SCALE, F_ACTION, F_COUNT };
static const char *const field_names[F_COUNT] = {"bcast_period", "lr_scale", "action"};

static const struct {
  const char *name;
  gs_job_action_t action;
} actions[] = {
    {"broadcast", GS_JOB_ACTION_BROADCAST},
    {"checkpoint", GS_JOB_ACTION_CHECKPOINT},
    {"stop", GS_JOB_ACTION_STOP},
};

/* Each field of the object, at most once, known ones only. */
static bool take_fields(const cJSON *doc, const cJSON *fields[F_COUNT], char *why, size_t why_len)
{
  const cJSON *item;
  bool any = false;

  cJSON_ArrayForEach(item, doc)
  {
    int f = 0;

    while (f < F_COUNT && strcmp(item->string, field_names[f]))
      f++;
    if (f == F_COUNT) {
      snprintf(why, why_len, "unknown field '%s' (expected bcast_period, lr_scale or action)",
               item->string);
      return false;
    }
    if (fields[f]) {
      snprintf(why, why_len, "field '%s' is given twice", item->string);
      return false;
    }
    fields[f] = item;
    any = true;
  }
  if (!any)
    snprintf(why, why_len, "nothing to do: give bcast_period, lr_scale and/or action");
  return any;
}

static bool read_fields(const cJSON *fields[F_COUNT], gs_job_control_t *out, char *why,
                        size_t why_len)
{
  const cJSON *period = fields[F_PERIOD], *lr = fields[F_LR_SCALE], *action = fields[F_ACTION];

  if (period) {
    double v = period->valuedouble;

    if (!cJSON_IsNumber(period) || v != floor(v) || v < -1 || v > INT_MAX) {
      snprintf(why, why_len, "bcast_period must be an integer >= -1");
      return false;
    }
    out->set_period = true;
    out->period = (int32_t)v;
  }
  if (lr) {
    /* Checked as the float the ranks will multiply by. */
    if (!cJSON_IsNumber(lr) || !gs_lr_scale_valid((float)lr->valuedouble)) {
      snprintf(why, why_len, "lr_scale must be a number above 0 and at most %g", GS_LR_SCALE_MAX);
      return false;
    }
    out->set_lr_scale = true;
    out->lr_scale = (float)lr->valuedouble;
  }
  if (action) {
    size_t i = 0;

    while (cJSON_IsString(action) && i < sizeof(actions) / sizeof(actions[0]) &&
           strcmp(action->valuestring, actions[i].name))
      i++;
    if (!cJSON_IsString(action) || i == sizeof(actions) / sizeof(actions[0])) {
      snprintf(why, why_len, "action must be \"broadcast\", \"checkpoint\" or \"stop\"");
      return false;
    }
    out->action = actions[i].action;
  }
  return true;
}

/* Whether text[0..len) holds only JSON whitespace. */
static bool only_whitespace(const char *text, size_t len)
{
  for (size_t i = 0; i < len; i++)
    if (!strchr(" \t\r\n", text[i]))
      return false;
  return true;
}

bool gs__control_body_parse(const char *body, size_t len, gs_job_control_t *out, char *why,
                            size_t why_len)
{
  const cJSON *fields[F_COUNT] = {0};
  const char *end = NULL;
  cJSON *doc;
  bool ok;

  *out = (gs_job_control_t){.action = GS_JOB_ACTION_NONE};
  if (json_has_nul(body, len)) {
    snprintf(why, why_len, "a string in the body holds a NUL (\\u0000)");
    return false;
  }
  doc = cJSON_ParseWithLengthOpts(body, len, &end, false);
  if (!cJSON_IsObject(doc)) {
    cJSON_Delete(doc);
    snprintf(why, why_len, "the body must be a JSON object");
    return false;
  }
  /* {"action":"broadcast"}{"action":"stop"} is not one request: nothing
   * of it is applied, rather than the first alone. */
  if (end && !only_whitespace(end, len - (size_t)(end - body))) {
    cJSON_Delete(doc);
    snprintf(why, why_len, "the body must be one JSON object, with nothing after it");
    return false;
  }
  ok = take_fields(doc, fields, why, why_len) && read_fields(fields, out, why, why_len);
  cJSON_Delete(doc);
  return ok;
}
