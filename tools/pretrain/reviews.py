"""The review family: chapter 2's sentiment classifiers (a BiLSTM with and without Bahdanau attention,
``bilstm-classify``) on IMDB and on NSMC, trained by the same command, loop, resume and card as the
pretrained models (``python -m tools.pretrain bilstm-attention-imdb``).

What differs from the other families is the data (``lib.data.reviews``, which the page reads too):

* a run reads labelled reviews, so its budget counts reviews (``unit="reviews"``): ``tokens`` is the
  number of reviews read, three passes over the training part in the chapter's recipes;
* a fixed share of the training reviews (``validation``) is held out: the run's held-out loss is the
  mean binary cross-entropy on them, and ``keep_best`` keeps the weights of the evaluation where it was
  lowest. The test reviews are never read: the page scores the checkpoints on them;
* the tokenizer is built from the training part only: IMDB's most frequent words, or an NSMC BPE
  tokenizer, saved as ``tokenizer.json``.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from lib import checkpoints
from lib.data import reviews
from lib.io import sha256 as file_sha256

KIND = "bilstm-classify"
CORPORA = reviews.CORPORA
model_config = reviews.model_config
step = reviews.step
heldout_loss = reviews.mean_loss       # the validation reviews' mean binary cross-entropy
#: the reviews trained on in each corpus's recipes (the training reviews less the validation share): a
#: recipe's budget is three passes over them (checked against the prepared data by the tests)
TRAINED_ON = {"imdb-sentiment": 22_500, "nsmc-sentiment": 184_762}


def _flat(examples: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(x) for x in examples])
    return torch.tensor([i for x in examples for i in x], dtype=torch.int32), torch.cumsum(lengths, 0) - lengths


def _unflat(ids: torch.Tensor, starts: torch.Tensor, labels: torch.Tensor) -> list[tuple[list[int], int]]:
    ends = torch.cat([starts[1:], torch.tensor([len(ids)])])
    ids = ids.tolist()
    return [(ids[s:e], int(y)) for s, e, y in zip(starts.tolist(), ends.tolist(), labels.tolist())]


def prepare(recipe, folder: Path, fingerprint: dict) -> dict:
    """The training reviews split into the part trained on and the validation part, the tokenizer of
    the first (``tokenizer.json``), both encoded (``streams.pt``); returns what ``data.json`` holds."""
    from lib import data
    from lib.io import atomic_write
    start = time.perf_counter()
    rows = reviews.rows(recipe.corpus, "train")
    keep, held = reviews.validation_split(len(rows), recipe.validation)
    tok = reviews.train_tokenizer(recipe.corpus, [rows[i]["text"] for i in keep], recipe.vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder / "tokenizer.json")
    streams, truncated = {}, 0
    for part, idx in (("train", keep), ("heldout", held)):
        ids, lengths = reviews.encode(tok, [rows[i]["text"] for i in idx], recipe.seq_len)
        streams[f"{part}_ids"], streams[f"{part}_starts"] = _flat(ids)
        streams[f"{part}_labels"] = torch.tensor([rows[i]["label"] for i in idx], dtype=torch.int8)
        truncated += int((lengths > recipe.seq_len).sum())
    with atomic_write(folder / "streams.pt", "wb") as f:
        torch.save(streams, f)
    return {"fingerprint": fingerprint, "documents": len(rows), "heldout_documents": len(held),
            "train_tokens": len(keep), "heldout_tokens": len(held),
            "heldout_rule": f"a fixed {recipe.validation:.0%} of the training reviews held out for validation (the "
                            "test reviews are never read)",
            "counts": {"training_reviews": len(rows), "trained_on": len(keep), "validation": len(held),
                       "positive_trained_on": int(sum(rows[i]["label"] for i in keep)),
                       f"truncated_to_the_last_{recipe.seq_len}_tokens": truncated},
            "corpus_sha256": _digest(rows),
            "datasets": [{"dataset": d, "file": name, "sha256": data.REGISTRY[d].files[name].sha256}
                         for d, name in reviews.CORPORA[recipe.corpus][1]],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": tok.vocab_size,
            "seconds": round(time.perf_counter() - start, 1)}


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256("\0".join(f"{r['label']}{r['text']}" for r in rows).encode("utf-8")).hexdigest()


def validation_batches(recipe, tok, corpus_sha256: str) -> list:
    """A run's validation batches rebuilt from the training reviews and its shipped tokenizer ``tok``
    (what ``tools.pretrain.restore`` scores), after checking that the reviews are the ones it read."""
    rows = reviews.rows(recipe.corpus, "train")
    if _digest(rows) != corpus_sha256:
        raise SystemExit(f"{recipe.name}: the training reviews of {recipe.corpus} are not the ones the checkpoint was "
                         "trained on (another SHA-256): its validation reviews cannot be rebuilt")
    _, held = reviews.validation_split(len(rows), recipe.validation)
    ids, _ = reviews.encode(tok, [rows[i]["text"] for i in held], recipe.seq_len)
    examples = [(x, int(rows[i]["label"])) for x, i in zip(ids, held)]
    return [reviews.collate([examples[i] for i in idx]) for idx in reviews.eval_batches(examples)]


def build_training(recipe, folder: Path) -> tuple:
    """(tokenizer, the training loader, the validation batches, the classifier from the seed)."""
    from lib.text import load_vocabulary
    tok = load_vocabulary(folder / "tokenizer.json")       # a WordVocab (IMDB) or a BPE tokenizer (NSMC)
    streams = torch.load(folder / "streams.pt", weights_only=True)
    train = _unflat(streams["train_ids"], streams["train_starts"], streams["train_labels"])
    held = _unflat(streams["heldout_ids"], streams["heldout_starts"], streams["heldout_labels"])
    loader = reviews.make_loader(train, recipe.batch_size, shuffle=True, seed=recipe.seed)
    heldout = [reviews.collate([held[i] for i in idx]) for idx in reviews.eval_batches(held)]
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(KIND, recipe.model_config(tok.vocab_size))
    return tok, loader, heldout, model
