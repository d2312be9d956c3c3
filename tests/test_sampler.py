#!/usr/bin/env python3
"""gradsync's DistributedSampler (python/gradsync/data.py) against
torch.utils.data.DistributedSampler, and across elastic world changes and
mid-epoch resumes. The optimizer here is a stand-in with the attributes
the sampler reads (rank, world_size, epoch, sample, set_epoch); the
engine is not needed, so the module is loaded from its file.

usage: test_sampler.py PYTHON_DIR   (the source python/ or build/python)
"""
import importlib.util
import os
import pickle
import random
import sys
import threading
import traceback

from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

SIZES = (0, 1, 7, 10, 100, 101)
WORLDS = (1, 2, 3, 4)
FLAGS = [(shuffle, drop_last) for shuffle in (True, False) for drop_last in (False, True)]


def load(py_dir):
    path = os.path.join(os.path.abspath(py_dir), "gradsync", "data.py")
    spec = importlib.util.spec_from_file_location("gradsync_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gradsync_data"] = module  # pickle finds the class by its module's name
    spec.loader.exec_module(module)
    return module


class FakeOptimizer:
    """What the sampler reads of a gradsync DistributedOptimizer; its
    set_epoch is the real one's (a new epoch starts at sample 0)."""

    def __init__(self, rank, world_size, epoch=0, sample=0):
        self.rank, self.world_size, self.epoch, self.sample = rank, world_size, epoch, sample
        self.set_epoch_calls = 0

    def set_epoch(self, epoch):
        self.set_epoch_calls += 1
        if int(epoch) != self.epoch:
            self.epoch, self.sample = int(epoch), 0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def torch_indices(n, world, rank, shuffle, drop_last, epoch, seed=0):
    s = TorchSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                     drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)


def batched(indices, b):
    """What a DataLoader's BatchSampler makes of a sampler (last batch partial)."""
    indices = list(indices)
    return [indices[i:i + b] for i in range(0, len(indices), b)]


def case_torch_grid(DS):
    count = 0
    for n in SIZES:
        for world in WORLDS:
            for shuffle, drop_last in FLAGS:
                for epoch in (0, 3):
                    for rank in range(world):
                        want = torch_indices(n, world, rank, shuffle, drop_last, epoch, seed=5)
                        ref = TorchSampler(list(range(n)), world, rank, shuffle, 5, drop_last)
                        s = DS(list(range(n)), world, rank, shuffle, 5, drop_last)
                        s.set_epoch(epoch)
                        opt = FakeOptimizer(rank, world, epoch=epoch)
                        o = DS(list(range(n)), shuffle=shuffle, seed=5, drop_last=drop_last,
                               optimizer=opt)
                        what = f"n {n} world {world} rank {rank} shuffle {shuffle} " \
                               f"drop_last {drop_last} epoch {epoch}"
                        check(list(s) == want, f"{what}: {list(s)} != torch's {want}")
                        check(list(o) == want, f"{what}, optimizer: {list(o)} != {want}")
                        check(len(s) == len(o) == len(ref) == len(want), f"{what}: len")
                        check(s.num_samples == ref.num_samples and
                              s.total_size == ref.total_size, f"{what}: num_samples/total_size")
                        count += 1
    return f"torch's indices and len on {count} (n, world, rank, shuffle, drop_last, epoch), " \
           "with and without an optimizer at sample 0"


def simulate(DS, n, b, worlds, shuffle, drop_last, dropped=(), epoch=2):
    """The elastic idiom over one epoch: each rank iterates its sampler in
    batches of b; after each step opt.sample advances by the global batch
    unless the step was dropped (its batch is trained again); the loop
    breaks out and builds its iterators again when the world changes or a
    step was dropped. worlds(step) is the world of step `step` (0-based).
    Returns the global batches that counted, in order."""
    opts, samplers, trained, step = [], [], [], 0
    while True:
        world = worlds(step)
        while len(opts) < world:  # a rank joins at the others' place
            sample = opts[0].sample if opts else 0
            opts.append(FakeOptimizer(len(opts), world, epoch=epoch, sample=sample))
            samplers.append(DS(list(range(n)), shuffle=shuffle, seed=11, drop_last=drop_last,
                               optimizer=opts[-1]))
        for o in opts:
            o.world_size = world
        yields = [list(samplers[r]) for r in range(world)]
        for r in range(world):
            check(len(samplers[r]) == len(yields[r]), f"rank {r}: len() is not what it yields")
            check(len(yields[r]) == len(yields[0]), "ranks yield different counts")
        rebuilt = False
        for per_rank in zip(*(batched(y, b) for y in yields)):
            if step in dropped:
                step += 1
                rebuilt = True
                break
            trained.append([i for batch in per_rank for i in batch])
            for o in opts:
                o.sample += len(per_rank[0]) * world
            step += 1
            if worlds(step) != world:
                rebuilt = True
                break
        if not rebuilt:
            return trained


def check_epoch(trained, n, drop_last, what):
    """Every example trained once; the only extras (padding) or the only
    ones missing (drop_last) are fewer than the world, at the epoch's end."""
    seen = [i for batch in trained for i in batch]
    before_last = [i for batch in trained[:-1] for i in batch]
    check(len(set(before_last)) == len(before_last), f"{what}: repeated before the last batch")
    missing = n - len(set(seen))
    extra = len(seen) - len(set(seen))
    check(all(0 <= i < n for i in seen), f"{what}: an index out of range")
    if drop_last:
        check(extra == 0, f"{what}: {extra} repeated with drop_last")
        check(missing < max(WORLDS), f"{what}: {missing} missing")
    else:
        check(missing == 0, f"{what}: {missing} never trained")
        check(extra < max(WORLDS), f"{what}: {extra} extra")
    return missing, extra


def case_elastic_3_to_2(DS):
    out = []
    for n, b, k in ((100, 4, 3), (101, 5, 2), (10, 1, 1), (7, 2, 1)):
        for shuffle, drop_last in FLAGS:
            trained = simulate(DS, n, b, lambda step: 3 if step < k else 2, shuffle, drop_last)
            what = f"n {n} b {b}: world 3 for {k} steps, then 2"
            flat = [i for batch in trained[:k] for i in batch]
            want = [i for r in range(3) for i in torch_indices(n, 3, r, shuffle, drop_last, 2,
                                                               seed=11)[:k * b]]
            check(sorted(flat) == sorted(want), f"{what}: the first {k} steps are not torch's")
            missing, extra = check_epoch(trained, n, drop_last, what)
            if not drop_last:
                check(extra == -(n - k * b * 3) % 2, f"{what}: {extra} extra, not the padding")
        out.append(f"{n}/{b}/{k}")
    return "world 3 for k steps of b, then 2 from sample k*b*3 (n/b/k " + ", ".join(out) + \
           "): every example once, plus the new world's padding at the end"


def case_elastic_random(DS):
    rng = random.Random(2026)
    runs = 0
    for _ in range(300):
        n, b = rng.choice((7, 10, 33, 100, 101)), rng.choice((1, 2, 3, 4, 8))
        shuffle, drop_last = rng.choice(FLAGS)
        changes = sorted(rng.sample(range(40), 4))
        plan = [rng.choice(WORLDS) for _ in range(5)]
        dropped = set(rng.sample(range(40), 2))

        def worlds(step):
            return plan[sum(step >= c for c in changes)]

        trained = simulate(DS, n, b, worlds, shuffle, drop_last, dropped)
        check_epoch(trained, n, drop_last, f"n {n} b {b} worlds {plan} at {changes} "
                                           f"dropped {sorted(dropped)}")
        runs += 1
    return f"{runs} random epochs, worlds 1-4 changing 4 times and 2 dropped steps: " \
           "every example once, extras (padding) or missing (drop_last) < world, at the end"


def case_resume(DS):
    count = 0
    for n in (10, 100, 101):
        for world in (1, 2, 3):
            for shuffle, drop_last in FLAGS:
                b = 3
                full = [torch_indices(n, world, r, shuffle, drop_last, 4) for r in range(world)]
                for k in range(len(full[0]) // b + 1):
                    for r in range(world):
                        opt = FakeOptimizer(r, world, epoch=4, sample=k * b * world)
                        s = DS(list(range(n)), shuffle=shuffle, drop_last=drop_last,
                               optimizer=opt)
                        s.set_epoch(4)  # a resumed loop's call keeps the place
                        got = list(s)
                        check(got == full[r][k * b:], f"n {n} world {world} rank {r} after "
                              f"{k} steps: {got} != {full[r][k * b:]}")
                        check(len(s) == len(got), "len")
                        count += 1
    return f"resumed at sample k*b*world: exactly the rest of torch's run ({count} cases, " \
           "padding included)"


def case_set_epoch(DS):
    s = DS(list(range(10)), num_replicas=2, rank=1)
    ref = TorchSampler(list(range(10)), num_replicas=2, rank=1)
    check(s.epoch == 0, "epoch starts at 0")
    s.set_epoch(3)
    ref.set_epoch(3)
    check(s.epoch == 3 and list(s) == list(ref), "set_epoch without an optimizer")

    opt = FakeOptimizer(1, 2, epoch=3, sample=4)
    o = DS(list(range(10)), optimizer=opt)
    o.set_epoch(3)
    check(opt.set_epoch_calls == 0 and opt.sample == 4, "set_epoch(same) moved the optimizer")
    check(list(o) == list(ref)[2:], f"same epoch, sample 4: {list(o)}")
    o.set_epoch(5)
    check(opt.set_epoch_calls == 1 and (opt.epoch, opt.sample) == (5, 0),
          "set_epoch(new) did not call optimizer.set_epoch")
    ref.set_epoch(5)
    check(o.epoch == 5 and list(o) == list(ref), "a new epoch from sample 0")
    opt.epoch = 6
    check(o.epoch == 6, "the epoch is read from the optimizer")
    return "torch's without an optimizer; with one, a new epoch calls " \
           "optimizer.set_epoch (sample 0), the same keeps the place"


class Unpicklable(FakeOptimizer):
    """An optimizer that cannot leave the process (it holds a lock)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()


def case_dataloader(DS):
    out = []
    for context in (None, "spawn"):
        n, b = 101, 4
        for opt in (None, Unpicklable(1, 3, epoch=1, sample=24)):
            s = DS(list(range(n)), num_replicas=3, rank=1, seed=3, optimizer=opt)
            s.set_epoch(1)
            loader = DataLoader(list(range(n)), batch_size=b, sampler=s, num_workers=2,
                                multiprocessing_context=context)
            got = [batch.tolist() for batch in loader]
            check(got == batched(s, b), f"{context}, optimizer {opt}: {got} != the sampler's")
            check(len(loader) == len(got), "len(loader)")
            if opt is not None:
                want = torch_indices(n, 3, 1, True, False, 1, seed=3)[8:]
                check([i for x in got for i in x] == want, "not the rest of torch's epoch")
        out.append(context or "fork")
    plain = DS(list(range(20)), num_replicas=2, rank=0, seed=9)
    plain.set_epoch(2)
    copy = pickle.loads(pickle.dumps(plain))
    check(list(copy) == list(plain), "a pickled sampler yields other indices")
    return "DataLoader(num_workers=2, " + " and ".join(out) + \
           "): the sampler's batches, the optimizer never pickled; a sampler pickles"


def case_errors(DS):
    for rank, world in ((2, 2), (5, 3), (-1, 2)):
        try:
            TorchSampler(list(range(4)), num_replicas=world, rank=rank)
        except ValueError as e:
            want = str(e)
        try:
            DS(list(range(4)), num_replicas=world, rank=rank)
            raise AssertionError(f"rank {rank} of {world} accepted")
        except ValueError as e:
            check(str(e) == want, f"{e!r} is not torch's {want!r}")
    opt = FakeOptimizer(1, 2)
    s = DS(list(range(4)), optimizer=opt)
    opt.rank = 2
    for use in (list, len):
        try:
            use(s)
            raise AssertionError(f"{use.__name__}: rank 2 of 2 accepted")
        except ValueError:
            pass
    saved = {k: os.environ.pop(k, None) for k in ("RANK", "WORLD_SIZE")}
    try:
        # Without them and before any job was joined, the place is not
        # known at the first iter() (a sampler made before the optimizer
        # takes it there once one has joined: test_torch.py sampler_job).
        for env in ({}, {"WORLD_SIZE": "2"}):
            os.environ.update(env)
            s = DS(list(range(4)))
            for use in (list, len):
                try:
                    use(s)
                    raise AssertionError(f"{env}: {use.__name__} without a world accepted")
                except ValueError as e:
                    check("not known yet" in str(e) and "optimizer" in str(e), f"{env}: {e}")
            for k in env:
                del os.environ[k]
        os.environ.update({"WORLD_SIZE": "2:4", "RANK": "0"})
        try:
            DS(list(range(4)))
            raise AssertionError("an elastic $WORLD_SIZE accepted")
        except ValueError as e:
            check("WORLD_SIZE" in str(e) and "optimizer" in str(e), f"2:4: {e}")
        for k in ("WORLD_SIZE", "RANK"):
            del os.environ[k]
        os.environ.update(RANK="1", WORLD_SIZE="3")
        s = DS(list(range(10)), shuffle=False)
        check((s.rank, s.num_replicas) == (1, 3) and list(s) == [1, 4, 7, 0], "from $RANK")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    return "a rank out of range (torch's ValueError, also when the optimizer's world " \
           "shrinks under it), no place known at iter(), an elastic $WORLD_SIZE; $RANK used"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    DS = load(sys.argv[1]).DistributedSampler
    failed = 0
    for name, case in [(k, v) for k, v in globals().items() if k.startswith("case_")]:
        try:
            print(f"ok   {name[5:]}: {case(DS)}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {name[5:]}: {traceback.format_exc()}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
