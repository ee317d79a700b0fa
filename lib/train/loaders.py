"""Data loaders whose order ``fit`` can replay exactly: ``make_loader``, the per-epoch re-seeding
of a loader's generators (``start_epoch``), the iterator that skips the batches a resumed epoch
already trained on (``epoch_iterator``), ``to_device``, and ``LengthBucketSampler``."""
from __future__ import annotations

import random
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from lib import device as _device
from lib.train.checkpoint import CheckpointError
from lib.validate import check_bool, check_callable, check_choice, check_int

__all__ = ["to_device", "make_loader", "LengthBucketSampler", "GlobalBatchSampler", "start_epoch", "epoch_iterator",
           "epoch_seed"]


def to_device(batch: Any, device: torch.device | str) -> Any:
    """Move every tensor in ``batch`` to ``device``: tensors, tuples, lists, dicts (nested),
    named tuples and dataclass-free containers keep their type; anything else is returned as is."""
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:
            return type(batch)(moved)
        except Exception:  # a mapping type that cannot be rebuilt from a dict: a plain dict will do
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch

def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed that depends only on (seed, epoch)."""
    state = np.random.SeedSequence([int(seed) % 2**63, int(epoch)]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31 | int(state[1]) >> 1) & (2**63 - 1)


def _seed_worker(worker_id: int) -> None:  # pragma: no cover - runs in DataLoader workers
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def make_loader(dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                collate_fn: Callable | None = None, drop_last: bool = False,
                num_workers: int = 0) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` whose order is reproducible and resumable: its sampler owns a
    ``torch.Generator`` that ``fit`` re-seeds from ``(seed, epoch)`` at every epoch, the loader has a
    second one for the workers' base seed, and workers seed numpy and ``random`` from torch's
    per-worker seed. (Random augmentation done inside worker processes is reproducible but is not
    replayed exactly by a mid-epoch resume; do it in the main process, ``num_workers=0``, for that.)"""
    check_int("batch_size", batch_size, 1)
    check_int("seed", seed, 0)
    check_int("num_workers", num_workers, 0)
    check_bool("shuffle", shuffle)
    check_bool("drop_last", drop_last)
    check_callable("collate_fn", collate_fn, allow_none=True)
    if isinstance(dataset, torch.utils.data.IterableDataset) and shuffle:
        raise ValueError("shuffle=True needs a map-style dataset (with __getitem__/__len__); an IterableDataset "
                         "decides its own order")
    sampler = None
    if _device.world_size() > 1:
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise ValueError("under torchrun make_loader needs a map-style dataset (with __getitem__/__len__) to "
                             "give each process its share; an IterableDataset must split itself by rank")
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=_device.world_size(),
                                                      rank=_device.rank(), shuffle=shuffle, seed=int(seed),
                                                      drop_last=drop_last)
    elif shuffle:
        sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(int(seed)))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                         collate_fn=collate_fn, drop_last=drop_last, num_workers=num_workers,
                                         generator=torch.Generator().manual_seed(int(seed)),
                                         worker_init_fn=_seed_worker if num_workers else None)
    loader.course_seed = int(seed)  # fit() uses it when no seed is given
    return loader


def _loader_generators(loader) -> tuple[list[torch.Generator], list[Any]]:
    """The torch generators and the ``set_epoch`` samplers that decide ``loader``'s order.

    A ``DataLoader`` without a generator gets one (otherwise every ``iter(loader)`` draws the
    workers' base seed from the global torch RNG and would shift the dropout random numbers), and
    a ``RandomSampler`` without a generator of its own gets one (so that its order depends only on
    ``(seed, epoch)``, not on how many random numbers the loader drew before)."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return [], []
    if loader.generator is None:
        loader.generator = torch.Generator()
    sampler = loader.sampler
    if isinstance(sampler, torch.utils.data.RandomSampler) and (
            sampler.generator is None or sampler.generator is loader.generator):
        sampler.generator = torch.Generator()
    samplers = []
    for s in (loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)):
        if s is not None and all(s is not t for t in samplers):
            samplers.append(s)
    gens, epoch_samplers = [loader.generator], []
    for s in samplers:
        g = getattr(s, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not h for h in gens):
            gens.append(g)
        if callable(getattr(s, "set_epoch", None)):
            epoch_samplers.append(s)
    return gens, epoch_samplers


def start_epoch(loader, seed: int, epoch: int) -> None:
    """Re-seed every generator that decides the loader's order from (seed, epoch)."""
    gens, epoch_samplers = _loader_generators(loader)
    for i, g in enumerate(gens):
        g.manual_seed(epoch_seed(seed + i, epoch))
    for s in epoch_samplers:
        s.set_epoch(epoch)


def epoch_iterator(loader, skip: int, where: str):
    """An iterator over this epoch's batches without the first ``skip`` (already trained on).

    For a map-style ``DataLoader`` the skipped batches are never loaded: the epoch's index batches
    are listed from its batch sampler and the rest are served by a one-off ``DataLoader`` with the
    same dataset, collate_fn, workers and generator. Anything else is iterated and the first
    ``skip`` batches are thrown away."""
    if skip == 0:
        return iter(loader)
    if (isinstance(loader, torch.utils.data.DataLoader) and loader.batch_sampler is not None
            and not isinstance(loader.dataset, torch.utils.data.IterableDataset)):
        batches = list(loader.batch_sampler)
        if skip > len(batches):
            raise CheckpointError(f"{where} says {skip} batches of this epoch were done, but train_loader has "
                                  f"only {len(batches)}: was the data changed?")
        rest = torch.utils.data.DataLoader(
            loader.dataset, batch_sampler=batches[skip:], num_workers=loader.num_workers,
            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator, prefetch_factor=loader.prefetch_factor if loader.num_workers else None)
        return iter(rest)
    iterator = iter(loader)
    for i in range(skip):
        try:
            next(iterator)
        except StopIteration:
            raise CheckpointError(f"{where} says {skip} batches of this epoch were done, but train_loader has "
                                  f"only {i}: was the data changed?") from None
    return iterator



class LengthBucketSampler(torch.utils.data.Sampler):
    """Batches of examples of similar length (little padding), in a new random order every epoch.

    A batch sampler (``DataLoader(dataset, batch_sampler=...)``): it shuffles the indices, sorts each
    window of ``batch_size * window`` of them by ``lengths`` (a stable sort), cuts the window into
    batches and shuffles the batches. Every index comes out exactly once per epoch; only the last
    batch of a window can be short, so there are ``ceil(len(lengths) / batch_size)`` batches.

    Where the random permutations come from:

    * by default a ``torch.Generator`` seeded from ``(seed, epoch)`` at every ``iter()``: the order
      depends only on them (``lib.train.fit`` calls ``set_epoch``);
    * ``rng="numpy"``: ``numpy.random.default_rng([seed, epoch])`` instead (chapter 2's batches);
    * ``generator=g``: draw from ``g`` and never re-seed it (exposed as ``.generator``, which
      ``fit`` re-seeds from its own seed and the epoch, as it does for a ``make_loader`` loader).
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, window: int = 50, *,
                 rng: str = "torch", generator: torch.Generator | None = None):
        if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) and not hasattr(lengths, "tolist"):
            raise TypeError(f"lengths must be a sequence of ints (one per example), got {type(lengths).__name__}")
        lengths = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
        if not lengths:
            raise ValueError("lengths is empty: a sampler needs at least one example")
        self.lengths = [check_int(f"lengths[{i}]", n, 0) for i, n in enumerate(lengths)]
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.window = check_int("window", window, 1)
        self.rng = check_choice("rng", rng, ("torch", "numpy"))
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def _permutation(self) -> Callable[[int], list[int]]:
        if self.generator is not None:
            return lambda n: torch.randperm(n, generator=self.generator).tolist()
        if self.rng == "numpy":
            gen = np.random.default_rng([self.seed, self.epoch])
            return lambda n: gen.permutation(n).tolist()
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return lambda n: torch.randperm(n, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        permutation = self._permutation()
        order, size, b = permutation(len(self.lengths)), self.batch_size * self.window, self.batch_size
        batches = []
        for start in range(0, len(order), size):
            chunk = sorted(order[start:start + size], key=self.lengths.__getitem__)
            batches += [chunk[k:k + b] for k in range(0, len(chunk), b)]
        for k in permutation(len(batches)):
            yield batches[k]


class GlobalBatchSampler(torch.utils.data.Sampler):
    """A batch sampler whose global batches do not depend on the number of processes.

    Every epoch is one permutation of ``range(n)`` drawn from ``(seed, epoch)``; global batch ``k`` is
    its slice ``[k * global_batch, (k + 1) * global_batch)`` (an incomplete last one is dropped), and
    process ``r`` of ``w`` (``torchrun``) takes the ``r``-th of its ``w`` equal parts. One process with
    the same ``global_batch`` therefore trains, step for step, on exactly the examples that the
    ``w`` processes train on together (``make_loader``'s ``DistributedSampler`` gives each process
    its share of a different order). ``fit`` calls ``set_epoch``.

    ``tag_epoch=True`` yields ``epoch * n + i`` instead of ``i``, so that a dataset can draw the
    randomness of an example from its index, new in every epoch (``index % n`` is the example):
    the same in every process and on every resume, without a random state to carry.
    """

    def __init__(self, n: int, global_batch: int, seed: int = 0, *, tag_epoch: bool = False,
                 rank: int | None = None, world: int | None = None):
        self.n = check_int("n", n, 1)
        self.global_batch = check_int("global_batch", global_batch, 1)
        self.seed = check_int("seed", seed, 0)
        self.tag_epoch = check_bool("tag_epoch", tag_epoch)
        self.world = check_int("world", world if world is not None else _device.world_size(), 1)
        self.rank = check_int("rank", rank if rank is not None else _device.rank(), 0, self.world - 1)
        if global_batch % self.world:
            raise ValueError(f"global_batch={global_batch} must be divisible by the number of processes ({self.world})")
        if n < global_batch:
            raise ValueError(f"n={n} examples cannot fill one global batch of {global_batch}")
        self.per_process = global_batch // self.world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return self.n // self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(self.n, generator=g)
        if self.tag_epoch:
            order += self.epoch * self.n
        for k in range(len(self)):
            start = k * self.global_batch + self.rank * self.per_process
            yield order[start:start + self.per_process].tolist()
