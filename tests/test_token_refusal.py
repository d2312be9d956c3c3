#!/usr/bin/env python3
"""The token contract (proto/README.md): a call with a missing or wrong
token gets one UNAUTHENTICATED reply, with its message, and then the
connection closes. Against the real coordinator from a raw socket, the
client pipelines more frames behind the refused one in the same write
(valid calls, calls without a token, an unknown method, an undecodable
Envelope, an oversized frame's header) and then reads: the reply comes
first, nothing behind it is dispatched (the coordinator's /metrics and
/status count nothing, its log has no line about them), then a clean EOF,
not a reset. The same with a burst of 20,000 frames behind it; with 60,000
answered calls before it that the client reads only afterwards, so the
replies wait in the coordinator's write queue and the refusal must wait
behind them; and with a client that never closes (the coordinator ends
the connection by itself). Case `tls` does it all inside TLS.

usage: test_token_refusal.py CASE COORDINATOR_BINARY PROTO_DIR
cases: plain, tls
"""
import json
import os
import re
import select
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from protoc_client import PREFIX, load_proto  # noqa: E402
from test_limits import Coordinator, frame  # noqa: E402
from testlib import WAIT  # noqa: E402

TOKEN = "sesame"
UNAUTHENTICATED = 16
NOT_FOUND = 5
WAIT_S = WAIT  # only a failure waits this long


class Peer:
    """One client connection, plaintext or TLS, driven from one thread (an
    SSL object is not for two): it writes and reads at once, so that
    neither side waits on the other."""

    def __init__(self, pb, port, tls):
        self.pb = pb
        raw = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        # No ragged EOFs: the coordinator ends a TLS session with a close_notify.
        self.sock = (tls.wrap_socket(raw, server_hostname="127.0.0.1", suppress_ragged_eofs=False)
                     if tls else raw)
        self.sock.setblocking(False)

    def exchange(self, data, stalled=None):
        """Sends `data` and reads until a clean EOF (a reset raises); returns
        the Envelopes read and what ended the sending ("all", or the error).
        With `stalled`, nothing is read until it says so: it is asked each
        time 0.1 s pass with no byte sent."""
        # A bytearray appends in place: a TLS read returns one record, often one reply.
        sent, buf, eof, ended = 0, bytearray(), False, None
        holding = stalled is not None
        deadline = time.monotonic() + WAIT_S
        while not eof or ended is None:
            assert time.monotonic() < deadline, f"no EOF within {WAIT_S} s"
            if sent == len(data) and ended is None:
                ended = "all"
            reading = not eof and not holding
            writing = ended is None
            pending = reading and hasattr(self.sock, "pending") and self.sock.pending()
            r, w, _ = select.select([self.sock] if reading else [],
                                    [self.sock] if writing else [], [], 0 if pending else 0.1)
            if holding and not w and stalled():
                holding = False
            if w:
                try:
                    sent += self.sock.send(data[sent:sent + (1 << 16)])
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except OSError as e:
                    ended = e
            if r or pending:
                try:
                    chunk = self.sock.recv(1 << 16)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue
                eof = not chunk
                buf += chunk
        envs, at = [], 0
        while at < len(buf):
            assert len(buf) - at >= 4, f"EOF inside a frame's length: {buf[at:]!r}"
            (n,) = struct.unpack_from(">I", buf, at)
            assert len(buf) - at >= 4 + n, "EOF inside a frame"
            envs.append(self.pb.Envelope.FromString(bytes(buf[at + 4:at + 4 + n])))
            at += 4 + n
        return envs, ended

    def close(self):
        self.sock.close()


class Server:
    def __init__(self, binary, tls_files=None):
        flags = ["--tls-cert", tls_files[0], "--tls-key", tls_files[1]] if tls_files else []
        self.c = Coordinator(binary, *flags, env=dict(os.environ, GRADSYNC_TOKEN=TOKEN))
        self.tls = None
        scheme = "http"
        if tls_files:
            self.tls = ssl.create_default_context(cafile=tls_files[0])
            scheme = "https"
        self.base = f"{scheme}://127.0.0.1:{self.c.http_port}"

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=WAIT_S, context=self.tls) as r:
            return r.read().decode()

    def metric(self, name):
        m = re.search("^" + re.escape(name) + r" (\d+)$", self.get("/metrics"), re.M)
        return int(m.group(1)) if m else 0

    def counts(self):
        """What the coordinator dispatched so far."""
        return {m: self.metric(f'gradsync_rpc_requests_total{{method="{m}"}}')
                for m in ("Heartbeat", "Join")} | {"bad": self.metric("gradsync_bad_frames_total")}

    def wait_connections(self, want):
        deadline = time.monotonic() + WAIT_S
        while self.metric("gradsync_rpc_connections") != want:
            assert time.monotonic() < deadline, "the coordinator kept a refused connection"
            time.sleep(0.05)


def hb(pb, token, request_id, job="nosuch"):
    return frame(pb, PREFIX + "Heartbeat", pb.HeartbeatRequest(job=job, rank=0), token=token,
                 request_id=request_id)


def behind(pb, n=0):
    """Frames a client pipelines behind the refused one: each would be
    dispatched, answered or logged if the coordinator read on. `n` more
    valid Heartbeats make a burst."""
    sig = pb.ModelSignature(param_count=1, total_elements=1, shapes_hash=1, dtypes_hash=1)
    join = frame(pb, PREFIX + "Join",
                 pb.JoinRequest(job="behind", world_size=2, node="n", local_rank=0, device="cpu",
                                model_signature=sig), token=TOKEN, request_id=11)
    undecodable = struct.pack(">I", 3) + b"\xff\xff\xff"
    oversized = struct.pack(">I", 100 << 20)  # a header only: the limit is 4 MiB
    return (join + hb(pb, TOKEN, 12) + hb(pb, "", 13) + hb(pb, "x" * 64, 14) +
            frame(pb, PREFIX + "NoSuchMethod", body=b"", token=TOKEN, request_id=15) +
            b"".join(hb(pb, TOKEN, 100 + i) for i in range(n)) + undecodable + oversized)


def refused(srv, pb, what, bad, message, before=0, after=0, close=True):
    """Sends `before` answered Heartbeats, the refused frame `bad` and what
    `behind` makes (the refused frame and those behind it in one write,
    when nothing comes before it); reads every reply; checks the contract."""
    base = srv.counts()
    log_mark = len(srv.c.text())
    p = Peer(pb, srv.c.rpc_port, srv.tls)
    data = b"".join(hb(pb, TOKEN, 100_000 + i) for i in range(before)) + bad + behind(pb, after)
    stalled = None
    if before:
        # The client reads nothing until the coordinator has stopped taking
        # frames (it reached the refused one, or its write queue is full),
        # so the replies wait in that queue.
        seen = []

        def stalled():
            seen.append(srv.counts()["Heartbeat"] - base["Heartbeat"])
            return seen[-1] == before + 1 or seen[-5:] == [seen[-1]] * 5

    replies, ended = p.exchange(data, stalled)
    got = srv.counts()
    assert len(replies) == before + 1, (
        f"{what}: {len(replies)} replies, want {before} and the refusal: "
        f"{[(r.request_id, r.status, r.message) for r in replies[-3:]]}")
    for i, r in enumerate(replies[:-1]):
        assert r.request_id == 100_000 + i and r.status == NOT_FOUND, (what, i, r)
    last = replies[-1]
    assert last.request_id == 1 and last.method == PREFIX + "Heartbeat", (what, last)
    assert last.status == UNAUTHENTICATED and last.message == message, (what, last)
    assert got == {"Heartbeat": base["Heartbeat"] + before + 1, "Join": base["Join"],
                   "bad": base["bad"]}, (what, base, got)
    assert json.loads(srv.get("/status"))["coordinator"]["jobs"] == 0, f"{what}: a Join ran"
    log = srv.c.text()[log_mark:]
    for line in ("unknown method", "undecodable", "byte limit", "behind"):
        assert line not in log, f"{what}: the coordinator read on: {log[-2000:]}"
    # A reset while the client still sends can destroy the reply before
    # the client reads it: the coordinator must drain, not reset.
    assert ended == "all", f"{what}: sending the rest failed: {ended}"
    if close:
        p.close()
    srv.wait_connections(0)  # closed by the client, or after the linger
    if not close:
        p.close()
    print(f"{what}: {before} replies, then {last.status} '{last.message}', then EOF; "
          f"nothing behind it dispatched")


def run_case(binary, pb, tls_files=None):
    srv = Server(binary, tls_files)
    name = "tls" if tls_files else "plain"
    try:
        refused(srv, pb, f"{name} wrong token", hb(pb, "wrong", 1), "wrong token")
        refused(srv, pb, f"{name} missing token", hb(pb, "", 1), "missing token")
        # 64 characters: perhaps a job's token, checked once the body
        # names the job.
        refused(srv, pb, f"{name} another job's token", hb(pb, "0" * 64, 1, job="j1"),
                "wrong token (not the coordinator's, not job j1's)")
        refused(srv, pb, f"{name} burst", hb(pb, "wrong", 1), "wrong token", after=20000)
        refused(srv, pb, f"{name} queued", hb(pb, "wrong", 1), "wrong token", before=60000,
                after=5000)
        refused(srv, pb, f"{name} never closed", hb(pb, "wrong", 1), "wrong token", close=False)
        assert srv.c.proc.poll() is None, "the coordinator died"
    finally:
        srv.c.close()


def case_plain(binary, pb):
    run_case(binary, pb)


def case_tls(binary, pb):
    if not shutil.which("openssl"):
        print("skipped: no openssl command to make a certificate")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="gs-token-") as d:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                        "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        run_case(binary, pb, (cert, key))


CASES = {"plain": case_plain, "tls": case_tls}


def main():
    case, binary, proto_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    CASES[case](binary, load_proto(proto_dir))
    print(f"{case}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
