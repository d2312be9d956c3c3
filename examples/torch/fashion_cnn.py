#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST, trained data-parallel with gradsync.

    gradsync-run --nproc 2 -- python3 examples/torch/fashion_cnn.py --epochs 3

(--device cuda: each rank on the GPU of its local rank, the gradients
summed by NCCL.)

An ordinary PyTorch training script: the lines marked "gradsync" are all
it takes (import, init, the optimizer, and stopping when a step says so).
The data are Debian's dataset-fashion-mnist IDX files (no download).
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradsync.torch as gs  # gradsync (1/3)

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack_from(">HBB", data)
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack_from(f">{ndim}I", data, 4)
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(data_dir, split):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        raise FileNotFoundError(f"no {stem}[.gz] in {data_dir} (apt install dataset-fashion-mnist)")
    x = read_idx(find(f"{split}-images-idx3-ubyte"))
    y = read_idx(find(f"{split}-labels-idx1-ubyte"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="examples per rank per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the GPU of this rank's local rank (modulo the GPUs there are)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no GPU visible to PyTorch")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    gs.init()  # gradsync (2/3): where the coordinator and the other ranks are
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", gs.local_rank() % torch.cuda.device_count())
    model = Net().to(device)
    opt = gs.DistributedOptimizer(model, lr=args.lr, momentum=0.9, weight_decay=5e-4,  # gradsync
                                  reduce="mean")
    rank, world = gs.rank(), gs.world_size()
    x_train, y_train = (t.to(device) for t in load(args.data, "train"))
    x_test, y_test = (t.to(device) for t in load(args.data, "t10k"))
    steps_per_epoch = len(x_train) // (args.batch * world)
    if rank == 0:
        print(f"{world} ranks x batch {args.batch}, {steps_per_epoch} steps per epoch", flush=True)

    stop = False
    for epoch in range(args.epochs):
        model.train()
        opt.set_epoch(epoch)
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        order = order.to(device)
        t0 = time.monotonic()
        for s in range(steps_per_epoch):
            # Each rank takes its own slice of the global batch.
            at = (s * world + rank) * args.batch
            idx = order[at:at + args.batch]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            if opt.step(loss).stop:  # gradsync (3/3): a stop every rank takes at this step
                stop = True
                break
        model.eval()
        with torch.no_grad():
            correct = torch.zeros(2)  # this rank's half of the test set: right, total
            for part in torch.arange(len(x_test), device=device).chunk(world)[rank].split(1000):
                correct[0] += (model(x_test[part]).argmax(1) == y_test[part]).sum().item()
                correct[1] += len(part)
        opt.allreduce_sum(correct)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {float(loss):.4f}, test accuracy "
                  f"{float(correct[0] / correct[1]):.4f}, {time.monotonic() - t0:.1f} s",
                  flush=True)
        if stop:
            break


if __name__ == "__main__":
    main()
