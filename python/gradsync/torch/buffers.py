"""The model's buffers (BatchNorm statistics) across the ranks.

Buffers are not packed: they follow one rank (rank 0, or in an elastic job
the first rank that has trained) at the start, after a resume or a
regroup, and, with broadcast_buffers (DDP's rule), before every forward
with grad. They travel flattened into one float32 tensor on the model's
device, kept from one sync to the next, summed or broadcast there by the
engine: never through host memory. "mean" sums the floating ones and
divides; an integer one (BatchNorm's batch count) is the root's."""
import torch

from gradsync._engine import WorldChanged
from gradsync.torch.state import share


class Buffers:
    """The buffers of one model and how they are shared (`mode`: "rank0",
    "mean" or "own")."""

    def __init__(self, named, mode, engine, device):
        self.named = named
        self.mode = mode
        self._engine = engine
        self._flat = None  # made at the first sync, on `device`
        self._device = device
        self._floating = [b.is_floating_point() for _, b in named]

    def __bool__(self):
        return bool(self.named)

    def combine(self, rank, world, root, mean=False):
        """Every rank's buffers become the root's (a broadcast), or with
        `mean` the ranks' mean of the floating ones (a sum; the others
        add zeros for an integer one, which stays the root's)."""
        parts = [b.detach().reshape(-1) for _, b in self.named]
        if self._flat is None:
            self._flat = torch.empty(sum(p.numel() for p in parts), dtype=torch.float32,
                                     device=self._device)
        flat = self._flat
        torch.cat([p.to(torch.float32) for p in parts], out=flat)
        if mean:
            at = 0
            for p, floating in zip(parts, self._floating):
                if rank != root and not floating:
                    flat[at:at + p.numel()].zero_()
                at += p.numel()
            self._engine.sum_at(flat.data_ptr(), flat.numel())
        else:
            self._engine.broadcast_at(flat.data_ptr(), flat.numel() * 4, root)
        at = 0
        with torch.no_grad():
            for (_, b), floating in zip(self.named, self._floating):
                part = flat[at:at + b.numel()].view(b.shape)
                b.copy_(part / world if mean and floating else part)
                at += b.numel()

    def load(self, saved):
        """A checkpoint's buffers into the model (a resume, rank 0)."""
        with torch.no_grad():
            for n, b in self.named:
                if n not in saved or saved[n].shape != b.shape:
                    raise ValueError(n, list(b.shape))
                b.copy_(saved[n])


def sync(opt, state=False, each_step=False):
    """Buffers take one rank's values, and with `state` (a regroup) a
    wrapped optimizer's state too; true when an elastic job regrouped
    meanwhile (then they are summed again over the new world).
    `each_step`: an elastic job's broadcast_buffers after a step, which
    every rank has trained (rank 0 is a root, or with "mean" the ranks'
    mean)."""
    changed = False
    state = state and opt._wrapped
    while (opt._buffers or state) and opt.world_size > 1:
        try:
            if each_step and not changed:
                opt._buffers.combine(opt.rank, opt.world_size, 0, mean=opt._buffers.mode == "mean")
            else:
                _sync_once(opt, state)
            return changed
        except WorldChanged:
            opt._follow_world()
            changed = True
    return changed


def _root(opt):
    """Rank 0, or in an elastic job the first rank that has trained in it
    (a rank that has just joined holds fresh buffers)."""
    if not opt._elastic:
        return 0
    held = torch.zeros(opt.world_size)
    held[opt.rank] = float(opt._has_state)
    opt._sum(held)
    first = held.nonzero()
    return int(first[0]) if len(first) else 0


def _sync_once(opt, state):
    root = _root(opt)
    if state:  # a rank that joined holds none of the wrapped optimizer's state
        mine = opt._inner.state_dict() if opt.rank == root else None
        opt._inner.load_state_dict(share(opt, mine, root))
    if opt._buffers:
        opt._buffers.combine(opt.rank, opt.world_size, root)
