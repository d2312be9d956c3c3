#!/usr/bin/env python3
"""Node agents (gradsync-relay, proto/README.md "Batch", "NodeHeartbeat") with real agents,
a real coordinator and Fashion-MNIST: node "a"'s three ranks reach the
coordinator through a node agent on a Unix socket, node "b"'s one
directly.

Cases (one per run):
  mixed    the mixed job trains exactly (the same test accuracy, to the
           digit) as the same job with every rank connected directly; the
           coordinator saw a Batch (one frame for the node's Joins) and
           NodeHeartbeats (one for its heartbeats of an interval) and one pack-list fetch for node a's two
           fetching ranks
  killed   the node agent killed (SIGKILL) mid-training in a fixed job:
           the job fails, its reason naming the node agent, and every rank
           stops
  elastic  the same in a 1:4 job: node b's rank regroups without node a's
           three and finishes, the regroup's reason naming the node agent
  news     node b's direct rank killed in a 3:4 job: node a's ranks regroup
           and go on, and the stop reaches rank 0 through the node agent
           (news of its NodeHeartbeats)
  outage   the coordinator killed and restarted on its ports mid-training:
           the node agent redials it, its ranks redial the node agent and
           re-register through it like the direct rank, and the job trains
           on to a clean stop
  launcher gradsync-run --node-agent: its ranks join through the node agent
           it starts, and train exactly as without it; the socket's folder
           is gone afterwards
  restart  gradsync-run --node-agent --min-ranks 1: its node agent killed
           (SIGKILL) mid-training; gradsync-run starts it again on the same
           socket, the coordinator having lost both ranks they rejoin
           through the new one and train on from where they were, and the
           operator's stop ends the run cleanly

usage: test_node_agent.py CASE BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The elastic tests' job: a coordinator on free ports and agents logging to files.
from agentlib import node_address  # noqa: E402
from testlib import WAIT, descendants  # noqa: E402
from test_elastic import (AGENT, BIN_DIR, CASE, FASHION, FOREVER, QUICK_LOSS,  # noqa: E402
                          TRAIN, Job, accuracy, clean_env, expect_ok, post_stop, read,
                          regroup_line, run_case, scratch, wait_text)


RELAY = os.path.join(BIN_DIR, "gradsync-relay")
NODES = {0: "a", 1: "a", 2: "a", 3: "b"}  # index: node ("a": behind the node agent)
LOCAL = {0: 0, 1: 1, 2: 2, 3: 0}
# Two node names on one host: their ranks advertise an address that is not
# loopback (a job of two nodes on loopback is refused at its rendezvous).
HOST = node_address()


class NodeJob(Job):
    """A job of four agents on nodes a and b; with `relay`, node a's three
    reach the coordinator through a node agent."""

    def __init__(self, world, *coord_flags, relay=True):
        super().__init__(world, *coord_flags)
        self.relay = self.socket = None
        if relay:
            self.socket = os.path.join(self.dir, "node-a.sock")
            self.relay_log = os.path.join(self.dir, "relay.log")
            self.relay = subprocess.Popen(
                [RELAY, "--coordinator", self.rpc, "--socket", self.socket, "--ranks", "3"],
                stdout=subprocess.PIPE, stderr=open(self.relay_log, "w"), text=True,
                env=clean_env())
            line = self.relay.stdout.readline()
            assert line.startswith("gradsync-relay listening"), line

    def start(self, local, *extra, epochs=3, grace="5s"):
        node = NODES[local]
        where = f"unix:{self.socket}" if self.relay and node == "a" else self.rpc
        log = os.path.join(self.dir, f"agent{local}.log")
        p = subprocess.Popen(
            [AGENT, "--coordinator", where, "--job", self.name, "--world-size", self.world,
             "--local-rank", str(LOCAL[local]), "--node", node, "--epochs", str(epochs), *TRAIN,
             "--data", FASHION, "--coordinator-grace", grace, "--comm-bind", HOST, *extra],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=clean_env())
        self.agents[local] = (p, log)
        return p

    def close(self):
        if self.relay and self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait()
        super().close()


def calls(metrics, method):
    m = re.search(rf'^gradsync_rpc_requests_total\{{method="{method}"\}} (\d+)$', metrics, re.M)
    return int(m.group(1)) if m else 0


def run_four(relay):
    """A fixed job of four ranks, one epoch: rank 0's accuracy, and the
    coordinator's counts of Batch and FetchPackList calls."""
    job = NodeJob("4", relay=relay)
    try:
        for i in range(4):
            job.start(i, epochs=1)
        expect_ok(job, range(4))
        metrics = job.get("/metrics")
        ranks = json.loads(job.get(f"/jobs/{job.name}"))["ranks"]
        assert [r["node"] for r in ranks] == ["a", "a", "a", "b"], ranks
        return (accuracy(job.log(0)), calls(metrics, "Batch"), calls(metrics, "NodeHeartbeat"),
                calls(metrics, "FetchPackList"))
    finally:
        job.close()


def case_mixed():
    direct, none, no_beats, fetches = run_four(relay=False)
    mixed, batches, node_beats, relayed = run_four(relay=True)
    assert none == 0 and no_beats == 0 and fetches == 3, (none, no_beats, fetches)
    assert batches >= 1, "no Batch: the node's Joins went one by one"
    assert node_beats >= 1, "no NodeHeartbeat: the node's heartbeats went one by one"
    # Node a's ranks 1 and 2 asked; its node agent fetched once for both.
    assert relayed == 2, f"{relayed} pack-list fetches reached the coordinator, not 2"
    assert mixed == direct, f"through the node agent {mixed}, directly {direct}"
    print(f"mixed job (node a behind a node agent, {batches} Batches, {node_beats} "
          f"NodeHeartbeats, {relayed} pack-list fetches "
          f"for 3 fetching ranks): test accuracy {mixed:.4f}, the same as every rank direct")


def kill_node_agent(world):
    """Four ranks training, then the node agent killed: the job."""
    job = NodeJob(world, *QUICK_LOSS)
    for i in range(4):
        job.start(i, epochs=FOREVER)
    job.wait_line(0, r"epoch 1 validation")  # rank 0 (node a) reports
    job.relay.send_signal(signal.SIGKILL)
    job.relay.wait()
    return job


def case_killed():
    job = kill_node_agent("4")
    try:
        codes = job.finish([3])
        assert all(c != 0 for c in codes.values()), codes
        status = json.loads(job.get(f"/jobs/{job.name}"))
        assert status["state"] == "failed", status["state"]
        assert "its node agent's connection closed" in status["reason"], status["reason"]
        print(f"node agent killed: the job failed: {status['reason']}")
    finally:
        job.close()


def case_elastic():
    job = kill_node_agent("1:4")
    try:
        job.wait_line(3, r"continuing with 1 ranks")
        m = regroup_line(job.log(3))
        assert "its node agent's connection closed" in m.group(1), m.group(0)
        job.stop()
        expect_ok(job, [3])
        gens = json.loads(job.get(f"/jobs/{job.name}"))["generations"]
        assert [g["world_size"] for g in gens] == [4, 1], gens
        print(f"node agent killed in a 1:4 job: node b's rank went on: {m.group(0)}")
    finally:
        job.close()


def case_news():
    """Node b's direct rank killed in a 3:4 job: node a's ranks regroup
    (their allreduce fails, and the abort comes as news of their
    NodeHeartbeats, which the node agent answers their heartbeats with) and
    go on; the operator's stop then reaches rank 0 the same way, as news
    (without it no rank would stop)."""
    job = NodeJob("3:4", *QUICK_LOSS)
    try:
        for i in range(4):
            job.start(i, epochs=FOREVER)
        job.wait_line(0, r"epoch 1 validation")
        job.agents[3][0].kill()
        for i in range(3):
            job.wait_line(i, r"continuing with 3 ranks")
        m = regroup_line(job.log(0))
        job.wait_more(0, r"\nstep ")  # trains on, behind the node agent
        job.stop()
        expect_ok(job, range(3))
        # Rank 0 (node a) heard the stop and passed it on to the others.
        assert "the coordinator asked every rank to stop" in job.log(0), job.log(0)[-2000:]
        metrics = job.get("/metrics")
        assert calls(metrics, "NodeHeartbeat") >= 1, "the ranks' heartbeats never went as one"
        gens = json.loads(job.get(f"/jobs/{job.name}"))["generations"]
        assert [g["world_size"] for g in gens] == [4, 3], gens
        print(f"node b's direct rank killed: node a's 3 ranks heard it through their node "
              f"agent and went on: {m.group(0)}")
    finally:
        job.close()


def case_outage():
    job = NodeJob("4", "--heartbeat-interval", "250ms", "--heartbeat-timeout", "3s")
    try:
        for i in range(4):
            job.start(i, epochs=FOREVER, grace="600s")
        job.wait_line(0, r"epoch 1 validation")
        job.restart_coordinator()
        for i in range(4):  # node a's through the node agent, node b's directly
            job.wait_line(i, r"re-registered with the coordinator for generation 1")
        relay = open(job.relay_log).read()
        assert len(re.findall(r"relay: connected to the coordinator", relay)) >= 2, relay
        job.wait_more(0, r"\nstep ")  # trains on
        job.stop()
        expect_ok(job, range(4))
        print("coordinator restarted: the node agent redialled it and node a's 3 ranks "
              "re-registered through it; the job trained on and stopped cleanly")
    finally:
        job.close()


def launch(*flags):
    """gradsync-run --nproc 2 with `flags`, 300 steps: its output."""
    p = subprocess.run([os.path.join(BIN_DIR, "gradsync-run"), "--nproc", "2", *flags, "--",
                        *TRAIN, "--data", FASHION, "--steps", "300"],
                       capture_output=True, text=True, timeout=2 * WAIT, env=clean_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout + p.stderr


def case_launcher():
    direct = launch()
    out = launch("--node-agent")
    m = re.search(r"reach the coordinator through unix:(\S+)", out)
    assert m, out[-3000:]
    assert len(re.findall(r"joining unix:\S+ \(a node agent\)", out)) == 2, out[-3000:]
    assert not os.path.exists(os.path.dirname(m.group(1))), m.group(1)
    want, got = accuracy(direct), accuracy(out)
    assert got == want, f"through the node agent {got}, directly {want}"
    print(f"gradsync-run --node-agent: both ranks through {m.group(1)}, test accuracy {got:.4f} "
          f"as without it")


def node_agent_of(launcher):
    """The pid of the gradsync-relay below the launcher's process."""
    for pid in descendants(launcher.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.path.basename(f.read().split(b"\0")[0]) == b"gradsync-relay":
                    return pid
        except OSError:
            continue
    raise AssertionError("no gradsync-relay below gradsync-run")


def case_restart():
    log = os.path.join(scratch("gs_node_restart_"), "run.log")
    p = subprocess.Popen([os.path.join(BIN_DIR, "gradsync-run"), "--nproc", "2", "--min-ranks", "1",
                          "--node-agent", "--job", "nr", "--", *TRAIN, "--data", FASHION,
                          "--epochs", str(FOREVER), "--log-interval", "200ms"],
                         stdout=open(log, "w"), stderr=subprocess.STDOUT, env=clean_env())
    try:
        def text():
            return read(log)

        def alive():
            return p.poll() is None
        http = wait_text("gradsync-run", text, r"status at http://(\S+)/status", alive).group(1)
        wait_text("gradsync-run", text, r"\[rank 0\] step \d+", alive)
        old = node_agent_of(p)
        os.kill(old, signal.SIGKILL)
        wait_text("gradsync-run", text, r"node agent killed by signal SIGKILL while ranks were "
                  r"running: .*starting it again \(restart 1 of 3\)", alive)
        for r in (0, 1):  # both lost with it, both back through the new one
            wait_text("gradsync-run", text, rf"\[rank {r}\] .*continuing with 2 ranks from step",
                      alive)
        steps = len(re.findall(r"\[rank 0\] step ", text()))
        wait_text("gradsync-run", lambda: text().split("[rank 0] step ", steps)[-1],
                  r"\[rank 0\] step ", alive)  # one more: it trains on
        assert node_agent_of(p) != old
        post_stop(http, "nr")
        assert p.wait(timeout=WAIT) == 0, text()[-4000:]
        out = text()
        assert len(re.findall(r"relay: connected to the coordinator", out)) == 2, out[-3000:]
        m = re.search(r"\[rank 0\] .*(generation \d+: .*continuing with 2 ranks from step \d+)",
                      out)
        print(f"node agent killed under gradsync-run: started again, both ranks rejoined "
              f"through it: {m.group(1)}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


if __name__ == "__main__":
    if HOST == "127.0.0.1" and CASE not in ("launcher", "restart"):
        print("skip: two nodes on one machine need an address other than loopback")
        sys.exit(77)
    sys.exit(run_case(globals(), "node agent"))
