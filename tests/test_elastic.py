#!/usr/bin/env python3
"""Elastic training (--world-size MIN:MAX) with real agents, a real
coordinator and Fashion-MNIST: ranks are killed, stopped and added while a
job trains, and the job goes on.

Cases (one per run):
  kill        3 ranks of a 2:3 job (--elastic-lr linear), one killed
              (SIGKILL) after the first epoch: the other two finish, within
              0.5 points of the accuracy of an uninterrupted 3-rank run, and
              log the regroup
              with its timings; /metrics and /jobs/NAME count it
  rank0       rank 0 killed: a new rank 0 takes over from the same state
  two         4 ranks of a 2:4 job, two killed at once
  during      a rank killed and, as the others regroup, another stopped: the
              regroup waits for it only up to the heartbeat timeout, then
              goes on without it
  sigstop     a rank stopped past the heartbeat timeout is evicted and the
              others go on; once continued it learns it was evicted, joins
              again as a new agent, and the world grows back to 3
  grow        a 2:3 job starts with 2 agents; a third joins while it runs
              and the world becomes 3 at a step boundary
  restart     gradsync-run --nproc 3 --min-ranks 2 --max-restarts 1: a
              killed rank is started again and the world returns to 3 at a
              step boundary; training finishes with every rank
  launcher    gradsync-run --min-ranks 2 without restarts: a killed rank no
              longer stops the others, and the run exits 0
  below_min   2 of a 2:3 job's 3 ranks killed: the survivor waits for
              joiners until --rejoin-timeout, then fails saying why
  fixed       a fixed-size job still fails fast when a rank is lost
  same        an elastic job where nothing fails trains exactly (bit for
              bit) as a fixed job of the same size

usage: test_elastic.py CASE BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

FASHION = "/usr/share/datasets/fashion-mnist"
CASE, BIN_DIR, COORD = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
# A small model and a short run: a few seconds an epoch on two cores.
TRAIN = ["--reduce", "mean", "--layers", "784,64,10", "--batch", "64", "--seed", "7",
         "--log-interval", "250ms"]


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


class Job:
    """A coordinator on free ports and the agents of one job, each with
    its output in a file of a temporary folder."""

    def __init__(self, world, *coord_flags, name="el"):
        self.dir = tempfile.mkdtemp(prefix="gs-elastic-")
        self.world, self.name, self.agents = world, name, {}
        self.coord_log = os.path.join(self.dir, "coordinator.log")
        self.coord = subprocess.Popen(
            [COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", *coord_flags],
            stdout=subprocess.PIPE, stderr=open(self.coord_log, "w"), text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")})
        words = self.coord.stdout.readline().split()
        self.rpc = words[2].split("=", 1)[1]
        self.http = words[3].split("=", 1)[1]

    def start(self, local, *extra, epochs=3):
        log = os.path.join(self.dir, f"agent{local}.{len(self.agents)}.log")
        p = subprocess.Popen(
            [AGENT, "--coordinator", self.rpc, "--job", self.name, "--world-size", self.world,
             "--local-rank", str(local), "--node", "n", "--epochs", str(epochs), *TRAIN,
             "--data", FASHION, *extra],
            stdout=open(log, "w"), stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")})
        self.agents[local] = (p, log)
        return p

    def log(self, local):
        return read(self.agents[local][1])

    def wait_line(self, local, pattern, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.log(local))
            if m:
                return m
            if self.agents[local][0].poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"agent {local}: no {pattern!r}:\n{self.log(local)[-3000:]}")

    def kill(self, local, sig=signal.SIGKILL):
        self.agents[local][0].send_signal(sig)

    def finish(self, locals_, timeout=120):
        """Waits for these agents; returns their exit codes."""
        codes = {}
        for i in locals_:
            try:
                codes[i] = self.agents[i][0].wait(timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"agent {i} still running:\n{self.log(i)[-3000:]}")
        return codes

    def get(self, path):
        with urllib.request.urlopen(f"http://{self.http}{path}", timeout=10) as r:
            return r.read().decode()

    def close(self):
        for p, _ in self.agents.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.coord.terminate()
        self.coord.wait(10)


def accuracy(text):
    m = re.search(r"final: test accuracy ([0-9.]+)", text)
    assert m, "no final accuracy:\n" + text[-3000:]
    return float(m.group(1))


def expect_ok(job, locals_):
    codes = job.finish(locals_)
    for i, c in codes.items():
        assert c == 0, f"agent {i} exited {c}:\n{job.log(i)[-4000:]}"


def run_plain(world, n, *extra, epochs=3):
    """An uninterrupted job: rank 0's final accuracy and its log."""
    job = Job(world)
    try:
        for i in range(n):
            job.start(i, *extra, epochs=epochs)
        expect_ok(job, range(n))
        return accuracy(job.log(0)), job
    finally:
        job.close()


def regroup_line(text):
    m = re.search(r"generation \d+: (.*); continuing with (\d+) ranks from step (\d+) "
                  r"\(detect ([0-9.]+) s, regroup ([0-9.]+) s\)", text)
    assert m, "no regroup line:\n" + text[-3000:]
    return m


def case_kill():
    # A lower LR, which --elastic-lr linear scales with the world: the
    # final accuracy of this small model then varies little with the step
    # the kill lands on (at the default 0.05 it moves by a point).
    epochs = 4
    extra = ["--lr", "0.02", "--elastic-lr", "linear"]
    base, _ = run_plain("3", 3, *extra, epochs=epochs)
    job = Job("2:3")
    try:
        for i in range(3):
            job.start(i, *extra, epochs=epochs)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(2)
        expect_ok(job, [0, 1])
        text = job.log(0)
        m = regroup_line(text)
        assert m.group(2) == "2", m.group(0)
        assert "rank 2 (node 'n', local_rank 2) lost" in m.group(1), m.group(0)
        assert float(m.group(5)) < 5, m.group(0)
        acc = accuracy(text)
        print(f"uninterrupted 3 ranks: {base:.4f}; 3 then 2 ranks: {acc:.4f}; {m.group(0)}")
        assert abs(acc - base) <= 0.005, f"accuracy {acc} vs {base}"
        metrics = job.get("/metrics")
        assert re.search(r"^gradsync_regroups_total 1$", metrics, re.M), metrics
        status = json.loads(job.get(f"/jobs/{job.name}"))
        gens = status["generations"]
        assert [g["world_size"] for g in gens] == [3, 2], gens
        assert "lost" in gens[0]["lost"] and gens[1]["start_step"] > 0, gens
    finally:
        job.close()


def case_rank0():
    job = Job("2:3")
    try:
        for i in range(3):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(0)
        expect_ok(job, [1, 2])
        text = job.log(1)  # local rank 1 is rank 0 now
        m = regroup_line(text)
        assert "rank 0 (node 'n', local_rank 0) lost" in m.group(1), m.group(0)
        assert accuracy(text) > 0.80, text[-2000:]
        print(m.group(0))
    finally:
        job.close()


def case_two():
    job = Job("2:4")
    try:
        for i in range(4):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(1)
        job.kill(3)
        expect_ok(job, [0, 2])
        m = regroup_line(job.log(0))
        assert job.log(0).count("continuing with") >= 1
        assert "continuing with 2 ranks" in job.log(0), job.log(0)[-3000:]
        assert accuracy(job.log(0)) > 0.80
        print(m.group(0))
    finally:
        job.close()


def case_during():
    job = Job("2:4", "--heartbeat-timeout", "2s")
    try:
        for i in range(4):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(3)
        job.kill(2, signal.SIGSTOP)
        m = job.wait_line(0, r"continuing with 2 ranks from step \d+ \(detect [0-9.]+ s, "
                             r"regroup ([0-9.]+) s\)", timeout=30)
        assert 1.5 < float(m.group(1)) < 10, m.group(0)
        assert "rank 2 (node 'n', local_rank 2) lost" in job.log(0), job.log(0)[-3000:]
        expect_ok(job, [0, 1])
        print(m.group(0))
    finally:
        job.kill(2, signal.SIGKILL)
        job.close()


def case_sigstop():
    job = Job("2:3", "--heartbeat-timeout", "2s")
    try:
        for i in range(3):
            job.start(i, epochs=5)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(2, signal.SIGSTOP)
        m = job.wait_line(0, r"continuing with 2 ranks from step (\d+)", timeout=30)
        job.wait_line(0, r"step \d+/\d+ epoch", timeout=30)
        job.kill(2, signal.SIGCONT)
        job.wait_line(2, r"join again as a new agent", timeout=30)
        job.wait_line(0, r"new ranks joined; continuing with 3 ranks", timeout=60)
        expect_ok(job, [0, 1, 2])
        print(m.group(0), "; then back to 3 ranks")
        assert "no heartbeat" in job.log(0), job.log(0)[-3000:]
        assert accuracy(job.log(0)) > 0.80
    finally:
        job.close()


def case_grow():
    job = Job("2:3")
    try:
        job.start(0, epochs=8)
        job.start(1, epochs=8)
        job.wait_line(0, r"joined generation 1: rank 0 of 2")
        job.wait_line(0, r"epoch 1 validation")
        job.start(2, epochs=8)
        m = job.wait_line(0, r"generation 2: new ranks joined; continuing with 3 ranks from step "
                             r"(\d+)")
        expect_ok(job, [0, 1, 2])
        m2 = job.wait_line(2, r"joined generation 2: rank 2 of 3")
        assert accuracy(job.log(0)) > 0.80
        print(m.group(0), "|", m2.group(0))
    finally:
        job.close()


RUN = os.path.join(BIN_DIR, "gradsync-run")


def launch(tmp, *flags, epochs):
    """gradsync-run with its output in a file; the process and the file."""
    log = os.path.join(tmp, "run.log")
    p = subprocess.Popen([RUN, "--nproc", "3", "--job", "elrun", *flags, "--", *TRAIN,
                          "--data", FASHION, "--epochs", str(epochs)],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("GRADSYNC_")})
    return p, log


def wait_text(log, pattern, p, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(pattern, read(log))
        if m:
            return m
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r}:\n{read(log)[-4000:]}")


def kill_local_rank(local):
    subprocess.run(["pkill", "-9", "-f", f"job elrun --world-size 2:3 --local-rank {local} "])


def case_restart():
    tmp = tempfile.mkdtemp(prefix="gs-elastic-run-")
    p, log = launch(tmp, "--min-ranks", "2", "--max-restarts", "1", epochs=40)
    try:
        wait_text(log, r"epoch 1 validation", p)
        kill_local_rank(2)
        m = wait_text(log, r"continuing with 2 ranks from step (\d+)", p)
        g = wait_text(log, r"new ranks joined; continuing with 3 ranks from step (\d+)", p)
        assert p.wait(120) == 0, read(log)[-4000:]
        text = read(log)
        assert "restarting it in" in text, text[-3000:]
        assert re.search(r"all 3 ranks finished after \d+ restarts?", text), text[-3000:]
        assert int(g.group(1)) >= int(m.group(1))
        assert accuracy(text) > 0.80
        print(m.group(0), "|", g.group(0))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def case_launcher():
    tmp = tempfile.mkdtemp(prefix="gs-elastic-run-")
    p, log = launch(tmp, "--min-ranks", "2", epochs=3)
    try:
        wait_text(log, r"epoch 1 validation", p)
        kill_local_rank(1)
        m = wait_text(log, r"continuing with 2 ranks from step (\d+)", p)
        assert p.wait(120) == 0, read(log)[-4000:]
        text = read(log)
        assert "the elastic job goes on without rank 1" in text, text[-3000:]
        assert "2 of 3 ranks finished" in text, text[-3000:]
        assert accuracy(text) > 0.80
        print(m.group(0))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def case_below_min():
    job = Job("2:3")
    try:
        for i in range(3):
            job.start(i, "--rejoin-timeout", "3s")
        job.wait_line(0, r"epoch 1 validation")
        job.kill(1)
        job.kill(2)
        t0 = time.time()
        codes = job.finish([0], timeout=60)
        waited = time.time() - t0
        text = job.log(0)
        assert codes[0] != 0, text[-2000:]
        assert "could not regroup" in text and "fewer ranks than its minimum" in text, text[-3000:]
        assert 2.5 < waited < 20, waited
        print(f"failed after {waited:.1f} s:", re.search(r"error: (.*)", text).group(1))
    finally:
        job.close()


def case_fixed():
    job = Job("3")
    try:
        for i in range(3):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        t0 = time.time()
        job.kill(2)
        codes = job.finish([0, 1], timeout=60)
        assert codes[0] != 0 and codes[1] != 0, codes
        assert time.time() - t0 < 10
        assert "lost" in job.log(0), job.log(0)[-2000:]
        assert "continuing with" not in job.log(0)
    finally:
        job.close()


def case_same():
    out = tempfile.mkdtemp(prefix="gs-elastic-same-")
    fixed, _ = run_plain("3", 3, "--save-model", os.path.join(out, "fixed.safetensors"), epochs=1)
    elastic, _ = run_plain("2:3", 3, "--save-model", os.path.join(out, "elastic.safetensors"),
                           epochs=1)
    a = open(os.path.join(out, "fixed.safetensors"), "rb").read()
    b = open(os.path.join(out, "elastic.safetensors"), "rb").read()
    assert a == b, "the elastic job's model differs from the fixed job's"
    print(f"bit-identical models ({len(a)} bytes), accuracy {fixed:.4f} = {elastic:.4f}")


def main():
    if not os.path.isdir(FASHION):
        print(f"skip: {FASHION} missing (apt-get install dataset-fashion-mnist)")
        return 77
    globals()["case_" + CASE]()
    print(f"elastic {CASE}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
