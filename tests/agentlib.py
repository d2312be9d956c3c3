"""Helpers the whole-process agent tests share (tests/test_agent.py and
tests/gpu/test_gpu_agent.py): steering a job over the coordinator's HTTP
API, reading a launcher's output until a line appears, and the control
and SIGTERM scenarios both run on their own device."""
import json
import re
import signal
import socket
import time
import urllib.request

from checkpoints import newest_checkpoint, read_checkpoint
from testlib import WAIT


def post(url, body):
    """POSTs `body` as JSON; the HTTP status."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=WAIT) as r:
        return r.status


def wait_for(p, lines, pattern, timeout=WAIT):
    """Reads p's stdout (appending to `lines`) until a line matches
    `pattern`; the match, or AssertionError with the last lines. The
    timeout is looked at between lines (a silent process is the test's
    own deadline's, testlib)."""
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


def check_control(p, url, lines, timeout=WAIT):
    """On a running job `ctl` started by gradsync-run (p, its status URL and
    the lines read so far): a new broadcast period and then a stop, posted
    to the coordinator, act on ranks 0 and 1 at one step each, and the
    launcher exits 0. Returns (step of the period change, step of the stop)."""
    try:
        wait_for(p, lines, r"\[rank 0\] step \d+", timeout)
        assert post(url + "/jobs/ctl/control", {"bcast_period": 7}) == 200
        wait_for(p, lines, r"broadcast period set to 7", timeout)
        assert post(url + "/jobs/ctl/control", {"action": "stop"}) == 200
        lines.append(p.stdout.read())  # not communicate(): it would skip what readline buffered
        p.wait(timeout=timeout)
    finally:
        p.kill()
    text = "".join(lines)
    steps = {r: re.findall(rf"\[rank {r}\].*step (\d+): broadcast period set to 7", text)
             for r in (0, 1)}
    assert steps[0] and steps[0] == steps[1], (steps, text[-4000:])
    stop = re.search(r"stopped after step (\d+): the coordinator asked", text)
    assert stop, text[-3000:]
    assert p.returncode == 0, p.returncode
    return steps[0][0], stop.group(1)


def check_sigterm(p, lines, ckpt_dir, timeout=WAIT):
    """On a running job started by gradsync-run with --checkpoint-dir
    `ckpt_dir`: SIGTERM to the launcher stops every rank at one step, with
    a checkpoint of that step, and no rank exits on its own. Returns the
    step it stopped after."""
    try:
        wait_for(p, lines, r"\[rank 0\] step \d+", timeout)
        p.send_signal(signal.SIGTERM)
        lines.append(p.stdout.read())
        p.wait(timeout=timeout)
    finally:
        p.kill()
    text = "".join(lines)
    stop = re.search(r"stopped after step (\d+): SIGTERM received", text)
    assert stop, text[-3000:]
    ck = read_checkpoint(newest_checkpoint(ckpt_dir))
    assert ck["step"] == int(stop.group(1)), (ck["step"], stop.group(1))
    assert "rank 1 exited" not in text, text[-3000:]
    return stop.group(1)


def node_address():
    """An address of this machine that is not loopback, as another node
    would reach it (agents advertise the address they reach the coordinator
    from, and a job of two node names on loopback is refused), or 127.0.0.1
    when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
