"""Reading gradsync checkpoints from Python, exactly as docs/checkpoint.md
describes the format (so the tests that use this hold the document to the
code), and comparing parameter vectors."""
import glob
import math
import os
import struct
import zlib


def read_checkpoint(path):
    """Parses a checkpoint as docs/checkpoint.md describes it."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, nbuf, step, epoch, rng, layout = struct.unpack_from("<8sIIQQQQ", data, 0)
    assert magic == b"GSCKPT\x00\x01", magic
    assert version in (1, 2, 3, 4, 5, 6), version
    off = struct.calcsize("<8sIIQQQQ")
    bufs = []
    for _ in range(nbuf):
        (count,) = struct.unpack_from("<Q", data, off)
        off += 8
        bufs.append(struct.unpack_from(f"<{count}f", data, off))
        off += 4 * count
    desc = world_size = sample = optim_steps = extra = None
    if version >= 2:
        (n,) = struct.unpack_from("<I", data, off)
        desc = data[off + 4:off + 4 + n].decode()
        off += 4 + n
    if version >= 3:
        (world_size,) = struct.unpack_from("<I", data, off)
        off += 4
    if version >= 4:
        (sample,) = struct.unpack_from("<Q", data, off)
        off += 8
    if version >= 5:
        (optim_steps,) = struct.unpack_from("<Q", data, off)
        off += 8
    if version >= 6:
        (m,) = struct.unpack_from("<Q", data, off)
        extra = data[off + 8:off + 8 + m]
        off += 8 + m
    (crc,) = struct.unpack_from("<I", data, off)
    assert crc == zlib.crc32(data[:off]), "CRC mismatch"
    assert off + 12 == len(data), "trailing bytes"
    return {"step": step, "epoch": epoch, "layout": layout, "bufs": bufs, "desc": desc,
            "world_size": world_size, "sample": sample, "optim_steps": optim_steps, "extra": extra}


def newest_checkpoint(d):
    files = sorted(glob.glob(os.path.join(d, "ckpt-*.gsck")))
    assert files, f"no checkpoint in {d}"
    return files[-1]


def rel_error(a, b):
    num = sum((x - y) ** 2 for x, y in zip(a, b))
    den = sum(y * y for y in b)
    return math.sqrt(num / den) if den else math.sqrt(num)


def params_of(ckpt, per_pack=2):
    """The params buffers, concatenated: each pack's first of `per_pack`
    (params, then the optimizer's state: SGD's momentum, 2; Adam's two
    moments, 3)."""
    out = []
    for b in ckpt["bufs"][0::per_pack]:
        out.extend(b)
    return out
