"""lib.data.reviews: chapter 2's review data and classifier helpers."""
import numpy as np
import pytest
import torch

from lib import text
from lib.data import reviews


def test_the_validation_split_is_a_fixed_share_apart_from_the_rest():
    keep, held = reviews.validation_split(1000, 0.1)
    assert len(held) == 100 and len(keep) == 900 and not set(keep) & set(held)
    assert (keep, held) == reviews.validation_split(1000, 0.1)              # the same draw every time
    assert keep == sorted(keep) and held == sorted(held)
    assert reviews.validation_split(1000, 0.0) == (list(range(1000)), [])
    with pytest.raises(ValueError, match="share must be in"):
        reviews.validation_split(10, 0.5)


def test_a_review_keeps_its_last_tokens_and_its_length_before_truncation():
    vocab = text.WordVocab.build([["a", "b", "c", "d"]])
    ids, lengths = reviews.encode(vocab, ["a b c d", "d"], max_len=2)
    assert ids == [vocab.encode(["c", "d"]), vocab.encode(["d"])] and lengths.tolist() == [4, 1]
    with pytest.raises(ValueError, match="1 review.* no token at all"):
        reviews.encode(vocab, ["", "a"], max_len=2)


def test_evaluation_reads_sorted_batches_and_scores_every_review_in_its_place():
    data = [([1] * n, n % 2) for n in (5, 1, 3, 8, 2)]
    batches = reviews.eval_batches(data, batch_size=2)
    assert batches == [[1, 4], [2, 0], [3]]

    class Echo(torch.nn.Module):          # logit = +1 for odd lengths, -1 for even: right on every review
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x, lengths):
            return (lengths % 2).float() * 2 - 1 + self.w, None

    correct, losses = reviews.predictions(Echo(), data)
    assert correct.all() and np.allclose(losses, np.log1p(np.exp(-1.0)))
    flipped = [(ids, 1 - y) for ids, y in data]
    assert not reviews.predictions(Echo(), flipped)[0].any()
    collated = [reviews.collate([data[i] for i in idx]) for idx in batches]
    assert reviews.mean_loss(Echo(), collated) == pytest.approx(float(np.log1p(np.exp(-1.0))))
