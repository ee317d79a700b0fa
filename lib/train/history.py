"""The metrics of a run (``History``) and the running averages of the training metrics
between two history records (``MetricWindow``)."""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import torch

__all__ = ["History", "MetricWindow", "scalar"]


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


def scalar(name: str, value: Any) -> float | int | str:
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


class MetricWindow:
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

