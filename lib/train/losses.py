"""Per-sequence losses for scoring, shared by the chapters that compare models item by item.

A comparison paired over test items needs each item's own loss, not the batch mean that training
uses. :func:`sequence_nats` gives, for every sequence of a batch, the nats of its target tokens and
how many there are; summed over a test set they give the mean loss (``nats.sum() / counts.sum()``),
and each item's ``nats / counts.mean()`` averages to that same loss (``lib.transfer.item_verdict``
pairs them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["sequence_nats", "window_losses"]


def sequence_nats(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nats, counts)``, each of shape ``(B,)`` in float64: the summed cross-entropy of each
    sequence's target tokens under ``logits`` ``(B, T, V)`` (computed in float32 whatever their
    dtype) and the number of its targets that are not ``ignore_index``."""
    if logits.dim() != 3 or targets.dim() != 2 or logits.shape[:2] != targets.shape:
        raise ValueError(f"logits must be (B, T, V) and targets (B, T) with the same B and T, got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if targets.is_floating_point():
        raise TypeError(f"targets must hold integer ids, got {targets.dtype}")
    per_token = F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=ignore_index, reduction="none")
    return per_token.sum(1).double(), (targets != ignore_index).sum(1).double()


@torch.no_grad()
def window_losses(model: torch.nn.Module, batches, device: torch.device | str | None = None) -> list[float]:
    """The mean next-token cross-entropy (nats) of every window of ``batches`` (pairs of inputs and
    targets, ``(B, T)`` each) under a language model whose forward returns its logits first (GPT,
    Switch GPT, the character models): one number per window, in batch order, so that two models
    that read the same windows can be compared window by window (``lib.transfer.item_difference``,
    ``lib.transfer.grid_difference``). Eval mode; the model stays where it is unless ``device`` is given."""
    if device is not None:
        model.to(device)
    where = next(model.parameters()).device
    model.eval()
    out: list[float] = []
    for x, y in batches:
        logits = model(x.to(where))[0]
        nats, counts = sequence_nats(logits, y.to(where))
        out += (nats / counts).tolist()
    return out
