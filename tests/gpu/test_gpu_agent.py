#!/usr/bin/env python3
"""Whole-process GPU tests of the agent: gradsync-run with --device cuda and
the nccl backend, checked against the cpu device. They need a GPU and a
CUDA build; without either they exit 77 (ctest's skip code) with the reason.

The ranks_* cases run 2 ranks on GPU 0 with the nccl backend: gradsync-run
starts them through tests/gpu/one_gpu_ranks.sh (--agent-bin), which gives
each rank a NCCL_HOSTID of its own so NCCL talks between them over loopback
sockets as between hosts.

usage: test_gpu_agent.py CASE BIN_DIR [DATA_DIR]
cases: parity, nccl1, training, duplicate_gpu, ranks_equivalence, ranks_sharded, ranks_checkpoint, ranks_control, ranks_sigterm, ranks_validate, ranks_kill, ranks_stop, ranks_accuracy, ranks_elastic
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checkpoints import newest_checkpoint, params_of, read_checkpoint, rel_error  # noqa: E402
from agentlib import check_control, check_sigterm  # noqa: E402

CASE, BIN_DIR = sys.argv[1], sys.argv[2]
DATA = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
RUN = os.path.join(BIN_DIR, "gradsync-run")
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
COORD = os.path.join(BIN_DIR, "gradsync-coordinator")
ONE_GPU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_gpu_ranks.sh")
RANKS = ["--agent-bin", ONE_GPU, "--reduce", "mean"]  # 2 ranks on GPU 0 (see above)
FAST = ["--no-validate", "--log-interval", "200ms"]
SKIP = 77
os.environ["GS_AGENT_BIN"] = AGENT  # for one_gpu_ranks.sh


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
    assert code != 0, "two ranks on one GPU should fail"  # not hang: run()'s timeout decides


def ranks_to_checkpoint(tmp, name, nproc, steps, extra):
    d = os.path.join(tmp, name)
    agent = RANKS if nproc > 1 else ["--device", "cuda", "--backend", "nccl"]
    run(["--nproc", str(nproc), "--steps", str(steps), "--checkpoint-dir", d,
         "--checkpoint-every", str(steps)] + FAST + agent + extra)
    ck = read_checkpoint(newest_checkpoint(d))
    assert ck["step"] == steps, ck["step"]
    return ck


def case_ranks_equivalence(tmp):
    """2 ranks on one GPU with mean and batch b equal 1 rank with batch 2b
    (params within 1e-5 relative)."""
    common = ["--no-shuffle", "--seed", "3", "--lr", "0.1"]
    two = ranks_to_checkpoint(tmp, "two", 2, 30, common + ["--batch", "16"])
    one = ranks_to_checkpoint(tmp, "one", 1, 30, common + ["--batch", "32"])
    init = ranks_to_checkpoint(tmp, "init", 1, 1, common + ["--batch", "32", "--lr", "0"])
    err = rel_error(params_of(two), params_of(one))
    moved = rel_error(params_of(one), params_of(init))
    print(f"nccl, one GPU: mean(2 x 16) vs 1 x 32 after 30 steps: params relative error "
          f"{err:.2e}; params moved {moved:.2e}")
    assert moved > 1e-2, "training did not move the params; the comparison would be empty"
    assert err < 1e-5, err


def case_ranks_sharded(tmp):
    """2 ranks on one GPU with AdamW, --shard-optimizer against unsharded
    (ncclReduceScatter and ncclAllGather, the packs padded for NCCL's
    equal pieces): after 30 steps the params and both moments (the
    sharded checkpoint assembled from the shards) within 1e-5 relative,
    and half the state on rank 0."""
    common = ["--no-shuffle", "--seed", "3", "--optimizer", "adamw", "--lr", "0.001"]
    cks, states = {}, {}
    for name, extra in (("plain", []), ("sharded", ["--shard-optimizer"])):
        d = os.path.join(tmp, name)
        _, out, _, _ = run(["--nproc", "2", "--steps", "30", "--checkpoint-dir", d,
                            "--checkpoint-every", "30"] + FAST + RANKS + common + extra)
        states[name] = float(re.search(r"optimizer state: ([\d.]+) MiB", out).group(1))
        cks[name] = read_checkpoint(newest_checkpoint(d))
    a, b = cks["plain"]["bufs"], cks["sharded"]["bufs"]
    assert len(a) == len(b), (len(a), len(b))
    err = max(rel_error(x, y) for x, y in zip(b, a))
    print(f"nccl, 2 ranks on one GPU, AdamW: sharded vs unsharded after 30 steps: params and "
          f"moments relative error {err:.2e}; state on rank 0 {states['sharded']:.2f} MiB "
          f"against {states['plain']:.2f}")
    assert err < 1e-5, err
    assert states["sharded"] <= states["plain"] / 2 + 0.01, states


def case_ranks_checkpoint(tmp):
    """2 ranks with a broadcast every 7 steps and checkpoints: resuming at
    step 20 ends at step 40 with bit-identical params and momentum."""
    args = ["--nproc", "2", "--steps", "40", "--checkpoint-every", "20", "--checkpoint-keep",
            "5", "--bcast-period", "7"] + FAST + RANKS
    full = os.path.join(tmp, "full")
    _, out, err, _ = run(args + ["--checkpoint-dir", full])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(full, "ckpt-*.gsck")))
    assert names == ["ckpt-000000000020.gsck", "ckpt-000000000040.gsck"], names
    want = read_checkpoint(os.path.join(full, names[1]))
    part = os.path.join(tmp, "part")
    os.mkdir(part)
    shutil.copy(os.path.join(full, names[0]), part)
    _, out, _, _ = run(args + ["--checkpoint-dir", part, "--resume"])
    assert "resumed at step 20" in out, out
    got = read_checkpoint(os.path.join(part, names[1]))
    if got["bufs"] != want["bufs"]:
        sys.exit("resumed run ended with different params or momentum: relative error "
                 f"{rel_error(params_of(got), params_of(want)):.2e}")
    print("nccl, 2 ranks on one GPU, broadcast every 7 steps: resume from step 20 gives "
          "bit-identical params and momentum at step 40")


def start_launcher(args):
    """gradsync-run in the background; returns (process, status URL, lines read)."""
    p = subprocess.Popen([RUN, "--data", DATA] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines = []
    while True:
        line = p.stdout.readline()
        assert line, "launcher ended early:\n" + "".join(lines)
        lines.append(line)
        m = re.search(r"status at (http://\S+)/status", line)
        if m:
            return p, m.group(1), lines



def case_ranks_control(tmp):
    """A new period and a stop posted to the coordinator act on both ranks at one step."""
    p, url, lines = start_launcher(["--nproc", "2", "--job", "ctl", "--steps", "10000000"] +
                                   FAST + RANKS)
    period_step, stop_step = check_control(p, url, lines, timeout=120)
    print(f"nccl, 2 ranks: period changed at step {period_step} on both; stopped after step "
          f"{stop_step}")


def case_ranks_sigterm(tmp):
    """SIGTERM to the launcher stops both ranks at one step, with a checkpoint there."""
    d = os.path.join(tmp, "ck")
    p, url, lines = start_launcher(["--nproc", "2", "--steps", "10000000", "--checkpoint-dir",
                                    d] + FAST + RANKS)
    stop_step = check_sigterm(p, lines, d, timeout=120)
    print(f"nccl, 2 ranks: stopped after step {stop_step} with a checkpoint there")


def case_ranks_validate(tmp):
    """Validation sums its counts over the ranks (an allreduce on the nccl
    path): the final accuracy is reported and sensible."""
    # 2 x 64 a step: step 469 ends epoch 1 (its validation), 500 the run (the final one).
    _, out, _, took = run(["--nproc", "2", "--steps", "500", "--batch", "64", "--lr", "0.1",
                           "--log-interval", "5s"] + RANKS)
    assert re.search(r"epoch 1 validation: accuracy", out), out[-3000:]
    m = re.search(r"final: test accuracy ([\d.]+)", out)
    assert m, out[-3000:]
    acc = float(m.group(1))
    print(f"nccl, 2 ranks on one GPU, 500 steps: test accuracy {acc:.4f} in {took:.1f} s")
    assert acc >= 0.7, acc


def start_ranks(job, coord_args, agent_args, world="2", n=2, stderr=subprocess.PIPE,
                length=("--steps", "10000000")):
    """A coordinator and n agents through one_gpu_ranks.sh, started by hand
    (so one can be signalled); returns (coordinator, agents)."""
    coord = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--log-level", "warn"] + coord_args, stdout=subprocess.PIPE,
                             text=True)
    rpc = re.search(r"rpc=(\S+)", coord.stdout.readline()).group(1)
    agents = [subprocess.Popen([ONE_GPU, "--coordinator", rpc, "--job", job, "--world-size",
                                world, "--local-rank", str(i), "--reduce", "mean",
                                "--log-interval", "200ms", "--data", DATA, *length] +
                               agent_args,
                               env=dict(os.environ, LOCAL_RANK=str(i)),
                               stdout=subprocess.PIPE, stderr=stderr, text=True)
              for i in range(n)]
    return coord, agents


def lose_rank_1(job, sig, coord_args, agent_args):
    """Signals rank 1 once rank 0 trains; returns (rank 0's exit, stderr, seconds)."""
    coord, agents = start_ranks(job, coord_args, agent_args)
    try:
        for _ in range(1000):  # NCCL_DEBUG may print first
            line = agents[0].stdout.readline()
            if not line or line.startswith("step"):
                break
        assert line.startswith("step"), "rank 0 did not train:\n" + agents[0].stderr.read()[-3000:]
        agents[1].send_signal(sig)
        t0 = time.time()
        _, err = agents[0].communicate(timeout=120)
        took = time.time() - t0
    finally:
        for a in agents:
            a.kill()
        coord.kill()
    print(f"rank 0 exited {agents[0].returncode} {took:.1f} s after signal {int(sig)} to "
          f"rank 1:\n{err[-800:]}")
    return agents[0].returncode, err, took


def case_ranks_kill(tmp):
    """kill -9 of rank 1: rank 0 ends with a clear error (not hangs: the wait's
    timeout decides; how soon is bench/reaction.py's kill row, on CPU)."""
    code, err, took = lose_rank_1("kill", signal.SIGKILL, ["--heartbeat-timeout", "5s"], [])
    assert code == 1, code
    assert "error:" in err and "failed" in err, err


def case_ranks_accuracy(tmp):
    """2 and 4 ranks on one GPU, global batch 128 (mean), 2 epochs: the test
    accuracy of the 1-rank CPU training test (0.83)."""
    for n in (2, 4):
        _, out, _, took = run(["--nproc", str(n), "--epochs", "2", "--batch", str(128 // n),
                               "--log-interval", "5s"] + RANKS)
        m = re.search(r"final: test accuracy ([\d.]+)", out)
        assert m, out[-3000:]
        acc = float(m.group(1))
        print(f"nccl, {n} ranks on one GPU, {n} x {128 // n} a step, 2 epochs: test accuracy "
              f"{acc:.4f} in {took:.1f} s")
        assert acc >= 0.83, (n, acc)


def timed_lines(p, into):
    """Appends (monotonic time, line) for each line of p.stdout, in a thread."""
    def read():
        for line in p.stdout:
            into.append((time.monotonic(), line))
    th = threading.Thread(target=read, daemon=True)
    th.start()
    return th


def case_ranks_elastic(tmp):
    """An elastic job (--world-size 2:3) of 3 ranks on NCCL: rank 2 killed
    (-9) while they train; ranks 0 and 1 abort the communicator, make a new
    one for generation 1 and finish the run. Prints the time from the kill
    to the regroup line (when the next step starts) and its detect/regroup
    parts, and the final accuracy."""
    coord, agents = start_ranks("elastic", ["--heartbeat-timeout", "10s"],
                                ["--batch", "64", "--lr", "0.05"], world="2:3", n=3,
                                stderr=subprocess.STDOUT, length=("--epochs", "2"))
    lines = [[] for _ in agents]
    readers = [timed_lines(a, into) for a, into in zip(agents, lines)]
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("step") for _, line in lines[0]):
            assert agents[0].poll() is None and time.monotonic() < deadline, \
                "rank 0 did not train:\n" + "".join(line for _, line in lines[0])[-3000:]
            time.sleep(0.05)
        t_kill = time.monotonic()
        agents[2].kill()
        codes = [agents[i].wait(timeout=300) for i in (0, 1)]
        for r in readers:
            r.join(timeout=10)
        text = "".join(line for _, line in lines[0])
        assert codes == [0, 0], f"exits {codes}:\n{text[-4000:]}"
        regroup = [(t, line) for t, line in lines[0] if "continuing with" in line]
        assert regroup, "no regroup line:\n" + text[-4000:]
        t, line = regroup[0]
        m = re.search(r"continuing with (\d+) ranks from step (\d+) \(detect ([0-9.]+) s, "
                      r"regroup ([0-9.]+) s\)", line)
        assert m and m.group(1) == "2", line
        acc = float(re.search(r"final: test accuracy ([\d.]+)", text).group(1))
        print(f"nccl, 3 ranks on one GPU, rank 2 killed (-9): kill to the new generation's "
              f"first step {t - t_kill:.2f} s (detect {m.group(3)} s, regroup {m.group(4)} s); "
              f"2 ranks finished from step {m.group(2)}, test accuracy {acc:.4f}")
        print(line.strip())
        assert acc >= 0.80, acc
    finally:
        for a in agents:
            a.kill()
        coord.kill()


def case_ranks_stop(tmp):
    """SIGSTOP of rank 1 (the coordinator still counts it alive for 60 s):
    rank 0 ends at the comm timeout (8 s), with an error that says so; not
    before it (its last progress may precede the signal by a moment)."""
    code, err, took = lose_rank_1("stop", signal.SIGSTOP, ["--heartbeat-timeout", "60s"],
                                  ["--comm-timeout", "8s"])
    assert code == 1, code
    assert took >= 7.5, took
    assert "did not complete within 8000 ms" in err, err


if __name__ == "__main__":
    skip_without_gpu()
    with tempfile.TemporaryDirectory(prefix="gs_gpu_") as tmp:
        globals()["case_" + CASE](tmp)
    print(f"{CASE}: ok")
