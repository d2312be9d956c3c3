#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/NAME/):
a few valid inputs each, in the formats the harnesses' comments describe.
Run it again after changing a format; the files are committed.

    /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import gzip
import os
import shutil
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["Join", "Publish", "Fetch", "PublishPackList", "FetchPackList", "Heartbeat", "Leave",
           "Batch", "NodeHeartbeat"]


# Protobuf wire format, enough for our messages.
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, value):
    """A field: int -> varint, bytes/str -> length-delimited, float -> fixed32."""
    if isinstance(value, bool) or isinstance(value, int):
        return varint(num << 3) + varint(int(value))
    if isinstance(value, float):
        return varint(num << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(field(n, v) for n, v in fields if v is not None)


def join(job="j", world=2, node="n0", local=0, rejoin=0, settings=()):
    sets = [(12, msg((1, k), (2, v))) for k, v in settings]
    return msg((1, job), (2, world), (3, node), (4, local), (5, "cpu"), (7, "127.0.0.1:4000"),
               (9, 0), (10, rejoin or None), *sets)


def pack_list(params, sizes, order, threshold=1 << 20):
    ps = [(2, msg((1, name), (2, elements), (3, dtype))) for name, elements, dtype in params]
    return msg((1, threshold), *ps, (3, b"".join(varint(s) for s in sizes)),
               (4, b"".join(varint(o) for o in order)))


def node_beats(job, beats, sessions=()):
    """A NodeHeartbeatRequest: beats are (slot, rank, generation, step,
    news_seen); its columns packed fixed-width, has_progress packed bools."""
    def col(num, fmt, values):
        return field(num, b"".join(struct.pack("<" + fmt, v) for v in values))

    cols = list(zip(*beats))
    n = len(beats)
    return b"".join([field(1, job), col(2, "I", cols[0]), col(3, "I", cols[1]),
                     col(4, "Q", cols[2]), col(5, "Q", cols[3]), col(6, "f", [1.5] * n),
                     col(7, "f", [100.0] * n), col(8, "f", [9.0] * n), col(9, "f", [1.0] * n),
                     field(10, bytes([1] * n)), col(11, "I", [3] * n), col(12, "I", [0] * n),
                     col(13, "I", [700] * n), col(14, "Q", cols[3]), col(15, "f", [0.0] * n),
                     col(16, "Q", cols[4])]
                    + [field(17, msg((1, slot), (2, sess))) for slot, sess in sessions])


REQUESTS = {
    "Join": [join(), join(job="solo", world=1, settings=[("lr", "0.1"), ("seed", "7")]),
             join(rejoin=3)],
    "Publish": [msg((1, "j"), (2, 1), (3, "nccl-id"), (4, b"\x01\x02\x03")),
                msg((1, "j"), (2, 1), (3, "empty"))],
    "Fetch": [msg((1, "j"), (2, 1), (3, "nccl-id"))],
    "PublishPackList": [
        msg((1, "j"), (2, 1), (3, 0),
            (4, pack_list([("w1", 12, 0), ("b1", 3, 0), ("w2", 6, 0)], [2, 1], [0, 1, 2]))),
        msg((1, "j"), (2, 1), (3, 0), (4, pack_list([], [], []))),
    ],
    "FetchPackList": [msg((1, "j"), (2, 1))],
    "Heartbeat": [msg((1, "j"), (2, 1), (3, 1), (4, 10), (5, 0.5), (6, 100.0)),
                  msg((1, "j"))],
    "Leave": [msg((1, "j"), (2, 1), (3, 0), (4, True)),
              msg((1, "j"), (2, 1), (3, 1), (4, False), (5, "crashed"))],
}


def envelope(method, body, request_id=1, token="", timeout_ms=0):
    return msg((1, "/gradsync.Coordinator/" + method), (2, request_id), (5, body),
               (6, timeout_ms or None), (7, token or None))


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def record(op, peer, data):
    return bytes([op, peer]) + struct.pack(">H", len(data)) + data


def corpus_frame():
    out = {}
    for i, (method, bodies) in enumerate(REQUESTS.items()):
        out[f"{method.lower()}"] = frame(envelope(method, bodies[0], i + 1, token="t0ken"))
    out["two-frames"] = frame(envelope("Fetch", REQUESTS["Fetch"][0])) * 2
    out["unknown-method"] = frame(envelope("Nope", b""))
    out["empty-envelope"] = frame(b"")
    out["partial"] = frame(envelope("Join", join()))[:-3]
    return out


def corpus_messages():
    out = {}
    for method, bodies in REQUESTS.items():
        for i, body in enumerate(bodies):
            out[f"{method.lower()}-{i}"] = bytes([METHODS.index(method)]) + body
    out["empty-join"] = bytes([0])
    out["nodeheartbeat-0"] = bytes([METHODS.index("NodeHeartbeat")]) + node_beats(
        "j", [(1, 0, 1, 5, 0), (2, 1, 1, 5, 2)], [(1, "0." + "ab" * 16)])
    return out


def corpus_dispatch():
    """Whole exchanges: two ranks join, publish and fetch, beat, leave."""
    def call(peer, method, body, rid, timeout=0):
        return record(0, peer, envelope(method, body, rid, timeout_ms=timeout))

    def tick(ms):
        return record(2, 0, struct.pack(">I", ms))

    hb = lambda rank, step: msg((1, "j"), (2, 1), (3, rank), (4, step))
    train = (call(0, "Join", join(node="n0"), 1) + call(1, "Join", join(node="n1", local=1), 2)
             + call(0, "PublishPackList", REQUESTS["PublishPackList"][0][0:0]
                    + msg((1, "j"), (2, 1), (3, 0),
                          (4, pack_list([("w", 4, 0), ("b", 2, 0)], [2], [0, 1]))), 3)
             + call(1, "FetchPackList", msg((1, "j"), (2, 1)), 4)
             + call(0, "Publish", REQUESTS["Publish"][0], 5)
             + call(1, "Fetch", REQUESTS["Fetch"][0], 6)
             + tick(500) + call(0, "Heartbeat", hb(0, 1), 7) + call(1, "Heartbeat", hb(1, 1), 8)
             + record(3, 0, bytes([3, 1]) + b"j")
             + call(0, "Leave", msg((1, "j"), (2, 1), (3, 0), (4, True)), 9)
             + call(1, "Leave", msg((1, "j"), (2, 1), (3, 1), (4, True)), 10))
    lost = (call(0, "Join", join(node="n0"), 1) + call(1, "Join", join(node="n1", local=1), 2)
            + call(1, "Fetch", REQUESTS["Fetch"][0], 3, timeout=2000)
            + record(1, 0, b"") + tick(11000) + call(1, "Heartbeat", hb(1, 2), 4)
            + call(2, "Join", join(node="n0", rejoin=1), 5) + tick(70000))
    waiting = (call(0, "Join", join(world=3), 1) + record(1, 0, b"") + tick(61000)
               + call(3, "Join", join(job="solo", world=1), 2) + tick(1000))
    # Node beats on the joined ranks' peers (slot % 8), then news, then
    # beats holding the news, then one without a session (slot 129 % 8).
    node = (call(0, "Join", join(node="n0"), 1) + call(1, "Join", join(node="n1", local=1), 2)
            + tick(500) + call(2, "NodeHeartbeat", node_beats("j", [(0, 0, 1, 1, 0),
                                                                    (1, 1, 1, 1, 0)]), 7)
            + record(3, 0, bytes([3, 1]) + b"j")
            + call(2, "NodeHeartbeat", node_beats("j", [(0, 0, 1, 2, 2), (1, 1, 1, 2, 2)]), 8)
            + call(2, "NodeHeartbeat", node_beats("j", [(129, 1, 1, 3, 3)]), 9)
            + tick(11000))
    return {"train": train, "lost-rank": lost, "rendezvous-timeout": waiting, "node-beats": node}


def corpus_http():
    def req(method, target, auth="", body=b""):
        return f"{method}\n{target}\n{auth}\n".encode() + body

    return {
        "healthz": req("GET", "/healthz"),
        "status": req("GET", "/status"),
        "status-ranks": req("GET", "/status?ranks=1"),
        "status-page": req("GET", "/status?limit=1&after=2"),
        "metrics": req("GET", "/metrics"),
        "job": req("GET", "/jobs/a"),
        "no-job": req("GET", "/jobs/zz"),
        "control-period": req("POST", "/jobs/a/control", "Bearer t0ken", b'{"bcast_period": 5}'),
        "control-action": req("POST", "/jobs/a/control", "bearer  t0ken",
                              b'{"action": "checkpoint", "bcast_period": -1}'),
        "control-stop": req("POST", "/jobs/a/control", "Bearer t0ken", b'{"action":"stop"}'),
        "control-no-token": req("POST", "/jobs/a/control", "", b'{"action":"broadcast"}'),
        "wrong-method": req("DELETE", "/status"),
    }


def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def corpus_idx():
    images = idx([2, 3, 3], bytes(range(18)))
    labels = idx([4], bytes([0, 1, 9, 3]))
    return {"images": images, "labels": labels, "images.gz": gzip.compress(images, mtime=0),
            "empty": idx([0], b""), "4d": idx([1, 2, 1, 2], b"\x01\x02\x03\x04")}


def checkpoint(version=2, layout=0x5EED, counts=(3, 2), desc=b"fuzz", step=7, odd=True):
    body = b"GSCKPT\x00\x01" + struct.pack("<IIQQQQ", version, len(counts), step, 1, 42, layout)
    for i, n in enumerate(counts):
        body += struct.pack("<Q", n) + struct.pack(f"<{n}f", *[float(i + j) for j in range(n)])
    if version == 2:
        body += struct.pack("<I", len(desc)) + desc
    return body + struct.pack("<I", zlib.crc32(body)) + b"GSCKEND\x00"


def corpus_checkpoint():
    # The harness fixes the CRC up when the first byte is odd: 'G' (0x47) is.
    return {"v2": checkpoint(), "v1": checkpoint(version=1),
            "other-layout": checkpoint(layout=1, desc=b"layers 4,2"),
            "other-counts": checkpoint(counts=(3, 3))}


def main():
    gens = {"frame": corpus_frame, "messages": corpus_messages, "dispatch": corpus_dispatch,
            "http": corpus_http, "idx": corpus_idx, "checkpoint": corpus_checkpoint}
    for name, gen in gens.items():
        d = os.path.join(HERE, "corpus", name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for fname, data in gen().items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
