"""Trains a tiny regression model with ``lib.train.fit``; run by tests/lib/train/test_train_distributed.py,
under ``torchrun --nproc_per_node=2`` (data-parallel) or as one process (the reference).

Every rank writes ``rank<r>.pt`` with its final parameters, its history and ``device.summary()``.
"""
import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from lib import device, train


def dataset():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def model(dropout: float):
    torch.manual_seed(100 + device.rank())   # different on every rank: fit must start from rank 0's
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(16, 1))


def step_fn(model, batch):
    x, y = batch
    loss = F.mse_loss(model(x), y)
    return loss, {"rank": float(device.rank())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--checkpoint")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()

    device.setup(seed=0, cpu_threads=1)
    net = model(args.dropout)
    loader = train.make_loader(dataset(), batch_size=4, shuffle=True, seed=3)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    history = train.fit(net, loader, optimizer=opt, step_fn=step_fn, epochs=None, max_steps=args.steps,
                        log_every=1, checkpoint=args.checkpoint, resume=args.resume, progress=False)
    torch.save({"state": net.state_dict(), "history": history.to_dict(), "summary": device.summary(),
                "batches_per_epoch": len(loader)}, Path(args.out) / f"rank{device.rank()}.pt")


if __name__ == "__main__":
    main()
