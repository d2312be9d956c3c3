#!/usr/bin/env python3
"""A small GPT-style character model on Debian's fortunes, trained data-parallel with gradsync.

    gradsync-run --nproc 2 -- python3 examples/torch/char_transformer.py

Today's recipe in plain PyTorch: a decoder-only transformer (learned
positions, pre-LN blocks of causal self-attention and an MLP, the output
layer tied to the embedding), AdamW with weight decay on the matrices
only, linear warmup then cosine decay, gradient accumulation, clipping at
norm 1 and bf16 autocast. The lines marked "gradsync" are what data
parallelism adds. The text is the `fortunes` package's (apt install
fortunes): every file of /usr/share/games/fortunes in name order, the last
10% of each held out for validation.
"""
import argparse
import contextlib
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradsync.torch as gs  # gradsync

DATA = "/usr/share/games/fortunes"
# --quick: the same model for a quarter of the steps (about 2 minutes at 2
# ranks on 2 cores), for CI.
QUICK = dict(steps=150, warmup=15, eval_every=50, eval_windows=256)


def load_text(data_dir):
    """(train, validation) text: each fortune file (the ones without an
    extension: .dat and .u8 are fortune's indexes and links) split 90/10,
    so that validation covers every topic."""
    names = sorted(n for n in os.listdir(data_dir)
                   if "." not in n and os.path.isfile(os.path.join(data_dir, n)))
    if not names:
        raise FileNotFoundError(f"no fortune files in {data_dir} (apt install fortunes)")
    train, val = [], []
    for name in names:
        with open(os.path.join(data_dir, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        cut = len(text) * 9 // 10
        train.append(text[:cut])
        val.append(text[cut:])
    return "".join(train), "".join(val)


class Block(nn.Module):
    """Pre-LN: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def attend(self, x, future):
        b, t, c = x.shape
        # (3, batch, heads, time, head width)
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))

    def forward(self, x, future):
        x = x + self.attend(self.ln1(x), future)
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab, context, width, layers, heads):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.apply(self._init)
        nn.init.normal_(self.pos, std=0.02)
        self.head.weight = self.tok.weight  # tied: one matrix, in named_parameters() once

    @staticmethod
    def _init(m):
        # GPT-2's: small normal weights keep the residual stream's scale at the start.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        # True above the diagonal: the later positions a token must not see.
        # Made here, not a buffer, so that there are no buffers to broadcast.
        future = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        x = self.tok(idx) + self.pos[:t]
        for block in self.blocks:
            x = block(x, future)
        return self.head(self.ln(x))


def param_groups(model, weight_decay=0.1):
    """AdamW's groups: decay on the matrices only (biases, LayerNorm gains
    and the like are not pulled towards zero)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def windows(data, starts, context):
    """Inputs and next-character targets of the windows at `starts`."""
    chunk = data[starts[:, None] + torch.arange(context + 1)].long()
    return chunk[:, :-1], chunk[:, 1:]


def lr_factor(step, warmup, steps, floor=0.1):
    """Linear warmup to 1, then a cosine down to `floor` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    done = (step - warmup) / max(1, steps - 1 - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=16, help="windows per rank per micro-batch")
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--context", type=int, default=64, help="characters per window")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=30, help="steps of linear warmup")
    ap.add_argument("--no-autocast", action="store_true", help="float32 forward (default bf16)")
    ap.add_argument("--grad-dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="what the gradients travel in between the ranks (gradsync)")
    ap.add_argument("--shard-optimizer", action="store_true",
                    help="shard AdamW's state over the ranks (each keeps 1/world of it)")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between validations")
    ap.add_argument("--eval-windows", type=int, default=512,
                    help="validation windows, shared by the ranks")
    ap.add_argument("--target", type=float, help="exit 1 unless the final val loss is below it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=DATA)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--quick", action="store_true",
                    help="CI preset: the same model for 150 steps (flags given win)")
    args = ap.parse_args()
    if args.quick:
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
    torch.set_num_threads(args.threads)

    train_text, val_text = load_text(args.data_dir)
    chars = sorted(set(train_text + val_text))
    code = {c: i for i, c in enumerate(chars)}
    train = torch.tensor([code[c] for c in train_text], dtype=torch.uint8)
    val = torch.tensor([code[c] for c in val_text], dtype=torch.uint8)

    gs.init()  # gradsync: where the coordinator and the other ranks are
    torch.manual_seed(args.seed)
    model = CharGPT(len(chars), args.context, args.width, args.layers, args.heads)
    opt = gs.DistributedOptimizer(model, optimizer=torch.optim.AdamW(  # gradsync
        param_groups(model), lr=args.lr, betas=(0.9, 0.95)), grad_dtype=args.grad_dtype,
        shard_optimizer=args.shard_optimizer)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, args.warmup, args.steps))
    rank, world = gs.rank(), gs.world_size()  # gradsync: known once the optimizer joined
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast)
    # Fixed validation windows spread over the held-out text, each rank its share.
    val_starts = torch.linspace(0, len(val) - args.context - 1, args.eval_windows).long()

    def val_loss():
        model.eval()
        total = torch.zeros(2)  # this rank's summed loss over its windows, windows
        with torch.no_grad(), autocast:
            for starts in val_starts[rank::world].split(64):
                x, y = windows(val, starts, args.context)
                loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                total[0] += loss * len(starts)
                total[1] += len(starts)
        model.train()
        opt.allreduce_sum(total)  # gradsync: sum over the ranks
        return float(total[0] / total[1])

    if rank == 0:
        freq = torch.bincount(train.long(), minlength=len(chars)).double() / len(train)
        unigram = float(-(freq[freq > 0] * freq[freq > 0].log()).sum())
        size = sum(p.numel() for p in model.parameters())
        print(f"{world} ranks, {len(train):,} train / {len(val):,} val chars, vocabulary "
              f"{len(chars)} (unigram entropy {unigram:.3f} nats), {size:,} parameters, "
              f"{args.batch}x{args.accumulate} windows of {args.context} per rank per step",
              flush=True)

    t_start = t_mark = time.monotonic()
    trained, losses, vloss = 0, [], float("nan")
    for step in range(args.steps):
        # Each rank draws its own windows: a seed of (seed, rank, step).
        gen = torch.Generator().manual_seed((args.seed * 1009 + rank) * 1_000_003 + step)
        opt.zero_grad()
        loss_sum = torch.zeros(())
        for micro in range(args.accumulate):
            starts = torch.randint(0, len(train) - args.context - 1, (args.batch,), generator=gen)
            x, y = windows(train, starts, args.context)
            # All but the last backward only add into the gradients (gradsync).
            last = micro == args.accumulate - 1
            with contextlib.nullcontext() if last else opt.no_sync():
                with autocast:
                    loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                (loss / args.accumulate).backward()
            loss_sum += loss.detach() / args.accumulate
        opt.clip_grad_norm_(1.0)  # of the reduced gradients, as every rank sees them
        lr = opt.param_groups[0]["lr"]
        r = opt.step(loss_sum)  # gradsync: the step's result is every rank's
        sched.step()
        losses.append(float(loss_sum))
        trained += args.batch * args.accumulate * world
        done = step + 1 == args.steps or r.stop
        if (step + 1) % args.eval_every == 0 or done:
            rate = trained / (time.monotonic() - t_mark)
            vloss = val_loss()
            if rank == 0:  # loss: rank 0's training loss, mean since the last line
                print(f"step {step + 1}: loss {sum(losses) / len(losses):.4f}, val loss "
                      f"{vloss:.4f}, lr {lr:.2e}, {rate:,.0f} samples/s", flush=True)
            t_mark, trained, losses = time.monotonic(), 0, []
        if r.stop:
            break

    reached = args.target is None or vloss < args.target
    if rank == 0:
        verdict = "" if args.target is None else \
            f", target {args.target}: {'reached' if reached else 'NOT reached'}"
        print(f"final val loss {vloss:.4f} after {step + 1} steps, "
              f"{time.monotonic() - t_start:.0f} s{verdict}; optimizer state "
              f"{r.state_bytes / 2**20:.3f} MiB on rank 0"
              f"{' (sharded)' if args.shard_optimizer else ''}", flush=True)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
