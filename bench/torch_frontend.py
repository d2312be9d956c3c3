#!/usr/bin/env python3
"""One side of bench/torch_vs_ddp.py: trains a model for --steps steps after
--warmup untimed ones and prints one JSON line from rank 0:
{"samples_per_sec": global, "step_ms": ...}.

  --side plain     one plain PyTorch process, torch.optim.SGD
  --side ddp       --world processes under DistributedDataParallel (gloo;
                   nccl with --device cuda)
  --side gradsync  this process is one rank of a gradsync job (start it
                   with gradsync-run), gradsync.torch.DistributedOptimizer

--device cuda (default cpu): the model and the data on cuda:0, every rank
on that one GPU posing as a host of its own for NCCL (NCCL_HOSTID
gradsync-rank-R, NCCL_NET=Socket over lo, no InfiniBand, as
tests/gpu/one_gpu_ranks.sh does), so DDP's nccl process group and
gradsync's engine move the gradients over the same transport; the clock
is read after torch.cuda.synchronize(). Without a GPU it exits 77. On
cuda the line also gives the host's waits per step, counted over 20 more
steps: PyTorch's synchronizing calls (torch_syncs_per_step, from
torch.cuda.set_sync_debug_mode("warn")) on every side, and gradsync's
engine's own (engine_waits_per_step, its step results' counts).

Models: --model cnn (examples/torch/fashion_cnn.py's Net) or mlp
(784-256-128-10): synthetic Fashion-MNIST-shaped data (the throughput does
not depend on the values), SGD lr 0.05, momentum 0.9, weight decay 5e-4.
--model transformer: examples/torch/char_transformer.py's model at its
defaults (2 layers, width 64, 4 heads, context 64, 113 characters), random
windows of characters (a sample is one window), AdamW in the example's two
groups (lr 3e-3, betas 0.9/0.95, weight decay 0.1 on the matrices), the
forward and loss under bf16 autocast. Batch per rank --batch; one torch
thread per rank; gradients averaged.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "torch"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from fashion_cnn import Net  # noqa: E402
from char_transformer import CharGPT, param_groups  # noqa: E402  (imports gradsync.torch)
# Each rank on the one GPU a host of its own for NCCL, on both sides.
from torch_worker import one_gpu_ranks  # noqa: E402

OPT = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
VOCAB, CONTEXT = 113, 64  # the fortunes' characters, the example's default context


def model_of(name, device):
    torch.manual_seed(0)
    if name == "cnn":
        return Net().to(device)
    if name == "transformer":
        return CharGPT(VOCAB, CONTEXT, width=64, layers=2, heads=4).to(device)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10)).to(device)


def optimizer_of(name, model):
    """The torch optimizer of both sides (gradsync wraps it)."""
    if name == "transformer":
        return torch.optim.AdamW(param_groups(model), lr=3e-3, betas=(0.9, 0.95))
    return torch.optim.SGD(model.parameters(), **OPT)


def loss_of(name, net, x, y):
    if name != "transformer":
        return F.cross_entropy(net(x), y)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return F.cross_entropy(net(x).float().flatten(0, 1), y.flatten())


def batches(name, batch, rank, device):
    """Eight batches, already on the device (both sides alike)."""
    g = torch.Generator().manual_seed(rank)
    if name == "transformer":
        chunks = [torch.randint(0, VOCAB, (batch, CONTEXT + 1), generator=g).to(device)
                  for _ in range(8)]
        return [(c[:, :-1], c[:, 1:]) for c in chunks]
    return [(torch.randn(batch, 1, 28, 28, generator=g).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(8)]


def sync(device):
    """Waits for the device's queued work, so that the clock reads whole steps."""
    if device == "cuda":
        torch.cuda.synchronize()


WAIT_STEPS = 20  # counted after the timed ones (a warning per wait would cost time)


def host_waits(a, step, data):
    """On cuda, the host's waits per step, counted over WAIT_STEPS more
    steps: PyTorch's (each synchronizing call warns under
    torch.cuda.set_sync_debug_mode("warn")), and the engine's own blocking
    waits (what gradsync's step results count; None for the other
    sides)."""
    import warnings
    engine = 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        for i in range(WAIT_STEPS):
            r = step(*data[i % len(data)])
            if r is not None:
                engine += r.device_syncs + r.device_reads
        torch.cuda.set_sync_debug_mode("default")
    torch_syncs = sum("synchroniz" in str(w.message) for w in seen)
    return {"torch_syncs_per_step": torch_syncs / WAIT_STEPS,
            "engine_waits_per_step": engine / WAIT_STEPS if step.gradsync else None}


def timed(a, step, world, rank, parts=None):
    data = batches(a.model, a.batch, rank, a.device)
    for i in range(a.warmup):
        step(*data[i % len(data)])
    sync(a.device)
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(*data[i % len(data)])
    sync(a.device)
    dt = time.perf_counter() - t0
    waits = host_waits(a, step, data) if a.device == "cuda" else {}
    if a.phases and parts is not None:
        waits.update(phases(a, parts, data))
    if rank == 0:
        print(json.dumps({"samples_per_sec": a.steps * a.batch * world / dt,
                          "step_ms": dt / a.steps * 1000.0, **waits}), flush=True)


def phases(a, step_parts, data):
    """--phases: the mean ms per step of forward (with the loss), backward
    (gradsync: the hooks, and the allreduces they start) and the step
    (zero_grad with it), over --steps more steps, each timed apart."""
    sums = [0.0, 0.0, 0.0]
    for i in range(a.steps):
        for k, t in enumerate(step_parts(*data[i % len(data)])):
            sums[k] += t
    return {"phases_ms": {name: v / a.steps * 1000.0
                          for name, v in zip(("forward", "backward", "step"), sums)}}


def split(forward, backward, update):
    """A step as three timed parts (perf_counter seconds each)."""
    def parts(x, y):
        t0 = time.perf_counter()
        loss = forward(x, y)
        t1 = time.perf_counter()
        backward(loss)
        t2 = time.perf_counter()
        update(loss)
        return t1 - t0, t2 - t1, time.perf_counter() - t2
    return parts


def plain(a, rank=0, world=1, ddp=False):
    torch.set_num_threads(1)
    model = model_of(a.model, a.device)
    if not ddp:
        net = model
    elif a.device == "cuda":
        net = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    else:
        net = nn.parallel.DistributedDataParallel(model)
    opt = optimizer_of(a.model, model)

    def step(x, y):
        loss = loss_of(a.model, net, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    step.gradsync = False
    parts = split(lambda x, y: loss_of(a.model, net, x, y), lambda loss: loss.backward(),
                  lambda loss: (opt.step(), opt.zero_grad()))
    timed(a, step, world, rank, parts)


def ddp_rank(rank, a, port):
    import torch.distributed as dist
    backend = "gloo"
    if a.device == "cuda":
        backend = "nccl"
        one_gpu_ranks(rank)
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=a.world)
    plain(a, rank, a.world, ddp=True)
    dist.destroy_process_group()


def gradsync_side(a):
    import gradsync.torch as gs
    torch.set_num_threads(1)
    cfg = gs.init()
    if a.device == "cuda":
        one_gpu_ranks(cfg["local_rank"])
        torch.cuda.set_device(0)
    model = model_of(a.model, a.device)  # on cuda: the engine on cuda:0 with NCCL
    # SGD as the engine's own (lr=...), AdamW as a torch optimizer it wraps.
    hyper = dict(optimizer=optimizer_of(a.model, model)) if a.model == "transformer" else dict(OPT)
    if a.nonfinite != "stop":  # the default: a baseline build before the setting runs too
        hyper["nonfinite"] = a.nonfinite
    if a.decide != "now":
        hyper["decide"] = a.decide
    opt = gs.DistributedOptimizer(model, reduce="mean", **hyper)

    def step(x, y):
        loss = loss_of(a.model, model, x, y)
        opt.zero_grad()
        loss.backward()
        r = opt.step(loss)
        return r if hasattr(r, "device_syncs") else None  # a baseline build has no counts
    step.gradsync = True
    parts = split(lambda x, y: loss_of(a.model, model, x, y), lambda loss: loss.backward(),
                  lambda loss: (opt.step(loss), opt.zero_grad()))
    timed(a, step, gs.world_size(), gs.rank(), parts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=["plain", "ddp", "gradsync"], required=True)
    p.add_argument("--model", choices=["cnn", "mlp", "transformer"], default="cnn")
    p.add_argument("--world", type=int, default=2, help="ranks (ddp)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--nonfinite", choices=["stop", "skip", "off"], default="stop",
                   help="gradsync: what a non-finite step does (off: no check, overlap)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: every rank on cuda:0, DDP over nccl (default cpu)")
    p.add_argument("--decide", choices=["now", "late"], default="now",
                   help="gradsync: when a step's decisions are taken (late: the host never waits "
                        "for the device in a steady step)")
    p.add_argument("--phases", action="store_true",
                   help="also time forward, backward and step apart over --steps more steps")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_frontend: --device cuda: no GPU visible to PyTorch {torch.__version__} "
              "(torch.cuda.is_available() is False); nothing measured", file=sys.stderr)
        sys.exit(77)
    if a.side == "plain":
        plain(a)
    elif a.side == "gradsync":
        gradsync_side(a)
    else:
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(ddp_rank, args=(a, port), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
