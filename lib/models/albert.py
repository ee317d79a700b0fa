"""ALBERT (Lan et al., 2020): BERT with far fewer parameters, built on ``lib.models.bert``.

Three changes to BERT, each a replaceable part of :mod:`lib.models.bert`:

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
``activation="gelu_tanh"``, ``classifier_dropout=0.1``; presets ``AlbertConfig.base()``,
``.large()``, ``.xlarge()``, ``.xxlarge()`` (the paper's Table 1, vocabulary 30,000) and
``PUBLISHED`` (name -> config).
``AlbertModel(cfg)(input_ids, token_type_ids=None, attention_mask=None)`` -> ``BertOutput``.
``AlbertForPreTraining(cfg)(..., mlm_labels=None, sop_labels=None)`` -> ``PreTrainingOutput``
    whose ``nsp_logits`` are the SOP logits (0 = in order, 1 = swapped, Hugging Face's labels).
``lib.layers.count_parameters(AlbertModel, cfg)``: its parameters counted on the meta device (no memory).
``hf_albert_table(prefix="albert.", heads=True)`` and ``copy_from_hf_albert(ours, hf)``: weights
    of Hugging Face's ``AlbertForPreTraining`` (or ``AlbertModel`` with ``heads=False``).

Explained in chapters/10_bart_albert.ipynb.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn

from lib.layers import ACTIVATIONS, PositionwiseFeedForward
from lib.models.bert import (BertConfig, BertEmbeddings, BertEncoder, BertForPreTraining, BertLayer, BertMLMHead,
                             BertModel, PreTrainingOutput, init_bert_weights)
from lib.models.reference import Source, copy_weights
from lib.validate import check_choice, check_int, check_probability

__all__ = ["AlbertConfig", "AlbertEmbeddings", "AlbertLayer", "AlbertEncoder", "AlbertModel",
           "AlbertMLMHead", "AlbertForPreTraining", "PUBLISHED", "SHARING",
           "hf_albert_table", "copy_from_hf_albert"]

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
    def base(cls, **overrides) -> "AlbertConfig":
        """ALBERT-base: 12 layers, hidden 768, E = 128, all shared (12M parameters in the paper)."""
        return cls(**{"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 3072,
                      **overrides})

    @classmethod
    def large(cls, **overrides) -> "AlbertConfig":
        """ALBERT-large: 24 layers, hidden 1024 (18M)."""
        return cls(**{"hidden_size": 1024, "num_layers": 24, "num_heads": 16, "intermediate_size": 4096,
                      **overrides})

    @classmethod
    def xlarge(cls, **overrides) -> "AlbertConfig":
        """ALBERT-xlarge: 24 layers, hidden 2048 (60M)."""
        return cls(**{"hidden_size": 2048, "num_layers": 24, "num_heads": 16, "intermediate_size": 8192,
                      **overrides})

    @classmethod
    def xxlarge(cls, **overrides) -> "AlbertConfig":
        """ALBERT-xxlarge: 12 layers, hidden 4096, 64 heads (235M in the paper)."""
        return cls(**{"hidden_size": 4096, "num_layers": 12, "num_heads": 64, "intermediate_size": 16384,
                      **overrides})

    def embedding_view(self) -> BertConfig:
        """The BERT configuration of the embedding tables: BERT's embeddings at width ``E``."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(BertConfig)}
        return BertConfig(**{**fields, "hidden_size": self.embedding_size, "num_heads": 1})


PUBLISHED: dict[str, AlbertConfig] = {"ALBERT-base": AlbertConfig.base(), "ALBERT-large": AlbertConfig.large(),
                                      "ALBERT-xlarge": AlbertConfig.xlarge(), "ALBERT-xxlarge": AlbertConfig.xxlarge()}


class AlbertEmbeddings(BertEmbeddings):
    """BERT's embeddings at width ``E`` (``V x E`` tokens), then a linear projection ``E -> H``."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__(cfg.embedding_view())
        self.cfg = cfg
        self.project = nn.Linear(cfg.embedding_size, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.project(super().forward(input_ids, token_type_ids))


class AlbertLayer(BertLayer):
    """BERT's post-LN layer with the configured activation in the feed-forward."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__(cfg)
        if cfg.activation != "gelu":
            self.ffn = PositionwiseFeedForward(cfg.hidden_size, cfg.intermediate_size, dropout=0.0,
                                               activation=cfg.activation)


class AlbertEncoder(BertEncoder):
    """``num_layers`` layers with ALBERT's sharing. ``"all"`` keeps one layer and runs it
    ``num_layers`` times; ``"attention"``/``"ffn"`` give every layer the first layer's attention
    (or feed-forward) module and its residual block's LayerNorm; ``"none"`` is BERT's stack."""

    def __init__(self, cfg: AlbertConfig):
        nn.Module.__init__(self)            # not BertEncoder's: "all" must not build num_layers layers
        self.num_layers, self.sharing = cfg.num_layers, cfg.sharing
        count = 1 if cfg.sharing == "all" else cfg.num_layers
        self.layers = nn.ModuleList(self.build_layer(cfg) for _ in range(count))
        shared = {"attention": ("attention", "attention_block"), "ffn": ("ffn", "ffn_block")}.get(cfg.sharing, ())
        for layer in self.layers[1:]:
            for part in shared:
                setattr(layer, part, getattr(self.layers[0], part))

    def build_layer(self, cfg: AlbertConfig) -> nn.Module:
        return AlbertLayer(cfg)

    def layer_sequence(self):
        if self.sharing == "all":
            return (self.layers[0] for _ in range(self.num_layers))
        return iter(self.layers)


class AlbertModel(BertModel):
    """BERT with :class:`AlbertEmbeddings` and :class:`AlbertEncoder`."""

    def __init__(self, cfg: AlbertConfig, add_pooler: bool = True):
        if not isinstance(cfg, AlbertConfig):
            raise TypeError(f"cfg must be an AlbertConfig, got {type(cfg).__name__}")
        super().__init__(cfg, add_pooler)

    def build_embeddings(self, cfg: AlbertConfig) -> nn.Module:
        return AlbertEmbeddings(cfg)

    def build_encoder(self, cfg: AlbertConfig) -> nn.Module:
        return AlbertEncoder(cfg)


class AlbertMLMHead(BertMLMHead):
    """BERT's MLM head (``H -> E``, LayerNorm, tied ``E -> V`` decoder, bias) with ALBERT's activation."""

    def __init__(self, cfg: AlbertConfig, word_embeddings: nn.Embedding):
        super().__init__(cfg, word_embeddings)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.norm(self.act(self.dense(hidden))), self.decoder.weight, self.bias)


class AlbertForPreTraining(BertForPreTraining):
    """ALBERT with the MLM head and the sentence-order head (``nsp`` holds the SOP classifier)."""
    backbone = AlbertModel

    def __init__(self, cfg: AlbertConfig):
        super().__init__(cfg)
        self.mlm = AlbertMLMHead(cfg, self.bert.word_embeddings)
        self.nsp = nn.Sequential(nn.Dropout(cfg.classifier_dropout), self.nsp)   # SOP: dropout, then Linear(H, 2)
        for m in (self.mlm.dense, self.mlm.norm):
            init_bert_weights(m, cfg.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                sop_labels: torch.Tensor | None = None, only_masked: bool = False,
                **bert_kwargs) -> PreTrainingOutput:
        """As ``BertForPreTraining.forward``; ``sop_labels (B,)`` 0 = in order, 1 = swapped."""
        return super().forward(input_ids, token_type_ids, attention_mask, mlm_labels, sop_labels, only_masked,
                               **bert_kwargs)



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


def copy_from_hf_albert(ours: nn.Module, hf: nn.Module) -> nn.Module:
    """Copy Hugging Face's ``AlbertForPreTraining`` into our :class:`AlbertForPreTraining`, or its
    ``AlbertModel`` into our :class:`AlbertModel` (``sharing="all"``, same sizes)."""
    heads = isinstance(ours, AlbertForPreTraining)
    if not heads and not isinstance(ours, AlbertModel):
        raise TypeError(f"ours must be an AlbertForPreTraining or AlbertModel, got {type(ours).__name__}")
    cfg = ours.cfg
    if cfg.sharing != "all":
        raise ValueError(f"Hugging Face's ALBERT shares every layer: build ours with sharing='all', got {cfg.sharing!r}")
    tied = ["mlm.decoder.weight"] if heads else []
    tied_theirs = ["predictions.decoder.weight", "predictions.decoder.bias"] if heads else []
    state = hf.state_dict()
    return copy_weights(ours, state, hf_albert_table("albert." if heads else "", heads), tied=tied,
                        tied_theirs=[k for k in tied_theirs if k in state])
