"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", top to bottom.

Interface
---------
``TransformerConfig(src_vocab_size, tgt_vocab_size, d_model=512, num_heads=8,
num_encoder_layers=6, num_decoder_layers=6, d_ff=2048, dropout=0.1, max_len=512,
norm_first=False, pad_id=0, share_embeddings=False, tie_output=False, activation="relu",
layer_norm_eps=1e-5)``
    ``share_embeddings``: one matrix for source embedding, target embedding and output
    projection (Press & Wolf, 2017; needs one shared vocabulary). ``tie_output``: tie only the
    target embedding and the output projection (works with separate vocabularies).

Masks follow ``lib.attention``: boolean, **True = may attend**; padding masks are ``(B, S)``.

``EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first, activation, eps)``
    ``forward(x, key_padding_mask=None, mask=None) -> x``: self-attention, then FFN, each in a
    ``lib.layers.ResidualBlock`` (post-LN or pre-LN).
``DecoderLayer(...)``
    ``forward(x, memory, self_mask=None, memory_mask=None, cache=None) -> x``: masked
    self-attention, cross-attention over the encoder output ``memory``, FFN. ``cache`` is one
    layer's dict of projected keys/values (``lib.kv_cache``); it is read and updated in place.
``Encoder(...)``/``Decoder(...)``: a stack of layers **plus a final LayerNorm**, exactly the
    structure of ``torch.nn.TransformerEncoder``/``TransformerDecoder`` inside
    ``torch.nn.Transformer`` (which has that final norm for both post-LN and pre-LN).
    ``Encoder.forward(x, key_padding_mask=None, mask=None)``;
    ``Decoder.forward(x, memory, memory_key_padding_mask=None, tgt_key_padding_mask=None,
    tgt_mask=None, cache=None)``: the look-ahead mask is built here (offset by the cache
    length) unless ``tgt_mask`` is given.
``TransformerCore(d_model, num_heads, num_encoder_layers, num_decoder_layers, d_ff, dropout,
norm_first, activation, eps)``: the ``nn.Transformer``-shaped part (no embeddings, no output
    projection). ``forward(src, tgt, src_key_padding_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_mask=None) -> (B, T, d_model)`` on embedded inputs.
    At the base configuration it has exactly as many parameters as ``torch.nn.Transformer()``.
``copy_from_torch_mha(mha, torch_mha)`` / ``copy_from_torch_transformer(core, torch_transformer)``:
    a ``torch.nn.MultiheadAttention`` into a ``lib.attention.MultiHeadAttention``, a
    ``torch.nn.Transformer`` into a ``TransformerCore`` (name tables through
    ``lib.models.reference.copy_weights``, every weight used once).
The cache of incremental decoding is ``lib.kv_cache.KVCache`` (shared with GPT, BART and T5).
``Transformer(cfg)``:
    ``encode(src, src_key_padding_mask=None) -> memory (B, S, d_model)`` (mask from ``pad_id``
    when None);
    ``decode(tgt, memory, memory_key_padding_mask=None, cache=None, tgt_key_padding_mask=None)
    -> (logits (B, T, tgt_vocab), cache)``. Without a cache, ``tgt`` is the whole prefix and a
    new cache holding it is returned. With a cache, pass only the NEW tokens: positions continue
    from ``cache.length``. Decoding token by token with the cache gives the same logits as
    decoding the full prefix (tested, atol 1e-5). This is the encoder-decoder side of the
    protocol ``lib.generate`` decodes with (greedy, beam search, sampling, with or without the cache).
    ``forward(src, tgt) -> logits`` (padding masks from ``pad_id``, look-ahead mask);
    ``num_parameters(exclude_embeddings=False)`` (tied matrices counted once);
    ``attention_weights(src, tgt) -> dict`` of per-layer weights ``(B, H, Tq, Tk)`` under
    ``encoder_self``, ``decoder_self``, ``cross`` (for heatmaps).

Explained in chapters/03_transformer.ipynb, chapters/04_transformer_chatbot.ipynb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from lib.config import ModelConfig
from lib import kv_cache
from lib.attention import MultiHeadAttention, combine_masks, look_ahead_mask
from lib.kv_cache import KVCache
from lib.layers import PositionalEncoding, PositionwiseFeedForward, ResidualBlock, layer_norm, num_parameters
from lib.models.reference import Source, copy_weights, split
from lib.validate import check_token_ids

__all__ = ["TransformerConfig", "TeacherForcing", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder",
           "TransformerCore", "Transformer", "copy_from_torch_mha", "copy_from_torch_transformer"]


@dataclass
class TransformerConfig(ModelConfig):
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 512
    norm_first: bool = False
    pad_id: int = 0
    share_embeddings: bool = False
    tie_output: bool = False
    activation: str = "relu"
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings=True needs one shared vocabulary, got "
                             f"src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.tgt_vocab_size}")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id={self.pad_id} is not a valid token id of both vocabularies")



def _padding_4d(key_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``(B, S)`` -> ``(B, 1, 1, S)`` so that it broadcasts over heads and queries."""
    if key_padding_mask is None:
        return None
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise ValueError(f"a key padding mask must be bool (batch, time), True at real tokens; got "
                         f"dtype {key_padding_mask.dtype}, shape {tuple(key_padding_mask.shape)}")
    return key_padding_mask[:, None, None, :]


# ----------------------------------------------------------------------------- layers

class EncoderLayer(nn.Module):
    """Self-attention and a position-wise FFN, each wrapped in a residual block with LayerNorm."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.attn_block = ResidualBlock(d_model, dropout, norm_first, eps)
        self.ffn_block = ResidualBlock(d_model, dropout, norm_first, eps)
        self.keep_weights = False
        self.attn_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        full_mask = combine_masks(mask, _padding_4d(key_padding_mask))

        def attend(h):
            out, w = self.self_attn(h, h, h, mask=full_mask)
            if self.keep_weights:
                self.attn_weights = w.detach()
            return out

        x = self.attn_block(x, attend)
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, FFN; three residual blocks."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.self_block = ResidualBlock(d_model, dropout, norm_first, eps)
        self.cross_block = ResidualBlock(d_model, dropout, norm_first, eps)
        self.ffn_block = ResidualBlock(d_model, dropout, norm_first, eps)
        self.keep_weights = False
        self.self_weights: torch.Tensor | None = None
        self.cross_weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, memory: torch.Tensor, self_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, cache: dict | None = None) -> torch.Tensor:
        """``self_mask`` broadcastable to ``(B, H, T_new, T_past + T_new)``; ``memory_mask`` to
        ``(B, H, T_new, S)``. ``cache`` (a dict, may be empty) is extended in place."""

        def self_attend(h):
            k, v = kv_cache.update(cache, "self", *self.self_attn.project_kv(h, h))
            out, w = self.self_attn.attend_projected(h, k, v, mask=self_mask)
            if self.keep_weights:
                self.self_weights = w.detach()
            return out

        def cross_attend(h):
            k, v = kv_cache.memo(cache, "cross", lambda: self.cross_attn.project_kv(memory, memory))
            out, w = self.cross_attn.attend_projected(h, k, v, mask=memory_mask)
            if self.keep_weights:
                self.cross_weights = w.detach()
            return out

        x = self.self_block(x, self_attend)
        x = self.cross_block(x, cross_attend)
        return self.ffn_block(x, self.ffn)


# ----------------------------------------------------------------------------- stacks

class Encoder(nn.Module):
    """N encoder layers and a final LayerNorm (as in ``torch.nn.Transformer``)."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first, activation, eps)
                                    for _ in range(num_layers))
        self.norm = layer_norm(d_model, eps)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask=key_padding_mask, mask=mask)
        return self.norm(x)


class Decoder(nn.Module):
    """N decoder layers and a final LayerNorm (as in ``torch.nn.Transformer``)."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first, activation, eps)
                                    for _ in range(num_layers))
        self.norm = layer_norm(d_model, eps)

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_key_padding_mask: torch.Tensor | None = None,
                tgt_key_padding_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """``x (B, T_new, d)``. Without ``tgt_mask`` the look-ahead mask is used, shifted by
        ``cache.length``. ``tgt_key_padding_mask (B, T_new)`` covers the new tokens only."""
        if cache is not None and len(cache.layers) != len(self.layers):
            raise ValueError(f"cache has {len(cache.layers)} layers, the decoder {len(self.layers)}")
        past = cache.length if cache is not None else 0
        T = x.shape[1]
        if tgt_mask is None:
            tgt_mask = look_ahead_mask(T, device=x.device, num_keys=past + T)
        if cache is not None and (tgt_key_padding_mask is not None or cache.tgt_padding is not None):
            B = x.shape[0]
            new = tgt_key_padding_mask if tgt_key_padding_mask is not None else \
                torch.ones(B, T, dtype=torch.bool, device=x.device)
            old = cache.tgt_padding if cache.tgt_padding is not None else \
                torch.ones(B, past, dtype=torch.bool, device=x.device)
            tgt_key_padding_mask = cache.tgt_padding = torch.cat([old, new], dim=1)
        self_mask = combine_masks(tgt_mask, _padding_4d(tgt_key_padding_mask))
        memory_mask = _padding_4d(memory_key_padding_mask)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask,
                      cache=cache.layers[i] if cache is not None else None)
        return self.norm(x)


class TransformerCore(nn.Module):
    """The encoder–decoder without embeddings or output projection: ``torch.nn.Transformer``'s shape."""

    def __init__(self, d_model: int = 512, num_heads: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, d_ff: int = 2048, dropout: float = 0.1,
                 norm_first: bool = False, activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.d_model = d_model
        self.encoder = Encoder(num_encoder_layers, d_model, num_heads, d_ff, dropout, norm_first, activation, eps)
        self.decoder = Decoder(num_decoder_layers, d_model, num_heads, d_ff, dropout, norm_first, activation, eps)
        for p in self.parameters():          # Xavier/Glorot for every matrix, as torch.nn.Transformer
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None,
                tgt_key_padding_mask: torch.Tensor | None = None,
                memory_key_padding_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None) -> torch.Tensor:
        memory = self.encoder(src, key_padding_mask=src_key_padding_mask)
        return self.decoder(tgt, memory, memory_key_padding_mask=memory_key_padding_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask, tgt_mask=tgt_mask)


# ----------------------------------------------------------------------------- the model

class TeacherForcing:
    """``forward`` of an encoder-decoder that has ``encode``, ``decode`` and ``cfg.pad_id`` (the
    course's Transformer, BART): the whole target in one pass, padding masked on both sides."""

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ``src (B, S)``, ``tgt (B, T)`` ids -> logits ``(B, T, target vocabulary)``."""
        src_pad = src != self.cfg.pad_id
        memory = self.encode(src, src_pad)
        logits, _ = self.decode(tgt, memory, src_pad, tgt_key_padding_mask=tgt != self.cfg.pad_id)
        return logits


class Transformer(TeacherForcing, nn.Module):
    """Embeddings (scaled by sqrt(d_model)) + sinusoidal positions, the core, a linear generator."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else \
            nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id)
        self.src_pos = PositionalEncoding(d, cfg.max_len, cfg.dropout)
        self.tgt_pos = PositionalEncoding(d, cfg.max_len, cfg.dropout)
        self.core = TransformerCore(d, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers,
                                    cfg.d_ff, cfg.dropout, cfg.norm_first, cfg.activation, cfg.layer_norm_eps)
        self.generator = nn.Linear(d, cfg.tgt_vocab_size)
        # embeddings ~ N(0, 1/d) so that after the sqrt(d) scaling they have unit variance
        for emb in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(emb.weight, std=d ** -0.5)
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        if cfg.share_embeddings or cfg.tie_output:
            self.generator.weight = self.tgt_embed.weight
        else:
            nn.init.xavier_uniform_(self.generator.weight)
        nn.init.zeros_(self.generator.bias)

    @property
    def encoder(self) -> Encoder:
        return self.core.encoder

    @property
    def decoder(self) -> Decoder:
        return self.core.decoder

    def encode(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_token_ids("src", src, self.cfg.src_vocab_size, allow_empty=True)
        if src_key_padding_mask is None:
            src_key_padding_mask = src != self.cfg.pad_id
        x = self.src_pos(self.src_embed(src) * math.sqrt(self.cfg.d_model))
        return self.encoder(x, key_padding_mask=src_key_padding_mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor,
               memory_key_padding_mask: torch.Tensor | None = None, cache: KVCache | None = None,
               tgt_key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        check_token_ids("tgt", tgt, self.cfg.tgt_vocab_size, allow_empty=True)
        if memory.dim() != 3 or memory.shape[0] != tgt.shape[0] or memory.shape[-1] != self.cfg.d_model:
            raise ValueError(f"memory must be (batch={tgt.shape[0]}, S, d_model={self.cfg.d_model}), "
                             f"got {tuple(memory.shape)}")
        if cache is None:
            cache = KVCache(len(self.decoder.layers))
        offset = cache.length
        y = self.tgt_pos(self.tgt_embed(tgt) * math.sqrt(self.cfg.d_model), offset=offset)
        h = self.decoder(y, memory, memory_key_padding_mask=memory_key_padding_mask,
                         tgt_key_padding_mask=tgt_key_padding_mask, cache=cache)
        return self.generator(h), cache


    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters, each tied matrix counted once; ``exclude_embeddings=True`` leaves out the
        embedding tables and the output projection (what ``torch.nn.Transformer`` does not have)."""
        return num_parameters(self, (self.src_embed, self.tgt_embed, self.generator) if exclude_embeddings else ())

    @torch.no_grad()
    def attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        """Run ``forward`` in eval mode and return every layer's attention weights (B, H, Tq, Tk)."""
        was_training = self.training
        self.eval()
        layers = list(self.encoder.layers) + list(self.decoder.layers)
        for layer in layers:
            layer.keep_weights = True
        try:
            self.forward(src, tgt)
            return {"encoder_self": [l.attn_weights for l in self.encoder.layers],
                    "decoder_self": [l.self_weights for l in self.decoder.layers],
                    "cross": [l.cross_weights for l in self.decoder.layers]}
        finally:
            for layer in layers:
                layer.keep_weights = False
            self.train(was_training)


# ----------------------------------------------------------------------------- torch.nn references

def _linear(ours: str, theirs: str, bias: bool = True) -> dict[str, str]:
    """A ``Linear`` or ``LayerNorm``: weight (and bias) under the same names on both sides."""
    return {f"{ours}.weight": f"{theirs}.weight", **({f"{ours}.bias": f"{theirs}.bias"} if bias else {})}


def _mha_table(ours: str, theirs: str, bias: bool = True) -> dict[str, str | Source]:
    """``lib.attention.MultiHeadAttention`` at ``ours`` from ``nn.MultiheadAttention`` at ``theirs``:
    w_q, w_k, w_v are the three row blocks of the packed ``in_proj``; w_o is ``out_proj``."""
    table: dict[str, str | Source] = {}
    for i, name in enumerate("qkv"):
        table[f"{ours}w_{name}.weight"] = Source(f"{theirs}in_proj_weight", split(i, 3), shared=True)
        if bias:
            table[f"{ours}w_{name}.bias"] = Source(f"{theirs}in_proj_bias", split(i, 3), shared=True)
    return {**table, **_linear(f"{ours}w_o", f"{theirs}out_proj", bias)}


def copy_from_torch_mha(mha: nn.Module, torch_mha: nn.MultiheadAttention) -> nn.Module:
    """Copy a ``torch.nn.MultiheadAttention`` (same d_model and heads, packed in-projection) into
    ``mha``, a ``lib.attention.MultiHeadAttention``; every weight on both sides is used once."""
    if not isinstance(torch_mha, nn.MultiheadAttention):
        raise TypeError(f"torch_mha must be a torch.nn.MultiheadAttention, got {type(torch_mha).__name__}")
    if torch_mha.embed_dim != mha.d_model or torch_mha.num_heads != mha.num_heads:
        raise ValueError(f"shape mismatch: torch ({torch_mha.embed_dim}, {torch_mha.num_heads} heads), "
                         f"ours ({mha.d_model}, {mha.num_heads} heads)")
    if torch_mha.in_proj_weight is None:
        raise ValueError("torch_mha must use a packed in_proj_weight (kdim == vdim == embed_dim)")
    return copy_weights(mha, torch_mha, _mha_table("", "", bias=torch_mha.in_proj_bias is not None))


def copy_from_torch_transformer(core: nn.Module, torch_transformer: nn.Transformer) -> nn.Module:
    """Copy every weight of a ``torch.nn.Transformer`` into ``core``, a
    ``lib.models.transformer.TransformerCore`` of the same sizes (every weight used once)."""
    if not isinstance(torch_transformer, nn.Transformer):
        raise TypeError(f"torch_transformer must be a torch.nn.Transformer, got {type(torch_transformer).__name__}")
    enc, dec = torch_transformer.encoder, torch_transformer.decoder
    if len(enc.layers) != len(core.encoder.layers) or len(dec.layers) != len(core.decoder.layers):
        raise ValueError(f"layer counts differ: torch_transformer has {len(enc.layers)} + {len(dec.layers)}, "
                         f"core has {len(core.encoder.layers)} + {len(core.decoder.layers)}")
    table: dict[str, str | Source] = {}
    for i in range(len(enc.layers)):
        p = f"encoder.layers.{i}."
        table |= _mha_table(p + "self_attn.", p + "self_attn.")
        for ours, theirs in (("ffn.linear1", "linear1"), ("ffn.linear2", "linear2"),
                             ("attn_block.norm", "norm1"), ("ffn_block.norm", "norm2")):
            table |= _linear(p + ours, p + theirs)
    for i in range(len(dec.layers)):
        p = f"decoder.layers.{i}."
        table |= _mha_table(p + "self_attn.", p + "self_attn.")
        table |= _mha_table(p + "cross_attn.", p + "multihead_attn.")
        for ours, theirs in (("ffn.linear1", "linear1"), ("ffn.linear2", "linear2"), ("self_block.norm", "norm1"),
                             ("cross_block.norm", "norm2"), ("ffn_block.norm", "norm3")):
            table |= _linear(p + ours, p + theirs)
    table |= _linear("encoder.norm", "encoder.norm") | _linear("decoder.norm", "decoder.norm")
    return copy_weights(core, torch_transformer, table)
