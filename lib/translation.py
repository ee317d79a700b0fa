"""The translation experiment shared by chapters 1 and 3: split, length buckets, BLEU.

Both chapters train on the same Tatoeba pairs and score on the same held-out sentences,
so that the attention RNN of chapter 1 and the Transformer of chapter 3 are compared on
equal terms:

* :func:`split_pairs` splits **by source sentence** with a checksum (CRC-32), so the split
  never changes between runs or machines, and every translation of a held-out sentence is
  kept as a BLEU reference (none of them is seen in training);
* :func:`length_buckets` groups the held-out sentences by source length in tokens;
* :func:`corpus_bleu` is sacreBLEU's corpus BLEU on our own tokenisation, against all the
  references of each sentence;
* :func:`paired_bleu` compares two systems on the same sentences: both BLEUs, their difference and
  the difference's standard error from a paired bootstrap over the sentences (corpus BLEU is not a
  mean over sentences, so the sentences are resampled and BLEU recomputed from their n-gram counts).

Explained in chapters/01_seq2seq_attention.ipynb, chapters/03_transformer.ipynb.
"""
from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from lib.text import simple_tokenize
from lib.validate import check_int

__all__ = ["DEFAULT_BUCKETS", "TranslationSplit", "is_held_out", "split_pairs", "bucket_name",
           "length_buckets", "heldout_sample", "corpus_bleu", "bleu_statistics", "bleu_from_statistics", "paired_bleu",
           "paired_bleu_seeds"]

#: Source-length buckets (in tokens, both ends included; ``None``: no upper end).
DEFAULT_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 5), (6, 8), (9, 11), (12, 14), (15, None))

Tokenize = Callable[[str], list[str]]


def is_held_out(sentence: str, every: int = 10) -> bool:
    """True for about one source sentence in ``every``, chosen by its CRC-32 checksum.

    The choice depends only on the sentence, so all the pairs that share a source sentence
    fall on the same side of the split, and the split is the same on every machine.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    check_int("every", every, 2)
    return zlib.crc32(sentence.encode("utf-8")) % every == 0


@dataclass
class TranslationSplit:
    """Tokenised training pairs and the held-out references of :func:`split_pairs`."""

    train_pairs: list[tuple[list[str], list[str]]]
    #: held-out source sentence -> all its translations (untokenised), in corpus order
    references: dict[str, list[str]]


def split_pairs(rows: Iterable[Mapping[str, str]], *, tokenize: Tokenize = simple_tokenize,
                max_tokens: int | None = None, max_train_pairs: int | None = None, seed: int = 0,
                every: int = 10, src_key: str = "en", tgt_key: str = "other") -> TranslationSplit:
    """Split translation pairs into tokenised training pairs and held-out references.

    ``rows`` are dicts such as those of :func:`lib.data.load_tatoeba`. A pair is held out
    when :func:`is_held_out` says so for its source sentence. Training pairs longer than
    ``max_tokens`` on either side are dropped; ``max_train_pairs`` keeps a random subset
    (``torch.randperm`` seeded with ``seed``, in that random order) for the small CI recipe.
    """
    max_tokens = check_int("max_tokens", max_tokens, 1, allow_none=True)
    max_train_pairs = check_int("max_train_pairs", max_train_pairs, 0, allow_none=True)
    train_pairs: list[tuple[list[str], list[str]]] = []
    references: dict[str, list[str]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or src_key not in row or tgt_key not in row:
            raise ValueError(f"row {i} must be a mapping with keys {src_key!r} and {tgt_key!r}, got {row!r}")
        src, tgt = row[src_key], row[tgt_key]
        if is_held_out(src, every):
            references.setdefault(src, []).append(tgt)
            continue
        s, t = tokenize(src), tokenize(tgt)
        if max_tokens is None or (len(s) <= max_tokens and len(t) <= max_tokens):
            train_pairs.append((s, t))
    if max_train_pairs is not None:
        order = torch.randperm(len(train_pairs), generator=torch.Generator().manual_seed(seed)).tolist()
        train_pairs = [train_pairs[i] for i in order[:max_train_pairs]]
    return TranslationSplit(train_pairs, references)


def bucket_name(lo: int, hi: int | None) -> str:
    """``"6-8"`` for a closed bucket, ``"15+"`` for an open-ended one."""
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


def _check_buckets(buckets) -> list[tuple[int, int | None]]:
    checked, previous_hi = [], 0
    for b in buckets:
        if not (isinstance(b, (tuple, list)) and len(b) == 2):
            raise ValueError(f"each bucket must be a pair (lo, hi), got {b!r}")
        lo, hi = b
        if not isinstance(lo, int) or lo <= previous_hi or (hi is not None and (not isinstance(hi, int) or hi < lo)):
            raise ValueError(f"buckets must be increasing, non-overlapping (lo, hi) pairs with lo <= hi; "
                             f"got {list(buckets)!r}")
        checked.append((lo, hi))
        previous_hi = hi if hi is not None else float("inf")
    if not checked:
        raise ValueError("buckets must not be empty")
    return checked


def length_buckets(references: Mapping[str, Sequence[str]], *, tokenize: Tokenize = simple_tokenize,
                   buckets: Sequence[tuple[int, int | None]] = DEFAULT_BUCKETS,
                   per_bucket: int | None = None, seed: int = 1) -> dict[str, list[tuple[str, list[str]]]]:
    """Group held-out ``(source, references)`` by source length in tokens.

    Returns ``{bucket name: [(source, references), ...]}`` with every bucket in the order
    of ``buckets`` (possibly empty) and the sentences of a bucket in sorted order. With
    ``per_bucket``, each bucket keeps a fixed random sample of that many sentences (the
    same sample on every run for a given ``seed``); sentences outside every bucket are
    left out.
    """
    buckets = _check_buckets(buckets)
    per_bucket = check_int("per_bucket", per_bucket, 1, allow_none=True)
    sets: dict[str, list[tuple[str, list[str]]]] = {bucket_name(lo, hi): [] for lo, hi in buckets}
    for src, refs in sorted(references.items()):
        if not refs:
            raise ValueError(f"source sentence {src!r} has no reference translation")
        n = len(tokenize(src))
        for lo, hi in buckets:
            if lo <= n and (hi is None or n <= hi):
                sets[bucket_name(lo, hi)].append((src, list(refs)))
                break
    if per_bucket is not None:
        for name, items in sets.items():
            order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
            sets[name] = [items[i] for i in sorted(order[:per_bucket])]
    return sets


def heldout_sample(references: Mapping[str, Sequence[str]], n: int, seed: int = 1) -> list[tuple[str, str]]:
    """``n`` held-out ``(source, its first translation)`` pairs in a seeded random order (every length
    represented): the pairs on which ``python -m tools.pretrain`` measures a translator's held-out loss
    while it trains (with ``seed`` = the recipe's seed + 1), so that a page can measure the same."""
    n = check_int("n", n, 1)
    sources = list(references)
    order = torch.randperm(len(sources), generator=torch.Generator().manual_seed(seed)).tolist()
    return [(sources[i], references[sources[i]][0]) for i in order[:n]]


def corpus_bleu(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[str]], *,
                tokenize: Tokenize = simple_tokenize) -> float:
    """Corpus BLEU (0–100) of tokenised ``hypotheses`` against untokenised ``references``.

    ``references[i]`` holds all the reference translations of sentence ``i`` (at least
    one; sentences may have different numbers of them). References are tokenised with
    ``tokenize`` and scored by sacreBLEU with ``tokenize="none"``, so hypotheses and
    references are split into words the same way.
    """
    import sacrebleu  # imported here: only the translation chapters need it

    _check_bleu_inputs(hypotheses, references)
    return sacrebleu.corpus_bleu([" ".join(h) for h in hypotheses], _reference_streams(references, tokenize),
                                 tokenize="none", force=True).score


def _check_bleu_inputs(hypotheses, references) -> None:
    """Every hypothesis a token list, with a non-empty list of reference strings."""
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses but {len(references)} reference lists")
    if not hypotheses:
        raise ValueError("corpus_bleu needs at least one sentence")
    for i, (hyp, refs) in enumerate(zip(hypotheses, references)):
        if isinstance(hyp, str):
            raise TypeError(f"hypothesis {i} must be a list of tokens, got a str: {hyp!r}")
        if isinstance(refs, str) or not refs:
            raise ValueError(f"references[{i}] must be a non-empty list of reference strings, got {refs!r}")


def _reference_streams(references, tokenize: Tokenize) -> list[list[str | None]]:
    """sacreBLEU's reference streams: the k-th reference of every sentence, tokenised (None where a
    sentence has fewer)."""
    n_refs = max(len(r) for r in references)
    return [[" ".join(tokenize(r[k])) if k < len(r) else None for r in references] for k in range(n_refs)]


@functools.lru_cache(maxsize=1)
def _bleu_metric():
    """One sacreBLEU scorer (a bootstrap scores thousands of resamples with it)."""
    from sacrebleu.metrics import BLEU
    return BLEU(tokenize="none", force=True)


def bleu_statistics(hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[str]], *,
                    tokenize: Tokenize = simple_tokenize) -> torch.Tensor:
    """The n-gram counts BLEU is computed from, one row per sentence ``(N, 10)``: hypothesis length,
    closest reference length, then matched and total n-grams for n = 1..4 (sacreBLEU's). Corpus BLEU
    is :func:`bleu_from_statistics` of their column sums, so any resample of the sentences can be
    scored without translating again."""
    _check_bleu_inputs(hypotheses, references)
    return _statistics(hypotheses, _reference_streams(references, tokenize))


def _statistics(hypotheses, streams) -> torch.Tensor:
    stats = _bleu_metric()._extract_corpus_statistics([" ".join(h) for h in hypotheses], streams)
    return torch.tensor(stats, dtype=torch.float64)


def bleu_from_statistics(stats: torch.Tensor) -> float:
    """Corpus BLEU (0-100) of the sentences whose :func:`bleu_statistics` rows are ``stats``."""
    if stats.dim() != 2 or stats.shape[1] != 10 or not len(stats):
        raise ValueError(f"stats must be bleu_statistics rows (N, 10), got shape {tuple(stats.shape)}")
    return float(_bleu_metric()._compute_score_from_stats([int(x) for x in stats.sum(0).round().tolist()]).score)


def paired_bleu(hyps_a: Sequence[Sequence[str]], hyps_b: Sequence[Sequence[str]],
                references: Sequence[Sequence[str]], *, tokenize: Tokenize = simple_tokenize,
                samples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Two systems' translations of the same sentences: ``{"a", "b"}`` their corpus BLEUs, ``"mean"``
    the difference ``a - b``, ``"se"`` its standard error from a paired bootstrap (``samples``
    resamples of the sentences with replacement, the same resample for both systems, from ``seed``),
    ``"n"`` the number of sentences. The dict reads like :func:`lib.transfer.item_difference`'s, so
    :func:`lib.transfer.item_sentence` (``unit="bleu"``) turns it into a sentence."""
    samples = check_int("samples", samples, 2)
    if not (len(hyps_a) == len(hyps_b) == len(references)):
        raise ValueError(f"both systems must translate the same sentences: got {len(hyps_a)} and {len(hyps_b)} "
                         f"translations for {len(references)} reference lists")
    for hyps in (hyps_a, hyps_b):
        _check_bleu_inputs(hyps, references)
    streams = _reference_streams(references, tokenize)                  # the references tokenised once
    sa, sb = (_statistics(h, streams) for h in (hyps_a, hyps_b))
    a, b = bleu_from_statistics(sa), bleu_from_statistics(sb)
    return {"a": a, "b": b, "mean": a - b, "se": _bootstrap_se([sa], [sb], samples, seed), "n": len(sa)}


def _bootstrap_se(sa: Sequence[torch.Tensor], sb: Sequence[torch.Tensor], samples: int, seed: int) -> float:
    """The standard error of the seed-averaged BLEU difference ``a - b`` from a paired bootstrap: ``samples``
    resamples of the sentences with replacement (from ``seed``), the same for every seed and both systems;
    ``sa[s]``, ``sb[s]`` are the :func:`bleu_statistics` of seed ``s``."""
    g = torch.Generator().manual_seed(seed)
    diffs = []
    for _ in range(samples):
        idx = torch.randint(len(sa[0]), (len(sa[0]),), generator=g)
        diffs.append(sum(bleu_from_statistics(x[idx]) - bleu_from_statistics(y[idx]) for x, y in zip(sa, sb)) / len(sa))
    return float(torch.tensor(diffs).std())


def paired_bleu_seeds(hyps_a: Sequence[Sequence[Sequence[str]]], hyps_b: Sequence[Sequence[Sequence[str]]],
                      references: Sequence[Sequence[str]], *, tokenize: Tokenize = simple_tokenize,
                      samples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Two systems trained from the same seeds: ``hyps_a[s]`` and ``hyps_b[s]`` are the translations of
    the same sentences by the runs of seed ``s``. ``{"a", "b"}``: their corpus BLEUs averaged over the
    seeds; ``"mean"``: the mean difference; ``"se"``: its standard error from both sources of noise, the
    seeds' spread of their differences and a paired bootstrap over the sentences of the seed-averaged
    difference (``lib.transfer.combine_noise``, as ``grid_difference`` does for per-item scores);
    ``"n"`` seeds, ``"items"`` sentences, ``"df"``, ``"by_seed"``. Reads like a ``grid_difference`` in
    :func:`lib.transfer.item_sentence` (``unit="bleu"``)."""
    from lib.transfer import combine_noise, mean_se
    samples = check_int("samples", samples, 2)
    if not hyps_a or len(hyps_a) != len(hyps_b):
        raise ValueError(f"both systems need the same seeds: got {len(hyps_a)} and {len(hyps_b)}")
    for hyps in (*hyps_a, *hyps_b):
        if len(hyps) != len(references):
            raise ValueError(f"every seed must translate the same sentences: got {len(hyps)} translations for "
                             f"{len(references)} reference lists")
        _check_bleu_inputs(hyps, references)
    streams = _reference_streams(references, tokenize)
    sa, sb = [_statistics(h, streams) for h in hyps_a], [_statistics(h, streams) for h in hyps_b]
    bleu_a, bleu_b = [bleu_from_statistics(s) for s in sa], [bleu_from_statistics(s) for s in sb]
    by_seed = [x - y for x, y in zip(bleu_a, bleu_b)]
    se, df = combine_noise(mean_se(by_seed)[1] if len(sa) > 1 else None, len(sa),
                           _bootstrap_se(sa, sb, samples, seed), len(references))
    return {"a": sum(bleu_a) / len(sa), "b": sum(bleu_b) / len(sb), "mean": sum(by_seed) / len(sa), "se": se,
            "n": len(sa), "items": len(references), "df": df, "by_seed": by_seed}
