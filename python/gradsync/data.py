"""A drop-in for torch.utils.data.DistributedSampler that follows an
elastic world and resumes mid-epoch (re-exported as
gradsync.torch.DistributedSampler)::

    sampler = gs.DistributedSampler(train, optimizer=opt)
    loader = DataLoader(train, batch_size=64, sampler=sampler, num_workers=2)
    while opt.epoch < epochs:
        for x, y in loader:               # from opt.sample of opt.epoch, over the world of now
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward()
            r = opt.step(loss)
            if r.stop or r.world_changed:
                break                     # a new world: the next `for` re-shards
        else:
            sampler.set_epoch(opt.epoch + 1)
            continue
        if r.stop:
            break

Without an optimizer it is torch's sampler: the same indices on every
rank for the same dataset length, num_replicas, rank, shuffle, seed,
drop_last and epoch (a torch.Generator seeded with seed + epoch and
torch.randperm; the list padded by repeating it from its start, or its
tail dropped with drop_last; rank r takes positions r, r + W, r + 2W...).
num_replicas and rank left out come from $WORLD_SIZE and $RANK when they
are set, else from the job once a DistributedOptimizer has joined it
(gs.world_size(), gs.rank()): taken at construction when it has, else at
the first `iter()` or `len()` (a sampler made before the optimizer), and
kept. An elastic job's world changes: pass the optimizer.

With `optimizer=opt`, every `iter()` and `len()` reads the place from it:
num_replicas and rank (when not given) from `opt.world_size`, `opt.rank`,
the epoch from `opt.epoch`, and where the epoch goes on from `opt.sample`
(the examples of the epoch trained on, over all ranks). Rank r's k-th
index is position r + kW of the epoch's list, so after whole global
batches the examples trained are exactly its first `opt.sample`
positions. The sampler therefore takes the epoch's list from position
`opt.sample` on and shares that remainder over the world of now: padded
to a multiple of W (by repeating the epoch's list from its start, as
torch does) or its tail dropped with drop_last, rank r taking positions
r, r + W... of it. A world change mid-epoch thus loses and repeats no
example except the padding (fewer than W, at the epoch's end). The
padding's size comes from the remainder, its examples from the epoch's
start: the same count of repeats as taking them from the remainder, but
distinct examples when the remainder is shorter than W, and a rank that
resumes from a checkpoint in the same world yields exactly the rest of
what the uninterrupted run would have, padding included. At sample 0 in
an unchanged world the result is torch's exactly.

`set_epoch(e)` with an optimizer sets the optimizer's epoch: a different
one calls `opt.set_epoch(e)`, which starts it at sample 0; the same one
changes nothing, so a resumed loop that calls `set_epoch(epoch)` keeps
its place mid-epoch.

A DataLoader iterates its sampler in the main process and sends workers
only the dataset, so the optimizer is never pickled.
"""
import math
import os
import sys

import torch

__all__ = ["DistributedSampler"]


def _env_int(name):
    """$name as a number, or None when it is not set."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"DistributedSampler: ${name}={value!r} is not a number (an elastic "
                         "world?): pass optimizer=opt to follow the world") from None


def _job_place():
    """(world, rank) of this process's job once a DistributedOptimizer has
    joined it, else None."""
    env = sys.modules.get("gradsync.torch.env")
    engine = env.state.get("engine") if env is not None else None
    if engine is None:
        return None
    info = engine.info()
    return info["world_size"], info["rank"]


def _check_rank(rank, num_replicas):
    """torch's check and message, word for word."""
    if rank >= num_replicas or rank < 0:
        raise ValueError("Invalid rank {}, rank should be in the interval"
                         " [0, {}]".format(rank, num_replicas - 1))


class DistributedSampler(torch.utils.data.Sampler):
    """torch.utils.data.DistributedSampler's arguments and indices, plus
    `optimizer`: a gradsync DistributedOptimizer (or anything with
    `rank`, `world_size`, `epoch`, `sample` and `set_epoch`) whose world
    and position the sampler follows (see the module's docstring)."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, optimizer=None):
        if optimizer is None:
            num_replicas = _env_int("WORLD_SIZE") if num_replicas is None else num_replicas
            rank = _env_int("RANK") if rank is None else rank
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.optimizer = optimizer
        self._num_replicas, self._rank, self._epoch = num_replicas, rank, 0
        if optimizer is not None or self._place(must=False):
            _check_rank(self.rank, self.num_replicas)

    def _place(self, must=True):
        """Fills the world and rank not given from the job, once joined;
        whether both are known (a ValueError when `must` and they are not)."""
        if self.optimizer is not None:
            return True
        if self._num_replicas is None or self._rank is None:
            place = _job_place()
            if place is not None:
                world, rank = place
                self._num_replicas = world if self._num_replicas is None else self._num_replicas
                self._rank = rank if self._rank is None else self._rank
        known = self._num_replicas is not None and self._rank is not None
        if must and not known:
            raise ValueError("DistributedSampler: the rank and world are not known yet: iterate "
                             "it once a DistributedOptimizer has joined the job, pass "
                             "num_replicas and rank, set $WORLD_SIZE and $RANK, or pass "
                             "optimizer=opt")
        return known

    @property
    def num_replicas(self):
        """The world: as given, else the optimizer's now, else the job's."""
        if self._num_replicas is None and self.optimizer is None:
            self._place()
        if self._num_replicas is not None:
            return self._num_replicas
        return int(self.optimizer.world_size)

    @property
    def rank(self):
        if self._rank is None and self.optimizer is None:
            self._place()
        return self._rank if self._rank is not None else int(self.optimizer.rank)

    def _get_epoch(self):
        return self._epoch if self.optimizer is None else int(self.optimizer.epoch)

    def set_epoch(self, epoch):
        """As torch's: the epoch seeds the shuffle (seed + epoch). With an
        optimizer the epoch is the optimizer's: a different one calls
        `optimizer.set_epoch(epoch)`, which starts it at sample 0; the
        same one changes nothing, so a resumed run's loop may call it and
        keep its place mid-epoch."""
        if self.optimizer is None:
            self._epoch = epoch
        elif int(epoch) != int(self.optimizer.epoch):
            self.optimizer.set_epoch(epoch)

    epoch = property(_get_epoch, set_epoch)

    def _start(self, n):
        """The position of the epoch's list this pass starts at."""
        if self.optimizer is None:
            return 0
        sample = int(self.optimizer.sample)
        if sample < 0:
            raise ValueError(f"DistributedSampler: optimizer.sample is {sample}")
        return min(sample, n)  # past n: the epoch's padding was trained too

    def _size(self):
        """(num_replicas, rank, start, total): the world of now, the
        epoch's position to start at, and the indices all ranks share."""
        num_replicas, rank, n = self.num_replicas, self.rank, len(self.dataset)
        _check_rank(rank, num_replicas)
        start = self._start(n)
        if self.drop_last:  # torch's ceil((n - W) / W) when W does not divide n
            total = (n - start) // num_replicas * num_replicas
        else:
            total = math.ceil((n - start) / num_replicas) * num_replicas
        return num_replicas, rank, start, total

    def __iter__(self):
        num_replicas, rank, start, total = self._size()
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        indices = order[start:start + total]
        indices += [order[i % n] for i in range(total - len(indices))]
        return iter(indices[rank:total:num_replicas])

    def __len__(self):
        num_replicas, _, _, total = self._size()
        return total // num_replicas

    @property
    def num_samples(self):
        """torch's attribute: what this rank yields (len())."""
        return len(self)

    @property
    def total_size(self):
        """torch's attribute: what all ranks yield together."""
        return self._size()[3]
