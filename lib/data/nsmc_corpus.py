"""Korean pre-training text from the raw NSMC crawl: each movie's reviews as one "document".

BERT's pre-training data are documents made of sentences (BooksCorpus and Wikipedia); next-
sentence prediction asks whether segment B is the text that follows segment A in the same
document. Movie reviews are mostly one sentence long, so here a *document* is the sequence of
reviews of one movie in the order they were written (by ``review_id``) and a *sentence* is one
review: IsNext pairs are consecutive reviews of the same movie, NotNext pairs take B from
another movie. The labels still come from the raw text alone (self-supervised).

The reviews of the sentiment test split (:func:`lib.data.nsmc.is_test`) are left out, so the
pre-trained model has never read a review it is later tested on. :func:`pretraining_reviews`, the
text of the course checkpoint ``ko-bert``, also leaves out every review whose text is the text of
a test-side review (short ones such as "최고" recur thousands of times).

Explained in chapters/08_bert.ipynb.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

from lib.data.nsmc import TEST_EVERY, is_test
from lib.validate import check_int

__all__ = ["movie_documents", "pretraining_reviews"]


def movie_documents(rows: Iterable[Mapping], max_reviews: int | None = None, min_reviews: int = 2,
                    test_every: int = TEST_EVERY) -> list[list[str]]:
    """``load_nsmc_raw()`` rows -> documents (one per movie, in the order of the movies' first
    review), each the list of its reviews' texts in ``review_id`` order, without the sentiment
    test split's reviews, empty reviews, and movies with fewer than ``min_reviews`` reviews.
    ``max_reviews`` stops once that many reviews have been collected (whole movies)."""
    check_int("max_reviews", max_reviews, 1, allow_none=True)
    check_int("min_reviews", min_reviews, 1)
    by_movie: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not {"review_id", "movie_id", "review"} <= set(row):
            raise ValueError(f"row {i} must be a load_nsmc_raw() row with review_id, movie_id and review, got {row!r}")
        text = " ".join(str(row["review"]).split())
        if text and not is_test(row["review_id"], test_every):
            by_movie[row["movie_id"]].append((row["review_id"], text))
    docs, total = [], 0
    for movie in sorted(by_movie, key=lambda m: min(r for r, _ in by_movie[m])):
        reviews = [t for _, t in sorted(by_movie[movie])]
        if len(reviews) < min_reviews:
            continue
        docs.append(reviews)
        total += len(reviews)
        if max_reviews is not None and total >= max_reviews:
            break
    return docs


def pretraining_reviews(rows: Iterable[Mapping], test_every: int = TEST_EVERY) -> tuple[list[str], dict[str, int]]:
    """Every review a model may read before it is tested on the sentiment split, and counts of what
    was left out: the reviews of :func:`movie_documents` (all movies, ``min_reviews=1``), without
    those whose text (whitespace collapsed) equals the text of a test-side review (any rating)."""
    rows = list(rows)
    test_side = [r for r in rows if is_test(r["review_id"], test_every)]
    test_texts = {" ".join(str(r["review"]).split()) for r in test_side}
    reviews = [t for d in movie_documents(rows, min_reviews=1, test_every=test_every) for t in d]
    kept = [t for t in reviews if t not in test_texts]
    return kept, {"rows": len(rows), "test_side_reviews": len(test_side),
                  "same_text_as_a_test_review": len(reviews) - len(kept), "reviews": len(kept)}
