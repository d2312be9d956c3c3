#!/usr/bin/python3
"""gloo_allreduce: the torch.distributed gloo anchor for bench/allreduce_bench.c.

Same sizes, same procedure (one checked allreduce, fixed warm-up, rank 0
sizes the timed loop and broadcasts the count) and the same output lines,
with dist.all_reduce in place on a float32 tensor, one torch thread per
process. It starts the N processes itself (fork), rendezvous over TCP on
127.0.0.1.

  gloo_allreduce.py --ranks 2 [--min S] [--max S] [--factor K] [--time SECS] [--csv] [--bind]
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    units = {"KiB": 1 << 10, "K": 1 << 10, "MiB": 1 << 20, "M": 1 << 20, "GiB": 1 << 30,
             "G": 1 << 30, "B": 1, "": 1}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u) and s[:len(s) - len(u)].isdigit():
            return int(s[:len(s) - len(u)]) * units[u]
    raise argparse.ArgumentTypeError("bad size: " + s)


def values(rank, n):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 13 + rank * 7) % 23 - 11).to(torch.float32)


def run_size(buf, n, args, rank, world):
    nbytes = n * 4
    t = buf[:n]
    t.copy_(values(rank, n))
    dist.all_reduce(t)
    want = sum(values(r, n) for r in range(world))
    ok = torch.tensor([1 if torch.equal(t, want) else 0], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    t.zero_()
    warm = 20 if nbytes <= 1 << 20 else 5 if nbytes <= 16 << 20 else 2
    t0 = time.perf_counter()
    for _ in range(warm):
        dist.all_reduce(t)
    per = (time.perf_counter() - t0) / warm
    iters = torch.tensor([min(max(int(args.time / per), 3), 1000000)], dtype=torch.int64)
    dist.broadcast(iters, 0)
    iters = int(iters.item())
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    sec = (time.perf_counter() - t0) / iters
    if rank != 0:
        return
    algbw = nbytes / sec / 1e9
    busbw = algbw * 2 * (world - 1) / world
    correct = "yes" if ok.item() == 1 else "no"
    if args.csv:
        print("gloo,%d,%d,%.2f,%.3f,%.3f,%s" % (world, nbytes, sec * 1e6, algbw, busbw, correct))
    else:
        print("%12d %12.2f %10.3f %10.3f  %s" % (nbytes, sec * 1e6, algbw, busbw, correct))
    sys.stdout.flush()


def rank_main(rank, args, port):
    if args.bind:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=args.ranks)
    buf = torch.zeros(args.max // 4, dtype=torch.float32)
    b = args.min
    while b <= args.max:
        run_size(buf, b // 4, args, rank, args.ranks)
        b *= args.factor
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--min", type=parse_size, default=4096)
    p.add_argument("--max", type=parse_size, default=256 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--time", type=float, default=0.3, help="timed seconds per size")
    p.add_argument("--csv", action="store_true")
    p.add_argument("--bind", action="store_true",
                   help="pin rank r to the r-th allowed CPU (mpirun's default for as many "
                   "ranks as cores)")
    args = p.parse_args()
    if args.ranks < 1 or args.min < 4 or args.min > args.max or args.factor < 2:
        p.error("bad sizes or ranks")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.csv:
        print("# gloo all_reduce, %d ranks, float32 sum" % args.ranks)
        print("# %10s %12s %10s %10s  %s" % ("bytes", "time_us", "algbw_GB/s", "busbw_GB/s",
                                             "correct"))
        sys.stdout.flush()
    mp.start_processes(rank_main, args=(args, free_port()), nprocs=args.ranks,
                       start_method="fork")


if __name__ == "__main__":
    main()
