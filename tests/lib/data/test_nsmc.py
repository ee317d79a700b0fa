"""Tests of lib.data.nsmc: the course's balanced sentiment split of the raw NSMC crawl."""
from __future__ import annotations

import zlib

import pytest

from lib.data import nsmc


def fake_rows(n=400):
    """Reviews with every rating, ids 0..n-1, some empty."""
    return [{"review_id": i, "movie_id": 1, "rating": 1 + i % 10, "date": "15.01.01",
             "review": "" if i % 37 == 0 else f"리뷰 {i}"} for i in range(n)]


def test_rating_rule():
    assert [nsmc.sentiment_label(r) for r in range(1, 11)] == [0, 0, 0, 0, None, None, None, None, 1, 1]
    for bad in (0, 11, 4.0, True, "9"):
        with pytest.raises(ValueError, match="rating"):
            nsmc.sentiment_label(bad)


def test_split_is_balanced_labelled_by_rule_and_skips_empty_reviews():
    split = nsmc.sentiment_split(fake_rows())
    for rows in (split.train, split.test):
        labels = [r["label"] for r in rows]
        assert labels.count(0) == labels.count(1) > 0
        assert labels[:4] == [0, 1, 0, 1]                      # alternating
        for r in rows:
            assert r["label"] == (1 if r["rating"] >= 9 else 0) and r["rating"] not in (5, 6, 7, 8)
            assert r["text"].strip()


def test_train_and_test_are_disjoint_and_chosen_by_review_id():
    split = nsmc.sentiment_split(fake_rows())
    train_ids, test_ids = {r["review_id"] for r in split.train}, {r["review_id"] for r in split.test}
    assert not train_ids & test_ids
    assert all(zlib.crc32(str(i).encode()) % 5 == 0 for i in test_ids)
    assert not any(zlib.crc32(str(i).encode()) % 5 == 0 for i in train_ids)
    # a review stays on its side whatever else is in the data
    smaller = nsmc.sentiment_split(fake_rows()[::2])
    assert {r["review_id"] for r in smaller.test} <= {r["review_id"] for r in fake_rows() if nsmc.is_test(r["review_id"])}


def test_deterministic_and_independent_of_row_order():
    a = nsmc.sentiment_split(fake_rows(), train_per_class=20, test_per_class=5)
    b = nsmc.sentiment_split(list(reversed(fake_rows())), train_per_class=20, test_per_class=5)
    assert a.train == b.train and a.test == b.test
    assert len(a.train) == 40 and len(a.test) == 10


def test_clear_errors():
    with pytest.raises(ValueError, match="train_per_class=10000 but the train split has only"):
        nsmc.sentiment_split(fake_rows(), train_per_class=10_000)
    with pytest.raises(ValueError, match="test_per_class"):
        nsmc.sentiment_split(fake_rows(), test_per_class=0)
    with pytest.raises(ValueError, match="row 0 must be a mapping"):
        nsmc.sentiment_split([{"id": 1}])
    with pytest.raises(ValueError, match="appears twice"):
        nsmc.sentiment_split(fake_rows(3) + fake_rows(3))
    with pytest.raises(ValueError, match="test_every"):
        nsmc.is_test(3, test_every=1)
    with pytest.raises(ValueError, match="review_id"):
        nsmc.is_test(-1)


def test_real_split(data_mirror):
    split = nsmc.sentiment_split(train_per_class=1000, test_per_class=500)
    assert len(split.train) == 2000 and len(split.test) == 1000
    assert not {r["review_id"] for r in split.train} & {r["review_id"] for r in split.test}
    full = nsmc.sentiment_split()
    # SOURCE.md: 121,684 negative reviews (ratings 1-4); some are empty and dropped
    negatives = len(full.train) // 2 + len(full.test) // 2
    assert 0.18 * 121_684 < len(full.test) // 2 < 0.22 * 121_684
    assert 121_000 < negatives <= 121_684
