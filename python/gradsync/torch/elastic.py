"""Following the world: the rare end of a step (a stop, an elastic regroup,
an elastic job's buffers after every step) and a metric's sum that meets
a regroup. The engine regroups inside end_step; the front end only
follows it: this rank's new place, the position every rank now holds,
the buffers (and a wrapped optimizer's state) of a rank that trained,
then the script's on_world_change."""
from gradsync._engine import WorldChanged
from gradsync.torch import buffers, env


def world_changed(opt):
    if opt.on_world_change is not None:
        opt.on_world_change(opt.rank, opt.world_size, opt.step_count)


def take_position(opt):
    """The position every rank holds after a regroup (the engine's)."""
    info = opt._engine.info()
    opt.step_count, opt.epoch, opt.sample = info["step"], info["epoch"], info["sample"]


def after_step(opt, r):
    """Moves the position (the engine's: a non-finite step stopped at was
    not applied), re-syncs buffers, sets the result's world_changed and
    dropped, and leaves the job at a stop."""
    after = opt.step_count + 1
    opt._lr_factor = r.lr_factor
    opt.step_count, opt.epoch, opt.sample = r.step, r.epoch, r.sample
    opt._has_state = True
    opt.rank, opt.world_size = r.rank, r.world_size
    changed = r.regrouped
    if r.regrouped:  # the buffers (and state) of a rank that trained
        changed = buffers.sync(opt, state=True) or changed
    elif opt._elastic and opt._buffers.mode != "own":
        changed = buffers.sync(opt, each_step=True)
    if changed:  # a regroup met re-syncing the buffers left r's place behind
        take_position(opt)
        r.rank, r.world_size = opt.rank, opt.world_size
        r.step, r.epoch, r.sample = opt.step_count, opt.epoch, opt.sample
    r.world_changed = changed
    r.dropped = changed and opt.step_count < after
    if changed:
        world_changed(opt)
    if r.stop:
        env.state["nonfinite_stop"] |= r.nonfinite
        opt.finish(finished=not r.nonfinite, reason=r.stop_reason)


def allreduce_sum(opt, tensor):
    """opt.allreduce_sum: a WorldChanged is raised once this rank follows
    the new world (the state taken may be a step newer than this rank's:
    it goes on from it)."""
    try:
        return opt._sum(tensor)
    except WorldChanged:
        opt._follow_world()
        take_position(opt)
        buffers.sync(opt, state=True)
        world_changed(opt)
        raise
