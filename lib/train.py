"""One training loop for every chapter: progress, mixed precision, clipping, schedules,
evaluation, a metrics history, and checkpoints that resume exactly.

A chapter writes only what is specific to its model, the loss of one batch::

    def step_fn(model, batch):
        x, y = batch                                  # already on the device
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        return loss, {"acc": (logits.argmax(-1) == y).float().mean().item()}

    loader = train.make_loader(dataset, batch_size=32, shuffle=True, seed=0)
    history = train.fit(model, loader, optimizer=opt, step_fn=step_fn, epochs=3,
                        eval_fn=lambda m: {"loss": val_loss(m)}, device=dev)
    history.to_frame()                                # step, epoch, lr, train_loss, acc, eval_loss

What ``fit`` does on every step: move the batch to the device (``to_device``), compute the
loss under autocast on a GPU (``lib.device.autocast``; nothing on cpu), backpropagate (through a
``torch.amp.GradScaler`` where ``lib.device.precision`` asks for one), clip the gradient norm
to ``clip_grad``, step the optimizer and then the scheduler (schedules here are per step, not per
epoch).

Exact resume
------------
``fit(..., checkpoint=path, resume=True)`` continues an interrupted run so that, on cpu, the
result is bit-for-bit the result of the run that was never interrupted (same parameters,
same history). What makes that true:

* the checkpoint holds the model, optimizer, scheduler and grad-scaler states, the step, the
  position inside the epoch, the history, the partly averaged metrics, and the random number
  generator states (python, numpy, torch cpu, cuda), so dropout draws the same masks;
* the data order is a function of ``(seed, epoch)``: at the start of every epoch ``fit``
  re-seeds every ``torch.Generator`` of the loader, its sampler and batch sampler (a
  ``DataLoader`` or ``RandomSampler`` without one gets one) and calls ``set_epoch(epoch)`` on
  samplers that have it; ``make_loader`` builds such a loader. A resumed run rebuilds the
  interrupted epoch's order and skips the batches already consumed: for a map-style
  ``DataLoader`` without loading them (the rest of the epoch's index batches go to a one-off
  ``DataLoader``), for anything else by iterating past them. The random states at the start
  of the epoch are saved too and restored before the order is rebuilt, so a loader that
  shuffles with the global RNGs resumes exactly as well;
* randomness in the data pipeline must therefore come from the global RNGs (in the main
  process) or from generators/``set_epoch`` that ``fit`` can reach. Random augmentation inside
  DataLoader worker processes is reproducible but not replayed exactly by a mid-epoch resume;
* evaluation happens at fixed steps (epoch ends and every ``eval_every`` steps) and the
  checkpoint is written after it, so the random numbers an ``eval_fn`` may draw are accounted
  for too.

``seed`` defaults to the ``make_loader`` seed, else ``torch.initial_seed()`` (the seed given to
``lib.device.setup``). The final evaluation after the last step (when it had none) is not in the
checkpoint, so that resuming never changes the history.

Several processes (``torchrun``)
--------------------------------
The same script trains data-parallel when started with ``torchrun --nproc_per_node=N``
(after ``lib.device.setup``, which joins the process group):

* ``make_loader`` gives each process its own share of every epoch (a ``DistributedSampler``
  seeded with ``seed``; ``fit`` calls its ``set_epoch``), so a batch of ``batch_size`` per
  process makes a global batch of ``N * batch_size``;
* ``fit`` copies rank 0's parameters and buffers to every process before the first step, and
  after every backward pass replaces each gradient by its average over the processes (one
  all-reduce over all gradients flattened together, before clipping), which is the arithmetic
  of ``DistributedDataParallel`` without its overlap of communication and computation; ``step_fn``
  is unchanged and may call any method of the model. With a mean loss and equal batch sizes the
  update is exactly that of one process on the global batch (``tests/test_train_distributed.py``
  checks it);
* the logged training metrics are averaged over the processes (every process must return the
  same metric names), ``eval_fn`` runs in every process (the replicas are identical), and only
  rank 0 prints and writes the checkpoint, which holds every process's random states; a resume
  must use the same number of processes.

"""
from __future__ import annotations

import math
import os
import pickle
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from lib import device as _device
from lib.io import atomic_write

__all__ = ["fit", "History", "to_device", "make_loader", "transformer_lr", "transformer_schedule",
           "warmup_cosine_factor", "warmup_cosine", "save_checkpoint", "load_checkpoint",
           "CheckpointError", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "lib.train.checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: not a weights-only checkpoint, or not one of ours."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

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


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        expected = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _epoch_seed(seed: int, epoch: int) -> int:
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
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0)
    _check_int("num_workers", num_workers, 0)
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be a bool, got {shuffle!r}")
    if not isinstance(drop_last, bool):
        raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}")
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


def _start_epoch(loader, seed: int, epoch: int) -> None:
    """Re-seed every generator that decides the loader's order from (seed, epoch)."""
    gens, epoch_samplers = _loader_generators(loader)
    for i, g in enumerate(gens):
        g.manual_seed(_epoch_seed(seed + i, epoch))
    for s in epoch_samplers:
        s.set_epoch(epoch)


def _epoch_iterator(loader, skip: int, where: str):
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


# --------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------

def transformer_lr(step: int, d_model: int, warmup_steps: int) -> float:
    """The schedule of "Attention Is All You Need" (section 5.3):
    ``d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``, with ``step`` counted from 1.
    It rises linearly for ``warmup_steps`` steps, peaks at ``step == warmup_steps`` and then
    decays as ``1/sqrt(step)``."""
    _check_int("step", step, 1)
    _check_int("d_model", d_model, 1)
    _check_int("warmup_steps", warmup_steps, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def transformer_schedule(optimizer: torch.optim.Optimizer, d_model: int,
                         warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` whose factor for the k-th optimizer step (k = 1, 2, ...) is
    ``transformer_lr(k, d_model, warmup_steps)``. Give the optimizer ``lr=1.0`` to get the
    paper's values (any other base lr scales them)."""
    _check_optimizer(optimizer)
    _check_int("d_model", d_model, 1)
    _check_int("warmup_steps", warmup_steps, 1)
    d_model, warmup_steps = int(d_model), int(warmup_steps)

    def factor(index: int) -> float:  # LambdaLR passes 0 before the first step
        return transformer_lr(index + 1, d_model, warmup_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base lr at step ``step`` (counted from 1): linear warm-up ``step/warmup``
    up to 1 at ``step == warmup_steps``, then a half cosine down to ``min_ratio`` at
    ``step == total_steps``, and ``min_ratio`` after that."""
    _check_int("step", step, 1)
    _check_warmup_cosine(warmup_steps, total_steps, min_ratio)
    if step <= warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _check_warmup_cosine(warmup_steps, total_steps, min_ratio) -> None:
    _check_int("warmup_steps", warmup_steps, 0)
    _check_int("total_steps", total_steps, 1)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must be larger than warmup_steps ({warmup_steps})")
    if isinstance(min_ratio, bool) or not isinstance(min_ratio, (int, float)) or not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be a number in [0, 1], got {min_ratio!r}")


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR``: linear warm-up, then cosine decay to ``min_ratio * base_lr`` at
    ``total_steps`` (see ``warmup_cosine_factor``)."""
    _check_optimizer(optimizer)
    _check_warmup_cosine(warmup_steps, total_steps, min_ratio)
    w, t, m = int(warmup_steps), int(total_steps), float(min_ratio)

    def factor(index: int) -> float:
        return warmup_cosine_factor(index + 1, w, t, m)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")


# --------------------------------------------------------------------------------------------
# History
# --------------------------------------------------------------------------------------------

class History:
    """The metrics of a run, as data.

    ``records`` is a list of dicts, one per logged step: ``step``, ``epoch`` (1-based), ``lr``,
    ``train_loss`` and the other training metrics averaged over the steps since the previous
    record, plus ``eval_*`` keys on the records where an evaluation ran.
    """

    def __init__(self, records: Iterable[Mapping[str, Any]] | None = None):
        self.records: list[dict[str, Any]] = [dict(r) for r in (records or [])]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __eq__(self, other) -> bool:
        return isinstance(other, History) and self.records == other.records

    def __repr__(self) -> str:
        keys = sorted({k for r in self.records for k in r})
        return f"History({len(self.records)} records, keys={keys})"

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            seen.update(dict.fromkeys(r))
        return list(seen)

    def values(self, key: str) -> list[Any]:
        """The values of ``key`` in order, skipping records without it."""
        out = [r[key] for r in self.records if key in r]
        if not out:
            raise KeyError(f"no record has the key {key!r}; keys are {self.keys()}")
        return out

    def series(self, key: str) -> tuple[list[int], list[Any]]:
        """(steps, values) of ``key``, for plotting."""
        pairs = [(r.get("step"), r[key]) for r in self.records if key in r]
        if not pairs:
            raise KeyError(f"no record has the key {key!r}; keys are {self.keys()}")
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def last(self, key: str) -> Any:
        """The most recent value of ``key``."""
        return self.values(key)[-1]

    def best(self, key: str, mode: str = "min") -> Any:
        """The smallest (``mode="min"``) or largest (``mode="max"``) value of ``key``."""
        return self.best_record(key, mode)[key]

    def best_record(self, key: str, mode: str = "min") -> dict[str, Any]:
        """The whole record where ``key`` is best (the first one on ties)."""
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        candidates = [r for r in self.records if key in r and not _is_nan(r[key])]
        if not candidates:
            raise KeyError(f"no record has a value for {key!r}; keys are {self.keys()}")
        pick = min if mode == "min" else max
        return dict(pick(candidates, key=lambda r: r[key]))

    def to_frame(self):
        """A pandas DataFrame, one row per record (missing values are NaN)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records, columns=self.keys() or None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (also loadable with ``torch.load(weights_only=True)``)."""
        return {"records": [dict(r) for r in self.records]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "History":
        if not isinstance(data, Mapping) or not isinstance(data.get("records"), list):
            raise ValueError("History.from_dict expects {'records': [dict, ...]}, "
                             f"got {type(data).__name__} with keys {list(data) if isinstance(data, Mapping) else '-'}")
        return cls(data["records"])


def _is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _scalar(name: str, value: Any) -> float | int | str:
    """A metric value as a plain python number (0-d tensors and numpy scalars accepted)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return value.detach().float().item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"metric {name!r} must be a number or a scalar tensor, got {type(value).__name__}")


class _Window:
    """Running sums of the training metrics since the last history record."""

    def __init__(self, state: Mapping[str, Any] | None = None):
        state = state or {}
        self.sums: dict[str, float] = dict(state.get("sums", {}))
        self.counts: dict[str, int] = dict(state.get("counts", {}))

    def add(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.counts[k] = self.counts.get(k, 0) + 1

    def __bool__(self) -> bool:
        return bool(self.counts)

    def flush(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.sums, self.counts = {}, {}
        return out

    def state(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}


# --------------------------------------------------------------------------------------------
# Random number generator states, in a form torch.load(weights_only=True) accepts
# --------------------------------------------------------------------------------------------

def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    if _device._mps_available():
        try:
            state["mps"] = torch.mps.get_rng_state()
        except Exception:  # pragma: no cover - depends on the torch build
            pass
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state({"bit_generator": nps["bit_generator"],
                         "state": {"key": nps["key"].numpy().astype(np.uint32), "pos": nps["pos"]},
                         "has_gauss": nps["has_gauss"], "gauss": nps["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(f"the checkpoint has RNG states for {len(cuda_states)} cuda devices, this machine "
                          f"has {torch.cuda.device_count()}: cuda RNG not restored", stacklevel=3)
    if "mps" in state and _device._mps_available():  # pragma: no cover
        torch.mps.set_rng_state(state["mps"])


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None))


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is made of tensors and plain python containers, the only
    things ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, (torch.Tensor,) + _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where} has a key {k!r} of type {type(k).__name__}; keys must be str or int")
            _check_plain(v, f"{where}[{k!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__name__}; a checkpoint may only hold tensors, numbers, "
                    "strings, None and lists/tuples/dicts of them (so that it loads with weights_only=True)")


def _write_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    path = Path(path)
    with atomic_write(path, "wb") as f:
        torch.save(payload, f)
    return path


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, step: int = 0, extra: Mapping[str, Any] | None = None, *,
                    scaler: torch.amp.GradScaler | None = None, epoch: int = 0,
                    history: History | None = None, rng: bool = True) -> Path:
    """Write a checkpoint to ``path`` (a temporary file beside it, then renamed: a crash never
    leaves a half-written checkpoint, and the previous one survives a failed save).

    It holds the model, optimizer, scheduler and grad-scaler states, ``step``, ``epoch``, the
    ``history``, ``extra`` (tensors / numbers / strings / lists / dicts only) and, with ``rng=True``,
    the python, numpy, torch and cuda random states.
    """
    payload = _payload(model, optimizer, scheduler, scaler, step=step, epoch=epoch, history=history,
                       extra=extra, rng=rng)
    return _write_checkpoint(path, payload)


def _payload(model, optimizer, scheduler, scaler, *, step, epoch, history, extra, rng, loop=None) -> dict:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None:
        _check_optimizer(optimizer)
    if scheduler is not None and not callable(getattr(scheduler, "state_dict", None)):
        raise TypeError(f"scheduler must have a state_dict() method, got {type(scheduler).__name__}")
    _check_int("step", step, 0)
    _check_int("epoch", epoch, 0)
    if history is not None and not isinstance(history, History):
        raise TypeError(f"history must be a lib.train.History or None, got {type(history).__name__}")
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}")
    extra = dict(extra or {})
    _check_plain(extra, "extra")
    payload = {
        "format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "step": int(step),
        "epoch": int(epoch),
        "history": history.to_dict() if history is not None else None,
        "rng": _rng_state() if rng else None,
        "extra": extra,
        "loop": loop,
    }
    _check_plain(payload["history"], "history")
    _check_plain(payload["scheduler"], "scheduler state")
    return payload


def _read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path} is not a weights-only checkpoint (it holds python objects that "
                              f"torch.load(weights_only=True) refuses to unpickle, so it is not loaded): {e}") from e
    except (RuntimeError, EOFError) as e:
        raise CheckpointError(f"{path} is not a readable torch checkpoint: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path} is not a lib.train checkpoint (format {got!r}, expected {CHECKPOINT_FORMAT!r})")
    return payload


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, *, scaler: torch.amp.GradScaler | None = None,
                    restore_rng: bool = False) -> dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint`` (or ``fit``) into ``model`` (and the
    optimizer / scheduler / scaler when given), reading it with ``torch.load(weights_only=True)``:
    a file that would need to run arbitrary pickled code is refused with a ``CheckpointError``.

    Returns a dict with ``step``, ``epoch``, ``history`` (a ``History`` or None) and ``extra``.
    ``restore_rng=True`` also restores the random number generators.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    payload = _read_checkpoint(path)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise CheckpointError(f"the model in {path} does not match this model: {e}") from e
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if obj is None:
            continue
        if payload.get(name) is None:
            if name == "scaler":
                continue
            raise CheckpointError(f"{path} has no {name} state, but a {name} was given to load it into")
        obj.load_state_dict(payload[name])
    if restore_rng:
        if payload.get("rng") is None:
            raise CheckpointError(f"{path} was saved without random number generator states")
        _set_rng_state(payload["rng"])
    return {"step": payload["step"], "epoch": payload["epoch"],
            "history": History.from_dict(payload["history"]) if payload.get("history") else None,
            "extra": payload.get("extra") or {}}


# --------------------------------------------------------------------------------------------
# Progress: a bar when a person watches, short text lines otherwise
# --------------------------------------------------------------------------------------------

def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def _show_bar(progress: bool | None) -> bool:
    """Whether to draw a tqdm bar. ``COURSE_PROGRESS=0`` always wins (CI, book build);
    ``COURSE_PROGRESS=1`` forces it. Automatic: on a terminal, or in a Jupyter kernel that a
    Jupyter server started for a person (it sets JPY_SESSION_NAME; nbval / nbclient / the book
    build do not), so executed notebooks get text lines instead of widget output."""
    env = os.environ.get("COURSE_PROGRESS", "").strip()
    if env == "0" or progress is False:
        return False
    if env == "1" or progress is True:
        return True
    if _in_kernel():
        return bool(os.environ.get("JPY_SESSION_NAME"))
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt(metrics: Mapping[str, Any]) -> str:
    parts = []
    for k, v in metrics.items():
        if k in ("step", "epoch"):
            continue
        if isinstance(v, float):
            parts.append(f"{k} {v:.2e}" if k == "lr" else f"{k} {v:.4g}")
        else:
            parts.append(f"{k} {v}")
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------

def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def _unpack_step(out, step: int) -> tuple[torch.Tensor, dict[str, Any]]:
    if isinstance(out, torch.Tensor):
        loss, metrics = out, {}
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        loss, metrics = out
        metrics = {} if metrics is None else metrics
    else:
        raise TypeError(f"step_fn must return (loss, metrics_dict) or a loss tensor, got {type(out).__name__}")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"step_fn must return a scalar loss tensor first, got "
                        f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    if not loss.requires_grad:
        raise ValueError("the loss returned by step_fn does not require grad: was it computed under "
                         "torch.no_grad(), or detached?")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"step_fn's metrics must be a dict, got {type(metrics).__name__}")
    clean = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(f"metric names must be str, got {k!r}")
        if k in ("step", "epoch", "lr", "train_loss") or k.startswith("eval_"):
            raise ValueError(f"step_fn returned a metric named {k!r}, a name the history reserves")
        clean[k] = _scalar(k, v)
    return loss, clean


def _broadcast_model(model: nn.Module) -> None:
    """Give every process rank 0's parameters and buffers (what DistributedDataParallel does at start)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            torch.distributed.broadcast(t.data, src=0)


def _average_gradients(model: nn.Module, world: int) -> None:
    """Replace every gradient by its mean over the processes: one all-reduce of all the gradients
    flattened together. A parameter that has a gradient in some process gets one in all (zeros
    where it was unused), so every process steps the same parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
    torch.distributed.all_reduce(has_grad, op=torch.distributed.ReduceOp.MAX)
    used = [p for p, h in zip(params, has_grad.tolist()) if h]
    for p in used:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not used:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in used])
    torch.distributed.all_reduce(flat)
    flat /= world
    offset = 0
    for p in used:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def _average_metrics(loss_value: float, metrics: dict[str, Any], world: int,
                     device: torch.device) -> tuple[float, dict[str, Any]]:
    """The step's loss and numeric metrics averaged over the processes (in sorted name order)."""
    names = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
    values = torch.tensor([loss_value] + [float(metrics[k]) for k in names], dtype=torch.float64,
                          device=device if device.type == "cuda" else "cpu")
    torch.distributed.all_reduce(values)
    values = (values / world).tolist()
    return values[0], {**metrics, **dict(zip(names, values[1:]))}


def fit(model: nn.Module, train_loader: Iterable, *, optimizer: torch.optim.Optimizer,
        step_fn: Callable[[nn.Module, Any], Any], epochs: int | None = 1, max_steps: int | None = None,
        scheduler: Any = None, clip_grad: float | None = 1.0,
        eval_fn: Callable[[nn.Module], Mapping[str, Any]] | None = None, eval_every: int | None = None,
        device: torch.device | str | None = None, checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int | None = None, resume: bool = False, progress: bool | None = None,
        log_every: int | None = 50, seed: int | None = None) -> History:
    """Train ``model`` and return its ``History``.

    model, train_loader   the model and a re-iterable source of batches (a ``DataLoader``, ideally
                          from ``make_loader``, or a list of batches).
    optimizer, scheduler  the scheduler (optional) is stepped after every optimizer step.
    step_fn               ``step_fn(model, batch) -> (loss, {name: float})``: the loss of one batch
                          (the batch is already on the device).
    epochs, max_steps     stop after ``epochs`` passes over the data or ``max_steps`` optimizer steps
                          in total (counting steps done before a resume), whichever comes first.
                          ``epochs=None`` means "until max_steps".
    clip_grad             maximum global gradient norm; None disables clipping.
    eval_fn, eval_every   ``eval_fn(model) -> {name: float}`` runs (in eval mode, without grad) at the
                          end of every epoch, every ``eval_every`` steps, and once at the end of
                          training if the last step had none; keys are stored as ``eval_<name>``.
    device                where to train (the model is moved there); default: the model's device.
    checkpoint, checkpoint_every, resume
                          write a checkpoint to ``checkpoint`` every ``checkpoint_every`` steps, at each
                          epoch end and when training stops. ``resume=True`` continues from it if the
                          file exists (and starts afresh if not); see the module docstring for why the
                          result equals an uninterrupted run.
    progress, log_every   a tqdm bar (None = automatic, see ``_show_bar``), or a text line every
                          ``log_every`` steps. ``log_every`` is also how often the averaged training
                          metrics are written to the history (and at every epoch end / evaluation);
                          ``log_every=None`` writes history records only at epoch ends / evaluations.
    seed                  decides the data order of each epoch; default: the loader's ``make_loader``
                          seed, else ``torch.initial_seed()``.
    """
    # ---- arguments -------------------------------------------------------------------------
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_optimizer(optimizer)
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
    if eval_fn is not None and not callable(eval_fn):
        raise TypeError(f"eval_fn must be callable or None, got {type(eval_fn).__name__}")
    if not isinstance(train_loader, Iterable) or isinstance(train_loader, (str, bytes)):
        raise TypeError(f"train_loader must be an iterable of batches, got {type(train_loader).__name__}")
    if isinstance(train_loader, Iterator):
        raise TypeError("train_loader is a one-shot iterator; pass something that can be iterated once "
                        "per epoch (a DataLoader or a list of batches)")
    _check_int("epochs", epochs, 1, allow_none=True)
    _check_int("max_steps", max_steps, 1, allow_none=True)
    if epochs is None and max_steps is None:
        raise ValueError("give epochs or max_steps (both are None, so training would never stop)")
    if clip_grad is not None and (isinstance(clip_grad, bool) or not isinstance(clip_grad, (int, float))
                                  or not clip_grad > 0 or not math.isfinite(clip_grad)):
        raise ValueError(f"clip_grad must be a positive number or None, got {clip_grad!r}")
    _check_int("eval_every", eval_every, 1, allow_none=True)
    _check_int("checkpoint_every", checkpoint_every, 1, allow_none=True)
    _check_int("log_every", log_every, 1, allow_none=True)
    _check_int("seed", seed, 0, allow_none=True)
    if eval_every is not None and eval_fn is None:
        raise ValueError("eval_every was given but eval_fn is None")
    if checkpoint_every is not None and checkpoint is None:
        raise ValueError("checkpoint_every was given but checkpoint (a path) is None")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=<path>")
    if progress not in (None, True, False):
        raise TypeError(f"progress must be None, True or False, got {progress!r}")
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler must have a step() method, got {type(scheduler).__name__}")

    device = torch.device(device) if device is not None else _model_device(model)
    model.to(device)
    world, rank = _device.world_size(), _device.rank()
    if world > 1:
        _broadcast_model(model)
    prec = _device.precision(device)
    scaler = torch.amp.GradScaler(device.type) if prec.grad_scaler else None
    if seed is None:
        seed = getattr(train_loader, "course_seed", None)
        seed = int(seed) if seed is not None else int(torch.initial_seed() % 2**63)

    try:
        n_batches = len(train_loader)  # type: ignore[arg-type]
    except TypeError:
        n_batches = None
    if n_batches == 0:
        raise ValueError("train_loader yields no batches (is the dataset smaller than batch_size with drop_last=True?)")

    # ---- state (fresh or from the checkpoint) ----------------------------------------------
    history = History()
    window = _Window()
    step, epoch, skip = 0, 0, 0
    rng_to_restore = None
    loop_state: dict[str, Any] = {}
    if resume and Path(checkpoint).is_file():
        payload = _read_checkpoint(checkpoint)
        loop = payload.get("loop")
        if not loop:
            raise CheckpointError(f"{checkpoint} was not written by fit() (no loop state), so it cannot be resumed")
        if (scheduler is None) != (payload["scheduler"] is None):
            raise CheckpointError(f"{checkpoint} was written {'with' if payload['scheduler'] is not None else 'without'} "
                                  f"a scheduler, but this call has {'one' if scheduler is not None else 'none'}")
        try:
            model.load_state_dict(payload["model"])
            optimizer.load_state_dict(payload["optimizer"])
            if scheduler is not None:
                scheduler.load_state_dict(payload["scheduler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"cannot resume from {checkpoint}: it was written for another model, optimizer "
                                  f"or scheduler ({e}); delete it or pass resume=False") from e
        if scaler is not None and payload.get("scaler") is not None:
            scaler.load_state_dict(payload["scaler"])
        saved_world = loop.get("world_size", 1)
        if saved_world != world:
            raise CheckpointError(f"{checkpoint} was written by a run with {saved_world} process(es), this one has "
                                  f"{world}: resume with the same number of processes, or pass resume=False")
        loop_state = dict(loop)
        if world > 1:
            loop_state["epoch_rng"] = loop["rank_rng"][rank]["epoch_rng"]
        step, epoch, skip = payload["step"], payload["epoch"], loop["batch_in_epoch"]
        history = History.from_dict(payload["history"])
        window = _Window(loop["window"])
        if loop["seed"] != seed:
            warnings.warn(f"resuming with the checkpoint's data seed {loop['seed']} (this call would have used {seed})",
                          stacklevel=2)
        seed = loop["seed"]
        rng_to_restore = loop["rank_rng"][rank]["rng"] if world > 1 else payload["rng"]

    def done() -> bool:
        return (max_steps is not None and step >= max_steps) or (epochs is not None and epoch >= epochs)

    total = None
    if n_batches is not None and epochs is not None:
        total = n_batches * epochs
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)

    bar = None
    if _show_bar(progress) and not done() and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="train", dynamic_ncols=True, leave=True)

    def say(line: str) -> None:
        if rank != 0:
            return
        if bar is not None:
            bar.write(line)
        elif log_every is not None or progress is False:
            print(line, flush=True)

    last_eval_step = loop_state.get("last_eval_step", -1)
    saved_at = (step, epoch, skip) if loop_state else None
    # the lr the latest step used (what a history record shows)
    last_lr = loop_state.get("lr", float(optimizer.param_groups[0]["lr"]))
    batch_in_epoch = skip
    epoch_rng = None  # the random states at the start of the current epoch

    def flush(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Close the averaging window into a history record at this step (merging ``extra``)."""
        if history.records and history.records[-1]["step"] == step and not window:
            rec = history.records[-1]
        else:
            rec = {"step": step, "epoch": epoch + 1, "lr": last_lr}
            rec.update(window.flush())
            history.records.append(rec)
        if extra:
            rec.update(extra)
        return rec

    def evaluate() -> None:
        nonlocal last_eval_step
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = eval_fn(model)
        finally:
            model.train(was_training)
        if not isinstance(out, Mapping):
            raise TypeError(f"eval_fn must return a dict of metrics, got {type(out).__name__}")
        metrics = {}
        for k, v in out.items():
            if not isinstance(k, str):
                raise TypeError(f"eval_fn's metric names must be str, got {k!r}")
            metrics[k if k.startswith("eval_") else f"eval_{k}"] = _scalar(k, v)
        flush(metrics)
        last_eval_step = step
        say(f"eval  step {step} (epoch {epoch + 1}): {_fmt(metrics)}")

    def save() -> None:
        nonlocal saved_at
        where = (step, epoch, batch_in_epoch)
        if checkpoint is None or saved_at == where:
            return
        loop = {"batch_in_epoch": batch_in_epoch, "window": window.state(), "seed": seed, "lr": last_lr,
                "last_eval_step": last_eval_step, "epoch_rng": epoch_rng, "world_size": world}
        if world > 1:
            # every process's random states, so that each resumes its own dropout stream
            states = [None] * world
            torch.distributed.all_gather_object(states, {"rng": _rng_state(), "epoch_rng": epoch_rng})
            loop["rank_rng"] = states
        if rank == 0:
            payload = _payload(model, optimizer, scheduler, scaler, step=step, epoch=epoch, history=history,
                               extra=None, rng=True, loop=loop)
            _write_checkpoint(checkpoint, payload)
        if world > 1:
            torch.distributed.barrier()  # the file exists before any process goes on
        saved_at = where

    if step > 0 or skip > 0:
        say(f"resumed from {checkpoint} at step {step} (epoch {epoch + 1}, batch {skip})")

    model.train()
    start_time = time.perf_counter()
    try:
        while not done():
            # The random states are restored at the point of the loop where they were saved: before
            # the epoch's iterator exists for a checkpoint between epochs; for one inside an epoch,
            # first the state the epoch started with (so that a loader drawing from the global RNGs
            # rebuilds the same order), then, once the consumed batches are skipped, the saved one.
            if rng_to_restore is not None and not skip:
                _set_rng_state(rng_to_restore)
                rng_to_restore = None
            if skip and loop_state.get("epoch_rng") is not None:
                _set_rng_state(loop_state["epoch_rng"])
            epoch_rng = _rng_state() if checkpoint is not None else None
            _start_epoch(train_loader, seed, epoch)
            iterator = _epoch_iterator(train_loader, skip, str(checkpoint))
            if rng_to_restore is not None:
                _set_rng_state(rng_to_restore)
                rng_to_restore = None
            batch_in_epoch, skip = (skip, 0)
            stopped = False
            for batch in iterator:
                batch = to_device(batch, device)
                lr = float(optimizer.param_groups[0]["lr"])
                optimizer.zero_grad(set_to_none=True)
                with _device.autocast(device):
                    loss, metrics = _unpack_step(step_fn(model, batch), step + 1)
                loss_value = loss.detach().float().item()
                if world > 1:  # every process sees the same (averaged) numbers, and stops together
                    loss_value, metrics = _average_metrics(loss_value, metrics, world, device)
                if not math.isfinite(loss_value):
                    raise FloatingPointError(f"the loss is {loss_value} at step {step + 1} (epoch {epoch + 1}): "
                                             "training diverged; try a lower learning rate or clip_grad")
                if scaler is not None:
                    scaler.scale(loss).backward()
                    if world > 1:
                        _average_gradients(model, world)
                    if clip_grad is not None:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    if world > 1:
                        _average_gradients(model, world)
                    if clip_grad is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
                    optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                batch_in_epoch += 1
                last_lr = lr
                window.add({"train_loss": loss_value, **metrics})
                # the history record of a step shows the lr that step used
                if log_every is not None and step % log_every == 0:
                    rec = flush()
                    if bar is None:
                        say(f"step {step}" + (f"/{total}" if total else "") + f" (epoch {epoch + 1}): {_fmt(rec)}")
                    else:
                        bar.set_postfix(loss=f"{rec['train_loss']:.4g}", lr=f"{lr:.2e}", refresh=False)
                if bar is not None:
                    bar.update(1)
                if eval_fn is not None and eval_every is not None and step % eval_every == 0:
                    evaluate()
                if checkpoint_every is not None and step % checkpoint_every == 0:
                    save()
                if max_steps is not None and step >= max_steps:
                    stopped = True
                    break
            if batch_in_epoch == 0 and not stopped:
                raise ValueError(f"train_loader yielded no batches in epoch {epoch + 1}")
            epoch_complete = not stopped or (n_batches is not None and batch_in_epoch >= n_batches)
            if not epoch_complete:
                break
            if window:
                flush()
            if eval_fn is not None and last_eval_step != step:
                evaluate()
            epoch += 1
            batch_in_epoch = 0
            save()
        # training is over: checkpoint the final state, then (outside the checkpoint, so that a
        # resumed run stays identical to an uninterrupted one) close the window and evaluate once more
        save()
        if window:
            flush()
        if eval_fn is not None and last_eval_step != step and step > 0:
            evaluate()
    finally:
        if bar is not None:
            bar.close()
    if step > 0:
        elapsed = time.perf_counter() - start_time
        if bar is None and (log_every is not None):
            say(f"done: {step} steps, {epoch} epochs complete, {elapsed:.1f} s this call")
    return history
