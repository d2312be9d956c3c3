"""DistributedOptimizer: a torch.optim.Optimizer whose step the engine owns.

The engine drives the step (gradsync/engine.h, `driven`): the first
gradient reported begins it, the last pack waits for the loss, end_step
applies the update and reports the rank's progress. What runs in Python
per step is constant: a call in the forward pre-hook, one per gradient
hook, and one in step(); nothing is rebuilt per step that did not change
(the groups are pushed only when a scheduler wrote them), and nothing is
read from the device (the loss, clipping's coefficient and a scaler's
found_inf reach the engine as device addresses)."""
import contextlib

import torch

from gradsync._engine import Error
from gradsync.torch import amp, buffers, elastic, env, grads, state
from gradsync.torch.config import engine_config


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer over gradsync: every rank's gradients summed
    or averaged (`reduce`) before the update, which the engine applies
    fused over the packs.

    `optimizer`: a torch optimizer over the model's parameters (with its
    parameter groups and their hyperparameters), e.g.
    `optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4,
    weight_decay=0.1)`. SGD, Adam and AdamW run fused in the engine, which
    reads each group's hyperparameters at every step, so torch's lr
    schedulers work on this optimizer (or on the one given); any other
    runs its own step() on the reduced gradients. Without it: SGD with
    `lr`, `momentum`, `weight_decay` and `nesterov`, as torch.optim.SGD
    computes them. `param_groups`,
    `state_dict()` and `load_state_dict()` are torch's (a checkpoint saved
    with torch.save resumes in plain torch, and the other way round).

    `decide`: when the host takes a step's decisions (its non-finite
    verdict, a stop, a checkpoint): "now" (default) at the step's end,
    which waits for the device once a step; "late" at the next step's
    end, so that on a GPU the host never waits for the device in a steady
    step: a result then says what became of the step before it (the same
    state; `drain()` decides the last step). Every rank passes the same.

    `nonfinite`: what a step whose summed gradients hold NaN or an
    infinity does (it is never applied): "stop" (default) stops every
    rank at it (`step()` returns with `stop` and `nonfinite` set, and the
    job ends failed), "skip" skips it on every rank and goes on
    (`skipped` set).

    Loss scaling: `scaler.step(opt)` of a GradScaler works as with a torch
    optimizer; an overflow on any rank skips the step on every rank.

    `grad_dtype`: what the gradients travel in between the ranks: "fp32"
    (default), or half the bytes as "bf16" or "fp16" (or the torch
    dtypes), added in float32 at every step of the reduction; `.grad`,
    the parameters and the optimizer stay float32.

    `shard_optimizer`: True shards the optimizer's state over the ranks
    (ZeRO-1): each rank keeps and updates 1/world of it (SGD, Adam and
    AdamW, fused), the gradients are reduce-scattered and the updated
    parameters allgathered, the same bytes as an allreduce. `.grad` after
    `synchronize()` then holds the reduced gradients only in this rank's
    shard (`opt.clip_grad_norm_` and a GradScaler work on the shards);
    `state_dict()` is the whole state in torch's format (every rank
    calls it), and `load_state_dict()` of a whole one shards it. Every
    rank passes the same; not in an elastic job yet.

    Accumulation: backward passes inside `with opt.no_sync():` only add
    into the packs; the next one outside it reduces the sum. Clipping:
    `opt.clip_grad_norm_(max_norm)` (or `max_grad_norm=` at every step)
    clips by the norm of the reduced gradients inside the fused update;
    for torch's own `clip_grad_norm_` (or anything that reads `.grad`),
    call `opt.synchronize()` first: the gradients are then reduced in
    place.

    `broadcast_buffers`: buffers (BatchNorm statistics) are rank 0's at
    the start; True (DDP's rule): rank 0's again before every forward
    with grad; "mean": the ranks' mean before every forward; False: each
    rank's own after the start.

    `model` is an nn.Module (its parameters and buffers are used) or an
    iterable of parameters. Construction joins the job (blocking until
    every rank has), takes rank 0's pack list and parameters (its buffers
    too), and binds the parameters to the packs.

    `groups`, like torch.optim's parameter groups: a list of dicts with
    "params" (parameters of the model) and "lr" (or "lr_mult", relative
    to `lr`) and/or "weight_decay"; parameters in no group take `lr` and
    `weight_decay`, or with `bias_lr_mult`/`bias_weight_decay` the bias
    rules of Detectron for those named "*bias".

    Elastic jobs (init's world size "MIN:MAX"): `rejoin_timeout` (seconds)
    is how long a regroup waits for at least MIN ranks; `elastic_lr` is
    "keep" (the same lr at any world) or "linear" (lr x world / MAX);
    `on_world_change(rank, world_size, step)` is called, with this rank's
    new place and the step training goes on from, after every change of
    the world (in `step()` before it returns, or in `allreduce_sum()`
    before it raises WorldChanged), so that a sampler can re-shard from
    `opt.epoch` and `opt.sample`.
    """

    def __init__(self, model, lr=None, momentum=0.0, weight_decay=0.0, nesterov=False,
                 reduce="mean", pack_threshold="10MiB", bcast_period=0,
                 find_unused_parameters=False, broadcast_buffers=True, groups=None,
                 bias_lr_mult=1.0, bias_weight_decay=None, warmup_steps=0, warmup_factor=1 / 3,
                 schedule="constant", step_size=0, gamma=0.1, total_steps=0,
                 checkpoint_dir=None, checkpoint_every=0, checkpoint_failures=3, resume=False,
                 join_timeout=300.0, comm_timeout=120.0, connect_timeout=15.0,
                 coordinator_grace=600.0, rejoin_timeout=300.0, elastic_lr="keep",
                 on_world_change=None, optimizer=None, nonfinite="stop", max_grad_norm=None,
                 grad_dtype="fp32", decide="now", shard_optimizer=False):
        args = dict(locals())
        del args["self"], args["model"]
        self._engine = None
        cfg, e, named, model_buffers, mode = engine_config(self, model, args)
        self._named = named
        self._engine = e
        env.state["engine"] = e
        self._lr_factor = e.info()["lr_factor"]  # an lr scale set before this rank joined
        self.on_world_change = on_world_change
        self._elastic = cfg["world_min"] > 0
        self._has_state = False  # trained in this job: its buffers are the job's
        self._buffers = buffers.Buffers(model_buffers, mode, e, self.device)
        grads.bind(self)
        # A rank that joins a running elastic job starts where the others are.
        self.step_count, self.epoch, sample = e.sync_initial()
        self.sample = sample or 0  # None: a checkpoint from before it was stored
        state.load_extra(self, e.resumed_extra())  # rank 0 resumed: its checkpoint's
        # A wrapped optimizer's state from rank 0 after a resume, or, for a
        # rank that joins a running elastic job, from the others.
        buffers.sync(self, state=self.step_count > 0)
        self._in_step = self._accumulating = self._accumulated = False
        self._synced = self._scaled = self._clipped = self._loss_given = False
        self._keep = []  # device tensors the step's work reads: alive until end_step
        self.max_grad_norm = max_grad_norm
        self._nonfinite = nonfinite
        self._reduce = reduce
        self.copies = 0  # gradients that arrived outside the packs (set_to_none, assigned .grad)
        # broadcast_buffers before every forward with grad (an elastic job
        # syncs them at the end of each step instead: see elastic.after_step).
        self._buffers_each_forward = (mode != "own" and bool(self._buffers) and
                                      self.world_size > 1 and not self._elastic)
        self._hooks = [grads.hook(self, i, p) for i, p in enumerate(self.params)]
        if isinstance(model, torch.nn.Module):
            self._hooks.append(model.register_forward_pre_hook(self._saw_input))
        env.state["optimizers"].append(self)

    # The wrapped optimizer's own, always (its load_state_dict replaces
    # them): a scheduler of either optimizer works.
    param_groups = property(lambda self: self._inner.param_groups,
                            lambda self, v: setattr(self._inner, "param_groups", v))
    state = property(lambda self: self._inner.state,
                     lambda self, v: setattr(self._inner, "state", v))
    defaults = property(lambda self: self._inner.defaults,
                        lambda self, v: setattr(self._inner, "defaults", v))

    def state_dict(self):
        return state.state_dict(self)

    def load_state_dict(self, state_dict):
        state.load_state_dict(self, state_dict)
        self._groups.forget()

    def add_param_group(self, param_group):
        raise Error("the engine's packs are fixed once it has joined: give every parameter group "
                    "to the optimizer before wrapping it")

    def _follow_world(self):
        """This rank's place (after an elastic regroup: the engine's)."""
        info = self._engine.info()
        self.rank, self.world_size = info["rank"], info["world_size"]

    def _saw_input(self, module, args):
        """Before every forward of the model with grad: the compute phase
        and the batch (the position, samples/s), and, as DDP's
        broadcast_buffers, the buffers that forward reads (not in
        no_sync(), nor inside an open step)."""
        if not torch.is_grad_enabled():
            return
        x = args[0] if args else None
        self._engine.forward(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() > 0 else 0)
        if self._buffers_each_forward and not self._accumulating and not self._in_step:
            self._buffers.combine(self.rank, self.world_size, 0,
                                  mean=self._buffers.mode == "mean")

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation, as DDP's `no_sync`: backward passes inside
        it only add their gradients into the packs; the next backward
        outside it reduces the sum, and step() applies it::

            for i, (x, y) in enumerate(loader):
                last = (i + 1) % accumulate == 0
                with contextlib.nullcontext() if last else opt.no_sync():
                    (F.cross_entropy(model(x), y) / accumulate).backward()
                if last:
                    opt.step(); opt.zero_grad()
        """
        if self._in_step:
            raise Error("no_sync() after a backward outside it in this step: accumulate "
                        "first, and let the step's last backward reduce")
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    # -- the step ---------------------------------------------------------

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in the packs (set_to_none=True drops them;
        the next backward's arrive with one copy each)."""
        for p, gv in zip(self.params, self._grad_views):
            if set_to_none:
                p.grad = None
            else:
                gv.zero_()
                p.grad = gv

    def _loss_at(self, loss):
        """The step's loss for the engine, once a step: a tensor's address
        (never read here), or a number given at once; 0 when none."""
        if self._accumulating:
            raise Error("step() or synchronize() inside no_sync(): the step's last backward "
                        "must be outside it, so that the accumulated gradients are reduced")
        if not self._in_step and self._accumulated:
            raise Error("step() after backward passes inside no_sync() only: the step's last "
                        "backward must be outside it, so that the sum is reduced")
        self._accumulated = False
        if loss is None or self._loss_given:
            return 0
        self._loss_given = True
        if not isinstance(loss, torch.Tensor):
            self._engine.set_loss(float(loss))
            return 0
        t = loss.detach()
        if t.numel() != 1:
            raise ValueError(f"step(loss): the loss is one number, not a tensor of shape "
                             f"{list(t.shape)}")
        if t.dtype is not torch.float32 or t.device != self.device:
            t = t.to(self.device, torch.float32)
        self._keep.append(t)
        return t.data_ptr()

    def synchronize(self, loss=None):
        """Completes the step's allreduces now, without the update (as
        Horovod's): afterwards every `p.grad` holds the reduced gradient
        (the mean with reduce="mean", what DDP leaves there), for torch's
        own `clip_grad_norm_`, a GradScaler's unscale_, or a look; step()
        then applies it (with shard_optimizer, only this rank's shard of
        each gradient is reduced: `opt.clip_grad_norm_` clips by the whole
        norm). `loss` (else given to step()) is checked here: a non-finite
        loss on any rank stops the step."""
        if self._synced:
            return
        at = self._loss_at(loss)
        self._synced = self._scaled = True
        self._engine.synchronize(True, False, at)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        """torch.nn.utils.clip_grad_norm_ over the reduced gradients: the
        norm of the per-parameter norms, returned as a tensor; the
        gradients are scaled by min(1, max_norm / (norm + 1e-6)) inside the
        fused update (no pass of its own, no host wait). Call it after
        backward and before step()."""
        return amp.clip_grad_norm_(self, max_norm, norm_type, error_if_nonfinite)

    def _reduce_for_update(self, loss):
        """The step's allreduces done, as its update reads them: a wrapped
        optimizer's step reads .grad, so the means in place; the fused
        update takes the sums and folds the mean's 1/world in."""
        if self._wrapped:
            self.synchronize(loss)
        elif not self._synced:
            at = self._loss_at(loss)
            self._synced, self._scaled = True, False
            self._engine.synchronize(False, False, at)

    def _grad_scale(self):
        return 1.0 / self.world_size if self._reduce == "mean" else 1.0

    # GradScaler.step(opt) hands itself to step() (grad_scaler=) instead of
    # unscaling and checking this rank's own gradients.
    _step_supports_amp_scaling = True

    def step(self, loss=None, closure=None, grad_scaler=None):
        """Waits for the allreduces, applies the update, and returns the
        step's decisions (a StepResult, the same on every rank). `loss` (a
        number or a 0-dim tensor, never read on the host) feeds the status
        page, and a non-finite loss on any rank stops every rank at this
        step (or skips it, with nonfinite="skip"). In an elastic job a lost
        rank does not fail the step: the result says `world_changed` (and
        whether this step was `dropped`), and on_world_change was called.
        `closure` (torch's signature) is called first and its value is the
        loss. `grad_scaler`: GradScaler.step(opt) passes itself."""
        e = self._engine
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = amp.unscale(self, grad_scaler, loss) if grad_scaler is not None else None
        if self.max_grad_norm is not None and not self._clipped:
            self._reduce_for_update(loss)  # with the loss, which clip_grad_norm_ does not have
            amp.clip_grad_norm_(self, self.max_grad_norm)
        at = self._loss_at(loss)
        if self._groups.changed():
            self._groups.push()
        if self._wrapped:
            self._wrapped_step(at, found_inf)
            at = 0
        self._in_step = self._synced = self._clipped = self._loss_given = False
        try:
            r = e.end_step(at)
        finally:
            self._keep.clear()
        if r.stop or r.regrouped or r.lr_scale_changed or self._elastic:
            elastic.after_step(self, r)
        else:
            self.step_count, self.epoch, self.sample = r.step, r.epoch, r.sample
        return r

    def _wrapped_step(self, at, found_inf):
        """An optimizer the engine does not run: the reduced means in .grad,
        then its own step on the pack views unless the step is not to be
        applied, which the host must know to call torch (a wait, counted)."""
        self._synced = self._scaled = True
        nonfinite, regrouped = self._engine.synchronize(True, True, at)
        if found_inf is not None and not nonfinite:
            nonfinite = bool(found_inf.item())  # torch's step is the host's to call or not
        if nonfinite or regrouped:
            if nonfinite and found_inf is not None:
                self._engine.skip_step()
            return
        amp.scaled_step(self)

    @property
    def position(self):
        """(step, epoch): steps completed, and the epoch the user set.
        `opt.sample` is the third coordinate: the examples of the epoch
        trained on over all ranks (the batch of each step's forward times
        the world size), where an elastic job's data goes on."""
        return self.step_count, self.epoch

    def set_epoch(self, epoch):
        """A new epoch starts at sample 0 (the current one keeps its
        sample: a loop may call it again after a resume)."""
        if int(epoch) != self.epoch:
            self.epoch, self.sample = int(epoch), 0
            self._engine.set_epoch(self.epoch)

    def checkpoint(self):
        """Rank 0 writes a checkpoint of this step (with checkpoint_dir)."""
        self.drain()
        self._engine.checkpoint(self.step_count, self.epoch, self.sample)

    def drain(self):
        """With decide="late": what became of the last step, whose verdict is
        still in flight (a StepResult, as step() returns; None when there was
        nothing to say). Call it after the last step to learn of a stop there;
        finish() does."""
        r = self._engine.drain()
        if r is not None:
            elastic.after_step(self, r)
        return r

    def allreduce_sum(self, tensor):
        """Sums a float32 tensor over the ranks, in place (metrics; through
        host memory). In an elastic job a rank lost meanwhile raises
        WorldChanged once the others have regrouped (buffers re-synced,
        on_world_change called): compute this rank's share again over the
        new world (gs.rank() of gs.world_size()) and sum again."""
        return elastic.allreduce_sum(self, tensor)

    def _sum(self, tensor):
        t = tensor.detach()
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError("allreduce_sum takes a contiguous float32 tensor")
        host = t if t.device.type == "cpu" else t.cpu()
        self._engine.allreduce_sum(memoryview(host.numpy()).cast("B"))
        if host is not t:
            t.copy_(host)
        return tensor

    def finish(self, finished=True, reason=""):
        """Leaves the job; at the end of the process otherwise (finished
        unless the script died of an exception, or the last step, decided
        late, was not finite)."""
        e = getattr(self, "_engine", None)
        if e is None:
            return
        try:
            last = e.drain()
        except Error:
            last = None  # failed before: the engine's finish says so
        if last is not None and last.stop:
            env.state["nonfinite_stop"] |= last.nonfinite
            finished, reason = finished and not last.nonfinite, reason or last.stop_reason
        e.finish(finished, reason)

    def __del__(self):
        for h in getattr(self, "_hooks", []):
            h.remove()
