"""lib.data.noising: BART's five corruptions, checked as properties on large samples."""
import math
from collections import Counter
from itertools import permutations

import numpy as np
import pytest

from lib.data import noising

MASK = 1


def _poisson_pmf(k, lam):
    return math.exp(-lam) * lam ** k / math.factorial(k)


def test_span_lengths_are_poisson_3_and_cover_exactly_the_ratio():
    rng = np.random.default_rng(0)
    lengths = Counter()
    for _ in range(3000):
        n = int(rng.integers(20, 200))
        spans = noising.sample_spans(n, rng, mask_ratio=0.3, poisson_lambda=3.0)
        assert sum(length for _, length in spans) == round(0.3 * n)
        starts = [s for s, _ in spans]
        assert starts == sorted(starts)
        for (s0, l0), (s1, _) in zip(spans, spans[1:]):
            assert s0 + l0 <= s1                     # no overlap
        assert spans[-1][0] + spans[-1][1] <= n
        lengths.update(length for _, length in spans[:-1])   # the last one is cut to the exact total
    total = sum(lengths.values())
    assert total > 30000
    for k in range(9):
        assert abs(lengths[k] / total - _poisson_pmf(k, 3.0)) < 0.01, k
    assert lengths[0] > 0                            # zero-length spans exist: they insert a mask
    mean = sum(k * c for k, c in lengths.items()) / total
    # a little below 3: the span that crosses the target (left out) is more often a long one
    assert abs(mean - 3.0) < 0.15


def test_every_position_is_masked_about_as_often():
    rng = np.random.default_rng(1)
    masked = np.zeros(100)
    for _ in range(4000):
        for start, length in noising.sample_spans(100, rng, mask_ratio=0.3):
            masked[start:start + length] += 1
    by_tenth = (masked / 4000).reshape(10, 10).mean(1)
    assert abs(by_tenth.mean() - 0.3) < 1e-9
    inner = by_tenth[1:-1]        # the first and last tenth are a little less often inside a span
    assert inner.max() - inner.min() < 0.03 and by_tenth.min() > 0.2


def test_text_infilling_one_mask_per_span():
    rng = np.random.default_rng(2)
    ids = list(range(10, 110))
    for _ in range(500):
        state = rng.bit_generator.state
        spans = noising.sample_spans(len(ids), rng)
        rng.bit_generator.state = state
        out = noising.text_infilling(ids, MASK, rng)
        assert out.count(MASK) == len(spans)
        assert len(out) == len(ids) - sum(l for _, l in spans) + len(spans)
        kept = [t for t in out if t != MASK]
        masked = {p for s, l in spans for p in range(s, s + l)}
        assert kept == [t for i, t in enumerate(ids) if i not in masked]


def test_zero_length_span_inserts_a_mask():
    rng = np.random.default_rng(3)
    seen_insertion = False
    for _ in range(300):
        state = rng.bit_generator.state
        spans = noising.sample_spans(30, rng)
        rng.bit_generator.state = state
        out = noising.text_infilling(list(range(10, 40)), MASK, rng)
        if any(l == 0 for _, l in spans) and len(out) > 30 - 9 + len(spans) - 1:
            seen_insertion = True
    assert seen_insertion


def test_token_masking_fraction_and_length():
    rng = np.random.default_rng(4)
    ids = list(range(10, 10010))
    out = noising.token_masking(ids, MASK, rng, p=0.15)
    assert len(out) == len(ids)
    assert abs(out.count(MASK) / len(ids) - 0.15) < 0.01
    assert all(o == MASK or o == i for o, i in zip(out, ids))


def test_token_deletion_fraction_and_order():
    rng = np.random.default_rng(5)
    ids = list(range(10, 10010))
    out = noising.token_deletion(ids, rng, p=0.15)
    assert abs(1 - len(out) / len(ids) - 0.15) < 0.01
    assert out == sorted(out) and set(out) <= set(ids)


def test_sentence_permutation_keeps_the_multiset_and_is_uniform():
    rng = np.random.default_rng(6)
    doc = [[10, 11], [12], [13, 14, 15]]
    counts = Counter()
    for _ in range(6000):
        out = noising.sentence_permutation(doc, rng)
        assert sorted(map(tuple, out)) == sorted(map(tuple, doc))
        counts[tuple(map(tuple, out))] += 1
    assert set(counts) == {tuple(map(tuple, p)) for p in permutations(doc)}
    assert all(abs(c / 6000 - 1 / 6) < 0.02 for c in counts.values())


def test_document_rotation_is_a_rotation_with_a_uniform_start():
    rng = np.random.default_rng(7)
    ids = list(range(10, 20))
    starts = Counter()
    for _ in range(5000):
        out, start = noising.document_rotation(ids, rng)
        assert out == ids[start:] + ids[:start]
        starts[start] += 1
    assert set(starts) == set(range(10))
    assert all(abs(c / 5000 - 0.1) < 0.02 for c in starts.values())


def test_bad_input_is_rejected():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="rng"):
        noising.token_masking([1, 2], MASK, rng=0)
    with pytest.raises(ValueError, match="mask_ratio"):
        noising.sample_spans(10, rng, mask_ratio=1.5)
    with pytest.raises(TypeError, match="ids"):
        noising.text_infilling("abc", MASK, rng)
    with pytest.raises(ValueError, match="poisson_lambda"):
        noising.sample_spans(10, rng, poisson_lambda=0)
    assert noising.sample_spans(3, rng, mask_ratio=0.1) == []


def test_denoising_pair_permutes_then_infills():
    rng = np.random.default_rng(8)
    doc = [[10, 11, 12, 13], [20, 21, 22], [30, 31, 32, 33, 34]]
    for _ in range(200):
        corrupted, original = noising.denoising_pair(doc, MASK, rng)
        assert original == [t for s in doc for t in s]
        assert sum(t != MASK for t in corrupted) == 12 - round(0.3 * 12)
    orders = {tuple(noising.denoising_pair(doc, MASK, rng, mask_ratio=0.0)[0]) for _ in range(100)}
    assert len(orders) == 6


def test_chatbot_split_keeps_repeated_questions_on_one_side():
    from lib.data.chatbot import heldout_split, split_punctuation
    assert split_punctuation("영화 볼래?") == "영화 볼래 ?"
    rows = [{"q": f"질문 {i % 40}?", "a": f"답 {i}"} for i in range(200)]
    split = heldout_split(rows, fraction=0.25, seed=0)
    assert sorted(split.train + split.heldout) == list(range(200))
    held_q = {split.questions[i] for i in split.heldout}
    assert len(held_q) == 10 and not held_q & {split.questions[i] for i in split.train}
    assert heldout_split(rows, 0.25, seed=1).heldout != split.heldout
    with pytest.raises(ValueError, match="rows\\[0\\]"):
        heldout_split([{"q": "x"}])


def test_an_echo_is_half_of_the_question_or_more_coming_back_in_one_piece():
    from lib.data.chatbot import echo_share, echoes
    assert echoes("카페갈래?", "카페갈래도 괜찮아요 .") and echo_share("카페갈래?", "카페갈래도 괜찮아요 .") == 1.0
    assert echo_share("영화 볼래?", "볼래도 괜찮아요 .") == pytest.approx(2 / 4)    # 영화볼래: 볼래 comes back
    assert echoes("영화 볼래?", "볼래도 괜찮아요 .")
    assert not echoes("배고파", "뭐 좀 챙겨 드세요 .") and echo_share("배고파", "뭐 좀 챙겨 드세요 .") == 0.0
    # one piece: the question's characters scattered over the reply are not an echo
    assert echo_share("가나다라", "가 다 나 라") == pytest.approx(1 / 4)
    assert echo_share("1지망 학교 떨어졌어", "학교를 좋아하면 돼요") == pytest.approx(2 / 9)
    assert echo_share("?!", "네") == 0.0 and echo_share("안녕", "") == 0.0
    assert echoes("안녕", "안", threshold=0.5) and not echoes("안녕", "안", threshold=0.6)
    with pytest.raises(TypeError, match="str"):
        echo_share(None, "네")
    with pytest.raises(ValueError, match="threshold"):
        echoes("a", "a", threshold=2)
