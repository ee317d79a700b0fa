import pytest
import torch

from lib.data import random_windows


def test_windows_are_consecutive_ids_from_seeded_starts():
    ids = torch.arange(100, 200)
    w = random_windows(ids, 9, 50, seed=1)
    assert w.shape == (50, 9) and w.dtype == ids.dtype
    starts = w[:, 0] - 100
    assert torch.equal(w, 100 + starts[:, None] + torch.arange(9))          # consecutive
    assert int(starts.min()) >= 0 and int(starts.max()) <= 100 - 9 - 1     # inside the stream
    assert len(set(starts.tolist())) > 30                                   # spread over it
    assert torch.equal(w, random_windows(ids, 9, 50, seed=1))               # the same seed, the same windows
    assert not torch.equal(w, random_windows(ids, 9, 50, seed=2))


def test_windows_match_the_loop_chapters_wrote():
    # the chapters drew starts with torch.randint(0, len - length, (count,)) from a seeded generator
    ids = torch.randint(0, 65, (1000,), generator=torch.Generator().manual_seed(0))
    starts = torch.randint(0, 1000 - 33, (7,), generator=torch.Generator().manual_seed(4))
    expected = torch.stack([ids[s:s + 33] for s in starts.tolist()])
    assert torch.equal(random_windows(ids, 33, 7, seed=4), expected)


@pytest.mark.parametrize("ids, length, count, exc, match", [
    (torch.arange(10).float(), 3, 2, TypeError, "ids must be an integer tensor"),
    (torch.zeros(2, 5, dtype=torch.long), 3, 2, ValueError, "1-D stream"),
    (torch.arange(5), 5, 2, ValueError, "ids holds 5 tokens: too few for a window of 5"),
    (torch.arange(5), 0, 2, ValueError, "length must be >= 1"),
    (torch.arange(5), 2, -1, ValueError, "count must be >= 0"),
])
def test_windows_reject_bad_arguments(ids, length, count, exc, match):
    with pytest.raises(exc, match=match):
        random_windows(ids, length, count, seed=0)
