"""gradsync for PyTorch: a training script's optimizer becomes a
DistributedOptimizer and the script trains data-parallel through gradsync
(packed, overlapped allreduce, fused SGD, the coordinator's control and
status page)::

    import gradsync.torch as gs
    gs.init()                                     # the launcher's environment
    opt = gs.DistributedOptimizer(model, lr=0.1, momentum=0.9)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward()
        if opt.step(loss).stop:
            break

How it works (docs/design.md, "Front ends"): the model's parameters are
registered with the engine in model order; once it has joined, every
parameter's `.data` is a view of its pack's memory and its `.grad` a view
of the pack's gradients, so autograd accumulates straight into the packs;
a hook on each parameter's gradient accumulator reports it final, which
starts its pack's allreduce while backward goes on; `step()` runs the
engine's fused SGD (torch.optim.SGD's arithmetic) and returns what the
step decided, identically on every rank.

Elastic jobs (world size "MIN:MAX": `init(world_size="2:4")`, or
$GRADSYNC_WORLD_SIZE / $WORLD_SIZE): a lost rank does not fail the job.
The engine regroups the others (at least MIN of them) and every rank goes
on from one state, the params and momentum of the rank at the newest step
(the model's tensors are views of the packs, so the model already holds
it); new ranks join at a step boundary, up to MAX. What the loop sees:

- `opt.step(loss)` returns with `world_changed` true. If `dropped`, the
  step in flight was discarded with its gradients: `step` (steps
  completed, where training goes on) did not advance, and the batch just
  computed is trained again; else the step counted.
- `gs.rank()` and `gs.world_size()` (and the result's `rank`,
  `world_size`) are this rank's new place; `opt.epoch` and `opt.sample`
  (the examples of the epoch trained on, over all ranks) are the position
  every rank now holds.
- `DistributedOptimizer(..., on_world_change=fn)` calls
  `fn(rank, world_size, step)` first (buffers are already re-synced), so a
  sampler can re-shard: the next global batch starts at example
  `opt.sample` of the epoch's order, rank r taking its slice of it. A
  loop over a DataLoader breaks out and builds the loader again from there.
- `opt.allreduce_sum(t)` interrupted by a lost rank raises
  `gradsync.WorldChanged` after the regroup (on_world_change called):
  compute this rank's share again and sum again.

::

    def batch_at(epoch, sample, rank, world):   # this rank's slice of a global batch
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        idx = order[sample + rank * b:sample + (rank + 1) * b]
        return x[idx], y[idx]

    while opt.epoch < epochs:
        if opt.sample + b * gs.world_size() > n:  # no whole global batch left
            opt.set_epoch(opt.epoch + 1)
            continue
        xb, yb = batch_at(opt.epoch, opt.sample, gs.rank(), gs.world_size())
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(); loss.backward()
        r = opt.step(loss)                  # r.world_changed: the next batch_at re-shards
        if r.stop:
            break

`opt.sample` advances by the batch of the model's last forward times the
world size (every rank the same batch). A rank that joins a running job
starts from the others' `opt.position` and `opt.sample`.
"""
from gradsync._engine import (Error, Interrupted, ModelMismatch, PeerLost,  # noqa: F401
                              StepResult, Timeout, WorldChanged)
from gradsync.data import DistributedSampler  # noqa: F401
from gradsync.torch.env import init, local_rank, rank, world_size  # noqa: F401
from gradsync.torch.optimizer import DistributedOptimizer  # noqa: F401

__all__ = ["init", "rank", "world_size", "local_rank", "DistributedOptimizer", "StepResult",
           "DistributedSampler",
           "Error", "PeerLost", "ModelMismatch", "Timeout", "Interrupted", "WorldChanged"]
