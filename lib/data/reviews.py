"""Chapter 2's sentiment data and classifier, shared by the page and by the recipes that train its
checkpoints (``tools/pretrain/reviews.py``).

Two corpora (``CORPORA``):

* ``imdb-sentiment``: IMDB's 25,000 training and 25,000 test reviews, read as words
  (``lib.text.simple_tokenize``) with a vocabulary of the most frequent training words;
* ``nsmc-sentiment``: the course's NSMC split (``lib.data.nsmc.sentiment_split``: balanced, by review
  id), read as BPE pieces of a tokenizer trained on the training reviews.

A review becomes the ids of its **last** ``max_len`` tokens (the end of a review often says what the
reviewer thought). The recipes hold out a share of the training reviews as a validation split
(``validation_split``: a fixed draw, the same for every seed), on which a run's held-out loss is read;
the test reviews are never read while training. Batches group reviews of similar length
(``make_loader``: ``lib.train.LengthBucketSampler``, the chapter's numpy permutations), and evaluation
reads them sorted by length (``eval_batches``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lib.text import SPECIAL_IDS

#: corpus -> (how it is read, the data files of its training reviews)
CORPORA = {"imdb-sentiment": ("words", (("imdb", "imdb_train.csv.gz"),)),
           "nsmc-sentiment": ("bpe", (("nsmc_raw", "nsmc_raw_reviews.csv.gz"),))}
PAD = SPECIAL_IDS["pad"]          # id 0, for the word vocabulary and the subword tokenizer alike
SPLIT_SEED = 0                    # the validation split: one fixed draw for every seed of a recipe

__all__ = ["CORPORA", "PAD", "rows", "validation_split", "train_tokenizer", "encode", "collate", "eval_batches",
           "make_loader", "model_config", "step", "predictions", "mean_loss"]


def _check_corpus(corpus: str) -> None:
    if corpus not in CORPORA:
        raise ValueError(f"unknown review corpus {corpus!r}: expected one of {', '.join(CORPORA)}")


def rows(corpus: str, split: str) -> list[dict]:
    """The reviews of ``split`` ("train" or "test") of ``corpus``: ``{"text", "label"}`` dicts, in a fixed order."""
    _check_corpus(corpus)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if corpus == "imdb-sentiment":
        from lib.data import load_imdb
        return [{"text": r["text"], "label": r["label"]} for r in load_imdb(split)]
    from lib.data import nsmc
    return [{"text": r["text"], "label": r["label"]} for r in getattr(nsmc.sentiment_split(), split)]


def validation_split(n: int, share: float, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
    """Indices of ``n`` training reviews: (the ones trained on, the ``round(share * n)`` held out for
    validation), from a fixed permutation, each list in increasing order."""
    if not 0.0 <= share < 0.5:
        raise ValueError(f"share must be in [0, 0.5), got {share!r}")
    order = np.random.default_rng(seed).permutation(n)
    held = set(order[:round(share * n)].tolist())
    return [i for i in range(n) if i not in held], sorted(held)


def train_tokenizer(corpus: str, texts: Sequence[str], vocab_size: int):
    """The corpus's tokenizer, built from ``texts`` (the training reviews): a ``WordVocab`` of the
    ``vocab_size`` most frequent words (plus the special tokens) for IMDB, a BPE tokenizer for NSMC."""
    from lib import text
    _check_corpus(corpus)
    if CORPORA[corpus][0] == "words":
        return text.WordVocab.build([text.simple_tokenize(t) for t in texts],
                                    max_size=vocab_size + len(text.SPECIAL_TOKENS))
    return text.train_tokenizer(list(texts), kind="bpe", vocab_size=vocab_size)


def encode(tokenizer, texts: Sequence[str], max_len: int) -> tuple[list[list[int]], np.ndarray]:
    """Each text's ids, truncated to its last ``max_len``, and its length in tokens before truncation.
    A word vocabulary reads words (``simple_tokenize``), a subword tokenizer its pieces."""
    from lib import text
    if isinstance(tokenizer, text.WordVocab):
        ids = [tokenizer.encode(text.simple_tokenize(t)) for t in texts]
    else:
        ids = tokenizer.encode_batch(list(texts))
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise ValueError(f"{len(empty)} review(s) have no token at all (the first: {texts[empty[0]]!r})")
    return [x[-max_len:] for x in ids], np.array([len(x) for x in ids])


def collate(examples: Sequence[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, label)`` pairs -> padded ids ``(B, T)``, lengths ``(B,)``, labels ``(B,)`` as floats."""
    from lib import text
    x, lengths = text.pad_batch([ids for ids, _ in examples], pad_id=PAD)
    return x, lengths, torch.tensor([y for _, y in examples], dtype=torch.float32)


def eval_batches(dataset: Sequence[tuple[list[int], int]], batch_size: int = 512) -> list[list[int]]:
    """Index batches in evaluation order: sorted by length (a stable sort), little padding."""
    order = np.argsort([len(ids) for ids, _ in dataset], kind="stable")
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]


def make_loader(dataset: Sequence[tuple[list[int], int]], batch_size: int, shuffle: bool, seed: int = 0):
    """Training batches of reviews of similar length in a new order every epoch (the chapter's numpy
    permutations from ``(seed, epoch)``), or, without ``shuffle``, the evaluation order."""
    from lib import train
    sampler = (train.LengthBucketSampler([len(ids) for ids, _ in dataset], batch_size, seed=seed, rng="numpy")
               if shuffle else eval_batches(dataset, batch_size))
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)


def model_config(vocab_size: int, attention: bool, attn_hidden: int = 64) -> dict[str, Any]:
    """The chapter's classifier (``lib.models.bilstm_attention``): 128-d embeddings, two BiLSTM layers of
    64 cells each way, a dense layer of 20, dropout 0.5; with or without attention."""
    return dict(vocab_size=vocab_size, embed_dim=128, hidden=64, layers=2, attention=attention,
                attn_hidden=attn_hidden, dense=20, dropout=0.5, pad_id=PAD)


def step(model, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The training step: binary cross-entropy of the logit, and the batch's accuracy."""
    x, lengths, y = batch
    logits, _ = model(x, lengths)
    return F.binary_cross_entropy_with_logits(logits, y), {"acc": ((logits > 0).float() == y).float().mean().item()}


@torch.no_grad()
def predictions(model, dataset: Sequence[tuple[list[int], int]], device=None) -> tuple[np.ndarray, np.ndarray]:
    """Per review of ``dataset`` (in its order): whether the prediction was right, and the loss (binary
    cross-entropy, nats)."""
    was = model.training
    model.eval()
    where = device if device is not None else next(model.parameters()).device
    correct, losses = np.zeros(len(dataset), dtype=bool), np.zeros(len(dataset))
    for idx in eval_batches(dataset):
        x, lengths, y = collate([dataset[i] for i in idx])
        logits, _ = model(x.to(where), lengths.to(where))
        logits = logits.float().cpu()
        correct[idx] = ((logits > 0).float() == y).numpy()
        losses[idx] = F.binary_cross_entropy_with_logits(logits, y, reduction="none").numpy()
    model.train(was)
    return correct, losses


@torch.no_grad()
def mean_loss(model, batches: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> float:
    """Mean binary cross-entropy per review over collated batches (a run's held-out loss)."""
    was = model.training
    model.eval()
    where = next(model.parameters()).device
    total = count = 0.0
    for x, lengths, y in batches:
        logits, _ = model(x.to(where), lengths.to(where))
        total += F.binary_cross_entropy_with_logits(logits.float(), y.to(where), reduction="sum").item()
        count += len(y)
    model.train(was)
    return total / count
