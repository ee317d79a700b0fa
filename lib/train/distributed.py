"""Data-parallel training under ``torchrun``, the arithmetic of ``DistributedDataParallel``
without its overlap of communication and computation: start every replica from rank 0's
weights, average the gradients after each backward pass, average the logged metrics; and
:func:`torchrun`, which starts a module or script in several local CPU processes (the tests and
chapter 12's expert-parallel check)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from lib.validate import check_int

__all__ = ["broadcast_model", "average_gradients", "average_metrics", "torchrun"]

REPO = Path(__file__).resolve().parents[2]


def torchrun(target: str | os.PathLike, *args: str, processes: int = 2, timeout: float = 300,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``target`` (a module name such as ``"tools.pretrain"``, or a script's path) under
    ``torchrun --standalone --nproc_per_node=processes`` with ``args``, on the CPU (Gloo), one thread
    per process, from the repository root and with it on ``PYTHONPATH``; ``env`` adds variables.
    Returns the finished process (its ``stdout`` and ``stderr`` as text); a non-zero exit raises
    ``RuntimeError`` with the end of both."""
    check_int("processes", processes, 1)
    run_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    run_env |= {"OMP_NUM_THREADS": "1", "COURSE_DEVICE": "cpu", "COURSE_PROGRESS": "0",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), run_env.get("PYTHONPATH", "")) if p)}
    run_env |= dict(env or {})
    script = isinstance(target, Path) or str(target).endswith(".py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
           *([str(target)] if script else ["-m", str(target)]), *map(str, args)]
    proc = subprocess.run(cmd, env=run_env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun {target} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return proc


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
