"""Learning-rate schedules, per optimizer step (not per epoch): factories of
``torch.optim.lr_scheduler.LambdaLR`` and the pure functions behind them."""
from __future__ import annotations

import math

import torch

from lib.validate import check_int, check_probability

__all__ = ["transformer_lr", "transformer_schedule", "warmup_cosine_factor", "warmup_cosine", "check_optimizer"]


def check_optimizer(optimizer) -> torch.optim.Optimizer:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return optimizer


def transformer_lr(step: int, d_model: int, warmup_steps: int) -> float:
    """The schedule of "Attention Is All You Need" (section 5.3):
    ``d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``, with ``step`` counted from 1.
    It rises linearly for ``warmup_steps`` steps, peaks at ``step == warmup_steps`` and then
    decays as ``1/sqrt(step)``."""
    check_int("step", step, 1)
    check_int("d_model", d_model, 1)
    check_int("warmup_steps", warmup_steps, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def transformer_schedule(optimizer: torch.optim.Optimizer, d_model: int,
                         warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` whose factor for the k-th optimizer step (k = 1, 2, ...) is
    ``transformer_lr(k, d_model, warmup_steps)``. Give the optimizer ``lr=1.0`` to get the
    paper's values (any other base lr scales them)."""
    check_optimizer(optimizer)
    check_int("d_model", d_model, 1)
    check_int("warmup_steps", warmup_steps, 1)

    def factor(index: int) -> float:  # LambdaLR passes 0 before the first step
        return transformer_lr(index + 1, d_model, warmup_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base lr at step ``step`` (counted from 1): linear warm-up ``step/warmup``
    up to 1 at ``step == warmup_steps``, then a half cosine down to ``min_ratio`` at
    ``step == total_steps``, and ``min_ratio`` after that."""
    check_int("step", step, 1)
    _check_warmup_cosine(warmup_steps, total_steps, min_ratio)
    if step <= warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _check_warmup_cosine(warmup_steps, total_steps, min_ratio) -> None:
    check_int("warmup_steps", warmup_steps, 0)
    check_int("total_steps", total_steps, 1)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must be larger than warmup_steps ({warmup_steps})")
    check_probability("min_ratio", min_ratio)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR``: linear warm-up, then cosine decay to ``min_ratio * base_lr`` at
    ``total_steps`` (see ``warmup_cosine_factor``)."""
    check_optimizer(optimizer)
    _check_warmup_cosine(warmup_steps, total_steps, min_ratio)
    w, t, m = int(warmup_steps), int(total_steps), float(min_ratio)

    def factor(index: int) -> float:
        return warmup_cosine_factor(index + 1, w, t, m)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
