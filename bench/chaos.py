#!/usr/bin/env python3
"""Elastic training under faults: trials of a 4-rank elastic job
(--world-size 2:4) on CPU, each with one fault at a random moment of its
training, and what the job made of it.

Faults, drawn in turn (each kind as often as the others) and shuffled:
  kill   SIGKILL of one rank (each rank as often as the others, rank 0
         included): the process dies, its sockets close at once;
  stop   SIGSTOP of one rank for the heartbeat timeout + 1.5 s, then
         SIGCONT: a silent rank, evicted by the coordinator; once
         continued it learns it was evicted, joins again as a new agent
         and the world grows back to 4 at a step boundary;
  netns  (root, where network namespaces can be made) the job spread over
         two nodes of two ranks each, every node a network namespace with
         its own /dev/shm (tests/cluster.py); node b's cable pulled for the
         heartbeat timeout + 1.5 s, then plugged back: node b's ranks are
         evicted, node a's go on as a world of 2, node b's join again.

First uninterrupted 4-rank runs of the same job (the anchors: their final
accuracies), one per --anchor-seeds (the job's --seed; the trials use the
first). A trial's accuracy passes when it is no more than 0.5 points below
the lowest anchor: a fault may cost accuracy, and a run that ends more
accurate than the anchors is no miss (one anchor, and a band on both sides
of it, counted 8 of 12 such runs as misses, every one above). Each fault comes once rank 0's progress line passes a uniform
random fraction (FAULT_WINDOW) of the run's steps. The coordinator runs
with a short --heartbeat-timeout (default 2 s; the interval its default
1 s), so that a silent rank costs seconds, not tens. The kill and stop
trials run on this host (one node, shared-memory links), the netns ones
on the namespaces (TCP between the nodes).

Per trial, all on one clock (the driver's, and the logs' UTC stamps):
  abort    fault → the coordinator's `generation N aborted`
  noticed  fault → the first surviving rank noticing (a failed collective,
           or the abort in its heartbeat's reply)
  regroup  abort → the last survivor's `continuing with` line (state shared
           and checked: its next step is the new generation's first), and
           in brackets the same from the later of abort and noticing; also
           the engine's own `regroup X s` (its noticing → state shared, the
           slowest survivor) and the coordinator's `lost_s` of the new
           generation
  steps lost  the newest step a survivor was in (the step in flight is
           discarded) minus the step the new generation starts from
  grew back  a stopped or cut-off rank joined again: the world and step,
           and how long after it came back
  accuracy rank 0's final test accuracy, against the first anchor (the
           same --seed)
  left     processes of the trial still alive after it (any whose command
           line names the trial's job), files in /dev/shm named gs-* or
           gradsync* (each node's, for netns) that were not there before

A trial is ok when every agent that was not killed exited 0 (a stopped or
cut-off rank included: it must rejoin and finish), rank 0 printed its
final accuracy and nothing was left running. After the trials, the cost of
the deferred SGD: an elastic engine applies a step's SGD only once every
allreduce of the step succeeded; no-failure runs at --world-size 4 and
2:4, alternating, --ab-runs each, median step time from the agents'
timing line, with the model in one pack and in one pack per parameter.

usage: chaos.py --bin DIR [--trials 20] [--seed 1] [--epochs 80] [--anchor-seeds 7,8,9]
                [--heartbeat-timeout 2] [--faults kill,stop,netns]
                [--ab-runs 4] [--keep-logs DIR] [--json PATH] [--markdown PATH]
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from benchlib import FINAL_RE, PART_RE, TIMING_RE, subset, tail  # noqa: E402
from cluster import Cluster, missing_tool  # noqa: E402

WORLD, RANGE = 4, "2:4"
# The tests' small model (tests/test_elastic.py): an epoch is about half a
# second at 4 ranks on two cores.
TRAIN = ["--reduce", "mean", "--layers", "784,64,10", "--batch", "64",
         "--log-interval", "100ms", "--device", "cpu", "--threads", "1"]
TRIAL_SEED = 7  # the trials' --seed; the anchors' are --anchor-seeds
BAND_POINTS = 0.5  # a trial may end this far below the lowest anchor, and any amount above
FAULTS = ("kill", "stop", "netns")
FAULT_WINDOW = (0.2, 0.5)  # of the run's steps
SILENCE_EXTRA_S = 1.5      # a silent rank stays silent this much past the heartbeat timeout
TRIAL_TIMEOUT_S = 45       # from the fault to every surviving agent's exit
LATE_S = 15                # a stopped or cut-off rank's time to finish after the others
LOG_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z (\w+) (\S+) \[([^\]]*)\] (.*)$",
                    re.M)
SHM_RE = re.compile(r"^(gs-|gradsync)")
HTTP_GET = ("import sys, urllib.request; "
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")


def stamp(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def log_lines(text):
    """[(time, message)] of the stamped lines of a log."""
    return [(stamp(m.group(1)), m.group(5)) for m in LOG_RE.finditer(text)]


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return env


class Host:
    """Every process on this machine, the agents on one node 'n'."""
    name = "host"
    placement = [(None, ["--node", "n", "--local-rank", str(i)]) for i in range(WORLD)]

    def spawn(self, node, argv, log):
        with open(log, "w") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=clean_env(),
                                    start_new_session=True)

    def listen(self):
        return "127.0.0.1:0"

    def get(self, url):
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    def shm(self):
        return {"host": {f for f in os.listdir("/dev/shm") if SHM_RE.match(f)}}


class Nodes:
    """A Cluster: the coordinator on node c, two agents on each of nodes a
    and b (their host names tell them apart)."""
    name = "nodes"
    placement = [(n, ["--local-rank", str(i)]) for n in "ab" for i in range(2)]

    def __init__(self, cl):
        self.cl = cl

    def spawn(self, node, argv, log):
        with open(log, "w") as f:
            return self.cl.run(node or "c", argv, stdout=f, env=clean_env(),
                               start_new_session=True)

    def listen(self):
        return "10.77.0.1:0"

    def get(self, url):
        return self.cl.exec("c", ["/usr/bin/python3", "-c", HTTP_GET, url]).stdout

    def shm(self):
        return {n: set(files) for n, files in self.cl.shm_files().items()}


class Job:
    """One job: a coordinator and WORLD agents at a place, every output in a
    file of `folder`."""

    def __init__(self, a, place, name, folder, extra=(), seed=TRIAL_SEED):
        self.a, self.place, self.name, self.dir = a, place, name, folder
        self.coord_log = os.path.join(folder, "coordinator.log")
        listen = place.listen()
        self.coord = place.spawn(None, [a.coordinator, "--listen", listen, "--http", listen,
                                        "--heartbeat-timeout", f"{a.heartbeat_timeout:g}s"],
                                 self.coord_log)
        m = self.wait_for(self.coord_log, r"listening rpc=(\S+) http=(\S+)", 15, self.coord)
        self.rpc, self.http = m.group(1), m.group(2)
        self.agents = []
        for i, (node, where) in enumerate(place.placement):
            argv = [a.agent, "--coordinator", self.rpc, "--job", name, "--world-size", a.world,
                    "--epochs", str(a.epochs), "--data", a.data, *where, *TRAIN,
                    "--seed", str(seed), *extra]
            log = os.path.join(folder, f"agent{i}.log")
            self.agents.append((place.spawn(node, argv, log), log))

    @staticmethod
    def wait_for(path, pattern, timeout, proc=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, read(path))
            if m:
                return m
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"{path}: no {pattern!r} within {timeout} s:\n{tail(read(path))}")

    def ranks(self, timeout=60):
        """Waits until every agent joined generation 1; {rank: agent index}."""
        out = {}
        for i, (p, log) in enumerate(self.agents):
            m = self.wait_for(log, r"joined generation 1: rank (\d+) of", timeout, p)
            out[int(m.group(1))] = i
        for i, (p, log) in enumerate(self.agents):
            self.wait_for(log, r"host backend connected", timeout, p)
        return out

    def wait(self, timeout, late=()):
        """Every agent's exit code (None: still running at the deadline);
        the agents in `late` get at most LATE_S more once the others are done."""
        deadline = time.time() + timeout
        codes = {}
        for group in ([i for i in range(len(self.agents)) if i not in late], late):
            for i in group:
                try:
                    codes[i] = self.agents[i][0].wait(max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    codes[i] = None
            deadline = min(deadline, time.time() + LATE_S)
        return [codes[i] for i in range(len(self.agents))]

    def wait_step(self, log, fraction, timeout=120):
        """Waits until rank 0's progress line (in `log`) passes `fraction` of
        the run's steps."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            steps = re.findall(r"^step (\d+)/(\d+) ", read(log), re.M)
            if steps and int(steps[-1][0]) >= fraction * int(steps[-1][1]):
                return
            time.sleep(0.01)
        raise RuntimeError(f"rank 0 did not reach {fraction:.0%} of its steps in {timeout} s")

    def status(self):
        """(/jobs/NAME as JSON or None, /metrics text)."""
        try:
            job = json.loads(self.place.get(f"http://{self.http}/jobs/{self.name}"))
        except (OSError, ValueError, RuntimeError):
            job = None
        try:
            metrics = self.place.get(f"http://{self.http}/metrics")
        except (OSError, RuntimeError):
            metrics = ""
        return job, metrics

    def stop_coordinator(self):
        self.coord.send_signal(signal.SIGTERM)
        try:
            return self.coord.wait(10)
        except subprocess.TimeoutExpired:
            return None

    def leftovers(self):
        """Descriptions of this job's processes still alive; kills them."""
        left = []
        for p, log in [(self.coord, self.coord_log)] + self.agents:
            if p.poll() is None:
                left.append(f"pid {p.pid} ({os.path.basename(log)})")
                p.kill()
                p.wait()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"--job" in argv and self.name.encode() in argv:
                left.append(f"pid {pid} ({argv[0].decode(errors='replace')})")
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        return left

    def close(self):
        for p, _ in [(self.coord, None)] + self.agents:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
                p.kill()
                p.wait()


def final_of(job):
    """(accuracy, training seconds) from the agent that printed `final:`."""
    for _, log in job.agents:
        m = FINAL_RE.search(read(log))
        if m:
            return float(m.group(1)), float(m.group(5))
    return None, None


def run_anchor(a, place, seed):
    folder = tempfile.mkdtemp(prefix=f"gs-chaos-anchor-{seed}-", dir=a.logs)
    job = Job(a, place, f"chaos-anchor-{seed}-{os.getpid()}", folder, seed=seed)
    try:
        job.ranks()
        codes = job.wait(TRIAL_TIMEOUT_S)
        acc, train_s = final_of(job)
        if codes != [0] * WORLD or acc is None:
            raise RuntimeError(f"the uninterrupted run failed (exit codes {codes}); logs in "
                               f"{folder}:\n{tail(read(job.agents[0][1]))}")
        job.stop_coordinator()
    finally:
        job.close()
    shutil.rmtree(folder, ignore_errors=True)
    return acc, train_s


def plan(a):
    """The trials' faults and victims: each kind (and each rank within a
    kind) in turn, then shuffled, so every one comes up."""
    rng = random.Random(a.seed)
    kinds = [a.faults[i % len(a.faults)] for i in range(a.trials)]
    rng.shuffle(kinds)
    victims = {k: [] for k in a.faults}
    out = []
    for k in kinds:
        if not victims[k]:
            victims[k] = list(range(WORLD))
            rng.shuffle(victims[k])
        out.append({"fault": k, "victim": victims[k].pop(),
                    "at": rng.uniform(*FAULT_WINDOW)})
    return out


def inject(a, job, cl, t, ranks, res):
    """Applies trial t's fault; fills res with what it did and when (the
    driver's clock): `t0` the fault, `t1` its end (the victim gone, or
    back), `victim_agents`."""
    silence = a.heartbeat_timeout + SILENCE_EXTRA_S
    if t["fault"] == "netns":
        res["victim_agents"] = [i for i, (n, _) in enumerate(job.place.placement) if n == "b"]
        res["what"] = f"node b's link down {silence:g} s"
        res["t0"] = time.time()
        cl.link("b", "down")
        time.sleep(silence)
        cl.link("b", "up")
        res["t1"] = time.time()
        return
    i = ranks[t["victim"]]
    p = job.agents[i][0]
    res["victim_agents"] = [i]
    if t["fault"] == "kill":
        res["what"] = f"kill -9 rank {t['victim']}"
        res["t0"] = time.time()
        os.kill(p.pid, signal.SIGKILL)
        p.wait()  # the process gone: its sockets are closed
        res["t1"] = time.time()
        return
    res["what"] = f"SIGSTOP rank {t['victim']} {silence:g} s"
    res["t0"] = time.time()
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(silence)
    os.kill(p.pid, signal.SIGCONT)
    res["t1"] = time.time()


NOTICE_RE = re.compile(r"generation (\d+) (?!regroups to admit)(.*); regrouping from step (\d+)$")
HB_ABORT_RE = re.compile(r"generation (\d+) aborted: ")
RESUME_RE = re.compile(r"generation (\d+): (.*); continuing with (\d+) ranks from step (\d+) "
                       r"\(detect ([0-9.]+) s, regroup ([0-9.]+) s\)")
GROW_RE = re.compile(r"generation (\d+): new ranks joined; continuing with (\d+) ranks from step "
                     r"(\d+) \(regroup ([0-9.]+) s\)")
INFLIGHT_RE = re.compile(r"\bstep (\d+): ")


def first(lines, rx, since):
    for ts, msg in lines:
        m = rx.search(msg)
        if m and ts >= since:
            return ts, m
    return None, None


def measure(res, job, codes, status):
    """Fills res with the trial's measures from the logs and the status."""
    t0, victims = res["t0"], res["victim_agents"]
    since = t0 - 0.002  # log stamps are truncated to the millisecond
    coord = log_lines(read(job.coord_log))
    early = [msg for ts, msg in coord if ts < since and " aborted: " in msg]
    if early:
        res["problems"].append(f"aborted before the fault: {early[0]}")
    abort_ts, m = first(coord, re.compile(r"generation (\d+) aborted: (.*)"), since)
    res["coord_abort"] = m.group(2) if m else None
    notices, resumes, grows, inflight = [], [], [], []
    for i, (_, log) in enumerate(job.agents):
        lines = log_lines(read(log))
        if i in victims:
            res["rejoined"] = res.get("rejoined", False) or \
                "join again as a new agent" in read(log)
            continue
        ts_n, mn = first(lines, NOTICE_RE, since)
        ts_h, _ = first(lines, HB_ABORT_RE, since)
        seen = [x for x in (ts_n, ts_h) if x is not None]
        if seen:
            notices.append(min(seen))
        if mn:
            s = INFLIGHT_RE.search(mn.group(2))
            inflight.append(int(s.group(1)) if s else int(mn.group(3)))
        ts_r, mr = first(lines, RESUME_RE, since)
        if mr:
            resumes.append((ts_r, mr))
        ts_g, mg = first(lines, GROW_RE, ts_r or since)
        if mg:
            grows.append((ts_g, mg))
    first_notice = min(notices) if notices else None
    known = [x for x in (abort_ts, first_notice) if x is not None]
    res.update(abort_s=abort_ts - t0 if abort_ts else None,
               notice_s=first_notice - t0 if first_notice else None,
               detect_s=min(known) - t0 if known else None)
    if resumes:
        last = max(ts for ts, _ in resumes)
        m = resumes[0][1]
        res.update(abort_to_step_s=last - abort_ts if abort_ts else None,
                   regroup_s=last - max(known) if known else None,
                   engine_regroup_s=max(float(mr.group(6)) for _, mr in resumes),
                   world_after=int(m.group(3)), from_step=int(m.group(4)),
                   generation=int(m.group(1)), reason=m.group(2))
        if inflight:
            res["steps_lost"] = max(inflight) - res["from_step"]
    if grows:
        res.update(grew_to=int(grows[0][1].group(2)), grew_at_step=int(grows[0][1].group(3)),
                   grow_regroup_s=max(float(mg.group(4)) for _, mg in grows),
                   back_s=max(ts for ts, _ in grows) - res["t1"])
    job_json, metrics = status
    if job_json and res.get("generation"):
        for g in job_json.get("generations", []):
            if g.get("generation") == res["generation"]:
                res["coord_lost_s"] = g.get("lost_s")
    m = re.search(r"^gradsync_regroups_total (\d+)", metrics, re.M)
    res["regroups_total"] = int(m.group(1)) if m else None
    res["accuracy"], _ = final_of(job)
    res["exit_codes"] = codes


def run_trial(a, n, t, place, cl):
    res = {"trial": n, "fault": t["fault"], "problems": [], "ok": False}
    folder = tempfile.mkdtemp(prefix=f"gs-chaos-{n:02d}-", dir=a.logs)
    shm_before = place.shm()
    job = Job(a, place, f"chaos-{a.seed}-{n}-{os.getpid()}", folder)
    try:
        ranks = job.ranks()
        start = time.time()
        job.wait_step(job.agents[ranks[0]][1], t["at"])
        inject(a, job, cl, t, ranks, res)
        res["at_s"] = res["t0"] - start
        codes = job.wait(TRIAL_TIMEOUT_S - (time.time() - res["t0"]), res["victim_agents"])
        measure(res, job, codes, job.status())
        coord_rc = job.stop_coordinator()
        if coord_rc != 0:
            res["problems"].append(f"coordinator exited {coord_rc}")
    except RuntimeError as e:
        res["problems"].append(str(e).splitlines()[0])
    finally:
        left = job.leftovers()
        job.close()
    shm_after = place.shm()
    new_shm = sorted(f"{n_}:{f}" for n_, files in shm_after.items()
                     for f in files - shm_before.get(n_, set()))
    res["left"] = left + new_shm
    for i, c in enumerate(res.get("exit_codes", [])):
        killed = t["fault"] == "kill" and i in res.get("victim_agents", [])
        if c is None:
            late = i in res.get("victim_agents", [])
            res["problems"].append(
                f"agent {i} still running " + (f"{LATE_S} s after the others exited" if late else
                                               f"{TRIAL_TIMEOUT_S} s after the fault"))
        elif c != (-signal.SIGKILL if killed else 0):
            res["problems"].append(f"agent {i} exited {c}")
    if res.get("accuracy") is None:
        res["problems"].append("no final accuracy")
    if res["left"]:
        res["problems"].append("left running: " + ", ".join(res["left"]))
    res["ok"] = not res["problems"]
    if res["ok"] and not a.keep_logs:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        res["logs"] = folder
    return res


def ab_runs(a, place):
    """Step times of no-failure 4-rank runs, fixed (4) against elastic
    (2:4), alternating; {row: {side: [timing dicts]}}."""
    rows = {"1 pack": [], "1 pack per parameter": ["--pack-threshold", "1KiB"]}
    out = {r: {"4": [], RANGE: []} for r in rows}
    saved = a.world, a.epochs
    a.epochs = a.ab_epochs
    try:
        for i in range(a.ab_runs):
            for row, extra in rows.items():
                for world in ("4", RANGE):
                    a.world = world
                    folder = tempfile.mkdtemp(prefix="gs-chaos-ab-", dir=a.logs)
                    job = Job(a, place, f"chaos-ab-{i}-{os.getpid()}", folder, extra)
                    try:
                        codes = job.wait(TRIAL_TIMEOUT_S)
                        job.stop_coordinator()
                    finally:
                        job.close()
                    text = "".join(read(log) for _, log in job.agents)
                    tm = TIMING_RE.search(read(job.agents[0][1])) or TIMING_RE.search(text)
                    if codes != [0] * WORLD or not tm:
                        print(f"A/B {row} --world-size {world}: FAILED (exit codes {codes}); "
                              f"logs in {folder}", flush=True)
                        continue
                    shutil.rmtree(folder, ignore_errors=True)
                    parts = {k: float(v) for k, v in PART_RE.findall(tm.group(2))}
                    packs = re.search(r"in (\d+) packs", text)
                    out[row][world].append({"step_ms": float(tm.group(1)), "parts_ms": parts,
                                            "packs": int(packs.group(1)) if packs else None})
                    print(f"A/B run {i + 1} {row} --world-size {world}: step "
                          f"{float(tm.group(1)):.3f} ms ({' + '.join(f'{k} {v:.3f}' for k, v in parts.items())})",
                          flush=True)
    finally:
        a.world, a.epochs = saved
    return out


def median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def verdict(ok):
    return "PASS" if ok else "MISS"


def cell(v, spec):
    return "–" if v is None else format(v, spec)


def trial_rows(anchor, results):
    rows = ["| # | fault | at s | abort s | noticed s | regroup s: abort → first step (after noticing) "
            "| engine regroup s | coordinator lost_s | world from step (lost) | grew back "
            "| accuracy (Δ points) | result |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        acc = r.get("accuracy")
        delta = f" ({(acc - anchor['accuracy']) * 100:+.2f})" if acc is not None else ""
        grew = "–" if r["fault"] == "kill" else "no"
        if r.get("grew_to"):
            grew = f"{r['grew_to']} at {r['grew_at_step']}, {r['back_s']:.1f} s after"
        world = "–"
        if r.get("world_after"):
            world = f"{r['world_after']} from {r['from_step']} ({cell(r.get('steps_lost'), 'd')})"
        rows.append(
            f"| {r['trial']} | {r.get('what', r['fault'])} | {cell(r.get('at_s'), '.1f')} "
            f"| {cell(r.get('abort_s'), '.3f')} | {cell(r.get('notice_s'), '.3f')} "
            f"| {cell(r.get('abort_to_step_s'), '.3f')} ({cell(r.get('regroup_s'), '.3f')}) "
            f"| {cell(r.get('engine_regroup_s'), '.2f')} | {cell(r.get('coord_lost_s'), '.3f')} "
            f"| {world} | {grew} | {cell(acc, '.4f')}{delta} "
            f"| {'ok' if r['ok'] else 'FAILED: ' + '; '.join(r['problems'])} |")
    return rows


def summary_rows(a, anchor, results):
    hb = a.heartbeat_timeout
    done = [r for r in results if r["ok"]]
    kills = [r for r in results if r["fault"] == "kill"]
    silent = [r for r in results if r["fault"] != "kill"]
    # In points, rounded as printed (the accuracies have 4 digits).
    delta = {r["trial"]: round((r["accuracy"] - anchor["accuracy"]) * 100, 2) for r in done}
    lowest = min(anchor["seeds"].values())
    above_floor = [r for r in done if round((r["accuracy"] - lowest) * 100, 2) >= -BAND_POINTS]
    within = [r for r in done if abs(delta[r["trial"]]) <= BAND_POINTS]
    left = sum(len(r["left"]) for r in results)

    def med(rs, key):
        return median([r.get(key) for r in rs])

    rows = ["| measure | median | target | |", "|---|---|---|---|",
            f"| trials finished | {len(done)}/{len(results)} | all | "
            f"{verdict(len(done) == len(results))} |"]
    if kills:
        m = med(kills, "detect_s")
        rows += [f"| detection, process death: kill → first sign ({len(kills)} trials) "
                 f"| {cell(m, '.3f')} s | ≤ 1 s | {verdict(m is not None and m <= 1)} |",
                 f"| of which the killed process's teardown (kill → reaped) "
                 f"| {cell(median([r['t1'] - r['t0'] for r in kills if 't1' in r]), '.3f')} s | | |"]
    if silent:
        m = med(silent, "abort_s")
        rows += [f"| detection, silent rank or node: fault → coordinator's abort "
                 f"({len(silent)} trials) | {cell(m, '.3f')} s | ≤ {hb:g} s (heartbeat timeout) "
                 f"| {verdict(m is not None and m <= hb)} |",
                 f"| the abort reaching the survivors (abort → first noticing), silent "
                 f"| {cell(median([r['notice_s'] - r['abort_s'] for r in silent if r.get('notice_s') is not None and r.get('abort_s') is not None]), '.3f')} s "
                 f"| | |"]
    m = med(results, "abort_to_step_s")
    rows += [f"| regroup, abort → first step of the new generation ({len(results)} trials) "
             f"| {cell(m, '.3f')} s | ≤ 1 s | {verdict(m is not None and m <= 1)} |"]
    for what, rs in (("process death", kills), ("silent rank or node", silent)):
        if rs:
            rows.append(f"| regroup after {what}: abort → first step; after noticing "
                        f"| {cell(med(rs, 'abort_to_step_s'), '.3f')} s; "
                        f"{cell(med(rs, 'regroup_s'), '.3f')} s | | |")
    rows += [f"| steps lost | {cell(med(results, 'steps_lost'), '.0f')} "
             f"(max {cell(max([r.get('steps_lost') or 0 for r in results], default=None), 'd')}) "
             f"| | |",
             f"| final accuracy no more than {BAND_POINTS:g} points below the lowest anchor "
             f"({lowest:.4f}; seeds " + ", ".join(f"{s}: {v:.4f}" for s, v in anchor["seeds"].items())
             + f") | {len(above_floor)}/{len(results)} (median Δ against seed {TRIAL_SEED} "
             f"{cell(median(list(delta.values())), '+.2f')} points) | all "
             f"| {verdict(len(above_floor) == len(results))} |",
             f"| final accuracy within {BAND_POINTS:g} points of seed {TRIAL_SEED}'s anchor, "
             f"either side | {len(within)}/{len(results)} | | |",
             f"| left running (processes, /dev/shm files) | {left} in all | 0 | "
             f"{verdict(left == 0)} |"]
    return rows


def ab_rows(a, ab):
    rows = [f"Deferred SGD: no-failure runs, 4 ranks, {a.ab_epochs} epochs, fixed "
            f"`--world-size 4` against elastic `--world-size {RANGE}`, alternating, medians of "
            f"{a.ab_runs} (the agents' timing line):", "",
            "| packs | world | step ms | comm-wait ms | optimizer ms | elastic vs fixed |",
            "|---|---|---|---|---|---|"]
    for row, sides in ab.items():
        base = median([x["step_ms"] for x in sides["4"]])
        for world, runs in sides.items():
            step = median([x["step_ms"] for x in runs])
            cw = median([x["parts_ms"].get("comm-wait") for x in runs])
            opt = median([x["parts_ms"].get("optimizer") for x in runs])
            npk = median([x["packs"] for x in runs])
            rel = f"{(step / base - 1) * 100:+.1f} %" if world != "4" and step and base else ""
            rows.append(f"| {row} ({cell(npk, '.0f')}) | {world} | {cell(step, '.3f')} "
                        f"| {cell(cw, '.3f')} | {cell(opt, '.3f')} | {rel} |")
    return rows


def report(a, anchor, results, ab, netns_note):
    hb = a.heartbeat_timeout
    lines = [f"## Elastic chaos: {len(results)} trials of a 4-rank `--world-size {RANGE}` job "
             f"({platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})", "",
             f"Seed {a.seed}; `--layers 784,64,10 --batch 64 --reduce mean --seed {TRIAL_SEED}`, "
             f"{a.epochs} epochs; coordinator `--heartbeat-timeout {hb:g}s` (interval 1 s); "
             f"faults at {FAULT_WINDOW[0]:.0%}–{FAULT_WINDOW[1]:.0%} of the steps; "
             f"a silent rank or node is silent {hb + SILENCE_EXTRA_S:g} s, then resumes. "
             f"Anchors (uninterrupted, 4 ranks): accuracy "
             + ", ".join(f"{v:.4f} (seed {s})" for s, v in anchor["seeds"].items())
             + f", training {anchor['train_s']:.1f} s. Times in seconds from the fault.", ""]
    if netns_note:
        lines += [netns_note, ""]
    lines += trial_rows(anchor, results) + [""] + summary_rows(a, anchor, results)
    if ab:
        lines += [""] + ab_rows(a, ab)
    return "\n".join(lines) + "\n"


def netns_possible():
    if os.geteuid() != 0:
        return None, "netns trials skipped: network namespaces need root"
    tool = missing_tool()
    if tool:
        return None, f"netns trials skipped: {tool} is not installed"
    try:
        return Cluster(prefix="gsch").__enter__(), None
    except RuntimeError as e:
        return None, f"netns trials skipped: cannot make network namespaces here: {e}"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="folder with gradsync-agent and gradsync-coordinator")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=1, help="draws the faults, victims and times")
    p.add_argument("--epochs", type=int, default=80,
                   help="epochs of each trial's job (long enough to outlive a 3.5 s fault)")
    p.add_argument("--heartbeat-timeout", type=float, default=2.0, help="the coordinator's, seconds")
    p.add_argument("--anchor-seeds", default=f"{TRIAL_SEED},8,9",
                   help="the --seed of each uninterrupted run; the first is the trials' own")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"subset of {','.join(FAULTS)}")
    p.add_argument("--ab-runs", type=int, default=4, help="runs of each side of the deferred-SGD "
                   "comparison (0: none)")
    p.add_argument("--ab-epochs", type=int, default=2)
    p.add_argument("--keep-logs", help="keep every trial's logs under this folder (failed "
                   "trials' logs are always kept)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--markdown", help="also write the tables here")
    a = p.parse_args()
    a.faults = subset(p, "--faults", a.faults, FAULTS)
    if a.trials < 0:
        p.error("--trials >= 0")
    try:
        a.anchor_seeds = [int(s) for s in a.anchor_seeds.split(",")]
    except ValueError:
        p.error("--anchor-seeds: whole numbers separated by commas, e.g. 7,8,9")
    if a.anchor_seeds[0] != TRIAL_SEED:
        p.error(f"--anchor-seeds: the first is the trials' own seed, {TRIAL_SEED}")
    a.bin = os.path.abspath(a.bin)
    a.agent = os.path.join(a.bin, "gradsync-agent")
    a.coordinator = os.path.join(a.bin, "gradsync-coordinator")
    for exe in (a.agent, a.coordinator):
        if not os.access(exe, os.X_OK):
            p.error(f"no {os.path.basename(exe)} in {a.bin}")
    if not os.path.isdir(a.data):
        p.error(f"{a.data} missing (apt-get install dataset-fashion-mnist)")
    a.world = RANGE
    return a


def main():
    a = parse_args()
    a.logs = a.keep_logs or tempfile.gettempdir()
    os.makedirs(a.logs, exist_ok=True)
    t_start = time.time()
    cl, netns_note = (None, None)
    if "netns" in a.faults:
        cl, netns_note = netns_possible()
        if not cl:
            a.faults = [f for f in a.faults if f != "netns"] or ["kill"]
            print(netns_note, flush=True)
    host = Host()
    results, ab = [], None
    try:
        anchor = {"seeds": {}}
        for seed in a.anchor_seeds:
            acc, train_s = run_anchor(a, host, seed)
            anchor["seeds"][seed] = acc
            if seed == TRIAL_SEED:
                anchor.update(accuracy=acc, train_s=train_s)
            print(f"anchor: uninterrupted 4 ranks, --seed {seed}, test accuracy {acc:.4f}, "
                  f"training {train_s:.1f} s; coordinator --heartbeat-timeout "
                  f"{a.heartbeat_timeout:g}s", flush=True)
        for n, t in enumerate(plan(a), 1):
            r = run_trial(a, n, t, Nodes(cl) if t["fault"] == "netns" else host, cl)
            results.append(r)
            print(f"trial {n}: {r.get('what', r['fault'])} at {cell(r.get('at_s'), '.1f')} s: "
                  f"abort {cell(r.get('abort_s'), '.3f')} s, noticed {cell(r.get('notice_s'), '.3f')} s, "
                  f"first step {cell(r.get('abort_to_step_s'), '.3f')} s after the abort, "
                  f"world {cell(r.get('world_after'), 'd')} from step {cell(r.get('from_step'), 'd')}, "
                  f"steps lost {cell(r.get('steps_lost'), 'd')}, accuracy {cell(r.get('accuracy'), '.4f')}: "
                  f"{'ok' if r['ok'] else 'FAILED: ' + '; '.join(r['problems']) + ' (logs ' + r['logs'] + ')'}",
                  flush=True)
        if a.ab_runs:
            ab = ab_runs(a, host)
    finally:
        if cl:
            cl.__exit__()
    md = report(a, anchor, results, ab, netns_note)
    print()
    print(md, end="")
    print(f"\n(whole bench: {time.time() - t_start:.0f} s)", flush=True)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": a.seed, "anchor": anchor, "trials": results, "ab": ab}, f, indent=2)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
