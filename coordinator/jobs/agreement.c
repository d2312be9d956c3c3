/* What the members of a rendezvous must agree on (see agreement.h). */
#include "agreement.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb_array.h"

/* Writes what differs between two signatures; false when they agree. */
static bool signature_diff(const gradsync_ModelSignature *a, const gradsync_ModelSignature *b,
                           char *out, size_t len)
{
  if (a->param_count != b->param_count)
    snprintf(out, len, "param_count %u vs %u", a->param_count, b->param_count);
  else if (a->total_elements != b->total_elements)
    snprintf(out, len, "total_elements %llu vs %llu", (unsigned long long)a->total_elements,
             (unsigned long long)b->total_elements);
  else if (a->shapes_hash != b->shapes_hash)
    snprintf(out, len, "parameter shapes differ (shapes_hash %016llx vs %016llx)",
             (unsigned long long)a->shapes_hash, (unsigned long long)b->shapes_hash);
  else if (a->dtypes_hash != b->dtypes_hash)
    snprintf(out, len, "parameter dtypes differ (dtypes_hash %016llx vs %016llx)",
             (unsigned long long)a->dtypes_hash, (unsigned long long)b->dtypes_hash);
  else
    return false;
  return true;
}

/* What differs between member `m` and the reference `ref`, written to
 * `out`; false when they agree. */
typedef bool (*diff_fn)(const gs_member_t *m, const gs_member_t *ref, char *out, size_t len);
/* Whether a member takes part in a comparison (NULL: every member does). */
typedef bool (*has_fn)(const gs_member_t *m);

/* A missing signature counts as all fields zero: every member compares. */
static bool model_diff(const gs_member_t *m, const gs_member_t *ref, char *out, size_t len)
{
  return signature_diff(&m->req.model_signature, &ref->req.model_signature, out, len);
}

/* The kind of a device name: what comes before ':' ("cuda" of "cuda:1"). */
static size_t device_kind_len(const char *device)
{
  return strcspn(device, ":");
}

static bool has_device(const gs_member_t *m)
{
  return m->req.device[0] != '\0';
}

/* Ranks on different kinds of device cannot run one collective backend
 * (host memory vs nccl): refused here rather than at the comm timeout. */
static bool device_diff(const gs_member_t *m, const gs_member_t *ref, char *out, size_t len)
{
  size_t a = device_kind_len(m->req.device), b = device_kind_len(ref->req.device);

  if (a == b && !memcmp(m->req.device, ref->req.device, a))
    return false;
  snprintf(out, len, "device '%s' vs '%s': a job cannot mix %.*s and %.*s ranks", m->req.device,
           ref->req.device, (int)a, m->req.device, (int)b, ref->req.device);
  return true;
}

static bool has_settings(const gs_member_t *m)
{
  return m->settings_count > 0;
}

/* The value of setting `name` in a member's packed settings, or NULL. */
static const char *setting_find(const gs_member_t *m, const char *name)
{
  const char *p = m->settings, *end = p + m->settings_len;

  while (p && p < end) {
    const char *value = p + strlen(p) + 1;

    if (!strcmp(p, name))
      return value;
    p = value + strlen(value) + 1;
  }
  return NULL;
}

/* The first setting of `a` that `b` lacks or holds another value of; its
 * name and both values (NULL: missing) in *name, *va, *vb. */
static bool first_unlike(const gs_member_t *a, const gs_member_t *b, const char **name,
                         const char **va, const char **vb)
{
  const char *p = a->settings, *end = p + a->settings_len;

  while (p < end) {
    const char *value = p + strlen(p) + 1, *other = setting_find(b, p);

    if (!other || strcmp(value, other)) {
      *name = p, *va = value, *vb = other;
      return true;
    }
    p = value + strlen(value) + 1;
  }
  return false;
}

/* Settings decide the collective sequence and the arithmetic (batch, step
 * count, reduce op, learning rate...): a rank that differs would hang the
 * job or drift silently. Compared by name, whatever the order. */
static bool settings_diff(const gs_member_t *m, const gs_member_t *ref, char *out, size_t len)
{
  const char *name, *mine, *theirs;

  if (m->settings_len == ref->settings_len && !memcmp(m->settings, ref->settings, m->settings_len))
    return false;
  if (first_unlike(ref, m, &name, &theirs, &mine))
    snprintf(out, len, "setting '%s' is %s%s%s vs '%s'", name, mine ? "'" : "",
             mine ? mine : "not sent", mine ? "'" : "", theirs);
  else if (first_unlike(m, ref, &name, &mine, &theirs))
    snprintf(out, len, "setting '%s' is '%s' vs not sent", name, mine);
  else
    return false;
  return true;
}

/* One comparison: what it is called in messages, who takes part (NULL:
 * every member) and how two members differ. */
static const struct {
  const char *what;
  has_fn has;
  diff_fn diff;
} comparisons[] = {
    /* Named differences before the model's hashes: a front end that sends
     * its layout as settings (gradsync.torch) gets the parameter named. */
    {"a device kind", has_device, device_diff},
    {"settings", has_settings, settings_diff},
    {"a model", NULL, model_diff},
};

#define NCOMPARISONS (sizeof(comparisons) / sizeof(comparisons[0]))

/* Whether member i takes part in comparison c. */
static bool takes_part(uint32_t c, gs_member_t *const *m, uint32_t i)
{
  return !comparisons[c].has || comparisons[c].has(m[i]);
}

/* The first member that differs from the reference in comparison c. */
static bool find_in(uint32_t c, gs_member_t *const *m, uint32_t n, gs_disagreement_t *d,
                    char *detail, size_t len)
{
  for (d->ref = 0; d->ref < n && !takes_part(c, m, d->ref); d->ref++)
    ;
  for (d->bad = d->ref + 1; d->bad < n; d->bad++) {
    if (takes_part(c, m, d->bad) && comparisons[c].diff(m[d->bad], m[d->ref], detail, len))
      return true;
  }
  return false;
}

bool gs__agreement_find(gs_member_t *const *m, uint32_t n, const char *job, gs_disagreement_t *d)
{
  char detail[512];

  for (d->comparison = 0; d->comparison < NCOMPARISONS; d->comparison++) {
    const gs_member_t *r, *b;

    if (!find_in(d->comparison, m, n, d, detail, sizeof(detail)))
      continue;
    r = m[d->ref], b = m[d->bad];
    /* The difference before the node names: a reply's message is cut at
     * 511 bytes (proto/gradsync.options), and node names may be long. */
    snprintf(d->message, sizeof(d->message),
             "rendezvous of job %s failed: rank %u has %s unlike rank %u's: %s (rank %u: node "
             "'%s', local_rank %u; rank %u: node '%s', local_rank %u)",
             job, d->bad, comparisons[d->comparison].what, d->ref, detail, d->bad, b->req.node,
             b->req.local_rank, d->ref, r->req.node, r->req.local_rank);
    return true;
  }
  return false;
}

bool gs__agreement_differs(const gs_disagreement_t *d, gs_member_t *const *m, uint32_t i)
{
  char detail[512];

  return i > d->ref && takes_part(d->comparison, m, i) &&
         comparisons[d->comparison].diff(m[i], m[d->ref], detail, sizeof(detail));
}

bool gs__agreement_newcomer(const gs_member_t *m, const gs_member_t *ref, const char *job,
                            char *msg, size_t len)
{
  char detail[512];

  for (uint32_t c = 0; c < NCOMPARISONS; c++) {
    if (comparisons[c].has && (!comparisons[c].has(m) || !comparisons[c].has(ref)))
      continue;
    if (!comparisons[c].diff(m, ref, detail, sizeof(detail)))
      continue;
    snprintf(msg, len,
             "job %s runs generation %llu, and this agent has %s unlike its rank %u's: %s (this "
             "agent: node '%s', local_rank %u; rank %u: node '%s', local_rank %u)",
             job, (unsigned long long)ref->generation, comparisons[c].what, ref->rank, detail,
             m->req.node, m->req.local_rank, ref->rank, ref->req.node, ref->req.local_rank);
    return true;
  }
  return false;
}

static bool setting_name_ok(const char *s)
{
  if (!*s)
    return false;
  for (; *s; s++) {
    if (!isalnum((unsigned char)*s) && !strchr("._-", *s))
      return false;
  }
  return true;
}

/* O(n^2) over at most GS_JOB_MAX_SETTINGS names. */
bool gs__settings_valid(const gradsync_JoinRequest *req, char *why, size_t len)
{
  const gs_pb_array_t *a = req->settings.arg;
  const gradsync_Setting *s = a ? a->items : NULL;

  for (size_t i = 0; a && i < a->count; i++) {
    if (!setting_name_ok(s[i].name)) {
      snprintf(why, len, "setting name '%s' is invalid: use 1-63 letters, digits, '.', '_' or '-'",
               s[i].name);
      return false;
    }
    for (size_t j = 0; j < i; j++) {
      if (!strcmp(s[i].name, s[j].name)) {
        snprintf(why, len, "setting '%s' is sent twice", s[i].name);
        return false;
      }
    }
  }
  return true;
}

bool gs__settings_take(gs_member_t *m, const gradsync_JoinRequest *req)
{
  const gs_pb_array_t *a = req->settings.arg;
  const gradsync_Setting *s;
  size_t len = 0;
  char *p;

  if (!a || !a->count)
    return true;
  s = a->items;
  for (size_t i = 0; i < a->count; i++)
    len += strlen(s[i].name) + strlen(s[i].value) + 2;
  p = m->settings = malloc(len);
  if (!p)
    return false;
  for (size_t i = 0; i < a->count; i++) {
    p = stpcpy(p, s[i].name) + 1;
    p = stpcpy(p, s[i].value) + 1;
  }
  m->settings_len = len;
  m->settings_count = (uint32_t)a->count;
  gs__member_count(m, len + GS_STORE_ALLOC_OVERHEAD);
  return true;
}
