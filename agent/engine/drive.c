/* A driven step (cfg.driven): a framework's training loop learns the loss
 * only after backward (loss.backward(), then optimizer.step(loss)), so the
 * engine, not the front end, keeps the step's state. The first gradient
 * reported outside a step begins it, with the position after it made
 * here; the last pack, which carries the control vector and with it the
 * loss's verdict, waits for the loss (gs_engine_set_loss_at, or end_step);
 * end_step reports the rank's progress. The front end then makes a
 * constant number of calls per step besides the gradient hooks, and
 * reads nothing back that it did not ask for.
 *
 * What only the device knows (the loss, a loss scaler's verdict,
 * clipping's coefficient) is handed in as device memory and read by the
 * device when the step's work runs, never by the host. */
#include <string.h>

#include "engine_internal.h"

void gs_engine_set_batch(gs_engine_t *e, uint64_t batch)
{
  e->drive.batch = batch;
}

void gs_engine_set_epoch(gs_engine_t *e, uint64_t epoch)
{
  if (epoch != e->committed.epoch) {
    e->committed.epoch = epoch;
    e->committed.sample = 0;
  }
}

void gs_engine_set_loss_at(gs_engine_t *e, const float *loss)
{
  uint32_t i, j;
  float w;

  if (e->reduced.done) { /* synchronized already: too late for the verdict; for the page */
    e->drive.loss_at = loss;
    return;
  }
  if (!e->in_step && e->cfg.driven && !e->failed)
    gs__engine_drive_begin(e); /* a step with no gradient yet: end_step names them */
  if (!e->in_step || e->failed)
    return;
  gs_control_nonfinite_at(gs__membership_rank(&e->member), e->nctl, &i, &j, &w);
  if (j >= e->nctl) /* no bit for this rank: the count alone */
    j = i, w = 0.0f;
  /* Behind begin_step's upload of this rank's vector, before the last
   * pack's allreduce, which the loss releases. */
  gs_device_mark_nonfinite(e->cfg.dev, loss, e->ctl_dev, i, j, w);
  e->drive.loss_at = loss;
  if (e->cfg.driven && !e->drive.loss_given) {
    e->drive.loss_given = true;
    gs__engine_issue_ready(e);
  }
}

void gs_engine_skip_step_at(gs_engine_t *e, const float *flag)
{
  e->drive.veto_at = flag;
}

float *gs_engine_verdict_at(const gs_engine_t *e)
{
  return e->skip_dev;
}

void gs_engine_scale_step_at(gs_engine_t *e, const float *factor)
{
  e->drive.factor_at = factor;
}
