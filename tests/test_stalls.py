#!/usr/bin/env python3
"""What holds a job up, named live: a coordinator and 3 or 4 MLP agents on
Fashion-MNIST, one rank made to misbehave, and /jobs/NAME and /metrics read
until `waiting_on` names it. The waits are on events (the verdict appearing)
with a generous timeout that only decides failure; how fast the verdict
comes is bench/hang_inject.sh's to measure, not a test's.

usage: test_stalls.py CASE BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT, Lines, wait_until  # noqa: E402

# The programs: set from the command line, or by bench/hang_inject.py.
COORD = AGENT = None
# Long enough that the job is still training whatever the machine's load.
AGENT_ARGS = ["--reduce", "mean", "--steps", "200000", "--batch", "32", "--no-validate",
              "--log-interval", "1s"]


class Job:
    """A coordinator and `world` agents of job "j"; agent_args(rank) adds
    each rank's own flags."""

    def __init__(self, world, agent_args=lambda rank: [], coord_args=()):
        self.coord = subprocess.Popen(
            [COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", *coord_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        m = re.search(r"rpc=(\S+) http=(\S+)", self.coord.stdout.readline())
        self.rpc, self.http = m.group(1), m.group(2)
        self.log = Lines(self.coord.stderr, "coordinator")
        self.agents = [subprocess.Popen(
            [AGENT, "--coordinator", self.rpc, "--job", "j", "--world-size", str(world),
             "--local-rank", str(r), *AGENT_ARGS, *agent_args(r)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        self.outs = [(Lines(a.stdout, f"rank {r} stdout"), Lines(a.stderr, f"rank {r} stderr"))
                     for r, a in enumerate(self.agents)]

    def get(self, path):
        with urllib.request.urlopen(f"http://{self.http}{path}", timeout=WAIT) as r:
            return r.read().decode()

    def job(self):
        try:
            return json.loads(self.get("/jobs/j"))
        except urllib.error.HTTPError as e:  # 404 until the first Join
            if e.code != 404:
                raise
            return {"state": "none", "waiting_on": None}

    def wait_training(self):
        """Until every rank has reported a step and its phase."""
        def training():
            j = self.job()
            ranks = j.get("ranks", [])
            return j["state"] == "running" and ranks and all(
                r.get("step", 0) > 0 and "phase" in r for r in ranks)
        wait_until("every rank training and reporting its phase", training)

    def wait_named(self, kind, rank):
        """Until waiting_on names `rank` for `kind`; the job's JSON then."""
        def named():
            j = self.job()
            w = j.get("waiting_on")
            return j if w and w["kind"] == kind and rank in w["ranks"] else None
        return wait_until(f"waiting_on naming rank {rank} ({kind})", named)

    def close(self):
        for a in self.agents:
            try:
                a.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            a.kill()
            a.wait()
        self.coord.kill()
        self.coord.wait()
        for o, e in self.outs:
            o.close()
            e.close()
        return self.log.close()


def check_metrics(job, rank, kind):
    text = job.get("/metrics")
    line = re.search(r'^gradsync_job_waiting_on\{job="j",rank="(\d+)",kind="(\w+)",'
                     r'phase="(\w+)"\} 1$', text, re.M)
    assert line and int(line.group(1)) == rank and line.group(2) == kind, text[-3000:]
    assert re.search(r'^gradsync_job_stalled\{job="j"\} 1$', text, re.M), text[-3000:]
    held = re.search(r'^gradsync_job_held_seconds\{job="j"\} ([\d.]+)$', text, re.M)
    assert held and float(held.group(1)) > 0, text[-3000:]
    return line.group(3)


def case_sigstop():
    """A rank frozen with SIGSTOP: its heartbeats stop with it, the others
    wait in their next allreduce; the job is stalled, the frozen rank named
    for its silence. SIGCONT: the job trains on and the verdict clears."""
    job = Job(4)
    try:
        job.wait_training()
        job.agents[2].send_signal(signal.SIGSTOP)
        j = job.wait_named("no_heartbeat", 2)
        w = j["waiting_on"]
        assert j["state"] == "stalled" and "rank 2 sent no heartbeat" in j["reason"], j
        assert w["ranks"] == [2] and w["rank_count"] == 1 and w["waiters"] >= 1, w
        check_metrics(job, 2, "no_heartbeat")
        step = j["rank_summary"]["step_max"]
        job.agents[2].send_signal(signal.SIGCONT)
        wait_until("the job training again, not held", lambda: (
            lambda j: j["state"] == "running" and j["waiting_on"] is None
            and j["rank_summary"]["step_min"] > step)(job.job()))
    finally:
        log = job.close()
    assert "held up: rank 2 sent no heartbeat" in log and "no longer held up" in log, log[-3000:]
    print(f"SIGSTOP on rank 2 of 4: named ({w['reason']}); cleared after SIGCONT")


def case_data_hang():
    """A data loader that hangs on rank 1 at step 30: the rank is alive
    (it heartbeats) and in its data phase; the three others wait in the
    allreduce of pack 0. The agents' own comm timeout (10 s here) then ends
    the job, and their error names what the coordinator saw."""
    job = Job(4, lambda r: ["--inject-fault", "data-hang:1:30:1h", "--comm-timeout", "10s"])
    try:
        job.wait_training()
        j = job.wait_named("phase", 1)
        w = j["waiting_on"]
        assert w["phase"] == "data" and j["state"] == "stalled", j
        assert "rank 1 in data for" in w["reason"] and "wait in the allreduce of pack" in w["reason"], w
        rank1 = next(r for r in j["ranks"] if r["rank"] == 1)
        assert rank1["phase"] == "data", rank1
        others = [r for r in j["ranks"] if r["rank"] != 1]
        assert all(r["phase"] == "allreduce" for r in others), others
        assert check_metrics(job, 1, "phase") == "data"
        # The waiting ranks give up at --comm-timeout (or as the first of
        # them closes the ring), naming rank 1.
        for r in (0, 2, 3):
            job.agents[r].wait(timeout=WAIT)
        errs = [job.outs[r][1].close() for r in (0, 2, 3)]
    finally:
        job.close()
    for err in errs:
        assert "the coordinator saw the job wait on rank 1 in data" in err, err[-3000:]
    print(f"data loader hung on rank 1: named ({w['reason']}); the others' timeout says so")


def case_straggler():
    """Rank 3 computes twice as long as the others: the job goes on, slower;
    waiting_on names rank 3 as a straggler and the job is not stalled."""
    job = Job(4, lambda r: ["--inject-fault", "straggler:3:2"])
    try:
        job.wait_training()
        j = job.wait_named("straggler", 3)
        w = j["waiting_on"]
        assert j["state"] == "running", j
        assert w["ranks"] == [3] and "not a hang" in w["reason"], w
        text = job.get("/metrics")
        assert re.search(r'^gradsync_job_stalled\{job="j"\} 0$', text, re.M), text[-2000:]
    finally:
        log = job.close()
    assert "held up" not in log, log[-3000:]
    print(f"2x straggler on rank 3: named, not a hang ({w['reason']})")


class NodesJob:
    """A coordinator on node c and `per_node` ranks on each of nodes a and
    b of the cluster `cl` (tests/cluster.py), read through curl on node c.
    Their output goes nowhere: not into a pipe that fills and stops them."""

    def __init__(self, cl, per_node=1):
        from cluster import ADDR
        self.cl, self.http, self.world = cl, f"{ADDR['c']}:8080", 2 * per_node
        cl.run("c", [COORD, "--listen", f"{ADDR['c']}:7070", "--http", self.http],
               stdout=subprocess.DEVNULL)
        self.agents = [cl.run(n, [AGENT, "--coordinator", f"{ADDR['c']}:7070", "--job", "j",
                                  "--world-size", str(self.world), "--local-rank", str(i),
                                  *AGENT_ARGS, "--comm-timeout", "10m"], stdout=subprocess.DEVNULL)
                       for n in "ab" for i in range(per_node)]

    def job(self):
        from cluster import sh
        p = sh(*self.cl.enter("c"), "curl", "-s", f"http://{self.http}/jobs/j", check=False)
        j = json.loads(p.stdout) if p.stdout.startswith("{") else {}
        return j if "ranks" in j else {"ranks": []}  # none yet, or a 404 before the first Join

    def wait_training(self):
        wait_until("every rank training", lambda: (lambda j: len(j["ranks"]) == self.world and all(
            r.get("step", 0) > 0 for r in j["ranks"]))(self.job()))

    def ranks_sending_off(self, node):
        """The ranks on `node` whose ring successor (rank + 1) is on another
        node: what they send leaves through the node's link."""
        on = {r["rank"]: r["node"] for r in self.job()["ranks"]}
        return [r for r in sorted(on) if on[r] == f"node-{node}"
                and on[(r + 1) % self.world] != f"node-{node}"]

    def throttle(self, node):
        """The node's link limited to 4 Mbit/s (tc tbf)."""
        self.cl.exec(node, ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "4mbit",
                            "burst", "32kb", "latency", "400ms"])


def netns_cluster(prefix):
    """A Cluster entered, or None where network namespaces cannot be made
    here (not root, iproute2 missing, or refused), saying why."""
    from cluster import Cluster, missing_tool
    if os.geteuid() != 0 or missing_tool():
        print("skipped: needs root and iproute2 for network namespaces")
        return None
    try:
        return Cluster(prefix).__enter__()
    except RuntimeError as e:
        print(f"skipped: cannot make network namespaces here: {e}")
        return None


def case_slow_link():
    """Two nodes (network namespaces on a bridge, tests/cluster.py), two
    ranks each; node a's link limited to 4 Mbit/s with tc tbf: the bytes
    of its ranks that send to node b wait in their sockets to leave while
    the others' do not, and waiting_on names those ranks for their slow
    link. Needs root (skipped otherwise)."""
    cl = netns_cluster("gsst")
    if not cl:
        sys.exit(77)
    try:
        nodes = NodesJob(cl, per_node=2)
        nodes.wait_training()
        slow = nodes.ranks_sending_off("a")
        nodes.throttle("a")
        got = {}

        def named():
            got.update(nodes.job())
            w = got.get("waiting_on")
            return w and w["kind"] == "slow_link" and w["ranks"] == slow
        wait_until(f"waiting_on naming ranks {slow}'s slow link (last: {got})", named, every=0.2)
        w = got["waiting_on"]
        # Named whether the job counts as held (an allreduce waited more than
        # three of its steps) or only as slowed (every step waits as long).
        assert "outbound link is" in w["reason"], got
        assert got["state"] == ("stalled" if w["hang"] else "running"), got
        for a in nodes.agents:
            assert a.poll() is None, f"an agent exited {a.returncode}"
    finally:
        cl.__exit__()
    print(f"4 Mbit/s link on node a: ranks {slow} named ({w['reason']})")


def check_trace_format(doc, world, steps):
    """The trace-event format as chrome://tracing and Perfetto read it:
    metadata naming each rank's process and threads, complete ("X") events
    with numeric times, on a training and a comm track per rank, spans of
    one track never overlapping, and `steps` steps of each rank."""
    events = doc["traceEvents"]
    assert all(e["ph"] in ("X", "M") for e in events), {e["ph"] for e in events}
    names = {(e["pid"], e.get("tid"), e["name"]) for e in events if e["ph"] == "M"}
    for r in range(world):
        assert (r, None, "process_name") in names and (r, 0, "thread_name") in names, names
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert e["pid"] in range(world) and e["tid"] in (0, 1), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and e["dur"] >= 0, e
    for r in range(world):
        for tid in (0, 1):
            track = sorted((e["ts"], e["dur"]) for e in spans if e["pid"] == r and e["tid"] == tid)
            assert track, (r, tid)
            for (t0, d0), (t1, _) in zip(track, track[1:]):
                assert t0 + d0 <= t1 + 1, (r, tid, t0, d0, t1)  # 1 µs of rounding
        seen = {e["args"]["step"] for e in spans if e["pid"] == r and e["tid"] == 0
                and e["name"] == "compute"}
        assert len(seen) >= steps, (r, sorted(seen))
    return spans


def case_trace():
    """POST /jobs/j/trace?steps=20 on a 3-rank job: 202, then GET gives the
    merged Chrome trace once every rank published. The ranks' clocks are
    aligned: the same step's allreduce of pack 0, which the three comm
    threads run together, overlaps on every rank's track, within what the
    alignment promises: 2 ms, plus half the heartbeat round trip each
    rank's clock was aligned by (otherData.clock_rtt_us; on a loaded
    machine that trip takes milliseconds)."""
    job = Job(3)
    try:
        job.wait_training()
        req = urllib.request.Request(f"http://{job.http}/jobs/j/trace?steps=20", method="POST")
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            started = json.loads(r.read())
            assert r.status == 202 and started["steps"] == 20 and started["ranks"] == 3, started

        def merged():
            with urllib.request.urlopen(f"http://{job.http}/jobs/j/trace", timeout=WAIT) as r:
                body = json.loads(r.read())
                return body if r.status == 200 else None
        doc = wait_until("every rank's part of the trace", merged, every=0.2)
    finally:
        job.close()
    spans = check_trace_format(doc, 3, 20)
    coll = {}
    for e in spans:
        if e["tid"] == 1 and e["name"] == "allreduce pack 0":
            coll.setdefault(e["args"]["step"], {})[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    together = [s for s, by in coll.items() if len(by) == 3]
    assert len(together) >= 10, coll
    rtt = doc["otherData"]["clock_rtt_us"]
    assert len(rtt) == 3, rtt
    for s in together:
        late = max(coll[s], key=lambda r: coll[s][r][0])  # the rank that started last
        early = min(coll[s], key=lambda r: coll[s][r][1])  # the one that ended first
        slack = 2000 + (rtt[late] + rtt[early]) / 2
        assert coll[s][late][0] <= coll[s][early][1] + slack, (s, coll[s], rtt)
    print(f"trace: {len(spans)} spans of 3 ranks x 20 steps, valid; the same allreduce overlaps "
          f"on every rank in {len(together)} steps")


CASES = {"trace": case_trace, "sigstop": case_sigstop, "data_hang": case_data_hang, "straggler": case_straggler,
         "slow_link": case_slow_link}

if __name__ == "__main__":
    COORD, AGENT = sys.argv[3], os.path.join(sys.argv[2], "gradsync-agent")
    CASES[sys.argv[1]]()
