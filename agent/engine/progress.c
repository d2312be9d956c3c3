/* Where the rank is: the training thread's phase, published for the
 * heartbeat thread, which sends it with every heartbeat so that the
 * coordinator can name the rank a stalled job waits on (docs/design.md,
 * "Seeing what holds a job up"). Setting a phase is two relaxed atomic
 * stores and a clock read, a few times per step. A driven step's figures
 * (its time, loss, samples/s) are reported here too, at its end. */
#include "engine_internal.h"

#include "clock.h"
#include "gradsync.pb.h"

_Static_assert((int)GS_PHASE_IDLE == gradsync_Phase_PHASE_IDLE &&
                   (int)GS_PHASE_DATA == gradsync_Phase_PHASE_DATA &&
                   (int)GS_PHASE_COMPUTE == gradsync_Phase_PHASE_COMPUTE &&
                   (int)GS_PHASE_ALLREDUCE == gradsync_Phase_PHASE_ALLREDUCE &&
                   (int)GS_PHASE_OPTIMIZER == gradsync_Phase_PHASE_OPTIMIZER &&
                   (int)GS_PHASE_CHECKPOINT == gradsync_Phase_PHASE_CHECKPOINT &&
                   (int)GS_PHASE_SYNC == gradsync_Phase_PHASE_SYNC,
               "gs_phase_t is the wire's Phase");

void gs__engine_enter(gs_engine_t *e, gs_phase_t phase, uint32_t pack)
{
  phase_board_t *b = &e->board;

  uint32_t was = atomic_load_explicit(&b->phase, memory_order_relaxed);
  uint32_t was_pack = atomic_load_explicit(&b->pack, memory_order_relaxed);

  if (was == (uint32_t)phase && was_pack == pack)
    return;
  if (gs__trace_now(e))
    gs__trace_phase_end(e, was, was_pack);
  if (e->cfg.no_progress)
    return;
  atomic_store_explicit(&b->since_ms, gs_now_ms(), memory_order_relaxed);
  atomic_store_explicit(&b->pack, pack, memory_order_relaxed);
  atomic_store_explicit(&b->phase, (uint32_t)phase, memory_order_relaxed);
}

gs_phase_t gs__engine_phase_now(const gs_engine_t *e)
{
  return (gs_phase_t)atomic_load_explicit(&e->board.phase, memory_order_relaxed);
}

void gs_engine_phase(gs_engine_t *e, gs_phase_t phase)
{
  if (e && (unsigned)phase <= GS_PHASE_SYNC)
    gs__engine_enter(e, phase, 0);
}

/* The heartbeat thread's reader (gs_heartbeat_config_t.where). The send
 * wait is the share of the time since the previous heartbeat; only this
 * thread keeps those two numbers. */
void gs__engine_where(void *arg, gradsync_Progress *out)
{
  gs_engine_t *e = arg;
  phase_board_t *b = &e->board;
  uint64_t now_ns = gs_now_ns(), now = now_ns / 1000000;
  uint64_t since = atomic_load_explicit(&b->since_ms, memory_order_relaxed);
  uint64_t wait_ns = gs_comm_gauge_send_wait_ns(&b->comm, now_ns, b->read_send_wait_ns);

  out->phase = (gradsync_Phase)atomic_load_explicit(&b->phase, memory_order_relaxed);
  out->pack = atomic_load_explicit(&b->pack, memory_order_relaxed);
  out->phase_ms = now > since ? (uint32_t)(now - since < UINT32_MAX ? now - since : UINT32_MAX) : 0;
  out->collectives_done = atomic_load_explicit(&b->comm.done, memory_order_relaxed);
  out->device_waits = atomic_load_explicit(&b->device_waits, memory_order_relaxed);
  out->comm_waits = atomic_load_explicit(&b->comm_waits, memory_order_relaxed);
  out->state_bytes = atomic_load_explicit(&b->state_bytes, memory_order_relaxed);
  if (b->read_ms && now > b->read_ms)
    out->send_wait = (float)((wait_ns - b->read_send_wait_ns) / 1e6 / (double)(now - b->read_ms));
  if (out->send_wait > 1.0f)
    out->send_wait = 1.0f;
  b->read_ms = now;
  b->read_send_wait_ns = wait_ns;
}

/* The heartbeat's figures from the step just ended: its time since the
 * previous one, the loss the readback brought (a loss never given counts
 * as 0), the global samples per second. */
void gs__engine_drive_report(gs_engine_t *e, const gs_step_result_t *r)
{
  double now = gs_now_ms_f(), dt = now - e->drive.last_end_ms;
  gs_progress_t p = {.step = e->committed.step};

  if (!e->cfg.driven)
    return;
  e->drive.last_end_ms = now;
  if (dt <= 0.0 || dt == now) /* the first step has no previous end */
    return;
  p.loss = e->drive.loss_at ? e->drive.loss_seen : e->loss;
  p.samples_per_sec =
      (float)((double)(e->drive.batch * gs__membership_world(&e->member)) * 1000.0 / dt);
  p.comm_wait_ms = (float)r->comm_wait_ms;
  p.compute_ms = (float)(dt > r->comm_wait_ms ? dt - r->comm_wait_ms : 0.0);
  if (e->hb) /* what gs_engine_report does, from below engine.c */
    gs_heartbeat_report(e->hb, &p);
}
