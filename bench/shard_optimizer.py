#!/usr/bin/env python3
"""What sharding the optimizer state (--shard-optimizer) saves and costs,
on this machine, at 2 ranks. The agent's large MLP (784-1024-1024-10)
with AdamW (lr 1e-3, weight decay 5e-4; two float32 moments per
parameter), batch 64 per rank, one BLAS thread per rank, mean of
gradients, in a fixed world and in an elastic one (--min-ranks 1, where
each rank also keeps a copy of the previous rank's shard): samples/s
(`--steps` steps, the modes in turn --pairs times), the optimizer state
rank 0 holds (its `optimizer state:` line), and, as root, the bytes rank
0 sends per step with the two ranks on two network namespaces
(tests/cluster.py), from its interface's counter over two runs of
different lengths, so that what a run sends once (the start, the params
broadcast) cancels out. The transformer example (examples/torch/
char_transformer.py, AdamW, bf16 autocast, 100 steps) unsharded and
sharded, --transformer-rounds times: its samples/s and the state rank 0
holds. The anchors are the unsharded runs in the same run: ratios of
medians.

usage: shard_optimizer.py --bin DIR [--data DIR] [--pairs 3] [--steps 300]
                          [--no-bytes] [--transformer-rounds 2]
                          [--json PATH] [--markdown PATH]
"""
import argparse
import os
import platform
import re
import sys

from benchlib import (add_agent_run_args, fmt, median_of, parse_ours, publish, run_timed,
                      run_transformer_example)
from train_vs_ddp import BATCH, LARGE

HERE = os.path.dirname(os.path.abspath(__file__))
ADAMW = ["--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "5e-4"]
# mode: (agent flags, elastic); each sharded mode's anchor is the unsharded one of its world.
MODES = {"unsharded": ([], False), "sharded": (["--shard-optimizer"], False),
         "unsharded, elastic": ([], True), "sharded, elastic": (["--shard-optimizer"], True)}
ANCHOR = {"unsharded": "unsharded", "sharded": "unsharded", "unsharded, elastic":
          "unsharded, elastic", "sharded, elastic": "unsharded, elastic"}
STATE_RE = re.compile(r"optimizer state:? ([\d.]+) MiB on rank 0")


def agent_flags(a, steps, seed, extra):
    return ["--seed", str(seed), "--layers", ",".join(map(str, LARGE)), "--batch", str(BATCH),
            "--threads", "1", "--data", a.data, "--log-level", "warn", "--reduce", "mean",
            "--steps", str(steps), "--no-validate"] + ADAMW + extra


def run_speed(a, seed, extra, elastic):
    cmd = [os.path.join(a.bin, "gradsync-run"), "--nproc", "2"] + \
        (["--min-ranks", "1"] if elastic else []) + agent_flags(a, a.steps, seed, extra)
    res, out = run_timed(cmd, a.timeout)
    if out is None:
        return res
    res = parse_ours(res, out, 2 * BATCH)
    m = STATE_RE.search(out)
    if m:
        res["state_mib"] = float(m.group(1))
    return res


def sent_per_step(a, extra, elastic):
    """Bytes node a's interface sent per step: two runs, (long - short) / steps."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from cluster import ADDR, Cluster
    sent = {}
    with Cluster("gsso") as cl:
        cl.run("c", [os.path.join(a.bin, "gradsync-coordinator"), "--listen",
                     f"{ADDR['c']}:7070", "--http", f"{ADDR['c']}:8080", "--log-level", "warn"])
        for steps in (20, 20 + a.byte_steps):
            before = int(cl.exec("a", ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]).stdout)
            argv = [os.path.join(a.bin, "gradsync-agent"), "--coordinator", f"{ADDR['c']}:7070",
                    "--job", f"bytes-{steps}-{len(extra)}-{elastic}", "--world-size",
                    "1:2" if elastic else "2"] + \
                agent_flags(a, steps, 1, extra)
            procs = [cl.run(n, argv) for n in "ab"]
            for p in procs:
                out = p.communicate(timeout=a.timeout)[0]
                if p.returncode:
                    raise RuntimeError(f"exit {p.returncode}: {out[-2000:]}")
            sent[steps] = int(cl.exec("a", ["cat", "/sys/class/net/eth0/statistics/tx_bytes"])
                              .stdout) - before
    return (sent[20 + a.byte_steps] - sent[20]) / a.byte_steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_agent_run_args(p)
    p.add_argument("--pairs", type=int, default=3, help="rounds of the speed runs")
    p.add_argument("--steps", type=int, default=300, help="steps of each speed run")
    p.add_argument("--byte-steps", type=int, default=100,
                   help="the steps between the two runs that count the bytes")
    p.add_argument("--no-bytes", action="store_true", help="skip the bytes (they need root)")
    p.add_argument("--transformer-rounds", type=int, default=2,
                   help="rounds of the transformer example (0: none)")
    a = p.parse_args()
    a.bin = os.path.abspath(a.bin)
    runs = {m: [] for m in MODES}
    for i in range(1, a.pairs + 1):
        for m, (extra, elastic) in MODES.items():
            r = run_speed(a, i, extra, elastic)
            runs[m].append(r)
            print(f"round {i} {m}: {fmt(r.get('samples_per_sec'), ',.0f')} samples/s, "
                  f"optimizer {r.get('parts_ms', {}).get('optimizer', float('nan')):.3f} ms, "
                  f"state {fmt(r.get('state_mib'), '.2f')} MiB" if r.get("ok") else
                  f"round {i} {m}: {r.get('error')}", flush=True)
    sent = {}
    if not a.no_bytes:
        for m, (extra, elastic) in MODES.items():
            sent[m] = sent_per_step(a, extra, elastic)
            print(f"{m}: {sent[m] / 2**20:.3f} MiB sent per step by rank 0", flush=True)
    tfm = {m: [] for m in ("unsharded", "sharded")}
    for i in range(1, a.transformer_rounds + 1):
        for m in tfm:
            r = run_transformer_example(a.bin, a.timeout, "--quick", "--steps", "100",
                                        *(["--shard-optimizer"] if m == "sharded" else []))
            tfm[m].append(r)
            print(f"transformer round {i} {m}: {fmt(r.get('samples_per_sec'), ',.1f')} samples/s, "
                  f"state {fmt(r.get('state_mib'), '.3f')} MiB" if r.get("ok") else
                  f"transformer round {i} {m}: {r.get('error')}", flush=True)
    rows = []
    for m in MODES:
        base = median_of(runs[ANCHOR[m]], "samples_per_sec")
        s = median_of(runs[m], "samples_per_sec")
        opt = sorted(r["parts_ms"]["optimizer"] for r in runs[m]
                     if r.get("ok") and "optimizer" in r.get("parts_ms", {}))
        rows.append({"mode": m, "samples_per_sec": s, "vs_unsharded": s / base if s and base else
                     None, "optimizer_ms": opt[len(opt) // 2] if opt else None,
                     "state_mib": median_of(runs[m], "state_mib"), "sent_per_step": sent.get(m)})
    lines = [f"## Sharded optimizer state ({platform.node()}, {os.cpu_count()} cores)", "",
             f"Large MLP {'-'.join(map(str, LARGE))}, AdamW, 2 ranks, batch 64 per rank; medians "
             f"of {a.pairs} rounds of {a.steps} steps. Anchor: unsharded in the same world, in "
             "the same run. Bytes: rank 0's interface between two network namespaces, per step.",
             "", "| | samples/s | vs unsharded | optimizer ms/step | state on rank 0 MiB "
             "| sent per step MiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['vs_unsharded']:.2f}x" if r["vs_unsharded"] else "–"
        sb = r["sent_per_step"] / 2**20 if r["sent_per_step"] is not None else None
        lines.append(f"| {r['mode']} | {fmt(r['samples_per_sec'], ',.0f')} | {ratio} "
                     f"| {fmt(r['optimizer_ms'], '.3f')} | {fmt(r['state_mib'], '.2f')} "
                     f"| {fmt(sb, '.3f')} |")
    if a.transformer_rounds:
        t_base = median_of(tfm["unsharded"], "samples_per_sec")
        lines += ["", f"Transformer example, 100 steps, 2 ranks; medians of {a.transformer_rounds} "
                  "rounds.", "", "| | samples/s | vs unsharded | state on rank 0 MiB |",
                  "|---|---|---|---|"]
        for m in tfm:
            s_ = median_of(tfm[m], "samples_per_sec")
            ratio = f"{s_ / t_base:.2f}x" if s_ and t_base else "–"
            lines.append(f"| {m} | {fmt(s_, ',.1f')} | {ratio} "
                         f"| {fmt(median_of(tfm[m], 'state_mib'), '.3f')} |")
    publish("\n".join(lines) + "\n", a.markdown, a.json,
            {"rows": rows, "runs": runs, "transformer": tfm})
    return 0 if all(r["samples_per_sec"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
