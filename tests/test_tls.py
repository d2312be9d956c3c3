#!/usr/bin/env python3
"""TLS on the coordinator's ports, against the real coordinator, agents,
curl and the Python package, with a throwaway CA made here by the openssl
command: agents train over TLS; curl --cacert reads /healthz and /status;
plain HTTP, plaintext agents, a wrong CA, a certificate that does not name
the address, a TLS agent against a plaintext coordinator and a handshake
that never starts all fail clearly, fast, and leave the coordinator
serving; --tls-client-ca refuses agents without a certificate it signed;
bad flag files end the coordinator with status 2 and a reason; ranks
behind a node agent train over TLS and mutual TLS, and its wrong CA, a
missing client certificate and an expired coordinator certificate end
the run at once, saying why.

usage: test_tls.py BIN_DIR COORDINATOR_BIN [PYTHON_PACKAGE_DIR]
"""
import json
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT  # noqa: E402

BIN_DIR, COORD = sys.argv[1], sys.argv[2]
PYDIR = sys.argv[3] if len(sys.argv) > 3 else None
AGENT = os.path.join(BIN_DIR, "gradsync-agent")
RUN = os.path.join(BIN_DIR, "gradsync-run")


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """Two CAs; from the first a server certificate for 127.0.0.1 and
    localhost, one that names neither, and a client certificate."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "ca2"):
        openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/CN=gradsync test {ca}", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    with open(os.path.join(d, "other.ext"), "w") as f:
        f.write("subjectAltName=DNS:elsewhere.example\n")
    for name, ext in (("server", "server.ext"), ("other", "other.ext"), ("client", None)):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                *(["-extfile", ext] if ext else []), cwd=d)
    return lambda name: os.path.join(d, name)


def expired_cert(d, name="expired", ext=None):
    """A server certificate of the first CA that expired in 2020 (openssl
    ca takes dates; req and x509 take only days from now); with `ext`,
    the extensions of that file (its subjectAltName)."""
    if not os.path.exists(os.path.join(d, "ca.cnf")):
        with open(os.path.join(d, "ca.cnf"), "w") as f:
            f.write("[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n"
                    "serial = serial\ndefault_md = sha256\npolicy = p\n"
                    "[p]\ncommonName = supplied\n")
        open(os.path.join(d, "index.txt"), "w").close()
        with open(os.path.join(d, "serial"), "w") as f:
            f.write("01\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in",
            f"{name}.csr", "-out", f"{name}.pem", "-startdate", "20200101000000Z", "-enddate",
            "20200102000000Z", "-notext", *(["-extfile", ext] if ext else []), cwd=d)
    return os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")


def check_cert_dates(pki, d):
    """An expired server certificate is named at start (the coordinator
    still starts: it may be renewed in place); one that expires within 14
    days is too (the test CA's live for 2)."""
    cert, key = expired_cert(d)
    for pem, key, want in ((cert, key, r"the certificate expired on 2020-01-02 00:00 UTC \(\d+ "
                                       r"day\(s\) ago\): TLS clients will refuse it"),
                           (pki("server.pem"), pki("server.key"),
                            # 2 when checked within the second it was made
                            r"the certificate expires on \S+ \S+ UTC, in [012] day\(s\): "
                            r"renew it")):
        c, _, _ = coordinator("--tls-cert", pem, "--tls-key", key)
        c.kill()
        _, err = c.communicate()
        assert re.search(r"WARN .*--tls-cert " + re.escape(pem) + ": " + want, err), err[-2000:]
        print("certificate dates:", re.search(r"--tls-cert .*", err).group(0))


def coordinator(*extra, env=None):
    c = subprocess.Popen([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                          "--log-level", "warn", "--idle-timeout", "2s"] + list(extra),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, **(env or {})))
    line = c.stdout.readline()
    m = re.search(r"rpc=(\S+) http=(\S+)", line)
    assert m, (line, c.stderr.read() if c.poll() is not None else "")
    return c, m.group(1), m.group(2)


def agents(rpc, job, *flags, world=1, env=None, steps=10):
    """Runs `world` agents of `job`: [(status, stderr, seconds)]. Their
    --join-timeout is an hour: one that failed only at it would fail the
    test at its wait instead."""
    start = time.time()
    ps = [subprocess.Popen([AGENT, "--coordinator", rpc, "--job", job, "--world-size", str(world),
                            "--local-rank", str(i), "--reduce", "mean", "--steps", str(steps),
                            "--no-validate", "--join-timeout", "3600s"] + list(flags),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, **(env or {})))
          for i in range(world)]
    try:
        out = []
        for p in ps:
            _, err = p.communicate(timeout=2 * WAIT)
            out.append((p.returncode, err, time.time() - start))
        return out
    finally:
        for p in ps:
            p.kill()
            p.wait()


def refused(rpc, job, want, *flags):
    """One agent that must fail at once (not at its join timeout), saying `want`."""
    [(code, err, secs)] = agents(rpc, job, *flags)
    assert code != 0 and want in err, (job, code, err[-2000:])
    return err.strip().splitlines()[-1]


def https_get(url, ca):
    """The body of GET `url`, by curl --cacert when there is curl."""
    if shutil.which("curl"):
        return subprocess.run(["curl", "-sS", "--fail", "--max-time", str(WAIT), "--cacert", ca,
                               url], capture_output=True, text=True, check=True).stdout
    with urllib.request.urlopen(url, timeout=WAIT,
                                context=ssl.create_default_context(cafile=ca)) as r:
        return r.read().decode()


def case_bad_flags(pki):
    for flags, want in [
            (["--tls-cert", pki("server.pem")], "needs --tls-key"),
            (["--tls-cert", pki("server.pem"), "--tls-key", pki("missing.key")],
             "No such file or directory"),
            (["--tls-cert", pki("server.pem"), "--tls-key", pki("client.key")], "does not match"),
            (["--tls-cert", pki("server.ext"), "--tls-key", pki("server.key")],
             "not a PEM certificate"),
            (["--tls-cert", pki("server.pem"), "--tls-key", pki("server.key"),
              "--tls-client-ca", pki("server.ext")], "no PEM certificate")]:
        r = subprocess.run([COORD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"] + flags,
                           capture_output=True, text=True, timeout=WAIT)
        assert r.returncode == 2 and want in r.stderr, (flags, r.returncode, r.stderr)
    r = subprocess.run([AGENT, "--coordinator", "127.0.0.1:1", "--world-size", "1", "--steps", "1",
                        "--tls-ca", pki("missing.pem")], capture_output=True, text=True, timeout=WAIT)
    assert r.returncode != 0 and "--tls-ca" in r.stderr and "No such file" in r.stderr, r.stderr
    print("bad TLS files: exit status 2 (agent: an error) naming the file and the cause")


def case_python(rpc, ca):
    """One rank of the Python package over TLS, tls_ca given to init()."""
    script = ("import sys, torch, torch.nn.functional as F\n"
              "import gradsync.torch as gs\n"
              "gs.init(coordinator=sys.argv[1], job='py', world_size=1, local_rank=0,\n"
              "        tls_ca=sys.argv[2])\n"
              "model = torch.nn.Linear(4, 2)\n"
              "opt = gs.DistributedOptimizer(model, lr=0.1)\n"
              "for _ in range(3):\n"
              "    opt.zero_grad()\n"
              "    loss = F.mse_loss(model(torch.ones(8, 4)), torch.zeros(8, 2))\n"
              "    loss.backward()\n"
              "    opt.step(loss)\n"
              "opt.finish()\n"
              "print('trained over TLS')\n")
    env = dict(os.environ, PYTHONPATH=PYDIR)
    r = subprocess.run([sys.executable, "-c", script, rpc, ca], capture_output=True, text=True,
                       env=env, timeout=2 * WAIT)
    assert r.returncode == 0 and "trained over TLS" in r.stdout, (r.returncode, r.stderr[-3000:])
    print("python: gradsync.torch.init(tls_ca=...) trained a rank over TLS")


def check_tls_coordinator(pki):
    c, rpc, http = coordinator("--tls-cert", pki("server.pem"), "--tls-key", pki("server.key"),
                               "--heartbeat-interval", "100ms", "--heartbeat-timeout", "10s")
    try:
        res = agents(rpc, "tls", "--tls-ca", pki("ca.pem"), world=2, steps=150)
        assert all(code == 0 for code, _, _ in res), res
        metrics = https_get(f"https://{http}/metrics", pki("ca.pem"))
        beats = re.search(r'gradsync_rpc_requests_total\{method="Heartbeat"\} (\d+)', metrics)
        assert beats and int(beats.group(1)) > 0, metrics[-2000:]
        print(f"2 agents trained over TLS (--tls-ca); their heartbeat threads' own "
              f"connections sent {beats.group(1)} heartbeats")
        r = subprocess.run([RUN, "--coordinator", rpc, "--nnodes", "1", "--node-rank", "0",
                            "--nproc-per-node", "2", "--job", "run", "--", "--tls-ca", pki("ca.pem"),
                            "--reduce", "mean", "--steps", "10", "--no-validate"],
                           capture_output=True, text=True, timeout=2 * WAIT)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        r = subprocess.run([RUN, "--nproc", "1", "--", "--tls-ca", pki("ca.pem")],
                           capture_output=True, text=True, timeout=WAIT)
        assert r.returncode == 2 and "without TLS" in r.stderr, (r.returncode, r.stderr)
        print("gradsync-run: --tls-ca reaches the agents that join; refused with its own "
              "coordinator")
        assert json.loads(https_get(f"https://{http}/healthz", pki("ca.pem")))["status"] == "ok"
        status = json.loads(https_get(f"https://{http}/status", pki("ca.pem")))
        assert any(j["name"] == "tls" for j in status["jobs"]), status
        print("curl --cacert ca.pem https://.../healthz and /status answer")
        try:
            urllib.request.urlopen(f"http://{http}/healthz", timeout=WAIT)
            raise AssertionError("plain http to the TLS port was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and b"https://" in e.read(), e
        assert json.loads(https_get(f"https://{http}/healthz", pki("ca.pem")))["status"] == "ok"
        print("plain http://: 400 'use https://', and the port serves TLS on")
        line = refused(rpc, "wrong-ca", "certificate verify failed", "--tls-ca", pki("ca2.pem"))
        print("wrong CA:", line)
        line = refused(rpc, "no-tls", "answered in TLS")
        print("no --tls-ca:", line)
        host, port = rpc.rsplit(":", 1)
        [(code, err, _)] = agents(f"localhost:{port}", "by-name", "--tls-ca", pki("ca.pem"))
        assert code == 0, err[-2000:]
        print("dialled by name (localhost), the name is checked and the agent trained")
        silent = [socket.create_connection((h, int(p)), timeout=WAIT)
                  for h, p in (rpc.rsplit(":", 1), http.rsplit(":", 1))]
        start = time.time()
        for s in silent:
            with s:
                assert s.recv(1) == b""  # no handshake: closed at --idle-timeout
        print(f"connections (RPC, HTTP) that never start a handshake close at --idle-timeout "
              f"(2 s): after {time.time() - start:.1f} s")
        if PYDIR:
            case_python(rpc, pki("ca.pem"))
        assert c.poll() is None, "the coordinator died"
    finally:
        c.kill()
        _, err = c.communicate()
    assert "TLS handshake failed" in err and "agents need --tls-ca" in err, err[-3000:]
    c, rpc, _ = coordinator("--tls-cert", pki("other.pem"), "--tls-key", pki("other.key"))
    try:
        line = refused(rpc, "mismatch", "IP address mismatch", "--tls-ca", pki("ca.pem"))
        print("a certificate that does not name 127.0.0.1:", line)
    finally:
        c.kill()
        c.wait()


def check_raw_client(pki):
    """A client written from proto/README.md alone (stock protoc, Python's
    ssl): frames travel inside TLS unchanged. 60,000 pipelined calls read
    only afterwards push the coordinator past its backpressure mark, so
    TLS connections pause and resume: every reply must come, in order. A
    2 MiB frame (many TLS records) is decoded and refused as too many
    params."""
    tests = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, tests)
    from protoc_client import PREFIX, load_proto
    pb = load_proto(os.path.join(tests, "..", "proto"))

    def frame(method, msg, request_id):
        data = pb.Envelope(method=PREFIX + method, request_id=request_id,
                           body=msg.SerializeToString()).SerializeToString()
        return struct.pack(">I", len(data)) + data

    def exact(sock, n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the coordinator closed the connection"
            buf += chunk
        return buf

    def envelope(sock):
        (n,) = struct.unpack(">I", exact(sock, 4))
        return pb.Envelope.FromString(exact(sock, n))

    c, rpc, _ = coordinator("--tls-cert", pki("server.pem"), "--tls-key", pki("server.key"),
                            "--idle-timeout", "30s")
    host, port = rpc.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=pki("ca.pem"))
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(WAIT)
        raw.connect((host, int(port)))
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            calls = 60000
            hb = b"".join(frame("Heartbeat", pb.HeartbeatRequest(job="nosuch", rank=0), i)
                          for i in range(1, calls + 1))
            sender = threading.Thread(target=s.sendall, args=(hb,))
            sender.start()
            time.sleep(1.0)
            ids = [envelope(s).request_id for _ in range(calls)]
            sender.join()
            assert ids == list(range(1, calls + 1)), "replies lost or out of order"
            entries = 1 << 20  # PackList.params: an empty ParamInfo is 2 bytes
            lst = b"\x12\x00" * entries
            body = (pb.PublishPackListRequest(job="big").SerializeToString() + b"\x22" +
                    _varint(len(lst)) + lst)
            env = pb.Envelope(method=PREFIX + "PublishPackList", request_id=7,
                              body=body).SerializeToString()
            s.sendall(struct.pack(">I", len(env)) + env)
            reply = envelope(s)
            assert reply.request_id == 7 and "--max-params" in reply.message, reply
        print(f"stock protobuf over Python ssl: {calls} pipelined calls answered in order; "
              f"a {len(env) >> 20} MiB frame decoded ({reply.message[:40]}...)")
        assert c.poll() is None, "the coordinator died"
    finally:
        c.kill()
        c.wait()


def _varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def check_mutual(pki):
    c, rpc, http = coordinator(env={"GRADSYNC_TLS_SERVER_CERT": pki("server.pem"),
                                    "GRADSYNC_TLS_SERVER_KEY": pki("server.key"),
                                    "GRADSYNC_TLS_CLIENT_CA": pki("ca.pem")})
    try:
        line = refused(rpc, "anon", "client certificate", "--tls-ca", pki("ca.pem"))
        print("mTLS, no client certificate:", line)
        line = refused(rpc, "stranger", "--tls-client-ca", "--tls-ca", pki("ca.pem"),
                       "--tls-cert", pki("ca2.pem"), "--tls-key", pki("ca2.key"))
        print("mTLS, a certificate another CA signed:", line)
        [(code, err, _)] = agents(rpc, "mtls", env={"GRADSYNC_TLS_CA": pki("ca.pem"),
                                                    "GRADSYNC_TLS_CERT": pki("client.pem"),
                                                    "GRADSYNC_TLS_KEY": pki("client.key")})
        assert code == 0, err[-2000:]
        print("mTLS (coordinator and agent set up by $GRADSYNC_TLS_*): the agent with a client "
              "certificate trained")
        assert json.loads(https_get(f"https://{http}/healthz", pki("ca.pem")))["status"] == "ok"
        print("mTLS: the HTTP port asks curl for no certificate")
    finally:
        c.kill()
        c.wait()


def node_agent_run(rpc, job, *agent_flags, env=None):
    """gradsync-run --node-agent with 2 ranks of `job` joining `rpc` (agent
    flags after "--"): (status, output)."""
    p = subprocess.run([RUN, "--node-agent", "--coordinator", rpc, "--nproc", "2", "--job", job,
                        "--", "--reduce", "mean", "--steps", "10", "--no-validate",
                        "--join-timeout", "3600s"] + list(agent_flags),
                       capture_output=True, text=True, timeout=2 * WAIT,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def check_node_agent(pki, d):
    """Ranks behind a node agent over TLS: the node agent speaks TLS (and
    mutual TLS) to the coordinator with the agents' flags or variables,
    the ranks reach it on its plain Unix socket, and the job trains. A
    wrong CA and an expired coordinator certificate end the run at once,
    saying why, without restarting the node agent."""
    c, rpc, _ = coordinator("--tls-cert", pki("server.pem"), "--tls-key", pki("server.key"),
                            "--tls-client-ca", pki("ca.pem"))
    try:
        code, out = node_agent_run(rpc, "na-flags", "--tls-ca", pki("ca.pem"), "--tls-cert",
                                   pki("client.pem"), "--tls-key=" + pki("client.key"))
        assert code == 0 and "relay: connected to the coordinator" in out and "(TLS)" in out, \
            out[-3000:]
        assert "all 2 local ranks of node 0 finished" in out, out[-3000:]
        print("node agent, mTLS by the agents' flags: the 2 ranks behind it trained")
        code, out = node_agent_run(rpc, "na-env", env={"GRADSYNC_TLS_CA": pki("ca.pem"),
                                                        "GRADSYNC_TLS_CERT": pki("client.pem"),
                                                        "GRADSYNC_TLS_KEY": pki("client.key")})
        assert code == 0 and "(TLS)" in out, out[-3000:]
        print("node agent, mTLS by $GRADSYNC_TLS_*: the 2 ranks behind it trained")
        code, out = node_agent_run(rpc, "na-nocert", "--tls-ca", pki("ca.pem"))
        assert code != 0 and "asks for a client certificate" in out, out[-3000:]
        assert "nor would a restart" in out and "starting it again" not in out, out[-3000:]
        print("node agent without a client certificate:",
              re.search(r"gradsync-relay: .*", out).group(0))
        code, out = node_agent_run(rpc, "na-wrongca", "--tls-ca", pki("ca2.pem"),
                                   "--tls-cert", pki("client.pem"), "--tls-key", pki("client.key"))
        assert code != 0 and "certificate verify failed" in out and \
            "is --tls-ca the CA that signed" in out, out[-3000:]
        assert "nor would a restart" in out and "starting it again" not in out, out[-3000:]
        print("node agent, a wrong CA:", re.search(r"gradsync-relay: .*", out).group(0))
    finally:
        c.kill()
        c.wait()
    cert, key = expired_cert(d, "expired-ip", pki("server.ext"))
    c, rpc, _ = coordinator("--tls-cert", cert, "--tls-key", key)
    try:
        code, out = node_agent_run(rpc, "na-expired", "--tls-ca", pki("ca.pem"))
        assert code != 0 and "certificate has expired" in out and \
            "check the certificate's dates" in out, out[-3000:]
        print("node agent, an expired coordinator certificate:",
              re.search(r"gradsync-relay: .*", out).group(0))
    finally:
        c.kill()
        c.wait()


def check_plain_coordinator(pki):
    c, rpc, _ = coordinator()
    try:
        line = refused(rpc, "tls-to-plain", "did not answer in TLS", "--tls-ca", pki("ca.pem"))
        print("TLS agent, plaintext coordinator:", line)
    finally:
        c.kill()
        _, err = c.communicate()
    assert "speaks TLS, but this coordinator has no --tls-cert" in err, err[-2000:]


def main():
    if not shutil.which("openssl"):
        print("skipped: no openssl command to make the test CA")
        return 77
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="gradsync-tls-") as d:
        pki = make_pki(d)
        case_bad_flags(pki)
        check_cert_dates(pki, d)
        check_tls_coordinator(pki)
        check_mutual(pki)
        check_node_agent(pki, d)
        check_raw_client(pki)
        check_plain_coordinator(pki)
    print(f"all TLS cases in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
