"""Data-parallel training under ``torchrun``, the arithmetic of ``DistributedDataParallel``
without its overlap of communication and computation: start every replica from rank 0's
weights, average the gradients after each backward pass, average the logged metrics."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["broadcast_model", "average_gradients", "average_metrics"]


def broadcast_model(model: nn.Module) -> None:
    """Give every process rank 0's parameters and buffers (what DistributedDataParallel does at start)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            torch.distributed.broadcast(t.data, src=0)


def average_gradients(model: nn.Module, world: int) -> None:
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


def average_metrics(loss_value: float, metrics: dict[str, Any], world: int,
                    device: torch.device) -> tuple[float, dict[str, Any]]:
    """The step's loss and numeric metrics averaged over the processes (in sorted name order)."""
    names = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
    values = torch.tensor([loss_value] + [float(metrics[k]) for k in names], dtype=torch.float64,
                          device=device if device.type == "cuda" else "cpu")
    torch.distributed.all_reduce(values)
    values = (values / world).tolist()
    return values[0], {**metrics, **dict(zip(names, values[1:]))}
