#!/usr/bin/env python3
"""PyTorch reference for gradsync's MLP benchmarks: the same model, batch,
loss, optimizer and data as gradsync's agents, in PyTorch eager mode; one
process, or --world N processes under DistributedDataParallel (gloo, CPU;
each rank its slice of the shuffled epoch, gradients averaged).

  nn.Linear layers with ReLU between (PyTorch's default init, seeded),
  CrossEntropyLoss (mean over the batch), torch.optim.SGD with momentum and
  weight decay applied to every parameter alike (gradsync's defaults: bias LR
  multiplier 1, bias weight decay = weight decay), fp32 without TF32.

Warms up, then times --steps steps and prints one JSON line (rank 0):
  {"samples_per_sec": ..., "step_ms": ..., "final_loss": ..., ...}
samples_per_sec counts every rank's samples.
Progress goes to stderr every --progress-every steps.

usage: torch_mlp.py --layers 784,256,128,10 --batch 64 --steps N
                    --device cuda|cpu --data DIR [--world N] [--lr 0.05 ...]
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

IDX_TYPE_UBYTE = 0x08


def read_idx(path):
    """Reads an IDX file (gzip or plain) into a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != IDX_TYPE_UBYTE:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated header")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    count = 1
    for d in dims:
        count *= d
    off = 4 + 4 * ndim
    if len(raw) - off != count:
        raise ValueError(f"{path}: {len(raw) - off} data bytes, header says {count}")
    # torch.frombuffer rather than numpy: torch wheels do not require numpy.
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8, offset=off,
                            count=count).reshape(dims)


def find_file(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    return None


def load_split(data_dir, prefix, width, device):
    """Images scaled to [0, 1] as [N, width] float32 and labels as int64, on
    `device`; None if the files are not there."""
    ipath = find_file(data_dir, f"{prefix}-images-idx3-ubyte")
    lpath = find_file(data_dir, f"{prefix}-labels-idx1-ubyte")
    if ipath is None or lpath is None:
        return None
    img, lab = read_idx(ipath), read_idx(lpath)
    n = img.shape[0]
    if lab.shape[0] != n or img[0].numel() != width:
        raise ValueError(f"{data_dir}/{prefix}: {n} images of {img[0].numel()} pixels, "
                         f"{lab.shape[0]} labels, model input {width}")
    x = (img.reshape(n, width).to(torch.float32) / 255.0).to(device)
    y = lab.to(torch.int64).to(device)
    return x, y


def set_tf32(allow):
    """TF32 for fp32 matmuls on or off. PyTorch 2.9+ has a new API and warns on
    the old one (and mixing the two can raise), so use only the new one where
    it exists."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if allow else "ieee"
    else:
        matmul.allow_tf32 = allow


def build_model(widths):
    mods = []
    for i in range(len(widths) - 1):
        mods.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


class Batches:
    """Batches by a fresh shuffled permutation each epoch (the same on every
    rank; each rank takes its slice of every global batch), dropping the last
    partial batch, as gradsync's sampler does. The whole training set sits on
    the device and rows are gathered there by index: the closest eager
    equivalent of our agent, which uploads each batch from pinned memory
    without a host-side DataLoader in the way."""

    def __init__(self, x, y, batch, seed, device, rank=0, world=1):
        self.x, self.y, self.batch = x, y, batch
        self.offset, self.stride = rank * batch, world * batch
        self.per_epoch = x.shape[0] // self.stride
        if self.per_epoch == 0:
            raise ValueError(f"batch {batch} x {world} ranks is more than the {x.shape[0]} examples")
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.device = device
        self.step = 0
        self.perm = None

    def next(self):
        k = self.step % self.per_epoch
        if k == 0:
            self.perm = torch.randperm(self.x.shape[0], device=self.device, generator=self.gen)
        start = k * self.stride + self.offset
        idx = self.perm[start:start + self.batch]
        self.step += 1
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="784,256,128,10")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=2000, help="timed steps")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank (--device cpu)")
    p.add_argument("--world", type=int, default=1,
                   help="ranks; more than 1: DistributedDataParallel over gloo (--device cpu)")
    p.add_argument("--allow-tf32", action="store_true",
                   help="let cuBLAS use TF32 (off: matches gradsync's fp32 GEMMs)")
    p.add_argument("--progress-every", type=int, default=100, help="0: no progress")
    a = p.parse_args()
    a.widths = [int(w) for w in a.layers.split(",")]
    if len(a.widths) < 2 or min(a.widths) < 1 or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        p.error("need --layers with 2+ positive widths, --batch >= 1, --steps >= 1")
    if a.world < 1 or (a.world > 1 and a.device != "cpu"):
        p.error("--world N needs N >= 1, and N > 1 runs on --device cpu only")
    return a


def evaluate(model, split, batch=10000):
    """Mean test loss and accuracy, outside the timed region."""
    if split is None:
        return None, None
    x, y = split
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            logits = model(x[i:i + batch])
            loss_sum += F.cross_entropy(logits, y[i:i + batch], reduction="sum").item()
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    return loss_sum / x.shape[0], correct / x.shape[0]


def run(rank, a, port):
    """One rank (the only one without --world)."""
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("torch_mlp: --device cuda but torch.cuda.is_available() is False")
        set_tf32(a.allow_tf32)
    else:
        torch.set_num_threads(a.threads)

    train = load_split(a.data, "train", a.widths[0], dev)
    if train is None:
        sys.exit(f"torch_mlp: no train-images/labels IDX files in {a.data}")
    test = load_split(a.data, "t10k", a.widths[0], dev)

    torch.manual_seed(a.seed)
    model = build_model(a.widths).to(dev)
    net = model
    if a.world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=a.world)
        net = DistributedDataParallel(model)  # also broadcasts rank 0's params
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay, nesterov=a.nesterov)
    batches = Batches(train[0], train[1], a.batch, a.seed, dev, rank, a.world)
    barrier = dist.barrier if a.world > 1 else (lambda: None)

    def step():
        xb, yb = batches.next()
        loss = F.cross_entropy(net(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    loss = None
    for _ in range(a.warmup):
        loss = step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        ev0 = torch.cuda.Event(enable_timing=True)
        ev1 = torch.cuda.Event(enable_timing=True)
    sync()
    barrier()
    t0 = time.perf_counter()
    if cuda:
        ev0.record()
    for s in range(a.steps):
        loss = step()
        # The only host sync in the loop, for progress.
        if rank == 0 and a.progress_every > 0 and (s + 1) % a.progress_every == 0:
            print(f"step {s + 1}/{a.steps} loss {loss.item():.4f}", file=sys.stderr, flush=True)
    if cuda:
        ev1.record()
    sync()
    barrier()
    secs = time.perf_counter() - t0
    if rank != 0:
        return

    final_loss = loss.item()
    test_loss, test_acc = evaluate(model, test)
    out = {
        "samples_per_sec": a.world * a.batch * a.steps / secs,
        "step_ms": 1e3 * secs / a.steps,
        "step_ms_events": ev0.elapsed_time(ev1) / a.steps if cuda else None,
        "final_loss": final_loss,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "layers": a.widths,
        "batch": a.batch,
        "world": a.world,
        "steps": a.steps,
        "warmup": a.warmup,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "threads": None if cuda else torch.get_num_threads(),
        "tf32": a.allow_tf32 if cuda else None,
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main():
    a = parse_args()
    if a.world == 1:
        run(0, a, None)
    else:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(a, free_port()), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
