/* What holds a job up (see waiting.h).
 *
 * A rank is held up when its heartbeat says it has waited in a collective
 * (an allreduce, or a sync outside the step) for longer than
 * GS_WAITING_MIN_MS and three of its own recent steps: a straggler's
 * neighbours wait less than a step each time, a hang's wait grows. The
 * ranks they wait on are then, in order: the silent ones (no heartbeat:
 * SIGSTOP, a frozen host, a cut link); the live ones in another phase (a
 * data loader that hangs, a forward that never ends); the ones inside the
 * collective whose sends wait most of the time (their outbound link is
 * slow: their neighbours wait to receive); and when every rank is inside
 * it and none is behind, the transport itself. */
#include "waiting.h"

#include <stdio.h>
#include <string.h>

#include "gradsync.pb.h"
#include "job.h"
#include "phase.h"
#include "why.h"

#define CHECK_EVERY_MS 250
#define HELD_AFTER_MAX_MS 86400000 /* a day */
#define WARN_AFTER_MS 10000        /* a hold this long is logged as a warning */
/* A rank whose sends waited this share of the time or more, twice any
 * other's, owns a slow link. */
#define SLOW_LINK_SHARE 0.5f
/* A straggler's extra compute is this share of its step or more. */
#define STRAGGLER_MIN_SHARE 0.1f

static const char *const kind_names[] = {"none",      "no_heartbeat", "phase",
                                         "slow_link", "transport",    "straggler"};

const char *gs__wait_kind_name(gs_wait_kind_t k)
{
  return (unsigned)k < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[k] : "unknown";
}

static bool in_collective(const gs_member_t *m)
{
  return m->phase == gradsync_Phase_PHASE_ALLREDUCE || m->phase == gradsync_Phase_PHASE_SYNC;
}

/* The silence after which a rank counts as silent: an interval and a
 * half (at least 500 ms more than one). */
static uint64_t silence_ms(const gs_job_t *job)
{
  uint64_t interval = job->jobs->cfg.heartbeat_interval_ms;

  return interval + (interval / 2 > 500 ? interval / 2 : 500);
}

/* Silent: its heartbeat thread does not run either. A rank whose
 * heartbeats take long to arrive (they cross a slow link, queued behind
 * its gradients) has its latest round trip more, up to an interval: the
 * wait is for a heartbeat, not for the network. */
static bool silent(const gs_member_t *m, uint64_t now)
{
  uint64_t interval = m->job->jobs->cfg.heartbeat_interval_ms;
  uint64_t late = m->clock.beat_rtt_ms < interval ? m->clock.beat_rtt_ms : interval;

  return now - m->last_heartbeat_ms > silence_ms(m->job) + late;
}

/* How long m may wait in a collective before it counts as held up: its
 * latest step or its recent ones, whichever was longer, three times. The
 * times are the client's floats: one past a day (or infinite) counts as a
 * day, which a C conversion of a huge double could not give. */
static uint64_t held_after_ms(const gs_member_t *m)
{
  double last = (double)m->compute_ms + (double)m->comm_wait_ms;
  double steps = 3.0 * (last > m->step_ms ? last : (double)m->step_ms);

  if (steps > HELD_AFTER_MAX_MS)
    return HELD_AFTER_MAX_MS;
  return steps > GS_WAITING_MIN_MS ? (uint64_t)steps : GS_WAITING_MIN_MS;
}

/* What the passes over the ranks found. */
typedef struct scan {
  uint32_t live_in_collective;
  const gs_member_t *longest;                   /* the waiter waiting longest; NULL: none */
  gs_waiting_on_t found[GS_WAIT_TRANSPORT + 1]; /* candidates of each kind */
} scan_t;

static void add_rank(gs_waiting_on_t *w, const gs_member_t *m)
{
  if (w->rank_count < GS_WAITING_MAX_RANKS)
    w->ranks[w->rank_count] = m->rank;
  if (w->rank_count++ == 0) {
    w->phase = m->phase;
    w->pack = m->pack;
  }
}

/* Whether m's heartbeats say it is held up: what a heartbeat said, never
 * a guess of where the rank went since (a rank reports a snapshot each
 * interval, and most of them are a few milliseconds old news). */
static bool held(const gs_member_t *m)
{
  return m->last_heartbeat_ms - m->phase_start_ms >= held_after_ms(m);
}

void gs__waiting_note_beat(gs_member_t *m, uint64_t now)
{
  if (m->has_progress && in_collective(m) && held(m))
    m->job->held.beat_ms = now;
}

/* The first pass: the ranks in a collective, and the one held longest. */
static void find_waiters(scan_t *s, const gs_member_t *m, uint64_t now)
{
  if (!m->has_progress || silent(m, now) || !in_collective(m))
    return;
  s->live_in_collective++;
  if (!held(m))
    return;
  if (!s->longest || m->phase_start_ms < s->longest->phase_start_ms)
    s->longest = m;
}

/* The second pass: who the longest waiter w waits on. Only a rank that
 * has not completed the collective w waits in can hold it up, and a live
 * rank's word counts only if it came after w began to wait. */
static void find_culprit(scan_t *s, const gs_member_t *m, const gs_member_t *w, uint64_t now)
{
  if (m->collectives_done > w->collectives_done)
    return;
  if (silent(m, now))
    add_rank(&s->found[GS_WAIT_NO_HEARTBEAT], m);
  else if (m->has_progress && !in_collective(m) && m->last_heartbeat_ms >= w->phase_start_ms)
    add_rank(&s->found[GS_WAIT_PHASE], m);
}

/* The ranks whose sends wait: SLOW_LINK_SHARE of the time or more, and
 * at least twice as long as any other rank's, into w. Several may own
 * slow links (a node's ranks that send off it, behind one slow port);
 * without a clear gap between them and the rest, or with no rest (every
 * rank's sends wait: the network, not a link), nobody is named. With
 * `in_collective_only`, among the ranks in a collective (a held job's). */
static void find_slow_links(const gs_job_t *job, bool in_collective_only, gs_waiting_on_t *w)
{
  float least_slow = 2.0f, most_other = -1.0f;

  for (int pass = 0; pass < 2; pass++) {
    for (uint32_t r = 0; r < job->world_size; r++) {
      const gs_member_t *m = job->ranks ? job->ranks[r] : NULL;
      bool slow;

      if (!m || m->state != GS_MEMBER_RUNNING || !m->has_progress ||
          (in_collective_only && !in_collective(m)))
        continue;
      slow = m->send_wait >= SLOW_LINK_SHARE;
      if (pass == 1 && slow)
        add_rank(w, m);
      else if (pass == 0 && slow && m->send_wait < least_slow)
        least_slow = m->send_wait;
      else if (pass == 0 && !slow && m->send_wait >= most_other)
        most_other = m->send_wait;
    }
    if (least_slow > 1.0f || most_other < 0 || least_slow < 2 * most_other)
      return;
  }
}

/* The possessive for the ranks of w: "its" or "their". */
static const char *its(const gs_waiting_on_t *w)
{
  return w->rank_count > 1 ? "their" : "its";
}

/* "rank 2" or "ranks 2, 5, 7 (and 3 more)". */
static void name_ranks(const gs_waiting_on_t *w, char *out, size_t len)
{
  uint32_t shown = w->rank_count < GS_WAITING_MAX_RANKS ? w->rank_count : GS_WAITING_MAX_RANKS;
  size_t n = (size_t)snprintf(out, len, "rank%s ", w->rank_count > 1 ? "s" : "");

  for (uint32_t i = 0; i < shown && n < len; i++)
    n += (size_t)snprintf(out + n, len - n, "%s%u", i ? ", " : "", w->ranks[i]);
  if (w->rank_count > shown && n < len)
    snprintf(out + n, len - n, " (and %u more)", w->rank_count - shown);
}

static void collective_words(uint32_t phase, uint32_t pack, char *out, size_t len)
{
  if (phase == gradsync_Phase_PHASE_ALLREDUCE)
    snprintf(out, len, "the allreduce of pack %u", pack);
  else
    snprintf(out, len, "a collective outside the step (%s)", gs_phase_name(phase));
}

/* The verdict's words; the same on the page, in the log and in the
 * agents' timeout errors. */
static void explain(gs_waiting_on_t *w, const gs_member_t *first, uint64_t now)
{
  char who[96], coll[64];
  double waited = (now - w->since_ms) / 1000.0;

  name_ranks(w, who, sizeof(who));
  collective_words(w->coll_phase, w->coll_pack, coll, sizeof(coll));
  switch (w->kind) {
  case GS_WAIT_NO_HEARTBEAT:
    gs_set_why(w->reason, sizeof(w->reason),
               "%s sent no heartbeat for %.1f s (stopped, frozen or cut off; last seen in %s at "
               "step %llu); %u rank(s) wait in %s for %.1f s",
               who, (now - first->last_heartbeat_ms) / 1000.0, gs_phase_name(first->phase),
               (unsigned long long)first->step, w->waiters, coll, waited);
    break;
  case GS_WAIT_PHASE:
    gs_set_why(w->reason, sizeof(w->reason),
               "%s in %s for %.1f s at step %llu; %u rank(s) wait in %s for %.1f s", who,
               gs_phase_name(first->phase), (now - first->phase_start_ms) / 1000.0,
               (unsigned long long)first->step, w->waiters, coll, waited);
    break;
  case GS_WAIT_SLOW_LINK:
    gs_set_why(w->reason, sizeof(w->reason),
               "%s: %s sends wait %.0f%% of the time in %s (%s outbound link is slow or down); "
               "%u rank(s) wait for %.1f s",
               who, its(w), 100.0 * first->send_wait, coll, its(w), w->waiters, waited);
    break;
  default:
    gs_set_why(w->reason, sizeof(w->reason),
               "every rank has waited in %s for %.1f s and none is behind: the network or the "
               "collective library holds them",
               coll, waited);
    break;
  }
}

/* The verdict of one pass, in `out`; GS_WAIT_NONE when nobody is held. */
static void judge(gs_job_t *job, uint64_t now, gs_waiting_on_t *out)
{
  scan_t s = {0};
  const gs_member_t *first = NULL;

  *out = (gs_waiting_on_t){0};
  /* A held rank is one whose latest heartbeat said so and is not older
   * than the silence: none such, no need to look (at 100,000 ranks, the
   * look costs a core more than their heartbeats, four times a second). */
  if (!job->held.beat_ms || now - job->held.beat_ms > silence_ms(job))
    return;
  for (uint32_t r = 0; r < job->world_size; r++) {
    const gs_member_t *m = job->ranks ? job->ranks[r] : NULL;

    if (m && m->state == GS_MEMBER_RUNNING)
      find_waiters(&s, m, now);
  }
  if (!s.longest)
    return;
  for (uint32_t r = 0; r < job->world_size; r++) {
    const gs_member_t *m = job->ranks[r];

    if (m && m->state == GS_MEMBER_RUNNING)
      find_culprit(&s, m, s.longest, now);
  }
  find_slow_links(job, true, &s.found[GS_WAIT_SLOW_LINK]);
  for (int k = GS_WAIT_NO_HEARTBEAT; k < GS_WAIT_TRANSPORT; k++) {
    if (s.found[k].rank_count) {
      *out = s.found[k];
      out->kind = (gs_wait_kind_t)k;
      break;
    }
  }
  if (out->kind == GS_WAIT_NONE) {
    if (s.longest->last_heartbeat_ms - s.longest->phase_start_ms <
        GS_WAITING_TRANSPORT_X * held_after_ms(s.longest))
      return;
    out->kind = GS_WAIT_TRANSPORT;
  }
  out->waiters = s.live_in_collective; /* held or not yet: all wait on the same ranks */
  out->coll_phase = s.longest->phase;
  out->coll_pack = s.longest->pack;
  out->since_ms = s.longest->phase_start_ms;
  if (out->rank_count)
    first = job->ranks[out->ranks[0]];
  explain(out, first ? first : s.longest, now);
}

/* The stragglers: compute over `ratio` times the median, by a tenth of
 * the rank's step or more. Where the allreduces take most of a step (a
 * slow link), a millisecond's jitter in compute is no straggler, and
 * naming one would hide what does slow the job. */
static bool find_stragglers(const gs_job_t *job, float median, float ratio, gs_waiting_on_t *w)
{
  const gs_member_t *first = NULL;

  *w = (gs_waiting_on_t){.kind = GS_WAIT_STRAGGLER};
  for (uint32_t r = 0; median > 0 && r < job->world_size; r++) {
    const gs_member_t *m = job->ranks ? job->ranks[r] : NULL;

    if (!m || m->state != GS_MEMBER_RUNNING || m->compute_ms <= ratio * median ||
        m->compute_ms - median < STRAGGLER_MIN_SHARE * m->step_ms)
      continue;
    add_rank(w, m);
    if (!first)
      first = m;
  }
  if (!first)
    return false;
  w->phase = gradsync_Phase_PHASE_COMPUTE;
  gs_set_why(w->reason, sizeof(w->reason),
             "rank %u computes %.1fx the median step (%.1f ms against %.1f ms)%s: the others wait "
             "for it in every step (a straggler, not a hang)",
             first->rank, first->compute_ms / median, first->compute_ms, median,
             w->rank_count > 1 ? ", with others" : "");
  return true;
}

/* Stragglers first: a rank that computes longer also makes its ring
 * neighbour's sends wait (the straggler reads late), which is no slow
 * link. */
bool gs__waiting_slow(const gs_job_t *job, float median_compute, float straggler_ratio,
                      gs_waiting_on_t *w)
{
  const gs_member_t *first;
  char who[96];

  if (find_stragglers(job, median_compute, straggler_ratio, w))
    return true;
  *w = (gs_waiting_on_t){.kind = GS_WAIT_SLOW_LINK};
  find_slow_links(job, false, w);
  if (!w->rank_count)
    return false;
  first = job->ranks[w->ranks[0]];
  name_ranks(w, who, sizeof(who));
  gs_set_why(w->reason, sizeof(w->reason),
             "%s: %s sends wait %.0f%% of the time (%s outbound link is the slow one): the others "
             "wait for %s data in every step",
             who, its(w), 100.0 * first->send_wait, its(w), its(w));
  return true;
}

/* Whether two verdicts name the same ranks for the same cause. */
static bool same_verdict(const gs_waiting_on_t *a, const gs_waiting_on_t *b)
{
  return a->kind == b->kind && a->rank_count == b->rank_count &&
         !memcmp(a->ranks, b->ranks, sizeof(a->ranks)) && a->phase == b->phase;
}

void gs__waiting_clear(gs_job_t *job)
{
  if (job->held.on.kind != GS_WAIT_NONE)
    job->held.version++;
  job->held.on = (gs_waiting_on_t){0};
}

void gs__waiting_sweep(gs_job_t *job, uint64_t now)
{
  gs_waiting_on_t was = job->held.on, now_w;
  bool same;

  if (job->state != GS_JOB_RUNNING || job->world_size < 2) {
    gs__waiting_clear(job);
    return;
  }
  if (now - job->held.checked_ms < CHECK_EVERY_MS)
    return;
  job->held.checked_ms = now;
  judge(job, now, &now_w);
  if (now_w.kind == GS_WAIT_NONE) {
    if (was.kind != GS_WAIT_NONE)
      gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1,
             "no longer held up after %.1f s (was: %s)", (now - was.since_ms) / 1000.0, was.reason);
    gs__waiting_clear(job);
    return;
  }
  same = same_verdict(&was, &now_w);
  now_w.named_ms = same ? was.named_ms : now;
  now_w.warned = same && was.warned;
  if (!same) {
    job->held.version++;
    gs_log(job->jobs->cfg.log, GS_LOG_INFO, job->name, -1, "held up: %s", now_w.reason);
  }
  /* A loaded machine holds ranks up for a second now and then; a hold
   * that lasts is what an operator must hear of. */
  if (!now_w.warned && now - now_w.since_ms >= WARN_AFTER_MS) {
    now_w.warned = true;
    gs_log(job->jobs->cfg.log, GS_LOG_WARN, job->name, -1, "stalled: %s", now_w.reason);
  }
  job->held.on = now_w;
  job->jobs->version++; /* /status shows it */
}
