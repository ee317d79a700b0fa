"""ALBERT (Lan et al., 2020): BERT with far fewer parameters.

Three changes to BERT. This file imports BERT's unchanged parts by name from
:mod:`lib.models.bert` (``BertLayer``, ``BertPooler``, ``BertMLMHead``, ``pretraining_output``)
and writes the ones that change in full:

1. **Factorised embedding.** BERT's token embedding is ``V x H``: every token gets a vector as
   wide as the hidden layers. ALBERT embeds tokens in a small space ``E`` and projects up:
   ``V x E + E x H`` parameters instead of ``V x H`` (30,000 x 128 + 128 x 768 = 3.9M instead of
   23M for the base size). :class:`AlbertEmbeddings` is BERT's embedding module at width ``E``
   (token, segment and position tables, LayerNorm, dropout) followed by the ``E -> H`` projection.
2. **Cross-layer parameter sharing.** ``sharing="all"`` (ALBERT's default): one layer's weights
   used by every layer, so the encoder's parameters do not grow with depth; ``"attention"`` or
   ``"ffn"``: only the attention (with its LayerNorm) or only the feed-forward (with its
   LayerNorm) shared, the paper's ablation; ``"none"``: BERT's stack. :class:`AlbertEncoder`.
3. **Sentence-order prediction (SOP)** instead of next-sentence prediction: the two segments are
   always consecutive text of one document, in order (label 0) or swapped (label 1). NSP's
   negatives come from another document, so NSP can be solved by noticing a change of topic;
   ALBERT dropped it because it is too easy, not to save computation. :class:`AlbertForPreTraining`
   has the MLM head (at width ``E``, tied to the token embedding) and the SOP head.

As in the released models and Hugging Face's ``AlbertModel``, the feed-forward and the MLM head
use GELU's tanh approximation (``"gelu_new"``), and the SOP head applies dropout to the pooled
``[CLS]`` state before its linear layer.

Interface
---------
``AlbertConfig(BertConfig)`` adds ``embedding_size=128``, ``sharing="all"``,
``activation="gelu_tanh"``, ``classifier_dropout=0.1``; ``AlbertConfig.from_hf(hf_config)``;
``PUBLISHED`` (name -> config): the paper's Table 1, vocabulary 30,000.
``AlbertModel(cfg)(input_ids, token_type_ids=None, attention_mask=None)`` -> ``BertOutput``.
``AlbertForPreTraining(cfg)(..., mlm_labels=None, sop_labels=None)`` -> ``PreTrainingOutput``
    whose ``nsp_logits`` are the SOP logits (0 = in order, 1 = swapped, Hugging Face's labels).
``lib.layers.count_parameters(AlbertModel, cfg)``: its parameters counted on the meta device (no memory).
``hf_albert_table(prefix="albert.", heads=True)`` and ``load_hf_albert(ours, theirs)``: weights
    of Hugging Face's ``AlbertForPreTraining`` (or ``AlbertModel`` with ``heads=False``).

Explained in chapters/10_bart_albert.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn

from lib.config import hf_reader
from lib.layers import ACTIVATIONS, num_parameters as _count
from lib.models.bert import (BertConfig, BertLayer, BertMLMHead, BertOutput, BertPooler, PreTrainingOutput,
                             check_inputs, init_bert_weights, pretraining_output)
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.validate import check_choice, check_int, check_probability

__all__ = ["AlbertConfig", "AlbertEmbeddings", "AlbertEncoder", "AlbertModel", "AlbertForPreTraining",
           "PUBLISHED", "SHARING", "hf_albert_table", "load_hf_albert"]

SHARING = ("all", "attention", "ffn", "none")


@dataclass
class AlbertConfig(BertConfig):
    """BERT's hyper-parameters plus the embedding width, the sharing and the activation."""
    vocab_size: int = 30000
    embedding_size: int = 128
    sharing: str = "all"
    activation: str = "gelu_tanh"
    classifier_dropout: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        check_int("AlbertConfig.embedding_size", self.embedding_size, 1)
        check_choice("AlbertConfig.sharing", self.sharing, SHARING)
        check_choice("AlbertConfig.activation", self.activation, sorted(ACTIVATIONS))
        check_probability("AlbertConfig.classifier_dropout", self.classifier_dropout, allow_one=False)

    @classmethod
    def from_hf(cls, hf_config) -> "AlbertConfig":
        """From a ``transformers.AlbertConfig`` (or its ``config.json`` as a dict): one group of layers,
        shared by every layer (the paper's ALBERT)."""
        get, need = hf_reader(hf_config, cls.__name__)
        need("num_hidden_groups", (1,), 1)
        need("inner_group_num", (1,), 1)
        need("position_embedding_type", (None, "absolute"), "absolute")
        activation = {"gelu_new": "gelu_tanh", "gelu": "gelu", "relu": "relu"}.get(get("hidden_act", "gelu_new"))
        if activation is None:
            raise ValueError(f"{cls.__name__} implements hidden_act gelu_new, gelu and relu, got {get('hidden_act')!r}")
        return cls(vocab_size=get("vocab_size"), embedding_size=get("embedding_size"), hidden_size=get("hidden_size"),
                   num_layers=get("num_hidden_layers"), num_heads=get("num_attention_heads"),
                   intermediate_size=get("intermediate_size"), max_position=get("max_position_embeddings"),
                   type_vocab_size=get("type_vocab_size"), dropout=get("hidden_dropout_prob"),
                   attention_dropout=get("attention_probs_dropout_prob"), layer_norm_eps=get("layer_norm_eps"),
                   pad_id=get("pad_token_id", 0) or 0, initializer_range=get("initializer_range", 0.02),
                   activation=activation, classifier_dropout=get("classifier_dropout_prob", 0.1), sharing="all")


# Lan et al. (2020), Table 1 (E = 128, everything shared); a variant is ``PUBLISHED[name].replace(...)``.
PUBLISHED: dict[str, AlbertConfig] = {
    "ALBERT-base": AlbertConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "ALBERT-large": AlbertConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "ALBERT-xlarge": AlbertConfig(hidden_size=2048, num_layers=24, num_heads=16, intermediate_size=8192),
    "ALBERT-xxlarge": AlbertConfig(hidden_size=4096, num_layers=12, num_heads=64, intermediate_size=16384),
}


class AlbertEmbeddings(nn.Module):
    """BERT's embeddings at width ``E``: ``LayerNorm(token + segment + position)`` with ``V x E``
    tokens, dropout, then a linear projection ``E -> H``."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.cfg = cfg
        E = cfg.embedding_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, E, padding_idx=cfg.pad_id)
        self.position_embeddings = nn.Embedding(cfg.max_position, E)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, E)
        self.norm = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.project = nn.Linear(E, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + self.position_embeddings(pos)
        return self.project(self.drop(self.norm(x)))


class AlbertEncoder(nn.Module):
    """``num_layers`` of BERT's layers (with ALBERT's activation), shared. ``"all"`` keeps one layer
    and runs it ``num_layers`` times; ``"attention"``/``"ffn"`` give every layer the first layer's
    attention (or feed-forward) module and its residual block's LayerNorm; ``"none"`` is BERT's stack."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.num_layers, self.sharing = cfg.num_layers, cfg.sharing
        count = 1 if cfg.sharing == "all" else cfg.num_layers
        self.layers = nn.ModuleList(BertLayer(cfg, activation=cfg.activation) for _ in range(count))
        shared = {"attention": ("attention", "attention_block"), "ffn": ("ffn", "ffn_block")}.get(cfg.sharing, ())
        for layer in self.layers[1:]:
            for part in shared:
                setattr(layer, part, getattr(self.layers[0], part))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False):
        """-> ``(last (B, T, H), hidden states or None, attention maps or None)``, as ``BertEncoder``:
        one state and one map per layer run, ``num_layers`` of them whatever the sharing."""
        states = [x] if output_hidden_states else None
        maps = [] if output_attentions else None
        for i in range(self.num_layers):
            layer = self.layers[0] if self.sharing == "all" else self.layers[i]
            x, w = layer(x, mask, need_weights=output_attentions)
            if output_hidden_states:
                states.append(x)
            if output_attentions:
                maps.append(w)
        return x, (tuple(states) if states is not None else None), (tuple(maps) if maps is not None else None)


class AlbertModel(nn.Module):
    """``AlbertModel(cfg)(input_ids, token_type_ids=None, attention_mask=None)`` -> ``BertOutput``:
    :class:`AlbertEmbeddings` -> :class:`AlbertEncoder` -> BERT's pooler."""

    def __init__(self, cfg: AlbertConfig, add_pooler: bool = True):
        super().__init__()
        if not isinstance(cfg, AlbertConfig):
            raise TypeError(f"cfg must be an AlbertConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embeddings = AlbertEmbeddings(cfg)
        self.encoder = AlbertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooler else None
        self.apply(lambda m: init_bert_weights(m, cfg.initializer_range))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The token embedding table, ``V x E`` (what the MLM decoder is tied to)."""
        return self.embeddings.word_embeddings

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameters, shared ones counted once; ``exclude_embeddings`` leaves out the embeddings
        (tables and projection)."""
        return _count(self, exclude=[self.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        token_type_ids, keep = check_inputs(self.cfg, input_ids, token_type_ids, attention_mask)
        mask = None if keep is None else keep[:, None, None, :]       # (B, 1, 1, T): hide padding keys
        x = self.embeddings(input_ids, token_type_ids)
        last, states, maps = self.encoder(x, mask, output_hidden_states, output_attentions)
        pooled = self.pooler(last) if self.pooler is not None else None
        return BertOutput(last, pooled, states, maps)


class AlbertForPreTraining(nn.Module):
    """ALBERT with BERT's MLM head (``H -> E``, tied ``E -> V`` decoder, ALBERT's activation) and
    the sentence-order head: dropout, then ``Linear(H, 2)`` on the pooled ``[CLS]`` (held in ``nsp``)."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = AlbertModel(cfg)
        self.mlm = BertMLMHead(cfg, self.bert.word_embeddings, activation=cfg.activation)
        self.nsp = nn.Sequential(nn.Dropout(cfg.classifier_dropout), nn.Linear(cfg.hidden_size, 2))
        for m in (self.mlm.dense, self.mlm.norm, self.nsp[1]):
            init_bert_weights(m, cfg.initializer_range)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return _count(self, exclude=[self.bert.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                sop_labels: torch.Tensor | None = None, only_masked: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False) -> PreTrainingOutput:
        """As ``BertForPreTraining.forward``; ``sop_labels (B,)`` 0 = in order, 1 = swapped (the
        SOP logits are the output's ``nsp_logits``)."""
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions)
        return pretraining_output(out, self.mlm, self.nsp, mlm_labels, sop_labels, only_masked)


# ----------------------------------------------------------------------------- reference

def _pair(ours: str, theirs: str) -> dict[str, str]:
    return {f"{ours}.weight": f"{theirs}.weight", f"{ours}.bias": f"{theirs}.bias"}


def hf_albert_table(prefix: str = "albert.", heads: bool = True) -> dict[str, str | Source]:
    """Our keys -> Hugging Face ``AlbertForPreTraining`` keys (``prefix="albert."``, ``heads=True``)
    or ``AlbertModel`` keys (``prefix=""``, ``heads=False``, ours an ``AlbertModel``). One shared
    layer group with one layer (Hugging Face's default, our ``sharing="all"``)."""
    ours = "bert." if heads else ""
    e, te = f"{ours}embeddings.", f"{prefix}embeddings."
    t: dict[str, str | Source] = {f"{e}{n}.weight": f"{te}{n}.weight"
                                  for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
    t |= _pair(f"{e}norm", f"{te}LayerNorm") | _pair(f"{e}project", f"{prefix}encoder.embedding_hidden_mapping_in")
    o, h = f"{ours}encoder.layers.0.", f"{prefix}encoder.albert_layer_groups.0.albert_layers.0."
    for q, name in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "dense")):
        t |= _pair(f"{o}attention.w_{q}", f"{h}attention.{name}")
    t |= _pair(f"{o}attention_block.norm", f"{h}attention.LayerNorm")
    t |= _pair(f"{o}ffn.linear1", f"{h}ffn") | _pair(f"{o}ffn.linear2", f"{h}ffn_output")
    t |= _pair(f"{o}ffn_block.norm", f"{h}full_layer_layer_norm") | _pair(f"{ours}pooler.dense", f"{prefix}pooler")
    if heads:
        t |= _pair("mlm.dense", "predictions.dense") | _pair("mlm.norm", "predictions.LayerNorm")
        t["mlm.bias"] = "predictions.bias"
        t |= _pair("nsp.1", "sop_classifier.classifier")
    return t


def load_hf_albert(ours: AlbertModel | AlbertForPreTraining,
                   theirs: nn.Module | Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy Hugging Face's ``AlbertForPreTraining`` into our :class:`AlbertForPreTraining`, or its
    ``AlbertModel`` into our :class:`AlbertModel` (``sharing="all"``, same sizes); ``theirs`` a
    model or its state dict. Both MLM decoders are the token embedding (tied). Returns ``ours``."""
    heads = isinstance(ours, AlbertForPreTraining)
    if not heads and not isinstance(ours, AlbertModel):
        raise TypeError(f"ours must be an AlbertForPreTraining or AlbertModel, got {type(ours).__name__}")
    if ours.cfg.sharing != "all":
        raise ValueError("Hugging Face's ALBERT shares every layer: build ours with sharing='all', "
                         f"got {ours.cfg.sharing!r}")
    state = as_state_dict(theirs)
    tied_theirs = [k for k in ("predictions.decoder.weight", "predictions.decoder.bias") if k in state]
    return copy_weights(ours, state, hf_albert_table("albert." if heads else "", heads),
                        tied=["mlm.decoder.weight"] if heads else [], tied_theirs=tied_theirs if heads else [],
                        ignore_theirs=[k for k in state if k.endswith("position_ids")])
