"""Text to ids and back: subword tokenizers, word vocabularies, padding and batching.

Two families of tokenizers are used in the course:

* **Subword** tokenizers (BPE, WordPiece) trained with the Hugging Face ``tokenizers``
  library: :func:`train_tokenizer` returns a :class:`SubwordTokenizer`.
* **Word-level** vocabularies for the early RNN chapters: :func:`simple_tokenize` splits
  a sentence into words and punctuation, :class:`WordVocab` maps them to ids.

Both share the same special tokens, always with the same ids::

    [PAD]=0  [UNK]=1  [BOS]=2  [EOS]=3  [CLS]=4  [SEP]=5  [MASK]=6

so ``pad_id`` is 0 and ``bos_id`` is 2 whichever tokenizer a chapter uses.

How the subword tokenizers see text
-----------------------------------
Text is first normalized: Unicode NFC (decomposed Hangul is composed into syllables),
every run of whitespace becomes one space, leading/trailing spaces are stripped (and,
with ``lowercase=True``, lower-cased). :meth:`SubwordTokenizer.normalize` shows the
result. NFKC is deliberately *not* used: it turns the stand-alone jamo of Korean
internet text into conjoining jamo, so ``"ㅋㅠㅠ"`` would come back as ``"큐ᅲ"``.

* ``kind="bpe"``: character-level BPE with SentencePiece-style ``▁`` word markers
  (the Metaspace pre-tokenizer), punctuation split off. Korean stays readable
  (``"영화 볼래?" -> ["▁영화", "▁볼래", "?"]``) and decoding is exact:
  ``decode(encode(s)) == normalize(s)`` whenever every character of ``s`` was seen in
  training (an unseen character becomes ``[UNK]``).
* ``kind="wordpiece"``: BERT-style WordPiece (split on whitespace and punctuation,
  ``##`` marks a word continuation). Decoding joins words with spaces and re-attaches
  ``. , ? !``; other punctuation may come back with spaces around it
  (``"(yes)" -> "( yes )"``), as with BERT.
"""
from __future__ import annotations

import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from lib.io import atomic_write
from lib.validate import check_choice, check_id_list, check_int

__all__ = [
    "SPECIAL_TOKENS", "SPECIAL_IDS", "train_tokenizer", "SubwordTokenizer", "WordVocab", "load_vocabulary",
    "simple_tokenize", "pad_batch", "pad_sequences", "collate_pairs", "unigram_nats",
]

SPECIAL_TOKENS: dict[str, str] = {
    "pad": "[PAD]", "unk": "[UNK]", "bos": "[BOS]", "eos": "[EOS]",
    "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]",
}
#: name -> id of every special token (``{"pad": 0, "unk": 1, ...}``), the same for every tokenizer.
SPECIAL_IDS: dict[str, int] = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
_SPECIAL_LIST = list(SPECIAL_TOKENS.values())
_KINDS = ("bpe", "wordpiece")
_FORMAT = "lib.text.SubwordTokenizer"
_WORD_FORMAT = "lib.text.WordVocab"


# ----------------------------------------------------------------------------- checks

def _check_text(name: str, text) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


class _SpecialIds:
    """The ``pad_id`` ... ``mask_id`` properties shared by both tokenizers."""

    pad_id = property(lambda self: SPECIAL_IDS["pad"], doc="id of [PAD] (0)")
    unk_id = property(lambda self: SPECIAL_IDS["unk"], doc="id of [UNK] (1)")
    bos_id = property(lambda self: SPECIAL_IDS["bos"], doc="id of [BOS] (2)")
    eos_id = property(lambda self: SPECIAL_IDS["eos"], doc="id of [EOS] (3)")
    cls_id = property(lambda self: SPECIAL_IDS["cls"], doc="id of [CLS] (4)")
    sep_id = property(lambda self: SPECIAL_IDS["sep"], doc="id of [SEP] (5)")
    mask_id = property(lambda self: SPECIAL_IDS["mask"], doc="id of [MASK] (6)")


# ----------------------------------------------------------------------------- subword

def _build_hf_tokenizer(kind: str, lowercase: bool):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    # NFC, not NFKC: NFKC maps Hangul compatibility jamo (ㅋ, ㅠ) to conjoining jamo
    steps = [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
        tok.decoder = decoders.Metaspace()
    else:
        tok = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk"]))
        # splits on whitespace and on every Unicode punctuation character
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
    tok.normalizer = normalizers.Sequence(steps)
    return tok


def train_tokenizer(texts: Iterable[str], kind: str = "bpe", vocab_size: int = 8000,
                    lowercase: bool = False, min_frequency: int = 2) -> "SubwordTokenizer":
    """Train a subword tokenizer on ``texts`` (an iterable of str; a list is best).

    ``kind``: ``"bpe"`` (character-level BPE, exact decoding) or ``"wordpiece"`` (BERT-style).
    BPE gives the same vocabulary and ids in every process. WordPiece does not: the
    ``tokenizers`` WordPiece trainer assigns ids (and breaks rare ties between pieces) in an
    order that changes from one process to the next, so everything trained on its ids changes
    between runs of the same code (measured on 8,000 NSMC reviews: about 40 % of the ids move,
    one piece in 4,000 differs). Use BPE where runs must repeat exactly.
    ``vocab_size``: the largest vocabulary, special tokens and single characters included
    (a small corpus may give fewer). ``min_frequency``: a merge must occur at least this
    often. The seven special tokens get ids 0..6 (:data:`SPECIAL_TOKENS`).
    """
    check_choice("kind", kind, _KINDS)
    check_int("vocab_size", vocab_size)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be larger than the {len(SPECIAL_TOKENS)} special tokens, "
                         f"got {vocab_size}")
    check_int("min_frequency", min_frequency, 1)
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of strings, got a single string; wrap it in a list")
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be an iterable of strings, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: a tokenizer needs some text to learn from")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
    if not any(t.strip() for t in texts):
        raise ValueError("texts contains only empty or blank strings")

    from tokenizers import trainers

    tok = _build_hf_tokenizer(kind, lowercase)
    common = dict(vocab_size=vocab_size, min_frequency=min_frequency,
                  special_tokens=_SPECIAL_LIST, show_progress=False)
    trainer = trainers.BpeTrainer(**common) if kind == "bpe" else trainers.WordPieceTrainer(**common)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return SubwordTokenizer(tok, kind=kind, lowercase=lowercase)



def _write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write ``payload`` as UTF-8 JSON, atomically; returns the path."""
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False)
    return path


def _read_json(path: str | os.PathLike, fmt: str, what: str, writer: str) -> dict:
    """Read a JSON file written by ``writer`` whose ``format`` is ``fmt``; clear errors otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} file at {path}")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a valid {what} file (bad JSON: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise ValueError(f"{path} was not written by {writer} (expected format {fmt!r})")
    return payload


class SubwordTokenizer(_SpecialIds):
    """A trained BPE or WordPiece tokenizer (wraps a ``tokenizers.Tokenizer``).

    Make one with :func:`train_tokenizer` or :meth:`load`. ``.hf`` is the underlying
    Hugging Face tokenizer for anything not wrapped here.
    """

    def __init__(self, hf_tokenizer, kind: str, lowercase: bool = False):
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}")
        for name, i in SPECIAL_IDS.items():
            got = hf_tokenizer.token_to_id(SPECIAL_TOKENS[name])
            if got != i:
                raise ValueError(f"special token {SPECIAL_TOKENS[name]} must have id {i}, "
                                 f"the tokenizer gives it {got}")
        self.hf = hf_tokenizer
        self.kind = kind
        self.lowercase = bool(lowercase)

    # ------------------------------------------------------------------ basics
    @property
    def vocab_size(self) -> int:
        """Number of ids (special tokens included)."""
        return self.hf.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"SubwordTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it (NFC, whitespace collapsed, maybe lower-cased)."""
        return self.hf.normalizer.normalize_str(_check_text("text", text))

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(_check_text("token", token))

    def id_to_token(self, i: int) -> str:
        (i,) = check_id_list("id", [i])
        self._check_range([i])
        return self.hf.id_to_token(i)

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_bos_eos: bool = False) -> list[int]:
        """Ids of ``text``; ``add_bos_eos=True`` wraps them in ``[BOS] ... [EOS]``."""
        ids = self.hf.encode(_check_text("text", text), add_special_tokens=False).ids
        return [self.bos_id, *ids, self.eos_id] if add_bos_eos else list(ids)

    def encode_batch(self, texts: Sequence[str], add_bos_eos: bool = False) -> list[list[int]]:
        """:meth:`encode` on every text (in parallel inside ``tokenizers``)."""
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
        texts = list(texts)
        for i, t in enumerate(texts):
            _check_text(f"texts[{i}]", t)
        encs = self.hf.encode_batch(texts, add_special_tokens=False)
        if add_bos_eos:
            return [[self.bos_id, *e.ids, self.eos_id] for e in encs]
        return [list(e.ids) for e in encs]

    def tokens(self, text: str) -> list[str]:
        """The subword strings of ``text`` (no special tokens)."""
        return list(self.hf.encode(_check_text("text", text), add_special_tokens=False).tokens)

    def _check_range(self, ids: list[int]) -> None:
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"ids must be in [0, {n}) (the vocabulary size), got {bad[:5]}")

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of ``ids`` (list / 1-D tensor). ``skip_special`` drops [PAD], [BOS], [EOS] etc.

        Ids after the first ``[EOS]`` are kept; cut them yourself if you generate past it.
        """
        ids = check_id_list("ids", ids)
        self._check_range(ids)
        if skip_special:
            ids = [i for i in ids if i >= len(SPECIAL_TOKENS)]
            return self.hf.decode(ids, skip_special_tokens=False)
        # keep specials visible as text: decode the pieces between them separately
        out, run = [], []
        for i in ids:
            if i < len(SPECIAL_TOKENS):
                if run:
                    out.append(self.hf.decode(run, skip_special_tokens=False))
                    run = []
                out.append(_SPECIAL_LIST[i])
            else:
                run.append(i)
        if run:
            out.append(self.hf.decode(run, skip_special_tokens=False))
        return " ".join(out)

    def decode_batch(self, batch, skip_special: bool = True) -> list[str]:
        if isinstance(batch, torch.Tensor):
            if batch.dim() != 2:
                raise ValueError(f"batch must be 2-D (B, T), got shape {tuple(batch.shape)}")
            batch = batch.tolist()
        return [self.decode(ids, skip_special=skip_special) for ids in batch]

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as one JSON file (atomically); returns the path."""
        return _write_json(path, {"format": _FORMAT, "version": 1, "kind": self.kind,
                                  "lowercase": self.lowercase, "tokenizer": json.loads(self.hf.to_str())})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SubwordTokenizer":
        """Read a tokenizer written by :meth:`save`."""
        from tokenizers import Tokenizer

        payload = _read_json(path, _FORMAT, "tokenizer", "SubwordTokenizer.save")
        hf = Tokenizer.from_str(json.dumps(payload["tokenizer"]))
        return cls(hf, kind=payload["kind"], lowercase=payload.get("lowercase", False))


# ----------------------------------------------------------------------------- word level

_WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def simple_tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Split ``text`` into words and punctuation marks (Unicode aware).

    A word is a run of letters, digits or ``_`` in any script (Hangul syllables are
    letters); every other non-space character is a token of its own::

        simple_tokenize("영화 볼래?")   -> ["영화", "볼래", "?"]
        simple_tokenize("Don't go!")   -> ["don", "'", "t", "go", "!"]
        simple_tokenize("ㅋㅋ 최고")     -> ["ㅋㅋ", "최고"]

    The text is NFC-normalized first (decomposed Hangul becomes syllables; stand-alone
    jamo such as ㅋ and ㅠ are kept as they are, which NFKC would not do).
    """
    text = unicodedata.normalize("NFC", _check_text("text", text))
    if lowercase:
        text = text.lower()
    return _WORD_RE.findall(text)


class WordVocab(_SpecialIds):
    """A word-level vocabulary: the seven special tokens (ids 0..6) then words, most frequent first.

    Build with :meth:`build`. Unknown words map to ``[UNK]``.
    """

    def __init__(self, itos: Sequence[str]):
        itos = list(itos)
        if itos[:len(_SPECIAL_LIST)] != _SPECIAL_LIST:
            raise ValueError(f"itos must start with the special tokens {_SPECIAL_LIST}, got {itos[:7]}")
        for i, t in enumerate(itos):
            if not isinstance(t, str):
                raise TypeError(f"itos[{i}] must be a str, got {type(t).__name__}")
        if len(set(itos)) != len(itos):
            dup = [t for t, c in Counter(itos).items() if c > 1]
            raise ValueError(f"itos has duplicate tokens: {dup[:5]}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(itos)}

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], max_size: int | None = None,
              min_freq: int = 1) -> "WordVocab":
        """Count the tokens of ``token_lists`` (e.g. ``[simple_tokenize(s) for s in texts]``).

        Keeps the words seen at least ``min_freq`` times, most frequent first, ties in
        alphabetical order (so the result does not depend on the order of the data).
        ``max_size`` caps ``len(vocab)`` *including* the 7 special tokens (None: no cap).
        """
        if isinstance(token_lists, (str, bytes)) or not isinstance(token_lists, Iterable):
            raise TypeError(f"token_lists must be an iterable of token lists, got {type(token_lists).__name__}")
        if max_size is not None:
            check_int("max_size", max_size, allow_none=True)
            if max_size < len(_SPECIAL_LIST):
                raise ValueError(f"max_size must be at least {len(_SPECIAL_LIST)} (the special tokens), "
                                 f"got {max_size}")
        check_int("min_freq", min_freq, 1)
        counts: Counter = Counter()
        for i, toks in enumerate(token_lists):
            if isinstance(toks, str):
                raise TypeError(f"token_lists[{i}] is a str; expected a list of tokens "
                                "(split it first, e.g. with simple_tokenize)")
            toks = list(toks)
            for t in toks:
                if not isinstance(t, str):
                    raise TypeError(f"token_lists[{i}] contains {t!r} ({type(t).__name__}), expected str")
            counts.update(toks)
        specials = set(_SPECIAL_LIST)
        words = sorted((w for w, c in counts.items() if c >= min_freq and w not in specials),
                       key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size - len(_SPECIAL_LIST)]
        vocab = cls(_SPECIAL_LIST + words)
        vocab.counts = {w: counts[w] for w in words}
        return vocab

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"WordVocab(size={len(self)})"

    def encode(self, tokens: Sequence[str], add_bos_eos: bool = False) -> list[int]:
        """Ids of a token list (unknown words -> ``unk_id``)."""
        if isinstance(tokens, str):
            raise TypeError("tokens must be a list of tokens, got a str; split it first "
                            "(e.g. simple_tokenize(text))")
        if not isinstance(tokens, Iterable):
            raise TypeError(f"tokens must be a list of str, got {type(tokens).__name__}")
        unk = self.unk_id
        ids = []
        for t in tokens:
            if not isinstance(t, str):
                raise TypeError(f"tokens must contain str, found {t!r} ({type(t).__name__})")
            ids.append(self.stoi.get(t, unk))
        return [self.bos_id, *ids, self.eos_id] if add_bos_eos else ids

    def decode(self, ids, skip_special: bool = True, join: bool = False) -> list[str] | str:
        """Tokens of ``ids``; ``skip_special`` drops [PAD], [BOS], [EOS], [CLS], [SEP], [MASK]
        (``[UNK]`` is kept: it stands for a real word). ``join=True`` returns one
        space-separated string."""
        ids = check_id_list("ids", ids)
        n = len(self.itos)
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"ids must be in [0, {n}) (the vocabulary size), got {bad[:5]}")
        unk = self.unk_id
        toks = [self.itos[i] for i in ids
                if not (skip_special and i < len(_SPECIAL_LIST) and i != unk)]
        return " ".join(toks) if join else toks

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary as JSON (atomically); returns the path."""
        return _write_json(path, {"format": _WORD_FORMAT, "version": 1, "itos": self.itos})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordVocab":
        return cls(_read_json(path, _WORD_FORMAT, "vocabulary", "WordVocab.save")["itos"])


def load_vocabulary(path: str | os.PathLike) -> "SubwordTokenizer | WordVocab":
    """A file written by :meth:`SubwordTokenizer.save` or :meth:`WordVocab.save`, whichever it is."""
    path = Path(path)
    try:
        fmt = json.loads(path.read_text(encoding="utf-8")).get("format") if path.is_file() else None
    except (json.JSONDecodeError, AttributeError):
        fmt = None
    return (WordVocab if fmt == _WORD_FORMAT else SubwordTokenizer).load(path)


# ----------------------------------------------------------------------------- a baseline

def unigram_nats(train_ids, test_ids, vocab_size: int, never: Iterable[int] = ()) -> float:
    """Mean cross-entropy (nats per token) of ``test_ids`` under the add-one smoothed frequencies of
    ``train_ids`` over a vocabulary of ``vocab_size`` ids: the baseline a language model must beat
    (its ``exp`` is the unigram perplexity). Ids in ``never`` (e.g. ``[UNK]``, which a model is not
    asked to predict) get no probability and are left out of the test tokens."""
    check_int("vocab_size", vocab_size, 1)
    train = check_id_list("train_ids", train_ids)
    test = check_id_list("test_ids", test_ids)
    never = set(check_id_list("never", list(never)))
    for name, ids in (("train_ids", train), ("test_ids", test), ("never", never)):
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"{name} holds ids outside [0, {vocab_size}): {sorted(set(bad))[:5]}")
    if len(never) >= vocab_size:
        raise ValueError(f"never leaves no id of the vocabulary of {vocab_size} to predict")
    test = [i for i in test if i not in never]
    if not test:
        raise ValueError("test_ids has no token outside never: there is nothing to score")
    counts = torch.bincount(torch.tensor(train, dtype=torch.long), minlength=vocab_size).double() + 1
    counts[list(never)] = 0
    log_p = (counts / counts.sum()).log()
    return -log_p[torch.tensor(test)].mean().item()


# ----------------------------------------------------------------------------- padding

def _as_id_lists(name: str, seqs) -> list[list[int]]:
    if isinstance(seqs, torch.Tensor):
        if seqs.dim() != 2:
            raise ValueError(f"{name} must be a list of 1-D sequences or a 2-D tensor, "
                             f"got a tensor of shape {tuple(seqs.shape)}")
        return seqs.tolist()
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Iterable):
        raise TypeError(f"{name} must be a list of id sequences, got {type(seqs).__name__}")
    return [check_id_list(f"{name}[{i}]", s) for i, s in enumerate(seqs)]


def pad_batch(seqs, pad_id: int = 0, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id sequences into a ``(B, T)`` LongTensor; also return their lengths ``(B,)``.

    ``T`` is the longest sequence, or ``max_len`` at most: longer sequences keep their
    first ``max_len`` ids. ``lengths`` are the lengths after truncation, so
    ``lib.attention.padding_mask(lengths, T)`` is the padding mask.
    """
    seqs = _as_id_lists("seqs", seqs)
    if not seqs:
        raise ValueError("seqs is empty: cannot make a batch of zero sequences")
    check_int("pad_id", pad_id, 0)
    if max_len is not None:
        check_int("max_len", max_len, 1)
        seqs = [s[:max_len] for s in seqs]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    T = int(lengths.max())
    out = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out, lengths


def pad_sequences(seqs, max_len: int | None = None, pad_id: int = 0, truncating: str = "pre",
                  padding: str = "post") -> torch.Tensor:
    """Keras-style padding to a fixed length: returns a ``(B, max_len)`` LongTensor.

    * ``max_len``: the output length (None: the longest sequence).
    * ``truncating="pre"`` drops ids from the *start* of longer sequences (keeps the
      last ``max_len``, Keras' default); ``"post"`` drops them from the end.
    * ``padding="post"`` puts ``pad_id`` after the ids; ``"pre"`` before them
      (Keras' default is ``"pre"``; the course pads after, as masks expect).

    ``pad_sequences([[1, 2, 3], [4]], max_len=2)`` -> ``[[2, 3], [4, 0]]``.
    """
    for name, v in (("truncating", truncating), ("padding", padding)):
        if v not in ("pre", "post"):
            raise ValueError(f"{name} must be 'pre' or 'post', got {v!r}")
    seqs = _as_id_lists("seqs", seqs)
    if not seqs:
        raise ValueError("seqs is empty: cannot pad zero sequences")
    check_int("pad_id", pad_id, 0)
    if max_len is None:
        max_len = max(len(s) for s in seqs)
    else:
        check_int("max_len", max_len, 1)
    out = torch.full((len(seqs), max_len), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s) > max_len:
            s = s[-max_len:] if truncating == "pre" else s[:max_len]
        if not s:
            continue
        t = torch.tensor(s, dtype=torch.long)
        if padding == "post":
            out[i, :len(s)] = t
        else:
            out[i, max_len - len(s):] = t
    return out


def collate_pairs(pad_id: int = 0, bos_id: int = SPECIAL_IDS["bos"], eos_id: int = SPECIAL_IDS["eos"],
                  max_src_len: int | None = None, max_tgt_len: int | None = None):
    """A ``collate_fn`` for a DataLoader over ``(src_ids, tgt_ids)`` pairs (seq2seq, chatbots).

    Each batch is a tuple ``(src, src_lengths, tgt_in, tgt_out)``:

    * ``src``  ``(B, S)`` LongTensor, right-padded with ``pad_id``; ``src_lengths`` ``(B,)``.
    * ``tgt_in``  ``(B, T)``: ``[bos] + tgt``, the decoder input (teacher forcing).
    * ``tgt_out`` ``(B, T)``: ``tgt + [eos]``, what the decoder must predict at each position.

    ``tgt_in[:, t]`` is followed by ``tgt_out[:, t]``; both are padded with ``pad_id`` to the
    same ``T`` (longest target + 1), so ``tgt_out != pad_id`` masks the loss. ``src`` is
    used as given (add bos/eos yourself if your encoder wants them). ``max_src_len`` keeps
    the first ids of longer sources; ``max_tgt_len`` keeps the first ``max_tgt_len - 1``
    target ids, so ``T <= max_tgt_len``. The default bos/eos ids are those of every
    tokenizer in :mod:`lib.text`.
    """
    for name, v in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
        check_int(name, v, 0)
    if max_src_len is not None:
        check_int("max_src_len", max_src_len, 1)
    if max_tgt_len is not None:
        check_int("max_tgt_len", max_tgt_len, 2)

    def collate(batch):
        if not isinstance(batch, Sequence) or not batch:
            raise ValueError("collate_pairs: the batch must be a non-empty list of (src_ids, tgt_ids) pairs")
        srcs, tgts = [], []
        for i, pair in enumerate(batch):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"collate_pairs: batch[{i}] must be a (src_ids, tgt_ids) pair, got {pair!r:.80}")
            srcs.append(check_id_list(f"batch[{i}][0] (src)", pair[0]))
            tgt = check_id_list(f"batch[{i}][1] (tgt)", pair[1])
            if max_tgt_len is not None:
                tgt = tgt[:max_tgt_len - 1]
            tgts.append(tgt)
        src, src_lengths = pad_batch(srcs, pad_id, max_src_len)
        tgt_in, _ = pad_batch([[bos_id, *t] for t in tgts], pad_id)
        tgt_out, _ = pad_batch([[*t, eos_id] for t in tgts], pad_id)
        return src, src_lengths, tgt_in, tgt_out

    return collate
