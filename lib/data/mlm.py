"""BERT's pre-training data: masked-LM corruption and next-sentence-prediction pairs.

Built the way the original ``create_pretraining_data.py`` (Devlin et al., 2019) builds them::

    choose_positions      which tokens are predicted: 15 % of the real, non-special tokens of
                          each sequence (``round``, at least one), chosen uniformly at random
    corrupt_80_10_10      of the chosen: 80 % -> [MASK], 10 % -> a random token, 10 % unchanged
    mask_tokens           both at once -> (inputs, labels): labels hold the original token at
                          the chosen positions and -100 everywhere else (ignored by the loss)
    truncate_pair         cut the longer segment, at the front or the back with probability 1/2
    pack_pair             [CLS] A [SEP] B [SEP] and the segment ids 0 ... 0 1 ... 1
    nsp_examples          documents (lists of sentences of token ids) -> sentence pairs: half the
                          time B is the text that follows A, half the time text from another
                          document; usually filled to the full length, 10 % of the time to a
                          shorter random target length

The labels of next-sentence prediction come from the raw text itself (which sentence follows
which), so NSP is self-supervised like MLM: no human labels anything.

``choose_positions`` and ``corrupt_80_10_10`` are separate so that other units of masking reuse
the 80/10/10 step (ERNIE chooses whole phrases and entities; pass its ``chosen`` mask);
``truncate_pair`` and ``pack_pair`` build ALBERT's sentence-order pairs as well.

Explained in chapters/08_bert.ipynb.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from lib.validate import check_int, check_probability, check_tensor

__all__ = ["IGNORE_INDEX", "collate_masked_pairs", "candidate_mask", "choose_positions", "corrupt_80_10_10", "mask_tokens",
           "truncate_pair", "pack_pair", "PairExample", "nsp_examples", "collate_pretraining", "IS_NEXT", "NOT_NEXT"]

IGNORE_INDEX = -100       # the label of positions the MLM loss ignores (cross_entropy's default)
IS_NEXT, NOT_NEXT = 0, 1  # NSP labels, as in Hugging Face's BertForPreTraining


def candidate_mask(ids: torch.Tensor, special_ids: Iterable[int] = (), pad_id: int | None = None,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """True where a token may be chosen: not special ([CLS], [SEP], ...), not padding."""
    check_tensor("ids", ids, dtype=torch.long, dim=2, what="(batch, time)")
    ok = torch.ones_like(ids, dtype=torch.bool)
    for s in set(special_ids) | ({pad_id} if pad_id is not None else set()):
        ok &= ids != s
    if attention_mask is not None:
        check_tensor("attention_mask", attention_mask, shape=tuple(ids.shape), what="(batch, time)")
        ok &= attention_mask.bool()
    return ok


def choose_positions(candidates: torch.Tensor, mask_prob: float = 0.15, max_predictions: int | None = None,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Choose ``max(1, round(mask_prob * n))`` of the ``n`` candidates of each row, uniformly
    (at most ``max_predictions``; none in a row without candidates). ``candidates (B, T)`` bool."""
    check_tensor("candidates", candidates, dtype="bool", dim=2, what="(batch, time)")
    mask_prob = check_probability("mask_prob", mask_prob)
    check_int("max_predictions", max_predictions, 1, allow_none=True)
    n = candidates.sum(dim=1)
    k = torch.clamp(torch.round(n.double() * mask_prob).long(), min=1)
    k = torch.minimum(k, n)
    if max_predictions is not None:
        k = k.clamp(max=max_predictions)
    noise = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    noise = noise.masked_fill(~candidates, 2.0)               # non-candidates sort last
    rank = noise.argsort(dim=1).argsort(dim=1)                 # rank of each position in its row
    return rank < k[:, None]


def corrupt_80_10_10(ids: torch.Tensor, chosen: torch.Tensor, mask_id: int, vocab_size: int,
                     replace_prob: float = 0.8, random_prob: float = 0.1, random_ids: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt the ``chosen`` positions: with probability 0.8 [MASK], 0.1 a random token, else kept.

    The random token is drawn uniformly from ``random_ids`` (default: the whole vocabulary, as
    in the original code). Returns ``(inputs, labels)``, labels -100 where nothing was chosen."""
    check_tensor("ids", ids, dtype=torch.long, dim=2, what="(batch, time)")
    check_tensor("chosen", chosen, dtype="bool", shape=tuple(ids.shape), what="(batch, time)")
    check_int("vocab_size", vocab_size, 1)
    check_int("mask_id", mask_id, 0, vocab_size - 1)
    replace_prob, random_prob = check_probability("replace_prob", replace_prob), check_probability("random_prob", random_prob)
    if replace_prob + random_prob > 1.0 + 1e-12:
        raise ValueError(f"replace_prob + random_prob must be <= 1, got {replace_prob} + {random_prob}")
    u = torch.rand(ids.shape, generator=generator, device=ids.device)
    to_mask = chosen & (u < replace_prob)
    to_random = chosen & (u >= replace_prob) & (u < replace_prob + random_prob)
    if random_ids is None:
        rand = torch.randint(vocab_size, ids.shape, generator=generator, device=ids.device)
    else:
        check_tensor("random_ids", random_ids, dtype=torch.long, dim=1)
        if random_ids.numel() == 0:
            raise ValueError("random_ids must not be empty")
        rand = random_ids.to(ids.device)[torch.randint(random_ids.numel(), ids.shape, generator=generator,
                                                        device=ids.device)]
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, rand, inputs)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, labels


def mask_tokens(ids: torch.Tensor, mask_id: int, vocab_size: int, special_ids: Iterable[int] = (),
                pad_id: int | None = None, attention_mask: torch.Tensor | None = None, mask_prob: float = 0.15,
                replace_prob: float = 0.8, random_prob: float = 0.1, max_predictions: int | None = None,
                random_ids: torch.Tensor | None = None, chosen: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM corruption of ``ids (B, T)`` -> ``(inputs, labels)``.

    ``mask_prob`` of the candidates (neither special nor padding) are chosen per row; of those
    80 % become ``mask_id``, 10 % a random token, 10 % stay; ``labels`` is the original token at
    the chosen positions and -100 elsewhere. ``chosen`` (bool ``(B, T)``) skips the choice and
    corrupts exactly those positions (whole-word, phrase or span masking)."""
    check_tensor("ids", ids, dtype=torch.long, dim=2, what="(batch, time)")
    if chosen is None:
        cand = candidate_mask(ids, special_ids, pad_id, attention_mask)
        chosen = choose_positions(cand, mask_prob, max_predictions, generator)
    return corrupt_80_10_10(ids, chosen, mask_id, vocab_size, replace_prob, random_prob, random_ids, generator)


# ----------------------------------------------------------------------------- sentence pairs

def truncate_pair(a: list, b: list, max_tokens: int, rng: random.Random) -> None:
    """Shorten ``a`` and ``b`` in place until ``len(a) + len(b) <= max_tokens``: one token at a
    time from the longer one, from its front or its back with probability 1/2 each."""
    check_int("max_tokens", max_tokens, 2)
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def pack_pair(a: Sequence[int], b: Sequence[int], cls_id: int, sep_id: int) -> tuple[list[int], list[int]]:
    """``[CLS] A [SEP] B [SEP]`` and its segment ids (0 for [CLS], A and the first [SEP]; 1 after)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"both segments must be non-empty, got lengths {len(a)} and {len(b)}")
    tokens = [cls_id, *a, sep_id, *b, sep_id]
    return tokens, [0] * (len(a) + 2) + [1] * (len(b) + 1)


@dataclass
class PairExample:
    tokens: list[int]          # [CLS] A [SEP] B [SEP]
    segment_ids: list[int]     # 0 ... 0 1 ... 1
    is_random_next: bool       # NSP label: False = IsNext (0), True = NotNext (1)

    @property
    def nsp_label(self) -> int:
        return NOT_NEXT if self.is_random_next else IS_NEXT


def nsp_examples(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int, cls_id: int, sep_id: int,
                 short_seq_prob: float = 0.1, nsp_prob: float = 0.5, rng: random.Random | None = None,
                 ) -> list[PairExample]:
    """Next-sentence pairs from ``documents`` (each a list of sentences, each a list of token ids),
    following ``create_instances_from_document`` of the original code, for every document once.

    Sentences are gathered until a target length is reached (``max_seq_length - 3``; with
    probability ``short_seq_prob`` a random target in ``[2, max_seq_length - 3]``). A random
    number of the gathered sentences become A; the rest become B (IsNext) or, with probability
    ``nsp_prob`` or when only one sentence was gathered, B is taken from a random place in another
    document (NotNext) and the unused sentences go back to be used in the next pair. The pair is
    truncated to fit with :func:`truncate_pair` and packed with :func:`pack_pair`."""
    check_int("max_seq_length", max_seq_length, 5)
    short_seq_prob = check_probability("short_seq_prob", short_seq_prob)
    nsp_prob = check_probability("nsp_prob", nsp_prob)
    rng = rng if rng is not None else random.Random(0)
    docs = [[list(s) for s in d if len(s)] for d in documents]
    if sum(1 for d in docs if d) < 2:
        raise ValueError("nsp_examples needs at least two non-empty documents (NotNext takes B from another one)")
    max_tokens = max_seq_length - 3
    out: list[PairExample] = []
    for di, doc in enumerate(docs):
        target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
        chunk: list[list[int]] = []
        length, i = 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                if len(chunk) == 1 or rng.random() < nsp_prob:
                    random_next = True
                    b_target = max(1, target - len(a))
                    for _ in range(10):
                        ri = rng.randrange(len(docs))
                        if ri != di and docs[ri]:
                            break
                    else:
                        ri = next(j for j in range(len(docs)) if j != di and docs[j])
                    other = docs[ri]
                    b: list[int] = []
                    for s in other[rng.randrange(len(other)):]:
                        b.extend(s)
                        if len(b) >= b_target:
                            break
                    i -= len(chunk) - a_end          # the unused sentences are not wasted
                else:
                    random_next = False
                    b = [t for s in chunk[a_end:] for t in s]
                truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    tokens, segments = pack_pair(a, b, cls_id, sep_id)
                    out.append(PairExample(tokens, segments, random_next))
                chunk, length = [], 0
            i += 1
    return out


def collate_masked_pairs(token_ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]],
                         nsp_labels: Sequence[int], *, mask_id: int, vocab_size: int, pad_id: int,
                         special_ids: Iterable[int], generator: torch.Generator | None = None,
                         what: str = "example", **mask_kwargs) -> dict[str, torch.Tensor]:
    """Pad packed sequences and their segment (or role) ids, and mask them with
    :func:`mask_tokens`: ``input_ids``, ``token_type_ids`` (0 on padding), ``attention_mask``
    (bool), ``mlm_labels`` (-100 where not chosen) and ``nsp_labels``. Shared by BERT's
    pretraining batches and ERNIE's dialogue batches."""
    if not token_ids:
        raise ValueError(f"a batch needs at least one {what}")
    if not len(token_ids) == len(type_ids) == len(nsp_labels):
        raise ValueError(f"{len(token_ids)} token lists, {len(type_ids)} type-id lists and "
                         f"{len(nsp_labels)} labels: one of each per {what}")
    for b, (tokens, types) in enumerate(zip(token_ids, type_ids)):
        if len(tokens) != len(types):
            raise ValueError(f"{what} {b} has {len(tokens)} ids but {len(types)} segment/role ids")
    from lib.text import pad_batch

    ids, lengths = pad_batch(token_ids, pad_id=pad_id)
    types, _ = pad_batch(type_ids, pad_id=0)
    keep = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    inputs, labels = mask_tokens(ids, mask_id, vocab_size, special_ids=special_ids, pad_id=pad_id,
                                 attention_mask=keep, generator=generator, **mask_kwargs)
    return {"input_ids": inputs, "token_type_ids": types, "attention_mask": keep, "mlm_labels": labels,
            "nsp_labels": torch.tensor(list(nsp_labels))}


def collate_pretraining(examples: Sequence[PairExample], mask_id: int, vocab_size: int, pad_id: int,
                        special_ids: Iterable[int], generator: torch.Generator | None = None,
                        **mask_kwargs) -> dict[str, torch.Tensor]:
    """A batch of :class:`PairExample` -> padded tensors with fresh 80/10/10 masking:
    ``input_ids``, ``token_type_ids``, ``attention_mask`` (bool), ``mlm_labels`` (-100 where not
    chosen) and ``nsp_labels`` (0 IsNext, 1 NotNext).

    Masking here, per batch, gives every pass over the data new masks (RoBERTa's *dynamic*
    masking); the original code masked once when it wrote the data, ``dupe_factor`` = 10 times
    with different masks."""
    if not examples:
        raise ValueError("collate_pretraining needs at least one example")
    return collate_masked_pairs([e.tokens for e in examples], [e.segment_ids for e in examples],
                                [e.nsp_label for e in examples], mask_id=mask_id, vocab_size=vocab_size,
                                pad_id=pad_id, special_ids=special_ids, generator=generator, **mask_kwargs)
