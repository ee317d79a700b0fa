"""Plain-Python loaders: each dataset as a list of dicts (or a string), quirks handled.

Every loader finds its file with :func:`lib.data.path` (mirror, cache, download; checksum
checked), parses it once per process, and hands out fresh dicts on every call, so a caller
that edits its rows cannot change what the next caller gets.
"""
from __future__ import annotations

import csv
import functools
import gzip
import io
import itertools
from pathlib import Path

from .files import DataError, path
from lib.validate import check_int

__all__ = ["load_chatbot", "load_imdb", "load_tatoeba", "load_tinyshakespeare", "load_nsmc_raw",
           "IMDB_SPLITS", "TATOEBA_PAIRS", "load_imdb_unsup"]

IMDB_SPLITS = ("train", "test")
TATOEBA_PAIRS = ("kor_eng", "fra_eng")


def _open_text(file: Path):
    """Open a UTF-8 text file, gunzipping ``.gz`` files; ``newline=""`` as csv wants."""
    if file.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(file, "rb"), encoding="utf-8", newline="")
    return open(file, encoding="utf-8", newline="")


def _check_header(file: Path, header: list[str], expected: list[str]) -> None:
    if header != expected:
        raise DataError(f"{file}: header is {header}, expected {expected}")


# ---------------------------------------------------------------- Korean chatbot Q&A
@functools.lru_cache(maxsize=None)
def _chatbot_rows(file: Path) -> tuple[tuple[str, str, int], ...]:
    with _open_text(file) as f:
        reader = csv.reader(f)  # the file has CRLF line ends: csv handles them
        _check_header(file, next(reader), ["Q", "A", "label"])
        # One label is "2   " (trailing spaces): strip before int().
        return tuple((q, a, int(label.strip())) for q, a, label in reader)


def load_chatbot() -> list[dict]:
    """The 11,823 Korean chatbot Q&A pairs: ``{"q", "a", "label"}``.

    label: 0 = everyday talk, 1 = breakup (negative), 2 = love (positive).
    """
    return [{"q": q, "a": a, "label": label}
            for q, a, label in _chatbot_rows(path("chatbot_data", "ChatbotData.csv"))]


# ---------------------------------------------------------------- IMDB reviews
@functools.lru_cache(maxsize=None)
def _imdb_rows(file: Path) -> tuple[tuple[str, int, int], ...]:
    with _open_text(file) as f:
        reader = csv.reader(f)
        _check_header(file, next(reader), ["file", "id", "rating", "label", "text"])
        # The reviews keep IMDb's HTML line breaks "<br />": turn each into a space.
        return tuple((text.replace("<br />", " "), int(label), int(rating))
                     for _, _, rating, label, text in reader)


def load_imdb(split: str) -> list[dict]:
    """IMDB reviews of ``split`` ("train" or "test"), 25,000 each: ``{"text", "label", "rating"}``.

    label: 0 = negative (rating 1-4), 1 = positive (rating 7-10). Rows are sorted negative
    then positive: shuffle before training.
    """
    if split not in IMDB_SPLITS:
        raise ValueError(f"split must be one of {IMDB_SPLITS}, got {split!r}")
    file = path("imdb", f"imdb_{split}.csv.gz")
    return [{"text": text, "label": label, "rating": rating}
            for text, label, rating in _imdb_rows(file)]


def load_imdb_unsup(exclude_test: bool = True) -> list[str]:
    """IMDB's 50,000 unlabelled reviews (``imdb_unsup``), in id order, ``<br />`` made a space: text
    for language-model pre-training only, never for evaluation.

    Some of them are, word for word, reviews of the labelled test split; ``exclude_test=True`` (the
    default) leaves those out, so that a model pre-trained on this text has never read a test review."""
    file = path("imdb_unsup", "imdb_unsup.csv.gz")
    with _open_text(file) as f:
        reader = csv.reader(f)
        _check_header(file, next(reader), ["file", "id", "text"])
        texts = [text.replace("<br />", " ") for _, _, text in reader]
    if exclude_test:
        test = {r["text"] for r in load_imdb("test")}
        texts = [t for t in texts if t not in test]
    return texts


# ---------------------------------------------------------------- Tatoeba pairs
def _about_attribution(file: Path) -> str:
    """The "Attribution: ..." line of a ManyThings.org ``_about.txt``."""
    for line in file.read_text(encoding="utf-8").splitlines():
        if line.startswith("Attribution:"):
            return line.strip()
    raise DataError(f"{file} has no 'Attribution:' line")


@functools.lru_cache(maxsize=None)
def _tatoeba_rows(file: Path, about: Path) -> tuple[tuple[str, str, str], ...]:
    shared = _about_attribution(about)
    rows = []
    with _open_text(file) as f:
        for number, line in enumerate(f, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) == 2:  # the 2017 French release: attribution in _about.txt
                fields.append(shared)
            if len(fields) != 3:
                raise DataError(f"{file}, line {number}: expected 2 or 3 tab-separated fields, "
                                f"got {len(fields)}")
            rows.append(tuple(fields))
    return tuple(rows)


def load_tatoeba(pair: str) -> list[dict]:
    """Tatoeba sentence pairs ``{"en", "other", "attribution"}`` for ``pair`` "kor_eng" or "fra_eng".

    kor_eng (5,749 pairs) carries a per-sentence attribution (Tatoeba ids and contributors);
    fra_eng (142,787 pairs) gets the release's attribution line from ``_about.txt``. The
    license (CC-BY 2.0 FR) requires keeping the attribution when redistributing.
    """
    if pair not in TATOEBA_PAIRS:
        raise ValueError(f"pair must be one of {TATOEBA_PAIRS}, got {pair!r}")
    name = f"tatoeba_{pair}"
    text_file = "kor.txt" if pair == "kor_eng" else "fra.txt.gz"
    rows = _tatoeba_rows(path(name, text_file), path(name, "_about.txt"))
    return [{"en": en, "other": other, "attribution": attribution}
            for en, other, attribution in rows]


# ---------------------------------------------------------------- Tiny Shakespeare
@functools.lru_cache(maxsize=None)
def _read_text(file: Path) -> str:
    return file.read_text(encoding="utf-8")


def load_tinyshakespeare() -> str:
    """Tiny Shakespeare as one string of 1,115,394 characters."""
    return _read_text(path("tinyshakespeare", "input.txt"))


# ---------------------------------------------------------------- NSMC raw crawl
def load_nsmc_raw(limit: int | None = None) -> list[dict]:
    """The raw NSMC crawl: ``{"review_id", "movie_id", "rating", "date", "review"}``.

    712,404 reviews sorted by ``review_id`` (ratings 1-10, ``date`` as "YY.MM.DD"; 217
    reviews contain newlines and 21 are empty). ``limit`` reads only the first ``limit``
    rows. The full list takes a few seconds and a few hundred MB, so it is not cached:
    keep your own reference. NSMC's rule: negative = rating 1-4, positive = 9-10.
    """
    check_int("limit", limit, 0, allow_none=True)
    file = path("nsmc_raw", "nsmc_raw_reviews.csv.gz")
    with _open_text(file) as f:
        reader = csv.reader(f)
        _check_header(file, next(reader), ["review_id", "movie_id", "rating", "date", "review"])
        return [{"review_id": int(review_id), "movie_id": int(movie_id), "rating": int(rating),
                 "date": date, "review": review}
                for review_id, movie_id, rating, date, review in itertools.islice(reader, limit)]
