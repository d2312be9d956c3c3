#!/usr/bin/env python3
"""Hang injection: how often, and how fast, the coordinator names the rank
that holds a job up (`waiting_on` in /jobs/NAME), and what saying where
each rank is costs the training step.

Each fault runs --runs times on a fresh 4-rank MLP job (tests/test_stalls.py
makes them the same way):

  sigstop    rank 2 frozen with SIGSTOP; timed from the signal
  data_hang  rank 1's data loading sleeps (--inject-fault data-hang); timed
             from the moment the coordinator says rank 1 entered its data
             phase (its phase_s when first named)
  straggler  rank 3 computes twice as long (--inject-fault straggler); right
             when it is named a straggler and the job never called stalled
             in the --watch seconds after; not timed
  slow_link  two network-namespace nodes of two ranks each, node a's link
             limited to 4 Mbit/s with tc tbf (root only; skipped otherwise);
             right when the ranks of node a that send to node b are named;
             timed from the tc command

A run is named correctly when the first verdict that names anyone as
holding the job up (for the straggler: at all) names the right rank for
the right cause. /jobs/NAME is read every 20 ms, so a
time is at most that late.

The overhead rows: the same training run (--ranks, --steps) with each
rank's progress on and off (--no-progress), alternating, --pairs times;
samples/s of each (rank 0's timing line), and their ratio. Runs differ by
more than the instrumentation costs, so the operations are also counted:
what each costs (bench/progress_cost), how many a real step makes (its
phase changes from a step timeline, its poll() calls under strace: each
sleep of the ring adds at most a send-wait mark and, on a TCP link, one
ioctl), and their share of the step.

usage: bench/hang_inject.py --bin BUILD/bin [--runs 10] [--faults sigstop,...]
                            [--pairs 5] [--steps 5000] [--ranks 2] [--markdown F] [--json F]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
import test_stalls  # noqa: E402  (the faults, as the tests make them)
from benchlib import fmt, parse_ours, publish, run_timed, subset  # noqa: E402

FAULTS = ("sigstop", "data_hang", "straggler", "slow_link")
POLL_S = 0.02


def first_verdict(job, timeout=60, hang=False):
    """Polls /jobs/j until waiting_on names someone (with `hang`, as holding
    the job up): (its JSON, when), or (None, None) past the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = job.job()
        if j.get("waiting_on") and (j["waiting_on"]["hang"] or not hang):
            return j, time.monotonic()
        time.sleep(POLL_S)
    return None, None


def run_sigstop():
    job = test_stalls.Job(4)
    try:
        job.wait_training()
        t0 = time.monotonic()
        job.agents[2].send_signal(signal.SIGSTOP)
        j, t = first_verdict(job, hang=True)
        w = j and j["waiting_on"]
        return {"ok": bool(w and w["kind"] == "no_heartbeat" and w["ranks"] == [2]),
                "s": t - t0 if t else None, "verdict": w and w["reason"]}
    finally:
        job.close()


def run_data_hang():
    job = test_stalls.Job(4, lambda r: ["--inject-fault", "data-hang:1:400:1h"])
    try:
        job.wait_training()
        j, _ = first_verdict(job, hang=True)
        w = j and j["waiting_on"]
        ok = bool(w and w["kind"] == "phase" and w["ranks"] == [1] and w["phase"] == "data")
        rank1 = j and next(r for r in j["ranks"] if r["rank"] == 1)
        return {"ok": ok, "s": rank1["phase_s"] if ok else None, "verdict": w and w["reason"]}
    finally:
        job.close()


def run_straggler(watch):
    job = test_stalls.Job(4, lambda r: ["--inject-fault", "straggler:3:2"])
    try:
        job.wait_training()
        j, _ = first_verdict(job)
        w = j and j["waiting_on"]
        ok = bool(w and w["kind"] == "straggler" and w["ranks"] == [3])
        deadline = time.monotonic() + watch
        while ok and time.monotonic() < deadline:
            j = job.job()
            ok = j["state"] == "running" and not (j["waiting_on"] or {}).get("hang")
            if not ok:
                w = j["waiting_on"] or {"reason": f"state {j['state']}: {j['reason']}"}
            time.sleep(0.1)
        return {"ok": ok, "s": None, "verdict": w and w["reason"]}
    finally:
        job.close()


def run_slow_link():
    cl = test_stalls.netns_cluster("gshi")
    if not cl:
        return None
    try:
        nodes = test_stalls.NodesJob(cl, per_node=2)
        nodes.wait_training()
        slow = nodes.ranks_sending_off("a")
        t0 = time.monotonic()
        nodes.throttle("a")
        while time.monotonic() < t0 + 60:
            w = nodes.job().get("waiting_on")
            if w and w["kind"] != "straggler":  # 4 ranks on a small machine jitter
                return {"ok": w["kind"] == "slow_link" and w["ranks"] == slow,
                        "s": time.monotonic() - t0, "verdict": w["reason"]}
            time.sleep(POLL_S)
        return {"ok": False, "s": None, "verdict": None}
    finally:
        cl.__exit__()


def pct(vals, q):
    """The q-quantile (nearest rank) of vals."""
    s = sorted(vals)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def training(a, steps, *extra):
    """The training run the overhead is measured on: --ranks ranks of the
    MLP under gradsync-run, `steps` steps."""
    return [os.path.join(a.bin, "gradsync-run"), "--nproc", str(a.ranks), "--reduce", "mean",
            "--steps", str(steps), "--no-validate", "--threads", "1", *extra]


def overhead(a):
    """Alternating runs with progress on and off: samples/s of each."""
    got = {"on": [], "off": [], "step_ms": []}
    for i in range(a.pairs):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            cmd = training(a, a.steps, "--log-level", "warn",
                           *(["--no-progress"] if mode == "off" else []))
            res, out = run_timed(cmd, 1800)
            r = res if out is None else parse_ours(res, out, a.ranks * 64)
            if r.get("ok"):
                got[mode].append(r["samples_per_sec"])
                if mode == "on" and r.get("step_ms"):
                    got["step_ms"].append(r["step_ms"])
            print(f"overhead pair {i + 1} {mode}: {fmt(r.get('samples_per_sec'), ',.0f')} "
                  f"samples/s{'' if r.get('ok') else ' ' + str(r.get('error'))}", flush=True)
    return got


def op_costs(a):
    """ns per operation of the instrumentation (bench/progress_cost.c)."""
    out = subprocess.run([os.path.join(a.bin, "progress_cost")], capture_output=True, text=True,
                         check=True).stdout
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+) ([\d.]+) ns$", out, re.M)}


def counted_step(a, tcp, steps=3000, traced=20):
    """The same training run as the overhead rows, under strace: its poll()
    and ioctl() calls per rank and step (every thread and process of the
    run: an upper bound on the ring's sleeps), and the phase changes of a
    step, counted from a `traced`-step timeline (POST /jobs/NAME/trace)."""
    if not shutil.which("strace"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        counts = os.path.join(tmp, "strace")
        cmd = ["strace", "-f", "--seccomp-bpf", "-qq", "-c", "-e", "trace=poll,ioctl", "-o", counts,
               *training(a, steps, "--job", "cost")]
        env = dict(os.environ, GRADSYNC_HOST_SHM="0" if tcp else "1")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
        try:
            http = None
            for line in p.stdout:
                m = re.search(r"status at http://([\d.:]+)/status", line)
                if m:
                    http = m.group(1)
                    break
            threading.Thread(target=p.stdout.read, daemon=True).start()
            doc = http and trace_of(http, traced)
            rc = p.wait(timeout=1800)
        finally:
            if p.poll() is None:
                p.kill()
        if rc or not doc:
            return None
        calls = {m.group(2): int(m.group(1)) for m in
                 re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$",
                             open(counts).read(), re.M)}
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    rank_steps = {(e["pid"], e["args"]["step"]) for e in spans}
    per = a.ranks * steps
    return {"traced": traced, "phases": len(spans) / len(rank_steps),
            "polls": calls.get("poll", 0) / per,
            "ioctls": calls.get("ioctl", 0) / per}


def trace_of(http, steps):
    """Job "cost"'s merged timeline of `steps` steps, or None."""
    req = urllib.request.Request(f"http://{http}/jobs/cost/trace?steps={steps}", method="POST")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if req:
                urllib.request.urlopen(req, timeout=10)
                req = None
            with urllib.request.urlopen(f"http://{http}/jobs/cost/trace", timeout=10) as r:
                if r.status == 200:
                    return json.loads(r.read())
        except (OSError, ValueError):
            pass  # the job not there yet, or gone
        time.sleep(0.2)
    return None


def cost_rows(a, step_ms):
    """What the instrumentation's operations cost a step, counted on the
    ring's shared-memory links (one machine) and on TCP (GRADSYNC_HOST_SHM=0,
    as between nodes), against the step of the overhead rows (on one
    machine: a TCP step is longer, so its share is an upper bound)."""
    ns, shm, tcp = op_costs(a), counted_step(a, False), counted_step(a, True)
    if not shm or not tcp:
        return "\n(the per-step count needs strace and a timeline: skipped)\n", None

    def cost(n):
        return n["phases"] * ns["phase"] + n["polls"] * ns["gauge"] + n["ioctls"] * ns["ioctl"]

    def row(name, n):
        share = fmt(100 * cost(n) / 1e6 / step_ms, ".3f") + " %" if step_ms else "n/a"
        return (f"| {name} | {n['phases']:.1f} | {n['polls']:.1f} | {n['ioctls']:.1f} | "
                f"{cost(n):.0f} | {share} |\n")
    return (f"\n| counted per rank and step | phase changes ({ns['phase']:.1f} ns) | "
            f"poll(): send-wait marks at most ({ns['gauge']:.1f} ns) | ioctl() "
            f"({ns['ioctl']:.1f} ns) | ns a step | share of the {fmt(step_ms, '.3f')} ms step |\n"
            f"|---|---|---|---|---|---|\n" + row("shared-memory ring (one machine)", shm)
            + row("TCP ring", tcp)), {"ns": ns, "shm": shm, "tcp": tcp}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build's bin folder")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--watch", type=float, default=5.0,
                    help="seconds a straggler's job is watched for a false stall")
    ap.add_argument("--pairs", type=int, default=5, help="overhead: on/off pairs (0: none)")
    ap.add_argument("--steps", type=int, default=5000, help="overhead: steps per run")
    ap.add_argument("--ranks", type=int, default=2,
                    help="overhead: ranks (2: one a core here; more share the cores, and the "
                         "noise hides what is measured)")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    a = ap.parse_args()
    faults = subset(ap, "--faults", a.faults, FAULTS)
    a.bin = os.path.abspath(a.bin)
    test_stalls.COORD = os.path.join(a.bin, "gradsync-coordinator")
    test_stalls.AGENT = os.path.join(a.bin, "gradsync-agent")
    rows, data = [], {"faults": {}, "overhead": None}
    for f in faults:
        runs = []
        for i in range(a.runs):
            r = run_straggler(a.watch) if f == "straggler" else globals()["run_" + f]()
            if r is None:
                print(f"{f}: skipped (needs root and network namespaces)", flush=True)
                break
            runs.append(r)
            print(f"{f} run {i + 1}: {'named' if r['ok'] else 'WRONG'}"
                  f"{'' if r['s'] is None else ' in %.2f s' % r['s']}: {r['verdict']}",
                  flush=True)
        if not runs:
            continue
        data["faults"][f] = runs
        times = [r["s"] for r in runs if r["ok"] and r["s"] is not None]
        rows.append(f"| {f} | {sum(r['ok'] for r in runs)} of {len(runs)} | "
                    f"{fmt(statistics.median(times) if times else None, '.2f')} | "
                    f"{fmt(pct(times, 0.99) if times else None, '.2f')} |")
    table = ("| fault (4 ranks) | named correctly | time to name, median s | p99 s |\n"
             "|---|---|---|---|\n" + "\n".join(rows) + "\n")
    if a.pairs:
        got = overhead(a)
        on, off = (statistics.median(got[m]) if got[m] else None for m in ("on", "off"))
        data["overhead"] = got
        table += (f"\n| training, {a.ranks} ranks, {a.steps} steps | samples/s (median of {a.pairs}) |\n"
                  f"|---|---|\n| progress off (--no-progress) | {fmt(off, ',.0f')} |\n"
                  f"| progress on (default) | {fmt(on, ',.0f')} |\n"
                  f"| on / off | {fmt(on / off if on and off else None, '.3f')} |\n")
        rows, data["counted"] = cost_rows(a, statistics.median(got["step_ms"]) if got["step_ms"]
                                          else None)
        table += rows
    publish(table, a.markdown, a.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
