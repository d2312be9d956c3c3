#!/usr/bin/env python3
"""Tokens, against the real coordinator and agents: a job's token (made by
`gradsync-coordinator token --job NAME`) opens that job's RPCs, control and
status and nothing else; --http-auth decides what HTTP needs a token for.

usage: test_auth.py BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT  # noqa: E402

BIN_DIR, COORD = sys.argv[1], sys.argv[2]
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
SECRET = "cluster-secret-0123"


def coordinator(*extra):
    env = dict(os.environ, GRADSYNC_TOKEN=SECRET)
    c = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--log-level", "warn"] + list(extra), stdout=subprocess.PIPE,
                         text=True, env=env)
    m = re.search(r"rpc=(\S+) http=(\S+)", c.stdout.readline())
    return c, m.group(1), "http://" + m.group(2)


def job_token(job):
    env = dict(os.environ, GRADSYNC_TOKEN=SECRET)
    return subprocess.run([COORD, "token", "--job", job], capture_output=True, text=True,
                          env=env, check=True).stdout.strip()


def train(rpc, job, token, world=2):
    env = dict(os.environ, GRADSYNC_TOKEN=token)
    ps = [subprocess.Popen([AGENT, "--coordinator", rpc, "--job", job, "--world-size", str(world),
                            "--local-rank", str(i), "--reduce", "mean", "--steps", "20",
                            "--no-validate", "--join-timeout", "600s"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
          for i in range(world)]
    try:
        out = []
        for p in ps:
            _, err = p.communicate(timeout=2 * WAIT)
            out.append((p.returncode, err))
        return out
    finally:
        for p in ps:
            p.kill()
            p.wait()


def http(url, token=None, body=None):
    """The HTTP status of GET (or POST `body`)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 method="POST" if body else "GET")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    a, b = job_token("team-a"), job_token("team-b")
    assert re.fullmatch(r"[0-9a-f]{64}", a) and a != b, (a, b)
    c, rpc, url = coordinator()
    try:
        res = train(rpc, "team-a", a)
        assert all(code == 0 for code, _ in res), res
        print("job token: team-a's agents trained with team-a's token")
        res = train(rpc, "team-b", a, world=1)
        assert res[0][0] != 0 and "not job team-b's" in res[0][1], res
        print("job token: refused for another job (UNAUTHENTICATED)")
        for path, token, body, want in [
                ("/healthz", None, None, 200),
                ("/status", None, None, 200),
                ("/metrics", None, None, 200),
                ("/status?ranks=1", None, None, 401),
                ("/status?ranks=1", a, None, 401),
                ("/status?ranks=1", SECRET, None, 200),
                ("/jobs/team-a", None, None, 401),
                ("/jobs/team-a", a, None, 200),
                ("/jobs/team-a", b, None, 401),
                ("/jobs/team-a/control", a, {"action": "broadcast"}, 200),
                ("/jobs/team-a/control", b, {"action": "broadcast"}, 401),
                ("/jobs/team-a/control", None, {"action": "broadcast"}, 401),
                ("/jobs/team-a/control", SECRET, {"action": "broadcast"}, 200)]:
            got = http(url + path, token, body)
            assert got == want, (path, token and token[:8], got, want)
        print("--http-auth control: addresses and control need a token; a job's opens its own")
    finally:
        c.kill()
        c.wait()
    for mode, cases in (("read", [("/healthz", None, 200), ("/status", None, 401),
                                  ("/metrics", None, 401), ("/status", SECRET, 200)]),
                        ("none", [("/status?ranks=1", None, 200)])):
        c, rpc, url = coordinator("--http-auth", mode)
        try:
            for path, token, want in cases:
                got = http(url + path, token)
                assert got == want, (mode, path, got, want)
        finally:
            c.kill()
            c.wait()
        print(f"--http-auth {mode}: as documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
