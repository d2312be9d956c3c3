#!/usr/bin/env python3
"""Whole-process GPU tests of the agent: gradsync-run with --device cuda and
the nccl backend, checked against the cpu device. They need a GPU and a
CUDA build; without either they exit 77 (ctest's skip code) with the reason.

usage: test_gpu_agent.py CASE BIN_DIR [DATA_DIR]
cases: parity, nccl1, training, duplicate_gpu
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checkpoints import newest_checkpoint, params_of, read_checkpoint, rel_error  # noqa: E402

CASE, BIN_DIR = sys.argv[1], sys.argv[2]
DATA = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
RUN = os.path.join(BIN_DIR, "gradsync-run")
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
SKIP = 77


def skip_without_gpu():
    version = subprocess.run([AGENT, "--version"], capture_output=True, text=True).stdout
    if "cuda" not in version:
        print(f"SKIP: built without CUDA ({version.strip()})")
        sys.exit(SKIP)
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    if "GPU" not in gpus:
        print("SKIP: no CUDA device visible (nvidia-smi -L lists none)")
        sys.exit(SKIP)


def run(args, timeout=600, check=True):
    """Runs gradsync-run; returns (exit code, stdout, stderr, seconds)."""
    t0 = time.time()
    p = subprocess.run([RUN, "--data", DATA] + args, capture_output=True, text=True,
                       timeout=timeout)
    took = time.time() - t0
    if check and p.returncode != 0:
        sys.exit(f"gradsync-run {' '.join(args)} exited {p.returncode}\n"
                 f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p.returncode, p.stdout, p.stderr, took


def losses(out):
    """{step: loss} from the progress lines ("step 12/50 epoch 1 loss 0.6931 ...")."""
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"step (\d+)/\d+ epoch \d+ loss ([-\d.naif]+)", out)}


def train_to_checkpoint(tmp, name, args, steps):
    d = os.path.join(tmp, name)
    _, out, err, _ = run(["--nproc", "1", "--steps", str(steps), "--checkpoint-dir", d,
                             "--checkpoint-every", str(steps), "--no-validate",
                             "--log-interval", "0s"] + args)
    ck = read_checkpoint(newest_checkpoint(d))
    assert ck["step"] == steps, ck["step"]
    return ck, out, err


def case_parity(tmp):
    """Same seed, same data order, K steps on cuda and on cpu: the losses and
    the params agree within 1e-4 (relative)."""
    common = ["--no-shuffle", "--seed", "5", "--batch", "64", "--lr", "0.05"]
    cpu, cpu_out, _ = train_to_checkpoint(tmp, "cpu", common + ["--device", "cpu"], 100)
    gpu, gpu_out, gpu_err = train_to_checkpoint(tmp, "gpu", common + ["--device", "cuda"], 100)
    assert "nccl backend" in gpu_err, "the cuda run did not use the nccl backend:\n" + gpu_err
    lc, lg = losses(cpu_out), losses(gpu_out)
    assert len(lc) >= 50 and lc.keys() == lg.keys(), (len(lc), len(lg))
    # The progress lines print 4 decimals: allow their rounding on top of 1e-4 relative.
    worst = max(max(abs(lc[s] - lg[s]) - 1e-4, 0) / max(abs(lc[s]), 1e-6) for s in lc)
    err = rel_error(params_of(gpu), params_of(cpu))
    init, _, _ = train_to_checkpoint(tmp, "init", common + ["--device", "cpu", "--lr", "0"], 1)
    moved = rel_error(params_of(cpu), params_of(init))
    print(f"cuda vs cpu after 100 steps: params relative error {err:.2e}, "
          f"worst loss relative difference {worst:.2e} over {len(lc)} steps; "
          f"params moved {moved:.2e}")
    assert moved > 1e-2, "training did not move the params; the comparison would be empty"
    assert err < 1e-4, err
    assert worst < 1e-4, worst


def case_nccl1(tmp):
    """World size 1 through the coordinator on the nccl backend: broadcast
    period, checkpoints, and a resume that continues to the same params."""
    args = ["--device", "cuda", "--backend", "nccl", "--reduce", "mean", "--bcast-period", "25",
            "--no-shuffle", "--seed", "2", "--no-validate", "--log-interval", "1s"]
    full = os.path.join(tmp, "full")
    run(["--nproc", "1", "--steps", "300", "--checkpoint-dir", full, "--checkpoint-every",
         "100", "--checkpoint-keep", "5"] + args)
    want = read_checkpoint(newest_checkpoint(full))
    assert want["step"] == 300, want["step"]
    part = os.path.join(tmp, "part")
    os.mkdir(part)
    shutil.copy(os.path.join(full, "ckpt-000000000100.gsck"), part)
    _, out, _, _ = run(["--nproc", "1", "--steps", "300", "--checkpoint-dir", part,
                        "--checkpoint-every", "100", "--resume"] + args)
    assert "resumed at step 100" in out, out
    got = read_checkpoint(newest_checkpoint(part))
    err = rel_error(params_of(got), params_of(want))
    print(f"nccl world 1: resumed at 100 -> 300, params relative error vs uninterrupted {err:.2e}")
    assert got["step"] == 300 and err < 1e-5, err


def case_training(tmp):
    """A short Fashion-MNIST training on the GPU reaches the CPU's accuracy."""
    _, out, _, took = run(["--nproc", "1", "--device", "cuda", "--epochs", "2", "--batch", "128",
                           "--log-interval", "5s"])
    m = re.search(r"final: test accuracy ([\d.]+)", out)
    assert m, out
    acc = float(m.group(1))
    print(f"cuda, 1 rank, batch 128, 2 epochs: test accuracy {acc:.4f} in {took:.1f} s")
    print("\n".join(line for line in out.splitlines() if "final" in line or "timing" in line))
    assert acc >= 0.83, acc


def case_duplicate_gpu(tmp):
    """Two ranks on one GPU: NCCL refuses it, and the job must fail with an
    error rather than hang (multi-rank NCCL needs a GPU per rank)."""
    code, out, err, took = run(["--nproc", "2", "--device", "cuda", "--gpu", "0", "--reduce",
                                "mean", "--steps", "20", "--comm-timeout", "20s"],
                               timeout=180, check=False)
    print(f"2 ranks on one GPU: exit {code} after {took:.1f} s; last error lines:")
    print("\n".join(line for line in err.splitlines() if "error" in line.lower())[-1500:])
    assert code != 0, "two ranks on one GPU should fail"
    assert took < 120, took


if __name__ == "__main__":
    skip_without_gpu()
    with tempfile.TemporaryDirectory(prefix="gs_gpu_") as tmp:
        globals()["case_" + CASE](tmp)
    print(f"{CASE}: ok")
