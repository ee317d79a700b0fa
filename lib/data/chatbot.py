"""The held-out split of the Korean chatbot data that chapter 4 uses, importable by later chapters.

Chapter 4 writes it out in the notebook (it is that chapter's lesson); chapters that compare
with chapter 4's numbers (chapter 10's BART) must use exactly the same pairs, so the same rule
lives here:

``split_punctuation(sentence)``: a space on both sides of ``? . ! ,`` and single spaces
    (``'영화 볼래?' -> '영화 볼래 ?'``).
``heldout_split(rows, fraction=0.05, seed=0) -> ChatbotSplit``: ``questions``/``answers`` (the
    punctuation split applied to every row of ``load_chatbot()``), and ``train``/``heldout``
    row indices. The held-out side is a ``fraction`` of the *distinct* questions (sorted, then
    shuffled by ``random.Random(seed)``), so a question asked several times is never on both sides.
``echo_share(question, reply)``: the share of the question's characters (letters and digits; spaces
    and punctuation dropped) that the reply repeats in one piece: the longest run of characters both
    hold, over the question's length. ``echoes(question, reply)``: at least ``ECHO_THRESHOLD`` (half) of
    the question comes back (``'카페갈래?' -> '카페갈래도 괜찮아요.'`` echoes; ``'배고파' -> '뭐 좀 드세요.'``
    does not). A chatbot whose replies mostly echo has learned to copy, not to answer: chapter 10 counts
    them, beside how often the corpus's own answers do.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from lib.validate import check_int, check_probability

__all__ = ["split_punctuation", "ChatbotSplit", "heldout_split", "ECHO_THRESHOLD", "echo_share", "echoes"]

ECHO_THRESHOLD = 0.5


def split_punctuation(sentence: str) -> str:
    """``'영화 볼래?' -> '영화 볼래 ?'``: a space before ? . ! , and single spaces."""
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    sentence = re.sub(r"([?.!,])", r" \1 ", sentence)
    return re.sub(r"\s+", " ", sentence).strip()


@dataclass
class ChatbotSplit:
    questions: list[str]
    answers: list[str]
    train: list[int]
    heldout: list[int]


def heldout_split(rows: Sequence[Mapping], fraction: float = 0.05, seed: int = 0) -> ChatbotSplit:
    """Chapter 4's split of ``load_chatbot()`` rows (see the module docstring)."""
    fraction = check_probability("fraction", fraction)
    seed = check_int("seed", seed)
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping) or not {"q", "a"} <= set(r):
            raise ValueError(f"rows[{i}] must be a load_chatbot() row with 'q' and 'a', got {r!r:.80}")
    questions = [split_punctuation(r["q"]) for r in rows]
    answers = [split_punctuation(r["a"]) for r in rows]
    distinct = sorted(set(questions))
    random.Random(seed).shuffle(distinct)
    held = set(distinct[:round(fraction * len(distinct))])
    return ChatbotSplit(questions, answers, [i for i, q in enumerate(questions) if q not in held],
                        [i for i, q in enumerate(questions) if q in held])


def _letters(sentence: str) -> str:
    if not isinstance(sentence, str):
        raise TypeError(f"expected a str, got {type(sentence).__name__}")
    return "".join(ch for ch in sentence if ch.isalnum())


def echo_share(question: str, reply: str) -> float:
    """The longest run of characters that ``question`` and ``reply`` share (letters and digits only), as a
    share of the question's letters and digits; 0.0 for a question without any."""
    q, r = _letters(question), _letters(reply)
    if not q or not r:
        return 0.0
    best, previous = 0, [0] * (len(r) + 1)
    for a in q:                        # longest common substring, one row of the table at a time
        current = [0] * (len(r) + 1)
        for j, b in enumerate(r, 1):
            if a == b:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best / len(q)


def echoes(question: str, reply: str, threshold: float = ECHO_THRESHOLD) -> bool:
    """Does ``reply`` repeat at least ``threshold`` of ``question`` in one piece? (see ``echo_share``)"""
    threshold = check_probability("threshold", threshold)
    return echo_share(question, reply) >= threshold
