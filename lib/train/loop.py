"""``fit``: the one training loop.

What ``fit`` does on every step: move the batch to the device (``to_device``), compute the
loss under the course's precision policy (``lib.device.precision(device, model)``: bfloat16 autocast on a
GPU, and on a CPU with native bfloat16 for models wide enough to gain from it; float32 elsewhere), backpropagate (through a
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

How the code is laid out: ``LoopState`` holds everything the loop changes (and a checkpoint
saves); ``_Trainer`` holds what stays fixed during a call and does one step, one evaluation,
one checkpoint, one epoch; ``fit`` checks its arguments, builds both and runs the epochs.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from lib import device as _device
from lib.train.checkpoint import CheckpointError, make_payload, read_checkpoint, write_checkpoint
from lib.train.distributed import average_gradients, average_metrics, broadcast_model
from lib.train.history import History, MetricWindow, scalar
from lib.train.loaders import epoch_iterator, start_epoch, to_device
from lib.train.progress import Progress, show_bar
from lib.train.rng import rng_state, set_rng_state
from lib.train.schedules import check_optimizer
from lib.validate import check_callable, check_float, check_int

__all__ = ["fit", "LoopState"]


# --------------------------------------------------------------------------------------------
# The state of the loop
# --------------------------------------------------------------------------------------------

@dataclass
class LoopState:
    """Everything ``fit`` changes while it runs, and so everything a checkpoint must hold to resume."""

    seed: int                         # the data order of epoch e is a function of (seed, e)
    lr: float                         # the lr the latest step used (what a history record shows)
    step: int = 0                     # optimizer steps done, counting those before a resume
    epoch: int = 0                    # complete epochs
    batch_in_epoch: int = 0           # batches of the current epoch trained on
    skip: int = 0                     # batches of the current epoch a resumed run must skip
    last_eval_step: int = -1
    history: History = field(default_factory=History)
    window: MetricWindow = field(default_factory=MetricWindow)  # training metrics since the last record
    epoch_rng: dict | None = None     # the random states at the start of the current epoch
    resume_epoch_rng: dict | None = None  # from a checkpoint: those of the interrupted epoch
    resume_rng: dict | None = None    # from a checkpoint: the random states when it was written
    saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch_in_epoch) of the last checkpoint

    def done(self, epochs: int | None, max_steps: int | None) -> bool:
        return (max_steps is not None and self.step >= max_steps) or (epochs is not None and self.epoch >= epochs)

    def record(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Close the averaging window into a history record at this step (merging ``extra``)."""
        records = self.history.records
        if records and records[-1]["step"] == self.step and not self.window:
            rec = records[-1]
        else:
            rec = {"step": self.step, "epoch": self.epoch + 1, "lr": self.lr}
            rec.update(self.window.flush())
            records.append(rec)
        if extra:
            rec.update(extra)
        return rec

    def checkpoint_entry(self, world: int) -> dict[str, Any]:
        """The checkpoint's ``loop`` entry (step, epoch and history are top-level entries)."""
        return {"batch_in_epoch": self.batch_in_epoch, "window": self.window.state(), "seed": self.seed,
                "lr": self.lr, "last_eval_step": self.last_eval_step, "epoch_rng": self.epoch_rng,
                "world_size": world}

    @classmethod
    def from_checkpoint(cls, payload: Mapping[str, Any], rank: int, default_lr: float) -> "LoopState":
        loop = payload["loop"]
        mine = loop["rank_rng"][rank] if loop.get("world_size", 1) > 1 else None
        skip = loop["batch_in_epoch"]
        return cls(seed=loop["seed"], lr=loop.get("lr", default_lr), step=payload["step"], epoch=payload["epoch"],
                   batch_in_epoch=skip, skip=skip, last_eval_step=loop.get("last_eval_step", -1),
                   history=History.from_dict(payload["history"]), window=MetricWindow(loop["window"]),
                   resume_epoch_rng=mine["epoch_rng"] if mine else loop.get("epoch_rng"),
                   resume_rng=mine["rng"] if mine else payload["rng"],
                   saved_at=(payload["step"], payload["epoch"], skip))


# --------------------------------------------------------------------------------------------
# One step, one evaluation, one checkpoint, one epoch
# --------------------------------------------------------------------------------------------

@dataclass
class _Trainer:
    """What stays fixed during one ``fit`` call, and the parts of the loop."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    precision: _device.Precision
    step_fn: Callable
    eval_fn: Callable | None
    clip_grad: float | None
    device: torch.device
    checkpoint: str | os.PathLike | None
    max_steps: int | None
    eval_every: int | None
    checkpoint_every: int | None
    log_every: int | None
    world: int
    rank: int
    progress: Progress

    def begin_epoch(self, s: LoopState, loader: Iterable) -> Iterator:
        """Re-seed the loader for this epoch and return its iterator (past ``s.skip`` batches).

        The random states are restored at the point of the loop where they were saved: before
        the epoch's iterator exists for a checkpoint between epochs; for one inside an epoch,
        first the state the epoch started with (so that a loader drawing from the global RNGs
        rebuilds the same order), then, once the consumed batches are skipped, the saved one."""
        if s.resume_rng is not None and not s.skip:
            set_rng_state(s.resume_rng)
            s.resume_rng = None
        if s.skip and s.resume_epoch_rng is not None:
            set_rng_state(s.resume_epoch_rng)
        s.epoch_rng = rng_state() if self.checkpoint is not None else None
        start_epoch(loader, s.seed, s.epoch)
        iterator = epoch_iterator(loader, s.skip, str(self.checkpoint))
        if s.resume_rng is not None:
            set_rng_state(s.resume_rng)
            s.resume_rng = None
        s.batch_in_epoch, s.skip = s.skip, 0
        return iterator

    def train_step(self, s: LoopState, batch: Any) -> None:
        """Forward, backward (scaled, averaged over processes, clipped), optimizer and scheduler step."""
        batch = to_device(batch, self.device)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.autocast():
            loss, metrics = _unpack_step(self.step_fn(self.model, batch), s.step + 1)
        loss_value = loss.detach().float().item()
        if self.world > 1:  # every process sees the same (averaged) numbers, and stops together
            loss_value, metrics = average_metrics(loss_value, metrics, self.world, self.device)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"the loss is {loss_value} at step {s.step + 1} (epoch {s.epoch + 1}): "
                                     "training diverged; try a lower learning rate or clip_grad")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.world > 1:
            average_gradients(self.model, self.world)
        if self.clip_grad is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        s.step += 1
        s.batch_in_epoch += 1
        s.lr = lr
        s.window.add({"train_loss": loss_value, **metrics})
        if self.log_every is not None and s.step % self.log_every == 0:
            self.progress.logged(s.step, s.epoch, s.record())
        self.progress.stepped()
        if self.eval_every is not None and s.step % self.eval_every == 0:
            self.evaluate(s)
        if self.checkpoint_every is not None and s.step % self.checkpoint_every == 0:
            self.save(s)

    def evaluate(self, s: LoopState) -> None:
        """``eval_fn`` in eval mode without grad; its metrics go to the history as ``eval_*``."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.eval_fn(self.model)
        finally:
            self.model.train(was_training)
        if not isinstance(out, Mapping):
            raise TypeError(f"eval_fn must return a dict of metrics, got {type(out).__name__}")
        metrics = {}
        for k, v in out.items():
            if not isinstance(k, str):
                raise TypeError(f"eval_fn's metric names must be str, got {k!r}")
            metrics[k if k.startswith("eval_") else f"eval_{k}"] = scalar(k, v)
        s.record(metrics)
        s.last_eval_step = s.step
        self.progress.evaluated(s.step, s.epoch, metrics)

    def save(self, s: LoopState) -> None:
        """Write the checkpoint (rank 0, with every rank's random states), unless this point is saved."""
        where = (s.step, s.epoch, s.batch_in_epoch)
        if self.checkpoint is None or s.saved_at == where:
            return
        loop = s.checkpoint_entry(self.world)
        if self.world > 1:
            # every process's random states, so that each resumes its own dropout stream
            states = [None] * self.world
            torch.distributed.all_gather_object(states, {"rng": rng_state(), "epoch_rng": s.epoch_rng})
            loop["rank_rng"] = states
        if self.rank == 0:
            extra = {STEP_STATE: self.step_fn.state_dict()} if _stateful(self.step_fn) else None
            payload = make_payload(self.model, self.optimizer, self.scheduler, self.scaler, step=s.step,
                                   epoch=s.epoch, history=s.history, extra=extra, rng=True, loop=loop)
            write_checkpoint(self.checkpoint, payload)
        if self.world > 1:
            torch.distributed.barrier()  # the file exists before any process goes on
        s.saved_at = where

    def run_epoch(self, s: LoopState, loader: Iterable, n_batches: int | None) -> bool:
        """Train on (the rest of) one epoch; False if ``max_steps`` stopped it before its end."""
        stopped = False
        for batch in self.begin_epoch(s, loader):
            self.train_step(s, batch)
            if self.max_steps is not None and s.step >= self.max_steps:
                stopped = True
                break
        if s.batch_in_epoch == 0 and not stopped:
            raise ValueError(f"train_loader yielded no batches in epoch {s.epoch + 1}")
        if stopped and not (n_batches is not None and s.batch_in_epoch >= n_batches):
            return False
        if s.window:
            s.record()
        if self.eval_fn is not None and s.last_eval_step != s.step:
            self.evaluate(s)
        s.epoch += 1
        s.batch_in_epoch = 0
        self.save(s)
        return True

    def finish(self, s: LoopState) -> None:
        """Checkpoint the final state, then (outside the checkpoint, so that a resumed run stays
        identical to an uninterrupted one) close the window and evaluate once more."""
        self.save(s)
        if s.window:
            s.record()
        if self.eval_fn is not None and s.last_eval_step != s.step and s.step > 0:
            self.evaluate(s)


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
        clean[k] = scalar(k, v)
    return loss, clean



#: the checkpoint's ``extra`` entry that holds a stateful step function's state
STEP_STATE = "step_state"


def _stateful(step_fn) -> bool:
    """A step function that carries state from one step to the next (Transformer-XL's memory): an
    object with ``state_dict()`` (tensors and plain containers) and ``load_state_dict(state)``."""
    return callable(getattr(step_fn, "state_dict", None)) and callable(getattr(step_fn, "load_state_dict", None))


def _resume(path, model, optimizer, scheduler, scaler, seed: int, world: int, rank: int,
            step_fn=None) -> LoopState:
    """Load the checkpoint at ``path`` into the model, optimizer, scheduler and scaler (and a stateful
    ``step_fn``); its loop state."""
    payload = read_checkpoint(path)
    loop = payload.get("loop")
    if not loop:
        raise CheckpointError(f"{path} was not written by fit() (no loop state), so it cannot be resumed")
    if (scheduler is None) != (payload["scheduler"] is None):
        raise CheckpointError(f"{path} was written {'with' if payload['scheduler'] is not None else 'without'} "
                              f"a scheduler, but this call has {'one' if scheduler is not None else 'none'}")
    try:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(payload["scheduler"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot resume from {path}: it was written for another model, optimizer "
                              f"or scheduler ({e}); delete it or pass resume=False") from e
    if scaler is not None and payload.get("scaler") is not None:
        scaler.load_state_dict(payload["scaler"])
    if _stateful(step_fn):
        extra = payload.get("extra") or {}
        if STEP_STATE not in extra:
            raise CheckpointError(f"{path} holds no state of the step function (written by a run whose step kept "
                                  "none), so this stateful step cannot resume from it; delete it or pass resume=False")
        step_fn.load_state_dict(extra[STEP_STATE])
    saved_world = loop.get("world_size", 1)
    if saved_world != world:
        raise CheckpointError(f"{path} was written by a run with {saved_world} process(es), this one has "
                              f"{world}: resume with the same number of processes, or pass resume=False")
    if loop["seed"] != seed:
        warnings.warn(f"resuming with the checkpoint's data seed {loop['seed']} (this call would have used {seed})",
                      stacklevel=3)
    return LoopState.from_checkpoint(payload, rank, default_lr=float(optimizer.param_groups[0]["lr"]))


def _check_arguments(model, train_loader, optimizer, step_fn, epochs, max_steps, scheduler, clip_grad, eval_fn,
                     eval_every, checkpoint, checkpoint_every, resume, progress, log_every, seed) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_optimizer(optimizer)
    check_callable("step_fn", step_fn)
    check_callable("eval_fn", eval_fn, allow_none=True)
    if not isinstance(train_loader, Iterable) or isinstance(train_loader, (str, bytes)):
        raise TypeError(f"train_loader must be an iterable of batches, got {type(train_loader).__name__}")
    if isinstance(train_loader, Iterator):
        raise TypeError("train_loader is a one-shot iterator; pass something that can be iterated once "
                        "per epoch (a DataLoader or a list of batches)")
    check_int("epochs", epochs, 1, allow_none=True)
    check_int("max_steps", max_steps, 1, allow_none=True)
    if epochs is None and max_steps is None:
        raise ValueError("give epochs or max_steps (both are None, so training would never stop)")
    check_float("clip_grad", clip_grad, positive=True, allow_none=True)
    for name, value in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every), ("log_every", log_every)):
        check_int(name, value, 1, allow_none=True)
    check_int("seed", seed, 0, allow_none=True)
    if eval_every is not None and eval_fn is None:
        raise ValueError("eval_every was given but eval_fn is None")
    if checkpoint_every is not None and checkpoint is None:
        raise ValueError("checkpoint_every was given but checkpoint (a path) is None")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint=<path>")
    if progress not in (None, True, False, "summary"):
        raise TypeError(f"progress must be None, True, False or 'summary', got {progress!r}")
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler must have a step() method, got {type(scheduler).__name__}")


def _num_batches(train_loader) -> int | None:
    try:
        n = len(train_loader)  # type: ignore[arg-type]
    except TypeError:
        return None
    if n == 0:
        raise ValueError("train_loader yields no batches (is the dataset smaller than batch_size with drop_last=True?)")
    return n


def _total_steps(n_batches: int | None, epochs: int | None, max_steps: int | None) -> int | None:
    total = n_batches * epochs if n_batches is not None and epochs is not None else None
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)
    return total


# --------------------------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------------------------

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
                          (the batch is already on the device). A step that carries state to the next
                          (Transformer-XL's memory) is an object with ``state_dict()`` and
                          ``load_state_dict(state)`` as well: its state goes into every checkpoint and a
                          resumed run starts from it.
    epochs, max_steps     stop after ``epochs`` passes over the data or ``max_steps`` optimizer steps
                          in total (counting steps done before a resume), whichever comes first.
                          ``epochs=None`` means "until max_steps".
    clip_grad             maximum global gradient norm; None disables clipping.
    eval_fn, eval_every   ``eval_fn(model) -> {name: float}`` runs (in eval mode, without grad, in float32) at the
                          end of every epoch, every ``eval_every`` steps, and once at the end of
                          training if the last step had none; keys are stored as ``eval_<name>``.
    device                where to train (the model is moved there); default: the model's device.
    checkpoint, checkpoint_every, resume
                          write a checkpoint to ``checkpoint`` every ``checkpoint_every`` steps, at each
                          epoch end and when training stops. ``resume=True`` continues from it if the
                          file exists (and starts afresh if not); see the module docstring for why the
                          result equals an uninterrupted run.
    progress, log_every   a tqdm bar (None = automatic, see ``lib.train.progress.show_bar``), or a text line every
                          ``log_every`` steps; ``"summary"``: a bar where one is shown automatically, else
                          one line at the end (steps, time, last metrics) instead of a line per log. ``log_every`` is also how often the averaged training
                          metrics are written to the history (and at every epoch end / evaluation);
                          ``log_every=None`` writes history records only at epoch ends / evaluations.
    seed                  decides the data order of each epoch; default: the loader's ``make_loader``
                          seed, else ``torch.initial_seed()``.
    """
    _check_arguments(model, train_loader, optimizer, step_fn, epochs, max_steps, scheduler, clip_grad, eval_fn,
                     eval_every, checkpoint, checkpoint_every, resume, progress, log_every, seed)
    device = torch.device(device) if device is not None else _model_device(model)
    model.to(device)
    world, rank = _device.world_size(), _device.rank()
    if world > 1:
        broadcast_model(model)
    precision = _device.precision(device, model)
    scaler = torch.amp.GradScaler(device.type) if precision.grad_scaler else None
    if seed is None:
        seed = getattr(train_loader, "course_seed", None)
        seed = int(seed) if seed is not None else int(torch.initial_seed() % 2**63)
    n_batches = _num_batches(train_loader)

    if resume and Path(checkpoint).is_file():
        state = _resume(checkpoint, model, optimizer, scheduler, scaler, seed, world, rank, step_fn)
    else:
        state = LoopState(seed=seed, lr=float(optimizer.param_groups[0]["lr"]))

    with Progress(bar=show_bar(progress) and not state.done(epochs, max_steps), initial=state.step,
                  total=_total_steps(n_batches, epochs, max_steps), log_every=log_every,
                  quiet=progress is False, rank=rank, summary=progress == "summary") as report:
        trainer = _Trainer(model, optimizer, scheduler, scaler, precision, step_fn, eval_fn, clip_grad, device, checkpoint,
                           max_steps, eval_every, checkpoint_every, log_every, world, rank, report)
        if state.step > 0 or state.skip > 0:
            report.say(f"resumed from {checkpoint} at step {state.step} (epoch {state.epoch + 1}, batch {state.skip})")
        model.train()
        start_time = time.perf_counter()
        while not state.done(epochs, max_steps):
            if not trainer.run_epoch(state, train_loader, n_batches):
                break  # max_steps stopped it inside an epoch
        trainer.finish(state)
    report.finished(state.step, state.epoch, time.perf_counter() - start_time, precision.name)
    return state.history
