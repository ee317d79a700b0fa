"""Expert parallelism checked on CPU processes: :func:`launch` runs this module under
``torchrun --nproc_per_node=W`` (Gloo) and returns what each process computed; :func:`reference`
computes the same with one process holding every expert. Used by tests/lib/models/test_switch.py and
chapter 12.

Every process builds the same full Switch layer (same seed), keeps the router and its own
``E / W`` experts (:meth:`ExpertParallelSwitchFFN.from_full`), takes its ``B / W`` sequences
of the same global batch, runs forward and backward, and writes ``rank<r>.pt`` with its
outputs, its input gradient, its parameter gradients and the routing statistics.

Explained in chapters/12_switch.ipynb.
"""
import argparse
import tempfile
from pathlib import Path

import torch

from lib import device
from lib.models.switch import ExpertParallelSwitchFFN, SwitchFFN
from lib.train.distributed import torchrun

D_MODEL, D_FF, EXPERTS, BATCH, TIME = 16, 32, 4, 4, 12


def problem(capacity_factor: float):
    """The full layer, the global batch and the fixed weights of the test loss."""
    torch.manual_seed(0)
    layer = SwitchFFN(D_MODEL, D_FF, EXPERTS, capacity_factor, init_scale=1.0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, TIME, D_MODEL, generator=g)
    w = torch.randn(BATCH, TIME, D_MODEL, generator=g)
    return layer, x, w


def loss_fn(y, w, layer, world):
    # a sum over tokens splits over processes as it is; the load-balancing loss is a mean over
    # the groups (sequences), so each process adds its own groups' mean / world
    return (y * w).sum() + layer.stats.aux_loss / world


def reference(capacity_factor: float) -> dict:
    layer, x, w = problem(capacity_factor)
    x.requires_grad_(True)
    y = layer(x)
    loss_fn(y, w, layer, 1).backward()
    return {"y": y.detach(), "x_grad": x.grad, "grads": {k: p.grad for k, p in layer.named_parameters()},
            "dropped": layer.stats.dropped_fraction}


def launch(processes: int = 2, capacity_factor: float = 1.0, timeout: float = 300) -> list[dict]:
    """Run the check in ``processes`` Gloo processes (``torchrun --standalone``) and return each
    rank's saved dict, in rank order. Raises ``RuntimeError`` with torchrun's output if it fails."""
    if processes < 1 or EXPERTS % processes or BATCH % processes:
        raise ValueError(f"processes must divide the {EXPERTS} experts and the batch of {BATCH}, got {processes}")
    with tempfile.TemporaryDirectory() as out:
        torchrun(__name__, "--out", out, "--capacity-factor", str(capacity_factor), processes=processes,
                 timeout=timeout)
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=True) for r in range(processes)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--capacity-factor", type=float, default=1.0)
    args = ap.parse_args()
    device.setup(seed=0, cpu_threads=1)
    rank, world = device.rank(), device.world_size()
    full, x, w = problem(args.capacity_factor)
    layer = ExpertParallelSwitchFFN.from_full(full)
    share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    x = x[share].clone().requires_grad_(True)
    y = layer(x)
    loss_fn(y, w[share], layer, world).backward()
    torch.save({"y": y.detach(), "x_grad": x.grad, "grads": {k: p.grad for k, p in layer.named_parameters()},
                "dropped": layer.stats.dropped_fraction, "world": world, "rank": rank,
                "summary": device.summary()}, Path(args.out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
