"""The course's own balanced sentiment split of the raw NSMC crawl (``nsmc_raw``).

**This is not the published NSMC split.** The canonical ``ratings_train.txt`` /
``ratings_test.txt`` (150k / 50k) could not be obtained; ``nsmc_raw`` is the raw crawl
they were sampled from (see ``shared/data/nsmc_raw/SOURCE.md``). Numbers measured on this
split cannot be compared with published NSMC results.

The rules, all deterministic (no random generator, the same on every machine):

* **label** (NSMC's rule, from its README): rating 1-4 is negative (0), 9-10 is positive (1);
  ratings 5-8 get no label and are left out. Reviews that are empty after stripping spaces
  are left out too.
* **train / test by review id**: a review is in the test split when the CRC-32 of its
  decimal ``review_id`` is divisible by ``test_every`` (default 5, about 20 %). A review is
  therefore always on the same side, whatever else is selected.
* **balance**: in each split, both classes get the same number of reviews: the requested
  ``per_class`` (or, by default, as many as the smaller class has). Within a class the
  reviews are taken in the order of a second checksum (CRC-32 of ``"order:<review_id>"``),
  which mixes movies and years; the returned list alternates negative and positive.

::

    from lib.data import nsmc
    split = nsmc.sentiment_split(train_per_class=2000, test_per_class=1000)
    split.train[0]    # {"review_id", "text", "label", "rating"}

Explained in chapters/06_transfer_elmo.ipynb; chapter 02 (Bahdanau attention) trains its
Korean classifiers on it.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, Mapping

__all__ = ["NEGATIVE_RATINGS", "POSITIVE_RATINGS", "TEST_EVERY", "SentimentSplit", "sentiment_label",
           "is_test", "order_key", "sentiment_split"]

NEGATIVE_RATINGS = (1, 2, 3, 4)
POSITIVE_RATINGS = (9, 10)
TEST_EVERY = 5


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def sentiment_label(rating: int) -> int | None:
    """NSMC's rule: 0 for ratings 1-4, 1 for 9-10, ``None`` for 5-8 (no label)."""
    if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 10:
        raise ValueError(f"rating must be an int from 1 to 10, got {rating!r}")
    if rating in NEGATIVE_RATINGS:
        return 0
    if rating in POSITIVE_RATINGS:
        return 1
    return None


def is_test(review_id: int, test_every: int = TEST_EVERY) -> bool:
    """True when the review belongs to the test split (CRC-32 of its id divisible by ``test_every``)."""
    _check_int("review_id", review_id, 0)
    _check_int("test_every", test_every, 2)
    return zlib.crc32(str(review_id).encode("ascii")) % test_every == 0


def order_key(review_id: int) -> int:
    """The order in which reviews of one class are taken: a checksum, not the id (which follows time)."""
    return zlib.crc32(f"order:{review_id}".encode("ascii"))


@dataclass
class SentimentSplit:
    """Balanced train and test reviews: lists of ``{"review_id", "text", "label", "rating"}``."""

    train: list[dict]
    test: list[dict]
    test_every: int

    def __repr__(self) -> str:
        return f"SentimentSplit(train={len(self.train)}, test={len(self.test)}, test_every={self.test_every})"


def _balanced(by_class: list[list[dict]], per_class: int | None, split: str) -> list[dict]:
    available = min(len(rows) for rows in by_class)
    if per_class is None:
        per_class = available
    elif per_class > available:
        raise ValueError(f"{split}_per_class={per_class} but the {split} split has only {available} reviews "
                         f"in its smaller class (negative {len(by_class[0])}, positive {len(by_class[1])})")
    chosen = [sorted(rows, key=lambda r: order_key(r["review_id"]))[:per_class] for rows in by_class]
    return [row for pair in zip(*chosen) for row in pair]        # negative, positive, negative, ...


def sentiment_split(rows: Iterable[Mapping] | None = None, *, train_per_class: int | None = None,
                    test_per_class: int | None = None, test_every: int = TEST_EVERY) -> SentimentSplit:
    """The balanced, deterministic sentiment split described in the module docstring.

    ``rows`` are ``load_nsmc_raw()`` rows (read from the data mirror when omitted);
    ``train_per_class`` / ``test_per_class`` are reviews per class (default: all that the
    smaller class allows). Raises ``ValueError`` when a count exceeds what is available or a
    row lacks ``review_id``, ``rating`` or ``review``.
    """
    if train_per_class is not None:
        _check_int("train_per_class", train_per_class, 1)
    if test_per_class is not None:
        _check_int("test_per_class", test_per_class, 1)
    _check_int("test_every", test_every, 2)
    if rows is None:
        from .loaders import load_nsmc_raw

        rows = load_nsmc_raw()
    pools = {"train": [[], []], "test": [[], []]}
    seen = set()
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not {"review_id", "rating", "review"} <= set(row):
            raise ValueError(f"row {i} must be a mapping with review_id, rating and review "
                             f"(a load_nsmc_raw() row), got {row!r}")
        review_id = row["review_id"]
        if review_id in seen:
            raise ValueError(f"row {i}: review_id {review_id} appears twice")
        seen.add(review_id)
        label = sentiment_label(row["rating"])
        review = row["review"]
        if not isinstance(review, str):
            raise ValueError(f"row {i}: review must be a str, got {type(review).__name__}")
        if label is None or not review.strip():
            continue
        split = "test" if is_test(review_id, test_every) else "train"
        pools[split][label].append({"review_id": review_id, "text": review, "label": label,
                                    "rating": row["rating"]})
    return SentimentSplit(train=_balanced(pools["train"], train_per_class, "train"),
                          test=_balanced(pools["test"], test_per_class, "test"), test_every=test_every)
