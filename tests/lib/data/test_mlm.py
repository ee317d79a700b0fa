"""lib.data.mlm: the 80/10/10 masked-LM corruption and the next-sentence pairs, on large samples."""
import random

import pytest
import torch

from lib.data.mlm import (IGNORE_INDEX, choose_positions, collate_masked_pairs, mask_tokens, nsp_examples, pack_pair,
                          truncate_pair)

CLS, SEP, MASK, PAD, V = 2, 3, 4, 0, 500


def _batch(seed=0, B=400, T=64):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, V, (B, T), generator=g)
    lengths = torch.randint(8, T + 1, (B,), generator=g)
    ids[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
    ids[:, 0] = CLS
    ids[torch.arange(B), lengths - 1] = SEP
    ids[:, 5] = SEP                                         # a second [SEP] in every row
    return ids, lengths


def test_fractions_80_10_10_and_15_percent():
    ids, lengths = _batch()
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(CLS, SEP), pad_id=PAD,
                                 generator=torch.Generator().manual_seed(1))
    chosen = labels != IGNORE_INDEX
    n_cand = (lengths - 3).double()                         # minus [CLS] and two [SEP]
    per_row = chosen.sum(1).double()
    assert torch.equal(per_row, torch.clamp(torch.round(n_cand * 0.15), min=1))   # exactly round(15 %)
    assert torch.equal(labels[chosen], ids[chosen])          # labels are the original tokens
    n = int(chosen.sum())
    masked = float((inputs[chosen] == MASK).sum()) / n
    kept = float((inputs[chosen] == ids[chosen]).sum()) / n
    randomised = 1 - masked - kept
    # ~ 3,600 chosen tokens: 3 standard errors of 0.8 are about 0.02, of 0.1 about 0.015
    assert abs(masked - 0.8) < 0.025 and abs(kept - 0.1) < 0.02 and abs(randomised - 0.1) < 0.02, \
        (masked, kept, randomised)
    assert torch.equal(inputs[~chosen], ids[~chosen])        # nothing else changes


def test_special_tokens_and_padding_are_never_chosen():
    ids, _ = _batch(seed=2)
    _, labels = mask_tokens(ids, MASK, V, special_ids=(CLS, SEP), pad_id=PAD, mask_prob=0.9,
                            generator=torch.Generator().manual_seed(3))
    chosen = labels != IGNORE_INDEX
    assert not chosen[(ids == CLS) | (ids == SEP) | (ids == PAD)].any()
    assert chosen.sum() > 0.8 * ((ids != CLS) & (ids != SEP) & (ids != PAD)).sum()


def test_choice_is_uniform_over_positions():
    cand = torch.ones(20000, 10, dtype=torch.bool)
    chosen = choose_positions(cand, 0.2, generator=torch.Generator().manual_seed(0))
    assert torch.all(chosen.sum(1) == 2)
    freq = chosen.double().mean(0)
    assert torch.all((freq - 0.2).abs() < 0.015), freq


def test_given_chosen_positions_and_bad_arguments():
    ids = torch.full((1, 6), 50)
    chosen = torch.tensor([[False, True, True, False, False, False]])
    _, labels = mask_tokens(ids, MASK, V, chosen=chosen)
    assert torch.equal(labels != IGNORE_INDEX, chosen)
    with pytest.raises(ValueError, match="replace_prob \\+ random_prob"):
        mask_tokens(ids, MASK, V, replace_prob=0.8, random_prob=0.3)
    with pytest.raises(ValueError, match="mask_prob"):
        mask_tokens(ids, MASK, V, mask_prob=1.5)
    with pytest.raises(TypeError, match="dtype"):
        mask_tokens(ids.float(), MASK, V)


def test_pack_pair_and_truncation_from_both_ends():
    tokens, seg = pack_pair([10, 11], [12], CLS, SEP)
    assert tokens == [CLS, 10, 11, SEP, 12, SEP] and seg == [0, 0, 0, 0, 1, 1]
    rng = random.Random(0)
    front_cuts = []
    for _ in range(400):
        a, b = list(range(100, 120)), list(range(7))
        truncate_pair(a, b, 24, rng)
        assert len(a) + len(b) == 24 and b == list(range(7))        # only the longer one is cut
        assert a == list(range(a[0], a[-1] + 1))                     # a contiguous piece remains
        front_cuts.append(a[0] - 100)                                # of the 3 tokens cut
    mean = sum(front_cuts) / len(front_cuts)
    assert abs(mean - 1.5) < 0.15, mean                              # each cut: front or back, 1/2 each
    assert {0, 3} <= set(front_cuts)                                 # all at the back, all at the front


def _documents(n_docs=300, seed=0):
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        docs.append([[10_000 * (d + 1) + 100 * s + k for k in range(rng.randint(3, 12))] for s in range(rng.randint(2, 12))])
    return docs


def test_nsp_pairs_are_half_next_and_b_really_follows_a():
    docs = _documents()
    examples = nsp_examples(docs, 48, CLS, SEP, rng=random.Random(1))
    owner = {t: d for d, doc in enumerate(docs) for s in doc for t in s}
    random_next = 0
    for ex in examples:
        assert len(ex.tokens) <= 48 and ex.tokens[0] == CLS and ex.tokens[-1] == SEP
        first_sep = ex.tokens.index(SEP)
        a, b = ex.tokens[1:first_sep], ex.tokens[first_sep + 1:-1]
        assert ex.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        same_doc = owner[a[-1]] == owner[b[0]]
        assert same_doc != ex.is_random_next
        if not ex.is_random_next:
            assert b[0] > a[-1]                                     # B comes after A in the document
        random_next += ex.is_random_next
    share = random_next / len(examples)
    # 50 % by the coin, plus the chunks of a single sentence, which must take a random B
    assert 0.45 < share < 0.65, share


def test_nsp_lengths_full_mostly_and_sometimes_short():
    docs = _documents(600, seed=2)
    examples = nsp_examples(docs, 40, CLS, SEP, short_seq_prob=0.1, rng=random.Random(3))
    full = sum(len(e.tokens) >= 36 for e in examples) / len(examples)
    never_short = nsp_examples(docs, 40, CLS, SEP, short_seq_prob=0.0, rng=random.Random(3))
    full0 = sum(len(e.tokens) >= 36 for e in never_short) / len(never_short)
    assert full0 > full + 0.04, (full0, full)          # short targets make some sequences shorter
    assert all(len(e.tokens) <= 40 for e in examples)
    with pytest.raises(ValueError, match="two non-empty documents"):
        nsp_examples(docs[:1], 40, CLS, SEP)


def test_sentences_left_over_by_a_random_b_are_used_again():
    docs = _documents(200, seed=4)
    examples = nsp_examples(docs, 48, CLS, SEP, nsp_prob=1.0, rng=random.Random(5))
    in_a = {t for e in examples for t in e.tokens[1:e.tokens.index(SEP)]}
    sentences = [s for d in docs for s in d]
    used = sum(any(t in in_a for t in s) for s in sentences) / len(sentences)
    assert used > 0.9, used        # the original puts them back; dropping them loses about half


def test_collate_pads_masks_and_labels_a_batch():
    from lib.data.mlm import PairExample, collate_pretraining
    examples = [PairExample([CLS, 10, 11, 12, SEP, 13, SEP], [0, 0, 0, 0, 0, 1, 1], False),
                PairExample([CLS, 14, SEP, 15, SEP], [0, 0, 0, 1, 1], True)] * 200
    batch = collate_pretraining(examples, MASK, V, PAD, (CLS, SEP), generator=torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape == (400, 7)
    assert batch["attention_mask"][1].tolist() == [True] * 5 + [False] * 2
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1, 0, 0]
    assert batch["nsp_labels"][:2].tolist() == [0, 1]
    chosen = batch["mlm_labels"] != IGNORE_INDEX
    assert not chosen[~batch["attention_mask"]].any()
    assert chosen.sum(1).min() == 1                          # round(15 % of 2 or 4) -> at least one
    assert torch.equal(batch["input_ids"][~chosen], torch.stack([torch.tensor(
        e.tokens + [PAD] * (7 - len(e.tokens))) for e in examples])[~chosen])


def test_movie_documents_leave_out_test_reviews_and_keep_time_order():
    from lib.data.nsmc import is_test
    from lib.data.nsmc_corpus import movie_documents
    rows = [{"review_id": i, "movie_id": i % 3, "rating": 5, "review": f"리뷰 {i}"} for i in range(300)]
    rows.append({"review_id": 1000, "movie_id": 7, "rating": 5, "review": "   "})
    docs = movie_documents(rows)
    texts = [t for d in docs for t in d]
    assert len(docs) == 3
    assert all(not is_test(int(t.split()[1])) for t in texts)
    assert len(texts) == sum(not is_test(i) for i in range(300))
    for d in docs:
        ids = [int(t.split()[1]) for t in d]
        assert ids == sorted(ids) and len({i % 3 for i in ids}) == 1
    assert len(movie_documents(rows, max_reviews=10)) == 1
    with pytest.raises(ValueError, match="load_nsmc_raw"):
        movie_documents([{"review": "x"}])


def test_collate_masked_pairs_pads_types_with_zero_and_never_masks_padding():
    tokens = [[4, 10, 11, 5, 12, 5], [4, 13, 5, 14, 5]]
    types = [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    out = collate_masked_pairs(tokens, types, [0, 1], mask_id=6, vocab_size=30, pad_id=0, special_ids=(4, 5),
                               generator=torch.Generator().manual_seed(0), mask_prob=1.0)
    assert out["attention_mask"].tolist() == [[True] * 6, [True] * 5 + [False]]
    assert out["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 0]]
    assert out["input_ids"][1, 5] == 0 and out["mlm_labels"][1, 5] == IGNORE_INDEX     # padding stays padding
    chosen = out["mlm_labels"] != IGNORE_INDEX
    assert chosen.tolist() == [[False, True, True, False, True, False], [False, True, False, True, False, False]]
    assert out["nsp_labels"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="has 3 ids but 2 segment/role ids"):
        collate_masked_pairs([[4, 10, 5]], [[0, 0]], [0], mask_id=6, vocab_size=30, pad_id=0, special_ids=(4, 5))
    with pytest.raises(ValueError, match="one of each"):
        collate_masked_pairs([[4, 10, 5]], [[0, 0, 0]], [0, 1], mask_id=6, vocab_size=30, pad_id=0, special_ids=(4, 5))
