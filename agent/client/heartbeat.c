/* The heartbeat thread: reports progress every interval on a connection of
 * its own, keeps the latest directives, and calls on_abort once when the
 * coordinator aborts the generation or stays unreachable too long. */
#include "heartbeat.h"
#include "beat_fields.h"
#include "clock.h"
#include "lr_scale.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CALL_MS 1000u /* a stop waits at most for one call in flight */
#define MIN_CALL_MS 50u

struct gs_heartbeat {
  gs_heartbeat_config_t cfg; /* the client strings and log point at the copies below */
  gs_log_t default_log;      /* used when the config names no log */
  char *job;
  char *token;
  gs_client_t *cl;
  /* Held across a re-registration; guards can_rejoin, which
   * gs_heartbeat_forgo_rejoin clears. */
  pthread_mutex_t rejoin_lock;
  bool can_rejoin;
  gradsync_JoinRequest rejoin;
  pthread_t thread;
  pthread_mutex_t lock; /* guards everything below */
  pthread_cond_t wake;  /* signalled by stop */
  bool stopping;
  bool aborted;
  bool gave_up; /* the abort is this rank's own: the coordinator unreachable, or it refused us */
  bool grace_raised; /* cfg.grace_ms was below the coordinator's heartbeat timeout */
  char why[512];
  char waiting_on[256];         /* the last reply's (see gs_heartbeat_waiting_on) */
  uint64_t gives_up_at;         /* while heartbeats fail: when the grace ends; 0 otherwise */
  uint64_t sent_us, replied_us; /* the last answered heartbeat's (the thread's own) */
  gs_progress_t progress;
  gs_directives_t directives;
  const gs_packlist_t *packlist; /* rank 0's, to publish again after a re-registration */
  const gs_param_desc_t *params;
  uint32_t nparams;
};

/* Waits on the condition variable until `until` (monotonic ms; UINT64_MAX:
 * forever) or a stop; called with the lock held. Returns whether the thread
 * should stop. */
static bool wait_until(gs_heartbeat_t *hb, uint64_t until)
{
  while (!hb->stopping && until == UINT64_MAX)
    pthread_cond_wait(&hb->wake, &hb->lock);
  while (!hb->stopping && gs_now_ms() < until) {
    struct timespec ts = {.tv_sec = (time_t)(until / 1000),
                          .tv_nsec = (long)(until % 1000) * 1000000};

    pthread_cond_timedwait(&hb->wake, &hb->lock, &ts);
  }
  return hb->stopping;
}

/* Records the abort and calls on_abort (without the lock, so that it may
 * call back into gs_heartbeat_aborted). */
static void fire_abort(gs_heartbeat_t *hb, bool gave_up, const char *why)
{
  const gs_client_config_t *cc = &hb->cfg.client;

  pthread_mutex_lock(&hb->lock);
  hb->aborted = true;
  hb->gave_up = gave_up;
  snprintf(hb->why, sizeof(hb->why), "%s", why);
  pthread_mutex_unlock(&hb->lock);
  gs_log(cc->log, GS_LOG_WARN, cc->job, hb->cfg.rank, "generation %llu aborted: %s",
         (unsigned long long)hb->cfg.generation, why);
  if (hb->cfg.on_abort)
    hb->cfg.on_abort(hb->cfg.arg, hb->cfg.generation, why);
}

/* The deadline of one call: short enough to notice the timeout and to stop
 * promptly. */
static uint32_t call_ms(const gs_heartbeat_t *hb)
{
  uint32_t ms =
      hb->cfg.interval_ms < hb->cfg.timeout_ms / 2 ? hb->cfg.interval_ms : hb->cfg.timeout_ms / 2;

  return ms > MAX_CALL_MS ? MAX_CALL_MS : ms < MIN_CALL_MS ? MIN_CALL_MS : ms;
}

/* Sends one heartbeat with the latest progress; on a reply, stores its
 * directives. Returns the call's result; *abort tells whether the
 * coordinator aborted the generation (its reason in `why`). */
static int beat(gs_heartbeat_t *hb, uint64_t *coord_id, bool *abort, char *why, size_t len)
{
  const gs_client_config_t *cc = &hb->cfg.client;
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;
  gradsync_HeartbeatResponse resp;
  uint64_t sent_us = gs_now_ns() / 1000;
  int err;

  req.generation = hb->cfg.generation;
  req.clock_sent_us = hb->sent_us;
  req.clock_replied_us = hb->replied_us;
  req.rank = hb->cfg.rank;
  /* Long poll: the reply comes at once when the generation ends or a
   * directive changes, else after about an interval. */
  req.wait_ms = hb->cfg.interval_ms;
  pthread_mutex_lock(&hb->lock);
  /* The step's figures: the table's REPORT part, gs_progress_t. */
#define REPORT(name, ctype, part, ...) REPORT_##part(name)
#define REPORT_SENDER(name)
#define REPORT_WHERE(name)
#define REPORT_REPORT(name) req.name = hb->progress.name;
  GS_BEAT_FIELDS(REPORT)
#undef REPORT
#undef REPORT_SENDER
#undef REPORT_WHERE
#undef REPORT_REPORT
  pthread_mutex_unlock(&hb->lock);
  if (hb->cfg.where) {
    req.has_progress = true;
    hb->cfg.where(hb->cfg.where_arg, &req.progress);
  }
  err = gs_client_heartbeat(hb->cl, &req, &resp, req.wait_ms + call_ms(hb));
  if (err)
    return err;
  hb->sent_us = sent_us;
  hb->replied_us = gs_now_ns() / 1000;
  if (*coord_id && resp.coordinator_id != *coord_id)
    gs_log(cc->log, GS_LOG_WARN, cc->job, hb->cfg.rank,
           "coordinator %s:%u restarted (id %016llx, was %016llx)", cc->host, cc->port,
           (unsigned long long)resp.coordinator_id, (unsigned long long)*coord_id);
  *coord_id = resp.coordinator_id;
  pthread_mutex_lock(&hb->lock);
  hb->directives = (gs_directives_t){
      .valid = true,
      .bcast_period = resp.directives.bcast_period,
      .broadcast_seq = resp.directives.broadcast_seq,
      .checkpoint_seq = resp.directives.checkpoint_seq,
      .stop = resp.directives.stop,
      .regroup_seq = resp.directives.regroup_seq,
      .trace_seq = resp.directives.trace_seq,
      .trace_steps = resp.directives.trace_steps,
      .lr_scale = gs_lr_scale_or_one(resp.directives.lr_scale),
      .coordinator_id = resp.coordinator_id,
  };
  snprintf(hb->waiting_on, sizeof(hb->waiting_on), "%s", resp.waiting_on);
  pthread_mutex_unlock(&hb->lock);
  *abort = resp.abort;
  snprintf(why, len, "%s", resp.abort_reason[0] ? resp.abort_reason : "generation aborted");
  return 0;
}

/* Logs a failed heartbeat: the first of a run at WARN, the rest at DEBUG;
 * a NOT_FOUND is how a restarted coordinator answers. */
static void log_failure(gs_heartbeat_t *hb, int err, bool first)
{
  const gs_client_config_t *cc = &hb->cfg.client;

  gs_log(cc->log, first ? GS_LOG_WARN : GS_LOG_DEBUG, cc->job, hb->cfg.rank,
         "heartbeat failed%s: %s", err == GS_ENOTFOUND ? " (coordinator restarted?)" : "",
         gs_client_error(hb->cl));
}

/* Rank 0, after re-registering: the restarted coordinator knows no pack
 * list (its status page shows it, and a rank that joins later fetches
 * it). A failure is logged; training does not need it. */
static void republish_packlist(gs_heartbeat_t *hb, uint32_t deadline_ms)
{
  const gs_client_config_t *cc = &hb->cfg.client;
  const gs_packlist_t *list;
  const gs_param_desc_t *params;
  uint32_t n;

  pthread_mutex_lock(&hb->lock);
  list = hb->packlist, params = hb->params, n = hb->nparams;
  pthread_mutex_unlock(&hb->lock);
  if (hb->cfg.rank != 0 || !list)
    return;
  if (gs_client_publish_packlist(hb->cl, hb->cfg.generation, 0, list, params, n, deadline_ms))
    gs_log(cc->log, GS_LOG_WARN, cc->job, hb->cfg.rank,
           "could not publish the pack list again to the restarted coordinator: %s",
           gs_client_error(hb->cl));
}

/* Registers the rank again with a coordinator that no longer knows it (it
 * restarted), so that it rebuilds the job from the agents. Returns 0 once
 * re-registered; GS_EABORTED (with the abort fired) when the coordinator
 * says the generation is over. */
static int reregister(gs_heartbeat_t *hb, uint32_t deadline_ms)
{
  const gs_client_config_t *cc = &hb->cfg.client;
  gradsync_JoinRequest req;
  gs_join_result_t res = {0};
  char why[sizeof(hb->why)];
  int err;

  pthread_mutex_lock(&hb->lock);
  req = hb->rejoin;
  pthread_mutex_unlock(&hb->lock);
  req.rejoin_generation = hb->cfg.generation;
  req.rejoin_rank = hb->cfg.rank;
  req.rejoin_world_size = hb->cfg.world_size;
  err = gs_client_join(hb->cl, &req, deadline_ms, &res);
  gs_join_result_free(&res);
  if (err == 0) {
    gs_log(cc->log, GS_LOG_INFO, cc->job, hb->cfg.rank,
           "re-registered with the coordinator for generation %llu (broadcast period %d, lr "
           "scale %g)",
           (unsigned long long)hb->cfg.generation, req.bcast_period, (double)req.lr_scale);
    republish_packlist(hb, deadline_ms);
  } else if (err == GS_EABORTED) {
    snprintf(why, sizeof(why), "re-registration refused: %s", gs_client_error(hb->cl));
    fire_abort(hb, true, why);
  }
  return err;
}

/* reregister(), unless the owner left this generation: a rank that
 * joins the next one with a new comm address must not bring the old
 * generation back, with the old address, at a restarted coordinator.
 * GS_ENOTFOUND (the beat's own error) when it may not. */
static int reregister_if_member(gs_heartbeat_t *hb, uint32_t deadline_ms)
{
  int err = GS_ENOTFOUND;

  pthread_mutex_lock(&hb->rejoin_lock);
  if (hb->can_rejoin)
    err = reregister(hb, deadline_ms);
  pthread_mutex_unlock(&hb->rejoin_lock);
  return err;
}

void gs_heartbeat_forgo_rejoin(gs_heartbeat_t *hb)
{
  if (!hb)
    return;
  pthread_mutex_lock(&hb->rejoin_lock);
  hb->can_rejoin = false;
  pthread_mutex_unlock(&hb->rejoin_lock);
}

/* Says once that heartbeats work again after one or more failed, and
 * for how long the coordinator did not hear from this rank. */
static void log_recovery(const gs_heartbeat_t *hb, uint64_t last_ok)
{
  const gs_client_config_t *cc = &hb->cfg.client;

  gs_log(cc->log, GS_LOG_INFO, cc->job, hb->cfg.rank,
         "heartbeats recovered: the coordinator %s:%u answers again after %.1f s without a reply",
         cc->host, cc->port, (gs_now_ms() - last_ok) / 1000.0);
}

/* Checks whether the coordinator has been unreachable for longer than
 * the grace period; fires the abort when it has. Past the heartbeat
 * timeout, says once that training goes on meanwhile. */
static bool check_unreachable(gs_heartbeat_t *hb, uint64_t last_ok, bool *told)
{
  const gs_client_config_t *cc = &hb->cfg.client;
  uint64_t silent = gs_now_ms() - last_ok;
  char why[sizeof(hb->why)];

  if (silent > hb->cfg.timeout_ms && silent <= hb->cfg.grace_ms && !*told) {
    gs_log(cc->log, GS_LOG_WARN, cc->job, hb->cfg.rank,
           "coordinator %s:%u unreachable for %.1f s; training goes on for up to %.0f s "
           "(--coordinator-grace) while this rank keeps trying",
           cc->host, cc->port, silent / 1000.0, hb->cfg.grace_ms / 1000.0);
    *told = true;
  }
  if (silent <= hb->cfg.grace_ms)
    return false;
  snprintf(
      why, sizeof(why), "coordinator unreachable for %.1f s, longer than --coordinator-grace%s: %s",
      silent / 1000.0, hb->grace_raised ? " (raised to the coordinator's heartbeat timeout)" : "",
      gs_client_error(hb->cl));
  fire_abort(hb, true, why);
  return true;
}

static void *run(void *arg)
{
  gs_heartbeat_t *hb = arg;
  uint64_t last_ok = gs_now_ms(), next = last_ok, coord_id = 0;
  bool failing = false, done = false, told = false, abort;
  char why[300];
  int err;

  pthread_mutex_lock(&hb->lock);
  while (!wait_until(hb, done ? UINT64_MAX : next)) {
    pthread_mutex_unlock(&hb->lock);
    next = gs_now_ms() + hb->cfg.interval_ms;
    abort = false;
    err = beat(hb, &coord_id, &abort, why, sizeof(why));
    if (err == GS_ENOTFOUND) {
      err = reregister_if_member(hb, call_ms(hb));
      if (err == GS_EABORTED) {
        done = true;
        pthread_mutex_lock(&hb->lock);
        continue;
      }
    }
    pthread_mutex_lock(&hb->lock);
    hb->gives_up_at = err ? last_ok + hb->cfg.grace_ms : 0;
    pthread_mutex_unlock(&hb->lock);
    if (!err) {
      if (failing)
        log_recovery(hb, last_ok);
      last_ok = gs_now_ms();
      failing = told = false;
      if (abort) {
        fire_abort(hb, false, why);
        done = true;
      }
    } else {
      log_failure(hb, err, !failing);
      failing = true;
      done = check_unreachable(hb, last_ok, &told);
      /* Wake up in time to notice the grace's end, even with a long interval. */
      if (!done && last_ok + hb->cfg.grace_ms + 1 < next)
        next = last_ok + hb->cfg.grace_ms + 1;
    }
    pthread_mutex_lock(&hb->lock);
  }
  pthread_mutex_unlock(&hb->lock);
  return NULL;
}

/* Copies the config and its strings; the client config points at our copies. */
static int copy_config(gs_heartbeat_t *hb, const gs_heartbeat_config_t *cfg)
{
  hb->cfg = *cfg;
  /* Giving up sooner than the coordinator would lose this rank ends a
   * generation the coordinator still runs. */
  hb->grace_raised = hb->cfg.grace_ms < hb->cfg.timeout_ms;
  if (hb->grace_raised)
    hb->cfg.grace_ms = hb->cfg.timeout_ms;
  hb->can_rejoin = cfg->rejoin != NULL;
  if (cfg->rejoin)
    hb->rejoin = *cfg->rejoin;
  hb->cfg.rejoin = NULL;
  hb->job = strdup(cfg->client.job ? cfg->client.job : "");
  hb->token = cfg->client.token ? strdup(cfg->client.token) : NULL;
  hb->cfg.client.job = hb->job;
  hb->cfg.client.token = hb->token;
  hb->default_log = (gs_log_t){.level = GS_LOG_WARN, .component = "agent"};
  if (!hb->cfg.client.log)
    hb->cfg.client.log = &hb->default_log;
  return !hb->job || (cfg->client.token && !hb->token) ? GS_ENOMEM : 0;
}

/* Makes the locks and a condition variable on the monotonic clock. */
static int init_sync(gs_heartbeat_t *hb)
{
  pthread_condattr_t attr;
  int rc;

  if (pthread_mutex_init(&hb->lock, NULL))
    return GS_ENOMEM;
  if (pthread_mutex_init(&hb->rejoin_lock, NULL))
    goto out_destroy_lock;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  rc = pthread_cond_init(&hb->wake, &attr);
  pthread_condattr_destroy(&attr);
  if (rc)
    goto out_destroy_rejoin_lock;
  return 0;

out_destroy_rejoin_lock:
  pthread_mutex_destroy(&hb->rejoin_lock);
out_destroy_lock:
  pthread_mutex_destroy(&hb->lock);
  return GS_ENOMEM;
}

static void destroy_sync(gs_heartbeat_t *hb)
{
  pthread_cond_destroy(&hb->wake);
  pthread_mutex_destroy(&hb->rejoin_lock);
  pthread_mutex_destroy(&hb->lock);
}

static void free_config(gs_heartbeat_t *hb)
{
  free(hb->job);
  free(hb->token);
  free(hb);
}

gs_heartbeat_t *gs_heartbeat_start(const gs_heartbeat_config_t *cfg)
{
  gs_heartbeat_t *hb;
  int rc;

  if (cfg->interval_ms == 0 || cfg->timeout_ms == 0) {
    gs_log(cfg->client.log, GS_LOG_ERROR, cfg->client.job, cfg->rank,
           "heartbeat: interval (%u ms) and timeout (%u ms) must be positive", cfg->interval_ms,
           cfg->timeout_ms);
    return NULL;
  }
  hb = calloc(1, sizeof(*hb));
  if (!hb || copy_config(hb, cfg))
    goto out_nomem;
  hb->cl = gs_client_new(&hb->cfg.client);
  if (!hb->cl)
    goto out_nomem;
  gs_client_set_session(hb->cl, cfg->session);
  hb->cfg.session = NULL; /* the client holds the copy */
  if (init_sync(hb))
    goto out_free_client;
  rc = pthread_create(&hb->thread, NULL, run, hb);
  if (rc) {
    gs_log(cfg->client.log, GS_LOG_ERROR, cfg->client.job, cfg->rank,
           "heartbeat: cannot start its thread: %s", strerror(rc));
    goto out_destroy_sync;
  }
  return hb;

out_destroy_sync:
  destroy_sync(hb);
out_free_client:
  gs_client_free(hb->cl);
  free_config(hb);
  return NULL;
out_nomem:
  gs_log(cfg->client.log, GS_LOG_ERROR, cfg->client.job, cfg->rank, "heartbeat: out of memory");
  if (hb) {
    gs_client_free(hb->cl);
    free_config(hb);
  }
  return NULL;
}

void gs_heartbeat_report(gs_heartbeat_t *hb, const gs_progress_t *p)
{
  pthread_mutex_lock(&hb->lock);
  hb->progress = *p;
  pthread_mutex_unlock(&hb->lock);
}

void gs_heartbeat_directives(gs_heartbeat_t *hb, gs_directives_t *out)
{
  pthread_mutex_lock(&hb->lock);
  *out = hb->directives;
  pthread_mutex_unlock(&hb->lock);
}

void gs_heartbeat_waiting_on(gs_heartbeat_t *hb, char *out, size_t len)
{
  pthread_mutex_lock(&hb->lock);
  snprintf(out, len, "%s", hb->waiting_on);
  pthread_mutex_unlock(&hb->lock);
}

uint64_t gs_heartbeat_gives_up_at(gs_heartbeat_t *hb)
{
  uint64_t at;

  pthread_mutex_lock(&hb->lock);
  at = hb->aborted ? 0 : hb->gives_up_at;
  pthread_mutex_unlock(&hb->lock);
  return at;
}

void gs_heartbeat_set_in_effect(gs_heartbeat_t *hb, int32_t period, float lr_scale)
{
  pthread_mutex_lock(&hb->lock);
  hb->rejoin.bcast_period = period;
  hb->rejoin.lr_scale = lr_scale;
  pthread_mutex_unlock(&hb->lock);
}

void gs_heartbeat_set_packlist(gs_heartbeat_t *hb, const gs_packlist_t *list,
                               const gs_param_desc_t *params, uint32_t n)
{
  pthread_mutex_lock(&hb->lock);
  hb->packlist = list;
  hb->params = params;
  hb->nparams = n;
  pthread_mutex_unlock(&hb->lock);
}

bool gs_heartbeat_aborted(gs_heartbeat_t *hb, char *why, size_t len)
{
  bool aborted;

  pthread_mutex_lock(&hb->lock);
  aborted = hb->aborted;
  if (aborted && why && len)
    snprintf(why, len, "%s", hb->why);
  pthread_mutex_unlock(&hb->lock);
  return aborted;
}

bool gs_heartbeat_gave_up(gs_heartbeat_t *hb)
{
  bool gave_up;

  pthread_mutex_lock(&hb->lock);
  gave_up = hb->aborted && hb->gave_up;
  pthread_mutex_unlock(&hb->lock);
  return gave_up;
}

void gs_heartbeat_stop(gs_heartbeat_t *hb)
{
  if (!hb)
    return;
  pthread_mutex_lock(&hb->lock);
  hb->stopping = true;
  pthread_cond_signal(&hb->wake);
  pthread_mutex_unlock(&hb->lock);
  pthread_join(hb->thread, NULL);
  destroy_sync(hb);
  gs_client_free(hb->cl);
  free_config(hb);
}
