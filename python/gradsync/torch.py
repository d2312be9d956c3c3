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
import atexit
import contextlib
import io
import os
import re
import socket
import sys
import time
import zlib
from dataclasses import dataclass

import torch

from gradsync import _engine
from gradsync._engine import (Error, Interrupted, ModelMismatch, PeerLost,  # noqa: F401
                              Timeout, WorldChanged)
from gradsync.data import DistributedSampler  # noqa: F401

__all__ = ["init", "rank", "world_size", "local_rank", "DistributedOptimizer", "StepResult",
           "DistributedSampler",
           "Error", "PeerLost", "ModelMismatch", "Timeout", "Interrupted", "WorldChanged"]

_COORDINATOR_PORT = "7070"
_state = {"config": None, "engine": None, "optimizers": [], "nonfinite_stop": False}


@atexit.register
def _leave_at_exit():
    """A script that ends normally has finished; one that dies of an
    uncaught exception (which sets sys.last_value) has failed. A job that
    stopped at a non-finite step failed too, however the script ended:
    the process exits with status 1 (Python cannot change the status of a
    normal exit otherwise; handlers registered before gradsync's import
    but logging's are skipped)."""
    failed = hasattr(sys, "last_value")
    for opt in _state["optimizers"]:
        opt.finish(finished=not failed,
                   reason=f"the script raised {type(sys.last_value).__name__}" if failed else "")
    if _state["nonfinite_stop"] and not failed:
        import logging
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _env(*names):
    """The first of the variables that is set and not empty, and its name."""
    for n in names:
        v = os.environ.get(n)
        if v:
            return v, n
    return None, None


def _number(value, name):
    try:
        n = int(value)
    except ValueError:
        raise Error(f"${name}={value!r} is not a number") from None
    if n < 0:
        raise Error(f"${name}={value!r} is negative")
    return n


def _world(value, where):
    """(MIN, MAX) from N or "MIN:MAX", as gradsync-agent's --world-size
    reads it: MIN 0 is a fixed world of N ranks; 1 <= MIN <= MAX an
    elastic job that goes on while at least MIN ranks remain."""
    text = str(value).strip()
    low, colon, high = text.partition(":")
    try:
        lo, hi = (int(low), int(high)) if colon else (0, int(text))
    except ValueError:
        raise Error(f"{where}={value!r}: expected N or MIN:MAX (an elastic job)") from None
    if hi < 1 or (colon and lo < 1):
        raise Error(f"{where}={value!r}: a world size is at least 1")
    if lo > hi:
        raise Error(f"{where}={value!r}: MIN ({lo}) is more than MAX ({hi})")
    return lo, hi


def init(coordinator=None, job=None, world_size=None, local_rank=None, node=None, token=None,
         tls_ca=None, tls_cert=None, tls_key=None):
    """Where the job is: the arguments given, else gradsync's variables
    (set by gradsync-run), else torchrun's and SLURM's, as gradsync-agent
    reads them (docs/guide/running.md, "Environment"). `world_size` (or
    the variable) is N, or "MIN:MAX" for an elastic job (see the module's
    docstring).
    tls_ca (else $GRADSYNC_TLS_CA) speaks TLS to a coordinator started with
    --tls-cert, verifying it with that CA file; tls_cert and tls_key (else
    $GRADSYNC_TLS_CERT, $GRADSYNC_TLS_KEY) are this rank's certificate for
    one started with --tls-client-ca. Joins nothing yet: the
    DistributedOptimizer joins (and reads the files). Returns the resolved
    settings (`world_min` 0 for a fixed world)."""
    if coordinator is None:
        coordinator, _ = _env("GRADSYNC_COORDINATOR")
    if coordinator is None:
        host, _ = _env("MASTER_ADDR", "PET_MASTER_ADDR")
        if host:
            port = os.environ.get("GRADSYNC_COORDINATOR_PORT") or _COORDINATOR_PORT
            coordinator = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not coordinator:
        raise Error("no coordinator: pass init(coordinator='HOST:PORT'), run under gradsync-run, "
                    "or set $GRADSYNC_COORDINATOR")
    if job is None:
        job, _ = _env("GRADSYNC_JOB")
        slurm, _ = _env("SLURM_JOB_ID")
        job = job or (f"slurm-{slurm}" if slurm else "local")
    if world_size is None:
        v, n = _env("GRADSYNC_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS")
        if v is None:
            raise Error("no world size: pass init(world_size=N) or set $GRADSYNC_WORLD_SIZE")
        world_min, world_size = _world(v, f"${n}")
    else:
        world_min, world_size = _world(world_size, "world_size")
    if local_rank is None:
        v, n = _env("GRADSYNC_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID")
        local_rank = _number(v, n) if v is not None else 0
    if node is None:
        node, _ = _env("GRADSYNC_NODE", "SLURMD_NODENAME")
        node = node or socket.gethostname()
    if token is None:
        token, _ = _env("GRADSYNC_TOKEN")
    cfg = {"coordinator": coordinator, "job": job, "world_size": world_size,
           "world_min": world_min, "local_rank": int(local_rank), "node": node}
    if token:
        cfg["token"] = token
    for key, var in (("comm_iface", "GRADSYNC_COMM_IFACE"), ("comm_bind", "GRADSYNC_COMM_BIND"),
                     ("comm_advertise", "GRADSYNC_COMM_ADVERTISE")):
        v, _ = _env(var)
        if v:
            cfg[key] = v
    for key, given, var in (("tls_ca", tls_ca, "GRADSYNC_TLS_CA"),
                            ("tls_cert", tls_cert, "GRADSYNC_TLS_CERT"),
                            ("tls_key", tls_key, "GRADSYNC_TLS_KEY")):
        v = os.fspath(given) if given is not None else _env(var)[0]
        if v:
            cfg[key] = v
    _state["config"] = cfg
    _engine.install_sigterm()
    return dict(cfg, token="***") if token else dict(cfg)


def _config():
    if _state["config"] is None:
        init()
    return _state["config"]


def _info():
    if _state["engine"] is None:
        raise Error("the rank is known once a DistributedOptimizer has joined the job (its "
                    "construction joins: the coordinator numbers the ranks as they join with "
                    "their model). Before it: gs.local_rank() picks the GPU, any seed works "
                    "(rank 0's parameters reach every rank), and data is sharded after it, "
                    "or by gs.DistributedSampler(dataset, optimizer=opt)")
    return _state["engine"].info()


def rank():
    """This process's rank (ranks are ordered by node, then local rank);
    in an elastic job, its rank in the current world (it changes when the
    world does)."""
    return _info()["rank"]


def world_size():
    """The number of ranks in the job: in an elastic job the current world
    once a DistributedOptimizer has joined, before that the most (MAX)."""
    if _state["engine"] is not None:
        return _info()["world_size"]
    return _config()["world_size"]


def local_rank():
    return _config()["local_rank"]


@dataclass
class StepResult:
    """What a step decided; the same on every rank (but `rank`)."""
    stop: bool
    stop_reason: str
    bcast_period: int
    period_changed: bool
    # The operator's lr scale (POST /jobs/NAME/control {"lr_scale": x}):
    # every group's lr is multiplied by it from the next step on, on top
    # of the script's own schedule (which sees the unscaled lr).
    lr_scale: float
    lr_scale_changed: bool
    broadcast: bool
    checkpoint: bool
    # A rank's loss, or the summed gradients, held NaN or an infinity: the
    # step was not applied; stop_reason names the ranks or the parameter.
    nonfinite: bool
    skipped: bool    # nonfinite="skip": the step was skipped on every rank
    comm_wait_ms: float
    optimizer_ms: float
    # Elastic jobs: the world changed (a rank was lost, or new ones joined)
    # during this step. `dropped`: the step was discarded, its gradients
    # too (a rank was lost while they were summed), so `step` did not
    # advance and its batch is trained again; else the step counts.
    world_changed: bool
    dropped: bool
    rank: int        # this rank's place from now on
    world_size: int
    step: int        # steps completed: where training goes on (opt.position)
    epoch: int
    sample: int      # examples of `epoch` trained on over all ranks (opt.sample)
    detect_ms: float   # world_changed: from the step's start to noticing the loss
    regroup_ms: float  # world_changed: from noticing to the state shared in the new world


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|kB|MB|GB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
          "kB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def _bytes(size):
    if isinstance(size, int):
        return size
    m = _SIZE.match(str(size))
    if not m:
        raise ValueError(f"pack_threshold: expected bytes like '10MiB', got {size!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


# Model layout settings: one character per parameter, so that the
# coordinator's refusal of unlike models names the first that differs.
_LAYOUT_CHARS = 120
_LAYOUT_SETTINGS = 8
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _grad_dtype(value):
    """The engine's name for what the gradients travel in."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    return names.get(value, value)


def _layout_settings(named):
    """('model.layout.k', chars): a character per parameter (a hash of its
    name and shape), in chunks; the rest as one hash."""
    chars = "".join(_ALPHABET[zlib.crc32(f"{n}{tuple(p.shape)}".encode()) % 64] for n, p in named)
    out = []
    for k in range(_LAYOUT_SETTINGS):
        chunk = chars[k * _LAYOUT_CHARS:(k + 1) * _LAYOUT_CHARS]
        if chunk:
            out.append((f"model.layout.{k}", chunk))
    rest = chars[_LAYOUT_SETTINGS * _LAYOUT_CHARS:]
    if rest:
        out.append(("model.layout.rest", f"{zlib.crc32(rest.encode()):08x}"))
    return out


_UNLIKE = re.compile(r"setting 'model\.layout\.(\d+)' is '([^']*)' vs '([^']*)'")
_RANKS = re.compile(r"rank (\d+) has settings unlike rank (\d+)'s")


def _mismatch(err, named):
    """A refusal of unlike models, with the first differing parameter
    named, from this rank's side: the coordinator sends every rank the
    same words about two ranks (the one that differs, then the one it was
    compared with), so each rank finds which of them it is by its own
    layout."""
    m, ranks = _UNLIKE.search(str(err)), _RANKS.search(str(err))
    if not m:
        return ModelMismatch(str(err)) if "model" in str(err) else err
    k = int(m.group(1))
    base, bad, ref = k * _LAYOUT_CHARS, m.group(2), m.group(3)
    bad_rank, ref_rank = ranks.groups() if ranks else ("?", "?")
    mine = dict(_layout_settings(named)).get(f"model.layout.{k}", "")
    me, other, theirs = (bad_rank, ref_rank, ref) if mine == bad else \
        (ref_rank, bad_rank, bad) if mine == ref else (None, None, None)
    if me is None:
        return ModelMismatch(f"the ranks' models differ (rank {bad_rank}'s from rank "
                             f"{ref_rank}'s; this rank is neither): {err}")
    i = next((j for j in range(min(len(mine), len(theirs))) if mine[j] != theirs[j]),
             min(len(mine), len(theirs)))
    i += base
    if i < len(named):
        name, p = named[i]
        what = (f"parameter {i} '{name}' (shape {list(p.shape)}) on this rank (rank {me}) "
                f"differs from rank {other}'s (its name or shape)")
    else:
        what = (f"this rank (rank {me}) has {len(named)} parameters, rank {other} more")
    return ModelMismatch(f"the ranks' models differ: {what}; {err}")


def _extra_saver(buffers, wrapped):
    """What gradsync's checkpoints hold besides the packs: the model's
    buffers (BatchNorm statistics) and the state of an optimizer the
    engine does not run, a torch.save of {"buffers": {name: tensor},
    "optimizer": state_dict} (docs/checkpoint.md)."""
    def save():
        out = io.BytesIO()
        torch.save({"buffers": {n: b.detach().cpu() for n, b in buffers},
                    "optimizer": wrapped.state_dict() if wrapped is not None else None}, out)
        return out.getvalue()
    return save


# torch.optim's optimizers the engine runs fused over the packs (their own
# class, not a subclass: a subclass may change step()).
# gs_phase_t (gradsync/engine.h): the model's forward starts the compute.
_PHASE_COMPUTE = 2
_FUSED = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}


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
                 grad_dtype="fp32"):
        if isinstance(model, torch.nn.Module):
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            self._buffers = list(model.named_buffers())
        else:
            named = [(f"param{i}", p) for i, p in enumerate(model) if p.requires_grad]
            self._buffers = []
        if broadcast_buffers not in (True, False, "mean"):
            raise ValueError(f"broadcast_buffers is True (rank 0's before every forward), "
                             f"'mean' (the ranks' mean) or False, not {broadcast_buffers!r}")
        self._buffer_mode = {True: "rank0", False: "own", "mean": "mean"}[broadcast_buffers]
        if not named:
            raise ValueError("the model has no parameter that requires a gradient")
        devices = {p.device for _, p in named}
        for n, p in named:
            if p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda"):
                raise Error(f"parameter '{n}' is {p.dtype} on {p.device}: gradsync.torch trains "
                            "float32 parameters on the cpu or one GPU")
        if len(devices) != 1:
            raise Error(f"the parameters are on several devices ({sorted(map(str, devices))}): "
                        "a rank trains on one")
        self.device = devices.pop()
        self._named = named
        self.params = [p for _, p in named]
        self.find_unused_parameters = find_unused_parameters
        scheduled = bool(groups or bias_lr_mult != 1.0 or bias_weight_decay is not None or
                         warmup_steps or schedule != "constant")
        if optimizer is None:
            if lr is None:
                raise TypeError("DistributedOptimizer needs lr= (SGD) or optimizer=")
            # With the engine's own schedule and rules (scheduled), the
            # engine's SGD settings decide, and this one only holds the
            # state's format.
            optimizer = torch.optim.SGD(self.params, lr=lr, momentum=momentum,
                                        weight_decay=weight_decay, nesterov=nesterov)
        elif lr is not None or scheduled:
            raise ValueError("optimizer= carries its own hyperparameters and groups: leave lr, "
                             "groups, the bias rules and the schedule out (use a torch "
                             "lr_scheduler on the optimizer)")
        kind = self._adopt(optimizer)
        # The torch groups become engine groups, unless the engine's own SGD
        # schedule decides or the wrapped optimizer steps itself.
        self._groups_in_engine = not (scheduled or self._wrapped)
        cfg = dict(_config())
        cfg.update(optimizer=kind, nonfinite=nonfinite, grad_dtype=_grad_dtype(grad_dtype),
                   lr=lr or 0.0, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                   reduce=reduce, pack_threshold=_bytes(pack_threshold), bcast_period=bcast_period,
                   bias_lr_mult=bias_lr_mult, warmup_steps=warmup_steps,
                   warmup_factor=warmup_factor, schedule=schedule, step_size=step_size,
                   gamma=gamma, total_steps=total_steps, checkpoint_every=checkpoint_every,
                   checkpoint_failures=checkpoint_failures, resume=resume,
                   join_timeout=join_timeout, comm_timeout=comm_timeout,
                   connect_timeout=connect_timeout, coordinator_grace=coordinator_grace,
                   rejoin_timeout=rejoin_timeout, elastic_lr=elastic_lr,
                   **self._device_config())
        if bias_weight_decay is not None:
            cfg["bias_wd"] = bias_weight_decay
        if checkpoint_dir:
            cfg["checkpoint_dir"] = str(checkpoint_dir)
            if self._buffers or self._wrapped:
                cfg["checkpoint_extra"] = _extra_saver(self._buffers,
                                                       self._inner if self._wrapped else None)
        e = _engine.Engine(**cfg)
        for n, p in named:
            e.register(n, p.numel(), n.endswith("bias"))
        self._engine_groups = {}
        if self._groups_in_engine:
            index = {id(p): i for i, p in enumerate(self.params)}
            for k, g in enumerate(self.param_groups):
                e.add_group(self._hyper(g))
                for p in g["params"]:
                    e.param_group(index[id(p)], k)
        rules = self._group_rules(groups or [], lr, weight_decay)
        for i, (lr_mult, decay) in sorted(rules.items()):
            e.param_rule(i, lr_mult, decay)
        if rules:
            text = ";".join(f"{i}:{m:.9g}:{d:.9g}" for i, (m, d) in sorted(rules.items()))
            e.add_setting("torch.groups", f"{len(rules)}/{zlib.crc32(text.encode()):08x}")
        for name, value in _layout_settings(named):
            e.add_setting(name, value)
        e.add_setting("torch.find-unused", str(bool(find_unused_parameters)).lower())
        e.add_setting("torch.buffers", f"{sum(b.numel() for _, b in self._buffers)}/"
                      f"{self._buffer_mode}")
        try:
            e.start()
        except Error as err:
            raise _mismatch(err, named) from None
        self._engine = e
        _state["engine"] = e
        self._lr_factor = e.info()["lr_factor"]  # an lr scale set before this rank joined
        self.on_world_change = on_world_change
        self._elastic = cfg["world_min"] > 0
        self._has_state = False  # trained in this job: its buffers are the job's
        self._bind()
        # A rank that joins a running elastic job starts where the others are.
        self.step_count, self.epoch, sample = e.sync_initial()
        self.sample = sample or 0  # None: a checkpoint from before it was stored
        self._load_extra(self._buffers, e.resumed_extra())  # rank 0 resumed: its checkpoint's
        # A wrapped optimizer's state from rank 0 after a resume, or, for a
        # rank that joins a running elastic job, from the others (who share
        # it at their regroup).
        self._sync_buffers(state=self.step_count > 0)
        self._in_step = False
        self._accumulating = self._accumulated = False
        self._synced = self._scaled = self._clipped = False
        self.max_grad_norm = max_grad_norm
        self._nonfinite = nonfinite
        self._reduce = reduce
        self._held = []
        self.copies = 0  # gradients that arrived outside the packs (set_to_none, assigned .grad)
        self._t_last = time.monotonic()
        self._hooks = [self._hook(i, p) for i, p in enumerate(self.params)]
        self._batch = 0
        if isinstance(model, torch.nn.Module):
            self._hooks.append(model.register_forward_pre_hook(self._saw_input))
        _state["optimizers"].append(self)

    def _adopt(self, optimizer):
        """Takes the torch optimizer's groups, defaults and (empty) state as
        this one's; the engine's name for its kind."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer= takes a torch.optim.Optimizer, not "
                            f"{type(optimizer).__name__}")
        # Others run their own step() on the pack views, after the reduce.
        kind = _FUSED.get(type(optimizer), "none")
        self._wrapped = kind == "none"
        if optimizer.state and not self._wrapped:  # Adagrad makes its own at construction
            raise Error("optimizer= has state already (it has stepped, or loaded a "
                        "state_dict): wrap it before training, and load a state_dict into the "
                        "DistributedOptimizer")
        mine = {id(p) for p in self.params}
        seen = set()
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in mine:
                    raise ValueError("optimizer= has a parameter that is not the model's (or does "
                                     "not require a gradient)")
                seen.add(id(p))
        missing = [n for n, p in self._named if id(p) not in seen]
        if missing:
            raise ValueError(f"parameter(s) {', '.join(missing[:5])} of the model are in no group "
                             "of optimizer=")
        self._inner = optimizer
        return kind

    # The wrapped optimizer's own, always (its load_state_dict replaces
    # them): a scheduler of either optimizer works.
    param_groups = property(lambda self: self._inner.param_groups,
                            lambda self, v: setattr(self._inner, "param_groups", v))
    state = property(lambda self: self._inner.state,
                     lambda self, v: setattr(self._inner, "state", v))
    defaults = property(lambda self: self._inner.defaults,
                        lambda self, v: setattr(self._inner, "defaults", v))

    @staticmethod
    def _hyper(group):
        """What the engine reads of a param group."""
        return {k: v for k, v in group.items() if k != "params"}

    def _push_groups(self):
        """Hands the engine the groups whose hyperparameters changed (a
        scheduler's lr) since the last step; cheap when none did."""
        if not self._groups_in_engine:
            return
        for k, g in enumerate(self.param_groups):
            key = tuple((n, float(v) if isinstance(v, torch.Tensor) else v)
                        for n, v in g.items() if n != "params" and
                        isinstance(v, (int, float, bool, tuple, torch.Tensor)))
            if self._engine_groups.get(k) != key:
                self._engine.set_group(k, self._hyper(g))
                self._engine_groups[k] = key

    # torch's state slots per optimizer, in the engine's order.
    _SLOTS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
              "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}

    def _state_views(self, i):
        """{torch's state name: a view of the engine's buffer} of parameter i."""
        kind = _FUSED[type(self._inner)]
        views = {}
        for slot, name in enumerate(self._SLOTS[kind]):
            if kind == "sgd" and not self._group_of(i).get("momentum"):
                continue
            if name == "max_exp_avg_sq" and not self._group_of(i).get("amsgrad"):
                continue
            views[name] = self._view(self._engine.state(i, slot), self.params[i].shape)
        return views

    def _group_of(self, i):
        p = self.params[i]
        return next(g for g in self.param_groups if any(q is p for q in g["params"]))

    def state_dict(self):
        """torch's format for the wrapped optimizer's class: "state" per
        parameter index (copies of the engine's buffers; "step" the updates
        applied) and "param_groups"."""
        if self._wrapped:
            return self._inner.state_dict()
        steps = self._engine.optim_steps()
        kind = _FUSED[type(self._inner)]
        self.state.clear()
        if steps:
            for i, p in enumerate(self.params):
                st = {k: v.clone() for k, v in self._state_views(i).items()}
                if kind == "sgd":
                    st.setdefault("momentum_buffer", None)
                else:
                    st["step"] = torch.tensor(float(steps))
                self.state[p] = st
        try:
            return self._inner.state_dict()
        finally:
            self.state.clear()

    def load_state_dict(self, state_dict):
        """Loads torch's format (from plain torch or from state_dict()):
        the groups' hyperparameters, and the state into the engine's
        buffers. Every rank loads the same (a checkpoint of rank 0's)."""
        self._inner.load_state_dict(state_dict)
        if self._wrapped:
            return
        steps = set()
        try:
            with torch.no_grad():
                for i, p in enumerate(self.params):
                    st = self.state.get(p, {})
                    for name, view in self._state_views(i).items():
                        if st.get(name) is not None:
                            view.copy_(st[name])
                        else:
                            view.zero_()
                    if "step" in st:
                        steps.add(int(st["step"]))
                    elif st.get("momentum_buffer") is not None:
                        steps.add(max(self._engine.optim_steps(), 1))
            if len(steps) > 1:
                raise Error(f"the state_dict's parameters have different step counts "
                            f"({sorted(steps)[:4]}): gradsync steps every parameter together")
            self._engine.optim_steps(steps.pop() if steps else 0)
        finally:
            self.state.clear()
        self._engine_groups.clear()

    def add_param_group(self, param_group):
        raise Error("the engine's packs are fixed once it has joined: give every parameter group "
                    "to the optimizer before wrapping it")

    def _load_extra(self, buffers, data):
        """After a resume: rank 0 holds the checkpoint's extra bytes; its
        buffers go into the model and a wrapped optimizer's state into it
        (the buffer sync then hands both to every rank)."""
        saved = torch.load(io.BytesIO(data)) if data else None
        if saved:
            with torch.no_grad():
                for n, b in buffers:
                    if n not in saved["buffers"] or saved["buffers"][n].shape != b.shape:
                        raise Error(f"the checkpoint has no buffer '{n}' of shape "
                                    f"{list(b.shape)} (a checkpoint of another model?)")
                    b.copy_(saved["buffers"][n])
        if self._wrapped and saved and saved["optimizer"] is not None:
            self._inner.load_state_dict(saved["optimizer"])  # shared next, with the buffers

    def _share(self, obj, root=0):
        """The root's object on every rank (torch.save's bytes, broadcast
        through host memory: the rare resume or regroup)."""
        data = bytearray()
        if self.rank == root:
            out = io.BytesIO()
            torch.save(obj, out)
            data = bytearray(out.getvalue())
        size = bytearray(len(data).to_bytes(8, "little"))
        self._engine.broadcast(size, root)
        if self.rank != root:
            data = bytearray(int.from_bytes(size, "little"))
        self._engine.broadcast(data, root)
        return torch.load(io.BytesIO(bytes(data)))

    def _saw_input(self, module, args):
        """Before every forward of the model: the batch size (for the
        status page's samples/s), and, as DDP's broadcast_buffers, the
        buffers that forward reads (not in no_sync() or without grad, as
        DDP's). An elastic job syncs them at the end of each step instead,
        where a regroup met in the sum is a step's world change (one met
        in a forward would leave that forward with the old world's
        batch)."""
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            self._batch = args[0].shape[0]
        if torch.is_grad_enabled() and self._engine is not None:
            self._engine.phase(_PHASE_COMPUTE)  # what the coordinator shows (waiting_on)
        if (self._buffer_mode != "own" and self._buffers and self.world_size > 1 and
                not self._elastic and torch.is_grad_enabled() and not self._accumulating and
                not self._in_step):
            self._combine_buffers(0, mean=self._buffer_mode == "mean")

    def _device_config(self):
        """cpu with the host backend; a GPU with NCCL, the engine's device
        work queued on PyTorch's current stream (so they need no events)."""
        if self.device.type == "cpu":
            return {"device": "cpu", "backend": "host"}
        index = self.device.index if self.device.index is not None else \
            torch.cuda.current_device()
        stream = torch.cuda.current_stream(index).cuda_stream
        return {"device": f"cuda:{index}", "backend": "nccl",
                "cuda_stream": stream or 1}  # 1: cudaStreamLegacy, the default stream

    def _view(self, buf, shape):
        if self.device.type == "cpu":
            return torch.frombuffer(buf, dtype=torch.float32).view(shape)
        return torch.as_tensor(buf, device=self.device).view(shape)

    def _group_rules(self, groups, lr, weight_decay):
        """{param index: (lr_mult, weight_decay)} from torch-style groups."""
        index = {id(p): i for i, p in enumerate(self.params)}
        rules = {}
        for g in groups:
            unknown = set(g) - {"params", "lr", "lr_mult", "weight_decay"}
            if unknown or "params" not in g:
                raise ValueError(f"a group has 'params' and 'lr', 'lr_mult' or 'weight_decay', "
                                 f"not {sorted(unknown) or 'no params'}")
            mult = g["lr"] / lr if "lr" in g else g.get("lr_mult", 1.0)
            decay = g.get("weight_decay", weight_decay)
            for p in g["params"]:
                if id(p) not in index:
                    raise ValueError("a group names a parameter that is not the model's (or "
                                     "does not require a gradient)")
                if index[id(p)] in rules:
                    raise ValueError(f"parameter '{self._named[index[id(p)]][0]}' is in two "
                                     "groups")
                rules[index[id(p)]] = (float(mult), float(decay))
        return rules

    # -- binding ----------------------------------------------------------

    def _bind(self):
        """Every parameter's data and grad become views of pack memory."""
        e = self._engine
        info = e.info()
        self.rank, self.world_size = info["rank"], info["world_size"]
        last = info["packs"] - 1
        self._in_last = [e.param_pack(i) == last for i in range(len(self.params))]
        self._param_views, self._grad_views = [], []
        with torch.no_grad():
            for i, p in enumerate(self.params):
                pv = self._view(e.param(i), p.shape)
                gv = self._view(e.grad(i), p.shape)
                pv.copy_(p.data)
                gv.zero_()
                p.data = pv
                p.grad = gv
                self._param_views.append(pv)
                self._grad_views.append(gv)

    def _follow_world(self):
        """This rank's place after an elastic regroup (the engine's)."""
        info = self._engine.info()
        self.rank, self.world_size = info["rank"], info["world_size"]

    def _world_changed(self):
        if self.on_world_change is not None:
            self.on_world_change(self.rank, self.world_size, self.step_count)

    def _sync_buffers(self, state=False, each_step=False):
        """Buffers (BatchNorm statistics) take one rank's values, and with
        `state` (a regroup) a wrapped optimizer's state too; true when an
        elastic job regrouped meanwhile (then they are summed again over
        the new world). `each_step`: an elastic job's broadcast_buffers
        after a step, which every rank has trained (rank 0 is a root, or
        with "mean" the ranks' mean)."""
        changed = False
        state = state and self._wrapped
        while (self._buffers or state) and self.world_size > 1:
            try:
                if each_step and not changed:
                    self._combine_buffers(0, mean=self._buffer_mode == "mean")
                else:
                    self._sync_buffers_once(state)
                return changed
            except WorldChanged:
                self._follow_world()
                changed = True
        return changed

    def _buffer_root(self):
        """Rank 0, or in an elastic job the first rank that has trained in
        it (a rank that has just joined holds fresh buffers)."""
        if not self._elastic:
            return 0
        held = torch.zeros(self.world_size)
        held[self.rank] = float(self._has_state)
        self._sum(held)
        first = held.nonzero()
        return int(first[0]) if len(first) else 0

    def _sync_buffers_once(self, state):
        root = self._buffer_root()
        if state:  # a rank that joined holds none of the wrapped optimizer's state
            mine = self._inner.state_dict() if self.rank == root else None
            self._inner.load_state_dict(self._share(mine, root))
        if self._buffers:
            self._combine_buffers(root)

    def _combine_buffers(self, root, mean=False):
        """Every rank's buffers become the root's (a broadcast), or with
        `mean` the ranks' mean of the floating ones (a sum; an integer one,
        as BatchNorm's batch count, is the root's: the others add zeros)."""
        flat = torch.cat([b.detach().reshape(-1).to("cpu", torch.float32)
                          for _, b in self._buffers])
        averaged = [mean and b.is_floating_point() for _, b in self._buffers]
        if mean:
            at = 0
            for (_, b), avg in zip(self._buffers, averaged):
                if self.rank != root and not avg:
                    flat[at:at + b.numel()] = 0.0
                at += b.numel()
            self._sum(flat)
        else:
            self._engine.broadcast(memoryview(flat.numpy()).cast("B"), root)
        at = 0
        with torch.no_grad():
            for (_, b), avg in zip(self._buffers, averaged):
                part = flat[at:at + b.numel()].view(b.shape)
                b.copy_((part / self.world_size if avg else part).to(b.device, b.dtype))
                at += b.numel()

    def _hook(self, i, p):
        """Reports parameter i's gradient final once autograd has
        accumulated it (PyTorch 2.1's post-accumulate hook, else the hook
        of its AccumulateGrad node)."""
        def ready(*_):
            self._grad_ready(i)
        if hasattr(p, "register_post_accumulate_grad_hook"):
            return p.register_post_accumulate_grad_hook(ready)
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        self._keep = getattr(self, "_keep", []) + [acc]  # the node must outlive the hook
        return acc.register_hook(ready)

    def _begin(self):
        if not self._in_step:
            self._in_step = True
            self._reported = [False] * len(self.params)
            # The position once this step is done (what a checkpoint or a
            # regroup after it records): the global batch is the batch of
            # the model's last forward on every rank.
            self._after = (self.step_count + 1, self.epoch,
                           self.sample + self._batch * self.world_size)
            self._engine.begin_step(0.0, *self._after)

    def _grad_ready(self, i):
        if self._accumulating:
            self._into_pack(i)
            self._accumulated = True
            return
        self._begin()
        self._into_pack(i)
        self._reported[i] = True
        if self._in_last[i]:
            self._held.append(i)  # the last pack carries the loss: reported in step()
        else:
            self._engine.grad_ready(i)

    def _into_pack(self, i):
        """Makes parameter i's gradient the pack's view again."""
        p, gv = self.params[i], self._grad_views[i]
        if p.grad is None or p.grad.data_ptr() != gv.data_ptr():
            # set_to_none zeroing, or a .grad of the user's: one copy into
            # the pack, and the pack's view is the gradient again.
            with torch.no_grad():
                if p.grad is None:
                    gv.zero_()
                else:
                    gv.copy_(p.grad)
            p.grad = gv
            self.copies += 1

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

    @staticmethod
    def _loss_value(loss):
        return float(loss.detach()) if isinstance(loss, torch.Tensor) else \
            float("nan") if loss is None else float(loss)

    def _release(self, loss):
        """Reports every gradient of the step (the missing ones as zeros
        with find_unused_parameters, the held last pack with the loss's
        verdict): the step's allreduces are all under way after it."""
        e = self._engine
        if self._accumulating:
            raise Error("step() or synchronize() inside no_sync(): the step's last backward "
                        "must be outside it, so that the accumulated gradients are reduced")
        if not self._in_step and self._accumulated:
            raise Error("step() after backward passes inside no_sync() only: the step's last "
                        "backward must be outside it, so that the sum is reduced")
        self._accumulated = False
        self._begin()
        missing = [i for i, done in enumerate(self._reported) if not done]
        if missing and not self.find_unused_parameters:
            self._abandon()
            names = ", ".join(self._named[i][0] for i in missing[:5])
            raise Error(f"{len(missing)} parameter(s) got no gradient this step ({names}"
                        f"{', ...' if len(missing) > 5 else ''}): pass "
                        "find_unused_parameters=True to count them as zero gradients")
        for i in missing:
            self._grad_views[i].zero_()
            self._reported[i] = True
            if self._in_last[i]:
                self._held.append(i)
            else:
                e.grad_ready(i)
        self._push_groups()
        e.set_loss(self._loss_value(loss) if loss is not None else 0.0)
        for i in self._held:
            e.grad_ready(i)
        self._held = []
        self._in_step = False

    def synchronize(self, loss=None):
        """Completes the step's allreduces now, without the update (as
        Horovod's): afterwards every `p.grad` holds the reduced gradient
        (the mean with reduce="mean", what DDP leaves there), for torch's
        own `clip_grad_norm_`, a GradScaler's unscale_, or a look; step()
        then applies it. `loss` (else given to step()) is checked here: a
        non-finite loss on any rank stops the step."""
        if self._synced:
            return
        self._release(loss)
        self._synced = self._scaled = True
        self._engine.synchronize(True)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        """torch.nn.utils.clip_grad_norm_ over the reduced gradients: the
        norm of the per-parameter norms, returned as a tensor; the
        gradients are scaled by max_norm / (norm + 1e-6) when that is below
        1, inside the fused update (no pass of its own). Call it after
        backward and before step()."""
        self._reduce_for_update(None)
        self._clipped = True
        norm_type = float(norm_type)
        with torch.no_grad():
            norms = [torch.linalg.vector_norm(g, norm_type) for g in self._grad_views]
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
            if not self._scaled:
                total = total * self._grad_scale()
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is "
                               "non-finite, so it cannot be clipped")
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1.0 and self._wrapped:
            torch._foreach_mul_(self._grad_views, coef)
        elif coef < 1.0:
            self._engine.scale_step(coef)
        return total

    def _reduce_for_update(self, loss):
        """The step's allreduces done, as its update reads them: a wrapped
        optimizer's step reads .grad, so the means in place; the fused
        update takes the sums and folds the mean's 1/world in."""
        if self._wrapped:
            self.synchronize(loss)
        else:
            self._sync_sums(loss)

    def _sync_sums(self, loss):
        """synchronize(), leaving the sums in the packs: the mean's 1/world
        goes into the norm and the update, not a pass of its own."""
        if not self._synced:
            self._release(loss)
            self._synced, self._scaled = True, False
            self._engine.synchronize(False)

    def _grad_scale(self):
        return 1.0 / self.world_size if self._reduce == "mean" else 1.0

    # GradScaler.step(opt) hands itself to step() (grad_scaler=) instead of
    # unscaling and checking this rank's own gradients.
    _step_supports_amp_scaling = True

    def step(self, loss=None, closure=None, grad_scaler=None):
        """Waits for the allreduces, applies the update, and returns the
        step's decisions (a StepResult, the same on every rank). `loss` (a
        number or a 0-dim tensor) feeds the status page, and a non-finite
        loss on any rank stops every rank at this step (or skips it, with
        nonfinite="skip"). In an elastic job a lost rank does not fail the
        step: the result says `world_changed` (and whether this step was
        `dropped`), and on_world_change was called. `closure` (torch's
        signature) is called first and its value is the loss.
        `grad_scaler`: GradScaler.step(opt) passes itself (see _unscale)."""
        e = self._engine
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        value = self._loss_value(loss)
        found_inf = grad_scaler is not None and self._unscale(grad_scaler, loss)
        if self.max_grad_norm is not None and not self._clipped:
            self._reduce_for_update(loss)  # with the loss, which clip_grad_norm_ does not have
            self.clip_grad_norm_(self.max_grad_norm)
        if not self._synced:
            self._release(loss)
        if self._wrapped:
            # The reduced means in .grad, then the optimizer's own step on
            # the pack views, unless the step is not to be applied.
            self._synced = self._scaled = True
            nonfinite, regrouped = self._engine.synchronize(True)
            if not nonfinite and not regrouped and not found_inf:
                self._scaled_step()
        self._synced = self._clipped = False
        r = self._result(e.end_step())
        now = time.monotonic()
        dt, self._t_last = max(now - self._t_last, 1e-9), now
        e.report(self.step_count, value if loss is not None else 0.0,
                 self._batch * self.world_size / dt, max(dt * 1000.0 - r.comm_wait_ms, 0.0),
                 r.comm_wait_ms)
        if r.world_changed:
            self._world_changed()
        if r.stop:
            self.finish(finished=not r.nonfinite, reason=r.stop_reason)
            _state["nonfinite_stop"] |= r.nonfinite
        return r

    def _scaled_step(self):
        """The wrapped optimizer's own step with each group's lr times the
        engine's factor (the operator's lr scale, elastic_lr's), as the
        fused update applies it: set for the step only, so the script's
        scheduler goes on from its own values."""
        f = self._lr_factor
        if f == 1.0:
            self._inner.step()
            return
        saved = [g["lr"] for g in self._inner.param_groups]
        try:
            for g in self._inner.param_groups:
                g["lr"] = g["lr"] * f
            self._inner.step()
        finally:
            for g, lr in zip(self._inner.param_groups, saved):
                g["lr"] = lr

    def _unscale(self, scaler, loss):
        """A GradScaler's step: the gradients reduced (the means in place),
        then unscaled by the scaler (unless the script did so, with
        scaler.unscale_(opt), before or after opt.synchronize(): the scale
        is linear, so before it too is right), and the scaler's verdict
        made the one of the sums, which every rank holds alike (never this
        rank's own, or ranks would disagree on skipping): with an infinity
        or NaN the step is skipped on every rank, and scaler.update()
        lowers the scale as usual. True when skipped."""
        self.synchronize(loss)
        state = scaler._per_optimizer_states[id(self)]
        if state["stage"].name == "READY":
            scaler.unscale_(self)  # the sums now: the verdict is every rank's
        nonfinite, regrouped = self._engine.synchronize(True)  # done: the verdict
        if regrouped:
            return False  # the step is dropped anyway
        if self._nonfinite == "off":  # the engine checked nothing: a pass here
            finite = torch.stack([g.isfinite().all() for g in self._grad_views]).all()
            nonfinite = not bool(finite)
        for t in state["found_inf_per_device"].values():
            t.fill_(float(nonfinite))
        if nonfinite:
            self._engine.skip_step()
        return nonfinite

    def _result(self, d):
        """Moves the position (to the engine's resume position after an
        elastic regroup), re-syncs buffers, and says what the step did."""
        resume, regrouped = d.pop("resume"), d.pop("regrouped")
        self._lr_factor = d.pop("lr_factor")
        if regrouped:
            step, epoch, sample = resume
            self.step_count, self.epoch, self.sample = step, epoch, sample or 0
        elif not (d["nonfinite"] and d["stop"]):  # a step stopped at was not applied
            self.step_count, self.epoch, self.sample = self._after
        self._has_state = True
        self.rank, self.world_size = d.pop("rank"), d.pop("world_size")
        changed = regrouped
        if regrouped:  # the buffers (and state) of a rank that trained
            changed = self._sync_buffers(state=True) or changed
        elif self._elastic and self._buffer_mode != "own":
            changed = self._sync_buffers(each_step=True)
        return StepResult(**d, world_changed=changed,
                          dropped=regrouped and self.step_count < self._after[0], rank=self.rank,
                          world_size=self.world_size, step=self.step_count, epoch=self.epoch,
                          sample=self.sample)

    def _abandon(self):
        self._held = []
        self._in_step = False
        self.finish(finished=False, reason="a parameter got no gradient")

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

    def checkpoint(self):
        """Rank 0 writes a checkpoint of this step (with checkpoint_dir)."""
        self._engine.checkpoint(self.step_count, self.epoch, self.sample)

    def allreduce_sum(self, tensor):
        """Sums a float32 tensor over the ranks, in place (metrics; through
        host memory). In an elastic job a rank lost meanwhile raises
        WorldChanged once the others have regrouped (buffers re-synced,
        on_world_change called): compute this rank's share again over the
        new world (gs.rank() of gs.world_size()) and sum again."""
        try:
            return self._sum(tensor)
        except WorldChanged:
            self._follow_world()
            # The state taken may be a step newer than this rank's: go on from it.
            info = self._engine.info()
            self.step_count, self.epoch, self.sample = info["step"], info["epoch"], info["sample"]
            self._sync_buffers(state=True)
            self._world_changed()
            raise

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
        unless the script died of an exception)."""
        if getattr(self, "_engine", None) is not None:
            self._engine.finish(finished, reason)

    def __del__(self):
        for h in getattr(self, "_hooks", []):
            h.remove()
