#!/usr/bin/env python3
"""How soon gradsync reacts to what the tests check it reacts to at all:
the bounds some tests used to assert, measured here instead (a test must
hold on a loaded machine, so it waits for the reaction with a generous
timeout and no longer asserts how soon it came). Each row runs --runs
times; the table gives the median and the slowest, next to the bound a
test once held it to. Run on a quiet machine; numbers from a loaded one
say how loaded it was.

  kill      kill -9 of one rank of two: until the other exits with an error
            (the coordinator sees the connection close; tests/test_agent.py kill)
  signal    SIGTERM to an agent waiting alone in the rendezvous: until it
            exits (test_agent.py signals)
  refusal   two agents whose --batch differs: from both saying they join
            until both exited, refused (test_agent.py settings)
  launcher  gradsync-run of two commands, one failing at once: the whole run,
            the other (sleeping an hour) stopped (test_agent.py command)
  healthz   GET /healthz while two clients pipeline requests and never read
            the replies (tests/test_limits.py noread)
  packlist  a 2 MiB, million-entry pack list: until it is refused
            (test_limits.py packlist)

usage: bench/reaction.py --bin BUILD/bin [--runs 5] [--rows kill,signal,...]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path.insert(0, TESTS)
import test_limits as limits  # noqa: E402  (the attacks, as the tests make them)
from benchlib import subset  # noqa: E402
from protoc_client import PREFIX, load_proto  # noqa: E402
from testlib import Lines, wait_until  # noqa: E402

FAST = ["--no-validate", "--log-interval", "200ms"]
# The bound a test held each to before (a reason to look if a median passes it).
WAS = {"kill": 5.0, "signal": 1.5, "refusal": 30.0, "launcher": 10.0, "healthz": 1.0,
       "packlist": 0.2}


def coordinator(b, *flags):
    """A coordinator on free ports: (process, rpc address, http address)."""
    c = subprocess.Popen([os.path.join(b, "gradsync-coordinator"), "--listen", "127.0.0.1:0",
                          "--http", "127.0.0.1:0", "--log-level", "error", *flags],
                         stdout=subprocess.PIPE, text=True)
    m = re.search(r"rpc=(\S+) http=(\S+)", c.stdout.readline())
    return c, m.group(1), m.group(2)


def agent(b, rpc, job, *flags, out=subprocess.DEVNULL, err=subprocess.DEVNULL):
    return subprocess.Popen([os.path.join(b, "gradsync-agent"), "--coordinator", rpc, "--job", job,
                             "--reduce", "mean", *flags], stdout=out, stderr=err, text=True)


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def row_kill(b):
    c, rpc, _ = coordinator(b, "--heartbeat-timeout", "3600s")
    a = [agent(b, rpc, "kill", "--world-size", "2", "--local-rank", str(i), "--steps", "10000000",
               "--log-interval", "200ms", out=subprocess.PIPE) for i in range(2)]
    try:
        Lines(a[0].stdout, "rank 0").wait(r"^step")
        a[1].kill()
        t0 = time.monotonic()
        code = a[0].wait(timeout=300)
        took = time.monotonic() - t0
        assert code == 1, f"rank 0 exited {code}"
        return took
    finally:
        stop(*a, c)


def row_signal(b):
    c, rpc, http = coordinator(b)
    a = agent(b, rpc, "sig", "--world-size", "2", "--steps", "5", *FAST)

    def parked():
        with urllib.request.urlopen(f"http://{http}/status", timeout=60) as r:
            return any(j["rendezvous"]["joined"] == 1 for j in json.load(r)["jobs"])

    try:
        wait_until("the agent in the rendezvous", parked)
        a.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = a.wait(timeout=300)
        took = time.monotonic() - t0
        assert code == 128 + signal.SIGTERM, f"the agent exited {code}"
        return took
    finally:
        stop(a, c)


def row_refusal(b):
    c, rpc, _ = coordinator(b)
    a = [agent(b, rpc, "set", "--world-size", "2", "--local-rank", str(i), "--steps", "5",
               "--join-timeout", "3600s", "--batch", str(64 >> i), *FAST, err=subprocess.PIPE)
         for i in range(2)]
    try:
        for i, p in enumerate(a):
            Lines(p.stderr, f"rank {i}").wait(r"joining ")
        t0 = time.monotonic()
        codes = [p.wait(timeout=300) for p in a]
        took = time.monotonic() - t0
        assert all(c == 1 for c in codes), f"the agents exited {codes}"
        return took
    finally:
        stop(*a, c)


def row_launcher(b):
    t0 = time.monotonic()
    p = subprocess.run([os.path.join(b, "gradsync-run"), "--nproc", "2", "--coordinator",
                        "127.0.0.1:9", "--", "sh", "-c",
                        '[ "$LOCAL_RANK" = 1 ] && exit 5; exec sleep 3600'],
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert p.returncode == 5 and "stopping the other ranks" in p.stderr, p.stderr
    return took


def row_healthz(b, pb):
    c = limits.Coordinator(os.path.join(b, "gradsync-coordinator"))
    try:
        hb = limits.frame(pb, PREFIX + "Heartbeat", pb.HeartbeatRequest(job="nosuch", rank=0))
        _, socks = limits.pipeline_without_reading(c, hb)
        took = c.healthz_s()
        for s in socks:
            s.close()
        return took
    finally:
        c.close()


def row_packlist(b, pb):
    c = limits.Coordinator(os.path.join(b, "gradsync-coordinator"))
    try:
        body = limits.million_entry_pack_list(pb)
        with socket.create_connection(("127.0.0.1", c.rpc_port), timeout=60) as s:
            data = limits.frame(pb, PREFIX + "PublishPackList", body=body)
            t0 = time.monotonic()
            s.sendall(data)
            limits.recv_envelope(pb, s)
            return time.monotonic() - t0
    finally:
        c.close()


ROWS = ["kill", "signal", "refusal", "launcher", "healthz", "packlist"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build's bin folder")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", default=",".join(ROWS))
    args = ap.parse_args()
    rows = subset(ap, "--rows", args.rows, ROWS)
    b = os.path.abspath(args.bin)
    pb = load_proto(os.path.join(HERE, "..", "proto"))
    print("| reaction | runs | median s | slowest s | a test asserted |")
    print("|---|---|---|---|---|")
    for name in rows:
        fn = globals()["row_" + name]
        times = [fn(b, pb) if name in ("healthz", "packlist") else fn(b) for _ in range(args.runs)]
        print(f"| {name} | {len(times)} | {statistics.median(times):.3f} | {max(times):.3f} "
              f"| < {WAS[name]} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
