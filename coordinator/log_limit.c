/* See log_limit.h. */
#include "log_limit.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "hash.h"

#define SETS (GS_LOG_LIMIT_SLOTS / GS_LOG_LIMIT_WAYS)
_Static_assert((SETS & (SETS - 1)) == 0, "GS_LOG_LIMIT_SLOTS / GS_LOG_LIMIT_WAYS: a power of 2");

static const struct {
  const char *transport;
  gs_log_level_t level;
  const char *what;
} kinds[GS_LOG_KIND_COUNT] = {
#define XX(name, transport, level, what) {transport, GS_LOG_##level, what},
    GS_LOG_KIND_MAP(XX)
#undef XX
};

void gs__log_limit_init(gs_log_limit_t *ll, const gs_log_t *log)
{
  memset(ll, 0, sizeof(*ll));
  ll->log = log;
  ll->window_ms = GS_LOG_LIMIT_WINDOW_MS;
  gs_list_init(&ll->windows);
}

/* Whether a line at `level` would be written at all: one that would not
 * takes no share of any limit. */
static bool enabled(const gs_log_limit_t *ll, gs_log_level_t level)
{
  return !ll->log || level <= ll->log->level;
}

/* Ends the window for all clients, with the summary of what it held back. */
static void all_end(gs_log_limit_t *ll, uint64_t now_ms)
{
  uint64_t secs = (now_ms - ll->all_start_ms) / 1000;

  if (ll->all_suppressed)
    gs_log(ll->log, GS_LOG_WARN, NULL, -1,
           "%llu more lines about clients suppressed in the last %llu s (at most %u per %u s "
           "for all clients together)",
           (unsigned long long)ll->all_suppressed, (unsigned long long)(secs ? secs : 1),
           GS_LOG_LIMIT_ALL, (unsigned)(ll->window_ms / 1000));
  ll->all_written = 0;
  ll->all_suppressed = 0;
}

/* Ends the window for all clients if it is open and has run its length. */
static void all_expire(gs_log_limit_t *ll, uint64_t now_ms)
{
  if ((ll->all_written || ll->all_suppressed) && now_ms - ll->all_start_ms >= ll->window_ms)
    all_end(ll, now_ms);
}

/* Takes one line's share of the limit for all clients; false when it is
 * spent (the caller counts what it held back in all_suppressed). */
static bool all_take(gs_log_limit_t *ll, uint64_t now_ms)
{
  all_expire(ll, now_ms);
  if (!ll->all_written && !ll->all_suppressed)
    ll->all_start_ms = now_ms;
  if (ll->all_written >= GS_LOG_LIMIT_ALL)
    return false;
  ll->all_written++;
  return true;
}

/* Ends a slot's window, writing its summary (within the limit for all
 * clients, else counted there), and frees the slot. */
static void slot_end(gs_log_limit_t *ll, gs_log_limit_slot_t *s, uint64_t now_ms)
{
  uint64_t secs = (now_ms - s->window_start_ms) / 1000;

  if (s->suppressed && !all_take(ll, now_ms))
    ll->all_suppressed += s->suppressed;
  else if (s->suppressed)
    gs_log(ll->log, kinds[s->kind].level, NULL, -1,
           "%s: %s: %u more '%s' lines suppressed in the last %llu s", kinds[s->kind].transport,
           s->address, s->suppressed, kinds[s->kind].what, (unsigned long long)(secs ? secs : 1));
  gs_list_remove(&s->node);
}

/* The address of "1.2.3.4:5" or "[::1]:5": up to the last ':' when only
 * digits follow it. */
static void address_of(const char *peer, char *out, size_t len)
{
  const char *colon = strrchr(peer, ':');
  size_t n = strlen(peer);

  if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
    n = (size_t)(colon - peer);
  if (n >= len)
    n = len - 1;
  memcpy(out, peer, n);
  out[n] = '\0';
}

/* FNV-1a of the address and the kind. */
static uint32_t slot_hash(const char *address, gs_log_kind_t kind)
{
  return gs_fnv1a_str(GS_FNV1A_SEED ^ (uint32_t)kind, address);
}

/* The slot of (address, kind) with a window open at `now_ms`: the one it
 * has, else a free one of its set, else the set's oldest window, ended
 * early to make room (its summary written first). */
static gs_log_limit_slot_t *slot_for(gs_log_limit_t *ll, uint64_t now_ms, const char *address,
                                     gs_log_kind_t kind)
{
  gs_log_limit_slot_t *set =
      &ll->slots[(slot_hash(address, kind) & (SETS - 1)) * GS_LOG_LIMIT_WAYS];
  gs_log_limit_slot_t *take = NULL;

  for (gs_log_limit_slot_t *s = set; s < set + GS_LOG_LIMIT_WAYS; s++) {
    if (!gs_list_linked(&s->node))
      continue;
    if (s->kind == kind && !strcmp(s->address, address)) {
      if (now_ms - s->window_start_ms < ll->window_ms)
        return s;
      slot_end(ll, s, now_ms); /* no sweep since its window ended */
      break;
    }
  }
  for (gs_log_limit_slot_t *s = set; s < set + GS_LOG_LIMIT_WAYS; s++) {
    if (!gs_list_linked(&s->node)) {
      take = s;
      break;
    }
    if (!take || s->window_start_ms < take->window_start_ms)
      take = s;
  }
  if (gs_list_linked(&take->node))
    slot_end(ll, take, now_ms);
  take->kind = (uint8_t)kind;
  snprintf(take->address, sizeof(take->address), "%s", address);
  take->window_start_ms = now_ms;
  take->written = take->suppressed = 0;
  gs_list_insert_tail(&ll->windows, &take->node);
  return take;
}

void gs__log_limit_vline(gs_log_limit_t *ll, uint64_t now_ms, const char *peer, gs_log_kind_t kind,
                         const char *fmt, va_list ap)
{
  gs_log_limit_slot_t *s;
  char address[sizeof(s->address)], text[512];

  if (!enabled(ll, kinds[kind].level))
    return;
  if (!peer)
    peer = "?";
  address_of(peer, address, sizeof(address));
  s = slot_for(ll, now_ms, address, kind);
  if (s->written >= GS_LOG_LIMIT_BURST) {
    s->suppressed++;
    return;
  }
  if (!all_take(ll, now_ms)) {
    ll->all_suppressed++;
    return;
  }
  s->written++;
  vsnprintf(text, sizeof(text), fmt, ap);
  gs_log(ll->log, kinds[kind].level, NULL, -1, "%s: %s: %s", kinds[kind].transport, peer, text);
}

void gs__log_limit_line(gs_log_limit_t *ll, uint64_t now_ms, const char *peer, gs_log_kind_t kind,
                        const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  gs__log_limit_vline(ll, now_ms, peer, kind, fmt, ap);
  va_end(ap);
}

void gs__log_limit_sweep(gs_log_limit_t *ll, uint64_t now_ms)
{
  gs_list_t *oldest;

  while ((oldest = gs_list_first(&ll->windows))) {
    gs_log_limit_slot_t *s = GS_CONTAINER_OF(oldest, gs_log_limit_slot_t, node);

    if (now_ms - s->window_start_ms < ll->window_ms)
      break;
    slot_end(ll, s, now_ms);
  }
  all_expire(ll, now_ms);
}

void gs__log_limit_close(gs_log_limit_t *ll, uint64_t now_ms)
{
  gs_list_t *oldest;

  while ((oldest = gs_list_first(&ll->windows)))
    slot_end(ll, GS_CONTAINER_OF(oldest, gs_log_limit_slot_t, node), now_ms);
  all_end(ll, now_ms);
}
