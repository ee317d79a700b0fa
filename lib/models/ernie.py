"""ERNIE (Baidu): BERT's architecture, trained on different targets.

ERNIE 1.0 (Sun et al., 2019, "Enhanced Representation through kNowledge IntEgration") is a
BERT encoder; what changes is the pre-training. Its **knowledge masking** hides whole phrases
and named entities instead of single tokens (``lib.data.knowledge_masking``), and its
**dialogue language model** reads dialogues whose *segment* embeddings are replaced by
*dialogue-role* embeddings (query / response, ``lib.data.dialogue``), with a real-vs-fake
head on ``[CLS]``, in batches that alternate with ordinary masked-LM batches. ERNIE 2.0 (Sun et
al., 2020) adds a **task embedding** for its continual multi-task pre-training: one more table,
indexed by a task id, added to the sum of token, segment and position embeddings. That table is
the only architectural difference from BERT, and it is what Hugging Face's ``ErnieModel``
(``use_task_id=True``) has beside BERT's layers.

So this file imports BERT's unchanged parts by name from ``lib.models.bert`` (``BertEncoder``,
``BertPooler``, ``BertMLMHead``, ``pretraining_output``, ``mean_pool``) and writes in full the
ones that take the task ids::

    ErnieConfig                  BertConfig + use_task_id, task_type_vocab_size
    ErnieEmbeddings              BERT's token + segment + position, + task type when use_task_id
    ErnieModel                   ErnieEmbeddings -> BERT's encoder -> BERT's pooler;
                                 forward(..., task_type_ids=None)
    ErnieForPreTraining          MLM head + the 2-way [CLS] head (NSP for text, real/fake for
                                 dialogues); the dialogue roles go in as token_type_ids
    ErnieForSequenceClassification   the fine-tuning head on the pooled [CLS]
    hf_ernie_table, load_hf_ernie    Hugging Face's ErnieModel / ErnieForPreTraining into ours

The role ids of a dialogue *are* the segment ids: ``token_type_ids`` index the same table BERT
uses for sentences A and B, added to the token embedding, never in place of it.

Explained in chapters/13_ernie.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn

from lib.config import hf_reader
from lib.layers import num_parameters as _count
from lib.models.bert import (BertConfig, BertEncoder, BertMLMHead, BertOutput, BertPooler, PreTrainingOutput,
                             check_inputs, hf_bert_table, init_bert_weights, mean_pool,
                             pretraining_output)
from lib.models.reference import Source, as_state_dict, copy_weights
from lib.validate import check_bool, check_int, check_token_ids

__all__ = ["ErnieConfig", "ErnieEmbeddings", "ErnieModel", "ErnieForPreTraining",
           "ErnieForSequenceClassification", "hf_ernie_table", "load_hf_ernie"]


@dataclass
class ErnieConfig(BertConfig):
    """BERT's hyper-parameters and ERNIE 2.0's task embedding (off by default, as in Hugging Face)."""
    use_task_id: bool = False
    task_type_vocab_size: int = 3

    def __post_init__(self):
        super().__post_init__()
        check_bool("ErnieConfig.use_task_id", self.use_task_id)
        check_int("ErnieConfig.task_type_vocab_size", self.task_type_vocab_size, 1)

    @classmethod
    def from_hf(cls, hf_config) -> "ErnieConfig":
        """From a ``transformers.ErnieConfig`` (or its ``config.json`` as a dict)."""
        get, _ = hf_reader(hf_config, cls.__name__)
        return super().from_hf(hf_config).replace(use_task_id=bool(get("use_task_id", False)),
                                                  task_type_vocab_size=get("task_type_vocab_size", 3))


class ErnieEmbeddings(nn.Module):
    """``LayerNorm(token + segment + position [+ task type])`` then dropout."""

    def __init__(self, cfg: ErnieConfig):
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_id)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.task_type_embeddings = (nn.Embedding(cfg.task_type_vocab_size, cfg.hidden_size)
                                     if cfg.use_task_id else None)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                task_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + self.position_embeddings(pos)
        if self.task_type_embeddings is not None:
            if task_type_ids is None:
                task_type_ids = torch.zeros_like(input_ids)
            x = x + self.task_type_embeddings(task_type_ids)
        return self.drop(self.norm(x))


class ErnieModel(nn.Module):
    """``ErnieModel(cfg)(input_ids, token_type_ids=None, attention_mask=None, task_type_ids=None)``
    -> ``BertOutput``: :class:`ErnieEmbeddings` -> BERT's encoder -> BERT's pooler.

    ``token_type_ids`` are BERT's segment ids, or a dialogue's role ids (0 query, 1 response);
    ``task_type_ids (B, T)`` need ``cfg.use_task_id`` (zeros when omitted)."""

    def __init__(self, cfg: ErnieConfig, add_pooler: bool = True):
        super().__init__()
        if not isinstance(cfg, ErnieConfig):
            raise TypeError(f"cfg must be an ErnieConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embeddings = ErnieEmbeddings(cfg)
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
                output_attentions: bool = False, task_type_ids: torch.Tensor | None = None) -> BertOutput:
        token_type_ids, keep = check_inputs(self.cfg, input_ids, token_type_ids, attention_mask)
        if task_type_ids is not None:
            if not self.cfg.use_task_id:
                raise ValueError("task_type_ids were given but the model has no task embedding "
                                 "(ErnieConfig(use_task_id=True) adds one)")
            check_token_ids("task_type_ids", task_type_ids, self.cfg.task_type_vocab_size, shape=tuple(input_ids.shape))
        mask = None if keep is None else keep[:, None, None, :]       # (B, 1, 1, T): hide padding keys
        x = self.embeddings(input_ids, token_type_ids, task_type_ids)
        last, states, maps = self.encoder(x, mask, output_hidden_states, output_attentions)
        pooled = self.pooler(last) if self.pooler is not None else None
        return BertOutput(last, pooled, states, maps)


class ErnieForPreTraining(nn.Module):
    """ERNIE with BERT's two heads: masked LM, and the 2-way head on the pooled ``[CLS]``, which
    ERNIE's dialogue language model trains to tell a real dialogue (``lib.data.dialogue.REAL``) from a
    fake one (``FAKE``) through ``nsp_labels``. ``task_type_ids=`` is passed on to :class:`ErnieModel`."""

    def __init__(self, cfg: ErnieConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = ErnieModel(cfg)
        self.mlm = BertMLMHead(cfg, self.bert.word_embeddings)
        self.nsp = nn.Linear(cfg.hidden_size, 2)
        for m in (self.mlm.dense, self.mlm.norm, self.nsp):
            init_bert_weights(m, cfg.initializer_range)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return _count(self, exclude=[self.bert.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None, only_masked: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                task_type_ids: torch.Tensor | None = None) -> PreTrainingOutput:
        """As ``BertForPreTraining.forward``, with ``task_type_ids``."""
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        task_type_ids)
        return pretraining_output(out, self.mlm, self.nsp, mlm_labels, nsp_labels, only_masked)


class ErnieForSequenceClassification(nn.Module):
    """Fine-tuning: a linear layer on the pooled ``[CLS]`` (``pooling="mean"``: on the mean of the
    real tokens' last states, no pooler built), after dropout; every weight is trained."""

    def __init__(self, cfg: ErnieConfig, num_labels: int = 2, pooling: str = "cls"):
        super().__init__()
        self.cfg = cfg
        self.num_labels = check_int("num_labels", num_labels, 1)
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' (the pooled [CLS] state) or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.bert = ErnieModel(cfg, add_pooler=pooling == "cls")
        self.drop = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        init_bert_weights(self.classifier, cfg.initializer_range)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return _count(self, exclude=[self.bert.embeddings] if exclude_embeddings else [])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, task_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        out = self.bert(input_ids, token_type_ids, attention_mask, task_type_ids=task_type_ids)
        if self.pooling == "cls":
            features = out.pooled
        else:
            keep = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            features = mean_pool(out.last_hidden_state, keep)
        return self.classifier(self.drop(features))


# ----------------------------------------------------------------------------- Hugging Face

def hf_ernie_table(num_layers: int, prefix: str = "ernie.", heads: bool = True, pooler: bool = True,
                   task_type: bool = False) -> dict[str, str | Source]:
    """Name table from Hugging Face ``ErnieForPreTraining`` (``prefix="ernie."``) or ``ErnieModel``
    (``prefix=""``, ``heads=False``): BERT's table plus the task-type embedding."""
    table = hf_bert_table(num_layers, prefix=prefix, heads=heads, pooler=pooler)
    if task_type:
        ours = "bert." if heads else ""
        table[f"{ours}embeddings.task_type_embeddings.weight"] = f"{prefix}embeddings.task_type_embeddings.weight"
    return table


def load_hf_ernie(ours: ErnieModel | ErnieForPreTraining, theirs: nn.Module | Mapping[str, torch.Tensor]) -> nn.Module:
    """Copy a Hugging Face ``ErnieModel`` / ``ErnieForPreTraining`` (or its state dict) into ours,
    every tensor used exactly once; both MLM decoders are the token embedding (tied). Returns ``ours``."""
    heads = isinstance(ours, ErnieForPreTraining)
    core = ours.bert if heads else ours
    if not isinstance(core, ErnieModel):
        raise TypeError(f"ours must be our ErnieModel or ErnieForPreTraining, got {type(ours).__name__}")
    state = as_state_dict(theirs)
    table = hf_ernie_table(len(core.encoder.layers), prefix="ernie." if heads else "", heads=heads,
                           pooler=core.pooler is not None, task_type=core.cfg.use_task_id)
    tied_theirs = [k for k in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias") if k in state]
    return copy_weights(ours, state, table, tied=["mlm.decoder.weight"] if heads else [],
                        tied_theirs=tied_theirs if heads else [],
                        ignore_theirs=[k for k in state if k.endswith("position_ids")])
