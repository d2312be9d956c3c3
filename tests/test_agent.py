#!/usr/bin/env python3
"""Whole-process tests of the agent: gradsync-run, gradsync-agent and
gradsync-coordinator training the reference MLP on Fashion-MNIST over
loopback. Checkpoints are read with the format of docs/checkpoint.md, so
these tests also hold that document to the code.

usage: test_agent.py CASE BIN_DIR COORDINATOR_BIN
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import newest_checkpoint, params_of, read_checkpoint, rel_error  # noqa: E402
from agentlib import check_control, check_sigterm, node_address, wait_for  # noqa: E402
from testlib import WAIT, Lines, free_port, wait_until  # noqa: E402

CASE, BIN_DIR, COORD = sys.argv[1], sys.argv[2], sys.argv[3]
RUN = os.path.join(BIN_DIR, "gradsync-run")
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
FAST = ["--no-validate", "--log-interval", "200ms"]


def run(args, timeout=240, check=True):
    """Runs gradsync-run with args; returns (exit code, stdout, stderr)."""
    p = subprocess.run([RUN] + args, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        sys.exit(f"gradsync-run {' '.join(args)} exited {p.returncode}\n"
                 f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def train_to_checkpoint(tmp, name, nproc, steps, extra):
    d = os.path.join(tmp, name)
    run(["--nproc", str(nproc), "--steps", str(steps), "--checkpoint-dir", d,
         "--checkpoint-every", str(steps)] + FAST + extra)
    ck = read_checkpoint(newest_checkpoint(d))
    assert ck["step"] == steps, ck["step"]
    return ck


def case_equivalence(tmp):
    """World 2 with mean and batch b equals world 1 with batch 2b; sum with
    LR / 2 (and twice the decay, which sum does not scale) equals mean; and
    with --optimizer adamw."""
    common = ["--no-shuffle", "--seed", "3", "--lr", "0.1"]
    two = train_to_checkpoint(tmp, "two", 2, 30, common + ["--reduce", "mean", "--batch", "16"])
    one = train_to_checkpoint(tmp, "one", 1, 30, common + ["--batch", "32"])
    s = train_to_checkpoint(tmp, "sum", 2, 30, common + [
        "--reduce", "sum", "--batch", "16", "--lr", "0.05", "--weight-decay", "1e-3"])  # last --lr wins
    init = train_to_checkpoint(tmp, "init", 1, 1, common + ["--batch", "32", "--lr", "0"])
    e1 = rel_error(params_of(two), params_of(one))
    e2 = rel_error(params_of(s), params_of(two))
    moved = rel_error(params_of(one), params_of(init))
    print(f"mean(2 x 16) vs 1 x 32: relative error {e1:.2e}")
    print(f"sum(lr/2) vs mean:      relative error {e2:.2e}")
    print(f"params moved by training: {moved:.2e} (relative)")
    assert moved > 1e-2, "training did not change the params; the comparison would be empty"
    assert e1 < 1e-5, e1
    assert e2 < 1e-5, e2
    # --optimizer adamw: the same equivalence; the checkpoint holds params
    # and both moments of each pack. (At lr 0.01 with this decay the two
    # runs part at step 15, 4.8e-6 to 4.8e-5, and the sums' last-bit
    # differences then grow to 1e-2 by step 30; both runs are
    # deterministic, and torch_optimizers holds the arithmetic to torch's.
    # At 0.001 they stay near 1e-6.)
    adam = ["--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "0.1"]
    a2 = train_to_checkpoint(tmp, "adam2", 2, 30, common + adam + ["--reduce", "mean",
                                                                   "--batch", "16"])
    a1 = train_to_checkpoint(tmp, "adam1", 1, 30, common + adam + ["--batch", "32"])
    assert len(a2["bufs"]) == 3 * (len(two["bufs"]) // 2), len(a2["bufs"])
    e3 = rel_error(params_of(a2, 3), params_of(a1, 3))
    moved = rel_error(params_of(a1, 3), params_of(init))
    print(f"adamw mean(2 x 16) vs 1 x 32: relative error {e3:.2e} (moved {moved:.2e})")
    assert moved > 1e-2 and e3 < 1e-5, (moved, e3)


def case_checkpoint(tmp):
    """Resume gives bit-identical params; a corrupt newest checkpoint is refused."""
    full = os.path.join(tmp, "full")
    args = ["--nproc", "2", "--reduce", "mean", "--steps", "40", "--checkpoint-every", "20",
            "--checkpoint-keep", "5"] + FAST
    run(args + ["--checkpoint-dir", full])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(full, "ckpt-*.gsck")))
    assert names == ["ckpt-000000000020.gsck", "ckpt-000000000040.gsck"], names
    want = read_checkpoint(os.path.join(full, names[1]))

    part = os.path.join(tmp, "part")
    os.mkdir(part)
    shutil.copy(os.path.join(full, names[0]), part)
    _, out, _ = run(args + ["--checkpoint-dir", part, "--resume"])
    assert "resumed at step 20" in out, out
    got = read_checkpoint(os.path.join(part, names[1]))
    assert got["bufs"] == want["bufs"], "resumed run ended with different params or momentum"
    print("resume from step 20: params and momentum at step 40 bit-identical")

    bad = os.path.join(tmp, "bad")
    shutil.copytree(full, bad)
    path = os.path.join(bad, names[1])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    _, out, err = run(args + ["--checkpoint-dir", bad, "--resume", "--steps", "41"])
    assert "resumed at step 20" in out, out
    assert names[1] in err and "skipped" in err, err
    print("a corrupt newest checkpoint was skipped with a warning")


DOC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
FASHION = "/usr/share/datasets/fashion-mnist"


def doc_reader():
    """The namespace made by running the Python block of docs/model-format.md."""
    with open(os.path.join(DOC_DIR, "model-format.md")) as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    assert len(blocks) == 1, f"expected one python block in docs/model-format.md, got {len(blocks)}"
    ns = {}
    exec(compile(blocks[0], "docs/model-format.md", "exec"), ns)
    return ns


def fashion_test_split():
    """t10k images (n x 784, scaled to [0, 1]) and labels, read independently of the agent."""
    import gzip
    import numpy as np
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x.astype(np.float32) / 255.0, y


def case_model(tmp):
    """A finished run keeps its model: the last step is checkpointed even off
    the --checkpoint-every grid, and --save-model writes a file that the
    reader of docs/model-format.md loads into an nn.Sequential whose test
    accuracy is the one the agent reported."""
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as e:
        print(f"skipped: {e} (Debian's python3-numpy and python3-torch)")
        sys.exit(77)
    d, path = os.path.join(tmp, "ck"), os.path.join(tmp, "model.safetensors")
    _, out, _ = run(["--nproc", "2", "--reduce", "mean", "--steps", "25", "--layers",
                     "784,64,32,10", "--checkpoint-dir", d, "--checkpoint-every", "10",
                     "--save-model", path] + FAST)
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "ckpt-*.gsck")))
    assert names[-1] == "ckpt-000000000025.gsck", names
    reported = float(re.search(r"final: test accuracy ([0-9.]+)", out).group(1))
    reader = doc_reader()
    tensors, meta = reader["load_model_file"](path)
    assert meta["gradsync.layers"] == "784,64,32,10" and meta["gradsync.step"] == "25", meta
    assert {k: v.shape for k, v in tensors.items()} == {
        "0.weight": (64, 784), "0.bias": (64,), "2.weight": (32, 64), "2.bias": (32,),
        "4.weight": (10, 32), "4.bias": (10,)}, tensors.keys()
    model = reader["to_torch"](tensors, meta)
    x, y = fashion_test_split()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    acc = float((pred == y).mean())
    print(f"agent reported test accuracy {reported:.4f}; the torch model from the file: {acc:.4f}")
    assert reported > 0.3, "training did not train: the comparison would say little"
    assert abs(acc - reported) <= 0.002, (acc, reported)


def case_resume(tmp):
    """--resume with no valid checkpoint is an error, --resume=auto starts
    fresh and says so, a checkpoint of other --layers is an error naming
    both layouts (with =auto too), and one written at another world size
    resumes with a warning naming both sizes."""
    d = os.path.join(tmp, "ck")
    os.mkdir(d)
    args = ["--nproc", "1", "--steps", "5", "--checkpoint-dir", d] + FAST
    code, out, err = run(args + ["--resume"], check=False)
    assert code != 0 and f"--resume: {d}: no checkpoint files" in err, err
    assert "--resume=auto starts fresh" in err and "final:" not in out, err
    print("--resume, none there:", re.search(r"error: (.*)", err).group(1))
    _, out, err = run(args + ["--resume=auto", "--layers", "784,32,10"])
    assert "--resume=auto: " in err and "starting fresh" in err, err
    assert "final:" in out and "resumed at" not in out, out
    assert os.path.exists(os.path.join(d, "ckpt-000000000005.gsck")), os.listdir(d)
    print("--resume=auto, none there: started fresh")
    for mode in ("--resume", "--resume=auto"):
        code, out, err = run(args + [mode, "--layers", "784,64,10", "--steps", "6"], check=False)
        assert code != 0, (code, err)
        assert ("another model: the checkpoint has layers 784,32,10, the model has layers "
                "784,64,10") in err, err
        assert "final:" not in out, out
    print("other --layers:", re.search(r"error: (.*)", err).group(1)[:160])
    _, out, err = run(args + ["--resume", "--layers", "784,32,10", "--steps", "8"])
    assert "resumed at step 5" in out, out
    assert "was written at world size" not in err, err
    # Another world size: allowed, with a warning naming both sizes.
    _, out, err = run(["--nproc", "2", "--steps", "10", "--checkpoint-dir", d, "--resume",
                       "--layers", "784,32,10", "--reduce", "mean"] + FAST)
    assert "resumed at step 8" in out, out
    want = "ckpt-000000000008.gsck was written at world size 1, resuming at world size 2"
    assert want in err + out, err
    ck = read_checkpoint(newest_checkpoint(d))
    assert ck["step"] == 10 and ck["world_size"] == 2, (ck["step"], ck["world_size"])
    print("other world size:", re.search(r"WARN .*(ckpt-\S+ was written at .*)", err + out).group(1))


def case_ckptdir(tmp):
    """An unusable --checkpoint-dir is an error before the rendezvous (here
    no coordinator even listens), naming the directory and the failing
    call; a usable one is created before it."""
    blocker = os.path.join(tmp, "file")
    open(blocker, "w").close()
    for d, why in ((os.path.join(blocker, "ck"), "mkdir: Not a directory"),
                   (blocker, "not a directory")):
        # Before the rendezvous: it never says it is joining (the join, to
        # a port nobody serves, would take its 5 minutes' --join-timeout).
        p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "2",
                            "--reduce", "mean", "--checkpoint-dir", d, "--steps", "5"] + FAST,
                           capture_output=True, text=True, timeout=WAIT)
        assert p.returncode == 1, (p.returncode, p.stderr)
        assert f"checkpoint directory {d} is not usable" in p.stderr and why in p.stderr, p.stderr
        assert "joining" not in p.stderr, p.stderr
        print(f"{d}: refused: {p.stderr.strip().splitlines()[-1]}")
    # --save-model into a folder that is not there: refused at start too.
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1",
                        "--save-model", os.path.join(tmp, "nowhere", "m.safetensors")] + FAST,
                       capture_output=True, text=True, timeout=WAIT)
    assert p.returncode == 1 and "nowhere does not exist" in p.stderr, p.stderr
    assert "joining" not in p.stderr, p.stderr
    ok = os.path.join(tmp, "new", "ck")
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1",
                        "--checkpoint-dir", ok, "--steps", "5", "--join-timeout", "300ms",
                        "--rpc-timeout", "300ms"] + FAST, capture_output=True, text=True,
                       timeout=WAIT)
    assert p.returncode == 1 and "not usable" not in p.stderr, p.stderr
    assert os.path.isdir(ok) and os.listdir(ok) == [], os.listdir(ok)


def mount_tmpfs(d, size):
    """A tmpfs of `size` at d (root only: else the case is skipped)."""
    os.makedirs(d, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(f"skipped: cannot mount a tmpfs ({p.stderr.strip() or 'not root'})")
        sys.exit(77)


def fill(d, leave):
    """A file in d that leaves about `leave` bytes free there."""
    st = os.statvfs(d)
    with open(os.path.join(d, "filler"), "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - leave))


def case_ckptfail(tmp):
    """A checkpoint directory whose disk fills up mid-run (a tmpfs of 640
    KiB; a checkpoint of --layers 784,32,10 is 204 KB): each failed write is
    a warning and training goes on; once space is freed the next checkpoint
    is written and the run ends well. A disk that stays full ends the job at
    the --checkpoint-failures-th failure in a row, the older checkpoint
    intact."""
    d = os.path.join(tmp, "ck")
    mount_tmpfs(d, "640k")
    args = ["--nproc", "1", "--steps", "1000000", "--layers", "784,32,10", "--checkpoint-dir", d,
            "--checkpoint-every", "20"] + FAST
    try:
        fill(d, 300 << 10)  # room for one checkpoint
        code, out, err = run(args + ["--checkpoint-failures", "3"], check=False)
        text = out + err
        assert code != 0, text[-3000:]
        for k in (1, 2):
            assert re.search(rf"checkpoint at step {20 + 20 * k} failed \({k} of 3 allowed in a "
                             r"row; training goes on.*No space left on device", text), text[-3000:]
        assert re.search(r"checkpoint at step 80 failed, 3 in a row: .*No space left", text), \
            text[-3000:]
        assert sorted(os.listdir(d)) == ["ckpt-000000000020.gsck", "filler"], os.listdir(d)
        assert read_checkpoint(os.path.join(d, "ckpt-000000000020.gsck"))["step"] == 20
        print("disk stays full:", re.search(r"error: (.*)", text).group(1)[:200])

        os.unlink(os.path.join(d, "ckpt-000000000020.gsck"))
        # One checkpoint kept: with the default 3 the disk (640 KiB, 204 KB a
        # checkpoint) is full again once two more are written, and whether
        # the stop's checkpoint fits then depends on when SIGTERM lands.
        p, _, lines = start_launcher(args + ["--checkpoint-failures", "1000000",
                                             "--checkpoint-keep", "1"])
        try:
            m = wait_for(p, lines, r"checkpoint at step (\d+) failed \(1 of 1000000")
            os.unlink(os.path.join(d, "filler"))
            after = wait_for(p, lines, r"checkpoint: step (\d+) -> ")
            assert int(after.group(1)) > int(m.group(1)), (after.group(0), m.group(0))
            p.send_signal(signal.SIGTERM)
            lines.append(p.stdout.read())
            p.wait(timeout=WAIT)
        finally:
            p.kill()
        text = "".join(lines)
        stop = re.search(r"stopped after step (\d+): SIGTERM received", text)
        assert stop and "final:" in text and "rank 0 exited" not in text, text[-3000:]
        assert read_checkpoint(newest_checkpoint(d))["step"] == int(stop.group(1)), \
            (os.listdir(d), stop.group(0))
        assert not [f for f in os.listdir(d) if f.endswith(".tmp")], os.listdir(d)
        print(f"disk full at step {m.group(1)}, freed: checkpoint of step {after.group(1)}, "
              f"stopped at {stop.group(1)} with its checkpoint")
    finally:
        subprocess.run(["umount", "-l", d])


def children(launcher_pid):
    """The children of a gradsync-run: {pid: argv}."""
    out = []
    for task in os.listdir(f"/proc/{launcher_pid}/task"):
        with open(f"/proc/{launcher_pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    argvs = {}
    for c in out:
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                argvs[c] = [a.decode() for a in f.read().split(b"\0")[:-1]]
        except FileNotFoundError:
            pass
    return argvs


def agent_pids(launcher_pid, local_rank=None):
    """The gradsync-agent children of a gradsync-run (of one local rank)."""
    return [pid for pid, argv in children(launcher_pid).items()
            if argv and "gradsync-agent" in argv[0] and
            (local_rank is None or f"--local-rank\0{local_rank}\0" in "\0".join(argv) + "\0")]


def case_shmkill(tmp):
    """kill -9 of both agents of a one-machine job while their ring and its
    shared-memory pipes form (a few milliseconds after rank 0 joined),
    again and again: nothing of theirs is left in /dev/shm (named segments
    there leaked in 3 of 6 such kills; the pipes are memfds now)."""
    import random
    rng = random.Random(15)
    for i in range(6):
        p = subprocess.Popen([RUN, "--nproc", "2", "--steps", "100000", "--reduce", "mean",
                              "--job", f"shmkill{i}"] + FAST,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        try:
            wait_for(p, lines, r"\[rank [01]\].*joined generation")
            pids = agent_pids(p.pid)
            assert len(pids) == 2, (pids, "".join(lines))
            time.sleep(rng.uniform(0, 0.004))
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            p.communicate(timeout=WAIT)
        finally:
            p.kill()
            p.wait()
        left = [n for n in os.listdir("/dev/shm") for pid in pids if f"-{pid}-" in n]
        assert not left, f"round {i}: left in /dev/shm: {left}"
    print("6 kills during pipe setup: nothing left in /dev/shm")


def flag_names(binary):
    """The flags of a binary's table, from its --help-markdown."""
    out = subprocess.run([binary, "--help-markdown"], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"^\| `(--[a-z0-9-]+)", out, re.M))


def case_coordinator_flags(tmp):
    """gradsync-run takes gradsync-coordinator's flags, by the coordinator's
    own table: before "--" they reach the coordinator it starts (its
    command line; a limit it then enforces; --log-level, which the agents
    have too, quiets both); a bad value, a flag it sets itself, TLS, one
    with --coordinator (no coordinator started) or one after "--" among
    the agents' arguments is refused before anything starts, saying whose
    flag it is and where it goes."""
    env = clean_env()
    coord = os.path.join(BIN_DIR, "gradsync-coordinator")
    p = subprocess.run([RUN, "--help"], capture_output=True, text=True, check=True)
    assert "Coordinator flags" in p.stdout and "--stall-timeout" in p.stdout, p.stdout
    # The brief's example: a command's ranks, the coordinator's flag.
    done = os.path.join(tmp, "done")
    p = subprocess.Popen([RUN, "--nproc", "2", "--stall-timeout", "2m", "--", "sh", "-c",
                          f"echo up; while [ ! -e {done} ]; do sleep 0.05; done"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = Lines(p.stdout, "gradsync-run")
    try:
        out.wait(r"\[rank 0\] up")  # in either order: each wait looks at every line read
        out.wait(r"\[rank 1\] up")
        argvs = children(p.pid).values()
        [c] = [a for a in argvs if a and a[0].endswith("gradsync-coordinator")]
        assert c[c.index("--stall-timeout") + 1] == "2m", c
        ranks = [a for a in argvs if a and a[0] == "sh"]
        assert len(ranks) == 2 and all("--stall-timeout" not in a for a in ranks), argvs
        open(done, "w").close()
        assert p.wait(WAIT) == 0, out.close()
    finally:
        p.kill()
        p.wait()
    print("--stall-timeout 2m before \"--\": on the coordinator's command line, not the ranks'")
    # A limit the coordinator then enforces; agent flags around it go on
    # to the agents.
    code, _, err = run(["--nproc", "1", "--max-params", "3", "--steps", "5"] + FAST, check=False)
    assert code == 1 and "more than 3: raise the coordinator's --max-params" in err, err
    code, out, err = run(["--nproc", "1", "--log-level", "warn", "--steps", "5"] + FAST)
    assert " INFO " not in out + err, out + err
    for dashes in (["--"], []):  # before a command it is the coordinator's alone
        code, out, err = run(["--nproc", "1", "--log-level", "warn"] + dashes +
                             ["sh", "-c", "echo ran the command"])
        assert "ran the command" in out and " INFO " not in out + err, out + err
    print("--max-params 3: the coordinator refused the 6-entry pack list; --log-level warn "
          "quiets coordinator and agents, and before a command the coordinator")
    for args, text in [
            (["--stall-timeout", "soon"], "invalid value 'soon' for --stall-timeout"),
            (["--max-params"], "--max-params needs a value"),
            (["--listen", ":7070"], "--listen of gradsync-coordinator is set by gradsync-run"),
            (["--max-world-size", "9"], "--max-world-size of gradsync-coordinator is set by"),
            (["--tls-client-ca", "ca.pem"], "starts listens on loopback without TLS"),
            (["--coordinator", "h:1", "--stall-timeout", "2m"],
             "--stall-timeout is a flag of gradsync-coordinator, and with --coordinator h:1 "
             "gradsync-run starts no coordinator"),
            (["--", "--stall-timeout", "2m"],
             "--stall-timeout is a flag of gradsync-coordinator, not of gradsync-agent: put it "
             "before \"--\""),
            (["--coordinator", "h:1", "--", "--max-frame", "1MiB"],
             "--max-frame is a flag of gradsync-coordinator, not of gradsync-agent; with "
             "--coordinator h:1 gradsync-run starts no coordinator")]:
        p = subprocess.run([RUN, "--nproc", "1"] + args, capture_output=True, text=True,
                           timeout=30, env=env)
        assert p.returncode == 2 and text in p.stderr, (args, p)
        assert "[coordinator]" not in p.stdout + p.stderr, (args, p)
    # A command's own arguments are its own, flags or not.
    code, out, _ = run(["--nproc", "1", "--print-config", "python3", "train.py", "--stall-timeout",
                        "1s"])
    assert "runs: python3" in out and "coordinator flags" not in out, out
    # Every flag of the coordinator: one the agents have too stays theirs
    # (the launcher's list of them matches both tables), any other is the
    # coordinator's; gradsync-run's own (--http, --token) aside.
    ours, agents = flag_names(RUN), flag_names(AGENT)
    for name in sorted(flag_names(coord) - ours):
        for args in (["--coordinator", "127.0.0.1:1", name, "1", "--print-config"],
                     ["--print-config", "--", name, "1"]):
            p = subprocess.run([RUN, "--nproc", "1"] + args, capture_output=True, text=True,
                               timeout=30, env=env)
            if name in agents and name.startswith("--tls-") and "--" in args:
                # The agents' TLS flags against the coordinator it starts.
                assert p.returncode == 2 and "without TLS" in p.stderr, (name, args, p)
            elif name in agents:
                assert p.returncode == 0, (name, args, p)
            else:
                assert p.returncode == 2 and f"{name} is a flag of gradsync-coordinator" in \
                    p.stderr, (name, args, p)
    print(f"{len(flag_names(coord) - ours)} coordinator flags: "
          f"{sorted((flag_names(coord) & agents) - ours)} stay the agents', the others are refused "
          "with --coordinator or after \"--\"")


def start_launcher(args):
    p = subprocess.Popen([RUN] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    status = None
    lines = []
    while status is None:
        line = p.stdout.readline()
        assert line, "launcher ended early:\n" + "".join(lines)
        lines.append(line)
        m = re.search(r"status at (http://\S+)/status", line)
        if m:
            status = m.group(1)
    return p, status, lines


def post_status(url, body):
    """POSTs `body` as JSON; (HTTP status, response body), errors included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def case_control(tmp):
    """A new period and a stop posted to the coordinator act on every rank at one step."""
    p, url, lines = start_launcher(["--nproc", "2", "--job", "ctl", "--reduce", "mean",
                                    "--steps", "10000000"] + FAST)
    try:
        # No --checkpoint-dir: a checkpoint request is refused, not queued for nobody.
        wait_for(p, lines, r"\[rank 0\] step \d+")
        code, body = post_status(url + "/jobs/ctl/control", {"action": "checkpoint"})
        assert code == 409 and "without a checkpoint directory" in body, (code, body)
        print(f"checkpoint request without a checkpoint dir: {code} {body.strip()}")
    except BaseException:
        p.kill()
        raise
    period_step, stop_step = check_control(p, url, lines)
    print(f"period changed at step {period_step} on both ranks; stopped after step {stop_step}")


def case_sigterm(tmp):
    """SIGTERM to the launcher stops every rank at one step, with a checkpoint there."""
    d = os.path.join(tmp, "ck")
    p, url, lines = start_launcher(["--nproc", "2", "--reduce", "mean", "--steps", "10000000",
                                    "--checkpoint-dir", d] + FAST)
    stop_step = check_sigterm(p, lines, d)
    print(f"stopped after step {stop_step} with a checkpoint there; launcher exit "
          f"{p.returncode}")


def case_training(tmp):
    """Two ranks reach >= 83% test accuracy on Fashion-MNIST within 2 epochs."""
    _, out, _ = run(["--nproc", "2", "--reduce", "mean", "--epochs", "2"], timeout=280)
    print(out[-600:])
    acc = float(re.search(r"final: test accuracy ([0-9.]+)", out).group(1))
    assert acc >= 0.83, acc


def case_kill(tmp):
    """kill -9 of one rank makes the other exit with a clear error at once,
    instead of hanging: the coordinator sees the rank's connection close
    and aborts the generation. The heartbeat timeout is far longer than the
    test waits, so that a failure noticed only by the silence would fail
    the test rather than pass slowly. How long it takes is bench/'s
    (bench/reaction.py)."""
    coord = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--heartbeat-timeout", "3600s", "--log-level", "warn"],
                             stdout=subprocess.PIPE, text=True)
    rpc = re.search(r"rpc=(\S+)", coord.stdout.readline()).group(1)
    agents = [subprocess.Popen([AGENT, "--coordinator", rpc, "--job", "kill", "--world-size", "2",
                                "--local-rank", str(i), "--reduce", "mean", "--steps", "10000000",
                                "--log-interval", "200ms"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    try:
        line = agents[0].stdout.readline()
        assert line.startswith("step"), line
        agents[1].send_signal(signal.SIGKILL)
        t0 = time.time()
        out, err = agents[0].communicate(timeout=WAIT)
        took = time.time() - t0
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.kill()
        coord.wait()
    print(f"rank 0 exited {agents[0].returncode} after {took:.1f}s:\n{err[-800:]}")
    assert agents[0].returncode == 1, agents[0].returncode
    assert "error:" in err and "failed" in err, err
    assert "lost: connection closed" in err, err


def start_listening(argv):
    """A coordinator started with argv, once it said it listens."""
    c = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = c.stdout.readline()
    assert "listening" in line, line
    return c


def case_outage(tmp):
    """The coordinator killed mid-training and back once the ranks found it
    unreachable for longer than its heartbeat timeout: the ranks train on,
    re-register, and finish with the accuracy of an uninterrupted run; the
    restarted coordinator keeps the broadcast period an operator set before
    the outage and shows rank 0's pack list again."""
    steps = ["--reduce", "mean", "--steps", "3000", "--no-validate", "--seed", "3"]
    _, out, _ = run(["--nproc", "2"] + steps)
    want = re.search(r"final: test accuracy ([\d.]+)", out).group(1)
    rpc, http = free_port(), free_port()
    argv = [COORD, "--listen", f"127.0.0.1:{rpc}", "--http", f"127.0.0.1:{http}",
            "--heartbeat-interval", "250ms", "--heartbeat-timeout", "3s", "--log-level", "warn"]
    coord = start_listening(argv)
    agents, outs = [], []
    # Rank 0 holds its last step until the restarted coordinator has the
    # job back (an event, not a time: 3000 steps take about as long here
    # as the ranks take to notice the outage; a fast machine trains them
    # all before).
    back = os.path.join(tmp, "coordinator-back")
    try:
        agents = [subprocess.Popen([AGENT, "--coordinator", f"127.0.0.1:{rpc}", "--job", "out",
                                    "--world-size", "2", "--local-rank", str(i),
                                    "--coordinator-grace", "600s", "--log-interval", "200ms",
                                    "--inject-fault", f"data-hang:0:2999:{back}"]
                                   + steps, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
                  for i in range(2)]
        outs = [(Lines(a.stdout, f"rank {i} stdout"), Lines(a.stderr, f"rank {i} stderr"))
                for i, a in enumerate(agents)]
        outs[0][0].wait(r"^step")
        url = f"http://127.0.0.1:{http}/jobs/out"
        req = urllib.request.Request(url + "/control", data=json.dumps({"bcast_period": 500})
                                     .encode(), method="POST")
        assert urllib.request.urlopen(req, timeout=WAIT).status == 200
        # Each rank takes the period at a step; a re-registration reports it from then on.
        for _, err in outs:
            err.wait(r"broadcast period set to 500")
        coord.kill()
        coord.wait()
        # Down until the ranks say so: past the heartbeat timeout, as they see it.
        for _, err in outs:
            err.wait(r"unreachable for [\d.]+ s; training goes on")
        coord = start_listening(argv)
        for _, err in outs:
            err.wait(r"re-registered with the coordinator")
        open(back, "w").close()
        for a in agents:
            a.wait(timeout=WAIT)
        outs = [(o.close(), e.close()) for o, e in outs]
        with urllib.request.urlopen(url, timeout=WAIT) as r:
            job = json.load(r)
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.kill()
        coord.wait()
    for a, (o, e) in zip(agents, outs):
        assert a.returncode == 0, (a.returncode, e[-3000:])
    got = re.search(r"final: test accuracy ([\d.]+)", outs[0][0]).group(1)
    assert got == want, (got, want)
    err = outs[0][1]
    assert "unreachable for" in err and "training goes on" in err, err[-3000:]
    assert "re-registered with the coordinator for generation 1 (broadcast period 500, lr scale " \
        "1)" in err, err[-3000:]
    assert job["state"] == "finished" and job["bcast_period"] == 500, job
    assert job["pack_list"] and job["pack_list"]["packs"] >= 1, job
    print(f"outage: ranks trained on and finished at accuracy {got} (uninterrupted: {want}); "
          f"period {job['bcast_period']} and the pack list kept")


def case_short_grace(tmp):
    """--coordinator-grace below the coordinator's heartbeat timeout: each
    rank says so once it joined (it waits the timeout instead); with the
    coordinator killed, the ranks stop saying the coordinator was
    unreachable, not that it aborted them."""
    rpc, http = free_port(), free_port()
    coord = start_listening([COORD, "--listen", f"127.0.0.1:{rpc}", "--http", f"127.0.0.1:{http}",
                             "--heartbeat-interval", "250ms", "--heartbeat-timeout", "3s",
                             "--log-level", "warn"])
    agents = []
    try:
        agents = [subprocess.Popen([AGENT, "--coordinator", f"127.0.0.1:{rpc}", "--job", "gr",
                                    "--world-size", "2", "--local-rank", str(i), "--steps",
                                    "1000000", "--reduce", "mean", "--coordinator-grace", "1s"] + FAST,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i in range(2)]
        outs = [Lines(a.stderr, f"rank {i} stderr") for i, a in enumerate(agents)]
        for err in outs:
            err.wait(r"--coordinator-grace 1\.0 s is below the coordinator's heartbeat timeout "
                     r"\(3\.0 s\): this rank waits 3\.0 s")
        steps = [Lines(a.stdout, f"rank {i} stdout") for i, a in enumerate(agents)]
        steps[0].wait(r"^step")
        coord.kill()
        coord.wait()
        codes = [a.wait(timeout=WAIT) for a in agents]
        texts = [err.close() for err in outs]
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.kill()
        coord.wait()
    for code, text in zip(codes, texts):
        assert code != 0, text[-3000:]
        error = re.search(r"error: (.*)", text)
        assert error, text[-3000:]
        assert "the coordinator aborted" not in error.group(1), error.group(1)
        assert re.search(r"this rank ended generation 1: coordinator unreachable for [\d.]+ s, "
                         r"longer than --coordinator-grace \(raised to the coordinator's "
                         r"heartbeat timeout\)", error.group(1)), error.group(1)
    print("short grace:", error.group(1)[:200])


def case_coordinator_stall(tmp):
    """A coordinator stopped (SIGSTOP) for twice its heartbeat timeout does
    not lose every rank when it runs again: the silence was its own. The
    stop is the test's own, 8 s; the timeout, 4 s with a heartbeat every
    250 ms, is one that a loaded machine does not reach by starving an
    agent (a 2 s timeout with heartbeats every second lost a rank there)."""
    coord = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--heartbeat-interval", "250ms", "--heartbeat-timeout", "4s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rpc = re.search(r"rpc=(\S+)", coord.stdout.readline()).group(1)
    # Rank 0 holds its last step until the coordinator has run again (an
    # event: the ranks train their 3000 steps within the stop).
    back = os.path.join(tmp, "coordinator-ran")
    agents = [subprocess.Popen([AGENT, "--coordinator", rpc, "--job", "stall", "--world-size", "2",
                                "--local-rank", str(i), "--reduce", "mean", "--steps", "3000",
                                "--no-validate", "--log-interval", "200ms",
                                "--inject-fault", f"data-hang:0:2999:{back}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    log = Lines(coord.stderr, "coordinator")
    try:
        outs = [(Lines(a.stdout, f"rank {i} stdout"), Lines(a.stderr, f"rank {i} stderr"))
                for i, a in enumerate(agents)]
        outs[0][0].wait(r"^step")
        coord.send_signal(signal.SIGSTOP)
        time.sleep(8)  # the stop itself, not a wait for something
        coord.send_signal(signal.SIGCONT)
        log.wait(r"the coordinator did not run for")
        open(back, "w").close()
        for a in agents:
            a.wait(timeout=WAIT)
        outs = [(o.close(), e.close()) for o, e in outs]
        coord.terminate()
        coord.wait(timeout=WAIT)
        log = log.close()
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.kill()
        coord.wait()
    for a, (_, e) in zip(agents, outs):
        assert a.returncode == 0, (a.returncode, e[-3000:])
    assert "the coordinator did not run for" in log, log[-3000:]
    assert "lost" not in log, log[-3000:]
    print("coordinator stopped 8 s (heartbeat timeout 4 s): no rank lost, the job finished")


def case_stall_at_end(tmp):
    """An elastic job whose ranks finish while the coordinator is stopped
    (SIGSTOP) is recorded finished once it runs again: each rank's last
    word, its Leave, waits for it as long as --coordinator-grace allows
    (issue 39: it waited 2 s, the ranks exited 0, and the coordinator,
    running again, found their connections closed and recorded the job
    failed). Its heartbeat connections, closed and redialled during the
    stop, no longer lose the ranks: just after its own stall the
    coordinator lets silence decide. The stop is the test's own: until the
    ranks say the coordinator is unreachable, then 4 s past the old 2 s
    Leave."""
    coord = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--heartbeat-interval", "250ms", "--heartbeat-timeout", "4s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = coord.stdout.readline()
    rpc = re.search(r"rpc=(\S+)", line).group(1)
    http = int(re.search(r"http=\S+:(\d+)", line).group(1))
    # Rank 0 holds its last step until the coordinator is stopped (an
    # event: a fast machine trains every step before the test stops it).
    back = os.path.join(tmp, "coordinator-stopped")
    agents = [subprocess.Popen([AGENT, "--coordinator", rpc, "--job", "end", "--world-size", "1:2",
                                "--local-rank", str(i), "--reduce", "mean", "--steps", "300",
                                "--no-validate", "--log-interval", "200ms",
                                "--inject-fault", f"data-hang:0:299:{back}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    log = Lines(coord.stderr, "coordinator")
    try:
        outs = [(Lines(a.stdout, f"rank {i} stdout"), Lines(a.stderr, f"rank {i} stderr"))
                for i, a in enumerate(agents)]
        outs[0][0].wait(r"^step")
        coord.send_signal(signal.SIGSTOP)
        # Stopped long enough that the ranks' heartbeats time out and their
        # heartbeat threads redial: their first connections are closed
        # when the coordinator runs again.
        for _, err in outs:
            err.wait(r"unreachable for [\d.]+ s; training goes on")
        open(back, "w").close()
        outs[0][0].wait(r"^final:")  # every rank trained its last step and leaves now
        time.sleep(4)  # the stop itself, not a wait for something: past the old 2 s Leave
        coord.send_signal(signal.SIGCONT)
        for a in agents:
            a.wait(timeout=WAIT)
        outs = [(o.close(), e.close()) for o, e in outs]
        job = job_json(http, "end")
        coord.terminate()
        coord.wait(timeout=WAIT)
        log = log.close()
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.send_signal(signal.SIGCONT)
        coord.kill()
        coord.wait()
    for a, (_, e) in zip(agents, outs):
        assert a.returncode == 0, (a.returncode, e[-3000:])
    assert job["state"] == "finished", (job["state"], log[-3000:])
    assert "lost" not in log, log[-3000:]
    print("coordinator stopped 4 s as the job ended: every rank's Leave waited; job finished")


def case_settings(tmp):
    """Ranks that disagree on a setting that decides the collectives or the
    arithmetic are refused at Join, promptly (not at a timeout: theirs is an
    hour, far past what the test waits), with an error naming the setting
    and both values; each run starts a fresh job."""
    coord = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--log-level", "warn"], stdout=subprocess.PIPE, text=True)
    rpc = re.search(r"rpc=(\S+)", coord.stdout.readline()).group(1)
    common = ["--coordinator", rpc, "--world-size", "2", "--join-timeout", "3600s",
              "--steps", "5"] + FAST
    agents = []
    try:
        for job, flags, named in [
                ("batch", [["--reduce", "mean", "--batch", "64"],
                           ["--reduce", "mean", "--batch", "32"]],
                 "setting 'batch' is '32' vs '64'"),
                ("reduce", [["--reduce", "mean"], ["--reduce", "sum"]],
                 "setting 'reduce' is 'sum' vs 'mean'"),
                ("steps", [["--reduce", "mean"], ["--reduce", "mean", "--steps", "6"]],
                 "setting 'steps' is '6' vs '5'")]:
            t0 = time.time()
            agents = [subprocess.Popen([AGENT] + common + ["--job", job, "--local-rank", str(i)]
                                       + flags[i], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                      for i in range(2)]
            errs = [a.communicate(timeout=WAIT)[1] for a in agents]
            took = time.time() - t0
            print(f"{job}: refused after {took:.1f}s: {errs[1].strip().splitlines()[-1]}")
            for i, a in enumerate(agents):
                assert a.returncode == 1, (i, a.returncode, errs[i])
                assert "rendezvous of job " + job + " failed" in errs[i], errs[i]
                assert named in errs[i], errs[i]
            assert "rank 1 has settings unlike rank 0's" in errs[0], errs[0]
            assert "(rank 1: node" in errs[0], errs[0]
        # Equal settings in another order of flags train.
        agents = [subprocess.Popen([AGENT] + common + ["--job", "same", "--local-rank", str(i),
                                                       "--reduce", "mean", "--batch", "16"]
                                   + (["--seed", "1"] if i else []),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i in range(2)]
        for a in agents:
            _, err = a.communicate(timeout=WAIT)
            assert a.returncode == 0, err
    finally:
        for a in agents:
            a.kill()
            a.wait()
        coord.kill()
        coord.wait()


def case_launcher(tmp):
    """gradsync-run: help, bad usage, and a failing rank stops the job with a non-zero exit."""
    p = subprocess.run([RUN, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--nproc" in p.stdout, p
    p = subprocess.run([RUN], capture_output=True, text=True)
    assert p.returncode == 2 and "--nproc" in p.stderr, p
    p = subprocess.run([RUN, "--nproc=0"], capture_output=True, text=True)
    assert p.returncode == 2 and "for --nproc: expected an integer from 1 to 1024" in p.stderr, p
    # Agent flags the launcher sets itself are refused; others pass through.
    p = subprocess.run([RUN, "--nproc", "1", "--", "--world-size", "2"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "'--world-size' is set by the launcher" in p.stderr, p
    code, out, err = run(["--nproc", "2", "--reduce", "mean", "--data", tmp], check=False)
    assert code != 0, code
    assert re.search(rf"\[rank [01]\] gradsync-agent: error: {re.escape(tmp)}/train-images-idx3-ubyte:"
                     r" No such file", err), err
    assert "exited with status" in err, err


def nvidia_gpus():
    """Whether the NVIDIA driver lists a GPU on this machine."""
    d = "/proc/driver/nvidia/gpus"
    return os.path.isdir(d) and bool(os.listdir(d))


def case_quiet(tmp):
    """A normal CPU run is no cause for warnings: `make demo`'s command
    (scripts/demo.sh, --log-level warn) prints no WARN line, and the one
    line saying which device the ranks use comes from gradsync-run, once.
    So does a run at the default log level with every GPU hidden
    (CUDA_VISIBLE_DEVICES=''), on any machine; a list naming a GPU that is
    not there is a mistake, and each rank warns."""
    demo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "demo.sh")
    cpu = re.compile(r"^gradsync-run: ranks 0-1 use the CPU \((.*)\)$", re.M)
    env = clean_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    runs = []
    if nvidia_gpus():  # two ranks on one GPU would rightly warn
        print("demo: skipped on a machine with a GPU; the run with every GPU hidden stands in")
    else:
        runs.append(("demo", [demo, os.path.dirname(BIN_DIR), "--steps", "30", "--no-validate"],
                     env))
    runs.append(("hidden", [RUN, "--nproc", "2", "--reduce", "mean", "--steps", "30"] + FAST,
                 dict(env, CUDA_VISIBLE_DEVICES="")))
    for name, argv, e in runs:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=e)
        out = p.stdout + p.stderr
        assert p.returncode == 0, (name, out[-3000:])
        warns = [line for line in out.splitlines() if " WARN " in line]
        assert not warns, (name, warns)
        lines = cpu.findall(p.stderr)
        assert len(lines) == 1, (name, p.stderr[-3000:])
        print(f"{name}: no WARN line; gradsync-run: {lines}")
    p = subprocess.run([RUN, "--nproc", "2", "--reduce", "mean", "--steps", "5"] + FAST,
                       capture_output=True, text=True, timeout=240,
                       env=dict(env, CUDA_VISIBLE_DEVICES="GPU-00000000-nosuch"))
    warns = [line for line in p.stderr.splitlines() if " WARN " in line]
    if "this build of gradsync has no CUDA" not in p.stderr:
        assert p.returncode == 0 and len(warns) == 2, p.stderr[-3000:]
        assert all("names GPUs, but none is visible" in w for w in warns), warns
        print(f"a GPU list naming none: {warns[0].split(' WARN ')[1]}")


def start_coordinator(host="127.0.0.1"):
    """A coordinator on free ports of `host`: (process, rpc port, http port)."""
    c = subprocess.Popen([COORD, "--listen", f"{host}:0", "--http", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"listening rpc=\S+:(\d+) http=\S+:(\d+)", c.stdout.readline())
    assert m, "the coordinator did not say where it listens"
    return c, int(m.group(1)), int(m.group(2))


def job_json(http_port, job):
    """/jobs/JOB of the coordinator at http_port, or None while it has no such job."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/jobs/{job}", timeout=WAIT) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def interrupt_in_rendezvous(rpc_port, http_port, sig, job):
    """An agent of a 2-rank job alone in the rendezvous ends at once at
    `sig`, saying what it waited for, and exits as for that signal. Its
    --join-timeout is an hour: an agent that waited for it instead would
    fail the test at its wait."""
    a = subprocess.Popen([AGENT, "--coordinator", f"127.0.0.1:{rpc_port}", "--world-size", "2",
                          "--reduce", "mean", "--job", job, "--steps", "5",
                          "--join-timeout", "3600s"] + FAST,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = Lines(a.stderr, f"agent of job {job}")
    try:
        wait_until(f"the agent parked in job {job}'s rendezvous",
                   lambda: ((job_json(http_port, job) or {}).get("rendezvous") or {})
                   .get("joined") == 1)
        t0 = time.monotonic()
        a.send_signal(sig)
        code = a.wait(timeout=WAIT)
        took = time.monotonic() - t0
    finally:
        a.kill()
        a.wait()
    err = err.close()
    name = signal.Signals(sig).name
    assert code == 128 + sig, (code, err)
    assert f"interrupted by {name} while waiting for the other ranks of job {job}" in err, err
    assert "no error" not in err, err
    return took


def interrupt_while_connecting(rpc_port, http_port, job):
    """Rank 1 advertises an address nobody listens on, so rank 0 keeps
    dialing it: SIGTERM ends rank 0 at once (not at its connect timeout,
    an hour), saying what it was doing. Returns (seconds, its stderr)."""
    common = [AGENT, "--coordinator", f"127.0.0.1:{rpc_port}", "--world-size", "2",
              "--reduce", "mean", "--job", job, "--steps", "5", "--connect-timeout", "3600s"]
    r1 = subprocess.Popen(common + ["--local-rank", "1", "--comm-advertise", "127.0.0.1:1"] + FAST,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r0 = subprocess.Popen(common + ["--local-rank", "0"] + FAST, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    err = Lines(r0.stderr, "rank 0")
    try:
        # Rank 0 publishes the pack list, its last call to the coordinator
        # before it dials rank 1 (a signal during that call says so instead).
        wait_until("rank 0's pack list at the coordinator",
                   lambda: (job_json(http_port, job) or {}).get("pack_list"))
        t0 = time.monotonic()
        r0.send_signal(signal.SIGTERM)
        code = r0.wait(timeout=WAIT)
        took = time.monotonic() - t0
    finally:
        r0.kill()
        r0.wait()
        r1.kill()
        r1.wait()
    err = err.close()
    assert code == 128 + signal.SIGTERM, (code, err)
    assert "interrupted by SIGTERM while " in err, err
    return took, err


def case_signals(tmp):
    """SIGTERM and SIGINT end an agent waiting in the rendezvous, or
    connecting to its peers, at once; each is named as what it is."""
    c, rpc, http = start_coordinator()
    try:
        for sig, job in ((signal.SIGTERM, "sigterm"), (signal.SIGINT, "sigint")):
            took = interrupt_in_rendezvous(rpc, http, sig, job)
            print(f"{signal.Signals(sig).name} in the rendezvous: exited after {took:.2f} s")
        # The pack list is seen at the coordinator a moment before rank 0
        # has its reply: a signal then interrupts that call instead (it
        # says so, and ends as soon). Another try then, on a fresh job.
        for attempt in range(3):
            took, err = interrupt_while_connecting(rpc, http, f"ring{attempt}")
            if "interrupted by SIGTERM while connecting to rank 1" in err:
                break
            print(f"SIGTERM landed before the ring's dialing: {err.splitlines()[-1]}")
        assert "interrupted by SIGTERM while connecting to rank 1" in err, err
    finally:
        c.kill()
        c.wait()


def write_idx(path, dims, data):
    """An unsigned-byte IDX file (the MNIST format) of shape `dims`."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + data)


def case_messages(tmp):
    """Misleading messages: an agent pointed at the HTTP port says so; an
    error the trainer reports is not followed by the engine's 'no error';
    a label out of range names the label, its file and index, and the
    classes."""
    c, rpc, http = start_coordinator()
    try:
        p = subprocess.run([AGENT, "--coordinator", f"127.0.0.1:{http}", "--world-size", "1",
                            "--steps", "1", "--join-timeout", "5s"] + FAST,
                           capture_output=True, text=True, timeout=WAIT)
        assert p.returncode == 1 and "answered like an HTTP server" in p.stderr, p.stderr
        assert "--listen" in p.stderr and "byte limit" not in p.stderr, p.stderr
        p = subprocess.run([AGENT, "--coordinator", f"127.0.0.1:{rpc}", "--world-size", "1",
                            "--batch", "100000", "--job", "big", "--steps", "1"] + FAST,
                           capture_output=True, text=True, timeout=WAIT)
        assert p.returncode == 1 and "--batch 100000 on 1 ranks needs" in p.stderr, p.stderr
        assert "no error" not in p.stderr, p.stderr
        # A label past the model's outputs is named as such, not as a --layers mismatch.
        data = os.path.join(tmp, "labels")
        os.mkdir(data)
        for split, n in (("train", 6), ("t10k", 3)):
            write_idx(os.path.join(data, f"{split}-images-idx3-ubyte"), [n, 2, 2], bytes(4 * n))
            write_idx(os.path.join(data, f"{split}-labels-idx1-ubyte"), [n],
                      bytes([0, 1, 2, 10, 1, 10][:n]))
        p = subprocess.run([AGENT, "--coordinator", f"127.0.0.1:{rpc}", "--world-size", "1",
                            "--layers", "4,10", "--data", data, "--steps", "1"] + FAST,
                           capture_output=True, text=True, timeout=WAIT)
        want = (f"{data}/train-labels-idx1-ubyte: label 10 (example 3, counting from 0) is out of "
                "range: the model has 10 classes")
        assert p.returncode == 1 and want in p.stderr, p.stderr
        assert "does not fit" not in p.stderr, p.stderr
    finally:
        c.kill()
        c.wait()


def case_errors(tmp):
    """The agent's own flag errors are clear and exit 2."""
    p = subprocess.run([AGENT, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--bcast-period" in p.stdout, p
    p = subprocess.run([AGENT, "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("gradsync-agent "), p
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "2"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--reduce sum|mean is required" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown flag '--bogus'" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1", "--lr=fast"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "'fast' for --lr: expected a number" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1"],
                       capture_output=True, text=True, env=dict(os.environ, LOCAL_RANK="x"))
    assert p.returncode == 2 and "--local-rank (from $LOCAL_RANK)" in p.stderr, p.stderr
    p = subprocess.run([COORD, "--idle-timeout", "0s"], capture_output=True, text=True)
    assert p.returncode == 2 and "--idle-timeout" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1",
                        "--layers", "784,0,10"], capture_output=True, text=True)
    assert p.returncode == 2 and "--layers" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1",
                        "--momentum", "1.5", "--rpc-timeout", "300ms", "--join-timeout",
                        "300ms"], capture_output=True, text=True, timeout=WAIT)
    assert p.returncode == 2 and "--momentum" in p.stderr, p.stderr
    p = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1",
                        "--device", "tpu"], capture_output=True, text=True)
    assert p.returncode == 2 and "--device" in p.stderr, p.stderr
    version = subprocess.run([AGENT, "--version"], capture_output=True, text=True).stdout
    if "cuda" in version:
        # A device and backend that cannot work together are refused before training.
        code, _, err = run(["--nproc", "1", "--device", "cpu", "--backend", "nccl",
                            "--steps", "1"], check=False)
        assert code != 0 and "the nccl backend cannot work on cpu memory" in err, err
        if shutil.which("nvidia-smi") is None:
            code, _, err = run(["--nproc", "1", "--device", "cuda", "--steps", "1"], check=False)
            assert code != 0 and "cannot open device 'cuda': no CUDA device 0" in err, err


def case_environment(tmp):
    """Under SLURM the agent takes its job settings from SLURM's variables;
    --print-config names each source and exits 0 without the token."""
    dialects = ("GRADSYNC_", "SLURM", "MASTER_", "PET_", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dialects)}
    env.update(SLURM_JOB_ID="4242", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_PROCID="5",
               SLURM_NODEID="1", SLURMD_NODENAME="gpu-07", GRADSYNC_COORDINATOR="head:7171",
               GRADSYNC_TOKEN="s3cret-token")
    p = subprocess.run([AGENT, "--print-config", "--lr", "0.1"], capture_output=True, text=True,
                       env=env, timeout=WAIT)
    assert p.returncode == 0, p
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in p.stdout.splitlines()
            if line.startswith("--")}
    assert rows["--coordinator"] == ["head:7171", "$GRADSYNC_COORDINATOR"], rows
    assert rows["--job"] == ["slurm-4242", "$SLURM_JOB_ID"], rows
    assert rows["--world-size"] == ["8", "$SLURM_NTASKS"], rows
    assert rows["--local-rank"] == ["1", "$SLURM_LOCALID"], rows
    assert rows["--node"] == ["gpu-07", "$SLURMD_NODENAME"], rows
    assert rows["--token"] == ["(hidden)", "$GRADSYNC_TOKEN"], rows
    assert rows["--lr"] == ["0.1", "flag"], rows
    assert rows["--batch"] == ["64", "default"], rows
    assert rows["--rank"] == ["5", "$SLURM_PROCID"], rows  # srun's one agent per task
    assert "ignored: $SLURM_NODEID=1 (the agent's own rank is $RANK" in p.stdout, p.stdout
    assert "s3cret-token" not in p.stdout + p.stderr, p.stdout
    # A flag wins over GRADSYNC_*, which wins over SLURM's; the lost ones are named.
    env.update(GRADSYNC_WORLD_SIZE="4")
    p = subprocess.run([AGENT, "--print-config", "--job", "mine"], capture_output=True,
                       text=True, env=env, timeout=WAIT)
    assert p.returncode == 0, p
    assert re.search(r"^--job +mine +flag; unused: \$SLURM_JOB_ID=slurm-4242$", p.stdout,
                     re.M), p.stdout
    assert re.search(r"^--world-size +4 +\$GRADSYNC_WORLD_SIZE; unused: \$SLURM_NTASKS=8$",
                     p.stdout, re.M), p.stdout


DIALECTS = ("GRADSYNC_", "SLURM", "MASTER_", "PET_", "WORLD_SIZE", "RANK", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE", "JOB_COMPLETION_INDEX")


def clean_env(**extra):
    """This environment without any scheduler's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DIALECTS)}
    env.update(extra)
    return env


def job_state(http, job):
    """The job's state at the coordinator's /jobs/NAME."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/jobs/{job}", timeout=WAIT) as r:
        return json.load(r)["state"]


def run_nodes(argvs, envs, timeout=2 * WAIT):
    """Runs one gradsync-run per node at once; their (exit code, output)."""
    procs = [subprocess.Popen([RUN] + a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=e) for a, e in zip(argvs, envs)]
    try:
        return [(p.communicate(timeout=timeout)[0], p.returncode) for p in procs]
    finally:
        for p in procs:
            p.kill()


def case_multinode(tmp):
    """gradsync-run's multi-node form: two "nodes" (distinct --node names)
    join one coordinator started apart, by flags and by SLURM's variables
    alone; the job finishes with a world of 2, each agent the rank its
    node rank makes it (node 0 is named "node-b", node 1 "node-a": the
    names sort the other way)."""
    host = node_address()
    if host == "127.0.0.1":
        # Two node names on loopback addresses are refused at rendezvous.
        print("skipped: two nodes on one machine need an address other than loopback")
        sys.exit(77)
    c, rpc, http = start_coordinator(host)
    train = ["--reduce", "mean", "--steps", "10"] + FAST
    try:
        out = run_nodes([["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                          "--coordinator", f"{host}:{rpc}", "--node", f"node-{'ba'[i]}",
                          "--job", "mn", "--"] + train for i in range(2)],
                        [clean_env()] * 2)
        for i, (text, code) in enumerate(out):
            assert code == 0, (i, code, text)
            assert f"node {i} of 2: 1 agent joining {host}:{rpc} as job mn" in text, text
            assert f"as node 'node-{'ba'[i]}' local rank 0 (world size 2)" in text, text
            assert f"joined generation 1: rank {i} of 2" in text, text
            assert f"the 1 local rank of node {i} finished" in text, text
        assert "[local rank 0] final: test accuracy" in out[0][0], out[0][0]
        assert job_state(http, "mn") == "finished"
        print("flags: 2 nodes x 1 agent joined one coordinator and finished")

        # SLURM's variables alone (one gradsync-run task per node), the
        # coordinator where $MASTER_ADDR points, agents per node from the GPUs
        # SLURM gave the node.
        envs = [clean_env(SLURM_JOB_ID="4242", SLURM_NNODES="2", SLURM_NODEID=str(i),
                          SLURMD_NODENAME=f"slurm-{i}", SLURM_NTASKS="2",
                          SLURM_NTASKS_PER_NODE="1", SLURM_GPUS_ON_NODE="1",
                          SLURM_PROCID=str(i), SLURM_LOCALID="0", MASTER_ADDR=host,
                          GRADSYNC_COORDINATOR_PORT=str(rpc)) for i in range(2)]
        p = subprocess.run([RUN, "--print-config"], capture_output=True, text=True, env=envs[1],
                           timeout=WAIT)
        assert p.returncode == 0, p
        for flag, value, source in [("--nproc", "1", "$SLURM_GPUS_ON_NODE"),
                                    ("--nnodes", "2", "$SLURM_NNODES"),
                                    ("--node-rank", "1", "$SLURM_NODEID"),
                                    ("--coordinator", f"{host}:{rpc}", "$MASTER_ADDR"),
                                    ("--job", "slurm-4242", "$SLURM_JOB_ID"),
                                    ("--node", "slurm-1", "$SLURMD_NODENAME")]:
            assert re.search(rf"^{flag} +{re.escape(value)} +{re.escape(source)}$", p.stdout,
                             re.M), (flag, p.stdout)
        assert "world size: 2 (2 nodes x 1)" in p.stdout, p.stdout
        assert "ignored: $SLURM_NTASKS_PER_NODE=1" in p.stdout, p.stdout
        out = run_nodes([train] * 2, envs)
        for i, (text, code) in enumerate(out):
            assert code == 0, (i, code, text)
            assert f"node {i} of 2: 1 agent joining {host}:{rpc} as job slurm-4242" in text
            assert f"as node 'slurm-{i}' local rank 0 (world size 2)" in text, text
        assert job_state(http, "slurm-4242") == "finished"
        print("SLURM variables only: 2 nodes joined as job slurm-4242 and finished")
    finally:
        c.kill()
        c.wait()


def case_command(tmp):
    """A first pass-through argument that is no flag is a program, run with
    the job in its environment and no flags added; its failure is the run's."""
    script = ("import os, sys; keys = ('GRADSYNC_COORDINATOR', 'GRADSYNC_JOB', "
              "'GRADSYNC_WORLD_SIZE', 'GRADSYNC_LOCAL_RANK', 'GRADSYNC_NODE', 'GRADSYNC_NNODES', "
              "'GRADSYNC_NODE_RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
              "'GRADSYNC_RANK', 'RANK', 'SLURM_PROCID'); "
              "print('ARGS', sys.argv[1:]); "
              "print('ENV', ' '.join(k + '=' + os.environ.get(k, '-') for k in keys))")
    # The coordinator is never dialled: the command does not join.
    p = subprocess.run([RUN, "--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "2",
                        "--coordinator", "127.0.0.1:9", "--node", "cmd-node", "--job", "cmd",
                        "--", sys.executable, "-c", script, "--lr", "1"],
                       capture_output=True, text=True, timeout=WAIT,
                       env=clean_env(SLURM_PROCID="2"))
    assert p.returncode == 0, p
    for i in range(2):
        assert f"[local rank {i}] ARGS ['--lr', '1']" in p.stdout, p.stdout
        want = (f"[local rank {i}] ENV GRADSYNC_COORDINATOR=127.0.0.1:9 GRADSYNC_JOB=cmd "
                f"GRADSYNC_WORLD_SIZE=6 GRADSYNC_LOCAL_RANK={i} GRADSYNC_NODE=cmd-node "
                f"GRADSYNC_NNODES=3 GRADSYNC_NODE_RANK=2 LOCAL_RANK={i} WORLD_SIZE=6 "
                f"LOCAL_WORLD_SIZE=2 GRADSYNC_RANK={4 + i} RANK={4 + i} SLURM_PROCID=2")
        assert want in p.stdout, (want, p.stdout)
    assert "node 2 of 3: 2 copies of " in p.stderr, p.stderr
    # Ranks numbered only for a fixed world whose node rank is known: not
    # for an elastic job, nor on several nodes without --node-rank (srun's
    # task id, the launcher's number, goes too; a stale $RANK as well).
    for flags in (["--node-rank", "2", "--min-ranks", "4"], []):
        p = subprocess.run([RUN, "--nnodes", "3", "--nproc-per-node", "2", "--coordinator",
                            "127.0.0.1:9"] + flags + ["--", sys.executable, "-c", script],
                           capture_output=True, text=True, timeout=WAIT,
                           env=clean_env(SLURM_PROCID="2", RANK="7"))
        assert p.returncode == 0, p
        assert "GRADSYNC_RANK=- RANK=- SLURM_PROCID=-" in p.stdout, (flags, p.stdout)
    # A command that fails gives its status; one that cannot run fails the
    # run (1: a status above 125 is the shell's, not the rank's).
    p = subprocess.run([RUN, "--nproc", "2", "--coordinator", "127.0.0.1:9", "--",
                        "sh", "-c", "exit $((3 + LOCAL_RANK))"],
                       capture_output=True, text=True, timeout=WAIT, env=clean_env())
    assert p.returncode in (3, 4) and "exited with status" in p.stderr, p
    # One local rank failing stops the others on its node (SIGTERM), at once:
    # the other would sleep an hour.
    p = subprocess.run([RUN, "--nproc", "2", "--coordinator", "127.0.0.1:9", "--", "sh", "-c",
                        '[ "$LOCAL_RANK" = 1 ] && exit 5; exec sleep 3600'],
                       capture_output=True, text=True, timeout=WAIT, env=clean_env())
    assert p.returncode == 5 and "stopping the other ranks" in p.stderr, p
    assert "rank 0 killed by signal SIGTERM" in p.stderr, p.stderr
    p = subprocess.run([RUN, "--nproc", "1", "--coordinator", "127.0.0.1:9", "--",
                        "no-such-program-gs"], capture_output=True, text=True, timeout=WAIT,
                       env=clean_env())
    assert p.returncode == 1 and "cannot execute no-such-program-gs" in p.stderr, p
    assert "rank 0 exited with status 127" in p.stderr, p
    print("a command ran with the job in its environment; its exit status is the run's")


def running_with(marker):
    """Pids of the processes whose command line holds `marker`."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if d.isdigit() and marker.encode() in f.read():
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def case_restart(tmp):
    """--max-restarts 1 with a fixed world size: kill -9 of rank 1 mid-run
    aborts the generation, so rank 0 fails too; each is restarted once in
    its slot (same command, same [rank N] prefix), both join generation 2,
    resume from the newest checkpoint and finish: exit 0, a trained model,
    nothing left running."""
    d = os.path.join(tmp, "ck")
    p = subprocess.Popen([RUN, "--nproc", "2", "--max-restarts", "1", "--reduce", "mean",
                          "--steps", "6000", "--checkpoint-dir", d, "--checkpoint-every", "200",
                          "--resume=auto"] + FAST,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen = [], set()
    try:
        wait_for(p, lines, r"\[rank 0\].*checkpoint: step (1[0-9]{3}) ")
        seen.update(children(p.pid))
        victim = agent_pids(p.pid, 1)
        assert len(victim) == 1, (victim, children(p.pid))
        os.kill(victim[0], signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(p, lines, r"\[rank 1\].*joined generation 2")
        seen.update(children(p.pid))
        lines.append(p.stdout.read())
        p.wait(timeout=2 * WAIT)
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    text = "".join(lines)
    assert p.returncode == 0, (p.returncode, text[-4000:])
    killed = re.search(r"gradsync-run: rank 1 killed by signal SIGKILL after [0-9.]+ s; "
                       r"restarting it in 1 s \(restart 1 of 1\)", text)
    assert killed, text[-4000:]
    assert re.search(r"gradsync-run: rank 0 exited with status 1 after [0-9.]+ s; "
                     r"restarting it in 1 s \(restart 1 of 1\)", text), text[-4000:]
    after = text[killed.end():]
    assert re.search(r"\[rank 1\] .*joining .* local rank 1 \(world size 2\)", after), after
    resumed = int(re.search(r"\[rank 0\] resumed at step (\d+)", after).group(1))
    assert 1000 <= resumed < 6000, resumed
    assert "gradsync-run: all 2 ranks finished after 2 restarts" in text, text[-2000:]
    acc = float(re.search(r"final: test accuracy ([0-9.]+)", after).group(1))
    assert acc >= 0.83, acc
    assert read_checkpoint(newest_checkpoint(d))["step"] == 6000
    left = [pid for pid in seen if os.path.exists(f"/proc/{pid}")] + running_with(d)
    assert not left, left
    print(f"rank 1 killed: both ranks restarted, resumed at step {resumed}, finished "
          f"{took:.1f} s later with test accuracy {acc}; {len(seen)} processes, none left")


def run_until(args, pattern, act):
    """Runs gradsync-run with args (no scheduler's variables), calls act(p)
    once a line matches `pattern`, and reads the rest: (exit code, output)."""
    p = subprocess.Popen([RUN] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=clean_env())
    lines = []
    try:
        wait_for(p, lines, pattern)
        act(p)
        lines.append(p.stdout.read())
        p.wait(timeout=WAIT)
    finally:
        p.kill()
        p.wait()
    return p.returncode, "".join(lines)


def case_restart_command(tmp):
    """--max-restarts for any command, in the multi-node form: a command
    that always fails starts K + 1 times in a slot, waiting 1 s then 2 s,
    and its status is the run's; one that fails once (K from
    $GRADSYNC_MAX_RESTARTS) runs again with the same environment and the
    run exits 0; --max-restarts 0 stops the others at once; a stop signal
    cancels a restart that waits."""
    base = [RUN, "--nproc", "2", "--coordinator", "127.0.0.1:9", "--"]
    t0 = time.monotonic()
    p = subprocess.run([RUN, "--max-restarts", "2"] + base[1:] + ["sh", "-c", "echo start; exit 3"],
                       capture_output=True, text=True, timeout=WAIT, env=clean_env())
    took = time.monotonic() - t0
    assert p.returncode == 3, p
    for i in range(2):
        for k, wait in ((1, 1), (2, 2)):
            assert re.search(rf"local rank {i} exited with status 3 after [0-9.]+ s; restarting it "
                             rf"in {wait} s \(restart {k} of 2\)", p.stderr), p.stderr
    last = re.findall(r"local rank (\d) exited with status 3 after [0-9.]+ s; no restarts left "
                      r"\(2 of 2 used\)", p.stderr)
    assert len(last) == 1, p.stderr
    # The other slot, a step behind, is stopped running or waiting.
    other = 1 - int(last[0])
    assert ("stopping the other ranks" in p.stderr or
            f"not restarting local rank {other}: stopping" in p.stderr), p.stderr
    assert p.stdout.count(f"[local rank {last[0]}] start") == 3, p.stdout
    assert p.stdout.count(f"[local rank {other}] start") in (2, 3), p.stdout
    assert took >= 3.0, took  # it waited 1 s, then 2 s
    print(f"always failing: 3 starts in slot {last[0]}, then exit 3 after {took:.1f} s")

    # Fails the first time in each slot, then finishes: exit 0.
    script = ("import os, sys; f = os.path.join(sys.argv[1], 'ran-' + os.environ['LOCAL_RANK']); "
              "again = os.path.exists(f); open(f, 'a').close(); "
              "print('again' if again else 'first', os.environ['GRADSYNC_LOCAL_RANK'], "
              "os.environ['WORLD_SIZE'], sys.argv[2]); sys.exit(0 if again else 4)")
    p = subprocess.run(base + [sys.executable, "-c", script, tmp, "arg"], capture_output=True,
                       text=True, timeout=WAIT, env=clean_env(GRADSYNC_MAX_RESTARTS="1"))
    assert p.returncode == 0, p
    for i in range(2):
        assert f"[local rank {i}] first {i} 2 arg" in p.stdout, p.stdout
        assert f"[local rank {i}] again {i} 2 arg" in p.stdout, p.stdout
        assert f"local rank {i} exited with status 4 after" in p.stderr, p.stderr
    assert "all 2 local ranks of node 0 finished after 2 restarts" in p.stderr, p.stderr
    print("failing once per slot (GRADSYNC_MAX_RESTARTS=1): restarted, exit 0")

    # The flag beats the variable; 0 is the first failure stopping the others
    # (the other would sleep an hour).
    p = subprocess.run([RUN, "--max-restarts", "0"] + base[1:] + [
        "sh", "-c", '[ "$LOCAL_RANK" = 1 ] && exit 5; exec sleep 3600'],
        capture_output=True, text=True, timeout=WAIT, env=clean_env(GRADSYNC_MAX_RESTARTS="5"))
    assert p.returncode == 5 and "stopping the other ranks" in p.stderr, p
    assert "restart" not in p.stderr and "local rank 1 exited with status 5\n" in p.stderr, p

    # SIGTERM while a restart waits: it does not happen.
    code, text = run_until(["--max-restarts", "5", "--nproc", "1"] + base[3:] +
                           ["sh", "-c", "echo start; exit 3"],
                           r"restarting it in 2 s \(restart 2 of 5\)",
                           lambda p: p.send_signal(signal.SIGTERM))
    assert code == 128 + signal.SIGTERM, (code, text)
    assert "not restarting local rank 0: stopping" in text, text
    assert text.count("[local rank 0] start") == 2 and "restart 3 of 5" not in text, text

    # The coordinator gradsync-run started is never restarted: its death
    # stops the run.
    def kill_coordinator(p):
        coord = [pid for pid, argv in children(p.pid).items()
                 if argv and "gradsync-coordinator" in argv[0]]
        assert len(coord) == 1, children(p.pid)
        os.kill(coord[0], signal.SIGKILL)

    code, text = run_until(["--nproc", "2", "--max-restarts", "3", "--", "sleep", "3600"],
                           r"coordinator rpc=", kill_coordinator)
    assert code == 1, (code, text)
    assert "coordinator killed by signal SIGKILL while ranks were running" in text, text
    assert "restarting" not in text, text
    print("--max-restarts 0 stops the others; SIGTERM cancels a waiting restart; the "
          "coordinator's death stops the run")


def case_launcher_errors(tmp):
    """Settings of the multi-node form that cannot fit are refused before
    anything starts, naming the flag and where its value came from."""
    env = clean_env()
    for args, extra, code, text in [
            (["--nproc", "1", "--nnodes", "2", "--node-rank", "2", "--coordinator", "h:1"], {},
             2, "--node-rank 2 must be below --nnodes 2"),
            (["--nproc", "1", "--coordinator", "h:1"], {"JOB_COMPLETION_INDEX": "1"},
             2, "--node-rank 1 (from $JOB_COMPLETION_INDEX) must be below --nnodes 1"),
            (["--nproc", "1", "--nnodes", "2"], {}, 2, "--nnodes 2 needs --coordinator"),
            (["--nproc", "1", "--coordinator", "h:1", "--http", "127.0.0.1:0"], {}, 2,
             "--http is for the coordinator gradsync-run starts"),
            (["--nproc-per-node", "0"], {}, 2,
             "for --nproc: expected an integer from 1 to 1024"),
            (["--nproc", "1"], {"GRADSYNC_NNODES": "two"}, 2,
             "'two' for --nnodes (from $GRADSYNC_NNODES)"),
            (["--nproc", "1", "--coordinator", "h:0"], {}, 2, "for --coordinator"),
            (["--nproc", "1024", "--nnodes", "65", "--coordinator", "h:1"], {}, 2,
             "is 66560 ranks; at most 65536"),
            ([], {"PET_NNODES": "2"}, 2, "--nproc N is required"),
            (["--nproc", "1", "--coordinator", "h:1", "--", "--node", "x"], {}, 2,
             "'--node' is set by the launcher")]:
        p = subprocess.run([RUN] + args, capture_output=True, text=True, timeout=WAIT,
                           env=dict(env, **extra))
        assert p.returncode == code and text in p.stderr, (args, extra, p)
    # A coordinator nobody serves: the agents' own error, the run fails.
    p = subprocess.run([RUN, "--nproc", "1", "--coordinator", "127.0.0.1:9", "--",
                        "--steps", "1", "--join-timeout", "1s", "--rpc-timeout", "1s"],
                       capture_output=True, text=True, timeout=WAIT, env=env)
    assert p.returncode != 0 and "[local rank 0]" in p.stderr, p
    print("bad multi-node settings are refused with the flag and its source")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="gs_agent_") as tmp:
        globals()["case_" + CASE](tmp)
    print(f"{CASE}: ok")
