"""GPT: a decoder-only Transformer language model (Radford et al., 2018, 2019).

Read top to bottom, in the order the papers explain it::

    GPTConfig            the hyper-parameters (GPT-2 small by default)
    MLP                  position-wise feed-forward, 4 * n_embd wide, GELU
    Block                masked self-attention + MLP, post-LN (GPT-1) or pre-LN (GPT-2)
    GPT                  token + learned position embeddings, N blocks, (final LayerNorm),
                         output layer tied to the token embedding
    GPTClassifier        GPT-1's fine-tuning head: a linear layer on the last token's state,
                         trained with the auxiliary language-modelling loss

The two layouts (``GPTConfig.norm_first``)::

    GPT-1, post-LN:  h = LN_1(x + Attn(x));        y = LN_2(h + MLP(h))       no final LN
    GPT-2, pre-LN:   h = x + Attn(LN_1(x));        y = h + MLP(LN_2(h))       final LN_f

GPT-2 also scales the initial weights of the layers that write into the residual stream
(the attention output and the MLP's second layer) by ``1/sqrt(N)`` for the ``N = 2 * n_layer``
residual additions, so that the variance of the stream does not grow with depth.

Attention is :class:`lib.attention.MultiHeadAttention` (separate q, k, v, o parameters; the
reference implementations keep q, k, v in one fused ``c_attn`` of width ``3 * n_embd``, which
the name tables below split). Its ``project_qkv`` still computes the three in one matrix
product, as ``c_attn`` does. ``fused=True`` (the default) calls
``F.scaled_dot_product_attention``, the flash / memory-efficient kernels on a GPU.

Interface shared with the other models of the course::

    logits, loss = model(idx, targets=None, attention_mask=None)   # training
    logits, cache = model.decode(tokens, cache=None)               # what lib.generate calls
    model.num_parameters(exclude_embeddings=False)

``decode`` takes new tokens ``(B, t)`` and returns ``logits (B, t, V)`` and the
:class:`~lib.kv_cache.KVCache` extended with their keys and values; the positions
of the new tokens continue from ``cache.length``. The cache has ``length`` and
``reorder(index)`` (beam search).

The name tables :func:`hf_gpt2_table` and :func:`hf_openai_gpt_table` map our weights to
Hugging Face's ``GPT2LMHeadModel`` and ``OpenAIGPTLMHeadModel``; :func:`load_hf_gpt` copies
either in (it knows which from their keys); the tests check that the logits agree.

Explained in chapters/07_gpt.ipynb.
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
from lib.attention import MultiHeadAttention, look_ahead_mask
from lib.kv_cache import KVCache
from lib.models.reference import Source, as_state_dict, copy_weights, split, transpose
from lib.validate import check_token_ids

__all__ = ["GPTConfig", "MLP", "Block", "GPT", "GPTClassifier", "PUBLISHED",
           "hf_gpt2_table", "hf_openai_gpt_table", "load_hf_gpt"]


@dataclass
class GPTConfig(ModelConfig):
    """Hyper-parameters. The defaults are GPT-2 small (124M parameters)."""
    vocab_size: int = 50257
    block_size: int = 1024          # the longest context (number of learned positions)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0            # on embeddings, attention weights and residual branches
    norm_first: bool = True         # True: GPT-2 (pre-LN + final LayerNorm); False: GPT-1 (post-LN)
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True        # output layer = token embedding matrix

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def from_hf(cls, hf_config) -> "GPTConfig":
        """From a ``transformers.GPT2Config`` or ``OpenAIGPTConfig`` (or its ``config.json`` as a dict):
        GPT-1 (``model_type`` "openai-gpt") is the post-LN model, GPT-2 the pre-LN one."""
        get, need = hf_reader(hf_config, cls.__name__)
        kind = need("model_type", ("gpt2", "openai-gpt"))
        # GELU in the tanh approximation, which transformers' GPT-1 calls "gelu" and its GPT-2 "gelu_new"
        need("activation_function", ("gelu_new",), "gelu_new") if kind == "gpt2" else need("afn", ("gelu",), "gelu")
        dropout = get("resid_pdrop", 0.1)
        need("embd_pdrop", (dropout,), dropout)
        need("attn_pdrop", (dropout,), dropout)
        return cls(vocab_size=get("vocab_size"), block_size=get("n_positions"), n_layer=get("n_layer"),
                   n_head=get("n_head"), n_embd=get("n_embd"), dropout=dropout, norm_first=kind == "gpt2",
                   layer_norm_eps=get("layer_norm_epsilon", 1e-5), tie_weights=bool(get("tie_word_embeddings", True)))


# Published configurations (vocabulary, context, layers, heads, width).
# GPT-1: Radford et al. (2018), 40,478 BPE tokens, 512 positions, 12 x 768.
# GPT-2: Radford et al. (2019), Table 2; 50,257 byte-level BPE tokens, 1024 positions.
# GPT-3: Brown et al. (2020), Table 2.1; 2048 positions, same vocabulary as GPT-2.
PUBLISHED: dict[str, GPTConfig] = {
    "GPT-1": GPTConfig(vocab_size=40478, block_size=512, n_layer=12, n_head=12, n_embd=768, norm_first=False),
    "GPT-2 small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "GPT-2 medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "GPT-2 large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "GPT-2 XL": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
    "GPT-3 175B": GPTConfig(block_size=2048, n_layer=96, n_head=96, n_embd=12288),
}


class MLP(nn.Module):
    """``c_proj(GELU(c_fc(x)))`` with a hidden width of ``4 * n_embd``.

    GELU in the tanh approximation that both GPT-1 and GPT-2 used
    (Hugging Face calls it ``gelu_new``)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Masked multi-head self-attention and the MLP, each in a residual connection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = MultiHeadAttention(cfg.n_embd, cfg.n_head, dropout=cfg.dropout)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def self_attention(self, x: torch.Tensor, mask: torch.Tensor | None, cache: dict | None,
                       fused: bool) -> torch.Tensor:
        """Attention of the new positions over the cached ones and themselves.

        ``cache`` (a dict, maybe empty) keeps the projected keys and values of every
        position so far, ``(B, H, T_past, d_head)``; it is extended in place. This is
        ``layer_past`` / ``present`` in the original GPT-2 code."""
        q, k, v = self.attn.project_qkv(x)               # one matrix product, like c_attn
        if cache is not None:
            k, v = kv_cache.update(cache, "self", k, v)
        # mask None: plain causal attention (the fused kernel masks the future by itself)
        out, _ = self.attn.attend_heads(q, k, v, mask=mask, fused=fused, is_causal=mask is None)
        return self.drop(out)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: dict | None = None,
                fused: bool = True) -> torch.Tensor:
        if self.norm_first:                                    # GPT-2
            x = x + self.self_attention(self.ln_1(x), mask, cache, fused)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.self_attention(x, mask, cache, fused))   # GPT-1
        return self.ln_2(x + self.mlp(x))


class GPT(nn.Module):
    """The decoder-only language model: ``p(x_t | x_<t)`` for every position at once."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)      # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)      # learned position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2: the layers that add into the residual stream start 1/sqrt(2 * n_layer) smaller.
        for name, p in self.named_parameters():
            if name.endswith(("attn.w_o.weight", "mlp.c_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # -- the shape of the model --------------------------------------------------------

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Trainable parameters, the tied output layer counted once. ``exclude_embeddings``
        leaves out the token and position embeddings (Kaplan et al.'s ``N``)."""
        n = sum(p.numel() for p in self.parameters())       # parameters() skips the tied duplicate
        if exclude_embeddings:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
        return n

    # -- the forward pass --------------------------------------------------------------

    def _check_tokens(self, idx: torch.Tensor, past: int = 0) -> None:
        check_token_ids("tokens", idx, self.cfg.vocab_size)
        if past + idx.shape[1] > self.cfg.block_size:
            raise ValueError(f"positions {past}..{past + idx.shape[1] - 1} exceed block_size="
                             f"{self.cfg.block_size} (the model has no embedding for them)")

    def hidden_states(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      cache: KVCache | None = None, fused: bool = True) -> torch.Tensor:
        """The last layer's states ``(B, T, n_embd)`` (after ``ln_f`` in GPT-2).

        ``attention_mask (B, T)`` bool, True at real tokens (padding anywhere). With a
        ``cache``, the new tokens take positions ``cache.length ...`` and see every cached one."""
        past = cache.length if cache is not None else 0
        self._check_tokens(idx, past)
        B, T = idx.shape
        if cache is not None and len(cache.layers) != len(self.blocks):
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {len(self.blocks)}")
        pos = torch.arange(past, past + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        # (T, past + T); None when it is the plain causal mask of a fresh sequence, which the
        # attention then applies itself (the flash kernels need no explicit mask)
        mask = (None if past == 0 and attention_mask is None
                else look_ahead_mask(T, device=idx.device, num_keys=past + T))
        if attention_mask is not None:
            if cache is not None:
                raise ValueError("attention_mask is not supported together with a cache")
            if attention_mask.dtype != torch.bool or tuple(attention_mask.shape) != (B, T):
                raise ValueError(f"attention_mask must be bool (batch, time)={(B, T)}, True at real "
                                 f"tokens; got dtype {attention_mask.dtype}, shape {tuple(attention_mask.shape)}")
            # Padding keys are hidden; every position still sees itself, so that no row of the
            # attention is empty (with left padding the first queries would have no key at all,
            # and not every fused GPU kernel returns zeros for an empty row). Real tokens are
            # unaffected: they see themselves anyway.
            eye = torch.eye(T, dtype=torch.bool, device=idx.device)
            mask = (look_ahead_mask(T, device=idx.device) & attention_mask[:, None, None, :]) | eye
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache.layers[i] if cache is not None else None, fused=fused)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx (B, T)`` -> ``(logits (B, T, V), loss)``; ``loss`` is the mean next-token
        cross-entropy when ``targets (B, T)`` is given (targets of -100 are ignored)."""
        logits = self.lm_head(self.hidden_states(idx, attention_mask))
        loss = None
        if targets is not None:
            if targets.shape != idx.shape:
                raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks))

    def decode(self, tokens: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """One decoding step for :mod:`lib.generate`: ``tokens (B, t)`` -> ``logits (B, t, V)``
        and the cache extended with them (a new cache when ``cache`` is None)."""
        if cache is None:
            cache = self.new_cache()
        elif not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        return self.lm_head(self.hidden_states(tokens, cache=cache)), cache


class GPTClassifier(nn.Module):
    """GPT-1 fine-tuning (Radford et al., 2018, section 3.2): the pretrained GPT, plus a linear
    layer ``W_y`` on the final state of the last real token of each input (the "extract"
    token). ``forward`` returns class logits and language-model logits, so that the
    fine-tuning loss can be ``L2 + lambda * L1``."""

    def __init__(self, gpt: GPT, num_classes: int, dropout: float = 0.1):
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        self.gpt = gpt
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(gpt.cfg.n_embd, num_classes)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``idx (B, T)``, ``attention_mask (B, T)`` bool with right padding ->
        ``(class logits (B, C), lm logits (B, T, V))``."""
        h = self.gpt.hidden_states(idx, attention_mask)
        last = attention_mask.long().sum(1) - 1                         # index of the extract token
        if int(last.min()) < 0:
            raise ValueError("every row of attention_mask needs at least one real token")
        h_last = h[torch.arange(idx.shape[0], device=idx.device), last]
        return self.head(self.drop(h_last)), self.gpt.lm_head(h)



# ----------------------------------------------------------------------------- references

def _qkv(i: int, fused: str, weight: bool) -> Source:
    """Part ``i`` (q, k, v) of a fused ``c_attn`` of width ``3 * n_embd``."""
    if weight:   # Conv1D weight (in, 3 * out) -> transpose -> (3 * out, in) -> rows i
        return Source(fused, split(i, 3, 0, then=transpose), shared=True)
    return Source(fused, split(i, 3, 0), shared=True)


def _block_table(ours: str, theirs: str) -> dict[str, str | Source]:
    t: dict[str, str | Source] = {}
    for i, name in enumerate(("w_q", "w_k", "w_v")):
        t[f"{ours}.attn.{name}.weight"] = _qkv(i, f"{theirs}.attn.c_attn.weight", True)
        t[f"{ours}.attn.{name}.bias"] = _qkv(i, f"{theirs}.attn.c_attn.bias", False)
    t[f"{ours}.attn.w_o.weight"] = Source(f"{theirs}.attn.c_proj.weight", transpose)
    t[f"{ours}.attn.w_o.bias"] = f"{theirs}.attn.c_proj.bias"
    for layer in ("c_fc", "c_proj"):
        t[f"{ours}.mlp.{layer}.weight"] = Source(f"{theirs}.mlp.{layer}.weight", transpose)
        t[f"{ours}.mlp.{layer}.bias"] = f"{theirs}.mlp.{layer}.bias"
    for ln in ("ln_1", "ln_2"):
        t[f"{ours}.{ln}.weight"] = f"{theirs}.{ln}.weight"
        t[f"{ours}.{ln}.bias"] = f"{theirs}.{ln}.bias"
    return t


def hf_gpt2_table(cfg: GPTConfig) -> dict[str, str | Source]:
    """Our keys -> ``GPT2LMHeadModel`` keys (``norm_first=True``). Our output layer is not in
    the table, nor is theirs: both are the token embedding (tied)."""
    t: dict[str, str | Source] = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
                                  "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
    for i in range(cfg.n_layer):
        t |= _block_table(f"blocks.{i}", f"transformer.h.{i}")
    return t


def hf_openai_gpt_table(cfg: GPTConfig) -> dict[str, str | Source]:
    """Our keys (``norm_first=False``) -> ``OpenAIGPTLMHeadModel`` keys (tied output layers left
    out, as in :func:`hf_gpt2_table`)."""
    t: dict[str, str | Source] = {"wte.weight": "transformer.tokens_embed.weight",
                                  "wpe.weight": "transformer.positions_embed.weight"}
    for i in range(cfg.n_layer):
        t |= _block_table(f"blocks.{i}", f"transformer.h.{i}")
    return t


def load_hf_gpt(ours: GPT, theirs: nn.Module | Mapping[str, torch.Tensor]) -> GPT:
    """Copy Hugging Face's ``GPT2LMHeadModel`` (into ours with ``norm_first=True``) or
    ``OpenAIGPTLMHeadModel`` (``norm_first=False``), a model or its state dict, same sizes, every
    tensor used once; which one it is, their keys say. Both output layers are the token embedding
    (tied); their causal-mask and position-id buffers are not weights. Returns ``ours``."""
    if not isinstance(ours, GPT):
        raise TypeError(f"ours must be our GPT, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    if "transformer.wte.weight" in state:
        table = hf_gpt2_table(ours.cfg)
    elif "transformer.tokens_embed.weight" in state:
        table = hf_openai_gpt_table(ours.cfg)
    else:
        raise ValueError("theirs is neither a GPT2LMHeadModel (transformer.wte) nor an OpenAIGPTLMHeadModel "
                         "(transformer.tokens_embed)")
    buffers = [k for k in state if k.endswith(("position_ids", ".attn.bias", ".attn.masked_bias"))]
    return copy_weights(ours, state, table, tied=["lm_head.weight"],
                        tied_theirs=[k for k in ("lm_head.weight",) if k in state], ignore_theirs=buffers)
