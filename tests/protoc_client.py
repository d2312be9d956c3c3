#!/usr/bin/env python3
"""A gradsync client written from proto/README.md alone, with classes that
stock protoc generates from proto/gradsync.proto. It starts the coordinator,
rendezvouses four fake ranks, heartbeats, reads /status and leaves.

usage: protoc_client.py COORDINATOR_BINARY PROTO_DIR
"""
import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testlib import WAIT  # noqa: E402

PREFIX = "/gradsync.Coordinator/"


def load_proto(proto_dir):
    """The module stock protoc generates from gradsync.proto, made in a
    temporary folder that is gone once it is loaded."""
    with tempfile.TemporaryDirectory(prefix="gs-protoc-") as out:
        subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={out}",
                        os.path.join(proto_dir, "gradsync.proto")], check=True)
        spec = importlib.util.spec_from_file_location("gradsync_pb2",
                                                      os.path.join(out, "gradsync_pb2.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["gradsync_pb2"] = module
        spec.loader.exec_module(module)
    return module


class Client:
    def __init__(self, pb, port):
        self.pb = pb
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.next_id = 1
        self.session = ""  # JoinResponse.session: sent with every later call

    def send(self, method, msg):
        env = self.pb.Envelope(method=PREFIX + method, request_id=self.next_id,
                               body=msg.SerializeToString(), session=self.session)
        self.next_id += 1
        data = env.SerializeToString()
        self.sock.sendall(struct.pack(">I", len(data)) + data)
        return env.request_id

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("coordinator closed the connection")
            buf += chunk
        return buf

    def recv_envelope(self):
        (n,) = struct.unpack(">I", self.recv_exact(4))
        return self.pb.Envelope.FromString(self.recv_exact(n))

    def recv(self, response_type):
        env = self.recv_envelope()
        if env.status != 0:
            raise RuntimeError(f"{env.method}: status {env.status}: {env.message}")
        return env, response_type.FromString(env.body)


def main():
    binary, proto_dir = sys.argv[1], sys.argv[2]
    pb = load_proto(proto_dir)
    coord = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = coord.stdout.readline().split()
        rpc_port = int(line[2].rsplit(":", 1)[1])
        http_port = int(line[3].rsplit(":", 1)[1])
        sig = pb.ModelSignature(param_count=6, total_elements=1000, shapes_hash=1, dtypes_hash=2)
        clients = [Client(pb, rpc_port) for _ in range(4)]
        # Join from nodes b, b, a, a: ranks follow (node, local_rank), not arrival.
        claims = [("b", 1), ("b", 0), ("a", 1), ("a", 0)]
        for c, (node, lr) in zip(clients, claims):
            c.send("Join", pb.JoinRequest(job="py", world_size=4, node=node, local_rank=lr,
                                          device="cpu", model_signature=sig,
                                          comm_addr=f"{node}:{7000 + lr}"))
        joined = [c.recv(pb.JoinResponse) for c in clients]
        # Replies carry the method of their request.
        assert all(env.method == PREFIX + "Join" for env, _ in joined), joined
        replies = [r for _, r in joined]
        for c, r in zip(clients, replies):
            assert r.session.startswith(f"{r.rank}.") and len(r.session) == len(str(r.rank)) + 33
            c.session = r.session
        ranks = [r.rank for r in replies]
        assert ranks == [3, 2, 1, 0], ranks
        for r in replies:
            assert r.world_size == 4 and r.generation == 1, r
            assert [p.comm_addr for p in r.peers] == ["a:7000", "a:7001", "b:7000", "b:7001"]
        for c, r in zip(clients, replies):
            c.send("Heartbeat", pb.HeartbeatRequest(job="py", generation=1, rank=r.rank,
                                                    step=10, loss=0.5, samples_per_sec=100))
            _, hb = c.recv(pb.HeartbeatResponse)
            assert not hb.abort, hb
        # An unknown method is UNIMPLEMENTED, and its reply names it too.
        rid = clients[0].send("Dance", pb.LeaveRequest())
        env = clients[0].recv_envelope()
        assert (env.status, env.request_id, env.method) == (12, rid, PREFIX + "Dance"), env
        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status",
                                                  timeout=WAIT))
        job = status["jobs"][0]
        assert job["name"] == "py" and job["state"] == "running", job
        assert job["rank_summary"]["running"] == 4 and job["rank_summary"]["step_max"] == 10, job
        status = json.load(
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status?ranks=1", timeout=WAIT))
        job = status["jobs"][0]
        assert [r["step"] for r in job["ranks"]] == [10] * 4, job
        for c, r in zip(clients, replies):
            c.send("Leave", pb.LeaveRequest(job="py", generation=1, rank=r.rank, finished=True))
            c.recv(pb.LeaveResponse)
        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/jobs/py",
                                                  timeout=WAIT))
        assert status["state"] == "finished", status
        print("protoc client: 4 ranks joined, heartbeated and left: ok")
    finally:
        coord.terminate()
        rc = coord.wait(timeout=WAIT)
    if rc != 0:
        sys.exit(f"coordinator exited with {rc}")


if __name__ == "__main__":
    main()
