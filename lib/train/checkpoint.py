"""Checkpoints that ``torch.load(weights_only=True)`` can read: the model, optimizer, scheduler and
grad-scaler states, the step, the history, the random states and (for ``fit``) its loop state.
Written to a temporary file beside the target and renamed, so a crash never leaves half a file."""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from lib.io import atomic_write
from lib.train.history import History
from lib.train.rng import rng_state, set_rng_state
from lib.train.schedules import check_optimizer
from lib.validate import check_int

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError", "CHECKPOINT_FORMAT",
           "make_payload", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_FORMAT = "lib.train.checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used: not a weights-only checkpoint, or not one of ours."""


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


def write_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
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
    payload = make_payload(model, optimizer, scheduler, scaler, step=step, epoch=epoch, history=history,
                       extra=extra, rng=rng)
    return write_checkpoint(path, payload)


def make_payload(model, optimizer, scheduler, scaler, *, step, epoch, history, extra, rng, loop=None) -> dict:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None:
        check_optimizer(optimizer)
    if scheduler is not None and not callable(getattr(scheduler, "state_dict", None)):
        raise TypeError(f"scheduler must have a state_dict() method, got {type(scheduler).__name__}")
    check_int("step", step, 0)
    check_int("epoch", epoch, 0)
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
        "rng": rng_state() if rng else None,
        "extra": extra,
        "loop": loop,
    }
    _check_plain(payload["history"], "history")
    _check_plain(payload["scheduler"], "scheduler state")
    return payload


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
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
    payload = read_checkpoint(path)
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
        set_rng_state(payload["rng"])
    return {"step": payload["step"], "epoch": payload["epoch"],
            "history": History.from_dict(payload["history"]) if payload.get("history") else None,
            "extra": payload.get("extra") or {}}

