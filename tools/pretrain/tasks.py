"""The text-to-text family: chapter 11's T5 task models (``t5-task``), fine-tuned from ``t5-mix``.

A recipe names its ``tasks`` (one of ``lib.data.text2text.TASKS``, or all three: the multi-task model)
and starts from the course's T5 (``init_from="t5-mix"``: its tokenizer and network, and its weights
unless ``init_weights`` is False, the twin from random weights). The data is
``lib.data.text2text.task_data`` at the sizes the page scores (``SIZES``); a step reads
``batch_size`` examples of ``task_stream`` in order (no shuffling: the stream is already in a seeded
order, and the multi-task stream takes the tasks in turn), so a single-task model reads exactly the
examples of its task that the multi-task model reads. The budget counts examples (``unit="pairs"``):
the multi-task model's ``tokens`` is three times a single-task model's, the same examples per task.

The held-out loss is read on the tasks' validation rows (never a test item): each task's mean
cross-entropy per target token, averaged over the recipe's tasks (the page's rule for choosing a
learning rate). With ``keep_best`` the checkpoint keeps the weights where it was lowest.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch

from lib import checkpoints, train
from lib.data import text2text
from lib.io import sha256 as file_sha256
from tools.pretrain import translation

KIND = "t5-task"
CORPUS = "t5-tasks"
FILES = (("tatoeba_fra_eng", "fra.txt.gz"), ("nsmc_raw", "nsmc_raw_reviews.csv.gz"), ("chatbot_data", "ChatbotData.csv"))


@functools.lru_cache(maxsize=1)
def task_data() -> text2text.TaskData:
    return text2text.task_data(**text2text.SIZES)


def _tokenizer(recipe):
    from lib.text import load_vocabulary
    return load_vocabulary(checkpoints.path(recipe.init_from, "tokenizer"))


def _digest(rows: dict) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def prepare(recipe, folder: Path, fingerprint: dict) -> dict:
    """The ``init_from`` tokenizer copied to ``folder``; returns what ``data.json`` holds."""
    from lib import data
    start = time.perf_counter()
    d = task_data()
    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(recipe)
    tok.save(folder / "tokenizer.json")
    per_task = recipe.tokens // len(recipe.tasks)
    counts = {"examples_per_task": per_task, **d.counts,
              "training_pairs": sum(d.counts["train"][t] for t in recipe.tasks),
              "validation_pairs": sum(d.counts["validation"][t] for t in recipe.tasks)}
    return {"fingerprint": fingerprint, "documents": counts["training_pairs"] + counts["validation_pairs"],
            "heldout_documents": counts["validation_pairs"], "train_tokens": counts["training_pairs"],
            "heldout_tokens": counts["validation_pairs"], "counts": counts,
            "corpus_sha256": _digest({t: d.train[t] for t in recipe.tasks}),
            "datasets": [{"dataset": ds, "file": name, "sha256": data.REGISTRY[ds].files[name].sha256}
                         for ds, name in FILES],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": tok.vocab_size,
            "heldout_rule": f"the validation rows of each task ({text2text.SIZES['val_per_task']} distinct sentences, "
                            "reviews or questions of its training side; chapter 11's test items are never read)",
            "init_from": translation.init_meta(recipe),
            "seconds": round(time.perf_counter() - start, 1)}


def build_training(recipe, folder: Path, init: bool = True) -> tuple:
    """(tokenizer, the training loader, the held-out batches as ``(task, batch)``, the model); ``init``
    False: the model stays at its random weights whatever the recipe (only the data is wanted)."""
    from lib.text import load_vocabulary
    tok = load_vocabulary(folder / "tokenizer.json")
    d = task_data()
    encode = text2text.Encoder(tok)
    stream = text2text.task_stream(d.train, recipe.tasks, recipe.tokens // len(recipe.tasks), recipe.seed, encode)
    fn = text2text.collate(tok.pad_id)
    loader = train.make_loader(stream, batch_size=recipe.batch_size, shuffle=False, collate_fn=fn)
    heldout = []
    for task in recipe.tasks:
        examples = [encode(task, r) for r in d.validation[task]][:recipe.heldout_sequences]
        heldout += [(task, fn(examples[i:i + 100])) for i in range(0, len(examples), 100)]
    return tok, loader, heldout, translation.initial_model(recipe, folder, translation.model_config(recipe, tok, tok),
                                                           init)


def step(model, batch):
    src, labels = batch
    return model(src, labels=labels)[1], {}


@torch.no_grad()
def heldout_loss(model, batches: list) -> float:
    """Each task's mean cross-entropy per target token (eval mode, float32), averaged over the tasks."""
    was = model.training
    model.eval()
    where = next(model.parameters()).device
    nats: dict[str, float] = {}
    counts: dict[str, int] = {}
    for task, (src, labels) in batches:
        n, c = train.sequence_nats(model(src.to(where), labels=labels.to(where))[0].float(), labels.to(where))
        nats[task] = nats.get(task, 0.0) + n.sum().item()
        counts[task] = counts.get(task, 0) + int(c.sum().item())
    model.train(was)
    return sum(nats[t] / counts[t] for t in nats) / len(nats)
