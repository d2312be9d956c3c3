"""The optimizer's parameter groups as the engine's.

The wrapped torch optimizer's `param_groups` stay the one source of
hyperparameters (schedulers write `lr` there). The engine reads them at
every step, so a group a scheduler wrote must reach it, but looking at
every value of every group each step would be the per-step bookkeeping
the step must not have: each group becomes a dict that notes its own
writes, and step() compares one counter."""
import zlib

from gradsync._engine import Error


class _Group(dict):
    """A param group that counts its writes on its owner."""
    __slots__ = ("owner", "dirty")

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.dirty = True
        self.owner.version += 1

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.dirty = True
        self.owner.version += 1

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]


def hyper(group):
    """What the engine reads of a param group."""
    return {k: v for k, v in group.items() if k != "params"}


class Groups:
    """The wrapped optimizer's groups, pushed to the engine when written
    (`in_engine`: the engine runs the optimizer with torch's groups)."""

    def __init__(self, inner, engine, in_engine):
        self._inner, self._engine, self.in_engine = inner, engine, in_engine
        self.version = self._pushed = 0
        self._list = None

    def add_to_engine(self, params):
        """Each group becomes an engine group, and each parameter joins its
        own (before start)."""
        index = {id(p): i for i, p in enumerate(params)}
        for k, g in enumerate(self._inner.param_groups):
            self._engine.add_group(hyper(g))
            for p in g["params"]:
                self._engine.param_group(index[id(p)], k)
        self._track()

    def _track(self):
        """The groups as _Group dicts (again, after torch replaced them)."""
        tracked = []
        for g in self._inner.param_groups:
            if type(g) is not _Group:
                g = _Group(g)
                g.owner = self
            g.dirty = False
            tracked.append(g)
        self._inner.param_groups[:] = tracked
        self._list = self._inner.param_groups

    def changed(self):
        """Whether a group was written (or replaced) since the last push:
        two comparisons."""
        return self.in_engine and (self.version != self._pushed or
                                   self._list is not self._inner.param_groups)

    def push(self):
        """Hands the engine the groups written since the last push."""
        replaced = self._list is not self._inner.param_groups
        if replaced:
            self._track()
        for k, g in enumerate(self._inner.param_groups):
            if replaced or g.dirty:
                self._engine.set_group(k, hyper(g))
                g.dirty = False
        self._pushed = self.version

    def forget(self):
        """Every group is pushed again at the next step (a state_dict was
        loaded)."""
        self._list = None


def rules(groups, params, named, lr, weight_decay):
    """{param index: (lr_mult, weight_decay)} from the engine SGD's own
    torch-style groups (`groups=`)."""
    index = {id(p): i for i, p in enumerate(params)}
    out = {}
    for g in groups:
        unknown = set(g) - {"params", "lr", "lr_mult", "weight_decay"}
        if unknown or "params" not in g:
            raise ValueError(f"a group has 'params' and 'lr', 'lr_mult' or 'weight_decay', "
                             f"not {sorted(unknown) or 'no params'}")
        mult = g["lr"] / lr if "lr" in g else g.get("lr_mult", 1.0)
        decay = g.get("weight_decay", weight_decay)
        for p in g["params"]:
            if id(p) not in index:
                raise ValueError("a group names a parameter that is not the model's (or "
                                 "does not require a gradient)")
            if index[id(p)] in out:
                raise ValueError(f"parameter '{named[index[id(p)]][0]}' is in two groups")
            out[index[id(p)]] = (float(mult), float(decay))
    return out


def add_rules(engine, rule_map):
    """The rules into the engine, and a setting every rank must share."""
    for i, (lr_mult, decay) in sorted(rule_map.items()):
        engine.param_rule(i, lr_mult, decay)
    if rule_map:
        text = ";".join(f"{i}:{m:.9g}:{d:.9g}" for i, (m, d) in sorted(rule_map.items()))
        engine.add_setting("torch.groups", f"{len(rule_map)}/{zlib.crc32(text.encode()):08x}")


def adopt(opt, optimizer, fused):
    """Takes the torch optimizer's groups, defaults and (empty) state as
    `opt`'s; the engine's name for its kind."""
    import torch
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer= takes a torch.optim.Optimizer, not "
                        f"{type(optimizer).__name__}")
    # Others run their own step() on the pack views, after the reduce.
    kind = fused.get(type(optimizer), "none")
    opt._wrapped = kind == "none"
    if optimizer.state and not opt._wrapped:  # Adagrad makes its own at construction
        raise Error("optimizer= has state already (it has stepped, or loaded a "
                    "state_dict): wrap it before training, and load a state_dict into the "
                    "DistributedOptimizer")
    mine = {id(p) for p in opt.params}
    seen = set()
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in mine:
                raise ValueError("optimizer= has a parameter that is not the model's (or does "
                                 "not require a gradient)")
            seen.add(id(p))
    missing = [n for n, p in opt._named if id(p) not in seen]
    if missing:
        raise ValueError(f"parameter(s) {', '.join(missing[:5])} of the model are in no group "
                         "of optimizer=")
    opt._inner = optimizer
    return kind
