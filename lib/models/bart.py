"""BART (Lewis et al., 2020): a denoising autoencoder with a BERT-like encoder and a GPT-like decoder.

BART corrupts a document (``lib.data.noising``: token masking, token deletion, text infilling,
sentence permutation, document rotation) and trains a standard encoder-decoder Transformer to
write the *original* document back, with the cross-entropy of the decoder. The encoder sees
the whole corrupted input in both directions (like BERT); the decoder generates left to right
(like GPT) while attending to the encoder. Because the decoder regenerates the whole text,
the corruption may change the length (deletion, infilling) or the order (permutation,
rotation): no one-to-one alignment between input and output is needed, unlike BERT's MLM.

The layers are the course's (``lib.models.transformer``: ``EncoderLayer``, ``DecoderLayer``,
the look-ahead mask and the KV cache of ``Decoder``). What makes it BART, as in the released
models and Hugging Face's ``BartForConditionalGeneration``:

* **learned** position embeddings (not sinusoidal), one table for the encoder and one for the
  decoder; one token embedding shared by encoder, decoder and the output layer (tied);
* a LayerNorm on the embeddings (``layernorm_embedding``) and **post-LN** layers, so the
  stacks have no final LayerNorm (``Encoder.norm``/``Decoder.norm`` are identities here);
* GELU in the feed-forward layers; embeddings not scaled by sqrt(d_model).

Hugging Face's position table has two extra rows at the front (an ``offset`` of 2 kept from
fairseq); ours starts at position 0 and the copy drops those two rows (never read).

Interface
---------
``BartConfig(vocab_size, d_model=768, num_heads=12, encoder_layers=6, decoder_layers=6,
d_ff=3072, dropout=0.1, max_len=1024, pad_id=0, layer_norm_eps=1e-5)``; ``BartConfig.from_hf(hf_config)``;
``PUBLISHED["BART-base"]`` / ``["BART-large"]`` are the published sizes (140M / 400M parameters with
the 50,265-token vocabulary).
``Bart(cfg)`` follows the encoder-decoder protocol of ``lib.generate``:
    ``encode(src, src_key_padding_mask=None) -> memory``;
    ``decoder_states(tgt, memory, memory_key_padding_mask=None, cache=None,
    tgt_key_padding_mask=None) -> (hidden (B, T, d), cache)``;
    ``decode(...) -> (logits, cache)`` (``lm_head`` of the states, tied to the embedding);
    ``forward(src, tgt) -> logits`` (padding masks from ``pad_id``);
    ``num_parameters(exclude_embeddings=False)``.
``BartClassifier(bart, num_classes, dropout=0.1)``: the paper's sequence classification. The
    same tokens go into the encoder and (shifted right behind ``[BOS]``) into the decoder; the
    decoder state of the final token (``[EOS]``), which has attended to the whole input, feeds
    a dense + tanh + linear head (as ``BartClassificationHead``). ``forward(ids) -> logits``
    with ``ids`` ending in ``eos_id`` before the padding.
``hf_bart_table(cfg)`` and ``load_hf_bart(ours, theirs)``: the weights of a Hugging Face
    ``BartForConditionalGeneration`` into ours (``lib.models.reference.copy_weights``).

Explained in chapters/10_bart_albert.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn

from lib.config import ModelConfig, hf_reader
from lib.kv_cache import KVCache
from lib.layers import layer_norm, num_parameters
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.models.transformer import Decoder, Encoder, TeacherForcing
from lib.validate import check_int, check_tensor

__all__ = ["BartConfig", "PUBLISHED", "Bart", "BartClassifier", "hf_bart_table", "load_hf_bart"]


@dataclass
class BartConfig(ModelConfig):
    vocab_size: int
    d_model: int = 768
    num_heads: int = 12
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_ff: int = 3072
    dropout: float = 0.1
    max_len: int = 1024
    pad_id: int = 0
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
            check_int(name, getattr(self, name), 1)
        for name in ("encoder_layers", "decoder_layers"):
            check_int(name, getattr(self, name), 0)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_int("pad_id", self.pad_id, 0, self.vocab_size - 1)

    @classmethod
    def from_hf(cls, hf_config) -> "BartConfig":
        """From a ``transformers.BartConfig`` (or its ``config.json`` as a dict): encoder and decoder of
        one width and head count, GELU, no embedding scale. Our layers use one dropout rate everywhere:
        Hugging Face's ``dropout`` (its attention and activation rates are not read)."""
        get, need = hf_reader(hf_config, cls.__name__)
        need("activation_function", ("gelu",), "gelu")
        need("scale_embedding", (False,), False)
        need("decoder_attention_heads", (get("encoder_attention_heads"),))
        need("decoder_ffn_dim", (get("encoder_ffn_dim"),))
        return cls(vocab_size=get("vocab_size"), d_model=get("d_model"), num_heads=get("encoder_attention_heads"),
                   encoder_layers=get("encoder_layers"), decoder_layers=get("decoder_layers"),
                   d_ff=get("encoder_ffn_dim"), dropout=get("dropout", 0.1), max_len=get("max_position_embeddings"),
                   pad_id=get("pad_token_id", 1))


# Lewis et al. (2020), section 3 (with GPT-2's 50,265-entry byte-level BPE): 140M and 400M parameters.
PUBLISHED: dict[str, BartConfig] = {
    "BART-base": BartConfig(vocab_size=50265, d_model=768, num_heads=12, encoder_layers=6, decoder_layers=6,
                            d_ff=3072),
    "BART-large": BartConfig(vocab_size=50265, d_model=1024, num_heads=16, encoder_layers=12, decoder_layers=12,
                             d_ff=4096),
}



class Bart(TeacherForcing, nn.Module):
    """Shared token embedding, learned positions, embedding LayerNorm, post-LN GELU encoder and
    decoder (the course's layers), output layer tied to the token embedding."""

    def __init__(self, cfg: BartConfig):
        super().__init__()
        if not isinstance(cfg, BartConfig):
            raise TypeError(f"cfg must be a BartConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        d, eps = cfg.d_model, cfg.layer_norm_eps
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        self.enc_pos = nn.Embedding(cfg.max_len, d)
        self.dec_pos = nn.Embedding(cfg.max_len, d)
        self.enc_norm = layer_norm(d, eps)
        self.dec_norm = layer_norm(d, eps)
        self.drop = nn.Dropout(cfg.dropout)
        layer_args = (d, cfg.num_heads, cfg.d_ff, cfg.dropout, False, "gelu", eps)
        self.encoder = Encoder(cfg.encoder_layers, *layer_args)
        self.decoder = Decoder(cfg.decoder_layers, *layer_args)
        self.encoder.norm = nn.Identity()      # post-LN layers end normalised: no final LayerNorm
        self.decoder.norm = nn.Identity()
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        self.apply(self._init)
        self.lm_head.weight = self.embed.weight

    @staticmethod
    def _init(module: nn.Module) -> None:
        """BART's initialisation: normal(0, 0.02) for matrices and embeddings, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()

    def embed_inputs(self, ids: torch.Tensor, positions: nn.Embedding, norm: nn.LayerNorm, offset: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        if offset + T > self.cfg.max_len:
            raise ValueError(f"positions {offset}..{offset + T - 1} exceed max_len={self.cfg.max_len}")
        pos = torch.arange(offset, offset + T, device=ids.device)
        return self.drop(norm(self.embed(ids) + positions(pos)))

    def encode(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_tensor("src", src, dtype="int", dim=2, what="(batch, time)")
        if src_key_padding_mask is None:
            src_key_padding_mask = src != self.cfg.pad_id
        return self.encoder(self.embed_inputs(src, self.enc_pos, self.enc_norm), key_padding_mask=src_key_padding_mask)

    def decoder_states(self, tgt: torch.Tensor, memory: torch.Tensor,
                       memory_key_padding_mask: torch.Tensor | None = None, cache: KVCache | None = None,
                       tgt_key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """The decoder's last hidden states ``(B, T, d_model)`` and the (extended) cache."""
        check_tensor("tgt", tgt, dtype="int", dim=2, what="(batch, time)")
        check_tensor("memory", memory, dtype="float", shape=(tgt.shape[0], None, self.cfg.d_model),
                     what="(batch, S, d_model)")
        if cache is None:
            cache = KVCache(len(self.decoder.layers))
        y = self.embed_inputs(tgt, self.dec_pos, self.dec_norm, offset=cache.length)
        h = self.decoder(y, memory, memory_key_padding_mask=memory_key_padding_mask,
                         tgt_key_padding_mask=tgt_key_padding_mask, cache=cache)
        return h, cache

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, memory_key_padding_mask: torch.Tensor | None = None,
               cache: KVCache | None = None,
               tgt_key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        h, cache = self.decoder_states(tgt, memory, memory_key_padding_mask, cache, tgt_key_padding_mask)
        return self.lm_head(h), cache

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Every parameter once (the tied output layer is the token embedding); ``True`` leaves out
        the token and position tables."""
        return num_parameters(self, (self.embed, self.enc_pos, self.dec_pos, self.lm_head) if exclude_embeddings else ())


class BartClassifier(nn.Module):
    """Sequence classification as in the BART paper: the same input into encoder and decoder, the
    final decoder state (at ``[EOS]``) into a dense + tanh + linear head."""

    def __init__(self, bart: Bart, num_classes: int, bos_id: int, eos_id: int, dropout: float = 0.1):
        super().__init__()
        if not isinstance(bart, Bart):
            raise TypeError(f"bart must be a lib.models.bart.Bart, got {type(bart).__name__}")
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.bos_id = check_int("bos_id", bos_id, 0, bart.cfg.vocab_size - 1)
        self.eos_id = check_int("eos_id", eos_id, 0, bart.cfg.vocab_size - 1)
        self.bart = bart
        d = bart.cfg.d_model
        self.dense = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(d, num_classes)

    def final_state(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids (B, S)`` (each row ends with ``eos_id``, then padding) -> the decoder state at that
        ``[EOS]`` ``(B, d_model)``: it has read the whole input, left to right, and attended to
        the encoder's bidirectional states of the same input."""
        check_tensor("ids", ids, dtype="int", dim=2, what="(batch, time)")
        pad = self.bart.cfg.pad_id
        lengths = (ids != pad).sum(1)
        last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        if (lengths == 0).any() or (last != self.eos_id).any():
            raise ValueError("every row of ids must end with eos_id before its padding")
        src_pad = ids != pad
        memory = self.bart.encode(ids, src_pad)
        tgt = torch.cat([torch.full_like(ids[:, :1], self.bos_id), ids], dim=1)   # [BOS] + the same tokens
        h, _ = self.bart.decoder_states(tgt, memory, src_pad, tgt_key_padding_mask=tgt != pad)
        return h[torch.arange(ids.shape[0], device=ids.device), lengths]   # tgt position of [EOS]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.tanh(self.dense(self.drop(self.final_state(ids))))))


# ----------------------------------------------------------------------------- reference

def _layer_table(ours: str, theirs: str, cross: bool) -> dict[str, str]:
    t: dict[str, str] = {}
    attn = [("self_attn", "self_attn", "self_block" if cross else "attn_block", "self_attn_layer_norm")]
    if cross:
        attn.append(("cross_attn", "encoder_attn", "cross_block", "encoder_attn_layer_norm"))
    for our_attn, their_attn, our_block, their_norm in attn:
        for w, proj in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
            for p in ("weight", "bias"):
                t[f"{ours}.{our_attn}.{w}.{p}"] = f"{theirs}.{their_attn}.{proj}.{p}"
        for p in ("weight", "bias"):
            t[f"{ours}.{our_block}.norm.{p}"] = f"{theirs}.{their_norm}.{p}"
    for p in ("weight", "bias"):
        t[f"{ours}.ffn.linear1.{p}"] = f"{theirs}.fc1.{p}"
        t[f"{ours}.ffn.linear2.{p}"] = f"{theirs}.fc2.{p}"
        t[f"{ours}.ffn_block.norm.{p}"] = f"{theirs}.final_layer_norm.{p}"
    return t


def _drop_offset(t: torch.Tensor) -> torch.Tensor:
    return t[2:]      # Hugging Face's positions start at row 2 (fairseq's offset)


def hf_bart_table(cfg: BartConfig) -> dict[str, str | Source]:
    """Our keys -> ``BartForConditionalGeneration`` keys (their position tables have ``max_len + 2`` rows)."""
    t: dict[str, str | Source] = {"embed.weight": "model.shared.weight",
                                  "enc_pos.weight": Source("model.encoder.embed_positions.weight", _drop_offset),
                                  "dec_pos.weight": Source("model.decoder.embed_positions.weight", _drop_offset)}
    for p in ("weight", "bias"):
        t[f"enc_norm.{p}"] = f"model.encoder.layernorm_embedding.{p}"
        t[f"dec_norm.{p}"] = f"model.decoder.layernorm_embedding.{p}"
    for i in range(cfg.encoder_layers):
        t |= _layer_table(f"encoder.layers.{i}", f"model.encoder.layers.{i}", cross=False)
    for i in range(cfg.decoder_layers):
        t |= _layer_table(f"decoder.layers.{i}", f"model.decoder.layers.{i}", cross=True)
    return t


def load_hf_bart(ours: Bart, theirs: nn.Module | Mapping[str, torch.Tensor]) -> Bart:
    """Copy a Hugging Face ``BartForConditionalGeneration`` (a model or its state dict, same sizes)
    into ``ours``, every tensor used once. Their encoder and decoder ``embed_tokens`` and their
    ``lm_head`` are ``model.shared`` (tied), as our ``lm_head`` is our ``embed``. Their
    ``final_logits_bias`` buffer must be zero (it is in the released models): ours has no bias.
    Returns ``ours``."""
    if not isinstance(ours, Bart):
        raise TypeError(f"ours must be our Bart, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    bias = state.get("final_logits_bias")
    if bias is not None and bias.abs().max() > 0:
        raise ValueError("final_logits_bias is not zero; lib.models.bart.Bart has no output bias")
    tied_theirs = [k for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                               "lm_head.weight") if k in state]
    return copy_weights(ours, state, hf_bart_table(ours.cfg), tied=["lm_head.weight"], tied_theirs=tied_theirs,
                        ignore_theirs=["final_logits_bias"] if bias is not None else [])
