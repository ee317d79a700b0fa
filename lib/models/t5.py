"""T5: the Text-to-Text Transfer Transformer (Raffel et al., 2020), top to bottom.

Read in the order the paper explains it (section 2.1)::

    T5Config                  the hyper-parameters (T5-small by default)
    RMSNorm                   T5's "layer norm": rescale only, no mean subtraction, no bias
    relative_position_bucket  relative distance -> one of 32 buckets (exact when small, log-spaced)
    T5Attention               multi-head attention without 1/sqrt(d) and without biases; the
                              first layer of each stack owns the learned bucket -> bias table
    FeedForward               ReLU (T5) or gated-GELU (T5 v1.1), no biases
    EncoderLayer, DecoderLayer  pre-norm residual blocks
    Stack                     embedding -> layers -> final RMSNorm; the position bias is
                              computed ONCE from the first layer's table and added in every layer
    T5                        shared embedding, encoder stack, decoder stack, output layer

One layer, pre-norm (the residual stream itself is never normalised)::

    h = x + Dropout(SelfAttn(RMSNorm(x)))                     encoder and decoder
    h = h + Dropout(CrossAttn(RMSNorm(h), encoder output))    decoder only
    y = h + Dropout(FFN(RMSNorm(h)))

Attention scores are ``q · k + b[bucket(j - i), head]``: no division by ``sqrt(d_kv)`` (the
Mesh TensorFlow initialisation of the query projection folds it into the weights) and a
learned scalar per (bucket, head) in place of position embeddings. The encoder's buckets are
bidirectional (16 for keys before the query, 16 for keys after it), the decoder's are causal
(32 for keys before). Cross-attention has no position bias.

Interface (the encoder-decoder protocol of :mod:`lib.generate`)::

    memory = model.encode(src, src_key_padding_mask=None)         # (B, S, d_model)
    logits, cache = model.decode(tgt, memory, memory_key_padding_mask=None, cache=None)
    logits, loss = model(input_ids, labels=labels)                 # teacher forcing
    model.num_parameters(exclude_embeddings=False)

Decoding starts from ``cfg.decoder_start_id``, which is the padding id in T5 (``labels``
are shifted right with it, :meth:`T5.shift_right`). The cache is
:class:`lib.kv_cache.KVCache`: each decoder layer keeps its self-attention keys and
values and the cross-attention keys and values of the encoder output (computed once).

:func:`hf_t5_table` maps our weights to Hugging Face's ``T5ForConditionalGeneration`` and
:func:`load_hf_t5` copies them in; the tests check that the logits agree.
:func:`mask_pattern` draws the three attention patterns of the paper's Figure 3.

Explained in chapters/11_t5.ipynb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config import ModelConfig, hf_reader
from lib import kv_cache
from lib.attention import look_ahead_mask, merge_heads, split_heads
from lib.kv_cache import KVCache
from lib.layers import num_parameters
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.validate import check_bool, check_choice, check_int, check_tensor, check_token_ids

__all__ = ["T5Config", "PUBLISHED", "RMSNorm", "relative_position_bucket", "T5Attention", "FeedForward",
           "EncoderLayer", "DecoderLayer", "Stack", "T5", "hf_t5_table", "load_hf_t5",
           "mask_pattern", "PATTERNS", "COURSE_SENTINELS"]

#: the sentinel ids (``<extra_id_0>``, ...) the course's T5 models add after their tokenizer's
#: vocabulary, ``<extra_id_0>`` the very last id (the published T5 has 100 of them)
COURSE_SENTINELS = 32

FEED_FORWARD = ("relu", "gated-gelu")


@dataclass
class T5Config(ModelConfig):
    """Hyper-parameters; the defaults are T5-small (60,506,624 parameters with the tied output)."""
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64                       # width of one head; heads * d_kv need not equal d_model
    d_ff: int = 2048
    num_heads: int = 8
    num_layers: int = 6                  # encoder layers
    num_decoder_layers: int | None = None    # None: as many as the encoder
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    feed_forward: str = "relu"           # "relu" (T5) or "gated-gelu" (T5 v1.1)
    tie_word_embeddings: bool = True     # T5: output = shared embedding, decoder output scaled by d_model^-0.5
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0            # T5 starts decoding from the padding token

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_layers",
                     "relative_attention_num_buckets", "relative_attention_max_distance"):
            check_int(f"T5Config.{name}", getattr(self, name), 1)
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        check_int("T5Config.num_decoder_layers", self.num_decoder_layers, 1)
        if self.relative_attention_num_buckets < 4:
            raise ValueError("T5Config.relative_attention_num_buckets must be >= 4 (half of half of them are "
                             f"exact), got {self.relative_attention_num_buckets}")
        check_choice("T5Config.feed_forward", self.feed_forward, FEED_FORWARD)
        check_bool("T5Config.tie_word_embeddings", self.tie_word_embeddings)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"T5Config.dropout must be in [0, 1), got {self.dropout}")
        for name in ("pad_id", "eos_id", "decoder_start_id"):
            check_int(f"T5Config.{name}", getattr(self, name), 0, self.vocab_size - 1)

    @classmethod
    def from_hf(cls, hf_config) -> "T5Config":
        """From a ``transformers.T5Config`` (or its ``config.json`` as a dict)."""
        get, need = hf_reader(hf_config, cls.__name__)
        feed_forward = need("feed_forward_proj", tuple(FEED_FORWARD), "relu")
        # transformers 5 always sets tie_word_embeddings and keeps "scale the decoder output" (what an
        # untied T5 v1.1 does not do) in scale_decoder_outputs; a config.json of version 4 has only the first
        tie = get("scale_decoder_outputs")
        tie = get("tie_word_embeddings", True) if tie is None else tie
        return cls(vocab_size=get("vocab_size"), d_model=get("d_model"), d_kv=get("d_kv"), d_ff=get("d_ff"),
                   num_heads=get("num_heads"), num_layers=get("num_layers"),
                   num_decoder_layers=get("num_decoder_layers"),
                   relative_attention_num_buckets=get("relative_attention_num_buckets", 32),
                   relative_attention_max_distance=get("relative_attention_max_distance", 128),
                   dropout=get("dropout_rate", 0.1), layer_norm_eps=get("layer_norm_epsilon", 1e-6),
                   feed_forward=feed_forward, tie_word_embeddings=bool(tie),
                   pad_id=get("pad_token_id", 0), eos_id=get("eos_token_id", 1),
                   decoder_start_id=get("decoder_start_token_id", 0))



# Published sizes (Raffel et al., 2020, section 3.7; the 32,128-row embedding of the released
# checkpoints: a 32,000-piece SentencePiece vocabulary padded to a multiple of 128).
PUBLISHED: dict[str, T5Config] = {
    "T5-small": T5Config(),
    "T5-base": T5Config(d_model=768, d_ff=3072, num_heads=12, num_layers=12),
    "T5-large": T5Config(d_model=1024, d_ff=4096, num_heads=16, num_layers=24),
    "T5-3B": T5Config(d_model=1024, d_kv=128, d_ff=16384, num_heads=32, num_layers=24),
    "T5-11B": T5Config(d_model=1024, d_kv=128, d_ff=65536, num_heads=128, num_layers=24),
}


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)`` over the last dimension (Zhang & Sennrich, 2019).

    LayerNorm is ``w * (x - mean(x)) / sqrt(var(x) + eps) + b``: T5 drops the mean subtraction
    and the bias ``b``. The mean of squares is taken in float32 whatever the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(ms + self.eps)).to(x.dtype)


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bucket of each relative position ``key - query`` (an integer tensor, any shape).

    Bidirectional (encoder): half of the buckets for keys at or before the query, half for
    keys after it. Causal (decoder): keys after the query cannot be attended and share bucket
    0 with distance 0. Within one direction of ``n`` buckets, distances ``0 .. n/2 - 1`` get
    one bucket each; larger distances share the other ``n/2`` buckets, spaced
    logarithmically up to ``max_distance``; every distance beyond it lands in the last one."""
    check_tensor("relative_position", relative_position, dtype="int")
    check_int("num_buckets", num_buckets, 4)
    check_int("max_distance", max_distance, 1)
    bucket = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        bucket += (relative_position > 0).long() * num_buckets      # keys after the query: upper half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)                 # only keys before the query count
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log(distance / max_exact) / log(max_distance / max_exact) runs from 0 to 1 over the log range
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class T5Attention(nn.Module):
    """Multi-head attention as T5 has it: ``softmax(q kᵀ + position bias) v``.

    No ``1/sqrt(d_kv)`` and no biases in the four projections. Only the first layer of each
    stack has ``relative_attention_bias`` (an embedding of ``num_buckets`` rows, one scalar
    per head): :meth:`position_bias` turns it into the ``(1, H, Tq, Tk)`` bias the whole stack
    adds. Masks are boolean, True = may attend; they are folded into the bias as a large
    negative number, so a masked key gets weight exp(-huge) = 0."""

    def __init__(self, cfg: T5Config, has_relative_bias: bool = False, bidirectional: bool = True):
        super().__init__()
        self.num_heads, self.d_kv = cfg.num_heads, cfg.d_kv
        inner = cfg.num_heads * cfg.d_kv
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.k = nn.Linear(cfg.d_model, inner, bias=False)
        self.v = nn.Linear(cfg.d_model, inner, bias=False)
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.bidirectional = bidirectional
        self.num_buckets, self.max_distance = cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        if has_relative_bias:
            self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)

    def position_bias(self, query_length: int, key_length: int, offset: int = 0) -> torch.Tensor:
        """``(1, H, Tq, Tk)``: the learned bias of bucket(key - query) for queries at positions
        ``offset .. offset + Tq - 1`` (``offset`` = positions already in a KV cache)."""
        table = self.relative_attention_bias.weight
        query = torch.arange(offset, offset + query_length, device=table.device)[:, None]
        key = torch.arange(key_length, device=table.device)[None, :]
        buckets = relative_position_bucket(key - query, self.bidirectional, self.num_buckets, self.max_distance)
        return F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, kv: torch.Tensor | None = None,
                cache: dict | None = None, cache_prefix: str = "self") -> torch.Tensor:
        """``x (B, Tq, d_model)`` attends over itself (``kv=None``) or over ``kv (B, Tk, d_model)``.
        ``bias`` (broadcastable to ``(B, H, Tq, Tk)``, float) holds the position bias and the
        mask. ``cache`` (one decoder layer's dict) keeps projected keys/values: self-attention
        appends the new ones, cross-attention computes the memory's once."""
        q = split_heads(self.q(x), self.num_heads)
        if kv is None:                                   # self-attention
            k, v = split_heads(self.k(x), self.num_heads), split_heads(self.v(x), self.num_heads)
            k, v = kv_cache.update(cache, cache_prefix, k, v)
        else:                                            # cross-attention: the memory's, once
            k, v = kv_cache.memo(cache, cache_prefix, lambda: (split_heads(self.k(kv), self.num_heads),
                                                              split_heads(self.v(kv), self.num_heads)))
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, scale=1.0)   # no 1/sqrt(d)
        return self.o(merge_heads(out))


class FeedForward(nn.Module):
    """``wo(ReLU(wi x))`` (T5) or ``wo(GELU(wi_0 x) * wi_1 x)`` (T5 v1.1, GELU in its tanh
    form); no biases; dropout on the hidden layer."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.gated = cfg.feed_forward == "gated-gelu"
        if self.gated:
            self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        else:
            self.wi = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            h = F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x)
        else:
            h = F.relu(self.wi(x))
        return self.wo(self.drop(h))


class EncoderLayer(nn.Module):
    """Pre-norm self-attention (fully visible) and feed-forward."""

    def __init__(self, cfg: T5Config, first: bool):
        super().__init__()
        self.norm_self = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.self_attn = T5Attention(cfg, has_relative_bias=first, bidirectional=True)
        self.norm_ffn = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.norm_self(x), bias))
        return x + self.drop(self.ffn(self.norm_ffn(x)))


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention, cross-attention over the encoder output (no position
    bias there), feed-forward."""

    def __init__(self, cfg: T5Config, first: bool):
        super().__init__()
        self.norm_self = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.self_attn = T5Attention(cfg, has_relative_bias=first, bidirectional=False)
        self.norm_cross = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.cross_attn = T5Attention(cfg)
        self.norm_ffn = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_bias: torch.Tensor, cross_bias: torch.Tensor,
                cache: dict | None = None) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.norm_self(x), self_bias, cache=cache, cache_prefix="self"))
        x = x + self.drop(self.cross_attn(self.norm_cross(x), cross_bias, kv=memory, cache=cache,
                                          cache_prefix="cross"))
        return x + self.drop(self.ffn(self.norm_ffn(x)))


def _fold_mask(bias: torch.Tensor | None, mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """bias + (0 where mask is True, the dtype's most negative number where it is False)."""
    if mask is None:
        return bias
    neg = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return neg if bias is None else bias + neg


class Stack(nn.Module):
    """The encoder (``decoder=False``) or the decoder: layers, then a final RMSNorm and dropout.
    The embedding is the model's shared one and is applied by :class:`T5`."""

    def __init__(self, cfg: T5Config, decoder: bool):
        super().__init__()
        n = cfg.num_decoder_layers if decoder else cfg.num_layers
        layer = DecoderLayer if decoder else EncoderLayer
        self.is_decoder = decoder
        self.layers = nn.ModuleList(layer(cfg, first=i == 0) for i in range(n))
        self.final_norm = RMSNorm(cfg.d_model, cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_key_padding_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        past = cache.length if cache is not None else 0
        # computed once, by the first layer's table, then shared by every layer of the stack
        bias = self.layers[0].self_attn.position_bias(T, past + T, offset=past).to(x.dtype)
        if self.is_decoder:
            self_bias = _fold_mask(bias, look_ahead_mask(T, device=x.device, num_keys=past + T), x.dtype)
            cross = None if memory_key_padding_mask is None else memory_key_padding_mask[:, None, None, :]
            cross_bias = _fold_mask(None, cross, x.dtype)    # no position bias in cross-attention
        else:
            pad = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
            self_bias = _fold_mask(bias, pad, x.dtype)
        x = self.drop(x)
        for i, layer in enumerate(self.layers):
            if self.is_decoder:
                x = layer(x, memory, self_bias, cross_bias, cache.layers[i] if cache is not None else None)
            else:
                x = layer(x, self_bias)
        return self.drop(self.final_norm(x))


class T5(nn.Module):
    """The encoder-decoder: one embedding shared by encoder, decoder and (tied) output layer."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        if not isinstance(cfg, T5Config):
            raise TypeError(f"cfg must be a T5Config, got {type(cfg).__name__}")
        self.cfg = cfg
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, decoder=False)
        self.decoder = Stack(cfg, decoder=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """Mesh TensorFlow's initialisation, as the released models had it: N(0, 1) embeddings and
        N(0, 1/fan_in) matrices, except the query projection, N(0, 1/(d_model * d_kv)): the
        ``1/sqrt(d_kv)`` the attention does not divide by is folded in here."""
        cfg = self.cfg
        nn.init.normal_(self.shared.weight, std=1.0)
        if not cfg.tie_word_embeddings:
            nn.init.normal_(self.lm_head.weight, std=cfg.d_model ** -0.5)
        for name, module in self.named_modules():
            if isinstance(module, T5Attention):
                nn.init.normal_(module.q.weight, std=(cfg.d_model * cfg.d_kv) ** -0.5)
                nn.init.normal_(module.k.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.v.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.o.weight, std=(cfg.num_heads * cfg.d_kv) ** -0.5)
                if hasattr(module, "relative_attention_bias"):
                    nn.init.normal_(module.relative_attention_bias.weight, std=cfg.d_model ** -0.5)
            elif isinstance(module, FeedForward):
                for lin in (module.wi_0, module.wi_1) if module.gated else (module.wi,):
                    nn.init.normal_(lin.weight, std=cfg.d_model ** -0.5)
                nn.init.normal_(module.wo.weight, std=cfg.d_ff ** -0.5)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters, the tied output layer counted once; ``exclude_embeddings`` leaves out
        the shared embedding and the output layer."""
        return num_parameters(self, (self.shared, self.lm_head) if exclude_embeddings else ())

    def encode(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src (B, S)`` ids -> encoder output ``(B, S, d_model)``; the padding mask (True at
        real tokens) defaults to ``src != pad_id``."""
        check_token_ids("src", src, self.cfg.vocab_size)
        if src_key_padding_mask is None:
            src_key_padding_mask = src != self.cfg.pad_id
        check_tensor("src_key_padding_mask", src_key_padding_mask, dtype="bool", shape=tuple(src.shape))
        return self.encoder(self.shared(src), key_padding_mask=src_key_padding_mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, memory_key_padding_mask: torch.Tensor | None = None,
               cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """``tgt (B, T)`` (the new tokens when a cache is given) -> ``(logits (B, T, V), cache)``."""
        check_token_ids("tgt", tgt, self.cfg.vocab_size)
        check_tensor("memory", memory, dtype="float", dim=3, what="(batch, S, d_model) encoder output")
        if memory.shape[0] != tgt.shape[0] or memory.shape[2] != self.cfg.d_model:
            raise ValueError(f"memory must be (batch={tgt.shape[0]}, S, d_model={self.cfg.d_model}), "
                             f"got {tuple(memory.shape)}")
        if cache is None:
            cache = KVCache(len(self.decoder.layers))
        elif not isinstance(cache, KVCache) or len(cache.layers) != len(self.decoder.layers):
            raise ValueError(f"cache must be a KVCache of {len(self.decoder.layers)} layers, got {cache!r}")
        h = self.decoder(self.shared(tgt), memory=memory, memory_key_padding_mask=memory_key_padding_mask,
                         cache=cache)
        if self.cfg.tie_word_embeddings:
            h = h * self.cfg.d_model ** -0.5        # T5 rescales before the tied output layer
        return self.lm_head(h), cache

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for teacher forcing: ``[start] + labels[:-1]`` (-100 read as padding)."""
        start = torch.full_like(labels[:, :1], self.cfg.decoder_start_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        return shifted.masked_fill(shifted == -100, self.cfg.pad_id)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: ``input_ids (B, S)``, ``labels (B, T)`` (-100 = ignored) ->
        ``(logits (B, T, V), mean cross-entropy or None)``. Without ``decoder_input_ids`` they are
        ``shift_right(labels)``."""
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give labels or decoder_input_ids")
            decoder_input_ids = self.shift_right(labels)
        if attention_mask is None:
            attention_mask = input_ids != self.cfg.pad_id
        memory = self.encode(input_ids, attention_mask)
        logits, _ = self.decode(decoder_input_ids, memory, attention_mask)
        loss = None
        if labels is not None:
            if labels.shape != decoder_input_ids.shape:
                raise ValueError(f"labels {tuple(labels.shape)} and decoder_input_ids "
                                 f"{tuple(decoder_input_ids.shape)} must have the same shape")
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return logits, loss



# ----------------------------------------------------------------------------- attention patterns

PATTERNS = ("fully_visible", "causal", "causal_with_prefix")


def mask_pattern(kind: str, length: int, prefix: int = 0) -> torch.Tensor:
    """The paper's Figure 3: ``(length, length)`` bool, row = output position, True = may attend.

    ``fully_visible``: every position sees every position (T5's encoder). ``causal``: position i
    sees 0..i (a language model, T5's decoder self-attention). ``causal_with_prefix``: fully
    visible over the first ``prefix`` positions, causal after them (a prefix LM)."""
    check_choice("kind", kind, PATTERNS)
    check_int("length", length, 1)
    check_int("prefix", prefix, 0, length)
    if kind == "fully_visible":
        return torch.ones(length, length, dtype=torch.bool)
    mask = look_ahead_mask(length)
    if kind == "causal_with_prefix":
        mask[:, :prefix] = True
    return mask


# ----------------------------------------------------------------------------- references

def _attention_table(ours: str, theirs: str, with_bias: bool) -> dict[str, str]:
    t = {f"{ours}.{p}.weight": f"{theirs}.{p}.weight" for p in "qkvo"}
    if with_bias:
        t[f"{ours}.relative_attention_bias.weight"] = f"{theirs}.relative_attention_bias.weight"
    return t


def hf_t5_table(cfg: T5Config) -> dict[str, str | Source]:
    """Our keys -> ``T5ForConditionalGeneration`` keys; their ``embed_tokens`` and ``lm_head``
    are ``shared`` (tied) and not in the table, nor is our ``lm_head`` when
    ``cfg.tie_word_embeddings``. (``transformers`` 5 always ties its output layer to ``shared``
    and only skips the ``d_model^-0.5`` rescaling for a config made with
    ``tie_word_embeddings=False``; our untied ``lm_head`` then gets a copy.)"""
    ffn = ("wi_0", "wi_1", "wo") if cfg.feed_forward == "gated-gelu" else ("wi", "wo")
    shared = not cfg.tie_word_embeddings
    t: dict[str, str | Source] = {"shared.weight": Source("shared.weight", shared=shared),
                                  "encoder.final_norm.weight": "encoder.final_layer_norm.weight",
                                  "decoder.final_norm.weight": "decoder.final_layer_norm.weight"}
    if shared:
        t["lm_head.weight"] = Source("shared.weight", shared=True)
    for i in range(cfg.num_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder.block.{i}.layer"
        t |= _attention_table(f"{ours}.self_attn", f"{theirs}.0.SelfAttention", i == 0)
        t[f"{ours}.norm_self.weight"] = f"{theirs}.0.layer_norm.weight"
        t |= {f"{ours}.ffn.{w}.weight": f"{theirs}.1.DenseReluDense.{w}.weight" for w in ffn}
        t[f"{ours}.norm_ffn.weight"] = f"{theirs}.1.layer_norm.weight"
    for i in range(cfg.num_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"decoder.block.{i}.layer"
        t |= _attention_table(f"{ours}.self_attn", f"{theirs}.0.SelfAttention", i == 0)
        t[f"{ours}.norm_self.weight"] = f"{theirs}.0.layer_norm.weight"
        t |= _attention_table(f"{ours}.cross_attn", f"{theirs}.1.EncDecAttention", False)
        t[f"{ours}.norm_cross.weight"] = f"{theirs}.1.layer_norm.weight"
        t |= {f"{ours}.ffn.{w}.weight": f"{theirs}.2.DenseReluDense.{w}.weight" for w in ffn}
        t[f"{ours}.norm_ffn.weight"] = f"{theirs}.2.layer_norm.weight"
    return t


def load_hf_t5(ours: T5, theirs: nn.Module | Mapping[str, torch.Tensor]) -> T5:
    """Copy a Hugging Face ``T5ForConditionalGeneration`` (a model or its state dict, same sizes)
    into ``ours``, every tensor used once. Their encoder and decoder ``embed_tokens`` and their
    ``lm_head`` are ``shared`` (tied); so is our ``lm_head`` when ``cfg.tie_word_embeddings``.
    Returns ``ours``."""
    if not isinstance(ours, T5):
        raise TypeError(f"ours must be our T5, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    tied_theirs = [k for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
                   if k in state]
    return copy_weights(ours, state, hf_t5_table(ours.cfg), tied=["lm_head.weight"] if ours.cfg.tie_word_embeddings
                        else [], tied_theirs=tied_theirs)
