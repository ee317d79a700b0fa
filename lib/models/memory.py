"""Attention variants that change what a layer can remember: adaptive span, persistent
memory and product-key memory, plus the small character language model they are
compared in.

Adaptive attention span (Sukhbaatar et al., 2019a)
    Each head h learns a span z_h. The weight of a key at distance x = t - r behind the
    query is multiplied by the soft mask m_z(x) = clamp((R + z - x) / R, 0, 1) and the
    weights are renormalised. A penalty proportional to the sum of the spans makes every
    head pay for the context it uses, so heads that do not need a long context shrink.
Persistent memory, the "all-attention" layer (Sukhbaatar et al., 2019b)
    N learned key/value vectors per head are concatenated to the keys and values of the
    sequence, and the feed-forward block is removed: the persistent vectors take its role.
Product-key memory (Lample et al., 2019)
    A table of n² values addressed by keys that are the concatenation of two sub-keys from
    two sets of n. The exact top-k over all n² keys is found from the top-k of each half:
    k² candidates instead of n² scores.

Interface
---------
``AdaptiveSpanMask(num_heads, max_span, ramp)``: ``forward(weights)`` on causal weights
    ``(B, H, T, T)``; ``.spans()`` (the current z per head); ``.penalty()`` (sum of z over heads).
``CausalSelfAttention(d_model, num_heads, dropout, span=None, num_persistent=0)``:
    causal multi-head self-attention (``lib.attention.MultiHeadAttention``); with ``span=(max_span, ramp, init_ratio)`` the adaptive span mask
    is applied; with ``num_persistent > 0`` persistent key/value vectors are attended to.
``CharLMConfig`` / ``CharLM``: a decoder-only language model with ``attention`` one of
    ``"standard"`` (attention + FFN), ``"adaptive"`` (adaptive span + FFN),
    ``"persistent"`` (all-attention: persistent memory, no FFN). ``forward(idx, targets=None)
    -> (logits, loss)``; ``span_penalty()``; ``spans()``.
``ProductKeyMemory(d_in, d_out, n_keys, k, d_key)``: ``search(q) -> (scores, indices)``,
    ``brute_force_search(q)`` (the same over all n² keys, for checking), ``forward(x)``.

Explained in chapters/05_attention_variants.ipynb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config import ModelConfig
from lib.attention import MultiHeadAttention, look_ahead_mask
from lib.layers import PositionwiseFeedForward, layer_norm, num_parameters
from lib.validate import check_int, check_probability, check_token_ids

__all__ = ["AdaptiveSpanMask", "CausalSelfAttention", "CharLMConfig", "CharLM", "ProductKeyMemory"]


# ----------------------------------------------------------------------------- adaptive span

class AdaptiveSpanMask(nn.Module):
    """The soft span mask m_z(x) = clamp((R + z - x) / R, 0, 1), one learnable z per head.

    z is stored as a fraction of ``max_span`` in ``[0, 1]`` (``span_ratio``), so that one
    learning rate suits every ``max_span``; ``spans() = span_ratio * max_span``.

    The ratio is kept in ``[0, 1]`` by clamping its *value* at the start of every ``mask``
    call (as the authors' code clamps it after each optimizer step), not by a clamp inside the
    computation: a clamp there has zero gradient outside ``[0, 1]``, so a span that the penalty
    pushed just below 0 would receive no gradient from the loss again and stay at 0 for good.
    """

    def __init__(self, num_heads: int, max_span: int, ramp: int, init_ratio: float = 0.0):
        super().__init__()
        check_int("max_span", max_span, 1)
        check_int("ramp", ramp, 1)
        check_probability("init_ratio", init_ratio)
        self.max_span, self.ramp = max_span, ramp
        self.span_ratio = nn.Parameter(torch.full((num_heads, 1, 1), float(init_ratio)))

    def _keep_in_range(self) -> None:
        with torch.no_grad():
            self.span_ratio.clamp_(0.0, 1.0)

    def spans(self) -> torch.Tensor:
        """The current span z of every head, in tokens, shape ``(num_heads,)``."""
        self._keep_in_range()
        return (self.span_ratio * self.max_span).flatten()

    def mask(self, distance: torch.Tensor) -> torch.Tensor:
        """m_z(x) for a tensor of distances x, per head: ``(H, *distance.shape)``."""
        self._keep_in_range()
        z = self.span_ratio * self.max_span
        return ((self.ramp + z - distance) / self.ramp).clamp(0, 1)

    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        """Apply the mask to causal attention weights ``(B, H, T, T)`` and renormalise."""
        T = weights.shape[-1]
        pos = torch.arange(T, device=weights.device)
        distance = (pos[:, None] - pos[None, :]).clamp(min=0).to(weights.dtype)  # x = t - r
        masked = weights * self.mask(distance)
        return masked / (masked.sum(-1, keepdim=True) + 1e-8)

    def penalty(self) -> torch.Tensor:
        """Sum of the spans of all heads (in tokens): the quantity the span loss penalises."""
        return self.spans().sum()


# ----------------------------------------------------------------------------- the layer

class CausalSelfAttention(nn.Module):
    """Causal self-attention through ``lib.attention.MultiHeadAttention`` (``.mha``), optionally
    with an adaptive span (it reweights the attention) or persistent memory (extra keys/values).

    Persistent vectors are keys/values that every query may attend to, at no position: they
    are never masked and carry no positional information.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0,
                 span: tuple[int, int, float] | None = None, num_persistent: int = 0):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, num_heads, dropout)
        self.span = AdaptiveSpanMask(num_heads, *span) if span is not None else None
        self.num_persistent = num_persistent
        if num_persistent:
            # Scaled like the keys/values of the sequence so that they start out comparable.
            d_head = d_model // num_heads
            self.persistent_k = nn.Parameter(torch.randn(num_heads, num_persistent, d_head) / math.sqrt(d_head))
            self.persistent_v = nn.Parameter(torch.randn(num_heads, num_persistent, d_head) / math.sqrt(d_head))

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        if not self.num_persistent:
            out, weights = self.mha(x, x, x, is_causal=True, reweight=self.span)
        else:
            B, T, N = x.shape[0], x.shape[1], self.num_persistent
            k, v = self.mha.project_kv(x, x)
            k = torch.cat([self.persistent_k.expand(B, -1, -1, -1), k], dim=2)
            v = torch.cat([self.persistent_v.expand(B, -1, -1, -1), v], dim=2)
            mask = torch.cat([torch.ones(T, N, dtype=torch.bool, device=x.device), look_ahead_mask(T, x.device)], dim=1)
            out, weights = self.mha.attend_projected(x, k, v, mask, reweight=self.span)
        return (out, weights) if return_weights else out


# ----------------------------------------------------------------------------- language model

@dataclass
class CharLMConfig(ModelConfig):
    vocab_size: int
    block_size: int = 128
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1
    attention: str = "standard"       # "standard" | "adaptive" | "persistent"
    max_span: int = 128               # adaptive: the largest span a head may learn
    span_ramp: int = 16               # adaptive: R, the width of the soft edge
    span_init: float = 0.0            # adaptive: initial z / max_span
    num_persistent: int = 0           # persistent: vectors per head

    def __post_init__(self):
        if self.attention not in ("standard", "adaptive", "persistent"):
            raise ValueError(f"attention must be 'standard', 'adaptive' or 'persistent', got {self.attention!r}")
        if self.attention == "persistent" and self.num_persistent < 1:
            raise ValueError("attention='persistent' needs num_persistent >= 1")
        if self.attention == "adaptive" and self.max_span > self.block_size:
            raise ValueError(f"max_span={self.max_span} exceeds block_size={self.block_size}")


class Block(nn.Module):
    """A pre-LN decoder block. The all-attention variant has no feed-forward sublayer."""

    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        span = (cfg.max_span, cfg.span_ramp, cfg.span_init) if cfg.attention == "adaptive" else None
        persistent = cfg.num_persistent if cfg.attention == "persistent" else 0
        self.norm1 = layer_norm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.num_heads, cfg.dropout, span, persistent)
        self.ffn = None
        if cfg.attention != "persistent":
            self.norm2 = layer_norm(cfg.d_model)
            self.ffn = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, activation="gelu")
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm1(x)))
        if self.ffn is not None:
            x = x + self.drop(self.ffn(self.norm2(x)))
        return x


class CharLM(nn.Module):
    """A small decoder-only character language model (learned positions, pre-LN blocks)."""

    def __init__(self, cfg: CharLMConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = layer_norm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Small initial weights (as in GPT-2): with tied embeddings, N(0, 1) would give huge logits.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        check_token_ids("idx", idx, self.cfg.vocab_size)
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.cfg.block_size}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def span_masks(self) -> list[AdaptiveSpanMask]:
        return [b.attn.span for b in self.blocks if b.attn.span is not None]

    def spans(self) -> torch.Tensor:
        """``(num_layers, num_heads)`` learned spans in tokens (adaptive models only)."""
        masks = self.span_masks()
        if not masks:
            raise ValueError("this model has no adaptive span (attention != 'adaptive')")
        return torch.stack([m.spans() for m in masks]).detach()

    def span_penalty(self) -> torch.Tensor:
        """Mean span over all heads (tokens); 0 for models without an adaptive span."""
        masks = self.span_masks()
        if not masks:
            return torch.zeros(())
        return torch.stack([m.penalty() for m in masks]).sum() / (len(masks) * self.cfg.num_heads)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters; ``exclude_embeddings=True`` leaves out the token table (tied to the
        output layer) and the position table."""
        return num_parameters(self, (self.tok, self.pos, self.head) if exclude_embeddings else ())


# ----------------------------------------------------------------------------- product keys

class ProductKeyMemory(nn.Module):
    """A memory of ``n_keys²`` values addressed through product keys.

    A query q is split into halves q¹, q². The full key of slot (i, j) is the
    concatenation [c¹_i ; c²_j] of two sub-keys, so its score is q·k = q¹·c¹_i + q²·c²_j.
    The best k slots overall are among the k × k pairs of the best k sub-keys of each half
    (a slot outside them is beaten by k slots that share its other half), so the search is
    exact with n + n + k² scores instead of n².
    """

    def __init__(self, d_in: int, d_out: int, n_keys: int = 128, k: int = 8, d_key: int = 64):
        super().__init__()
        if d_key % 2:
            raise ValueError(f"d_key must be even (it is split in two halves), got {d_key}")
        if not 1 <= k <= n_keys:
            raise ValueError(f"k must be in [1, n_keys={n_keys}], got {k}")
        self.n_keys, self.k, self.d_key = n_keys, k, d_key
        self.query = nn.Linear(d_in, d_key)
        half = d_key // 2
        self.sub_keys = nn.Parameter(torch.randn(2, n_keys, half) / math.sqrt(half))
        self.values = nn.Embedding(n_keys * n_keys, d_out)
        nn.init.normal_(self.values.weight, std=d_out ** -0.5)

    def _half_scores(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if q.dim() != 2 or q.shape[-1] != self.d_key:
            raise ValueError(f"queries must be (N, d_key={self.d_key}), got {tuple(q.shape)}")
        q1, q2 = q.chunk(2, dim=-1)
        return q1 @ self.sub_keys[0].T, q2 @ self.sub_keys[1].T          # (N, n) each

    def search(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k over the n² product keys: ``(scores (N, k), slot indices (N, k))``."""
        s1, s2 = self._half_scores(q)
        v1, i1 = s1.topk(self.k, dim=-1)                                  # (N, k)
        v2, i2 = s2.topk(self.k, dim=-1)
        candidates = (v1[:, :, None] + v2[:, None, :]).flatten(1)        # (N, k*k)
        scores, flat = candidates.topk(self.k, dim=-1)
        rows = i1.gather(1, torch.div(flat, self.k, rounding_mode="floor"))
        cols = i2.gather(1, flat % self.k)
        return scores, rows * self.n_keys + cols

    def brute_force_search(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same answer by scoring all n² keys (for tests and the speed comparison)."""
        s1, s2 = self._half_scores(q)
        all_scores = (s1[:, :, None] + s2[:, None, :]).flatten(1)        # (N, n*n)
        return all_scores.topk(self.k, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., d_in) -> (..., d_out)``: softmax over the k best slots, weighted sum of values."""
        shape = x.shape[:-1]
        scores, idx = self.search(self.query(x.reshape(-1, x.shape[-1])))
        weights = torch.softmax(scores, dim=-1)
        out = (weights[..., None] * self.values(idx)).sum(-2)
        return out.reshape(*shape, -1)
