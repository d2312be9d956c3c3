/* A job's curve (curve.h). */
#include "curve.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "invariant.h"
#include "job.h"

/* The point's loss and samples/s from at most GS_CURVE_SAMPLE_RANKS ranks
 * spread evenly over the world (all of a smaller one), so a sample costs
 * the same at any world: the running ones' mean loss, and their
 * samples/s scaled to the world. False when none has reported a loss. */
static bool sample_ranks(const gs_job_t *job, gs_curve_point_t *pt)
{
  uint32_t world = job->world_size,
           n = world < GS_CURVE_SAMPLE_RANKS ? world : GS_CURVE_SAMPLE_RANKS;
  double loss = 0, sps = 0;
  uint32_t losses = 0;

  for (uint32_t i = 0; i < n; i++) {
    const gs_member_t *m = job->ranks[(uint64_t)i * world / n];

    if (!m || m->state != GS_MEMBER_RUNNING)
      continue;
    sps += m->samples_per_sec;
    if (m->heartbeats_seen && isfinite(m->loss)) {
      loss += m->loss;
      losses++;
    }
  }
  if (!losses)
    return false;
  pt->loss = (float)(loss / losses);
  pt->samples_per_sec = (float)(sps * world / n);
  return true;
}

/* Keeps every other point, the first included, and doubles the interval. */
static void thin(gs_curve_t *c)
{
  uint32_t kept = 0;

  for (uint32_t i = 0; i < c->count; i += 2)
    c->points[kept++] = c->points[i];
  c->count = kept;
  c->interval_ms *= 2;
}

/* Room for one more point: grown within the budget and GS_CURVE_POINTS,
 * else thinned. */
static void make_room(gs_job_t *job)
{
  gs_curve_t *c = &job->curve;
  gs_mem_budget_t *mem = job->jobs->cfg.mem;
  uint32_t cap = c->cap ? c->cap * 2 : 64;
  size_t more = (size_t)(cap - c->cap) * sizeof(*c->points);
  gs_curve_point_t *p;

  if (c->count < c->cap)
    return;
  if (cap <= GS_CURVE_POINTS && (!mem || gs_mem_budget_members_fit(mem, more)) &&
      (p = realloc(c->points, cap * sizeof(*p)))) {
    c->points = p;
    c->cap = cap;
    if (mem)
      gs_mem_budget_members(mem, more, 0);
    return;
  }
  if (c->count)
    thin(c);
}

void gs__curve_sample(gs_job_t *job, uint64_t now)
{
  gs_curve_t *c = &job->curve;
  gs_curve_point_t pt = {.step = job->step_max};

  if (job->state != GS_JOB_RUNNING || !job->step_max)
    return;
  if (c->count && (now - c->last_ms < c->interval_ms || c->points[c->count - 1].step == pt.step))
    return;
  if (!sample_ranks(job, &pt))
    return;
  if (!c->interval_ms)
    c->interval_ms = GS_CURVE_FIRST_INTERVAL_MS;
  make_room(job);
  if (c->count == c->cap) /* no room at all: out of memory before the first */
    return;
  GS_ASSERT(c->count < c->cap);
  c->points[c->count++] = pt;
  c->last_ms = now;
}

void gs__curve_free(gs_job_t *job)
{
  gs_curve_t *c = &job->curve;
  gs_mem_budget_t *mem = job->jobs->cfg.mem;

  if (mem)
    gs_mem_budget_members(mem, 0, (size_t)c->cap * sizeof(*c->points));
  free(c->points);
  *c = (gs_curve_t){0};
}

/* `v` to 5 significant digits: the JSON says as much as a chart shows. */
static double shown(float v)
{
  char text[32];

  snprintf(text, sizeof(text), "%.5g", v);
  return strtod(text, NULL);
}

cJSON *gs__curve_json(const gs_curve_t *c)
{
  cJSON *o = cJSON_CreateObject(), *points = cJSON_AddArrayToObject(o, "points");

  if (!o || !points) {
    cJSON_Delete(o);
    return NULL;
  }
  cJSON_AddNumberToObject(o, "interval_s", c->interval_ms / 1000.0);
  for (uint32_t i = 0; i < c->count; i++) {
    const gs_curve_point_t *p = &c->points[i];
    cJSON *pt = cJSON_CreateArray();

    if (!pt) {
      cJSON_Delete(o);
      return NULL;
    }
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)p->step));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(shown(p->loss)));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(shown(p->samples_per_sec)));
    cJSON_AddItemToArray(points, pt);
  }
  return o;
}
