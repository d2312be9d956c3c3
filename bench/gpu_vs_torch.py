#!/usr/bin/env python3
"""gradsync on one GPU against PyTorch eager on the same GPU: same MLP, batch,
optimizer (SGD lr 0.05, momentum 0.9, weight decay 5e-4) and data, fp32
without TF32 on both sides.

For each size, runs ours (gradsync-run --nproc 1 --device cuda --backend
nccl) and bench/torch_mlp.py alternately, A B A B, --pairs times, and reports
medians. Also measures the "GEMM bound" of a size: the 8 cuBLAS GEMMs of one
training step (forward 3; backward a weight gradient per layer and an input
gradient for every layer but the first) timed alone with torch.mm on the same
shapes; our target is a step within 10% of it on the large size.

With --baseline-bin DIR (an earlier build's binaries), that build runs in
each pair too, after ours: a change's effect on the step measured on the
same GPU in the same run ("before" in the notes).

usage: gpu_vs_torch.py --bin DIR --data DIR [--steps N] [--pairs 3]
                       [--sizes small,large] [--baseline-bin DIR]
                       [--json PATH] [--markdown PATH]
"""
import argparse
import os
import statistics
import sys

from benchlib import (fmt, median_of, median_parts, parse_json_line, parse_ours, publish,
                      run_timed)

SIZES = {
    "small": {"layers": [784, 256, 128, 10], "batch": 64, "steps": 2000},
    "large": {"layers": [784, 4096, 4096, 10], "batch": 1024, "steps": 300},
}
TARGET_OVER_BOUND = 1.10


def run_ours(a, size, bin_dir=None):
    cfg = SIZES[size]
    cmd = [os.path.join(bin_dir or a.bin, "gradsync-run"), "--nproc", "1", "--device", "cuda",
           "--backend", "nccl", "--layers", ",".join(map(str, cfg["layers"])),
           "--batch", str(cfg["batch"]), "--steps", str(a.steps_of[size]), "--no-validate",
           "--log-level", "warn", "--data", a.data]
    res, out = run_timed(cmd, a.timeout)
    if out is None:
        return res
    return parse_ours(res, out, cfg["batch"])


def run_torch(a, size):
    cfg = SIZES[size]
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [a.python, os.path.join(here, "torch_mlp.py"), "--device", "cuda",
           "--layers", ",".join(map(str, cfg["layers"])), "--batch", str(cfg["batch"]),
           "--steps", str(a.steps_of[size]), "--data", a.data]
    res, out = run_timed(cmd, a.timeout)
    if out is None:
        return res
    return parse_json_line(res, out)


def gemm_bound_ms(widths, batch, reps=50):
    """Median time of one step's GEMMs alone (fp32, no TF32), CUDA events."""
    import torch
    from torch_mlp import set_tf32  # this file's folder is on sys.path
    set_tf32(False)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=g)

    L = len(widths) - 1
    h = [rnd(batch, widths[i]) for i in range(L)]            # layer inputs
    w = [rnd(widths[i + 1], widths[i]) for i in range(L)]    # [out, in] weights
    dz = [rnd(batch, widths[i + 1]) for i in range(L)]       # output gradients
    z = [torch.empty(batch, widths[i + 1], device=dev) for i in range(L)]
    gw = [torch.empty(widths[i + 1], widths[i], device=dev) for i in range(L)]
    dh = [torch.empty(batch, widths[i], device=dev) for i in range(L)]

    def one_step():
        for i in range(L):
            torch.mm(h[i], w[i].t(), out=z[i])
        for i in reversed(range(L)):
            torch.mm(dz[i].t(), h[i], out=gw[i])
            if i > 0:
                torch.mm(dz[i], w[i], out=dh[i])

    for _ in range(10):
        one_step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        one_step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    macs = sum(batch * widths[i] * widths[i + 1] for i in range(L))
    flops = 2 * (2 * macs + sum(batch * widths[i] * widths[i + 1] for i in range(1, L)))
    ms = statistics.median(times)
    return {"ms": ms, "gemms": 2 * L + (L - 1), "tflops": flops / (ms * 1e-3) / 1e12,
            "device": torch.cuda.get_device_name(dev)}


def summarize(size, ours, torch_runs, bound, before):
    cfg = SIZES[size]
    row = {
        "size": size, "layers": cfg["layers"], "batch": cfg["batch"],
        "ours_ok": sum(r["ok"] for r in ours), "torch_ok": sum(r["ok"] for r in torch_runs),
        "ours_samples_per_sec": median_of(ours, "samples_per_sec"),
        "torch_samples_per_sec": median_of(torch_runs, "samples_per_sec"),
        "ours_step_ms": median_of(ours, "step_ms"),
        "ours_parts_ms": median_parts(ours),
        "ours_test_accuracy": median_of(ours, "test_accuracy"),
        "torch_step_ms": median_of(torch_runs, "step_ms"),
        "torch_test_accuracy": median_of(torch_runs, "test_accuracy"),
        "ours_samples_source": ",".join(sorted({r["samples_source"] for r in ours if r["ok"]})),
        "gemm_bound_ms": bound["ms"] if bound else None,
        "gemm_tflops": bound["tflops"] if bound else None,
    }
    o, t = row["ours_samples_per_sec"], row["torch_samples_per_sec"]
    row["ours_over_torch"] = o / t if o and t else None
    s, b = row["ours_step_ms"], row["gemm_bound_ms"]
    row["ours_over_bound"] = s / b if s and b else None
    if before:
        row["before_step_ms"] = median_of(before, "step_ms")
        row["before_parts_ms"] = median_parts(before)
        p = row["before_step_ms"]
        row["before_over_bound"] = p / b if p and b else None
    return row


def markdown(rows, steps_of, pairs, gpu):
    lines = [f"## gradsync vs PyTorch eager, one GPU ({gpu})", "",
             f"Medians of {pairs} alternating pairs; fp32, no TF32; SGD lr 0.05, momentum 0.9, "
             "wd 5e-4. Ours: gradsync-run --nproc 1 --device cuda --backend nccl.", "",
             "| size | layers | batch | steps | ours samples/s | torch samples/s | ours/torch "
             "| ours step ms | ours step parts ms | torch step ms "
             "| GEMM-bound ms | ours/bound | test acc ours / torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        brk = " + ".join(f"{k} {v:.3f}" for k, v in r["ours_parts_ms"].items())
        lines.append(
            f"| {r['size']} | {'-'.join(map(str, r['layers']))} | {r['batch']} "
            f"| {steps_of[r['size']]} | {fmt(r['ours_samples_per_sec'], ',.0f')} "
            f"| {fmt(r['torch_samples_per_sec'], ',.0f')} | {fmt(r['ours_over_torch'], '.2f')} "
            f"| {fmt(r['ours_step_ms'], '.3f')} | {brk} "
            f"| {fmt(r['torch_step_ms'], '.3f')} | {fmt(r['gemm_bound_ms'], '.3f')} "
            f"| {fmt(r['ours_over_bound'], '.2f')} "
            f"| {fmt(r['ours_test_accuracy'], '.4f')} / {fmt(r['torch_test_accuracy'], '.4f')} |")
    lines.append("")
    for r in rows:
        notes = []
        if r["ours_ok"] < pairs or r["torch_ok"] < pairs:
            notes.append(f"{r['ours_ok']}/{pairs} ours and {r['torch_ok']}/{pairs} torch runs "
                         "succeeded")
        if r["ours_samples_source"] == "final":
            notes.append("no 'timing:' line: ours samples/s is the whole run's (with start-up)")
        if r["ours_over_bound"] is not None:
            verdict = "within" if r["ours_over_bound"] <= TARGET_OVER_BOUND else "NOT within"
            notes.append(f"ours step {r['ours_over_bound']:.2f}x the GEMM bound "
                         f"({r['gemm_tflops']:.1f} TFLOP/s): {verdict} the 10% target")
        if r.get("before_step_ms") is not None:
            brk = " + ".join(f"{k} {v:.3f}" for k, v in r["before_parts_ms"].items())
            notes.append(f"before (--baseline-bin): step {r['before_step_ms']:.3f} ms ({brk}), "
                         f"{fmt(r['before_over_bound'], '.2f')}x the GEMM bound")
        if notes:
            lines.append(f"- {r['size']}: " + "; ".join(notes))
    return "\n".join(lines).rstrip() + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="folder with gradsync-run and friends")
    p.add_argument("--data", required=True, help="Fashion-MNIST IDX folder")
    p.add_argument("--steps", type=int, help="steps per run (default: small 2000, large 300)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    p.add_argument("--python", default=sys.executable, help="python for torch_mlp.py")
    p.add_argument("--baseline-bin", help="an earlier build's binaries, run in each pair too")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--markdown", help="also write the markdown table here")
    a = p.parse_args()
    a.sizes = [s for s in a.sizes.split(",") if s]
    bad = [s for s in a.sizes if s not in SIZES]
    if bad or not a.sizes or a.pairs < 1 or (a.steps is not None and a.steps < 1):
        p.error(f"--sizes from {','.join(SIZES)}, --pairs >= 1, --steps >= 1")
    a.steps_of = {s: a.steps or SIZES[s]["steps"] for s in SIZES}
    a.bin = os.path.abspath(a.bin)
    a.data = os.path.abspath(a.data)
    for d in [a.bin] + ([a.baseline_bin] if a.baseline_bin else []):
        if not os.access(os.path.join(d, "gradsync-run"), os.X_OK):
            p.error(f"no gradsync-run in {d}")
    if a.baseline_bin:
        a.baseline_bin = os.path.abspath(a.baseline_bin)
    return a


def main():
    a = parse_args()
    runs = {}
    failed = False
    for size in a.sizes:
        ours, torch_runs, before = [], [], []
        sides = [("ours", run_ours, ours), ("torch", run_torch, torch_runs)]
        if a.baseline_bin:
            sides.append(("before", lambda a, s: run_ours(a, s, a.baseline_bin), before))
        for i in range(a.pairs):
            for name, fn, dst in sides:
                r = fn(a, size)
                dst.append(r)
                if r["ok"]:
                    print(f"{size} pair {i + 1} {name}: {r['samples_per_sec']:,.0f} samples/s"
                          f", step {fmt(r.get('step_ms'), '.3f')} ms, wall {r['wall_s']:.1f} s",
                          flush=True)
                else:
                    failed = True
                    print(f"{size} pair {i + 1} {name}: FAILED: {r['error']}", flush=True)
        runs[size] = (ours, torch_runs, before)

    # After the subprocess runs, so this process's CUDA context never shares
    # the GPU with a timed run.
    bounds, gpu = {}, "GPU unknown"
    for size in a.sizes:
        try:
            bounds[size] = gemm_bound_ms(SIZES[size]["layers"], SIZES[size]["batch"])
            gpu = bounds[size]["device"]
            print(f"{size} GEMM bound: {bounds[size]['ms']:.3f} ms for {bounds[size]['gemms']} "
                  f"GEMMs ({bounds[size]['tflops']:.1f} TFLOP/s)", flush=True)
        except Exception as e:  # report the rest even if torch/CUDA is unusable here
            failed = True
            bounds[size] = None
            print(f"{size} GEMM bound: FAILED: {e!r}", flush=True)

    rows = [summarize(s, runs[s][0], runs[s][1], bounds[s], runs[s][2]) for s in a.sizes]
    publish(markdown(rows, a.steps_of, a.pairs, gpu), a.markdown, a.json,
            {"gpu": gpu, "pairs": a.pairs, "steps": a.steps_of, "rows": rows,
             "runs": {s: {"ours": runs[s][0], "torch": runs[s][1], "before": runs[s][2]}
                      for s in a.sizes},
             "gemm_bound": bounds})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
