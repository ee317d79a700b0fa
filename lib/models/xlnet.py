"""XLNet: permutation language modelling with two-stream attention (Yang et al., 2019).

An autoregressive (AR) language model factorises ``p(x) = prod_t p(x_t | x_<t)``: exact, but
each token sees one side only. An autoencoding (AE) model such as BERT predicts masked tokens
from both sides, but (1) predicts the masked tokens *independently* of each other given the
rest, and (2) sees ``[MASK]`` in pretraining and never in fine-tuning. XLNet keeps the AR
product but over a random **factorisation order** ``z`` (a permutation of the positions)::

    max E_z [ sum_t log p(x_{z_t} | x_{z_<t}) ]

The tokens stay in place (the positions and the relative encoding are those of the text);
only the attention masks change. Predicting ``x_{z_t}`` needs *where* it is (two orders that
share ``z_<t`` but put different positions next would otherwise get the same prediction)
but must not see *what* it is; yet when ``x_{z_t}`` is context for a later token, its content
is needed. Hence two streams through the same layers (same weights):

* the **content stream** ``h``: position ``z_t`` attends to ``z_<=t`` (itself included) - it
  is an ordinary Transformer-XL state;
* the **query stream** ``g``: position ``z_t`` attends to the content of ``z_<t`` only, and
  starts from one learned vector ``w`` (``mask_emb``), so all it knows of its own token is
  its position (through the relative encoding).

The output layer reads the query stream. XLNet predicts only the last ``1/K`` tokens of each
order (*partial prediction*; the paper's large model uses K = 6), for which enough context exists.

Read top to bottom::

    permutation_masks       content and query masks (True = may attend) from an order z
    partial_targets         which positions are predicted: the last num_predict of z
    XLNetConfig, XLNet      embeddings, the layers of lib.models.transformer_xl run twice per
                            layer (content, query), memory, segment term, tied output layer
    hf_xlnet_table          our keys <- XLNetLMHeadModel keys
    load_hf_xlnet           copies an XLNetLMHeadModel into ours with that table

Shapes are batch-first (HF works sequence-first inside). Masks are boolean, True = may attend.

Explained in chapters/09_transformer_xl_xlnet.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.layers import num_parameters
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.models.transformer_xl import (RelativeLayer, TransformerXLConfig, init_weights, layer_table,
                                       relative_distances, relative_sinusoid, update_memory)
from lib.validate import check_int, check_tensor, check_token_ids

__all__ = ["permutation_masks", "partial_targets", "XLNetConfig", "XLNetOutput", "XLNet", "hf_xlnet_table",
           "load_hf_xlnet"]


def _ranks(perm: torch.Tensor) -> torch.Tensor:
    check_tensor("perm", perm, dtype=torch.long, min_dim=1)
    if perm.dim() > 2:
        raise ValueError(f"perm must be (T,) or (B, T), got shape {tuple(perm.shape)}")
    T = perm.shape[-1]
    if not torch.equal(perm.sort(dim=-1).values, torch.arange(T, device=perm.device).expand_as(perm)):
        raise ValueError(f"perm must be a permutation of 0..{T - 1} in every row, got {perm.tolist()}")
    return perm.argsort(dim=-1)                 # rank[i]: the step of the order at which i comes


def permutation_masks(perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``perm (T,)`` or ``(B, T)``, the factorisation order ``z`` (``perm[t]`` = position
    predicted at step ``t``) -> ``(content, query)`` masks ``(..., T, T)``, True = may attend:

    ``content[i, j] = rank(j) <= rank(i)``   (sees the positions before it in z, and itself)
    ``query[i, j]   = rank(j) <  rank(i)``   (the same without itself)"""
    rank = _ranks(perm)
    before = rank[..., None, :] <= rank[..., :, None]
    return before, before & ~torch.eye(perm.shape[-1], dtype=torch.bool, device=perm.device)


def partial_targets(perm: torch.Tensor, num_predict: int) -> torch.Tensor:
    """Bool ``(..., T)``: True at the positions of the last ``num_predict`` steps of ``perm``."""
    rank = _ranks(perm)
    check_int("num_predict", num_predict, 1, perm.shape[-1] - 1)
    return rank >= perm.shape[-1] - num_predict


@dataclass
class XLNetConfig(TransformerXLConfig):
    """Hyper-parameters (a small character-level default): Transformer-XL's, without memory by
    default (a permutation LM trains on single segments)."""
    mem_len: int = 0


@dataclass
class XLNetOutput:
    content: torch.Tensor                       # h, (B, T, D)
    query: torch.Tensor | None                  # g, (B, T, D) when a permutation was given
    mems: list[torch.Tensor] | None             # the next segment's memory, one per layer


class XLNet(nn.Module):
    """The XLNet encoder with its tied output layer (``lm_logits``)."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        if not isinstance(cfg, XLNetConfig):
            raise TypeError(f"cfg must be an XLNetConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, cfg.d_model))      # w, where g starts
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            RelativeLayer(cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner, cfg.dropout, cfg.activation,
                          cfg.layer_norm_eps, segments=True) for _ in range(cfg.n_layer))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.apply(init_weights)
        nn.init.normal_(self.mask_emb, std=0.02)
        self.lm_head.weight = self.word_embedding.weight

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude=[self.word_embedding, self.lm_head] if exclude_embeddings else ())

    def forward(self, idx: torch.Tensor, perm: torch.Tensor | None = None, mems: list[torch.Tensor] | None = None,
                token_type_ids: torch.Tensor | None = None, mem_len: int | None = None) -> XLNetOutput:
        """``idx (B, T)``; ``perm (T,)`` or ``(B, T)`` a factorisation order (None: every position
        sees every other, no query stream - fine-tuning); ``mems`` one ``(B, M, D)`` per layer
        (every position may attend to all of it); ``token_type_ids (B, T)`` segment ids."""
        check_token_ids("idx", idx, self.cfg.vocab_size)
        B, T = idx.shape
        M = 0 if mems is None else mems[0].shape[1]
        if mems is not None and len(mems) != len(self.layers):
            raise ValueError(f"mems must hold one tensor per layer ({len(self.layers)}), got {len(mems)}")
        mem_len = self.cfg.mem_len if mem_len is None else check_int("mem_len", mem_len, 0)
        mask_h = mask_g = None
        if perm is not None:
            if perm.shape[-1] != T:
                raise ValueError(f"perm must order the {T} positions of idx, got shape {tuple(perm.shape)}")
            mask_h, mask_g = permutation_masks(perm)
            if M:                                                  # the memory is visible to all
                seen = torch.ones(*mask_h.shape[:-1], M, dtype=torch.bool, device=idx.device)
                mask_h, mask_g = torch.cat([seen, mask_h], -1), torch.cat([seen, mask_g], -1)
        different = None
        if token_type_ids is not None:
            check_tensor("token_type_ids", token_type_ids, dtype=torch.long, shape=(B, T))
            keys = token_type_ids if M == 0 else torch.cat([token_type_ids.new_zeros(B, M), token_type_ids], 1)
            different = token_type_ids[:, :, None] != keys[:, None, :]
        pos = self.drop(relative_sinusoid(relative_distances(T, M + T, bidirectional=True).to(idx.device),
                                          self.cfg.d_model))
        h = self.drop(self.word_embedding(idx))
        g = None if perm is None else self.drop(self.mask_emb.expand(B, T, -1))
        new_mems = []
        for i, layer in enumerate(self.layers):
            mem = None if mems is None else mems[i]
            new_mems.append(update_memory(mem, h, mem_len))
            context = h if mem is None else torch.cat([mem, h], dim=1)     # keys, values: content only
            if g is not None:
                g = layer(g, context, pos, mask_g, different)              # query stream: same weights
            h = layer(h, context, pos, mask_h, different)                  # content stream
        return XLNetOutput(self.drop(h), None if g is None else self.drop(g), None if mem_len == 0 else new_mems)

    def lm_logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(states)

    def permutation_lm_loss(self, idx: torch.Tensor, perm: torch.Tensor, num_predict: int) -> torch.Tensor:
        """Mean cross-entropy of the query stream at the last ``num_predict`` positions of each order."""
        out = self.forward(idx, perm)
        target = partial_targets(perm, num_predict).expand_as(idx)
        return F.cross_entropy(self.lm_logits(out.query[target]), idx[target])


def hf_xlnet_table(cfg: XLNetConfig) -> dict[str, str | Source]:
    """Our :class:`XLNet` <- ``XLNetLMHeadModel`` (its ``.transformer`` is the ``XLNetModel``).
    Both output weights are the token embedding (tied) and not in the table; the output bias is."""
    t: dict[str, str | Source] = {"word_embedding.weight": "transformer.word_embedding.weight",
                                  "mask_emb": "transformer.mask_emb", "lm_head.bias": "lm_loss.bias"}
    for i in range(cfg.n_layer):
        t |= layer_table(f"layers.{i}", f"transformer.layer.{i}", segments=True)
    return t


def load_hf_xlnet(ours: XLNet, theirs: nn.Module | Mapping[str, torch.Tensor]) -> XLNet:
    """Copy a Hugging Face ``XLNetLMHeadModel`` (a model or its state dict, same sizes) into
    ``ours``, every tensor used once; our ``lm_head.weight`` and their ``lm_loss.weight`` are the
    word embedding (tied). Returns ``ours``."""
    if not isinstance(ours, XLNet):
        raise TypeError(f"ours must be our XLNet, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    return copy_weights(ours, state, hf_xlnet_table(ours.cfg), tied=["lm_head.weight"],
                        tied_theirs=[k for k in ("lm_loss.weight",) if k in state])
