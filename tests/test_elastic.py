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
  late_before rank 2 joins a running 2:3 job late, and rank 1 is killed as
              generation 2 forms, before rank 2 connected: rank 2 joins
              generation 3 with rank 0 instead of failing
  late_after  gradsync-run --min-ranks 2 with rank 2 held back until rank 1
              was killed and rank 0 regroups: rank 0 waits for it, and
              ranks 0 and 2 train on
  coord_restart 4 ranks of a 2:4 job, one killed, then the coordinator
              restarts: the job re-registers with its 3 ranks, admits a
              replacement and ends finished
  unlike      a 4th agent with another --batch asks to join a running 2:4
              job: it alone is refused, and the job trains on untouched
  below_min   2 of a 2:3 job's 3 ranks killed: the survivor waits for
              joiners until --rejoin-timeout, then fails saying why
  fixed       a fixed-size job still fails fast when a rank is lost
  same        an elastic job where nothing fails trains exactly (bit for
              bit) as a fixed job of the same size
  shard       --shard-optimizer in a 2:4 job, rank 3 killed mid-training:
              its shard of the optimizer state lives on in rank 0's copy,
              and the survivors go on from the state of the last step
              applied, the checkpoint of that step's to the bit

Nothing here asserts how long anything takes (that is bench/chaos.sh's
work): waits end on a line in a log, and their timeouts only decide
failure. Every case removes its folder and its processes, also when it
fails or runs out of time.

usage: test_elastic.py CASE BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT, descendants, wait_until  # noqa: E402
from checkpoints import read_checkpoint  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
CASE, BIN_DIR, COORD = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
# A small model and a short run: a few seconds an epoch on two cores.
TRAIN = ["--reduce", "mean", "--layers", "784,64,10", "--batch", "64", "--seed", "7",
         "--log-interval", "250ms"]
# Jobs that must outlast what a case does to them train "forever" and are
# stopped (every rank at one step, exit 0) once it is done.
FOREVER = 1000
SCRATCH = []  # folders removed when the case ends
# A silent rank is lost after 4 s; heartbeats every 250 ms, so that only a
# rank stopped on purpose, not one the load starves for a moment, is.
QUICK_LOSS = ["--heartbeat-timeout", "4s", "--heartbeat-interval", "250ms"]
VALIDATION = r"epoch \d+ validation"


def AFTER(first, then):
    """A pattern for a line matching `then` after one matching `first`."""
    return f"{first}.*\n(.*\n)*.*{then}"


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def scratch(prefix):
    """A temporary folder, removed when the case ends however it ends."""
    d = tempfile.mkdtemp(prefix=prefix)
    SCRATCH.append(d)
    return d


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}


def post_stop(http, job):
    """Asks the coordinator at `http` (HOST:PORT) to stop `job`: every rank
    stops after the same step and exits 0."""
    req = urllib.request.Request(f"http://{http}/jobs/{job}/control", method="POST",
                                 data=json.dumps({"action": "stop"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=WAIT) as r:
        assert r.status == 200, r.status


def wait_text(what, text, pattern, alive):
    """Waits until text() matches `pattern` (its match); fails at once when
    alive() turns false first."""
    def check():
        m = re.search(pattern, text())
        if m or alive():
            return m or None
        raise AssertionError(f"{what} ended without {pattern!r}:\n{text()[-4000:]}")
    try:
        return wait_until(f"{what}: {pattern!r}", check)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{text()[-4000:]}") from None


class Job:
    """A coordinator on free ports and the agents of one job, each with
    its output in a file of a temporary folder."""

    def __init__(self, world, *coord_flags, name="el"):
        self.dir = scratch("gs-elastic-")
        self.world, self.name, self.agents, self.coord_flags = world, name, {}, coord_flags
        self.coord_log = os.path.join(self.dir, "coordinator.log")
        self.coord = subprocess.Popen(
            [COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", *coord_flags],
            stdout=subprocess.PIPE, stderr=open(self.coord_log, "w"), text=True,
            env=clean_env())
        words = self.coord.stdout.readline().split()
        self.rpc = words[2].split("=", 1)[1]
        self.http = words[3].split("=", 1)[1]

    def start(self, local, *extra, epochs=3):
        log = os.path.join(self.dir, f"agent{local}.{len(self.agents)}.log")
        p = subprocess.Popen(
            [AGENT, "--coordinator", self.rpc, "--job", self.name, "--world-size", self.world,
             "--local-rank", str(local), "--node", "n", "--epochs", str(epochs), *TRAIN,
             "--data", FASHION, *extra],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=dict(clean_env(), GS_DEBUG_RESHARD="1"))
        self.agents[local] = (p, log)
        return p

    def log(self, local):
        return read(self.agents[local][1])

    def wait_line(self, local, pattern):
        p = self.agents[local][0]
        return wait_text(f"agent {local}", lambda: self.log(local), pattern,
                         lambda: p.poll() is None)

    def wait_more(self, local, pattern):
        """Waits until agent `local` logged one more line matching `pattern`
        than it has now."""
        seen = len(re.findall(pattern, self.log(local)))
        p = self.agents[local][0]
        wait_until(f"agent {local}: one more {pattern!r}",
                   lambda: len(re.findall(pattern, self.log(local))) > seen or
                   (p.poll() is not None and self.fail(local, pattern)))

    def fail(self, local, pattern):
        raise AssertionError(f"agent {local} ended without {pattern!r}:\n{self.log(local)[-3000:]}")

    def kill(self, local, sig=signal.SIGKILL):
        self.agents[local][0].send_signal(sig)

    def finish(self, locals_, timeout=WAIT):
        """Waits for these agents; returns their exit codes."""
        codes = {}
        for i in locals_:
            try:
                codes[i] = self.agents[i][0].wait(timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"agent {i} still running:\n{self.log(i)[-3000:]}")
        return codes

    def get(self, path):
        with urllib.request.urlopen(f"http://{self.http}{path}", timeout=WAIT) as r:
            return r.read().decode()

    def coord_text(self):
        return read(self.coord_log)

    def wait_coord(self, pattern):
        return wait_text("coordinator", self.coord_text, pattern, lambda: self.coord.poll() is None)

    def stop(self):
        post_stop(self.http, self.name)

    def restart_coordinator(self):
        """Kills the coordinator and starts a new one on the same ports (its
        log continues in the same file): the agents re-register with it."""
        self.coord.kill()
        self.coord.wait()
        self.coord = subprocess.Popen(
            [COORD, "--listen", self.rpc, "--http", self.http, *self.coord_flags],
            stdout=subprocess.DEVNULL, stderr=open(self.coord_log, "a"), env=clean_env())

    def close(self):
        for p, _ in self.agents.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.coord.kill()
        self.coord.wait()


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
    # Stopped first, so it cannot come back: the kill that follows ends
    # the generation while it is silent, and the regroup waits for it up
    # to the heartbeat timeout only.
    job = Job("2:4", *QUICK_LOSS)
    try:
        for i in range(4):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(2, signal.SIGSTOP)
        job.kill(3)
        m = job.wait_line(0, r"continuing with 2 ranks from step \d+")
        expect_ok(job, [0, 1])
        coord = job.coord_text()
        stopped = re.search(r"rank 2 \(node 'n', local_rank 2\) lost: no heartbeat", coord)
        killed = re.search(r"rank 3 \(node 'n', local_rank 3\) lost", coord)
        started = re.search(r"generation 2 started with 2 ranks", coord)
        assert stopped and killed and started, coord[-4000:]
        assert stopped.start() < started.start(), coord[-4000:]
        print(m.group(0))
    finally:
        job.kill(2, signal.SIGKILL)
        job.close()


def case_sigstop():
    job = Job("2:3", *QUICK_LOSS)
    try:
        for i in range(3):
            job.start(i, epochs=FOREVER)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(2, signal.SIGSTOP)
        m = job.wait_line(0, r"continuing with 2 ranks from step (\d+)")
        job.wait_line(0, r"continuing with 2 ranks.*\n(.*\n)*step \d+/\d+ epoch")
        job.kill(2, signal.SIGCONT)
        job.wait_line(2, r"join again as a new agent")
        job.wait_line(0, AFTER("new ranks joined; continuing with 3 ranks", VALIDATION))
        job.stop()
        expect_ok(job, [0, 1, 2])
        print(m.group(0), "; then back to 3 ranks")
        assert "no heartbeat" in job.log(0), job.log(0)[-3000:]
        assert accuracy(job.log(0)) > 0.80
    finally:
        job.close()


def case_grow():
    job = Job("2:3")
    try:
        job.start(0, epochs=FOREVER)
        job.start(1, epochs=FOREVER)
        job.wait_line(0, r"joined generation 1: rank 0 of 2")
        job.wait_line(0, r"epoch 1 validation")
        job.start(2, epochs=FOREVER)
        m = job.wait_line(0, r"generation 2: new ranks joined; continuing with 3 ranks from step "
                             r"(\d+)")
        job.wait_line(0, AFTER("new ranks joined", VALIDATION))
        job.stop()
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
                         env=clean_env())
    return p, log


def stop_launch(p):
    """Ends gradsync-run and everything it started (its process group)."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def wait_log(log, pattern, p):
    """Waits for `pattern` in gradsync-run's output; its match."""
    return wait_text("gradsync-run", lambda: read(log), pattern, lambda: p.poll() is None)


def kill_local_rank(p, local):
    """SIGKILLs the agent of local rank `local` that gradsync-run `p`
    started (found among its descendants, not by name: other runs may be
    on this machine)."""
    for pid in descendants(p.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[0].endswith("gradsync-agent") and "--local-rank" in argv and \
                argv[argv.index("--local-rank") + 1] == str(local):
            os.kill(pid, signal.SIGKILL)
            return
    raise AssertionError(f"no agent of local rank {local} below gradsync-run")


def stop_run(log, p, job="elrun"):
    """Stops the job at the coordinator gradsync-run started."""
    http = wait_log(log, r"status at http://([0-9.:]+)/status", p).group(1)
    post_stop(http, job)


def three_ranks_trained(log, p):
    """Waits until a generation of all three ranks trained an epoch (rank 2
    may start late and join generation 1 of two at a regroup)."""
    wait_log(log, AFTER(r"generation \d+ started with 3 ranks", r"\[rank 0\] " + VALIDATION), p)


def case_restart():
    tmp = scratch("gs-elastic-run-")
    p, log = launch(tmp, "--min-ranks", "2", "--max-restarts", "1", epochs=FOREVER)
    try:
        three_ranks_trained(log, p)
        kill_local_rank(p, 2)
        m = wait_log(log, r"continuing with 2 ranks from step (\d+)", p)
        g = wait_log(log, r"new ranks joined; continuing with 3 ranks from step (\d+)", p)
        wait_log(log, AFTER("new ranks joined; continuing with 3 ranks", VALIDATION), p)
        stop_run(log, p)
        assert p.wait(WAIT) == 0, read(log)[-4000:]
        text = read(log)
        assert "restarting it in" in text, text[-3000:]
        assert re.search(r"all 3 ranks finished after \d+ restarts?", text), text[-3000:]
        assert int(g.group(1)) >= int(m.group(1))
        assert accuracy(text) > 0.80
        print(m.group(0), "|", g.group(0))
    finally:
        stop_launch(p)


def case_launcher():
    tmp = scratch("gs-elastic-run-")
    p, log = launch(tmp, "--min-ranks", "2", epochs=FOREVER)
    try:
        three_ranks_trained(log, p)
        kill_local_rank(p, 1)
        m = wait_log(log, r"continuing with 2 ranks from step (\d+)", p)
        wait_log(log, AFTER("continuing with 2 ranks", VALIDATION), p)
        stop_run(log, p)
        assert p.wait(WAIT) == 0, read(log)[-4000:]
        text = read(log)
        assert "the elastic job goes on without rank 1" in text, text[-3000:]
        assert "2 of 3 ranks finished" in text, text[-3000:]
        assert accuracy(text) > 0.80
        print(m.group(0))
    finally:
        stop_launch(p)


def gated_agent(tmp):
    """An --agent-bin that holds local rank 2 back until the test creates
    the gate file (a rank late on purpose, by as much as the test says);
    the other ranks start at once. The gate's path."""
    gate = os.path.join(tmp, "gate")
    wrapper = os.path.join(tmp, "gated-agent")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n"
                f'if [ "$GRADSYNC_LOCAL_RANK" = 2 ]; then\n'
                f"  while [ ! -e {gate} ]; do sleep 0.05; done\n"
                "fi\n"
                f'exec {AGENT} "$@"\n')
    os.chmod(wrapper, 0o755)
    return wrapper, gate


def case_late_after():
    """gradsync-run --min-ranks 2 whose rank 2 comes late, after
    generation 1 formed with ranks 0 and 1 and trained an epoch, and after
    rank 1 was killed and rank 0 regroups: rank 0 waits for it, ranks 0
    and 2 train together, and once they do the job is stopped (it may not
    end before rank 2 came, however slowly it starts)."""
    tmp = scratch("gs-elastic-late-")
    wrapper, gate = gated_agent(tmp)
    p, log = launch(tmp, "--min-ranks", "2", "--agent-bin", wrapper, epochs=FOREVER)
    try:
        wait_log(log, r"generation 1 started with 2 ranks", p)
        wait_log(log, r"\[rank 0\] epoch 1 validation", p)
        kill_local_rank(p, 1)
        wait_log(log, r"\[rank 0\].*regrouping from step", p)
        open(gate, "w").close()
        # Rank 2 in a world of two: as it joined, or after a regroup.
        m = wait_log(log, r"\[rank 2\].*(joined generation \d+: rank 1 of 2|"
                           r"continuing with 2 ranks from step \d+)", p)
        wait_log(log, AFTER(re.escape(m.group(0)), r"\[rank 0\] " + VALIDATION), p)
        stop_run(log, p)
        assert p.wait(WAIT) == 0, read(log)[-5000:]
        text = read(log)
        assert "the elastic job goes on without rank 1" in text, text[-4000:]
        assert "2 of 3 ranks finished" in text, text[-4000:]
        gens = re.findall(r"generation (\d+) started with (\d+) ranks", text)
        assert gens[-1][1] == "2", (gens, text[-4000:])
        assert re.search(r"\[rank 0\] stopped after step \d+: the coordinator asked", text)
        print("generations (number, world):", gens, "|", m.group(1))
    finally:
        stop_launch(p)


def case_late_before():
    """Rank 2 joins while generation 1 of ranks 0 and 1 trains, and the
    world breaks as it starts: generation 2 forms with all three, rank 1
    is killed before rank 2 connected, and rank 2 must join generation 3
    rather than fail. Stopping ranks is what makes each step happen in
    this order, whatever the load: rank 0 stopped holds generation 1 (and
    its regroup) back while rank 2's Join waits at the coordinator; rank 2
    stopped with its Join answered keeps it from connecting until rank 1
    is gone."""
    job = Job("2:3", "--heartbeat-timeout", "5m", "--log-level", "debug")
    try:
        job.start(0, epochs=FOREVER)
        job.start(1, epochs=FOREVER)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(0, signal.SIGSTOP)
        job.start(2, epochs=FOREVER)
        job.wait_coord(r"\(node 'n', local_rank 2\) joined: 1 of 3")
        job.kill(2, signal.SIGSTOP)
        job.kill(0, signal.SIGCONT)
        job.wait_coord(r"generation 2 started with 3 ranks")
        job.kill(1)
        job.wait_coord(r"generation 2 aborted: rank 1 \(node 'n', local_rank 1\) lost")
        job.kill(2, signal.SIGCONT)
        m = job.wait_line(2, r"generation 2 broke before this rank trained in it: (.*); joining "
                             r"the next one")
        job.wait_line(2, r"joined generation \d+: rank 1 of 2")
        # Rank 0's progress lines after the regroup: the world of two trains.
        job.wait_line(0, AFTER(r"continuing with 2 ranks from step \d+", r"step \d+/\d+ epoch"))
        status = json.loads(job.get(f"/jobs/{job.name}"))
        assert status["generations"][-1]["world_size"] == 2, status["generations"]
        print("rank 2:", m.group(0))
    finally:
        for i in (0, 2):
            job.kill(i, signal.SIGCONT)
        job.close()


def case_unlike():
    """A 4th agent with another --batch asks to join a running 2:4 job: it
    alone is refused, saying what differs, and the three ranks train on
    in the same generation (no regroup), then finish."""
    job = Job("2:4")
    try:
        for i in range(3):
            job.start(i, epochs=FOREVER)
        # All three together (the third may come late and join at a regroup).
        job.wait_coord(AFTER(r"generation \d+ started with 3 ranks", "."))
        before = json.loads(job.get(f"/jobs/{job.name}"))["generations"]
        odd = job.start(3, "--batch", "32", epochs=FOREVER)
        assert odd.wait(WAIT) != 0, job.log(3)[-3000:]
        assert re.search(r"join failed: .*this agent has settings unlike its rank 0's: "
                         r"setting 'batch' is '32' vs '64'", job.log(3)), job.log(3)[-3000:]
        job.wait_more(0, VALIDATION)  # trains on
        job.stop()
        expect_ok(job, [0, 1, 2])
        after = json.loads(job.get(f"/jobs/{job.name}"))["generations"]
        assert [g["generation"] for g in after] == [g["generation"] for g in before], (before, after)
        assert after[-1]["world_size"] == 3, after
        print("refused:", re.search(r"error: (.*)", job.log(3)).group(1)[:160], "...")
    finally:
        job.close()


def case_coord_restart():
    """4 ranks of a 2:4 job, one killed: the job goes on with 3. Then the
    coordinator restarts: the ranks re-register a generation of 3 (not of
    4 with the lost rank's place empty), a replacement agent is admitted
    at a regroup, and once stopped the job ends finished."""
    job = Job("2:4")
    try:
        for i in range(4):
            job.start(i, epochs=FOREVER)
        four = job.wait_coord(AFTER(r"generation \d+ started with 4 ranks", "."))
        job.kill(3)
        job.finish([3])
        job.wait_coord(AFTER(re.escape(four.group(0)), r"generation \d+ started with 3 ranks"))
        # Restarted once the three train on: a restart between a rank's Join
        # and its pack list is another case (agent_outage, test_client
        # heartbeat_forgone_rejoin), and made this one wait out timeouts.
        for i in range(3):  # (a rank that had not trained yet joins it as a fresh one)
            job.wait_line(i, r"continuing with 3 ranks from step \d+|joined generation \d+: rank "
                             r"\d+ of 3")
        job.restart_coordinator()
        m = job.wait_coord(AFTER("re-registered", AFTER("re-registered", "re-registered")))
        status = json.loads(job.get(f"/jobs/{job.name}"))
        assert status["world_size"] == 3, status
        assert [r["state"] for r in status["ranks"]] == ["running"] * 3, status["ranks"]
        job.start(3, epochs=FOREVER)
        job.wait_coord(AFTER(re.escape(m.group(0)), r"generation \d+ started with 4 ranks"))
        job.wait_line(0, AFTER(r"continuing with 4 ranks from step \d+", VALIDATION))  # trains
        job.stop()
        expect_ok(job, range(4))
        status = wait_until("the job finished", lambda: (
            lambda s: s if s["state"] == "finished" else None)(json.loads(job.get(f"/jobs/{job.name}"))))
        print("after the restart:", [(g["generation"], g["world_size"])
                                     for g in status["generations"]])
    finally:
        job.close()


def case_below_min():
    job = Job("2:3")
    try:
        for i in range(3):
            job.start(i, "--rejoin-timeout", "3s")
        job.wait_line(0, r"epoch 1 validation")
        job.kill(1)
        job.kill(2)
        codes = job.finish([0])
        text = job.log(0)
        assert codes[0] != 0, text[-2000:]
        assert "could not regroup" in text and "fewer ranks than its minimum" in text, text[-3000:]
        print("failed:", re.search(r"error: (.*)", text).group(1))
    finally:
        job.close()


def case_fixed():
    job = Job("3")
    try:
        for i in range(3):
            job.start(i)
        job.wait_line(0, r"epoch 1 validation")
        job.kill(2)
        codes = job.finish([0, 1])
        assert codes[0] != 0 and codes[1] != 0, codes
        assert "lost" in job.log(0), job.log(0)[-2000:]
        assert "continuing with" not in job.log(0)
    finally:
        job.close()


def case_same():
    out = scratch("gs-elastic-same-")
    fixed, _ = run_plain("3", 3, "--save-model", os.path.join(out, "fixed.safetensors"), epochs=1)
    elastic, _ = run_plain("2:3", 3, "--save-model", os.path.join(out, "elastic.safetensors"),
                           epochs=1)
    a = open(os.path.join(out, "fixed.safetensors"), "rb").read()
    b = open(os.path.join(out, "elastic.safetensors"), "rb").read()
    assert a == b, "the elastic job's model differs from the fixed job's"
    print(f"bit-identical models ({len(a)} bytes), accuracy {fixed:.4f} = {elastic:.4f}")


def fnv1a_of_buffers(bufs):
    """The engine's state hash: FNV-1a 64 over every buffer's float32 bytes
    in checkpoint order (each pack's params, then its optimizer state)."""
    h = 0xcbf29ce484222325
    for b in bufs:
        for byte in struct.pack(f"<{len(b)}f", *b):
            h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


RESHARDED = r"resharded the optimizer state of step (\d+) from 4 ranks to 3 \(hash ([0-9a-f]{16})\)"


def case_shard():
    d = scratch("gs-elastic-shard-")
    # Rank 3 hangs in its data phase at step 40 (the others wait in its
    # collectives) and is killed there: a known last step, whose checkpoint
    # rank 0 wrote. Its shard lives on in rank 0's copy (the ring wraps).
    extra = ["--shard-optimizer", "--optimizer", "adamw", "--lr", "0.001", "--layers",
             "784,16,10", "--checkpoint-dir", d, "--checkpoint-every", "1", "--checkpoint-keep",
             "1000000", "--inject-fault", "data-hang:3:40:" + os.path.join(d, "never")]
    job = Job("2:4", *QUICK_LOSS)
    try:
        for i in range(4):
            job.start(i, *extra, epochs=FOREVER)
        (hung,) = wait_until("rank 3's data loader hanging", lambda: [
            i for i in range(4) if "data loader hangs at step 40" in job.log(i)] or (
            any(job.agents[i][0].poll() is not None for i in range(4)) and job.fail(0, "hang")))
        job.kill(hung)
        survivors = [i for i in range(4) if i != hung]
        m = job.wait_line(survivors[0], RESHARDED)
        after = os.path.join(d, f"ckpt-{int(m.group(1)) + 5:012d}.gsck")
        wait_until("training going on (5 more checkpoints)", lambda: os.path.exists(after))
        job.stop()
        expect_ok(job, survivors)
        said = [re.search(RESHARDED, job.log(i)) for i in survivors]
        assert all(said) and len({m.groups() for m in said}) == 1, \
            [m and m.group(0) for m in said]
        step, agreed = int(said[0].group(1)), int(said[0].group(2), 16)
        text = job.log(survivors[0])
        ck = read_checkpoint(os.path.join(d, f"ckpt-{step:012d}.gsck"))
        assert ck["step"] == step and len(ck["bufs"]) == 3, (ck["step"], len(ck["bufs"]))
        assert fnv1a_of_buffers(ck["bufs"]) == agreed, \
            f"the state resharded at step {step} is not the checkpoint's of that step"
        r = regroup_line(text)
        print(f"rank 3 of 4 killed: the survivors resharded step {step}'s params and AdamW "
              f"moments (hash {agreed:016x}, the checkpoint's); {r.group(0)}")
    finally:
        job.close()


def run_case(cases, what):
    """Runs case_CASE of `cases` (a module's globals) and removes its
    folders however it ends: the exit status (77: no data to train on)."""
    if not os.path.isdir(FASHION):
        print(f"skip: {FASHION} missing (apt-get install dataset-fashion-mnist)")
        return 77
    try:
        cases["case_" + CASE]()
    finally:
        for d in SCRATCH:
            shutil.rmtree(d, ignore_errors=True)
    print(f"{what} {CASE}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(run_case(globals(), "elastic"))
