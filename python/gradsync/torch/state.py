"""The optimizer's state in torch's format, and what gradsync's checkpoints
hold besides the packs.

The fused optimizers keep their state in the engine's packs; `state_dict()`
fills the wrapped torch optimizer's `state` with copies of those buffers
for one call of its own `state_dict()`, so the format is torch's, and
`load_state_dict()` runs the wrapped one's (torch checks and casts) and
copies the result into the engine. A checkpoint's front-end bytes are a
torch.save of {"buffers": {name: tensor}, "optimizer": state_dict} (the
model's buffers, and the state of an optimizer the engine does not run:
docs/checkpoint.md)."""
import io

import torch

from gradsync._engine import Error
from gradsync.torch import grads

# torch.optim's optimizers the engine runs fused over the packs (their own
# class, not a subclass: a subclass may change step()).
FUSED = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
# torch's state slots per optimizer, in the engine's order.
_SLOTS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
          "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}


def _group_of(opt, i):
    p = opt.params[i]
    return next(g for g in opt.param_groups if any(q is p for q in g["params"]))


def _state_views(opt, i):
    """{torch's state name: a view of the engine's buffer} of parameter i."""
    kind = FUSED[type(opt._inner)]
    views = {}
    for slot, name in enumerate(_SLOTS[kind]):
        if kind == "sgd" and not _group_of(opt, i).get("momentum"):
            continue
        if name == "max_exp_avg_sq" and not _group_of(opt, i).get("amsgrad"):
            continue
        views[name] = grads.view(opt.device, opt._engine.state(i, slot), opt.params[i].shape)
    return views


def state_dict(opt):
    """torch's format for the wrapped optimizer's class: "state" per
    parameter index (copies of the engine's buffers; "step" the updates
    applied) and "param_groups". With shard_optimizer the whole state,
    assembled from every rank's shard: every rank calls it."""
    if opt._wrapped:
        return opt._inner.state_dict()
    steps = opt._engine.optim_steps()
    kind = FUSED[type(opt._inner)]
    opt.state.clear()
    if opt._sharded:  # every rank's shard, assembled on every rank
        opt._engine.state_assemble()
    try:
        if steps:
            for i, p in enumerate(opt.params):
                st = {k: v.clone() for k, v in _state_views(opt, i).items()}
                if kind == "sgd":
                    st.setdefault("momentum_buffer", None)
                else:
                    st["step"] = torch.tensor(float(steps))
                opt.state[p] = st
        return opt._inner.state_dict()
    finally:
        opt.state.clear()
        if opt._sharded:
            opt._engine.state_release()


def load_state_dict(opt, sd):
    """Loads torch's format (from plain torch or from state_dict()): the
    groups' hyperparameters, and the state into the engine's buffers (with
    shard_optimizer each rank keeps its shard of it). Every rank loads the
    same (a checkpoint of rank 0's)."""
    opt._inner.load_state_dict(sd)
    if opt._wrapped:
        return
    steps = set()
    if opt._sharded:  # the whole state, of which each rank keeps its shard
        opt._engine.state_assemble(True)
    loaded = False
    try:
        with torch.no_grad():
            for i, p in enumerate(opt.params):
                st = opt.state.get(p, {})
                for name, view in _state_views(opt, i).items():
                    if st.get(name) is not None:
                        view.copy_(st[name])
                    else:
                        view.zero_()
                if "step" in st:
                    steps.add(int(st["step"]))
                elif st.get("momentum_buffer") is not None:
                    steps.add(max(opt._engine.optim_steps(), 1))
        if len(steps) > 1:
            raise Error(f"the state_dict's parameters have different step counts "
                        f"({sorted(steps)[:4]}): gradsync steps every parameter together")
        opt._engine.optim_steps(steps.pop() if steps else 0)
        loaded = True
    finally:
        opt.state.clear()
        if opt._sharded:
            opt._engine.state_release(loaded)


def extra_saver(named_buffers, wrapped):
    """What gradsync's checkpoints hold besides the packs (called by the
    engine on rank 0 as it takes one)."""
    def save():
        out = io.BytesIO()
        torch.save({"buffers": {n: b.detach().cpu() for n, b in named_buffers},
                    "optimizer": wrapped.state_dict() if wrapped is not None else None}, out)
        return out.getvalue()
    return save


def load_extra(opt, data):
    """After a resume: rank 0 holds the checkpoint's extra bytes; its
    buffers go into the model and a wrapped optimizer's state into it (the
    buffer sync then hands both to every rank)."""
    saved = torch.load(io.BytesIO(data)) if data else None
    if saved:
        try:
            opt._buffers.load(saved["buffers"])
        except ValueError as e:
            name, shape = e.args
            raise Error(f"the checkpoint has no buffer '{name}' of shape {shape} (a checkpoint "
                        "of another model?)") from None
    if opt._wrapped and saved and saved["optimizer"] is not None:
        opt._inner.load_state_dict(saved["optimizer"])  # shared next, with the buffers


def share(opt, obj, root=0):
    """The root's object on every rank (torch.save's bytes, broadcast
    through host memory: the rare resume or regroup)."""
    data = bytearray()
    if opt.rank == root:
        out = io.BytesIO()
        torch.save(obj, out)
        data = bytearray(out.getvalue())
    size = bytearray(len(data).to_bytes(8, "little"))
    opt._engine.broadcast(size, root)
    if opt.rank != root:
        data = bytearray(int.from_bytes(size, "little"))
    opt._engine.broadcast(data, root)
    return torch.load(io.BytesIO(bytes(data)))
