#!/usr/bin/env python3
"""A soak of the coordinator under hostile clients (issue 23): a training
job runs twice against a coordinator with a token, an explicit --max-memory
and a chosen open-file limit, first alone (the baseline), then with every
abuser below running alongside for the job's whole duration (bounded: they
stop when the job ends or after --max-abuse). It prints each run's outcome
(exit codes) and final accuracy, the coordinator's peak RSS (VmHWM) against
--max-memory, /healthz latency sampled every 50 ms throughout, the lines
the coordinator logged (and how many were WARN), and what each abuser sent
and saw refused. It exits 1 when a promise failed: the job did not finish,
or its accuracy differs from the baseline's by more than --tolerance, peak
RSS passed --max-memory, a /healthz went unanswered, or with the abusers
its p99 was 50 ms or more (the baseline's p99 only says how busy the
machine is), its RSS was not back within 64 MiB of where it started 10 s
after the abuse, or a node agent's connection was closed for one slot's
wrong token. The coordinator and the /healthz sampler run at nice -10 when
run as root (--coordinator-nice), as on a host of their own: on a small
machine shared with two training ranks and seven abusers, the scheduler
would otherwise be what /healthz measures.

The abusers, each in a process of its own (so that none waits on another's
Python lock, nor the /healthz sampler on theirs):

  partial  clients without the token, each sending all but the end of a
           frame of nearly 4 MiB and holding it, and many idle RPC
           connections (more than --max-connections)
  http     many idle HTTP connections, more than --max-http-connections
  parked   a client with a job's token parking a Join per connection in
           its own job, of world 65,536
  blobs    one-rank jobs (a job token each), each publishing 16 KiB blobs
           up to the 1,024 a job may hold, and heartbeating to keep them
  jobs     a client with the coordinator's token creating jobs as fast as
           it can: a Join with a fresh name, then the connection closed
  logs     wrong-token requests on both ports from one address
  preauth  frames with a wrong job-looking token (64 hex digits) carrying a
           pack list of 131,072 entries
  stream   clients without the token streaming frames of nearly 4 MiB as
           fast as the coordinator reads them (its pre-authentication rate)
  httpnoread  HTTP clients pipelining GET /ui/app.js and never reading
  trace    a job token's holder playing every rank of a 128-rank job (a
           node agent's slots), each publishing an 800-span trace, then
           asking for the merged trace over and over, pipelined, unread
  slotjoins  connections parking a Join on each of a node agent's 255 slots
  jobcap   one-rank jobs that join and leave finished at once, a new name
           each, filling --max-jobs with jobs at rest
  slottoken  a node agent's connection with 4 ranks of its job, heartbeating,
           and a fifth slot calling with a wrong token now and then: the
           connection must never be closed

The attacks reuse tests/test_limits.py's helpers (the coordinator under
test, frames, /metrics).

usage: bench/abuse_soak.py --bin BUILD/bin [--max-memory 256MiB] [--nofile 1024] [--max-jobs 2000]
                           [--epochs 10] [--max-abuse 240] [--abusers partial,http,...]
"""
import argparse
import hashlib
import hmac
import http.client
import math
import multiprocessing as mp
import os
import re
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import test_limits as limits  # noqa: E402  (the coordinator and frames, as the tests make them)
from benchlib import FINAL_RE, subset  # noqa: E402
from protoc_client import PREFIX, load_proto  # noqa: E402

MiB = limits.MiB
JOB = "soak"
DATA = "/usr/share/datasets/fashion-mnist"
TRAIN = ["--reduce", "mean", "--layers", "784,64,10", "--batch", "64", "--seed", "7"]
ABUSERS = ["partial", "http", "parked", "blobs", "jobs", "logs", "preauth", "stream",
           "httpnoread", "trace", "slotjoins", "jobcap", "slottoken"]
HEALTHZ_EVERY = 0.05
HEALTHZ_P99_MS = 50
RSS_BACK = 64 * 1024 * 1024  # the RSS a burst may leave behind once freed
RSS_SETTLE_S = 10
SIZE_RE = re.compile(r"^(\d+)(B|KiB|MiB|GiB)$")


def parse_size(text):
    m = SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"a size such as 256MiB, not {text!r}")
    return int(m.group(1)) << {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]


class Ctx:
    """What every abuser knows: the ports, the protocol, the tokens."""

    def __init__(self, pb, c, token, job_token):
        self.pb, self.rpc, self.http = pb, c.rpc_port, c.http_port
        self.token, self.job_token = token, job_token

    def connect(self, port=None, timeout=5):
        return socket.create_connection(("127.0.0.1", port or self.rpc), timeout=timeout)


class Counts(dict):
    def add(self, key, n=1):
        self[key] = self.get(key, 0) + n


class Pool:
    """Connections an abuser holds open, topped up to `want` (at most
    `per_round` new ones a round) and reaped when the coordinator closes
    them; `opener` makes one (it may send something first)."""

    def __init__(self, want, per_round, opener, counts, name):
        self.want, self.per_round, self.opener = want, per_round, opener
        self.counts, self.name, self.socks = counts, name, []
        self.poll = select.poll()

    def top_up(self):
        for _ in range(min(self.per_round, self.want - len(self.socks))):
            self.counts.add(f"{self.name} opened")
            try:
                s = self.opener()
            except OSError as e:
                self.counts.add(f"{self.name} refused at connect ({type(e).__name__})")
                continue
            s.setblocking(False)
            self.socks.append(s)
            self.poll.register(s, select.POLLIN)
        self.counts[f"{self.name} held (max)"] = max(
            self.counts.get(f"{self.name} held (max)", 0), len(self.socks))

    def reap(self, on_data=None):
        """Drops the connections the coordinator closed; `on_data(sock,
        bytes)` sees what the others were sent, and keeps the connection
        open by returning True."""
        ready = dict(self.poll.poll(0))
        keep = []
        for s in self.socks:
            if s.fileno() not in ready:
                keep.append(s)
                continue
            try:
                data = s.recv(1 << 16)
            except BlockingIOError:
                keep.append(s)
                continue
            except OSError as e:
                self.counts.add(f"{self.name} reset ({type(e).__name__})")
                data = b""
            if data:
                if on_data is None or on_data(s, data):
                    keep.append(s)
                else:
                    self.poll.unregister(s)
                    s.close()
            else:
                self.counts.add(f"{self.name} closed by the coordinator")
                self.poll.unregister(s)
                s.close()
        self.socks = keep

    def close(self):
        for s in self.socks:
            s.close()
        self.counts[f"{self.name} held at the end"] = len(self.socks)


def status_name(code):
    return {0: "OK", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 7: "PERMISSION_DENIED",
            8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
            16: "UNAUTHENTICATED"}.get(code, f"status {code}")


def abuse_partial(ctx, stop, n):
    """Clients without the token: each sends nearly 4 MiB of a frame it
    never finishes; and more idle connections than the RPC port admits."""
    size = 4 * MiB - 64
    part = struct.pack(">I", size) + b"\x0a" * (size - 1024)

    def partial():
        s = ctx.connect(timeout=0.5)
        try:
            s.sendall(part)
            n.add("partial frames sent whole")
        except socket.timeout:
            n.add("partial frames pushed back")  # the coordinator stopped reading
        except OSError:
            n.add("partial frames cut off")
        return s

    frames = Pool(32, 4, partial, n, "partial-frame connections")
    idle = Pool(1000, 50, ctx.connect, n, "idle RPC connections")
    while not stop.is_set():
        for p in (frames, idle):
            p.reap()
            p.top_up()
        stop.wait(0.1)
    frames.close()
    idle.close()


def abuse_http(ctx, stop, n):
    """Idle HTTP connections (they need no token), more than the cap."""
    idle = Pool(400, 50, lambda: ctx.connect(ctx.http), n, "idle HTTP connections")
    while not stop.is_set():
        idle.reap()
        idle.top_up()
        stop.wait(0.1)
    idle.close()


def abuse_parked(ctx, stop, n):
    """A job token's holder parks Joins in its own job, of world 65,536,
    one per connection, and opens another for each answered or closed."""
    pb, seq = ctx.pb, [0]
    sig = pb.ModelSignature(param_count=1, total_elements=1, shapes_hash=1, dtypes_hash=1)

    def join():
        seq[0] += 1
        s = ctx.connect()
        s.sendall(limits.frame(pb, PREFIX + "Join", pb.JoinRequest(
            job="parked", world_size=65536, node=f"p{seq[0]}", local_rank=0, device="cpu",
            model_signature=sig), token=ctx.job_token("parked")))
        n.add("Joins sent")
        return s

    def answered(s, data):
        env = envelopes(pb, data)
        for e in env:
            n.add(f"Joins answered {status_name(e.status)}")
        return not env  # once answered, a new Join takes its place

    joins = Pool(300, 20, join, n, "parked-Join connections")
    while not stop.is_set():
        joins.reap(answered)
        joins.top_up()
        stop.wait(0.1)
    joins.close()


def envelopes(pb, data):
    """The whole envelopes at the start of `data` (replies are small)."""
    out = []
    while len(data) >= 4:
        (size,) = struct.unpack(">I", data[:4])
        if len(data) < 4 + size:
            break
        out.append(pb.Envelope.FromString(data[4:4 + size]))
        data = data[4 + size:]
    return out


def abuse_blobs(ctx, stop, n, jobs=32, keys=1024):
    """One-rank jobs, each publishing 16 KiB blobs (a job holds 1,024 at
    most) and heartbeating so that its generation, and its blobs, stay."""
    pb, value = ctx.pb, os.urandom(16 * 1024)
    members, seq = [], [0]

    def call(m, method, msg):
        m["id"] += 1
        env = pb.Envelope(method=PREFIX + method, request_id=m["id"], token=m["token"],
                          session=m.get("session", ""), body=msg.SerializeToString())
        data = env.SerializeToString()
        m["sock"].sendall(struct.pack(">I", len(data)) + data)
        return limits.recv_envelope(pb, m["sock"])

    def new_member():
        seq[0] += 1
        name = f"blob-{os.getpid()}-{seq[0]}"
        m = {"job": name, "token": ctx.job_token(name), "id": 0, "key": 0, "beat": 0.0}
        m["sock"] = ctx.connect(timeout=10)
        r = call(m, "Join", pb.JoinRequest(job=name, world_size=1, node="b", local_rank=0,
                                           device="cpu"))
        n.add(f"Joins answered {status_name(r.status)}")
        if r.status != 0:
            m["sock"].close()
            return None
        j = pb.JoinResponse.FromString(r.body)
        m.update(session=j.session, generation=j.generation)
        return m

    while not stop.is_set():
        while len(members) < jobs and not stop.is_set():
            try:
                m = new_member()
            except OSError:
                n.add("connections lost")
                m = None
            if not m:
                stop.wait(0.2)
                break
            members.append(m)
        for m in list(members):
            try:
                if time.monotonic() - m["beat"] > 0.5:
                    m["beat"] = time.monotonic()
                    r = call(m, "Heartbeat", pb.HeartbeatRequest(
                        job=m["job"], generation=m["generation"], rank=0, step=1))
                    if r.status:
                        n.add(f"Heartbeats answered {status_name(r.status)}")
                if m["key"] < keys:
                    r = call(m, "Publish", pb.PublishRequest(
                        job=m["job"], generation=m["generation"], key=f"k{m['key']}",
                        value=value))
                    n.add("blobs sent")
                    n.add(f"blobs answered {status_name(r.status)}")
                    if r.status == 0:
                        m["key"] += 1
                        n.add("MiB of blobs accepted", 1 / 64)
            except OSError:
                n.add("connections lost")
                m["sock"].close()
                members.remove(m)
        if all(m["key"] >= keys for m in members):
            stop.wait(0.1)
    for m in members:
        m["sock"].close()
    n["jobs held at the end"] = len(members)


def abuse_jobs(ctx, stop, n):
    """New jobs as fast as one client makes them: a Join with a fresh name,
    then the connection closed (every 50th waits 20 ms for a refusal)."""
    pb, i = ctx.pb, 0
    while not stop.is_set():
        i += 1
        try:
            s = ctx.connect()
            s.sendall(limits.frame(pb, PREFIX + "Join", pb.JoinRequest(
                job=f"flood-{os.getpid()}-{i}", world_size=2, node="f", local_rank=0,
                device="cpu"), token=ctx.token))
            n.add("Joins sent")
            if i % 50 == 0 and select.select([s], [], [], 0.02)[0]:
                for e in envelopes(pb, s.recv(1 << 16)):
                    n.add(f"Joins answered {status_name(e.status)}")
            s.close()
        except OSError as e:
            n.add(f"failed ({type(e).__name__})")
            stop.wait(0.01)


def abuse_logs(ctx, stop, n):
    """Wrong-token requests on both ports, from 127.0.0.1: an RPC call on
    a new connection each (the coordinator closes it), and control POSTs
    on one kept-alive HTTP connection."""
    pb, conn = ctx.pb, None
    wrong = limits.frame(pb, PREFIX + "Heartbeat", pb.HeartbeatRequest(job=JOB, rank=0),
                         token="wrong")
    while not stop.is_set():
        try:
            with ctx.connect() as s:
                s.sendall(wrong)
                n.add("RPC calls sent")
                n.add(f"RPC calls answered {status_name(limits.recv_envelope(pb, s).status)}")
        except OSError as e:
            n.add(f"RPC calls without a reply ({type(e).__name__})")
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", ctx.http, timeout=5)
            conn.request("POST", f"/jobs/{JOB}/control", body=b'{"action":"stop"}',
                         headers={"Authorization": "Bearer wrong"})
            n.add("HTTP requests sent")
            r = conn.getresponse()
            r.read()
            n.add(f"HTTP requests answered {r.status}")
        except (OSError, http.client.HTTPException) as e:
            n.add(f"HTTP requests without a reply ({type(e).__name__})")
            conn.close()
            conn = None


def abuse_preauth(ctx, stop, n):
    """A wrong job-looking token on a 131,072-entry pack list for the job
    being trained, a new connection each: refused on the job name, before
    the list is decoded."""
    pb = ctx.pb
    big = limits.million_entry_pack_list(pb, entries=131072)
    body = (pb.PublishPackListRequest(job=JOB).SerializeToString() +
            big[len(pb.PublishPackListRequest(job="big").SerializeToString()):])
    took = []
    while not stop.is_set():
        data = limits.frame(pb, PREFIX + "PublishPackList", body=body, token=os.urandom(32).hex())
        t0 = time.monotonic()
        try:
            with ctx.connect() as s:
                s.sendall(data)
                n.add("pack lists sent")
                n.add(f"pack lists answered {status_name(limits.recv_envelope(pb, s).status)}")
            took.append(time.monotonic() - t0)
        except OSError as e:
            n.add(f"pack lists without a reply ({type(e).__name__})")
    if took:
        n["ms each (median)"] = round(statistics.median(took) * 1000, 1)
    n["MiB sent"] = round(n.get("pack lists sent", 0) * len(body) / MiB)


def abuse_stream(ctx, stop, n, conns=8):
    """Clients without the token, each streaming a frame of nearly 4 MiB as
    fast as the coordinator reads it, and another after it (a new
    connection when one is closed): what the pre-authentication rate lets
    them make the coordinator read."""
    size = 4 * MiB - 64
    chunk = b"\x0a" * (256 * 1024)
    socks, left = [], {}

    def open_one():
        s = ctx.connect()
        s.setblocking(False)
        socks.append(s)
        left[s] = 0
        n.add("connections opened")

    while not stop.is_set():
        while len(socks) < conns:
            try:
                open_one()
            except OSError:
                n.add("connections refused")
                break
        _, writable, _ = select.select([], socks, [], 0.1)
        for s in writable:
            try:
                if left[s] == 0:
                    s.send(struct.pack(">I", size))
                    left[s] = size
                sent = s.send(chunk[:min(len(chunk), left[s])])
                left[s] -= sent
                n.add("MiB sent", sent / MiB)
            except OSError:
                n.add("connections closed by the coordinator")
                socks.remove(s)
                del left[s]
                s.close()
    for s in socks:
        s.close()


def send_unread(ctx, n, socks, conns, requests, count, what):
    """One round of HTTP clients that never read: `socks` topped up to
    `conns` connections, then `requests` (`count` of them) sent on each,
    counted as `what`; those the coordinator closed are dropped."""
    while len(socks) < conns:
        try:
            s = limits.small_socket(ctx.http)
            s.setblocking(False)
            socks.append(s)
            n.add("connections opened")
        except OSError:
            n.add("connections refused")
            break
    for s in list(socks):
        try:
            s.send(requests)
            n.add(what, count)
        except BlockingIOError:
            n.add("sends pushed back")
        except OSError:
            n.add("connections closed by the coordinator")
            socks.remove(s)
            s.close()


def abuse_httpnoread(ctx, stop, n, conns=100):
    """HTTP clients without the token pipelining GET /ui/app.js and never
    reading a reply, reopened when the coordinator closes them (at its
    idle timeout or the memory budget)."""
    get = b"GET /ui/app.js HTTP/1.1\r\nHost: gradsync\r\n\r\n" * 64
    socks = []
    while not stop.is_set():
        send_unread(ctx, n, socks, conns, get, 64, "requests sent")
        stop.wait(0.05)
    for s in socks:
        s.close()


class SlotAgent:
    """A connection speaking as a node agent: calls on slots 1..255, each
    slot a rank of its own, with the job's token."""

    def __init__(self, ctx, job, token):
        self.ctx, self.pb, self.job, self.token = ctx, ctx.pb, job, token
        self.sock = ctx.connect(timeout=30)
        self.ids = 0
        self.sessions = {}

    def send(self, slot, method, msg, token=None, session=""):
        self.ids += 1
        env = self.pb.Envelope(method=PREFIX + method, request_id=self.ids, slot=slot,
                               token=self.token if token is None else token, session=session,
                               body=msg.SerializeToString())
        data = env.SerializeToString()
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def recv(self):
        return limits.recv_envelope(self.pb, self.sock)

    def join_all(self, world, first_slot=1):
        """Joins `world` ranks on slots first_slot.. and waits for their
        replies: {slot: JoinResponse}."""
        for i in range(world):
            self.send(first_slot + i, "Join", self.pb.JoinRequest(
                job=self.job, world_size=world, node=f"s{i // 8}", local_rank=i % 8,
                device="cpu"))
        joined = {}
        while len(joined) < world:
            r = self.recv()
            if r.status:
                raise RuntimeError(f"Join on slot {r.slot}: {status_name(r.status)} {r.message}")
            joined[r.slot] = self.pb.JoinResponse.FromString(r.body)
        self.sessions = {s: j.session for s, j in joined.items()}
        return joined

    def beat_all(self, joined):
        for slot, j in joined.items():
            self.send(slot, "Heartbeat", self.pb.HeartbeatRequest(
                job=self.job, generation=j.generation, rank=j.rank, step=1),
                session=self.sessions[slot])


def abuse_trace(ctx, stop, n, world=128, getters=20):
    """A job token's holder playing all 128 ranks of a job on one
    connection's slots, each publishing a trace of 800 spans, then GET
    /jobs/NAME/trace pipelined on 20 connections that never read, and on
    one that does: the merged trace (about 10 MB) is rendered once and
    each reply counted in --max-memory."""
    pb = ctx.pb
    job = f"trace-{os.getpid()}"
    token = ctx.job_token(job)
    agent = SlotAgent(ctx, job, token)
    joined = agent.join_all(world)
    hdrs = {"Authorization": f"Bearer {token}"}
    conn = http.client.HTTPConnection("127.0.0.1", ctx.http, timeout=30)
    conn.request("POST", f"/jobs/{job}/trace?steps=100", headers=hdrs)
    r = conn.getresponse()
    seq = int(re.search(rb'"trace_seq":(\d+)', r.read()).group(1))
    for slot, j in joined.items():
        t = pb.Trace(seq=seq, rank=j.rank, origin_us=1000)
        for i in range(800):
            t.events.add(phase=2, step=i // 8 + 1, start_us=i * 100, dur_us=90)
        agent.send(slot, "Publish", pb.PublishRequest(
            job=job, generation=j.generation, key=f"trace.{seq}.{j.rank}",
            value=t.SerializeToString()), session=agent.sessions[slot])
    for _ in joined:
        r = agent.recv()
        n.add(f"traces published {status_name(r.status)}")
    get = (f"GET /jobs/{job}/trace HTTP/1.1\r\nHost: gradsync\r\n"
           f"Authorization: Bearer {token}\r\n\r\n").encode() * 8
    socks, beat = [], 0.0
    agent.sock.setblocking(False)
    while not stop.is_set():
        if time.monotonic() - beat > 1:
            beat = time.monotonic()
            try:
                agent.beat_all(joined)
                while agent.sock.recv(1 << 16):  # the beats' replies, dropped
                    pass
            except BlockingIOError:
                pass
        send_unread(ctx, n, socks, getters, get, 8, "GETs sent unread")
        try:
            t0 = time.monotonic()
            conn.request("GET", f"/jobs/{job}/trace", headers=hdrs)
            r = conn.getresponse()
            body = r.read()
            n.add(f"GETs read {r.status}")
            n["MB a trace"] = round(len(body) / 1e6, 1)
            n["last GET read s"] = round(time.monotonic() - t0, 2)
        except (OSError, http.client.HTTPException) as e:
            n.add(f"GETs failed ({type(e).__name__})")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", ctx.http, timeout=30)
        stop.wait(0.05)
    for s in socks:
        s.close()


def abuse_slotjoins(ctx, stop, n, conns=40):
    """Connections parking a Join on each of a node agent's 255 slots (a
    job of world 400 per connection, which never fills), reopened as they
    are closed; the refusals past the members' part of --max-memory are
    counted."""
    pb, seq = ctx.pb, [0]

    def park():
        seq[0] += 1
        job = f"slotpark-{os.getpid()}-{seq[0]}"
        s = ctx.connect()
        s.sendall(b"".join(limits.frame(pb, PREFIX + "Join", pb.JoinRequest(
            job=job, world_size=400, node=f"n{slot}", local_rank=0, device="cpu"),
            token=ctx.job_token(job), request_id=slot, slot=slot) for slot in range(1, 256)))
        n.add("Joins sent", 255)
        return s

    def answered(s, data):
        for e in envelopes(pb, data):
            n.add(f"Joins answered {status_name(e.status)}")
        return True

    pool = Pool(conns, 5, park, n, "slot-Join connections")
    while not stop.is_set():
        pool.reap(answered)
        pool.top_up()
        stop.wait(0.1)
    pool.close()


def abuse_jobcap(ctx, stop, n):
    """Short jobs as fast as one client runs them: a one-rank job of a new
    name joins and leaves finished, over and over; they fill --max-jobs
    with jobs at rest, each kept for its status."""
    pb, i = ctx.pb, 0
    s = None
    while not stop.is_set():
        i += 1
        job = f"short-{os.getpid()}-{i}"
        try:
            s = s or ctx.connect()
            r = limits.rpc(pb, s, "Join", pb.JoinRequest(job=job, world_size=1, node="j",
                                                          local_rank=0, device="cpu"),
                           ctx.token, 1)
            n.add(f"Joins answered {status_name(r.status)}")
            if r.status:
                stop.wait(0.05)
                continue
            j = pb.JoinResponse.FromString(r.body)
            r = limits.rpc(pb, s, "Leave", pb.LeaveRequest(job=job, generation=j.generation,
                                                            rank=0, finished=True),
                           ctx.token, 2, session=j.session)
            n.add(f"Leaves answered {status_name(r.status)}")
        except OSError as e:
            n.add(f"failed ({type(e).__name__})")
            if s:
                s.close()
            s = None
            stop.wait(0.01)


def abuse_slottoken(ctx, stop, n, world=4):
    """A node agent's connection carrying 4 ranks of its job (heartbeating
    every 0.5 s) and, on a fifth slot, a call with a wrong token every
    0.1 s: the wrong ones are refused on their slot, and the connection,
    with its 4 ranks, must never be closed."""
    pb = ctx.pb
    job = f"node-{os.getpid()}"
    agent = SlotAgent(ctx, job, ctx.job_token(job))
    joined = agent.join_all(world)
    beat = 0.0
    agent.sock.setblocking(False)
    buf = b""
    while not stop.is_set():
        try:
            if time.monotonic() - beat > 0.5:
                beat = time.monotonic()
                agent.beat_all(joined)
            agent.send(world + 1, "Heartbeat", pb.HeartbeatRequest(job=job, generation=1, rank=0),
                       token="wrong")
            n.add("wrong-token calls sent")
            while True:
                data = agent.sock.recv(1 << 16)
                if not data:
                    n.add("NODE DROPPED: the connection was closed")
                    return
                buf += data
        except BlockingIOError:
            pass
        except OSError as e:
            n.add(f"NODE DROPPED ({type(e).__name__})")
            return
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            size = struct.unpack(">I", buf[:4])[0]
            e = pb.Envelope.FromString(buf[4:4 + size])
            buf = buf[4 + size:]
            who = "wrong-token slot" if e.slot == world + 1 else "ranks' slots"
            n.add(f"{who} answered {status_name(e.status)}")
        stop.wait(0.1)
    agent.sock.close()


def run_abuser(name, ctx, stop, out, nice):
    """An abuser's process: runs until `stop`, then hands its counts back."""
    os.nice(nice)
    n = Counts()
    try:
        globals()["abuse_" + name](ctx, stop, n)
    except Exception as e:  # noqa: BLE001  (reported, not fatal: the soak goes on)
        n["error"] = repr(e)
    out.put((name, dict(n)))


def sample_healthz(port, stop, out, nice):
    """GET /healthz on a new connection every 50 ms until `stop`: the
    latencies in seconds, and what went wrong instead."""
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    lat, errors = [], []
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            r.read()
            conn.close()
            if r.status == 200:
                lat.append(time.monotonic() - t0)
            else:
                errors.append(f"HTTP {r.status}")
        except (OSError, http.client.HTTPException) as e:
            errors.append(repr(e))
        stop.wait(max(0.0, HEALTHZ_EVERY - (time.monotonic() - t0)))
    out.put(("healthz", (lat, errors)))


def percentile(values, p):
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)] if s else float("nan")


def job_token_maker(coord_bin, token):
    """Job tokens as the coordinator derives them (docs/guide/security.md:
    an HMAC-SHA256 of the name under its token), checked once against
    `gradsync-coordinator token --job`."""
    def make(name):
        msg = b"gradsync job token v1:" + name.encode()
        return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()

    got = subprocess.run([coord_bin, "token", "--job", "parked"], capture_output=True, text=True,
                         env=dict(os.environ, GRADSYNC_TOKEN=token), check=True).stdout.strip()
    if got != make("parked"):
        raise SystemExit(f"job tokens are derived otherwise now: {got} from the coordinator")
    return make


def clean_env():
    """This environment without the GRADSYNC_ variables a caller may have set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}


class Run:
    """One coordinator and the training job against it, with the /healthz
    sampler and, for the abuse run, the abusers."""

    def __init__(self, args, pb, token, make_job_token, abusers):
        self.args, self.pb, self.abusers = args, pb, abusers
        self.token = token
        env = dict(clean_env(), GRADSYNC_TOKEN=token)
        self.c = limits.Coordinator(os.path.join(args.bin, "gradsync-coordinator"),
                                    "--max-memory", args.max_memory_text, "--max-jobs",
                                    str(args.max_jobs), nofile=args.nofile, env=env)
        self.ctx = Ctx(pb, self.c, token, make_job_token)
        self.dir = tempfile.TemporaryDirectory(prefix="gs-soak-")
        self.rss_max = 0

    def agents(self):
        env = dict(clean_env(), GRADSYNC_TOKEN=self.token, OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        procs = []
        for i in range(2):
            log = open(os.path.join(self.dir.name, f"agent{i}.log"), "w+")
            procs.append((subprocess.Popen(
                [os.path.join(self.args.bin, "gradsync-agent"), "--coordinator",
                 f"127.0.0.1:{self.c.rpc_port}", "--job", JOB, "--world-size", "2",
                 "--local-rank", str(i), "--node", "n", "--epochs", str(self.args.epochs),
                 *TRAIN, "--data", self.args.data],
                stdout=log, stderr=subprocess.STDOUT, env=env), log))
        return procs

    def watch_rss(self, stop):
        while not stop.wait(HEALTHZ_EVERY):
            try:
                self.rss_max = max(self.rss_max, limits.proc_kib(self.c.proc.pid, "VmRSS"))
            except (OSError, RuntimeError):
                return

    def go(self):
        """Runs the job (beside the abusers); returns what it measured."""
        mpc = mp.get_context("fork")
        stop, out = mpc.Event(), mpc.Queue()
        os.setpriority(os.PRIO_PROCESS, self.c.proc.pid, self.args.coordinator_nice)
        procs = [mpc.Process(target=sample_healthz,
                             args=(self.c.http_port, stop, out, self.args.coordinator_nice))]
        procs += [mpc.Process(target=run_abuser, args=(a, self.ctx, stop, out, self.args.nice))
                  for a in self.abusers]
        rss_stop = threading.Event()
        rss = threading.Thread(target=self.watch_rss, args=(rss_stop,))
        res = {"run": "with abusers" if self.abusers else "baseline"}
        agents = []
        try:
            res["rss_start_kib"] = limits.proc_kib(self.c.proc.pid, "VmRSS")
            rss.start()
            for p in procs:
                p.start()
            if self.abusers:
                time.sleep(self.args.warmup)  # the abuse in full swing before the job starts
            t0 = time.monotonic()
            agents = self.agents()
            deadline = t0 + self.args.max_abuse
            while time.monotonic() < deadline and any(a.poll() is None for a, _ in agents):
                time.sleep(0.1)
            res["abused_s"] = time.monotonic() - t0 if self.abusers else 0.0
            res["metrics"] = self.metrics()
            stop.set()
            got = dict(out.get(timeout=60) for _ in procs)
            for p in procs:
                p.join(30)
            res["codes"] = []
            for a, _ in agents:
                try:
                    res["codes"].append(a.wait(self.args.job_timeout))
                except subprocess.TimeoutExpired:
                    a.kill()
                    res["codes"].append(f"still running after {self.args.job_timeout} s")
            res["job_s"] = time.monotonic() - t0
            res["healthz"], res["abusers"] = got.pop("healthz"), got
            res["accuracy"] = self.accuracy(agents)
            res["hwm_kib"] = limits.proc_kib(self.c.proc.pid, "VmHWM")
            res["rss_max_kib"] = self.rss_max
            res["rss_after_kib"] = self.rss_after(res["rss_start_kib"])
            res["agent_tail"] = "".join(self.tail(log) for _, log in agents)
        finally:
            stop.set()
            rss_stop.set()
            for p in procs:
                if p.is_alive():
                    p.kill()
            rss.join()
            for a, f in agents:
                if a.poll() is None:
                    a.kill()
                    a.wait()
                f.close()
            log = self.c.text().splitlines()
            res["log_lines"] = len(log)
            res["log_warn"] = sum(1 for line in log if " WARN " in line)
            res["log_kinds"] = log_kinds(log)
            if self.args.keep_logs:
                os.makedirs(self.args.keep_logs, exist_ok=True)
                with open(os.path.join(self.args.keep_logs, f"coordinator-{res['run'][:4]}.log"),
                          "w") as f:
                    f.write("\n".join(log) + "\n")
            self.c.close()
            self.dir.cleanup()
        return res

    def rss_after(self, start_kib):
        """The coordinator's RSS once what the abusers held is freed: back
        within RSS_BACK of its start, or where it stood after RSS_SETTLE_S."""
        deadline = time.monotonic() + RSS_SETTLE_S
        while True:
            rss = limits.proc_kib(self.c.proc.pid, "VmRSS")
            if rss - start_kib <= RSS_BACK / 1024 or time.monotonic() > deadline:
                return rss
            time.sleep(0.2)

    def metrics(self):
        try:
            m = limits.metrics(self.c)
        except (OSError, http.client.HTTPException):
            return {}
        return {k: v for k, v in m.items() if k.startswith((
            "gradsync_rpc_memory_bytes", "gradsync_rpc_unauthenticated",
            "gradsync_jobs", "gradsync_rpc_connections", "gradsync_http_connections"))}

    @staticmethod
    def tail(log):
        log.flush()
        log.seek(0)
        return "".join(log.read().splitlines(True)[-3:])

    @staticmethod
    def accuracy(agents):
        for _, log in agents:
            log.seek(0)
            m = FINAL_RE.search(log.read())
            if m:
                return float(m.group(1))
        return None


def log_kinds(lines, top=8):
    """The commonest kinds of line (level and words, numbers and
    addresses dropped), commonest first, with their counts."""
    kinds = {}
    for line in lines:
        words = line.split(" ", 4)
        text = " ".join(words[1:2] + words[4:5])
        text = re.sub(r"\S*\d\S*", "#", text)[:90]
        kinds[text] = kinds.get(text, 0) + 1
    return sorted(kinds.items(), key=lambda kv: -kv[1])[:top]


def report(args, runs):
    """Prints the tables; returns the promises that failed."""
    failed, notes = [], []
    print("| run | exit codes | test accuracy | job s | peak RSS (VmHWM) | max RSS sampled "
          "| RSS at start, after | /healthz p50 / p99 / max ms (n) | unanswered "
          "| log lines (WARN) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        lat, errors = r["healthz"]
        ms = [x * 1000 for x in lat]
        print(f"| {r['run']} | {r['codes']} | {r['accuracy']} | {r['job_s']:.1f} "
              f"| {r['hwm_kib'] / 1024:.1f} MiB | {r['rss_max_kib'] / 1024:.1f} MiB "
              f"| {r['rss_start_kib'] / 1024:.1f}, {r['rss_after_kib'] / 1024:.1f} MiB "
              f"| {percentile(ms, 50):.1f} / {percentile(ms, 99):.1f} / "
              f"{max(ms, default=float('nan')):.1f} ({len(ms)}) | {len(errors)} "
              f"| {r['log_lines']} ({r['log_warn']}) |")
        if any(c != 0 for c in r["codes"]) or r["accuracy"] is None:
            failed.append(f"{r['run']}: the job did not finish: {r['codes']}\n{r['agent_tail']}")
        if r["hwm_kib"] * 1024 > args.max_memory:
            failed.append(f"{r['run']}: peak RSS {r['hwm_kib'] / 1024:.1f} MiB above "
                          f"--max-memory {args.max_memory_text}")
        if errors:
            failed.append(f"{r['run']}: {len(errors)} /healthz unanswered, e.g. {errors[:3]}")
        if (r["rss_after_kib"] - r["rss_start_kib"]) * 1024 > RSS_BACK:
            failed.append(f"{r['run']}: RSS {r['rss_after_kib'] / 1024:.1f} MiB {RSS_SETTLE_S} s "
                          f"after the abuse, more than {RSS_BACK / MiB:.0f} MiB above its "
                          f"{r['rss_start_kib'] / 1024:.1f} MiB at the start")
        dropped = [k for c in r["abusers"].values() for k in c if k.startswith("NODE DROPPED")]
        if dropped:
            failed.append(f"{r['run']}: a node agent's connection was closed for one slot's "
                          f"wrong token ({dropped})")
        slow = not ms or percentile(ms, 99) >= HEALTHZ_P99_MS
        if slow and r["abusers"]:
            failed.append(f"{r['run']}: /healthz p99 {percentile(ms, 99):.1f} ms, "
                          f"bound {HEALTHZ_P99_MS} ms")
        elif slow:  # the bound is the abused run's; this one says how busy the machine is
            notes.append(f"{r['run']}: /healthz p99 {percentile(ms, 99):.1f} ms without abusers: "
                         "the machine is too busy for the bound to say much")
    base, abused = runs[0], runs[-1]
    if len(runs) == 2 and base["accuracy"] is not None and abused["accuracy"] is not None:
        delta = abused["accuracy"] - base["accuracy"]
        print(f"\naccuracy with abusers {abused['accuracy']:.4f}, without "
              f"{base['accuracy']:.4f}: {delta:+.4f} (tolerance {args.tolerance}); the abusers "
              f"ran {abused['abused_s']:.1f} s, from {args.warmup:.0f} s before the job's start "
              f"to {'its end' if abused['abused_s'] < args.max_abuse else '--max-abuse'}")
        if abs(delta) > args.tolerance:
            failed.append(f"accuracy {delta:+.4f} from the baseline's")
    print("\n| abuser | what it sent and saw |\n|---|---|")
    for name, counts in abused["abusers"].items():
        text = "; ".join(f"{k} {v:,.0f}" if isinstance(v, (int, float)) and v == int(v)
                         else f"{k} {v}" for k, v in counts.items())
        print(f"| {name} | {text} |")
    if abused["metrics"]:
        print("\nthe coordinator's /metrics as the job ended:")
        for k, v in abused["metrics"].items():
            print(f"  {k} {v:,.0f}")
    secs = abused["job_s"] + (args.warmup if abused["abusers"] else 0)
    print(f"\nthe coordinator logged {abused['log_lines']:,} lines in about {secs:.0f} s "
          f"({abused['log_lines'] / secs:,.0f} a second), {abused['log_warn']} of them WARN; "
          "the commonest (numbers and addresses as #):")
    for text, count in abused["log_kinds"]:
        print(f"  {count:6,}  {text}")
    for note in notes:
        print(f"\nnote: {note}")
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the build's bin folder")
    ap.add_argument("--max-memory", default="256MiB", help="the coordinator's --max-memory")
    ap.add_argument("--nofile", type=int, default=1024, help="the coordinator's open-file limit")
    ap.add_argument("--max-jobs", type=int, default=2000,
                    help="the coordinator's --max-jobs (the jobcap abuser fills it)")
    ap.add_argument("--epochs", type=int, default=10,
                    help="the job's epochs (10: about 1 s alone on 2 cores, 5 s beside the "
                         "abusers; at 2 the abuse lasted under 2 s)")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--abusers", default=",".join(ABUSERS))
    ap.add_argument("--max-abuse", type=float, default=240,
                    help="seconds the abusers run at most (the job may go on after)")
    ap.add_argument("--warmup", type=float, default=2, help="seconds of abuse before the job")
    ap.add_argument("--job-timeout", type=float, default=600)
    ap.add_argument("--tolerance", type=float, default=0.002,
                    help="accuracy difference from the baseline allowed")
    ap.add_argument("--nice", type=int, default=0, help="the abusers' nice increment")
    ap.add_argument("--coordinator-nice", type=int, default=-10 if os.geteuid() == 0 else 0,
                    help="the coordinator's and the /healthz sampler's nice value (as root: "
                    "-10, so that they are not queued behind the ranks and abusers on a small "
                    "machine, as on a host of their own)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--keep-logs", metavar="DIR", help="write the coordinator's logs there")
    args = ap.parse_args()
    abusers = subset(ap, "--abusers", args.abusers, ABUSERS)
    args.max_memory_text, args.max_memory = args.max_memory, parse_size(args.max_memory)
    args.bin = os.path.abspath(args.bin)
    limits.raise_own_nofile(16384)
    pb = load_proto(os.path.join(HERE, "..", "proto"))
    token = os.urandom(16).hex()
    make = job_token_maker(os.path.join(args.bin, "gradsync-coordinator"), token)
    print(f"coordinator: --max-memory {args.max_memory_text}, open-file limit {args.nofile}; "
          f"job: 2 ranks {' '.join(TRAIN)} --epochs {args.epochs}; abusers: {','.join(abusers)} "
          f"(nice +{args.nice}); the coordinator and the /healthz sampler at nice "
          f"{args.coordinator_nice}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start",
          flush=True)
    runs = [] if args.no_baseline else [Run(args, pb, token, make, []).go()]
    runs.append(Run(args, pb, token, make, abusers).go())
    print(f"load {os.getloadavg()[0]:.1f} at the end\n")
    failed = report(args, runs)
    print("\n" + ("FAILED:\n  " + "\n  ".join(failed) if failed else
                  "PASS: the job finished alike, RSS stayed under --max-memory, /healthz "
                  f"p99 under {HEALTHZ_P99_MS} ms"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
