"""Transformer-XL: segment-level recurrence and relative positional attention (Dai et al., 2019).

A vanilla Transformer language model sees a fixed window of ``L`` tokens. Trained on
fixed-length segments cut out of a long text, it suffers from *context fragmentation*: the
first tokens of a segment are predicted with almost no context, and nothing flows across
segment boundaries. Evaluated with the longest context it can take, it has to slide its
window one token at a time and recompute all ``L`` positions for every new prediction.
Transformer-XL fixes both:

* **Segment-level recurrence.** Each layer caches the hidden states of the previous segment
  (the *memory*, ``mem_len`` positions, gradient stopped); the next segment's queries attend
  over ``[memory; current segment]``. Evaluation moves a whole segment at a time.
* **Relative positional attention.** Absolute positions would be ambiguous across segments
  (position 0 of every segment would look the same), so the score of query ``i`` and key
  ``j`` depends only on the distance ``i - j``::

      A_ij = (E_i W_q + u) . (E_j W_kE)          content:  (a) + (c)
           + (E_i W_q + v) . (R_{i-j} W_kR)      position: (b) + (d)

  with ``R`` the sinusoid table of the *distances*, ``W_kE`` / ``W_kR`` separate key
  projections for content and position, and ``u`` / ``v`` learned global biases (one vector
  per head) replacing the query terms ``U_i W_q`` of the absolute-position expansion.

Read top to bottom::

    relative_distances      the distances the table R is built for (klen .. 0, or .. -qlen + 1)
    relative_sinusoid       R: [sin(d w), cos(d w)] for each distance d
    rel_shift               the trick that turns one (T, P) product into every (i, j) pair
    RelativeMultiHeadAttention   the four-term score (and XLNet's segment term, optional)
    RelativeLayer           post-LN attention + feed-forward (shared with lib.models.xlnet)
    update_memory           [memory; new states][-mem_len:], detached
    TransformerXLConfig, TransformerXL   the character/word language model with memory
    batchify, evaluate_with_memory, evaluate_sliding_window   the two ways to evaluate it

Shapes are batch-first: hidden states ``(B, T, d_model)``, memories a list with one
``(B, M, d_model)`` tensor per layer (the *input* of that layer in the previous segments).
Masks are boolean, True = may attend, ``(T, M + T)`` or ``(B, T, M + T)``.

``transformers`` 5.x no longer ships Transformer-XL, but its XLNet keeps the same relative
attention and memory; with ``attn_type="uni"`` (causal) and no permutation, ``XLNetModel`` is
a Transformer-XL with XLNet's layer layout (post-LN, no embedding scale, no adaptive
softmax). :func:`hf_transformer_xl_table` maps our weights to it and :func:`load_hf_transformer_xl`
copies them in, leaving out XLNet's parts a Transformer-XL does not have; the tests check equality with
memory over several segments. The layer layout here is therefore XLNet's: ``LN(x + Attn(x))``
then ``LN(y + FF(y))``.

Explained in chapters/09_transformer_xl_xlnet.ipynb.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config import ModelConfig
from lib.attention import look_ahead_mask, masked_softmax, split_heads
from lib.layers import ACTIVATIONS, num_parameters
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.validate import check_int, check_tensor, check_token_ids

__all__ = ["relative_distances", "relative_sinusoid", "rel_shift", "RelativeMultiHeadAttention",
           "RelativeLayer", "update_memory", "TransformerXLConfig", "TransformerXL",
           "hf_transformer_xl_table", "load_hf_transformer_xl", "batchify", "evaluate_with_memory", "evaluate_sliding_window"]


# ----------------------------------------------------------------------------- positions

def relative_distances(q_len: int, k_len: int, bidirectional: bool = False) -> torch.Tensor:
    """The distances ``i - j`` the table R covers, largest first (float32).

    Causal (Transformer-XL): ``k_len, k_len - 1, ..., 0`` (``k_len + 1`` rows; the query at the
    end of a ``k_len``-long context is ``k_len - 1`` from the first key, the extra row keeps
    :func:`rel_shift` a plain reshape). Bidirectional (XLNet): ``k_len, ..., -q_len + 1``
    (``k_len + q_len`` rows: keys may lie after the query)."""
    check_int("q_len", q_len, 1)
    check_int("k_len", k_len, q_len)
    end = -q_len if bidirectional else -1
    return torch.arange(k_len, end, -1, dtype=torch.float32)


def relative_sinusoid(distances: torch.Tensor, d_model: int) -> torch.Tensor:
    """``R (P, d_model)``: ``[sin(d * w_0..), cos(d * w_0..)]`` with ``w_k = 10000^(-2k/d_model)``.

    The sines fill the first half and the cosines the second (the layout of the original
    Transformer-XL and XLNet code; chapter 3's table interleaves them). Only ``R W_kR`` is
    used, so the layout matters for copying weights, not for what the model can learn."""
    check_tensor("distances", distances, dtype="float", dim=1)
    check_int("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(f"d_model must be even for the (sin, cos) halves, got {d_model}")
    inv_freq = 1.0 / torch.pow(10000.0, torch.arange(0, d_model, 2.0, device=distances.device) / d_model)
    angles = distances[:, None] * inv_freq[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def rel_shift(x: torch.Tensor, k_len: int) -> torch.Tensor:
    """``x (..., T, P)`` scored against the distances of :func:`relative_distances` ->
    ``(..., T, k_len)`` with ``out[..., i, j] = x[..., i, j + T - i]``.

    Row ``i`` of ``x`` holds query ``i`` against every distance; column ``p`` is distance
    ``k_len - p``. Query ``i`` sits at position ``k_len - T + i`` of the context, so key ``j`` is
    at distance ``k_len - T + i - j``, column ``j + T - i``: each row must move left by
    ``T - i``. Reading the ``(T, P)`` block as ``(P, T)``, dropping its first row and reading
    the rest as ``(T, P - 1)`` shifts row ``i`` by exactly that, with no gather."""
    check_tensor("x", x, dtype="float", min_dim=2)
    *lead, T, P = x.shape
    check_int("k_len", k_len, 1, P - 1)
    if P - 1 < k_len or P - T > k_len:
        raise ValueError(f"x has {P} distance columns for {T} queries; k_len={k_len} needs between "
                         f"k_len + 1 and k_len + T columns")
    x = x.reshape(*lead, P, T)[..., 1:, :].reshape(*lead, T, P - 1)
    return x[..., :k_len]


# ----------------------------------------------------------------------------- attention

class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention with Transformer-XL's relative score.

    Parameters (per head ``h``): ``w_q`` (W_q), ``w_k`` (W_kE, the content keys), ``w_v``,
    ``w_r`` (W_kR, the position keys, applied to R), ``w_o``, and the biases ``u`` and ``v``
    ``(n_head, d_head)``. With ``segments=True`` (XLNet) also ``s`` and ``seg_embed
    (2, n_head, d_head)``: a fifth term ``(q_i + s) . seg_embed[i and j in different segments]``.
    No projection has a bias (the biases of the score are u, v and s)."""

    def __init__(self, d_model: int, n_head: int, d_head: int, dropout: float = 0.0, segments: bool = False):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("n_head", n_head, 1)
        check_int("d_head", d_head, 1)
        self.n_head, self.d_head = n_head, d_head
        self.scale = 1.0 / math.sqrt(d_head)
        inner = n_head * d_head
        self.w_q = nn.Linear(d_model, inner, bias=False)
        self.w_k = nn.Linear(d_model, inner, bias=False)
        self.w_v = nn.Linear(d_model, inner, bias=False)
        self.w_r = nn.Linear(d_model, inner, bias=False)
        self.w_o = nn.Linear(inner, d_model, bias=False)
        self.u = nn.Parameter(torch.zeros(n_head, d_head))
        self.v = nn.Parameter(torch.zeros(n_head, d_head))
        if segments:
            self.s = nn.Parameter(torch.zeros(n_head, d_head))
            self.seg_embed = nn.Parameter(torch.zeros(2, n_head, d_head))
        else:
            self.s = self.seg_embed = None
        self.drop = nn.Dropout(dropout)

    def scores(self, q: torch.Tensor, k: torch.Tensor, r: torch.Tensor,
               different_segment: torch.Tensor | None = None) -> torch.Tensor:
        """The scaled score ``(B, H, T, K)`` from projected heads: ``q (B, H, T, dh)``,
        ``k (B, H, K, dh)``, ``r (H, P, dh)`` (the position keys ``R W_kR``), and for XLNet
        ``different_segment (B, T, K)`` bool."""
        ac = (q + self.u[:, None]) @ k.transpose(-2, -1)                     # (a) + (c)
        bd = rel_shift((q + self.v[:, None]) @ r.transpose(-2, -1), k.shape[-2])   # (b) + (d)
        score = ac + bd
        if different_segment is not None:
            if self.seg_embed is None:
                raise ValueError("segment ids were given to an attention built with segments=False")
            ef = torch.einsum("bhid,shd->bhis", q + self.s[:, None], self.seg_embed)   # (B, H, T, 2)
            idx = different_segment.long()[:, None].expand(-1, self.n_head, -1, -1)
            score = score + torch.gather(ef, -1, idx)
        return score * self.scale

    def forward(self, x: torch.Tensor, context: torch.Tensor, pos: torch.Tensor,
                mask: torch.Tensor | None = None, different_segment: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries from ``x (B, T, D)``, keys and values from ``context (B, K, D)`` (memory and
        segment; its last ``T`` rows are the positions of ``x``), ``pos (P, D)`` the table R of
        :func:`relative_sinusoid`. Returns the output ``(B, T, D)`` (before the residual) and
        the attention weights ``(B, H, T, K)``."""
        q, k, v = (split_heads(t, self.n_head) for t in (self.w_q(x), self.w_k(context), self.w_v(context)))
        r = self.w_r(pos).unflatten(-1, (self.n_head, self.d_head)).transpose(0, 1)     # (H, P, dh)
        score = self.scores(q, k, r, different_segment)
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        weights = self.drop(masked_softmax(score, mask))
        out = (weights @ v).transpose(-3, -2).flatten(-2)                    # (B, T, H*dh)
        return self.w_o(out), weights


class RelativeLayer(nn.Module):
    """``y = LN(x + Attn(x, context))``, then ``LN(y + W_2 act(W_1 y))`` (post-LN, as XLNet)."""

    def __init__(self, d_model: int, n_head: int, d_head: int, d_inner: int, dropout: float = 0.0,
                 activation: str = "gelu", layer_norm_eps: float = 1e-12, segments: bool = False):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.attn = RelativeMultiHeadAttention(d_model, n_head, d_head, dropout, segments)
        self.ln_attn = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.ff_1 = nn.Linear(d_model, d_inner)
        self.ff_2 = nn.Linear(d_inner, d_model)
        self.ln_ff = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.act = ACTIVATIONS[activation]
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, context: torch.Tensor, pos: torch.Tensor,
                mask: torch.Tensor | None = None, different_segment: torch.Tensor | None = None) -> torch.Tensor:
        a, _ = self.attn(x, context, pos, mask, different_segment)
        x = self.ln_attn(x + self.drop(a))
        y = self.ff_2(self.drop(self.act(self.ff_1(x))))
        return self.ln_ff(x + self.drop(y))


def update_memory(memory: torch.Tensor | None, states: torch.Tensor, mem_len: int) -> torch.Tensor | None:
    """The next segment's memory: the last ``mem_len`` positions of ``[memory; states]``,
    **detached** (no gradient flows into earlier segments). ``mem_len = 0``: no memory."""
    check_int("mem_len", mem_len, 0)
    if mem_len == 0:
        return None
    cat = states if memory is None else torch.cat([memory, states], dim=1)
    return cat[:, -mem_len:].detach()


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) for matrices, embeddings and the u / v / s biases; LayerNorm 1 / 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, RelativeMultiHeadAttention):
        for p in (module.u, module.v, module.s, module.seg_embed):
            if p is not None:
                nn.init.normal_(p, std=std)


# ----------------------------------------------------------------------------- the model

@dataclass
class TransformerXLConfig(ModelConfig):
    """Hyper-parameters of the language model (a character-level default)."""
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    d_head: int | None = None            # None: d_model // n_head
    d_inner: int = 512
    dropout: float = 0.0
    mem_len: int = 64                    # memory kept per layer (the default; forward can override)
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "d_inner"):
            check_int(f"{type(self).__name__}.{name}", getattr(self, name), 1)
        check_int(f"{type(self).__name__}.mem_len", self.mem_len, 0)
        if self.d_head is None:
            if self.d_model % self.n_head:
                raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
            self.d_head = self.d_model // self.n_head
        check_int(f"{type(self).__name__}.d_head", self.d_head, 1)
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (sinusoid halves), got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")


class TransformerXL(nn.Module):
    """Causal language model with memory: ``forward(idx, mems) -> (logits, loss, new_mems)``."""

    def __init__(self, cfg: TransformerXLConfig):
        super().__init__()
        if not isinstance(cfg, TransformerXLConfig):
            raise TypeError(f"cfg must be a TransformerXLConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            RelativeLayer(cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.activation,
                          cfg.layer_norm_eps) for _ in range(cfg.n_layer))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)          # tied weight, own bias
        self.apply(init_weights)
        self.lm_head.weight = self.word_embedding.weight

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude=[self.word_embedding, self.lm_head] if exclude_embeddings else ())

    def _check(self, idx: torch.Tensor, mems) -> int:
        check_token_ids("idx", idx, self.cfg.vocab_size)
        if mems is None:
            return 0
        if len(mems) != len(self.layers):
            raise ValueError(f"mems must hold one tensor per layer ({len(self.layers)}), got {len(mems)}")
        m = mems[0].shape[1]
        for i, mem in enumerate(mems):
            if mem.dim() != 3 or mem.shape[0] != idx.shape[0] or mem.shape[1] != m or mem.shape[2] != self.cfg.d_model:
                raise ValueError(f"mems[{i}] must be (batch, mem, d_model)=({idx.shape[0]}, {m}, {self.cfg.d_model}), "
                                 f"got {tuple(mem.shape)}")
        return m

    def hidden_states(self, idx: torch.Tensor, mems: list[torch.Tensor] | None = None,
                      mem_len: int | None = None, mask: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """``idx (B, T)`` after memories ``(B, M, D)`` per layer -> last layer ``(B, T, D)`` and the
        new memories (``mem_len`` of them, default ``cfg.mem_len``; None when it is 0).

        ``mask (T, M + T)`` replaces the causal mask (the tests use it to express recurrence as
        one pass with a band)."""
        M = self._check(idx, mems)
        T = idx.shape[1]
        mem_len = self.cfg.mem_len if mem_len is None else check_int("mem_len", mem_len, 0)
        if mask is None:
            mask = look_ahead_mask(T, device=idx.device, num_keys=M + T)
        elif tuple(mask.shape[-2:]) != (T, M + T) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool (..., {T}, {M + T}), got {mask.dtype} {tuple(mask.shape)}")
        pos = self.drop(relative_sinusoid(relative_distances(T, M + T).to(idx.device), self.cfg.d_model))
        h = self.drop(self.word_embedding(idx))
        new_mems = []
        for i, layer in enumerate(self.layers):
            mem = None if mems is None else mems[i]
            new_mems.append(update_memory(mem, h, mem_len))
            context = h if mem is None else torch.cat([mem, h], dim=1)
            h = layer(h, context, pos, mask)
        return self.drop(h), (None if mem_len == 0 else new_mems)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                mems: list[torch.Tensor] | None = None, mem_len: int | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None]:
        """``(logits (B, T, V), mean cross-entropy or None, new memories)``."""
        h, new_mems = self.hidden_states(idx, mems, mem_len)
        logits = self.lm_head(h)
        loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss, new_mems


# ----------------------------------------------------------------------------- evaluation

def batchify(ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A long 1-D token stream -> ``(batch_size, N // batch_size)``: ``batch_size`` contiguous
    streams side by side (the remainder is dropped), so that segment ``k + 1`` of every row
    continues segment ``k`` of the same row, as the memory assumes."""
    check_tensor("ids", ids, dtype=torch.long, dim=1)
    check_int("batch_size", batch_size, 1, len(ids) // 2)
    n = len(ids) // batch_size
    return ids[: n * batch_size].view(batch_size, n)


@torch.no_grad()
def evaluate_with_memory(model: TransformerXL, stream: torch.Tensor, seg_len: int, mem_len: int) -> dict:
    """Mean next-token loss over ``stream (B, N)``, read one segment of ``seg_len`` at a time with
    ``mem_len`` positions of memory (0: every segment starts from nothing). Every token but the
    first of each row is predicted once. Returns ``{"loss", "tokens", "seconds", "loss_by_offset",
    "segment_losses"}``: the mean loss at each offset ``0 .. seg_len - 1`` inside a segment, and the mean
    loss of every row's every segment, ``(B, segments)`` (the items a paired comparison of two memories
    reads: the same characters, predicted with each)."""
    check_tensor("stream", stream, dtype=torch.long, dim=2, what="(batch, time)")
    check_int("seg_len", seg_len, 1)
    check_int("mem_len", mem_len, 0)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    total, count, mems = 0.0, 0, None
    by_offset = torch.zeros(seg_len, dtype=torch.float64)          # summed loss per offset in a segment
    seen = torch.zeros(seg_len, dtype=torch.float64)
    segments = []
    for s in range(0, stream.shape[1] - 1, seg_len):
        y = stream[:, s + 1:s + seg_len + 1]
        x = stream[:, s:s + y.shape[1]]
        logits, _, mems = model(x, mems=mems, mem_len=mem_len)
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        total += losses.sum().item()
        count += y.numel()
        by_offset[:y.shape[1]] += losses.sum(0).double().cpu()
        seen[:y.shape[1]] += y.shape[0]
        segments.append(losses.mean(1).double().cpu())
    model.train(was_training)
    return {"loss": total / count, "tokens": count, "seconds": time.perf_counter() - start,
            "loss_by_offset": (by_offset / seen.clamp(min=1)).tolist(), "segment_losses": torch.stack(segments, 1)}


@torch.no_grad()
def evaluate_sliding_window(model: TransformerXL, ids: torch.Tensor, context: int, positions: int) -> dict:
    """The vanilla evaluation: predict each of ``positions`` tokens of the 1-D ``ids`` (after the
    first ``context``) from a fresh window of the ``context`` tokens before it, recomputing the
    whole window for every token, no memory. Returns ``{"loss", "tokens", "seconds"}``."""
    check_tensor("ids", ids, dtype=torch.long, dim=1)
    check_int("context", context, 1)
    check_int("positions", positions, 1, len(ids) - context)
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    total = 0.0
    for t in range(context, context + positions):
        logits, _, _ = model(ids[None, t - context:t], mem_len=0)
        total += F.cross_entropy(logits[:, -1], ids[t:t + 1], reduction="sum").item()
    model.train(was_training)
    return {"loss": total / positions, "tokens": positions, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- reference

def _per_head(t: torch.Tensor) -> torch.Tensor:
    """HF's ``(d_model, n_head, d_head)`` input projection -> ``nn.Linear`` weight ``(H*dh, d_model)``."""
    return t.flatten(1).t()


def _out(t: torch.Tensor) -> torch.Tensor:
    """HF's output projection ``o (d_model, n_head, d_head)`` -> ``nn.Linear`` weight ``(d_model, H*dh)``."""
    return t.flatten(1)


def layer_table(ours: str, theirs: str, segments: bool) -> dict[str, str | Source]:
    """One :class:`RelativeLayer` <- one ``XLNetLayer``."""
    t: dict[str, str | Source] = {}
    for mine, hf in (("w_q", "q"), ("w_k", "k"), ("w_v", "v"), ("w_r", "r")):
        t[f"{ours}.attn.{mine}.weight"] = Source(f"{theirs}.rel_attn.{hf}", _per_head)
    t[f"{ours}.attn.w_o.weight"] = Source(f"{theirs}.rel_attn.o", _out)
    t[f"{ours}.attn.u"] = f"{theirs}.rel_attn.r_w_bias"
    t[f"{ours}.attn.v"] = f"{theirs}.rel_attn.r_r_bias"
    if segments:
        t[f"{ours}.attn.s"] = f"{theirs}.rel_attn.r_s_bias"
        t[f"{ours}.attn.seg_embed"] = f"{theirs}.rel_attn.seg_embed"
    for p in ("weight", "bias"):
        t[f"{ours}.ln_attn.{p}"] = f"{theirs}.rel_attn.layer_norm.{p}"
        t[f"{ours}.ff_1.{p}"] = f"{theirs}.ff.layer_1.{p}"
        t[f"{ours}.ff_2.{p}"] = f"{theirs}.ff.layer_2.{p}"
        t[f"{ours}.ln_ff.{p}"] = f"{theirs}.ff.layer_norm.{p}"
    return t


def hf_transformer_xl_table(cfg: TransformerXLConfig) -> dict[str, str | Source]:
    """Our :class:`TransformerXL` <- ``XLNetLMHeadModel`` with ``attn_type="uni"`` (``transformers``
    no longer has a Transformer-XL). Not in the table: the tied output weights, and XLNet's parts a
    Transformer-XL does not have (every ``r_s_bias``, ``seg_embed`` and ``mask_emb``)."""
    t: dict[str, str | Source] = {"word_embedding.weight": "transformer.word_embedding.weight",
                                  "lm_head.bias": "lm_loss.bias"}
    for i in range(cfg.n_layer):
        t |= layer_table(f"layers.{i}", f"transformer.layer.{i}", segments=False)
    return t


def load_hf_transformer_xl(ours: TransformerXL, theirs: nn.Module | Mapping[str, torch.Tensor]) -> TransformerXL:
    """Copy a Hugging Face ``XLNetLMHeadModel`` made with ``attn_type="uni"`` (a model or its state
    dict, same sizes) into our :class:`TransformerXL`, every weight used once except XLNet's
    segment and permutation parts (``r_s_bias``, ``seg_embed``, ``mask_emb``), which a
    Transformer-XL does not have; our ``lm_head.weight`` and their ``lm_loss.weight`` are the word
    embedding (tied). Returns ``ours``."""
    if not isinstance(ours, TransformerXL):
        raise TypeError(f"ours must be our TransformerXL, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    xlnet_only = [k for k in state if k.endswith(("r_s_bias", "seg_embed", "mask_emb"))]
    return copy_weights(ours, state, hf_transformer_xl_table(ours.cfg), tied=["lm_head.weight"],
                        tied_theirs=[k for k in ("lm_loss.weight",) if k in state], ignore_theirs=xlnet_only)
