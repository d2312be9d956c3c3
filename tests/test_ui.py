#!/usr/bin/env python3
"""The coordinator's dashboard (GET /, coordinator/ui/) and its event
streams (GET /events), against a real coordinator and a 2-rank MLP job.

Cases:
  page      the page in headless chromium, driven over its DevTools pipe
            (--remote-debugging-pipe, standard library only): both ranks
            appear, the step shown rises between two looks, the page's
            "broadcast now" and "lr x" controls reach the job, the headers (CSP,
            no-cache) are there, and a rank frozen with SIGSTOP is named
            as the one the job waits on.
  page_tls  the same page against a coordinator with --tls-cert/--tls-key
            (a self-signed certificate made here; chromium is told to
            ignore certificate errors).
  curve     the page opened mid-run draws the whole run: an elastic job
            trains, loses a rank (generation 2), and only then the page
            opens; its charts hold every point of the coordinator's
            curve (/jobs/NAME?curve=1) and mark generation 2.
  events    /events and /events?job=NAME read with a socket: events parse
            as JSON and keep coming; a client that goes away mid-stream,
            and one that never reads, leave the coordinator serving.

Chromium missing: the page cases exit 77 (skipped) saying so.

usage: test_ui.py CASE BIN_DIR COORDINATOR_BIN
"""
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT, Lines, wait_until  # noqa: E402

CASE, BIN_DIR, COORD = sys.argv[1], sys.argv[2], sys.argv[3]
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
JOB = "dash"


def start_coordinator(tmp, tls):
    """A coordinator on free ports: (process, rpc port, http port, CA file or None)."""
    args = [COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    ca = None
    if tls:
        ca, key = os.path.join(tmp, "server.pem"), os.path.join(tmp, "server.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", ca,
                        "-days", "2", "-subj", "/CN=gradsync ui test",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        args += ["--tls-cert", ca, "--tls-key", key]
    c = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.search(r"listening rpc=\S+:(\d+) http=\S+:(\d+)", c.stdout.readline())
    assert m, "the coordinator did not say where it listens"
    return c, int(m.group(1)), int(m.group(2)), ca


def start_job(rpc_port, ca, world="2"):
    """Two MLP agents of job JOB that train until stopped (the MLP takes
    about 2 ms a step here: a step count would end before a browser looked),
    their optimizer state sharded."""
    agents = []
    for rank in range(2):
        agents.append(subprocess.Popen(
            [AGENT, "--coordinator", f"127.0.0.1:{rpc_port}", "--world-size", world,
             "--local-rank", str(rank), "--reduce", "mean", "--job", JOB, "--steps", "100000000",
             "--no-validate", "--log-interval", "1s", "--shard-optimizer"] +
            (["--tls-ca", ca] if ca else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return agents


def http(base, path, ctx, method="GET", body=None):
    """(status, headers, body text) of one request."""
    req = urllib.request.Request(base + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=WAIT, context=ctx) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def job_json(base, ctx):
    code, _, text = http(base, f"/jobs/{JOB}", ctx)
    return json.loads(text) if code == 200 else None


class Chromium:
    """Headless chromium driven over --remote-debugging-pipe: JSON messages
    ended by NUL, written to its fd 3 and read from its fd 4."""

    def __init__(self, tmp, insecure):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():  # in the child: its ends as fds 3 and 4, whatever numbers they had
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [exe, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                f"--user-data-dir={os.path.join(tmp, 'chromium')}", "about:blank"]
        if insecure:
            args.insert(1, "--ignore-certificate-errors")
        self.proc = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.err = Lines(self.proc.stderr, "chromium")
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.next_id, self.replies, self.cv = 0, {}, threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.session = None

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self.from_chrome, 65536)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                m = json.loads(msg)
                if "id" in m:
                    with self.cv:
                        self.replies[m["id"]] = m
                        self.cv.notify_all()

    def call(self, method, **params):
        with self.cv:
            self.next_id += 1
            i = self.next_id
        msg = {"id": i, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        with self.cv:
            assert self.cv.wait_for(lambda: i in self.replies, WAIT), \
                f"chromium did not answer {method}:\n{self.err.text()[-2000:]}"
            reply = self.replies.pop(i)
        assert "error" not in reply, (method, reply)
        return reply["result"]

    def open(self, url):
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def close(self):
        self.proc.kill()
        self.proc.wait()
        os.close(self.to_chrome)


# What the test reads off the page: the DOM markers the dashboard promises.
LOOK = """document.getElementById('step-max') === null ? 'null' : JSON.stringify({
  ranks: [...document.querySelectorAll('#members tr[data-rank]')].map(
      r => [r.dataset.rank, r.dataset.state]),
  head: [...document.querySelectorAll('#members thead th')].map(t => t.textContent),
  cells: [...document.querySelectorAll('#members tr[data-rank]')].map(r => r.cells.length),
  step: Number(document.getElementById('step-max').textContent),
  job: document.getElementById('job-name').textContent,
  jobs: [...document.querySelectorAll('#jobs tr[data-job]')].map(r => r.dataset.job),
  heat: document.querySelectorAll('#heatmap span[data-rank]').length,
  conn: document.getElementById('conn').textContent,
  state: document.getElementById('job-state').textContent,
  waiting: document.getElementById('waiting-box').hidden ? '' :
      document.getElementById('waiting-on').textContent,
})"""


def stop_all(browser, agents, coordinator):
    """Closes the browser (if one was started), then kills the agents and
    the coordinator."""
    if browser:
        browser.close()
    for p in agents + [coordinator]:
        p.kill()
        p.wait()


def case_page(tmp, tls=False):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("skipped: chromium is not installed (apt-get install chromium)")
        sys.exit(77)
    c, rpc, port, ca = start_coordinator(tmp, tls)
    ctx = ssl.create_default_context(cafile=ca) if tls else None
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    agents, browser = [], None
    try:
        code, headers, page = http(base, "/", ctx)
        assert code == 200 and "<title>gradsync" in page, (code, page[:200])
        assert headers["Content-Type"].startswith("text/html"), dict(headers)
        assert headers["Cache-Control"] == "no-cache", dict(headers)
        assert "default-src 'self'" in headers["Content-Security-Policy"], dict(headers)
        for path in ("/ui", "/ui/app.js", "/ui/style.css", "/ui/beat_fields.js"):
            assert http(base, path, ctx)[0] == 200, path
        agents = start_job(rpc, ca)
        wait_until("the job running with 2 ranks",
                   lambda: (job_json(base, ctx) or {}).get("state") == "running")
        browser = Chromium(tmp, insecure=tls)
        browser.open(base + "/")

        def look(pred):
            got = json.loads(browser.eval(LOOK))  # null until the page has loaded
            return got if got and pred(got) else None

        first = wait_until("both ranks running on the page", lambda: look(
            lambda g: g["job"] == JOB and sorted(g["ranks"]) == [["0", "running"], ["1", "running"]]
            and g["step"] > 0 and g["heat"] == 2))
        second = wait_until("the step shown rising", lambda: look(
            lambda g: g["step"] > first["step"]))
        print(f"page over {'https' if tls else 'http'}: ranks {first['ranks']}, jobs {first['jobs']}, "
              f"step {first['step']} then {second['step']}, connection '{second['conn']}'")
        # The members' columns: the fixed ones, and those of the heartbeat
        # table (beat_fields.js) between them; every row fills each.
        assert second["head"] == ["rank", "state", "phase", "node", "device", "step", "loss",
                                  "samples/s", "compute ms", "comm wait ms", "send wait",
                                  "heartbeat"], second["head"]
        assert second["cells"] == [len(second["head"])] * 2, second
        # The job's settings, and its optimizer state sharded (rank 0's share).
        shown = wait_until("the page showing the sharded optimizer state", lambda: (lambda t: t if
                           "(sharded over the ranks)" in t and "shard-optimizertrue" in t else
                           None)(browser.eval("document.getElementById('settings').textContent")))
        print(f"the page's settings: {shown[:200]}")
        # Each rank holds its half of SGD's momentum, the MLP's 235,146 floats between them.
        held = [r["state_bytes"] for r in job_json(base, ctx)["ranks"]]
        whole = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
        assert sum(held) == whole and max(held) <= whole // 2 + 64, (held, whole)
        print(f"/jobs/{JOB}: state_bytes {held} of {whole}")
        # The page's own button reaches the job (no token set: none needed).
        before = job_json(base, ctx)["broadcast_seq"]
        browser.eval("document.querySelector('button[data-action=broadcast]').click()")
        wait_until("the page's broadcast request applied",
                   lambda: job_json(base, ctx)["broadcast_seq"] > before)
        wait_until("the page saying it was done", lambda: "broadcast: done" in browser.eval(
            "document.getElementById('control-result').textContent"))
        print("the page's 'broadcast now' reached the job")
        # Its lr control too: the value typed is the job's lr scale.
        browser.eval("(() => { const i = document.getElementById('lr-scale'); i.focus(); "
                     "i.value = '0.5'; document.querySelector('button[data-action=lr_scale]')"
                     ".click(); i.blur(); })()")
        wait_until("the page's lr scale applied",
                   lambda: job_json(base, ctx)["lr_scale"] == 0.5)
        wait_until("the page showing lr scale 0.5", lambda: browser.eval(
            "document.getElementById('lr-scale').value") == "0.5" and "lr scale0.5" in
            browser.eval("document.getElementById('settings').textContent"))
        print("the page's 'lr x 0.5' reached the job")
        # A rank frozen: the page names it (waiting_on), the job stalled.
        agents[1].send_signal(signal.SIGSTOP)
        held = wait_until("the page naming the frozen rank 1", lambda: look(
            lambda g: g["waiting"] == "rank 1" and g["state"] == "stalled"))
        reason = browser.eval("document.getElementById('waiting-why').textContent")
        assert "rank 1 sent no heartbeat" in reason, reason
        print(f"rank 1 stopped (SIGSTOP): the page says it waits on '{held['waiting']}': {reason}")
        agents[1].send_signal(signal.SIGCONT)
    finally:
        stop_all(browser, agents, c)


def case_page_tls(tmp):
    case_page(tmp, tls=True)


def case_curve(tmp):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("skipped: chromium is not installed (apt-get install chromium)")
        sys.exit(77)
    c, rpc, port, _ = start_coordinator(tmp, False)
    base = f"http://127.0.0.1:{port}"
    agents, browser = [], None

    def curve():  # the job with its curve; before the first Join, no curve
        code, _, text = http(base, f"/jobs/{JOB}?curve=1", None)
        assert code in (200, 404), (code, text)
        return json.loads(text) if code == 200 else {"curve": {"points": []}, "generation": 0}

    try:
        agents = start_job(rpc, None, world="1:2")
        wait_until("5 points of the curve", lambda: len(curve()["curve"]["points"]) >= 5)
        agents[1].kill()
        agents[1].wait()
        j = wait_until("generation 2 stepping with 1 rank, 3 points of it", lambda: (
            lambda j: j if j["generation"] == 2 and j["state"] == "running" and sum(
                p[0] > j["generations"][-1]["start_step"] for p in j["curve"]["points"]) >= 3
            else None)(curve()))
        points = j["curve"]["points"]
        assert j["curve"]["interval_s"] == 1, j["curve"]
        assert all(a[0] < b[0] for a, b in zip(points, points[1:])), points
        assert all(p[1] > 0 and p[2] > 0 for p in points), points
        browser = Chromium(tmp, insecure=False)
        browser.open(base + "/")
        look = ("(() => { const s = document.getElementById('chart-loss'); return s && "
                "s.dataset.points ? JSON.stringify({points: Number(s.dataset.points), gens: "
                "[...s.querySelectorAll('line')].map(l => l.dataset.generation)}) : 'null'; })()")
        got = wait_until("the page's loss chart", lambda: (lambda g: g if g and g["points"] >= len(
            points) else None)(json.loads(browser.eval(look))))
        assert got["gens"] == ["2"], got
        print(f"page opened after {len(points)} points ({points[0][0]} to {points[-1][0]}, "
              f"generation 2 from step {j['generations'][-1]['start_step']}): its chart draws "
              f"{got['points']} points, generation 2 marked")
    finally:
        stop_all(browser, agents, c)


def open_stream(port, query=""):
    """A socket that asked for /events?QUERY, and a reader of its events."""
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    s.sendall(f"GET /events{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    f = s.makefile("rb")
    head = []
    while (line := f.readline()) not in (b"\r\n", b""):
        head.append(line.decode().strip())
    assert head and head[0] == "HTTP/1.1 200 OK", head
    assert "Content-Type: text/event-stream" in head and "Cache-Control: no-cache" in head, head
    assert not any(h.lower().startswith("content-length") for h in head), head

    def event():
        kind, data = None, ""
        while (line := f.readline().decode()) != "\n":
            assert line, "the stream ended"
            if line.startswith("event: "):
                kind = line[7:].strip()
            elif line.startswith("data: "):
                data += line[6:].strip()
        return kind, json.loads(data)
    return s, event


def case_events(tmp):
    c, rpc, port, _ = start_coordinator(tmp, False)
    base = f"http://127.0.0.1:{port}"
    err = Lines(c.stderr, "coordinator")
    agents = []
    try:
        s, event = open_stream(port)
        k1, e1 = event()
        k2, e2 = event()
        assert k1 == k2 == "status" and e2["coordinator"]["uptime_s"] > e1["coordinator"]["uptime_s"], \
            (e1, e2)
        # The client goes away mid-stream.
        s.close()
        agents = start_job(rpc, None)
        wait_until("the job running", lambda: (job_json(base, None) or {}).get("state") == "running")
        s, event = open_stream(port, f"?job={JOB}")
        steps = []
        while len(steps) < 2 or steps[-1] <= steps[0]:
            kind, j = event()
            assert kind == "job" and j["name"] == JOB and len(j["ranks"]) == 2, (kind, j)
            assert j["ranks_listed"] == 2, j
            steps.append(j["rank_summary"]["step_max"])
        print(f"job stream: steps {steps}")
        # Gone mid-event: reset, with unread bytes.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        s.close()
        # A client that never reads: the coordinator closes its stream
        # once 256 KiB wait for it (GS_HTTP_STREAM_BACKLOG); it is not
        # idle, so only the backlog ends it. Its receive buffer is made
        # small so that this comes sooner.
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", port))
        slow.sendall(f"GET /events?job={JOB} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        for bad in ("?job=", "?job=%zz", "?job=nope"):
            code = http(base, "/events" + bad, None)[0]
            assert code in (400, 404), (bad, code)
        assert http(base, "/events", None, method="POST", body={})[0] == 405
        code, _, text = http(base, "/status", None)
        assert code == 200 and json.loads(text)["jobs"][0]["name"] == JOB, text
        print("after two clients left mid-stream and one that does not read: /status serves")
        slow.close()
    finally:
        for a in agents:
            a.kill()
            a.wait()
        c.kill()
        c.wait()


def main():
    tmp = tempfile.mkdtemp(prefix="gs-ui-")
    try:
        globals()["case_" + CASE](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"ui {CASE}: ok")


if __name__ == "__main__":
    main()
