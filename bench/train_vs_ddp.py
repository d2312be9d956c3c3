#!/usr/bin/env python3
"""gradsync against PyTorch on CPU, side by side on this machine: training
throughput at 1 rank (against plain PyTorch) and 2 ranks (against
DistributedDataParallel over gloo), and test accuracy after 3 epochs.

Both sides train the same MLP (PyTorch's default Linear init, which is
ours: uniform within 1/sqrt(fan_in)) on Fashion-MNIST with batch 64 per
rank, SGD lr 0.1, momentum 0.9, weight decay 5e-4, gradients averaged, one
BLAS thread per rank (OPENBLAS_NUM_THREADS=1 for both). Ours and PyTorch
run alternately, A B A B, --pairs times, pair i with seed i on both sides
(accuracy after 3 epochs at a constant LR varies by about a point from seed
to seed); the table shows medians. Samples/s
is global (every rank's) and steady-state: ours from the agent's timing
line (mean step after 10 untimed steps), PyTorch's over the steps after 50
untimed ones.

--baseline-bin DIR: an older build of gradsync (for example the previous
main) runs as a third side in each round (ours, the baseline, the anchor),
and the table adds its median and ours against it: a change that makes
the step slower shows here.

usage: train_vs_ddp.py --bin DIR [--baseline-bin DIR] [--data DIR] [--pairs 3]
                       [--rows LIST] [--python PYTHON] [--json PATH] [--markdown PATH]
"""
import argparse
import os
import platform
import sys

from benchlib import fmt, median_of, parse_json_line, parse_ours, publish, run_timed, subset

SMALL, LARGE = [784, 256, 128, 10], [784, 1024, 1024, 10]
BATCH = 64
OPT = {"lr": "0.1", "momentum": "0.9", "weight-decay": "5e-4"}
TRAIN_EXAMPLES = 60000
# name: (layers, world, steps or None for 3 epochs, what is compared, target ratio)
ROWS = {
    "small1": (SMALL, 1, 3000, "samples/s", 1.0),
    "small2": (SMALL, 2, 2000, "samples/s", 3.0),
    "large1": (LARGE, 1, 300, "samples/s", 1.0),
    "large2": (LARGE, 2, 300, "samples/s", 1.5),
    "accuracy": (SMALL, 2, None, "test accuracy", -0.005),  # at most 0.5 points below
}


def epochs_steps(world, epochs=3):
    return epochs * (TRAIN_EXAMPLES // (BATCH * world))


def run_ours(a, layers, world, steps, seed, extra=(), bin_dir=None):
    """gradsync-run (of `bin_dir`, default --bin) with the agent's flags
    (and `extra` ones); 3 epochs without `steps`."""
    cmd = [os.path.join(bin_dir or a.bin, "gradsync-run"), "--nproc", str(world),
           "--seed", str(seed),
           "--layers", ",".join(map(str, layers)), "--batch", str(BATCH), "--threads", "1",
           "--data", a.data, "--log-level", "warn"]
    cmd += [x for k, v in OPT.items() for x in (f"--{k}", v)]
    if world > 1:
        cmd += ["--reduce", "mean"]
    cmd += ["--epochs", "3"] if steps is None else ["--steps", str(steps), "--no-validate"]
    cmd += list(extra)
    res, out = run_timed(cmd, a.timeout)
    return res if out is None else parse_ours(res, out, world * BATCH)


def run_torch(a, layers, world, steps, seed):
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [a.python, os.path.join(here, "torch_mlp.py"), "--device", "cpu", "--threads", "1",
           "--seed", str(seed),
           "--world", str(world), "--layers", ",".join(map(str, layers)),
           "--batch", str(BATCH), "--data", a.data, "--progress-every", "0"]
    cmd += [x for k, v in OPT.items() for x in (f"--{k}", v)]
    if steps is None:  # train exactly 3 epochs, as ours does
        cmd += ["--steps", str(epochs_steps(world)), "--warmup", "0"]
    else:
        cmd += ["--steps", str(steps)]
    res, out = run_timed(cmd, a.timeout)
    return res if out is None else parse_json_line(res, out)


def run_baseline(a, layers, world, steps, seed):
    return run_ours(a, layers, world, steps, seed, bin_dir=a.baseline_bin)


def summarize(name, ours, anchor, baseline):
    layers, world, steps, what, target = ROWS[name]
    key = "test_accuracy" if what == "test accuracy" else "samples_per_sec"
    o, t, b = median_of(ours, key), median_of(anchor, key), median_of(baseline, key)
    row = {"row": name, "layers": layers, "world": world, "measure": what,
           "ours": o, "anchor": t, "ours_ok": sum(r["ok"] for r in ours),
           "anchor_ok": sum(r["ok"] for r in anchor),
           "ours_parts_ms": {}, "ours_step_ms": median_of(ours, "step_ms")}
    timed = [r for r in ours if r.get("ok") and r.get("parts_ms")]
    if timed and key == "samples_per_sec":
        row["ours_parts_ms"] = {k: sorted(r["parts_ms"][k] for r in timed)[len(timed) // 2]
                                for k in timed[0]["parts_ms"]}
    if o is None or t is None:
        row.update(ratio=None, met=False)
    elif key == "test_accuracy":
        row.update(ratio=o - t, met=o - t >= target)
    else:
        row.update(ratio=o / t, met=o / t >= target)
    row["target"] = target
    row["baseline"] = b
    if b is not None and o is not None:
        row["vs_baseline"] = o - b if key == "test_accuracy" else o / b
    return row


def markdown(rows, pairs, baseline):
    cols = " baseline | ours vs baseline |" if baseline else ""
    lines = [f"## gradsync vs PyTorch {torch_version()} on CPU ({platform.node()}, "
             f"{os.cpu_count()} cores)", "",
             f"Medians of {pairs} alternating pairs (seeds 1..{pairs}). Batch 64 per rank, SGD lr 0.1 momentum 0.9 "
             "wd 5e-4, mean of gradients, 1 BLAS thread per rank. Anchor: plain PyTorch at 1 "
             "rank, DDP (gloo) at 2."
             + (f" Baseline: the build in {baseline}." if baseline else ""),
             "",
             "| row | model | ranks | measure | ours | anchor | ours vs anchor | target | met "
             f"| ours step parts (ms) |{cols}",
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if baseline else "")]
    for r in rows:
        acc = r["measure"] == "test accuracy"
        val = ".4f" if acc else ",.0f"
        ratio = (f"{r['ratio'] * 100:+.2f} points" if acc else f"{r['ratio']:.2f}x") \
            if r["ratio"] is not None else "–"
        target = f">= {r['target'] * 100:+.1f} points" if acc else f">= {r['target']:.1f}x"
        parts = " + ".join(f"{k} {v:.3f}" for k, v in r["ours_parts_ms"].items())
        lines.append(f"| {r['row']} | {'-'.join(map(str, r['layers']))} | {r['world']} "
                     f"| {r['measure']} | {fmt(r['ours'], val)} | {fmt(r['anchor'], val)} "
                     f"| {ratio} | {target} | {'yes' if r['met'] else 'NO'} | {parts} |"
                     + (baseline_cells(r, val, acc) if baseline else ""))
    return "\n".join(lines) + "\n"


def baseline_cells(r, val, acc):
    v = r.get("vs_baseline")
    vs = "–" if v is None else f"{v * 100:+.2f} points" if acc else f"{v:.2f}x"
    return f" {fmt(r['baseline'], val)} | {vs} |"


def torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return "(not importable here)"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="folder with gradsync-run and gradsync-agent")
    p.add_argument("--baseline-bin", help="an older build's bin folder, run as a third side")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")
    p.add_argument("--python", default="/usr/bin/python3", help="a python3 with torch")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--markdown", help="also write the table here")
    a = p.parse_args()
    a.rows = subset(p, "--rows", a.rows, ROWS)
    if a.pairs < 1:
        p.error("--pairs >= 1")
    a.bin = os.path.abspath(a.bin)
    for d in filter(None, (a.bin, a.baseline_bin)):
        if not os.access(os.path.join(d, "gradsync-run"), os.X_OK):
            p.error(f"no gradsync-run in {d}")
    if a.baseline_bin:
        a.baseline_bin = os.path.abspath(a.baseline_bin)
    return a


def main():
    a = parse_args()
    # One BLAS thread per rank on both sides; torch.set_num_threads does not
    # reach Debian's OpenBLAS, the environment does.
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    rows, runs, failed = [], {}, False
    for name in a.rows:
        layers, world, steps, _, _ = ROWS[name]
        ours, anchor, baseline = [], [], []
        sides = [("ours", run_ours, ours), ("anchor", run_torch, anchor)]
        if a.baseline_bin:
            sides.insert(1, ("baseline", run_baseline, baseline))
        for i in range(a.pairs):
            for side, fn, dst in sides:
                r = fn(a, layers, world, steps, i + 1)
                dst.append(r)
                if r["ok"]:
                    print(f"{name} pair {i + 1} {side}: {r['samples_per_sec']:,.0f} samples/s, "
                          f"test accuracy {fmt(r.get('test_accuracy'), '.4f')}, "
                          f"wall {r['wall_s']:.1f} s", flush=True)
                else:
                    failed = True
                    print(f"{name} pair {i + 1} {side}: FAILED: {r['error']}", flush=True)
        runs[name] = {"ours": ours, "anchor": anchor, "baseline": baseline}
        rows.append(summarize(name, ours, anchor, baseline))
    publish(markdown(rows, a.pairs, a.baseline_bin), a.markdown, a.json,
            {"pairs": a.pairs, "rows": rows, "runs": runs})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
