"""Helpers the whole-process agent tests share (tests/test_agent.py and
tests/gpu/test_gpu_agent.py): steering a job over the coordinator's HTTP
API and reading a launcher's output until a line appears."""
import json
import re
import time
import urllib.request


def post(url, body):
    """POSTs `body` as JSON; the HTTP status."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def wait_for(p, lines, pattern, timeout=60):
    """Reads p's stdout (appending to `lines`) until a line matches
    `pattern`; the match, or AssertionError with the last lines."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(lines[-40:]))
