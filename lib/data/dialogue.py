"""ERNIE's dialogue language model (DLM) data: dialogues with Q/R role ids, real or fake.

ERNIE 1.0 (Sun et al., 2019) pretrains on dialogue threads as well as on plain text. A
dialogue is encoded like a BERT sentence pair, ``[CLS] turn [SEP] turn [SEP] ...``, and the
*segment* ids of BERT become *dialogue-role* ids: 0 for a query (Q), 1 for a response (R).
The role ids index the embedding table that BERT uses for segments A/B (it is added to the
token and position embeddings); the token embeddings are untouched. Half of the dialogues are
made fake by replacing the query or the response with a randomly selected sentence, and
the model learns to tell real from fake on ``[CLS]`` while it also predicts masked tokens.
ERNIE alternates these DLM batches with ordinary masked-LM batches.

The course's dialogue data, the Korean chatbot pairs (``load_chatbot()``), has one question
and one answer per row, so every dialogue here is a two-turn QR dialogue; ERNIE's Baidu Tieba
threads gave it three-turn QRQ, QRR and QQR ones. :func:`encode_dialogue` takes any number
of turns.

::

    train, test = split_pairs(load_chatbot())
    dialogues = make_dialogues(train, seed=0)          # list of Dialogue(turns, label)
    ex = encode_dialogue(dialogues[0].turns, tokenizer) # ids and role ids

Explained in chapters/13_ernie.ipynb.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from lib.data.knowledge_masking import space_cjk
from lib.data.mlm import collate_masked_pairs
from lib.validate import check_int, check_probability

__all__ = ["ROLE_Q", "ROLE_R", "ROLES", "REAL", "FAKE", "Dialogue", "EncodedDialogue", "is_held_out", "split_pairs",
           "make_dialogues", "encode_dialogue", "collate_dialogues"]

ROLE_Q = 0
ROLE_R = 1
#: Real-vs-fake labels, in the convention of BERT's NSP head (0 IsNext, 1 NotNext).
REAL, FAKE = 0, 1
ROLES = {"Q": ROLE_Q, "R": ROLE_R}


@dataclass(frozen=True)
class Dialogue:
    """Turns ``(role, text)`` with role ``"Q"`` or ``"R"``, ``label`` :data:`REAL` (0) or
    :data:`FAKE` (1), and where a fake's replacement came from (``"dialogue"``: a turn of another
    dialogue, ``"text"``: a sentence of other text; ``None`` for a real dialogue)."""
    turns: tuple[tuple[str, str], ...]
    label: int
    fake_from: str | None = None


@dataclass
class EncodedDialogue:
    """``ids`` = ``[CLS] turn_1 [SEP] turn_2 [SEP] ...``; ``roles`` the role id of every position."""
    ids: list[int]
    roles: list[int]
    label: int = REAL


def is_held_out(question: str, every: int = 10) -> bool:
    """A pair is held out when the CRC-32 of its question is divisible by ``every``
    (deterministic; the same question is always on the same side)."""
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    check_int("every", every, 2)
    return zlib.crc32(question.encode("utf-8")) % every == 0


def split_pairs(rows: Sequence[Mapping], every: int = 10) -> tuple[list[dict], list[dict]]:
    """Chatbot rows (keys ``q``, ``a``) split into train and held-out pairs by :func:`is_held_out`."""
    train, test = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not {"q", "a"} <= set(row):
            raise ValueError(f"rows[{i}] must be a mapping with keys q and a (a load_chatbot() row), got {row!r}")
        (test if is_held_out(row["q"], every) else train).append({"q": row["q"], "a": row["a"]})
    return train, test


def make_dialogues(pairs: Sequence[Mapping], seed: int = 0, fake_prob: float = 0.5,
                   sentences: Sequence[str] = (), sentence_prob: float = 0.5) -> list[Dialogue]:
    """One QR dialogue per pair; with probability ``fake_prob`` it is fake: its query (half of
    the time) or its response is replaced by a randomly chosen sentence, never the same text.
    ERNIE draws that sentence at random; here it is, with probability ``sentence_prob``, one of
    ``sentences`` (other text, e.g. reviews) when given, else the same turn of another pair.
    Deterministic for a given ``seed``."""
    check_int("seed", seed, 0)
    check_probability("fake_prob", fake_prob)
    check_probability("sentence_prob", sentence_prob)
    pairs, sentences = list(pairs), list(sentences)
    if len(pairs) < 2:
        raise ValueError(f"make_dialogues needs at least 2 pairs to draw fakes from, got {len(pairs)}")
    rng = random.Random(seed)
    out = []
    for i, p in enumerate(pairs):
        q, a = p["q"], p["a"]
        if rng.random() >= fake_prob:
            out.append(Dialogue((("Q", q), ("R", a)), REAL))
            continue
        replace_query = rng.random() < 0.5
        key, original = ("q", q) if replace_query else ("a", a)
        source = "text" if sentences and rng.random() < sentence_prob else "dialogue"
        for _ in range(100):
            other = (sentences[rng.randrange(len(sentences))] if source == "text"
                     else pairs[rng.randrange(len(pairs))][key])
            if other != original:
                break
        else:
            raise ValueError(f"pair {i}: every candidate equals its {key!r}, no fake can be made")
        turns = (("Q", other), ("R", a)) if replace_query else (("Q", q), ("R", other))
        out.append(Dialogue(turns, FAKE, source))
    return out


def encode_dialogue(turns: Sequence[tuple[str, str]], tokenizer, max_len: int = 64,
                    label: int = REAL) -> EncodedDialogue:
    """Ids and role ids of a dialogue for a BERT-style encoder.

    ``[CLS]`` takes the role of the first turn; each turn's tokens and the ``[SEP]`` that
    ends it take the turn's role (as BERT's segment ids do for sentences A and B). Every turn
    is cut to an equal share of ``max_len`` so that no turn is lost. Text goes through
    :func:`~lib.data.knowledge_masking.space_cjk` first, as in pretraining."""
    check_int("max_len", max_len, 4)
    turns = list(turns)
    if not turns:
        raise ValueError("turns is empty: a dialogue needs at least one turn")
    share = (max_len - 1) // len(turns) - 1
    if share < 1:
        raise ValueError(f"max_len={max_len} leaves no room for {len(turns)} turns")
    ids, roles = [tokenizer.cls_id], [ROLES.get(turns[0][0], -1)]
    for k, turn in enumerate(turns):
        if not (isinstance(turn, tuple) and len(turn) == 2 and turn[0] in ROLES and isinstance(turn[1], str)):
            raise ValueError(f"turns[{k}] must be (role, text) with role 'Q' or 'R', got {turn!r}")
        role, text = turn
        piece = tokenizer.encode(space_cjk(text))[:share] + [tokenizer.sep_id]
        ids += piece
        roles += [ROLES[role]] * len(piece)
    return EncodedDialogue(ids=ids, roles=roles, label=int(label))


def collate_dialogues(batch: Sequence[EncodedDialogue], *, mask_id: int, vocab_size: int,
                      special_ids: Sequence[int], pad_id: int = 0, mask_prob: float = 0.15,
                      num_special: int = 7, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """A dialogue-LM batch: ``input_ids`` with BERT's token masking (``lib.data.mlm.mask_tokens``:
    15 % of the non-special tokens, 80/10/10), ``token_type_ids`` = the role ids (0 on padding),
    ``attention_mask`` (bool), ``mlm_labels`` and ``nsp_labels`` (:data:`REAL` / :data:`FAKE`)."""
    batch = list(batch)
    if not batch:
        raise ValueError("batch is empty")
    return collate_masked_pairs([d.ids for d in batch], [d.roles for d in batch], [d.label for d in batch],
                                mask_id=mask_id, vocab_size=vocab_size, pad_id=pad_id, special_ids=special_ids,
                                generator=generator, what="batch item", mask_prob=mask_prob,
                                random_ids=torch.arange(num_special, vocab_size))
