"""Attention, from the first seq2seq papers to the Transformer.

One convention everywhere in the course: a **mask is a boolean tensor that is True
where attention is allowed** (the convention of ``F.scaled_dot_product_attention``).
Masks broadcast against the score tensor ``(..., T_query, T_key)``. A position that is
masked gets *exactly* zero weight, and a query whose keys are all masked gets an
all-zero weight row (so a zero context vector), never NaN.

Scores (query ``s``, keys ``h_i``):

* dot (Luong):            ``s · h_i``
* general (Luong):        ``s · W h_i``
* additive (Bahdanau):    ``v · tanh(W_q s + W_k h_i)``
* scaled dot-product:     ``q · k_i / sqrt(d_k)`` (Vaswani et al.)

Explained in chapters/01_seq2seq_attention.ipynb, chapters/02_bahdanau_imdb.ipynb, chapters/03_transformer.ipynb.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.validate import check_callable, check_tensor

__all__ = [
    "padding_mask", "padding_mask_from_tokens", "look_ahead_mask", "combine_masks",
    "masked_softmax", "attend", "dot_scores", "DotAttention", "GeneralAttention",
    "AdditiveAttention", "scaled_dot_product_attention", "split_heads", "merge_heads",
    "MultiHeadAttention",
]


# ----------------------------------------------------------------------------- checks

def _check_float(name: str, x: torch.Tensor, min_dim: int) -> None:
    check_tensor(name, x, dtype="float", min_dim=min_dim)


def _check_mask(mask: torch.Tensor | None, scores_shape: torch.Size) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
                        "convert a 0/1 mask with mask.bool()")
    try:
        torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
                         f"scores of shape {tuple(scores_shape)} (…, T_query, T_key)") from None
    return mask


# ----------------------------------------------------------------------------- masks

def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """``(B,)`` lengths -> ``(B, max_len)`` bool, True at real tokens, False at padding."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {tuple(lengths.shape)}")
    if (lengths < 0).any():
        raise ValueError("lengths must be non-negative")
    max_len = int(lengths.max()) if max_len is None else max_len
    if lengths.numel() and int(lengths.max()) > max_len:
        raise ValueError(f"a length ({int(lengths.max())}) exceeds max_len={max_len}")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def padding_mask_from_tokens(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(B, S)`` token ids -> ``(B, S)`` bool, True where the token is not ``pad_id``."""
    if tokens.dtype.is_floating_point:
        raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    return tokens != pad_id


def look_ahead_mask(size: int, device: torch.device | str | None = None, num_keys: int | None = None) -> torch.Tensor:
    """``(size, size)`` bool, True on and below the diagonal: position i sees 0..i.

    With ``num_keys`` (>= ``size``): ``(size, num_keys)`` for queries that are the *last* ``size``
    of ``num_keys`` positions (decoding with a KV cache): query i sees keys 0..num_keys - size + i."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    num_keys = size if num_keys is None else num_keys
    if num_keys < size:
        raise ValueError(f"num_keys={num_keys} must be >= size={size} (the queries are the last positions)")
    return torch.ones(size, num_keys, dtype=torch.bool, device=device).tril(diagonal=num_keys - size)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the given masks (None entries are skipped); broadcasting applies."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out & m)
    return out


# ----------------------------------------------------------------------------- softmax

def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """Softmax over ``dim`` where masked entries get exactly 0 and all-masked rows are all 0."""
    mask = _check_mask(mask, scores.shape)
    if mask is None:
        return torch.softmax(scores, dim=dim)
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(filled, dim=dim)
    # exp(min - max) underflows to 0 already; the product makes fully-masked rows 0 too.
    return weights * mask.to(weights.dtype)


def attend(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Context = weighted sum of values: ``(..., Tq, Tk) @ (..., Tk, Dv) -> (..., Tq, Dv)``."""
    return weights @ values


# ----------------------------------------------------------------------------- Luong / Bahdanau

def dot_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Luong dot scores. ``query (B, D)`` or ``(B, Tq, D)``; ``keys (B, S, D)`` -> ``(B, S)`` or ``(B, Tq, S)``."""
    _check_float("query", query, 2)
    _check_float("keys", keys, 3)
    if query.shape[-1] != keys.shape[-1]:
        raise ValueError(f"query size {query.shape[-1]} != key size {keys.shape[-1]} "
                         f"(query {tuple(query.shape)}, keys {tuple(keys.shape)}); use GeneralAttention "
                         "or AdditiveAttention when they differ")
    if query.shape[0] != keys.shape[0]:
        raise ValueError(f"batch sizes differ: query {query.shape[0]}, keys {keys.shape[0]}")
    if query.dim() == 2:
        return torch.einsum("bd,bsd->bs", query, keys)
    return query @ keys.transpose(-2, -1)


class _ScoreAttention(nn.Module):
    """Shared forward: scores -> masked softmax -> weighted sum of the keys (or given values)."""

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None,
                values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``query (B, Dq)`` or ``(B, Tq, Dq)``, ``keys (B, S, Dk)``, ``mask (B, S)`` bool.

        Returns ``(context, weights)``: ``(B, Dv)``/``(B, Tq, Dv)`` and ``(B, S)``/``(B, Tq, S)``.
        """
        scores = self.scores(query, keys)
        if mask is not None and mask.dim() == 2 and scores.dim() == 3:
            mask = mask[:, None, :]
        weights = masked_softmax(scores, mask)
        values = keys if values is None else values
        if weights.dim() == 2:
            return torch.einsum("bs,bsd->bd", weights, values), weights
        return weights @ values, weights


class DotAttention(_ScoreAttention):
    """Luong et al. (2015) "dot": score(s, h_i) = s · h_i. No parameters."""

    def scores(self, query, keys):
        return dot_scores(query, keys)


class GeneralAttention(_ScoreAttention):
    """Luong et al. (2015) "general": score(s, h_i) = s · W h_i."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.W = nn.Linear(key_dim, query_dim, bias=False)

    def scores(self, query, keys):
        _check_float("keys", keys, 3)
        if keys.shape[-1] != self.W.in_features:
            raise ValueError(f"keys have size {keys.shape[-1]}, expected key_dim={self.W.in_features}")
        return dot_scores(query, self.W(keys))


class AdditiveAttention(_ScoreAttention):
    """Bahdanau et al. (2015): score(s, h_i) = v · tanh(W_q s + W_k h_i).

    ``W_q`` (query_dim -> hidden) and ``W_k`` (key_dim -> hidden) have no bias;
    ``v`` (hidden -> 1) has none either, so the score is exactly the formula above
    (the Keras reference adds biases; they do not change what the layer can express
    much and make the hand check less clean).
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int, bias: bool = False):
        super().__init__()
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=bias)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def scores(self, query, keys):
        _check_float("query", query, 2)
        _check_float("keys", keys, 3)
        if query.shape[-1] != self.W_q.in_features:
            raise ValueError(f"query has size {query.shape[-1]}, expected query_dim={self.W_q.in_features} "
                             f"(query shape {tuple(query.shape)})")
        if keys.shape[-1] != self.W_k.in_features:
            raise ValueError(f"keys have size {keys.shape[-1]}, expected key_dim={self.W_k.in_features} "
                             f"(keys shape {tuple(keys.shape)})")
        if query.shape[0] != keys.shape[0]:
            raise ValueError(f"batch sizes differ: query {query.shape[0]}, keys {keys.shape[0]}")
        q = self.W_q(query)                       # (B, H) or (B, Tq, H)
        k = self.W_k(keys)                        # (B, S, H)
        if q.dim() == 2:
            return self.v(torch.tanh(q[:, None, :] + k)).squeeze(-1)            # (B, S)
        return self.v(torch.tanh(q[:, :, None, :] + k[:, None, :, :])).squeeze(-1)  # (B, Tq, S)


# ----------------------------------------------------------------------------- Transformer

def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 training: bool = False, reweight=None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / sqrt(d_k)) v, returning ``(output, weights)``.

    ``q (..., Tq, d_k)``, ``k (..., Tk, d_k)``, ``v (..., Tk, d_v)``; ``mask`` bool,
    broadcastable to ``(..., Tq, Tk)``, True = may attend. ``reweight``: a function applied to
    the weights after the softmax and before dropout (e.g. an adaptive-span mask).
    """
    check_callable("reweight", reweight, allow_none=True)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_float(name, x, 2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last dimension d_k: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = masked_softmax(scores, mask)
    if reweight is not None:
        weights = reweight(weights)
    if dropout_p > 0.0 and training:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(B, T, d_model) -> (B, num_heads, T, d_model // num_heads)``."""
    B, T, D = x.shape
    if D % num_heads:
        raise ValueError(f"d_model={D} is not divisible by num_heads={num_heads}")
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, d_head) -> (B, T, H * d_head)`` (inverse of ``split_heads``)."""
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017), batch-first.

    ``forward(query, key, value, mask)`` with ``query (B, Tq, d_model)``,
    ``key/value (B, Tk, d_model)``, ``mask`` bool broadcastable to ``(B, H, Tq, Tk)``
    (a ``(B, Tk)`` padding mask or a ``(Tq, Tk)`` look-ahead mask both work).
    Returns ``(output (B, Tq, d_model), weights (B, H, Tq, Tk))``.

    ``is_causal=True`` adds the look-ahead mask (the queries are the last ``Tq`` of the ``Tk``
    positions, so it also holds for one new query over a KV cache). ``reweight(weights)`` changes
    the weights after the softmax, before dropout (an adaptive span, ``lib.models.memory``).

    ``fused=True`` calls ``F.scaled_dot_product_attention`` (flash / memory-efficient
    kernels on GPU); it does not return weights.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                fused: bool = False, is_causal: bool = False,
                reweight=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``key_padding_mask (B, Tk)`` True at real tokens; ``mask`` broadcastable to (B, H, Tq, Tk)."""
        k, v = self.project_kv(key, value)
        if key_padding_mask is not None:
            if key_padding_mask.shape != key.shape[:2]:
                raise ValueError(f"key_padding_mask must be (batch, T_key)={tuple(key.shape[:2])}, "
                                 f"got {tuple(key_padding_mask.shape)}")
            mask = combine_masks(mask, key_padding_mask[:, None, None, :])
        return self.attend_projected(query, k, v, mask, fused=fused, is_causal=is_causal, reweight=reweight)

    # -- incremental decoding (KV cache) ------------------------------------------------
    # ``forward`` above is ``attend_projected(query, *project_kv(key, value), mask)``.
    # A decoder that generates one token at a time keeps the projected keys/values of
    # the tokens it has already seen and only projects the new ones.

    def project_kv(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project and split into heads: ``key/value (B, Tk, d_model) -> k, v (B, H, Tk, d_head)``."""
        for name, x in (("key", key), ("value", value)):
            _check_float(name, x, 3)
            if x.dim() != 3 or x.shape[-1] != self.d_model:
                raise ValueError(f"{name} must be (batch, time, d_model={self.d_model}), got {tuple(x.shape)}")
        return split_heads(self.w_k(key), self.num_heads), split_heads(self.w_v(value), self.num_heads)

    def attend_projected(self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor | None = None, fused: bool = False, is_causal: bool = False,
                         reweight=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of ``query (B, Tq, d_model)`` over already projected ``k, v (B, H, Tk, d_head)``.

        ``mask`` bool, broadcastable to ``(B, H, Tq, Tk)``, True = may attend.
        Returns ``(output (B, Tq, d_model), weights (B, H, Tq, Tk) or None when fused)``.
        """
        _check_float("query", query, 3)
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must be (batch, time, d_model={self.d_model}), got {tuple(query.shape)}")
        d_head = self.d_model // self.num_heads
        for name, x in (("k", k), ("v", v)):
            if x.dim() != 4 or x.shape[1] != self.num_heads or x.shape[-1] != d_head:
                raise ValueError(f"{name} must be (batch, heads={self.num_heads}, time, d_head={d_head}), "
                                 f"got {tuple(x.shape)}")
        return self.attend_heads(split_heads(self.w_q(query), self.num_heads), k, v, mask, fused=fused,
                                 is_causal=is_causal, reweight=reweight)

    # -- self-attention with one fused q/k/v projection (GPT-2's ``c_attn``) ------------

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention projections in one matrix product: ``x (B, T, d_model)`` ->
        ``q, k, v (B, H, T, d_head)``, equal to ``w_q(x)``, ``w_k(x)``, ``w_v(x)`` split into heads."""
        _check_float("x", x, 3)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, time, d_model={self.d_model}), got {tuple(x.shape)}")
        weight = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])
        bias = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
        q, k, v = F.linear(x, weight, bias).split(self.d_model, dim=-1)
        return split_heads(q, self.num_heads), split_heads(k, self.num_heads), split_heads(v, self.num_heads)

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                     fused: bool = False, is_causal: bool = False,
                     reweight=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of projected queries ``q (B, H, Tq, d_head)`` over ``k, v (B, H, Tk, d_head)``,
        heads merged and ``w_o`` applied (``mask``, ``is_causal``, ``reweight`` as in ``forward``).
        Returns ``(output (B, Tq, d_model), weights or None when fused)``."""
        p = self.dropout if self.training else 0.0
        if fused and is_causal and mask is None and reweight is None and q.shape[2] == k.shape[2]:
            # no explicit mask: the kernel masks the future itself, so the flash kernels can run
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.w_o(merge_heads(out)), None
        if is_causal:
            mask = combine_masks(mask, look_ahead_mask(q.shape[2], q.device, num_keys=k.shape[2]))
        if fused and reweight is not None:
            raise ValueError("reweight needs the attention weights, which fused=True never forms; use fused=False")
        if fused:
            _check_mask(mask, torch.Size((q.shape[0], self.num_heads, q.shape[2], k.shape[2])))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            weights = None
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=p, training=self.training,
                                                        reweight=reweight)
        return self.w_o(merge_heads(out)), weights
