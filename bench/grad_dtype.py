#!/usr/bin/env python3
"""What 16-bit gradients on the wire (--grad-dtype) gain and cost, on
this machine, at 2 ranks. The agent's large MLP (784-1024-1024-10):
samples/s with fp32, bf16 and fp16 gradients (300 steps, alternating fp32,
bf16, fp16 --pairs times), and test accuracy after 3 epochs of
Fashion-MNIST with fp32 and bf16 (seed i in round i for both); batch 64
per rank, SGD lr 0.1 momentum 0.9 wd 5e-4, mean of gradients, one BLAS
thread per rank, as bench/train_vs_ddp.py. The transformer example
(examples/torch/char_transformer.py --quick: AdamW, bf16 autocast, 150
steps) with fp32 and bf16 gradients, --transformer-rounds times: its
samples/s and final validation loss. The anchor is fp32 in the same run:
ratios of medians. On one machine the ranks' ring runs over shared memory,
so the bytes saved are memory copies, not a network's time; --link-rate
RATE (root) also runs the MLP's speed rows with the two ranks on two
network namespaces (tests/cluster.py) whose links a tc tbf limits to RATE
(e.g. 1gbit), where the bytes are the time.

usage: grad_dtype.py --bin DIR [--data DIR] [--pairs 3] [--no-accuracy]
                     [--transformer-rounds 2] [--link-rate 1gbit]
                     [--json PATH] [--markdown PATH]
"""
import argparse
import os
import platform
import sys

from benchlib import (add_agent_run_args, fmt, median_of, parse_ours, publish,
                      run_transformer_example)
from train_vs_ddp import BATCH, LARGE, OPT, run_ours

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = ("fp32", "bf16", "fp16")


def run_on_nodes(a, cl, dtype, steps, seed, job):
    """The large MLP's speed run with its two ranks on nodes a and b of the
    cluster `cl` (coordinator on c): rank 0's timing."""
    from cluster import ADDR
    argv = [os.path.join(a.bin, "gradsync-agent"), "--coordinator", f"{ADDR['c']}:7070",
            "--job", job, "--world-size", "2", "--seed", str(seed), "--steps", str(steps),
            "--no-validate", "--layers", ",".join(map(str, LARGE)), "--batch", str(BATCH),
            "--threads", "1", "--data", a.data, "--reduce", "mean", "--log-level", "warn",
            "--grad-dtype", dtype] + [x for k, v in OPT.items() for x in (f"--{k}", v)]
    procs = [cl.run(n, argv) for n in "ab"]
    outs = [p.communicate(timeout=a.timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        r = parse_ours({"cmd": " ".join(argv), "ok": False}, out, 2 * BATCH)
        if r.get("ok") or p.returncode:
            if p.returncode:
                r.update(ok=False, error=f"exit {p.returncode}: {out[-2000:]}")
            return r
    return {"ok": False, "error": "no rank printed a final line"}


def linked_rows(a):
    """--link-rate: the speed rows between two namespaces, fp32, bf16 and
    fp16 in turn --pairs times."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from cluster import ADDR, Cluster
    runs = {d: [] for d in DTYPES}
    with Cluster("gsgd") as cl:
        for n in "ab":
            cl.exec(n, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", a.link_rate,
                        "burst", "256kb", "latency", "100ms"])
        cl.run("c", [os.path.join(a.bin, "gradsync-coordinator"), "--listen",
                     f"{ADDR['c']}:7070", "--http", f"{ADDR['c']}:8080", "--log-level", "warn"])
        for i in range(1, a.pairs + 1):
            for d in DTYPES:
                r = run_on_nodes(a, cl, d, a.steps, i, f"link-{d}-{i}")
                runs[d].append(r)
                print(f"{a.link_rate} link round {i} {d}: "
                      f"{fmt(r.get('samples_per_sec'), ',.0f')} samples/s" if r.get("ok") else
                      f"{a.link_rate} link round {i} {d}: {r.get('error')}", flush=True)
    return runs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_agent_run_args(p)
    p.add_argument("--pairs", type=int, default=3, help="rounds of the speed and accuracy runs")
    p.add_argument("--steps", type=int, default=300, help="steps of each speed run")
    p.add_argument("--no-accuracy", action="store_true", help="skip the 3-epoch runs")
    p.add_argument("--transformer-rounds", type=int, default=2,
                   help="rounds of the transformer example (0: none)")
    p.add_argument("--link-rate", help="also between two namespaces over links of this rate "
                   "(tc tbf, e.g. 1gbit; root)")
    a = p.parse_args()
    a.bin = os.path.abspath(a.bin)
    speed = {d: [] for d in DTYPES}
    acc = {d: [] for d in DTYPES[:2]}
    for i in range(1, a.pairs + 1):
        for d in DTYPES:
            r = run_ours(a, LARGE, 2, a.steps, i, ["--grad-dtype", d])
            speed[d].append(r)
            print(f"speed round {i} {d}: {fmt(r.get('samples_per_sec'), ',.0f')} samples/s "
                  f"(comm-wait {r.get('parts_ms', {}).get('comm-wait', float('nan')):.1f} ms)"
                  if r.get("ok") else f"speed round {i} {d}: {r.get('error')}", flush=True)
        for d in acc if not a.no_accuracy else ():
            r = run_ours(a, LARGE, 2, None, i, ["--grad-dtype", d])
            acc[d].append(r)
            print(f"accuracy round {i} {d}: {fmt(r.get('test_accuracy'), '.4f')}"
                  if r.get("ok") else f"accuracy round {i} {d}: {r.get('error')}", flush=True)
    linked = linked_rows(a) if a.link_rate else {}
    tfm = {d: [] for d in DTYPES[:2]}
    for i in range(1, a.transformer_rounds + 1):
        for d in tfm:
            r = run_transformer_example(a.bin, a.timeout, "--quick", "--grad-dtype", d)
            tfm[d].append(r)
            print(f"transformer round {i} {d}: {fmt(r.get('samples_per_sec'), ',.1f')} samples/s, "
                  f"val loss {fmt(r.get('val_loss'), '.4f')}" if r.get("ok") else
                  f"transformer round {i} {d}: {r.get('error')}", flush=True)
    base = median_of(speed["fp32"], "samples_per_sec")
    base_acc = median_of(acc["fp32"], "test_accuracy")
    rows = []
    for d in DTYPES:
        s = median_of(speed[d], "samples_per_sec")
        wait = sorted(r["parts_ms"]["comm-wait"] for r in speed[d]
                      if r.get("ok") and "comm-wait" in r.get("parts_ms", {}))
        t = median_of(acc[d], "test_accuracy") if d in acc else None
        rows.append({"grad_dtype": d, "samples_per_sec": s,
                     "vs_fp32": s / base if s and base else None,
                     "comm_wait_ms": wait[len(wait) // 2] if wait else None,
                     "test_accuracy": t,
                     "accuracy_points": (t - base_acc) * 100 if t and base_acc else None})
    lines = [f"## 16-bit gradients on the wire ({platform.node()}, {os.cpu_count()} cores)", "",
             f"Large MLP {'-'.join(map(str, LARGE))}, 2 ranks, batch 64 per rank; medians of "
             f"{a.pairs} rounds ({a.steps}-step speed runs; accuracy after 3 epochs). Anchor: "
             "fp32 in the same run.", "",
             "| grad dtype | samples/s | vs fp32 | comm-wait ms/step | test accuracy "
             "| vs fp32 |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['vs_fp32']:.2f}x" if r["vs_fp32"] else "–"
        pts = f"{r['accuracy_points']:+.2f} points" if r["accuracy_points"] is not None else "–"
        lines.append(f"| {r['grad_dtype']} | {fmt(r['samples_per_sec'], ',.0f')} | {ratio} "
                     f"| {fmt(r['comm_wait_ms'], '.2f')} | {fmt(r['test_accuracy'], '.4f')} "
                     f"| {pts} |")
    if linked:
        l_base = median_of(linked["fp32"], "samples_per_sec")
        lines += ["", f"The same speed runs with the two ranks on two network namespaces, "
                  f"their links limited to {a.link_rate} (tc tbf).", "",
                  "| grad dtype | samples/s | vs fp32 | comm-wait ms/step |", "|---|---|---|---|"]
        for d in DTYPES:
            s_ = median_of(linked[d], "samples_per_sec")
            wait = sorted(r["parts_ms"]["comm-wait"] for r in linked[d]
                          if r.get("ok") and "comm-wait" in r.get("parts_ms", {}))
            ratio = f"{s_ / l_base:.2f}x" if s_ and l_base else "–"
            lines.append(f"| {d} | {fmt(s_, ',.0f')} | {ratio} "
                         f"| {fmt(wait[len(wait) // 2] if wait else None, '.2f')} |")
    t_base = median_of(tfm["fp32"], "samples_per_sec")
    if a.transformer_rounds:
        lines += ["", f"Transformer example, --quick (150 steps), 2 ranks; medians of "
                  f"{a.transformer_rounds} rounds.", "",
                  "| grad dtype | samples/s | vs fp32 | final val loss |", "|---|---|---|---|"]
        for d in tfm:
            s_ = median_of(tfm[d], "samples_per_sec")
            ratio = f"{s_ / t_base:.2f}x" if s_ and t_base else "–"
            lines.append(f"| {d} | {fmt(s_, ',.1f')} | {ratio} "
                         f"| {fmt(median_of(tfm[d], 'val_loss'), '.4f')} |")
    publish("\n".join(lines) + "\n", a.markdown, a.json,
            {"rows": rows, "speed": speed, "accuracy": acc, "transformer": tfm,
             "linked": linked})
    return 0 if all(r["samples_per_sec"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
