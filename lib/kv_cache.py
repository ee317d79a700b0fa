"""The key/value cache of incremental decoding, one for every decoder of the course (chapter 3's
encoder-decoder, GPT, BART, T5).

Generating token ``t`` needs the keys and values of every position before it. Without a cache
each step recomputes them for the whole prefix; with one, each layer keeps what it projected
and each step projects only the new tokens:

``KVCache(num_layers)``
    ``.layers``: one dict per decoder layer, ``<name>_k`` and ``<name>_v`` of shape
    ``(B, H, T, d_head)`` (``self`` for the self-attention, ``cross`` for the encoder output);
    ``.length``: target positions cached so far; ``.reorder(index)``: keep or reorder batch rows
    (beam search); ``.tgt_padding``: the target padding seen so far, when there was one.
``update(layer, name, k, v)``
    self-attention: the cached keys and values with the new ones appended (the cache is
    extended in place); without a cache (``layer`` None), the new ones.
``memo(layer, name, compute)``
    cross-attention: the keys and values of the encoder output, computed once (``compute()``)
    and then read from the cache.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["KVCache", "update", "memo"]

KV = tuple[torch.Tensor, torch.Tensor]


class KVCache:
    """What incremental decoding remembers: per decoder layer, the projected self-attention keys
    and values of every target token so far, and the cross-attention keys/values of the memory."""

    def __init__(self, num_layers: int):
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(num_layers)]
        self.tgt_padding: torch.Tensor | None = None   # (B, T_so_far) bool, only if one was given

    @property
    def length(self) -> int:
        if not self.layers or "self_k" not in self.layers[0]:
            return 0
        return int(self.layers[0]["self_k"].shape[2])

    def reorder(self, index: torch.Tensor) -> "KVCache":
        """Keep/reorder batch rows (``index`` 1-D LongTensor), in place; returns self."""
        for layer in self.layers:
            for key in list(layer):
                layer[key] = layer[key].index_select(0, index)
        if self.tgt_padding is not None:
            self.tgt_padding = self.tgt_padding.index_select(0, index)
        return self

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, length={self.length})"


def update(layer: dict | None, name: str, k: torch.Tensor, v: torch.Tensor) -> KV:
    """The keys and values of every position so far: ``layer``'s ``<name>_k``/``<name>_v`` with
    ``k``, ``v`` (the new positions, ``(B, H, t, d_head)``) appended along time, stored back."""
    if layer is None:
        return k, v
    if f"{name}_k" in layer:
        k = torch.cat([layer[f"{name}_k"], k], dim=2)
        v = torch.cat([layer[f"{name}_v"], v], dim=2)
    layer[f"{name}_k"], layer[f"{name}_v"] = k, v
    return k, v


def memo(layer: dict | None, name: str, compute: Callable[[], KV]) -> KV:
    """Keys and values that do not grow (the encoder output's): ``compute()`` once, then the cache."""
    if layer is not None and f"{name}_k" in layer:
        return layer[f"{name}_k"], layer[f"{name}_v"]
    k, v = compute()
    if layer is not None:
        layer[f"{name}_k"], layer[f"{name}_v"] = k, v
    return k, v
