"""BART's five ways of corrupting a document (Lewis et al., 2020, section 2.2).

BART is trained to reconstruct the original document from a corrupted copy. The paper
compares five corruptions; each function below implements one on plain lists of token ids
(the caller adds ``[BOS]``/``[EOS]`` afterwards, so the specials are never corrupted). All take
a ``numpy.random.Generator`` (``numpy.random.default_rng(seed)``) so a run is reproducible.

``token_masking(ids, mask_id, rng, p=0.15)``
    BERT's corruption: each token independently becomes ``mask_id`` with probability ``p``.
``token_deletion(ids, rng, p=0.15)``
    Each token is deleted with probability ``p``; unlike masking, the model must also find
    *where* tokens are missing.
``sample_spans(n, rng, mask_ratio=0.3, poisson_lambda=3.0) -> list[(start, length)]``
    The spans of text infilling: span lengths are drawn from Poisson(λ) until they cover
    ``round(mask_ratio * n)`` tokens (the last one is cut so that the total is exact), then
    the spans are placed at random, without overlap, in left-to-right order. A length of
    0 is allowed: it inserts a mask between two tokens.
``text_infilling(ids, mask_id, rng, mask_ratio=0.3, poisson_lambda=3.0)``
    Replaces every span of ``sample_spans`` by **one** ``mask_id`` (a 0-length span inserts
    one): the model must also predict how many tokens a mask stands for. BART's best models
    mask 30 % of the tokens with λ = 3. (SpanBERT draws lengths from a clamped geometric
    distribution and uses one mask per token: the span length is then visible.)
``sentence_permutation(sentences, rng)``
    A document given as a list of sentences (each a list of ids) comes back with its
    sentences in a uniformly random order (the multiset of sentences is unchanged).
``document_rotation(ids, rng) -> (rotated, start)``
    A token chosen uniformly at random becomes the first: ``ids[start:] + ids[:start]``;
    the model must find where the document really starts.
``denoising_pair(sentences, mask_id, rng, mask_ratio=0.3, poisson_lambda=3.0, permute=True)``
    BART's best combination (the paper's final models): sentence permutation, then text
    infilling over the whole permuted document. Returns ``(corrupted, original)`` id lists:
    the encoder reads the first, the decoder must write the second.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lib.validate import check_float, check_id_list, check_int, check_probability

__all__ = ["token_masking", "token_deletion", "sample_spans", "text_infilling", "sentence_permutation",
           "document_rotation", "denoising_pair"]


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (numpy.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def token_masking(ids: Sequence[int], mask_id: int, rng: np.random.Generator, p: float = 0.15) -> list[int]:
    """Each token becomes ``mask_id`` with probability ``p`` (independently); same length."""
    ids = check_id_list("ids", ids, 0)
    mask_id = check_int("mask_id", mask_id, 0)
    p = check_probability("p", p)
    chosen = _check_rng(rng).random(len(ids)) < p
    return [mask_id if c else t for t, c in zip(ids, chosen)]


def token_deletion(ids: Sequence[int], rng: np.random.Generator, p: float = 0.15) -> list[int]:
    """Each token is deleted with probability ``p`` (independently); the rest keep their order."""
    ids = check_id_list("ids", ids, 0)
    p = check_probability("p", p)
    dropped = _check_rng(rng).random(len(ids)) < p
    return [t for t, d in zip(ids, dropped) if not d]


def sample_spans(n: int, rng: np.random.Generator, mask_ratio: float = 0.3,
                 poisson_lambda: float = 3.0) -> list[tuple[int, int]]:
    """Non-overlapping ``(start, length)`` spans covering exactly ``round(mask_ratio * n)`` of ``n``
    tokens, lengths ~ Poisson(``poisson_lambda``) (the last cut to make the total exact), sorted by
    start. Spans may touch; a 0-length span at ``start`` means "insert before token ``start``"."""
    n = check_int("n", n, 0)
    mask_ratio = check_probability("mask_ratio", mask_ratio)
    poisson_lambda = check_float("poisson_lambda", poisson_lambda, positive=True)
    _check_rng(rng)
    target = round(mask_ratio * n)
    if target == 0:
        return []
    lengths: list[int] = []
    total = 0
    while total < target:
        length = int(rng.poisson(poisson_lambda))
        lengths.append(min(length, target - total))
        total += lengths[-1]
    # Placement: the n - target unmasked tokens and the k spans (each one block) in a random
    # order, every arrangement equally likely: choose which k of the n - target + k slots are spans.
    k = len(lengths)
    slots = np.sort(rng.choice(n - target + k, size=k, replace=False))
    spans, consumed = [], 0
    for j, (slot, length) in enumerate(zip(slots, lengths)):
        start = int(slot) - j + consumed     # slot - j unmasked tokens come before this span
        spans.append((start, length))
        consumed += length
    return spans


def text_infilling(ids: Sequence[int], mask_id: int, rng: np.random.Generator, mask_ratio: float = 0.3,
                   poisson_lambda: float = 3.0) -> list[int]:
    """Replace each span of :func:`sample_spans` by a single ``mask_id`` (0-length: insert one)."""
    ids = check_id_list("ids", ids, 0)
    mask_id = check_int("mask_id", mask_id, 0)
    out, pos = [], 0
    for start, length in sample_spans(len(ids), rng, mask_ratio, poisson_lambda):
        out.extend(ids[pos:start])
        out.append(mask_id)
        pos = start + length
    out.extend(ids[pos:])
    return out


def sentence_permutation(sentences: Sequence[Sequence[int]], rng: np.random.Generator) -> list[list[int]]:
    """The sentences (lists of ids) in a uniformly random order."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a list of sentences (lists of ids), got {type(sentences).__name__}")
    sentences = [check_id_list(f"sentences[{i}]", s, 0) for i, s in enumerate(sentences)]
    return [sentences[i] for i in _check_rng(rng).permutation(len(sentences))]


def document_rotation(ids: Sequence[int], rng: np.random.Generator) -> tuple[list[int], int]:
    """``(ids[start:] + ids[:start], start)`` with ``start`` uniform over the positions."""
    ids = check_id_list("ids", ids, 0)
    if not ids:
        return [], 0
    start = int(_check_rng(rng).integers(len(ids)))
    return ids[start:] + ids[:start], start


def denoising_pair(sentences: Sequence[Sequence[int]], mask_id: int, rng: np.random.Generator,
                   mask_ratio: float = 0.3, poisson_lambda: float = 3.0,
                   permute: bool = True) -> tuple[list[int], list[int]]:
    """``(text_infilling(concat(sentence_permutation(sentences))), concat(sentences))``."""
    order = sentence_permutation(sentences, rng) if permute else \
        [check_id_list(f"sentences[{i}]", s, 0) for i, s in enumerate(sentences)]
    original = [t for s in sentences for t in s]
    return text_infilling([t for s in order for t in s], mask_id, rng, mask_ratio, poisson_lambda), original
