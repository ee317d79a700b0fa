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

So this file only subclasses ``lib.models.bert``::

    ErnieConfig                  BertConfig + use_task_id, task_type_vocab_size
    ErnieEmbeddings              BERT's token + segment + position, + task type when use_task_id
    ErnieModel                   BertModel with ErnieEmbeddings; forward(..., task_type_ids=None)
    ErnieForPreTraining          MLM head + the 2-way [CLS] head (NSP for text, real/fake for
                                 dialogues); the dialogue roles go in as token_type_ids
    ErnieForSequenceClassification   the fine-tuning head on the pooled [CLS]
    hf_ernie_table               name table to Hugging Face's ErnieModel / ErnieForPreTraining

The role ids of a dialogue *are* the segment ids: ``token_type_ids`` index the same table BERT
uses for sentences A and B, added to the token embedding, never in place of it.

Explained in chapters/13_ernie.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn

from lib.models.bert import (BertConfig, BertEmbeddings, BertForPreTraining, BertForSequenceClassification,
                             BertModel, _check_ids)
from lib.models.reference import Source, copy_weights, hf_bert_table
from lib.validate import check_bool, check_int

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
        get = (hf_config.get if isinstance(hf_config, Mapping)
               else lambda k, d=None: getattr(hf_config, k, d))
        return super().from_hf(hf_config).replace(use_task_id=bool(get("use_task_id", False)),
                                                  task_type_vocab_size=get("task_type_vocab_size", 3))


class ErnieEmbeddings(BertEmbeddings):
    """``LayerNorm(token + segment + position [+ task type])`` then dropout."""

    def __init__(self, cfg: ErnieConfig):
        super().__init__(cfg)
        self.task_type_embeddings = (nn.Embedding(cfg.task_type_vocab_size, cfg.hidden_size)
                                     if cfg.use_task_id else None)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                task_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.sum_embeddings(input_ids, token_type_ids)
        if self.task_type_embeddings is not None:
            if task_type_ids is None:
                task_type_ids = torch.zeros_like(input_ids)
            x = x + self.task_type_embeddings(task_type_ids)
        return self.drop(self.norm(x))


class ErnieModel(BertModel):
    """``ErnieModel(cfg)(input_ids, token_type_ids=None, attention_mask=None, task_type_ids=None)``.

    ``token_type_ids`` are BERT's segment ids, or a dialogue's role ids (0 query, 1 response);
    ``task_type_ids (B, T)`` need ``cfg.use_task_id`` (zeros when omitted)."""

    def __init__(self, cfg: ErnieConfig, add_pooler: bool = True):
        if not isinstance(cfg, ErnieConfig):
            raise TypeError(f"cfg must be an ErnieConfig, got {type(cfg).__name__}")
        super().__init__(cfg, add_pooler)

    def build_embeddings(self, cfg: ErnieConfig) -> nn.Module:
        return ErnieEmbeddings(cfg)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, task_type_ids: torch.Tensor | None = None):
        if task_type_ids is not None:
            if not self.cfg.use_task_id:
                raise ValueError("task_type_ids were given but the model has no task embedding "
                                 "(ErnieConfig(use_task_id=True) adds one)")
            _check_ids("task_type_ids", task_type_ids, self.cfg.task_type_vocab_size,
                       tuple(getattr(input_ids, "shape", ())))
        return super().forward(input_ids, token_type_ids, attention_mask, output_hidden_states,
                               output_attentions, task_type_ids=task_type_ids)


class ErnieForPreTraining(BertForPreTraining):
    """ERNIE with BERT's two heads: masked LM, and the 2-way head on the pooled ``[CLS]``, which
    ERNIE's dialogue language model trains to tell a real dialogue (``lib.data.dialogue.REAL``) from a
    fake one (``FAKE``) through ``nsp_labels``. ``task_type_ids=`` is passed on to :class:`ErnieModel`."""
    backbone = ErnieModel


class ErnieForSequenceClassification(BertForSequenceClassification):
    """Fine-tuning: a linear layer on the pooled ``[CLS]``; every weight is trained."""
    backbone = ErnieModel


def hf_ernie_table(num_layers: int, prefix: str = "ernie.", heads: bool = True, pooler: bool = True,
                   task_type: bool = False) -> dict[str, str | Source]:
    """Name table from Hugging Face ``ErnieForPreTraining`` (``prefix="ernie."``) or ``ErnieModel``
    (``prefix=""``, ``heads=False``): BERT's table plus the task-type embedding."""
    table = hf_bert_table(num_layers, prefix=prefix, heads=heads, pooler=pooler)
    if task_type:
        ours = "bert." if heads else ""
        table[f"{ours}embeddings.task_type_embeddings.weight"] = f"{prefix}embeddings.task_type_embeddings.weight"
    return table


def load_hf_ernie(model: ErnieModel | ErnieForPreTraining, source: nn.Module | Mapping[str, torch.Tensor]):
    """Copy a Hugging Face ``ErnieModel`` / ``ErnieForPreTraining`` (or its state dict) into ours,
    every tensor used exactly once."""
    heads = isinstance(model, ErnieForPreTraining)
    core = model.bert if heads else model
    if not isinstance(core, ErnieModel):
        raise TypeError(f"model must be our ErnieModel or ErnieForPreTraining, got {type(model).__name__}")
    state = dict(source.state_dict()) if isinstance(source, nn.Module) else dict(source)
    table = hf_ernie_table(len(core.encoder.layers), prefix="ernie." if heads else "", heads=heads,
                           pooler=core.pooler is not None, task_type=core.cfg.use_task_id)
    tied_theirs = [k for k in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias") if k in state]
    return copy_weights(model, state, table, tied=["mlm.decoder.weight"] if heads else [],
                        tied_theirs=tied_theirs if heads else [],
                        ignore_theirs=[k for k in state if k.endswith("position_ids")])

