"""The model's layout as Join settings (so that the coordinator's refusal
of unlike models names the first parameter that differs), and the
optimizer's arguments the engine reads as they are: sizes, dtypes."""
import re
import zlib

import torch

from gradsync._engine import ModelMismatch

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|kB|MB|GB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
          "kB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def pack_bytes(size):
    if isinstance(size, int):
        return size
    m = _SIZE.match(str(size))
    if not m:
        raise ValueError(f"pack_threshold: expected bytes like '10MiB', got {size!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


# Model layout settings: one character per parameter, so that the
# coordinator's refusal of unlike models names the first that differs.
_LAYOUT_CHARS = 120
_LAYOUT_SETTINGS = 8
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def grad_dtype(value):
    """The engine's name for what the gradients travel in."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    return names.get(value, value)


def layout_settings(named):
    """('model.layout.k', chars): a character per parameter (a hash of its
    name and shape), in chunks; the rest as one hash."""
    chars = "".join(_ALPHABET[zlib.crc32(f"{n}{tuple(p.shape)}".encode()) % 64] for n, p in named)
    out = []
    for k in range(_LAYOUT_SETTINGS):
        chunk = chars[k * _LAYOUT_CHARS:(k + 1) * _LAYOUT_CHARS]
        if chunk:
            out.append((f"model.layout.{k}", chunk))
    rest = chars[_LAYOUT_SETTINGS * _LAYOUT_CHARS:]
    if rest:
        out.append(("model.layout.rest", f"{zlib.crc32(rest.encode()):08x}"))
    return out


_UNLIKE = re.compile(r"setting 'model\.layout\.(\d+)' is '([^']*)' vs '([^']*)'")
_RANKS = re.compile(r"rank (\d+) has settings unlike rank (\d+)'s")


def mismatch(err, named):
    """A refusal of unlike models, with the first differing parameter
    named, from this rank's side: the coordinator sends every rank the
    same words about two ranks (the one that differs, then the one it was
    compared with), so each rank finds which of them it is by its own
    layout."""
    m, ranks = _UNLIKE.search(str(err)), _RANKS.search(str(err))
    if not m:
        return ModelMismatch(str(err)) if "model" in str(err) else err
    k = int(m.group(1))
    base, bad, ref = k * _LAYOUT_CHARS, m.group(2), m.group(3)
    bad_rank, ref_rank = ranks.groups() if ranks else ("?", "?")
    mine = dict(layout_settings(named)).get(f"model.layout.{k}", "")
    me, other, theirs = (bad_rank, ref_rank, ref) if mine == bad else \
        (ref_rank, bad_rank, bad) if mine == ref else (None, None, None)
    if me is None:
        return ModelMismatch(f"the ranks' models differ (rank {bad_rank}'s from rank "
                             f"{ref_rank}'s; this rank is neither): {err}")
    i = next((j for j in range(min(len(mine), len(theirs))) if mine[j] != theirs[j]),
             min(len(mine), len(theirs)))
    i += base
    if i < len(named):
        name, p = named[i]
        what = (f"parameter {i} '{name}' (shape {list(p.shape)}) on this rank (rank {me}) "
                f"differs from rank {other}'s (its name or shape)")
    else:
        what = (f"this rank (rank {me}) has {len(named)} parameters, rank {other} more")
    return ModelMismatch(f"the ranks' models differ: {what}; {err}")
