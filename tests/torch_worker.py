"""One rank of tests/test_torch.py's jobs, started by gradsync-run:
`torch_worker.py SCENARIO OUT_DIR [options]`. Writes what the test checks
to OUT_DIR/rank-R.pt (torch.save of a dict)."""
import collections
import contextlib
import os
import signal
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradsync.torch as gs

OPTS = {}
DEVICE = "cpu"


def mlp(seed=0, hidden=16, bn=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(20, hidden)]
    if bn:
        layers.append(nn.BatchNorm1d(hidden))
    layers += [nn.ReLU(), nn.Linear(hidden, 3)]
    return nn.Sequential(*layers).to(DEVICE)


# NCCL's socket transport over loopback, for ranks that share GPU 0 (each
# also needs a NCCL_HOSTID of its own), as tests/gpu/one_gpu_ranks.sh sets
# for the agent.
ONE_GPU_ENV = dict(NCCL_NET="Socket", NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo")


def one_gpu_ranks(rank=None):
    """This process, rank `rank` (default: gradsync-run's LOCAL_RANK), on
    GPU 0 posing as a host of its own for NCCL; before its first NCCL call."""
    if rank is None:
        rank = os.environ.get("LOCAL_RANK", "0")
    os.environ.update(ONE_GPU_ENV, NCCL_HOSTID=f"gradsync-rank-{rank}")


def data(steps, batch, world):
    """The same examples on every rank; rank r takes its slice of each
    global batch of batch*world."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps, batch * world, 20, generator=g)
    y = torch.randint(0, 3, (steps, batch * world), generator=g)
    return x.to(DEVICE), y.to(DEVICE)


def sgd_args():
    return dict(lr=float(OPTS.get("lr", 0.1)), momentum=float(OPTS.get("momentum", 0.9)),
                weight_decay=float(OPTS.get("wd", 1e-3)), nesterov=OPTS.get("nesterov") == "1",
                shard_optimizer=sharded())


def sharded():
    """shard=1: the optimizer's state sharded over the ranks."""
    return OPTS.get("shard") == "1"


def save(**values):
    torch.save(values, os.path.join(OUT, f"rank-{gs.rank()}.pt"))


def train(model, opt, steps, batch, set_to_none=False):
    x, y = data(steps, batch, gs.world_size())
    r = gs.rank()
    for s in range(steps):
        xb, yb = x[s, r * batch:(r + 1) * batch], y[s, r * batch:(r + 1) * batch]
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=set_to_none)
        loss.backward()
        opt.step(loss)


def equivalence():
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, reduce=OPTS.get("reduce", "mean"),
                                  grad_dtype=OPTS.get("grad_dtype", "fp32"), **sgd_args())
    steps, batch = int(OPTS.get("steps", 50)), int(OPTS.get("batch", 8))
    train(model, opt, steps, batch, set_to_none=OPTS.get("set_to_none") == "1")
    views = [(p.data_ptr(), p.grad.data_ptr(), opt._param_views[i].data_ptr(),
              opt._grad_views[i].data_ptr()) for i, p in enumerate(opt.params)]
    save(params=[p.detach().cpu().clone() for p in model.parameters()], views=views,
         copies=opt.copies)


# torch optimizers by name, and their hyperparameters (tests/test_torch.py's
# case_optimizers): the same on every rank and in the reference.
def make_optimizer(model, name):
    """Two parameter groups (the first layer at its own lr), torch's own
    optimizer of the named configuration."""
    first, rest = list(model[0].parameters()), [p for m in list(model)[1:] for p in m.parameters()]
    kinds = {
        "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
        "nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=False)),
        "adam": (torch.optim.Adam, dict(lr=1e-2, weight_decay=1e-3, amsgrad=True)),
        "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99))),
        "adamw_max": (torch.optim.AdamW, dict(lr=1e-2, maximize=True, eps=1e-6)),
        # Not fused: their own step() on the pack views.
        "rmsprop": (torch.optim.RMSprop, dict(lr=1e-2, alpha=0.9, momentum=0.5, centered=True,
                                              weight_decay=1e-3)),
        "adagrad": (torch.optim.Adagrad, dict(lr=5e-2, lr_decay=1e-3)),
    }
    cls, kw = kinds[name]
    lr = kw.pop("lr")
    return cls([{"params": first, "lr": lr / 2}, {"params": rest}], lr=lr, **kw)


class CpuGradScaler(torch.cuda.amp.GradScaler):
    """torch.cuda.amp.GradScaler, its logic unchanged, with its CUDA-only
    parts (scaling, unscale-and-check, the scale's update) written out
    for the CPU: torch 1.13 has no CPU loss scaler (torch >= 2.3 has
    torch.amp.GradScaler("cpu")). Power-of-two scales: unscaling is exact."""

    def __init__(self, **kw):
        from torch.cuda.amp import grad_scaler
        available = grad_scaler.amp_definitely_not_available
        grad_scaler.amp_definitely_not_available = lambda: False  # else it disables itself
        try:
            super().__init__(**kw)
        finally:
            grad_scaler.amp_definitely_not_available = available
        self._refresh = grad_scaler._refresh_per_optimizer_state

    def scale(self, outputs):
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        # On the device, as torch's own: found_inf is never read here.
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        bad = (~torch.isfinite(p.grad).all()).to(found_inf.dtype)
                        found_inf.copy_(torch.maximum(found_inf, bad))
                        p.grad.mul_(inv_scale)
        return {found_inf.device: found_inf}

    def update(self, new_scale=None):
        found = sum(float(t) for st in self._per_optimizer_states.values()
                    for t in st["found_inf_per_device"].values())
        if found:
            self._scale.mul_(self._backoff_factor)
            self._growth_tracker.zero_()
        else:
            self._growth_tracker.add_(1)
            if int(self._growth_tracker) == self._growth_interval:
                self._scale.mul_(self._growth_factor)
                self._growth_tracker.zero_()
        self._per_optimizer_states = collections.defaultdict(self._refresh)


def optimizers():
    """Trains with optimizer=; saves params and the optimizer's state_dict.
    With inf_step=S: under a loss scaler (CpuGradScaler), rank 1's loss
    infinite at step S; unscale=before/after: scaler.unscale_(opt) called
    by the script, before or after opt.synchronize(); real_scaler=1: torch's
    own GradScaler (CUDA)."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, optimizer=make_optimizer(model, OPTS["opt"]),
                                  reduce=OPTS.get("reduce", "mean"),
                                  nonfinite=OPTS.get("nonfinite", "stop"),
                                  shard_optimizer=sharded())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.5)
    steps, batch = int(OPTS.get("steps", 100)), int(OPTS.get("batch", 8))
    x, y = data(steps, batch, gs.world_size())
    r = gs.rank()
    inf_step, nan_step = int(OPTS.get("inf_step", -1)), int(OPTS.get("nan_step", -1))
    scaler = None if inf_step < 0 else \
        torch.cuda.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=4) \
        if OPTS.get("real_scaler") == "1" else CpuGradScaler(init_scale=2.0 ** 10, growth_interval=4)
    scales, skipped = [], []
    for s in range(steps):
        loss = F.cross_entropy(model(x[s, r * batch:(r + 1) * batch]),
                               y[s, r * batch:(r + 1) * batch])
        opt.zero_grad()
        if scaler is None:
            if s == nan_step and r == 1:
                loss = loss * float("nan")  # with nonfinite="skip": skipped on every rank
            loss.backward()
            res = opt.step(loss)
            if res.skipped:
                skipped.append(s)
        else:
            if s == inf_step and r == 1:
                loss = loss * float("inf")  # an overflow on one rank
            scaler.scale(loss).backward()
            if OPTS.get("unscale") == "after":
                opt.synchronize()
            if OPTS.get("unscale") in ("before", "after"):
                scaler.unscale_(opt)
            res = scaler.step(opt)
            if res.skipped:
                skipped.append(s)
            scaler.update()
            scales.append(scaler.get_scale())
        sched.step()
    save(params=[p.detach().cpu().clone() for p in model.parameters()],
         state=opt.state_dict(), isinstance_optimizer=isinstance(opt, torch.optim.Optimizer),
         scales=scales, skipped=skipped, state_bytes=res.state_bytes)


def lr_schedule(step):
    """A LambdaLR factor that moves both ways: the operator's lr scale
    must compose with a schedule that sets the lr every step."""
    return 1.0 + 0.5 * ((step // 7) % 2)


def lr_scale():
    """optimizer=OPTS["opt"] under a LambdaLR, training on (the examples
    cycle) until a step's result says the operator's lr scale changed
    (the test posts it), then 20 steps more: the same count on every
    rank, since every rank sees the change at the same step."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, optimizer=make_optimizer(model, OPTS["opt"]))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule)
    batch, r = 8, gs.rank()
    x, y = data(200, batch, gs.world_size())
    changed, scale, s = None, None, 0
    while changed is None or s <= changed + 20:
        if s == 1_000_000:
            raise SystemExit("the lr scale never came")
        mine = (s % 200, slice(r * batch, (r + 1) * batch))
        loss = F.cross_entropy(model(x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        res = opt.step(loss)
        if res.lr_scale_changed:
            changed, scale = s, res.lr_scale
        sched.step()
        s += 1
        if changed is None:
            time.sleep(0.005)  # fewer steps to compare while the test asks
    save(params=[p.detach().cpu().clone() for p in model.parameters()], changed=changed,
         scale=scale, steps=s, lrs=[g["lr"] for g in opt.param_groups])


def accumulate():
    """Each step: `micro` backward passes of batch/micro examples, all but
    the last inside no_sync()."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, **sgd_args())
    steps, batch, micro = int(OPTS.get("steps", 30)), int(OPTS.get("batch", 16)), 4
    x, y = data(steps, batch, gs.world_size())
    r, b = gs.rank(), batch // micro
    for s in range(steps):
        xs, ys = x[s, r * batch:(r + 1) * batch], y[s, r * batch:(r + 1) * batch]
        for k in range(micro):
            last = k == micro - 1
            with contextlib.nullcontext() if last else opt.no_sync():
                loss = F.cross_entropy(model(xs[k * b:(k + 1) * b]), ys[k * b:(k + 1) * b])
                (loss / micro).backward()
        opt.step(loss)
        opt.zero_grad(set_to_none=OPTS.get("set_to_none") == "1")
    save(params=[p.detach().cpu().clone() for p in model.parameters()])


def roundtrip():
    """AdamW from step `start` to `steps`, starting from the saved file
    `load` (params and an optimizer state_dict, from plain torch or from
    this scenario) when given; saves the same at the end (rank 0)."""
    gs.init()
    model = mlp()
    start, steps, batch = int(OPTS.get("start", 0)), int(OPTS["steps"]), 8
    if "load" in OPTS:
        saved = torch.load(OPTS["load"])
        with torch.no_grad():
            for p, v in zip(model.parameters(), saved["params"]):
                p.copy_(v)
    opt = gs.DistributedOptimizer(model, optimizer=make_optimizer(model, "adamw"),
                                  shard_optimizer=sharded())
    if "load" in OPTS:
        opt.load_state_dict(saved["opt"])
    x, y = data(60, batch, gs.world_size())  # the same examples whatever `steps`
    r = gs.rank()
    for s in range(start, steps):
        loss = F.cross_entropy(model(x[s, r * batch:(r + 1) * batch]),
                               y[s, r * batch:(r + 1) * batch])
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
    save(params=[p.detach().cpu().clone() for p in model.parameters()], opt=opt.state_dict())


def sampler():
    """One epoch over 101 examples through a DataLoader with 2 workers and
    gs.DistributedSampler(optimizer=opt); saves the example ids trained."""
    late = OPTS.get("defaults") == "late"
    if late:  # as a launcher that numbers no ranks: the job's place, at the first iter()
        for k in ("RANK", "GRADSYNC_RANK", "WORLD_SIZE"):
            os.environ.pop(k)
    gs.init()
    at_init = None if late else gs.rank()  # the launcher's $RANK, before any join
    model = mlp()
    g = torch.Generator().manual_seed(3)
    ds = torch.utils.data.TensorDataset(torch.randn(101, 20, generator=g), torch.arange(101))
    # defaults=1: made before the optimizer joined, with torch's defaults:
    # gradsync-run's $RANK and $WORLD_SIZE, known at once.
    early = gs.DistributedSampler(ds, seed=7) if OPTS.get("defaults") != "0" else None
    if late:
        early_place = None if early._place(must=False) else "unknown"
    else:
        early_place = (early.rank, early.num_replicas) if early else None
    opt = gs.DistributedOptimizer(model, lr=0.1)
    s = early or gs.DistributedSampler(ds, optimizer=opt, seed=7)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=s, num_workers=2)
    seen = []
    for x, ids in loader:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
        seen += ids.tolist()
    save(seen=seen, torch_order=list(torch.utils.data.DistributedSampler(
        ds, num_replicas=gs.world_size(), rank=gs.rank(), seed=7)), sample=opt.sample,
         at_init=at_init, early_place=early_place)


def autocast():
    """AdamW under torch.autocast(bfloat16) on the CPU; saves params and losses."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, optimizer=make_optimizer(model, "adamw"))
    steps, batch = 40, 8
    x, y = data(steps, batch, gs.world_size())
    r, losses = gs.rank(), []
    for s in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x[s, r * batch:(r + 1) * batch])
            loss = F.cross_entropy(out, y[s, r * batch:(r + 1) * batch])
        assert out.dtype == torch.bfloat16
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
        losses.append(float(loss))
    save(params=[p.detach().cpu().clone() for p in model.parameters()], losses=losses)


def clip():
    """Clipping to max norm 0.5 three ways (mode=method: opt.clip_grad_norm_;
    ctor: max_grad_norm=; torch: opt.synchronize() then torch's own), with
    SGD or make_optimizer's `opt`."""
    gs.init()
    model = mlp()
    mode = OPTS["mode"]
    inner = make_optimizer(model, OPTS["opt"]) if "opt" in OPTS else \
        torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    opt = gs.DistributedOptimizer(model, optimizer=inner,
                                  max_grad_norm=0.5 if mode == "ctor" else None,
                                  shard_optimizer=sharded())
    steps, batch = 30, 8
    x, y = data(steps, batch, gs.world_size())
    r, norms = gs.rank(), []
    for s in range(steps):
        loss = F.cross_entropy(model(x[s, r * batch:(r + 1) * batch]),
                               y[s, r * batch:(r + 1) * batch])
        opt.zero_grad()
        loss.backward()
        if mode == "method":
            norms.append(float(opt.clip_grad_norm_(0.5)))
        elif mode == "torch":
            opt.synchronize()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step(loss)
    save(params=[p.detach().cpu().clone() for p in model.parameters()], norms=norms)


def resume():
    """Trains to `steps` from wherever the checkpoint leaves it."""
    gs.init()
    model = mlp(bn=OPTS.get("bn") == "1")
    how = dict(optimizer=make_optimizer(model, OPTS["opt"])) if "opt" in OPTS else sgd_args()
    opt = gs.DistributedOptimizer(model, checkpoint_dir=OPTS["dir"], checkpoint_every=10,
                                  resume=OPTS.get("resume") == "1", **how)
    steps, batch, start = int(OPTS["steps"]), 8, opt.position[0]
    x, y = data(20, batch, gs.world_size())  # the same examples whatever `steps`
    r = gs.rank()
    for s in range(start, steps):
        loss = F.cross_entropy(model(x[s, r * batch:(r + 1) * batch]), y[s, r * batch:(r + 1) * batch])
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
    save(params=[p.detach().clone() for p in model.parameters()], start=start,
         buffers=[b.detach().clone() for b in model.buffers()], state=opt.state_dict())


def slow():
    """Trains for a few seconds, slowly, for the status page to be read."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, **sgd_args())
    x, y = data(1, 8, gs.world_size())
    # hang=RANK:STEP: that rank's data loading hangs before that step.
    hang = [int(v) for v in OPTS["hang"].split(":")] if "hang" in OPTS else None
    for s in range(int(OPTS.get("steps", 400))):  # the same count on every rank
        if hang and hang == [gs.rank(), s]:
            time.sleep(3600)
        loss = F.cross_entropy(model(x[0]), y[0])
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
        time.sleep(0.01)


def buffers():
    """Records, at each step, the BatchNorm's running mean after the
    forward and the mean of the batch it normalized."""
    gs.init()
    model = mlp(seed=gs.local_rank(), bn=True)  # unlike params and buffers on each rank
    mode = {"1": True, "0": False, "mean": "mean"}[OPTS.get("bb", "1")]
    model[1].running_mean.add_(gs.local_rank() + 1.0)
    start = {n: b.clone() for n, b in model.named_buffers()}
    opt = gs.DistributedOptimizer(model, broadcast_buffers=mode, **sgd_args())
    joined = {n: b.clone() for n, b in model.named_buffers()}
    seen, after, nograd = [], [], []
    model[1].register_forward_hook(lambda m, args, out: seen.append(args[0].detach().mean(0)))
    steps, batch = int(OPTS.get("steps", 5)), 8
    x, y = data(steps, batch, gs.world_size())
    r = gs.rank()
    for s in range(steps):
        xb, yb = x[s, r * batch:(r + 1) * batch], y[s, r * batch:(r + 1) * batch]
        xb = xb + r  # unlike batches: unlike statistics
        loss = F.cross_entropy(model(xb), yb)
        after.append(model[1].running_mean.clone())
        with torch.no_grad():
            model(xb)  # no broadcast without grad (DDP's rule); eval would not update
        nograd.append(model[1].running_mean.clone())
        opt.zero_grad()
        loss.backward()
        opt.step(loss)
    save(start=start, joined=joined, seen=seen, after=after, nograd=nograd, momentum=model[1].momentum,
         buffers={n: b.clone() for n, b in model.named_buffers()},
         params=[p.detach().clone() for p in model.parameters()])


class HostReads:
    """Counts, while `on`, the calls that read a tensor's value on the host
    (a device-to-host copy and a wait on a GPU): .item(), float(t),
    int(t), bool(t) (a branch on a device value), .tolist(), .cpu() and
    .numpy(), instrumented on torch.Tensor itself; `where` names the first
    few callers."""
    NAMES = ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy")

    def __init__(self):
        self.on, self.count, self.where = False, 0, []
        for name in self.NAMES:
            setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name, method):
        def counted(t, *args, **kwargs):
            if self.on:
                self.count += 1
                if len(self.where) < 5:
                    import traceback
                    frame = traceback.extract_stack(limit=3)[0]
                    self.where.append(f"{name} at {frame.filename}:{frame.lineno}")
            return method(t, *args, **kwargs)
        return counted


def waits_setup(kind):
    """host_waits' model, its optimizer's arguments, batches and loss for
    `kind`: "mlp" (BatchNorm, AdamW in two groups, clipping, bf16 packs),
    "cnn" (the example CNN: BatchNorm, fused SGD) or "transformer" (the
    example's model: AdamW groups, clipping, bf16 packs, fp16 autocast on
    a GPU). The examples come from examples/torch beside tests/."""
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples", "torch")
    sys.path.insert(0, examples)
    g = torch.Generator().manual_seed(gs.local_rank())
    if kind == "cnn":
        from fashion_cnn import Net
        torch.manual_seed(0)
        model = Net().to(DEVICE)
        xs = [torch.randn(16, 1, 28, 28, generator=g) for _ in range(4)]
        ys = [torch.randint(0, 10, (16,), generator=g) for _ in range(4)]
        return (model, dict(lr=0.05, momentum=0.9), [(x.to(DEVICE), y.to(DEVICE)) for x, y in
                                                     zip(xs, ys)], F.cross_entropy)
    if kind == "transformer":
        from char_transformer import CharGPT, param_groups
        torch.manual_seed(0)
        model = CharGPT(113, 32, width=32, layers=1, heads=2).to(DEVICE)
        adamw = torch.optim.AdamW(param_groups(model), lr=3e-3, betas=(0.9, 0.95))
        chunks = [torch.randint(0, 113, (4, 33), generator=g).to(DEVICE) for _ in range(4)]

        def loss_of(out, y):
            return F.cross_entropy(out.float().flatten(0, 1), y.flatten())
        return (model, dict(optimizer=adamw, max_grad_norm=1.0, grad_dtype="bf16"),
                [(c[:, :-1], c[:, 1:]) for c in chunks], loss_of)
    model = mlp(bn=True)
    x, y = data(4, 8, 1)
    return (model, dict(optimizer=make_optimizer(model, "adamw"), max_grad_norm=0.5,
                        grad_dtype="bf16"), [(x[i], y[i]) for i in range(4)], F.cross_entropy)


def host_waits():
    """Steady steps of the fused path with what makes them hard (model=mlp
    (default), cnn or transformer: see waits_setup; broadcast_buffers on),
    with scaler=1 under a GradScaler (torch's on a GPU, fp16 autocast for
    the transformer; CpuGradScaler on the CPU). Saves, per step, the host
    reads of tensor values made inside forward, backward and opt.step
    (HostReads) and the engine's blocking waits (the step result's
    device_syncs, device_reads, comm_waits). On a GPU, sync_debug=1 also
    runs the steady steps under torch.cuda.set_sync_debug_mode("error").
    With inject=item, the step's loss is read with .item() inside the
    step, as a change to the front end would: the count must show it;
    decide=late decides each step at the next one's end (on a GPU, what
    leaves the host no wait at all)."""
    gs.init()
    reads = HostReads()
    model, kw, batches, loss_of = waits_setup(OPTS.get("model", "mlp"))
    opt = gs.DistributedOptimizer(model, broadcast_buffers=True, decide=OPTS.get("decide", "now"),
                                  **kw)
    if OPTS.get("inject") == "item":
        loss_at = opt._loss_at
        opt._loss_at = lambda loss: (loss.item(), loss_at(loss))[1]
    scaler, autocast = None, contextlib.nullcontext()
    if OPTS.get("scaler") == "1" and DEVICE == "cuda":
        scaler = torch.cuda.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=1000)
        autocast = torch.autocast("cuda", dtype=torch.float16)
    elif OPTS.get("scaler") == "1":
        scaler = CpuGradScaler(init_scale=2.0 ** 10, growth_interval=1000)
    steps, warm = int(OPTS.get("steps", 30)), int(OPTS.get("warm", 3))
    counts = []
    for s in range(steps):
        xb, yb = batches[s % len(batches)]
        opt.zero_grad()
        strict = DEVICE == "cuda" and OPTS.get("sync_debug") == "1" and s >= warm
        if strict:
            torch.cuda.set_sync_debug_mode("error")
        reads.on, before = True, reads.count
        with autocast:
            loss = loss_of(model(xb), yb)
        if scaler is None:
            loss.backward()
            res = opt.step(loss)
        else:
            scaler.scale(loss).backward()
            res = scaler.step(opt, loss=loss)
        reads.on = False
        if strict:
            torch.cuda.set_sync_debug_mode("default")
        if scaler is not None:
            scaler.update()  # the test's CPU scaler reads its verdict here, outside the step
        counts.append(dict(host_reads=reads.count - before, device_syncs=res.device_syncs,
                           device_reads=res.device_reads, comm_waits=res.comm_waits))
    save(counts=counts, where=reads.where, loss=float(loss))


def unlike_models():
    gs.init()
    hidden = 16 if gs.local_rank() == 0 else 17
    try:
        gs.DistributedOptimizer(mlp(hidden=hidden), lr=0.1, join_timeout=20)
    except gs.ModelMismatch as e:
        print(f"ModelMismatch: {e}", flush=True)
        sys.exit(3)
    sys.exit(0)


def unused():
    gs.init()
    model = mlp()
    extra = nn.Linear(3, 3)
    model.add_module("unused", extra)
    opt = gs.DistributedOptimizer(model, lr=0.1,
                                  find_unused_parameters=OPTS.get("find") == "1")
    x, y = data(3, 8, gs.world_size())
    try:
        for s in range(3):
            loss = F.cross_entropy(model[:3](x[s]), y[s])  # never calls `unused`
            opt.zero_grad()
            loss.backward()
            opt.step(loss)
    except gs.Error as e:
        print(f"Error: {e}", flush=True)
        sys.exit(3)
    save(unused=extra.weight.detach().clone())


def nan_loss():
    """Rank 1's loss (or with grad=1 one gradient) is NaN at step 5; with
    steps=N it stops after N steps instead (the reference); decide=late
    decides each step at the next one's end."""
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, lr=0.1,
                                  nonfinite="skip" if OPTS.get("skip") == "1" else "stop",
                                  decide=OPTS.get("decide", "now"))
    x, y = data(10, 8, gs.world_size())
    skipped = []
    for s in range(int(OPTS.get("steps", 10))):
        loss = F.cross_entropy(model(x[s]), y[s])
        if s == 4 and gs.rank() == 1 and OPTS.get("grad") != "1":
            loss = loss * float("nan")
        opt.zero_grad()
        loss.backward()
        if s == 4 and gs.rank() == 1 and OPTS.get("grad") == "1":
            with torch.no_grad():
                model[2].bias.grad[0] = float("inf")
        r = opt.step(loss)
        if r.skipped:
            skipped.append(s + 1)
        if r.stop:
            print(f"stopped at step {s + 1}: {r.stop_reason}", flush=True)
            break
    save(step=opt.position[0], params=[p.detach().clone() for p in model.parameters()],
         skipped=skipped)


def killed():
    gs.init()
    model = mlp()
    opt = gs.DistributedOptimizer(model, lr=0.1)
    x, y = data(1, 8, gs.world_size())
    t0 = None
    try:
        for s in range(100000):
            if s == 20 and gs.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if s == 20:
                t0 = time.monotonic()
            loss = F.cross_entropy(model(x[0]), y[0])
            opt.zero_grad()
            loss.backward()
            opt.step(loss)
    except gs.PeerLost as e:
        print(f"PeerLost after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        sys.exit(3)


def teacher(n, seed=3):
    """A learnable task: the class a fixed random linear map ranks first."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    y = (x @ torch.randn(20, 3, generator=g)).argmax(1)
    return x.to(DEVICE), y.to(DEVICE)


def test_metrics(model, x, y):
    """(loss, accuracy) on this rank alone."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss, acc = float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())
    model.train()
    return loss, acc


def shared_accuracy(model, opt, x, y):
    """(correct, count, tries) over the test set, rank r of W taking
    examples r, r+W, ...: summed over the ranks, and again over the new
    world when it changes during the sum. die=sum: local rank 2 dies
    (SIGKILL) just before its first sum."""
    tries = 0
    while True:
        r, w = gs.rank(), gs.world_size()
        if OPTS.get("die") == "sum" and gs.local_rank() == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        model.eval()
        with torch.no_grad():
            correct = float((model(x[r::w]).argmax(1) == y[r::w]).sum())
        model.train()
        sums = torch.tensor([correct, float(len(y[r::w]))])
        tries += 1
        try:
            opt.allreduce_sum(sums)
            return float(sums[0]), int(sums[1]), tries
        except gs.WorldChanged:
            continue


def elastic():
    """A rank of an elastic job (GRADSYNC_WORLD_SIZE=MIN:MAX): `epochs`
    over n examples, each step's global batch cut from the optimizer's
    position (epoch, sample) in the epoch's order, rank r taking its
    slice; after a world change it goes on from where every rank is. At
    each epoch's end the ranks sum their share of the test accuracy.
    hold=STEP: before step STEP + 1, wait until OUT/release exists (the
    test makes it once a joining rank waits at the coordinator, so that
    the job cannot end before it joins, however slowly it starts)."""
    gs.init()
    model = mlp(hidden=32, bn=True)
    changes, results, committed, sums = [], [], [], []

    def on_change(rank, world, step):
        # Buffers were re-synced before the callback: the same on every rank.
        changes.append(dict(rank=rank, world=world, step=step,
                            buffers={n: b.clone() for n, b in model.named_buffers()}))

    how = dict(lr=0.05, momentum=0.9)
    if OPTS.get("opt") == "rmsprop":  # not fused: its state is shared at a regroup
        how = dict(optimizer=torch.optim.RMSprop(model.parameters(), lr=0.003, momentum=0.5))
    opt = gs.DistributedOptimizer(model, rejoin_timeout=30, on_world_change=on_change, **how)
    # Where this rank starts (a rank that joins a running job: the others' place).
    joined = dict(position=(opt.step_count, opt.epoch, opt.sample), world=gs.world_size(),
                  buffers={n: b.clone() for n, b in model.named_buffers()})
    n, batch, epochs = int(OPTS.get("n", 960)), 8, int(OPTS.get("epochs", 3))
    x, y = teacher(n + 1000)
    xt, yt, x, y = x[n:], y[n:], x[:n], y[:n]
    before = test_metrics(model, xt, yt)
    hold = int(OPTS.get("hold", -1))
    while opt.epoch < epochs:
        if opt.step_count == hold:
            while not os.path.exists(os.path.join(OUT, "release")):
                time.sleep(0.02)
        world, r = gs.world_size(), gs.rank()
        if opt.sample + batch * world > n:  # the epoch's last whole global batch is done
            sums.append((opt.step_count,) + shared_accuracy(model, opt, xt, yt))
            opt.set_epoch(opt.epoch + 1)
            continue
        order = torch.randperm(n, generator=torch.Generator().manual_seed(opt.epoch))
        start = (opt.epoch, opt.sample, world)
        idx = order[opt.sample + r * batch:opt.sample + (r + 1) * batch].to(DEVICE)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        res = opt.step(loss)
        if res.world_changed:
            results.append(dict(vars(res), before=start))
            print(f"world changed at step {res.step}: rank {res.rank} of {res.world_size}, "
                  f"dropped {res.dropped}, detect {res.detect_ms:.0f} ms, "
                  f"regroup {res.regroup_ms:.0f} ms", flush=True)
        if not res.dropped:
            committed.append((res.step,) + start)
            if res.step % 10 == 0:
                print(f"step {res.step}", flush=True)
        time.sleep(float(OPTS.get("delay", 0.02)))
        if res.stop:
            break
    save(params=[p.detach().cpu().clone() for p in model.parameters()], results=results,
         changes=changes, committed=committed, sums=sums, joined=joined, before=before,
         after=test_metrics(model, xt, yt),
         position=(opt.step_count, opt.epoch, opt.sample), local_rank=gs.local_rank())


def no_coordinator():
    gs.init(coordinator=OPTS["coordinator"], world_size=2)
    t0 = time.monotonic()
    try:
        gs.DistributedOptimizer(mlp(), lr=0.1, join_timeout=float(OPTS.get("timeout", 3)))
    except gs.Error as e:
        print(f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    SCENARIO, OUT = sys.argv[1], sys.argv[2]
    OPTS.update(a.split("=", 1) for a in sys.argv[3:])
    DEVICE = OPTS.get("device", "cpu")
    if DEVICE == "cuda":
        one_gpu_ranks()
    globals()[SCENARIO]()
