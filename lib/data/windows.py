"""Random windows of a token stream: the training batches of a character- or token-level language model.

A language model trained on one long text (Tiny Shakespeare in chapters 5, 7, 9 and 12) reads
windows cut at random places: ``random_windows(ids, block_size + 1, count, seed)`` gives ``count``
of them, and a window ``w`` is the input ``w[:-1]`` with its next-token targets ``w[1:]``.
The starts come from a generator seeded with ``seed``, so a run sees the same windows every time.
"""
from __future__ import annotations

import torch

from lib.validate import check_int, check_tensor

__all__ = ["random_windows"]


def random_windows(ids: torch.Tensor, length: int, count: int, seed: int) -> torch.Tensor:
    """``(count, length)`` windows of consecutive ``ids`` (a 1-D integer tensor), each starting at a
    position drawn uniformly from ``0 .. len(ids) - length - 1`` with a generator seeded with ``seed``."""
    check_tensor("ids", ids, dtype="int", dim=1, what="a 1-D stream of token ids")
    length = check_int("length", length, 1)
    count = check_int("count", count, 0)
    seed = check_int("seed", seed)
    if len(ids) <= length:
        raise ValueError(f"ids holds {len(ids)} tokens: too few for a window of {length} and a choice of start")
    starts = torch.randint(0, len(ids) - length, (count,), generator=torch.Generator().manual_seed(seed))
    return ids[starts[:, None] + torch.arange(length)]
