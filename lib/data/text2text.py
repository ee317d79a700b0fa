"""Chapter 11's three tasks in T5's text-to-text format, and the data its task models train on.

The chapter's T5 task models (``python -m tools.pretrain t5-multitask`` and its twins) and the page
that evaluates them read the same examples through this module, so that no test item can slip into
training and the page scores exactly the split the checkpoints were trained on:

``to_text(task, example)``: an example as ``(input, target)`` strings, the task named by a prefix
    (``"translate English to French: ..."`` -> the French; ``"nsmc sentiment: ..."`` -> ``"positive"``
    or ``"negative"``; ``"chatbot: ..."`` -> the answer).
``task_data(**sizes)``: the training, validation and test rows of each task (``TaskData``): English ->
    French Tatoeba pairs whose English side has at most ``max_words`` words, split by
    ``lib.translation.is_held_out`` (every French translation of a test sentence is a BLEU reference);
    the course's balanced NSMC split (``lib.data.nsmc``); the chatbot pairs held out by a checksum of
    the question. Each task's training rows lose a validation split of ``val_per_task`` distinct keys
    (an English sentence, a review, a question). ``SIZES`` are the sizes the checkpoints were trained
    with.
``Encoder(tokenizer)``: ``(input ids, target ids)`` of an example, each cut to ``MAX_SRC`` / ``MAX_TGT``
    tokens with the end token.
``collate(pad_id)``: a batch of encoded examples as padded inputs and targets (-100 on the targets'
    padding, which the loss ignores).
``task_stream(train, tasks, per_task, seed, encode)``: the examples a model trains on, in order:
    ``per_task`` examples of each task in a seeded order (the same order whatever the other tasks), and
    for several tasks their round-robin mixture, so every batch holds an equal share of each (the
    paper's "equal mixing"). A single-task model reads exactly the examples of its task that the
    multi-task model reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from lib.validate import check_int

__all__ = ["TASKS", "LABELS", "SIZES", "MAX_SRC", "MAX_TGT", "to_text", "TaskData", "task_data", "Encoder",
           "task_stream", "stream_seed", "collate"]

TASKS = ("translate", "sentiment", "chat")
LABELS = ("negative", "positive")        # label 0, label 1: the words the decoder must spell
MAX_SRC, MAX_TGT = 48, 32                # tokens of an input and of a target, end token included
#: the sizes the chapter's checkpoints were trained with (the page scores their test sets)
SIZES = dict(mt_train=100_000, mt_test=1_000, max_words=10, nsmc_per_class=20_000, nsmc_test_per_class=500,
             chat_test=1_000, val_per_task=300)


def to_text(task: str, example: Mapping) -> tuple[str, str]:
    """``(input, target)`` strings of one example in T5's text-to-text format."""
    if task == "translate":
        return f"translate English to French: {example['en']}", example["other"]
    if task == "sentiment":
        return f"nsmc sentiment: {example['text']}", LABELS[int(example["label"])]
    if task == "chat":
        return f"chatbot: {example['q']}", example["a"]
    raise ValueError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")


@dataclass
class TaskData:
    """Each task's rows: ``train`` and ``validation`` (dicts task -> rows), and the test side:
    ``mt_test`` (English sentences), ``references`` (English -> every French translation),
    ``sentiment_test`` and ``chat_test`` (rows)."""
    train: dict
    validation: dict
    mt_test: list
    references: dict
    sentiment_test: list
    chat_test: list
    counts: dict = field(default_factory=dict)

    def test_examples(self, n: int | None = None) -> dict:
        """The first ``n`` test examples of each task (all when None), as rows ``to_text`` reads (a
        translation with its first reference as the target)."""
        return {"translate": [{"en": en, "other": self.references[en][0]} for en in self.mt_test[:n]],
                "sentiment": self.sentiment_test[:n], "chat": self.chat_test[:n]}


def _split_off(rows: list, key: Callable, n: int, seed: int) -> tuple[list, list]:
    """(validation, rest): the rows of ``n`` distinct keys set aside, so that no validation sentence is
    also trained on under another translation."""
    keys = sorted({key(r) for r in rows})
    if n > len(keys):
        raise ValueError(f"a validation split of {n} keys needs at least as many distinct ones, got {len(keys)}")
    picked = {keys[i] for i in torch.randperm(len(keys), generator=torch.Generator().manual_seed(seed))[:n].tolist()}
    return [r for r in rows if key(r) in picked], [r for r in rows if key(r) not in picked]


def task_data(*, mt_train: int, mt_test: int, max_words: int, nsmc_per_class: int, nsmc_test_per_class: int,
              chat_test: int, val_per_task: int, nsmc_rows: Sequence[Mapping] | None = None) -> TaskData:
    """The three tasks' rows (see the module docstring); ``nsmc_rows`` (``load_nsmc_raw()``) is read
    from the data mirror when omitted."""
    from lib.data import load_chatbot, load_nsmc_raw, load_tatoeba, nsmc
    from lib.translation import is_held_out
    for name, value in (("mt_train", mt_train), ("mt_test", mt_test), ("max_words", max_words),
                        ("nsmc_per_class", nsmc_per_class), ("nsmc_test_per_class", nsmc_test_per_class),
                        ("chat_test", chat_test), ("val_per_task", val_per_task)):
        check_int(name, value, 1)
    sentiment = nsmc.sentiment_split(load_nsmc_raw() if nsmc_rows is None else nsmc_rows,
                                     train_per_class=nsmc_per_class, test_per_class=nsmc_test_per_class)
    tatoeba, chatbot = load_tatoeba("fra_eng"), load_chatbot()
    g = torch.Generator().manual_seed(0)

    def short(english):
        return len(english.split()) <= max_words

    translate = [r for r in tatoeba if not is_held_out(r["en"]) and short(r["en"])]
    translate = [translate[i] for i in torch.randperm(len(translate), generator=g)[:mt_train].tolist()]
    references = {}
    for r in tatoeba:
        if is_held_out(r["en"]) and short(r["en"]):
            references.setdefault(r["en"], []).append(r["other"])
    held_out = list(references)
    test_sentences = [held_out[i] for i in torch.randperm(len(held_out), generator=g)[:mt_test].tolist()]
    chat_train = [r for r in chatbot if not is_held_out(r["q"])]
    chat_held = [r for r in chatbot if is_held_out(r["q"])][:chat_test]
    validation, train = {}, {}
    for k, (task, rows, key) in enumerate((("translate", translate, lambda r: r["en"]),
                                           ("sentiment", sentiment.train, lambda r: r["text"]),
                                           ("chat", chat_train, lambda r: r["q"]))):
        validation[task], train[task] = _split_off(rows, key, val_per_task, seed=20 + k)
    counts = {"train": {t: len(r) for t, r in train.items()}, "validation": {t: len(r) for t, r in validation.items()},
              "test": {"translate": len(test_sentences), "translate_references": sum(len(references[en])
                                                                                  for en in test_sentences),
                       "sentiment": len(sentiment.test), "chat": len(chat_held)}}
    return TaskData(train, validation, test_sentences, {en: references[en] for en in test_sentences},
                    sentiment.test, chat_held, counts)


class Encoder:
    """``encoder(task, example) -> (input ids, target ids)``: ``to_text``, tokenised, each side cut to
    ``max_src`` / ``max_tgt`` tokens including the end token."""

    def __init__(self, tokenizer, max_src: int = MAX_SRC, max_tgt: int = MAX_TGT):
        self.tok, self.max_src, self.max_tgt = tokenizer, check_int("max_src", max_src, 2), check_int("max_tgt", max_tgt, 2)

    def __call__(self, task: str, example: Mapping) -> tuple[list[int], list[int]]:
        source, target = to_text(task, example)
        eos = self.tok.eos_id
        return (self.tok.encode(source)[:self.max_src - 1] + [eos], self.tok.encode(target)[:self.max_tgt - 1] + [eos])


def stream_seed(task: str, seed: int) -> int:
    """The generator seed of ``task``'s training order in the runs of ``seed``."""
    return 10 + TASKS.index(task) + 100 * seed


def task_stream(train: Mapping[str, Sequence], tasks: Sequence[str], per_task: int, seed: int,
                encode: Callable) -> list:
    """The encoded training examples in training order: ``per_task`` of each task in its seeded order
    (cycling when a task has fewer rows), round-robin over ``tasks`` when there are several."""
    check_int("per_task", per_task, 1)
    if not tasks or any(t not in TASKS for t in tasks) or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be distinct names of {TASKS}, got {tasks!r}")
    examples = {}
    for task in tasks:
        rows = train[task]
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(stream_seed(task, seed))).tolist()
        examples[task] = [encode(task, rows[order[i % len(rows)]]) for i in range(per_task)]
    return [examples[task][i] for i in range(per_task) for task in tasks]


def collate(pad_id: int) -> Callable:
    """``fn(batch)``: a list of ``(input ids, target ids)`` -> ``(inputs, labels)``, the inputs padded with
    ``pad_id`` and the labels with -100 (ignored by the loss)."""
    check_int("pad_id", pad_id, 0)

    def fn(batch):
        from lib.text import pad_batch
        src, _ = pad_batch([s for s, _ in batch], pad_id=pad_id)
        labels, lengths = pad_batch([t for _, t in batch], pad_id=pad_id)
        return src, labels.masked_fill(torch.arange(labels.shape[1]) >= lengths[:, None], -100)
    return fn
