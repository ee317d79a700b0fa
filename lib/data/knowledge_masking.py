"""ERNIE's knowledge masking on Korean text: basic tokens, phrases and entities.

ERNIE 1.0 (Sun et al., 2019) keeps BERT's masked language model but changes *what* is
masked together. Basic-level masking hides single tokens, as BERT does; phrase-level
masking hides every token of a phrase at once; entity-level masking every token of a named
entity. A phrase or a name can then only be recovered from its context, not from its own
other half. The units come from a linguistic analysis of the raw text; the model still
reads WordPiece tokens. The pipeline, top to bottom::

    space_cjk(text)                 spaces around CJK ideographs (Hanja in Korean text), as
                                    BERT and ERNIE do before WordPiece: each one a word
    KoreanChunker.analyse(text)     morphemes from the Korean analyser Kiwi (kiwipiepy)
    phrase_spans(morphemes)         noun and predicate phrases, as character spans
    entity_spans(morphemes)         runs of proper nouns (NNP), as character spans
    token_spans(offsets, spans)     the WordPiece tokens each span covers (merged if they touch)
    KnowledgeExample                ids + phrase and entity token spans of one text
    mask_units(ids, units, ...)     whole units chosen for 15 % of the tokens, then 80/10/10
    collate(examples, levels)       a padded masked-LM batch, one level per example

The phrase rule (documented in :func:`phrase_spans`) is ours, written for Kiwi's Sejong
tag set; ERNIE used Chinese lexical analysis and chunking tools. The rule is simple on
purpose and tested on analysed sentences; it makes mistakes where Kiwi does (a title
tagged as common nouns is a phrase, not an entity).

Masking keeps the number of masked tokens the same at every level: ``round(mask_prob *
n)`` of the ``n`` maskable tokens (at least one), filled by whole units taken in a random
order and skipped when they would overshoot (the rule of BERT's whole-word masking). So a
comparison of the levels compares *which* tokens are hidden, not how many. (ERNIE's own code
draws each unit with probability 0.15 instead; a fixed budget removes one source of noise from
a small experiment.) The tokens of the chosen units then go through BERT's 80/10/10 step
(``lib.data.mlm.corrupt_80_10_10``), token by token as ERNIE's code does; the labels are the
original ids there and -100 elsewhere.

Explained in chapters/13_ernie.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from lib.data.mlm import IGNORE_INDEX, corrupt_80_10_10
from lib.validate import check_choice, check_int, check_probability

__all__ = ["LEVELS", "CJK_RANGES", "is_cjk", "space_cjk", "Morpheme", "KoreanChunker",
           "NOMINAL_TAGS", "PREDICATE_TAGS", "ADVERB_TAGS", "phrase_spans", "entity_spans",
           "token_spans", "KnowledgeExample", "prepare", "units_for", "select_units", "mask_units",
           "knowledge_mask", "collate", "IGNORE_INDEX"]

#: The three masking levels of ERNIE 1.0.
LEVELS = ("basic", "phrase", "entity")

#: The Unicode blocks of CJK ideographs (the ranges BERT's tokenizer treats as "Chinese
#: characters"). Hangul is *not* among them: Korean words stay whole words.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_cjk(ch: str) -> bool:
    """True for a CJK ideograph (Hanzi, Kanji, Hanja), False for Hangul, kana and the rest."""
    if not isinstance(ch, str) or len(ch) != 1:
        raise TypeError(f"ch must be a single character, got {ch!r}")
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def space_cjk(text: str) -> str:
    """``text`` with a space on both sides of every CJK ideograph, whitespace runs collapsed.

    Chinese has no spaces between words, so BERT and ERNIE make each ideograph a word of its
    own before WordPiece: ``"王추천"`` becomes ``"王 추천"``. Korean text is mostly Hangul,
    which is left alone; the rule applies to the Hanja that reviews sometimes contain."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = []
    for ch in text:
        out.append(f" {ch} " if is_cjk(ch) else ch)
    return " ".join("".join(out).split())


# ----------------------------------------------------------------------------- analysis

@dataclass(frozen=True)
class Morpheme:
    """One morpheme of the analysis: its form, Sejong tag and character span ``[start, end)``."""
    form: str
    tag: str
    start: int
    end: int


#: Nominal morphemes (nouns, pronouns, numerals, foreign words, Hanja, determiners,
#: noun prefixes and suffixes, roots): the body of a noun phrase.
NOMINAL_TAGS = frozenset({"NNG", "NNP", "NNB", "NR", "NP", "SN", "SL", "SH", "MM", "XPN", "XSN", "XR"})
#: Predicates (verbs, adjectives, auxiliaries, copulas, verb/adjective-deriving suffixes).
PREDICATE_TAGS = frozenset({"VV", "VA", "VX", "VCP", "VCN", "XSV", "XSA", "XSM"})
#: Adverbs: they open a phrase and join the predicate or noun that follows.
ADVERB_TAGS = frozenset({"MAG", "MAJ"})


def _kind(tag: str) -> str:
    base = tag.split("-")[0]                 # Kiwi marks irregular conjugation as VV-R, VA-I, ...
    if base in NOMINAL_TAGS:
        return "N"
    if base in PREDICATE_TAGS:
        return "P"
    if base in ADVERB_TAGS:
        return "A"
    if base[0] in "JE" or base in {"EP", "ETM", "ETN"}:
        return "F"                           # particles and endings: attach to what came before
    return "O"                               # punctuation, symbols, interjections: break


def _check_morphemes(morphemes) -> list[Morpheme]:
    if isinstance(morphemes, (str, bytes)) or not isinstance(morphemes, Iterable):
        raise TypeError(f"morphemes must be a list of Morpheme, got {type(morphemes).__name__}")
    morphemes = list(morphemes)
    for i, m in enumerate(morphemes):
        if not isinstance(m, Morpheme):
            raise TypeError(f"morphemes[{i}] must be a Morpheme, got {type(m).__name__}")
        if m.start < 0 or m.end < m.start:
            raise ValueError(f"morphemes[{i}] has an invalid span [{m.start}, {m.end})")
    return morphemes


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with overlapping ones merged and empty ones dropped (Kiwi may give a
    morpheme that starts inside the previous one, or one of length 0, for contracted forms)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue                        # an empty span (a morpheme of length 0) covers nothing
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def phrase_spans(morphemes: Sequence[Morpheme]) -> list[tuple[int, int]]:
    """Character spans of the phrases in an analysed sentence.

    The rule, over the morphemes' kinds (N nominal, P predicate, A adverb, F particle or
    ending, O anything else):

    * nominals run together into one noun phrase, across spaces too (``"황금 종려 상"``,
      ``"이 영화"``), until a particle or ending closes it;
    * a predicate joins the phrase before it when it follows an adverb (``"정말
      재미있다"``), a nominal in the same word (``"감동 + 하 + 다"``), a bound noun
      (``"수 있다"``), or a predicate and its ending in the same word or as an auxiliary
      (``"보 + 고 싶 + 다"``); never a particle (``"영화 + 를 보 + 고"`` is two phrases);
    * a nominal after an adnominal ending (ETM) joins it: ``"보 + ㄹ 수"``, ``"좋 + 은 영화"``;
    * particles and endings attach to the phrase before them; punctuation, symbols and
      interjections end it;
    * a new nominal after a particle or ending starts a new phrase.

    Phrases never overlap; a phrase is kept only when it holds a nominal or a predicate.
    """
    morphemes = _check_morphemes(morphemes)
    spans: list[tuple[int, int]] = []
    cur: list[Morpheme] = []
    kinds: list[str] = []

    def close():
        if cur and ("N" in kinds or "P" in kinds):
            spans.append((min(m.start for m in cur), max(m.end for m in cur)))
        cur.clear()
        kinds.clear()

    for m in morphemes:
        k = _kind(m.tag)
        last = kinds[-1] if kinds else None
        same_word = bool(cur) and m.start == cur[-1].end
        if k == "O":
            close()
            continue
        if k == "F":
            if cur:
                cur.append(m)
                kinds.append(k)
            continue
        if k == "N":
            joins = last in ("N", "A") or (last == "F" and cur[-1].tag == "ETM")
        elif k == "P":
            joins = (last in ("A", "P") or (last == "N" and (same_word or cur[-1].tag == "NNB"))
                     or (last == "F" and cur[-1].tag.startswith("E") and kinds.count("P") > 0
                         and (same_word or m.tag.startswith("VX"))))
        else:                                          # an adverb opens a phrase, or extends adverbs
            joins = last == "A"
        if not joins:
            close()
        cur.append(m)
        kinds.append(k)
    close()
    return _merge(spans)


def entity_spans(morphemes: Sequence[Morpheme], max_gap: int = 1) -> list[tuple[int, int]]:
    """Character spans of named entities: runs of proper nouns (tag NNP) at most ``max_gap``
    characters apart (``"송강호"``; ``"해리 포터"`` when both halves are tagged NNP)."""
    morphemes = _check_morphemes(morphemes)
    check_int("max_gap", max_gap, 0)
    spans: list[tuple[int, int]] = []
    prev_was_nnp = False
    for m in morphemes:
        if m.tag == "NNP":
            if prev_was_nnp and m.start - spans[-1][1] <= max_gap:
                spans[-1] = (spans[-1][0], m.end)
            else:
                spans.append((m.start, m.end))
            prev_was_nnp = True
        else:
            prev_was_nnp = False
    return _merge(spans)


class KoreanChunker:
    """Kiwi (the ``kiwipiepy`` package with its model, both from PyPI; runs offline) behind
    the two span functions. ``analyse(text)`` gives :class:`Morpheme` s, ``phrases(text)`` and
    ``entities(text)`` character spans, ``analyse_batch(texts)`` the morphemes of many texts."""

    def __init__(self, num_workers: int = -1):
        from kiwipiepy import Kiwi

        check_int("num_workers", num_workers, -1)
        # Kiwi's threads: -1 all cores, n >= 1 that many; 0 this thread only (then analyse_batch reads
        # one text after another: Kiwi's batch call needs worker threads)
        self.kiwi = Kiwi(num_workers=num_workers)
        self.num_workers = num_workers

    @staticmethod
    def _convert(tokens) -> list[Morpheme]:
        return [Morpheme(t.form, t.tag, t.start, t.start + t.len) for t in tokens]

    def analyse(self, text: str) -> list[Morpheme]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._convert(self.kiwi.tokenize(text))

    def analyse_batch(self, texts: Sequence[str]) -> list[list[Morpheme]]:
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
        if self.num_workers == 0:
            return [self.analyse(t) for t in texts]
        return [self._convert(toks) for toks in self.kiwi.tokenize(texts)]

    def phrases(self, text: str) -> list[tuple[int, int]]:
        return phrase_spans(self.analyse(text))

    def entities(self, text: str) -> list[tuple[int, int]]:
        return entity_spans(self.analyse(text))


# ----------------------------------------------------------------------------- to tokens

def token_spans(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]],
                shift: int = 0) -> list[tuple[int, int]]:
    """Map character spans to token index spans ``[i, j)``: every token whose characters
    overlap the span belongs to it (a span that starts or ends inside a WordPiece token takes
    the whole token). Spans that come to share a token are merged; spans that cover no token
    (cut off by truncation) are dropped. ``shift`` is added to every index (1 for ``[CLS]``)."""
    check_int("shift", shift, 0)
    offsets = [tuple(o) for o in offsets]
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if b <= a:
            raise ValueError(f"span ({a}, {b}) is empty or reversed")
        idx = [t for t, (s, e) in enumerate(offsets) if s < b and e > a]
        if not idx:
            continue
        out.append((idx[0] + shift, idx[-1] + 1 + shift))
    return _merge(out)


def unit_index(num_tokens: int, spans: Sequence[tuple[int, int]], first: int = 0) -> list[int]:
    """Per token, the number of the span ``[i, j)`` that covers it (``first``, ``first + 1``, ...
    in the order of ``spans``), -1 where none does: the form in which a packed token stream keeps
    its units (:func:`units_from_index` reads them back). Spans must not overlap."""
    check_int("num_tokens", num_tokens, 0)
    index = [-1] * num_tokens
    for k, (i, j) in enumerate(spans):
        if not 0 <= i < j <= num_tokens:
            raise ValueError(f"span ({i}, {j}) is outside the {num_tokens} tokens")
        if any(index[t] != -1 for t in range(i, j)):
            raise ValueError(f"span ({i}, {j}) overlaps an earlier span")
        index[i:j] = [first + k] * (j - i)
    return index


def units_from_index(index: Sequence[int], maskable: Sequence[bool]) -> list[tuple[int, int]]:
    """The masking units of a sequence cut from a packed stream: every run of maskable tokens
    that share one span number (>= 0) is a unit, and every other maskable token a unit of its own.
    A span cut by the sequence's edge keeps the part inside it; special tokens are never in a unit."""
    if len(index) != len(maskable):
        raise ValueError(f"index has {len(index)} entries, maskable {len(maskable)}")
    units: list[tuple[int, int]] = []
    t, n = 0, len(index)
    while t < n:
        if not maskable[t]:
            t += 1
            continue
        j = t + 1
        if index[t] >= 0:
            while j < n and maskable[j] and index[j] == index[t]:
                j += 1
        units.append((t, j))
        t = j
    return units


@dataclass
class KnowledgeExample:
    """One text ready for knowledge masking: ``ids`` = ``[CLS] tokens [SEP]`` and the token
    spans of its phrases and entities (indices into ``ids``)."""
    ids: list[int]
    phrases: list[tuple[int, int]] = field(default_factory=list)
    entities: list[tuple[int, int]] = field(default_factory=list)
    text: str = ""


def prepare(texts: Sequence[str], tokenizer, chunker: KoreanChunker, max_len: int = 64,
            morphemes: Sequence[Sequence[Morpheme]] | None = None, cjk_spacing: bool = True
            ) -> list[KnowledgeExample]:
    """Tokenise and analyse ``texts`` (a :class:`lib.text.SubwordTokenizer`, WordPiece or BPE).

    Each text is normalised the tokenizer's way, then :func:`space_cjk` (``cjk_spacing=False``
    skips it: for a tokenizer, like the course checkpoints', that read the text without it);
    Kiwi and the tokenizer read the same string, so the character spans line up with the token
    offsets. Texts are cut to ``max_len`` ids including ``[CLS]`` and ``[SEP]``. ``morphemes``
    (one list per text) skips the analysis when given."""
    check_int("max_len", max_len, 3)
    texts = [tokenizer.normalize(t) for t in texts]
    if cjk_spacing:
        texts = [space_cjk(t) for t in texts]
    if morphemes is None:
        morphemes = chunker.analyse_batch(texts)
    elif len(morphemes) != len(texts):
        raise ValueError(f"morphemes has {len(morphemes)} lists for {len(texts)} texts")
    encs = tokenizer.hf.encode_batch(texts, add_special_tokens=False)
    out = []
    for text, enc, morphs in zip(texts, encs, morphemes):
        n = min(len(enc.ids), max_len - 2)
        offsets = enc.offsets[:n]
        ids = [tokenizer.cls_id, *enc.ids[:n], tokenizer.sep_id]
        out.append(KnowledgeExample(ids=ids, phrases=token_spans(offsets, phrase_spans(morphs), shift=1),
                                    entities=token_spans(offsets, entity_spans(morphs), shift=1),
                                    text=text))
    return out


# ----------------------------------------------------------------------------- masking

def units_for(example: KnowledgeExample, level: str) -> list[tuple[int, int]]:
    """The masking units of ``example`` at ``level``: the level's spans, and every other
    token between ``[CLS]`` and ``[SEP]`` as a unit of its own ("basic": all single tokens)."""
    check_choice("level", level, LEVELS)
    n = len(example.ids)
    spans = {"basic": [], "phrase": example.phrases, "entity": example.entities}[level]
    covered = [False] * n
    units = []
    for i, j in spans:
        if not 1 <= i < j <= n - 1:
            raise ValueError(f"span ({i}, {j}) must lie between [CLS] and [SEP] of {n} ids")
        units.append((i, j))
        for t in range(i, j):
            covered[t] = True
    units += [(t, t + 1) for t in range(1, n - 1) if not covered[t]]
    return sorted(units)


def select_units(units: Sequence[tuple[int, int]], num_tokens: int, mask_prob: float = 0.15,
                 generator: torch.Generator | None = None) -> list[tuple[int, int]]:
    """Choose whole units covering exactly ``max(1, round(mask_prob * num_tokens))`` tokens
    when the units allow it: units in a random order, each taken if it still fits the
    budget. If no unit fits (one phrase longer than the budget), the first token of the
    first unit in that order is taken, so every example has something to predict."""
    check_probability("mask_prob", mask_prob)
    check_int("num_tokens", num_tokens, 1)
    budget = max(1, int(round(mask_prob * num_tokens)))
    order = torch.randperm(len(units), generator=generator).tolist()
    chosen, used = [], 0
    for u in order:
        i, j = units[u]
        if used + (j - i) <= budget:
            chosen.append((i, j))
            used += j - i
        if used == budget:
            break
    if not chosen and units:
        i, _ = units[order[0]]
        chosen = [(i, i + 1)]
    return sorted(chosen)


def mask_units(ids: Sequence[int], units: Sequence[tuple[int, int]], *, mask_id: int, vocab_size: int,
               mask_prob: float = 0.15, generator: torch.Generator | None = None,
               num_special: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-unit masking of one sequence: ``(inputs, labels)`` as LongTensors ``(T,)``.

    ``units`` are ``[i, j)`` token spans (:func:`units_for`). The chosen units
    (:func:`select_units`, budget from the number of tokens in ``units``) are predicted as a
    whole; their tokens then go through BERT's 80/10/10 step
    (:func:`lib.data.mlm.corrupt_80_10_10`: ``[MASK]``, a random ordinary token with id
    ``num_special .. vocab_size - 1``, or kept, token by token as in ERNIE's code). ``labels``
    hold the original ids at the chosen positions and -100 elsewhere."""
    check_int("mask_id", mask_id, 0)
    check_int("vocab_size", vocab_size, num_special + 1)
    ids = torch.as_tensor(list(ids), dtype=torch.long)
    units = [(int(i), int(j)) for i, j in units]
    for i, j in units:
        if not 0 <= i < j <= len(ids):
            raise ValueError(f"unit ({i}, {j}) is outside the {len(ids)} ids")
    chosen = torch.zeros(len(ids), dtype=torch.bool)
    if units:
        for i, j in select_units(units, sum(j - i for i, j in units), mask_prob, generator):
            chosen[i:j] = True
    inputs, labels = corrupt_80_10_10(ids[None], chosen[None], mask_id, vocab_size,
                                      random_ids=torch.arange(num_special, vocab_size), generator=generator)
    return inputs[0], labels[0]


def knowledge_mask(example: KnowledgeExample, level: str, *, mask_id: int, vocab_size: int,
                   mask_prob: float = 0.15, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mask_units` on the units of ``example`` at ``level`` ("basic", "phrase", "entity")."""
    return mask_units(example.ids, units_for(example, level), mask_id=mask_id, vocab_size=vocab_size,
                      mask_prob=mask_prob, generator=generator)



def collate(examples: Sequence[KnowledgeExample], levels: str | Sequence[str], *, mask_id: int,
            vocab_size: int, pad_id: int = 0, mask_prob: float = 0.15,
            generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """A masked-LM batch: ``input_ids``, ``attention_mask`` (bool, True at real tokens) and
    ``mlm_labels`` (-100 where nothing is predicted), right-padded with ``pad_id``.

    ``levels``: one level for every example, or a list with one level per example."""
    examples = list(examples)
    if not examples:
        raise ValueError("examples is empty")
    if isinstance(levels, str):
        levels = [levels] * len(examples)
    levels = list(levels)
    if len(levels) != len(examples):
        raise ValueError(f"levels has {len(levels)} entries for {len(examples)} examples")
    T = max(len(ex.ids) for ex in examples)
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), T), dtype=torch.bool)
    for b, (ex, level) in enumerate(zip(examples, levels)):
        x, y = knowledge_mask(ex, level, mask_id=mask_id, vocab_size=vocab_size, mask_prob=mask_prob,
                              generator=generator)
        input_ids[b, :len(x)], labels[b, :len(y)], attention_mask[b, :len(x)] = x, y, True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "mlm_labels": labels}


# ----------------------------------------------------------------------------- the cloze test

@dataclass(frozen=True)
class ClozeItem:
    """One cloze question: ``ids`` (``[CLS] ... [SEP]``) with the tokens ``span = (i, j)`` to be
    hidden together and restored from the rest of the review."""
    ids: tuple[int, ...]
    span: tuple[int, int]
    level: str


def cloze_items(examples: Sequence[KnowledgeExample], level: str, seed: int = 0,
                min_tokens: int = 2) -> list[ClozeItem]:
    """ERNIE's cloze test as a measurement: from every example with a unit of ``level`` of at least
    ``min_tokens`` tokens, one such unit drawn at random (seeded), to be masked whole.
    ``"basic"``: one ordinary token per example (``min_tokens`` does not apply). Examples without
    such a unit give no item, so two models are always compared on the same items."""
    check_choice("level", level, LEVELS)
    check_int("min_tokens", min_tokens, 1)
    g = torch.Generator().manual_seed(seed)
    items = []
    for ex in examples:
        if level == "basic":
            units = [(t, t + 1) for t in range(1, len(ex.ids) - 1)]
        else:
            units = [(i, j) for i, j in (ex.phrases if level == "phrase" else ex.entities) if j - i >= min_tokens]
        if units:
            k = int(torch.randint(len(units), (1,), generator=g))
            items.append(ClozeItem(tuple(ex.ids), units[k], level))
    return items


@torch.no_grad()
def cloze_scores(logits_fn, items: Sequence[ClozeItem], *, mask_id: int, pad_id: int = 0,
                 batch_size: int = 128) -> dict[str, list[float]]:
    """Every item's unit replaced by ``[MASK]`` s and predicted from
    ``logits_fn(input_ids, attention_mask, hidden) -> (N, V)``, the logits at the ``N`` positions
    where the bool mask ``hidden (B, T)`` is True, in row-major order (so the model's vocabulary head
    runs on the hidden positions only, like BERT's ``only_masked``): per item, ``"tokens"`` the share of the
    unit's tokens restored (each token by the argmax), ``"whole"`` 1.0 when all of them are (else
    0.0), and ``"nll"`` the mean negative log-likelihood of the unit's tokens in nats (the masked-LM
    loss on that unit: lower is better; it still ranks two models when neither restores the unit)."""
    items = list(items)
    if not items:
        raise ValueError("items is empty: no example had a unit of that level")
    out: dict[str, list[float]] = {"tokens": [], "whole": [], "nll": []}
    for s in range(0, len(items), batch_size):
        chunk = items[s:s + batch_size]
        T = max(len(it.ids) for it in chunk)
        ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        hidden = torch.zeros((len(chunk), T), dtype=torch.bool)
        for b, it in enumerate(chunk):
            ids[b, :len(it.ids)] = torch.tensor(it.ids)
            hidden[b, it.span[0]:it.span[1]] = True
        attention = ids != pad_id
        attention[:, 0] = True
        inputs = ids.masked_fill(hidden, mask_id)
        logits = logits_fn(inputs, attention, hidden).float().cpu()
        if logits.shape[:1] != (int(hidden.sum()),):
            raise ValueError(f"logits_fn gave logits of shape {tuple(logits.shape)} for {int(hidden.sum())} hidden "
                             "positions: it must return the logits at the hidden positions only, (N, V)")
        truth = ids[hidden]
        right = torch.zeros(hidden.shape)
        right[hidden] = (logits.argmax(-1) == truth).float()
        nll = torch.zeros(hidden.shape)
        nll[hidden] = -torch.log_softmax(logits, -1).gather(-1, truth[:, None])[:, 0]
        n = hidden.sum(1)
        out["tokens"] += (right.sum(1) / n).tolist()
        out["whole"] += (right.sum(1) == n).float().tolist()
        out["nll"] += (nll.sum(1) / n).tolist()
    return out
