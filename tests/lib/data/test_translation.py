"""lib.translation: the fixed split, the length buckets and corpus BLEU of chapters 1 and 3."""
import zlib

import pytest
import sacrebleu

from lib import transfer
from lib import translation as tr


def _rows(n=400):
    rows = []
    for i in range(n):
        en = " ".join(f"w{j}" for j in range(1 + i % 20)) + f" s{i // 2}."
        rows.append({"en": en, "other": f"traduction {i}"})
    # several translations of the same English sentence
    for k in range(5):
        rows.append({"en": rows[k]["en"], "other": f"autre traduction {k}"})
    return rows


def test_is_held_out_uses_the_checksum_of_the_sentence():
    sentences = [f"sentence number {i}" for i in range(2000)]
    held = [s for s in sentences if tr.is_held_out(s)]
    assert held == [s for s in sentences if zlib.crc32(s.encode()) % 10 == 0]
    assert 150 < len(held) < 250                                   # about one in ten
    assert sum(tr.is_held_out(s, every=4) for s in sentences) > 400


@pytest.mark.parametrize("bad, exc", [(1, ValueError), (0, ValueError), (-3, ValueError), (2.0, TypeError),
                                      (True, TypeError)])
def test_is_held_out_rejects_bad_every(bad, exc):
    with pytest.raises(exc, match="every"):
        tr.is_held_out("x", every=bad)


def test_is_held_out_rejects_non_strings():
    with pytest.raises(TypeError, match="str"):
        tr.is_held_out(["a", "list"])


def test_split_keeps_every_translation_of_a_held_out_sentence_and_none_in_training():
    rows = _rows()
    split = tr.split_pairs(rows, every=3)
    held = {r["en"] for r in rows if tr.is_held_out(r["en"], 3)}
    assert set(split.references) == held and held
    for en, refs in split.references.items():
        assert refs == [r["other"] for r in rows if r["en"] == en]      # all of them, in corpus order
    train_sources = {" ".join(s) for s, _ in split.train_pairs}
    assert not train_sources & {" ".join(tr.simple_tokenize(e)) for e in held}
    assert len(split.train_pairs) == sum(not tr.is_held_out(r["en"], 3) for r in rows)


def test_split_tokenises_and_filters_long_pairs():
    rows = _rows()
    split = tr.split_pairs(rows, max_tokens=8, every=3)
    assert split.train_pairs
    assert all(len(s) <= 8 and len(t) <= 8 for s, t in split.train_pairs)
    assert all(isinstance(s, list) and all(isinstance(w, str) for w in s) for s, _ in split.train_pairs)
    # the held-out side is not filtered: long sentences are what chapter 1 is about
    assert max(len(tr.simple_tokenize(e)) for e in split.references) > 8


def test_split_subset_is_a_seeded_random_sample():
    rows = _rows()
    whole = tr.split_pairs(rows, every=3).train_pairs
    a = tr.split_pairs(rows, every=3, max_train_pairs=50, seed=0).train_pairs
    b = tr.split_pairs(rows, every=3, max_train_pairs=50, seed=0).train_pairs
    c = tr.split_pairs(rows, every=3, max_train_pairs=50, seed=1).train_pairs
    assert a == b and len(a) == 50 and a != c
    assert all(p in whole for p in a)
    assert a != whole[:50]                                         # a random sample, not the first rows
    assert len(tr.split_pairs(rows, every=3, max_train_pairs=10_000).train_pairs) == len(whole)


@pytest.mark.parametrize("rows, match", [
    ([{"en": "a"}], "keys 'en' and 'other'"),
    (["a\tb"], "mapping"),
])
def test_split_rejects_malformed_rows(rows, match):
    with pytest.raises(ValueError, match=match):
        tr.split_pairs(rows)


@pytest.mark.parametrize("kwargs, exc", [(dict(max_tokens=0), ValueError), (dict(max_train_pairs=-1), ValueError),
                                         (dict(max_tokens=2.5), TypeError)])
def test_split_rejects_bad_limits(kwargs, exc):
    with pytest.raises(exc, match=next(iter(kwargs))):
        tr.split_pairs(_rows(), **kwargs)


def test_bucket_names():
    assert tr.bucket_name(6, 8) == "6-8"
    assert tr.bucket_name(15, None) == "15+"


def test_length_buckets_assign_by_token_count_at_the_boundaries():
    refs = {" ".join(["w"] * n) + f" {n}": [f"ref {n}"] for n in range(0, 30)}   # n + 1 tokens
    sets = tr.length_buckets(refs)
    assert list(sets) == ["1-5", "6-8", "9-11", "12-14", "15+"]
    lengths = {name: sorted(len(tr.simple_tokenize(s)) for s, _ in items) for name, items in sets.items()}
    assert lengths["1-5"] == [1, 2, 3, 4, 5]
    assert lengths["6-8"] == [6, 7, 8]
    assert lengths["12-14"] == [12, 13, 14]
    assert lengths["15+"] == list(range(15, 31))
    for items in sets.values():
        assert [s for s, _ in items] == sorted(s for s, _ in items)
        assert all(r == refs[s] for s, r in items)


def test_length_buckets_keep_empty_buckets_and_drop_sentences_outside_all_buckets():
    refs = {"a b": ["x"], "a b c d e f g": ["y"]}
    sets = tr.length_buckets(refs, buckets=[(1, 3), (4, 5)])
    assert sets == {"1-3": [("a b", ["x"])], "4-5": []}


def test_length_buckets_sample_is_fixed_and_sorted():
    refs = {f"sentence {i:03d}": [f"ref {i}"] for i in range(200)}   # all 2 tokens
    a = tr.length_buckets(refs, per_bucket=20)["1-5"]
    b = tr.length_buckets(refs, per_bucket=20)["1-5"]
    c = tr.length_buckets(refs, per_bucket=20, seed=7)["1-5"]
    assert a == b and len(a) == 20 and a != c
    assert [s for s, _ in a] == sorted(s for s, _ in a)
    assert [s for s, _ in a] != [f"sentence {i:03d}" for i in range(20)]


@pytest.mark.parametrize("buckets", [[], [(5, 3)], [(1, 5), (5, 8)], [(1, None), (3, 4)], ["15+"]])
def test_length_buckets_reject_bad_buckets(buckets):
    with pytest.raises(ValueError, match="bucket"):
        tr.length_buckets({"a": ["b"]}, buckets=buckets)


def test_length_buckets_reject_sentences_without_references():
    with pytest.raises(ValueError, match="no reference"):
        tr.length_buckets({"a b": []})


def test_corpus_bleu_is_100_for_a_perfect_match_against_any_reference():
    refs = [["le chat est sur le tapis .", "un chat dort sur le tapis ."],
            ["il fait très beau aujourd'hui , n'est-ce pas ?"]]
    hyps = [tr.simple_tokenize(refs[0][1]), tr.simple_tokenize(refs[1][0])]
    assert tr.corpus_bleu(hyps, refs) == pytest.approx(100.0)


def test_corpus_bleu_equals_sacrebleu_on_the_same_tokenisation():
    refs = [["le chat est sur le tapis .", "un chat est sur le tapis ."],
            ["il fait très beau aujourd'hui ."],
            ["je ne sais pas pourquoi il est parti si tôt .", "je ignore pourquoi il est parti tôt ."]]
    hyps = [["le", "chat", "dort", "sur", "le", "tapis", "."], ["il", "fait", "beau", "."],
            ["je", "ne", "sais", "pas", "pourquoi", "il", "part", "."]]
    expected = sacrebleu.corpus_bleu(
        [" ".join(h) for h in hyps],
        [[" ".join(tr.simple_tokenize(r[0])) for r in refs],
         [" ".join(tr.simple_tokenize(r[1])) if len(r) > 1 else None for r in refs]],
        tokenize="none", force=True).score
    score = tr.corpus_bleu(hyps, refs)
    assert 0 < score < 100
    assert score == pytest.approx(expected)
    # the second reference counts: without it the score drops
    assert tr.corpus_bleu(hyps, [r[:1] for r in refs]) < score


@pytest.mark.parametrize("hyps, refs, error, match", [
    ([["a"]], [["a"], ["b"]], ValueError, "1 hypotheses but 2"),
    ([], [], ValueError, "at least one"),
    (["a b"], [["a b"]], TypeError, "list of tokens"),
    ([["a"]], [[]], ValueError, "non-empty"),
    ([["a"]], ["a"], ValueError, "non-empty list"),
])
def test_corpus_bleu_rejects_bad_input(hyps, refs, error, match):
    with pytest.raises(error, match=match):
        tr.corpus_bleu(hyps, refs)


# ----------------------------------------------------------------------------- BLEU's uncertainty

def test_bleu_from_the_sentences_statistics_is_corpus_bleu():
    hyps = [["le", "chat", "est", "noir"], ["il", "pleut"], ["bonjour"], ["je", "suis", "là", "."]]
    refs = [["le chat est noir", "le chat noir"], ["il pleut ."], ["bonjour !"], ["je suis ici ."]]
    stats = tr.bleu_statistics(hyps, refs)
    assert stats.shape == (4, 10)
    assert tr.bleu_from_statistics(stats) == pytest.approx(tr.corpus_bleu(hyps, refs), abs=1e-9)
    # a subset of the sentences is the subset's corpus BLEU, not a mean of sentence scores
    assert tr.bleu_from_statistics(stats[[0, 3]]) == pytest.approx(
        tr.corpus_bleu([hyps[0], hyps[3]], [refs[0], refs[3]]), abs=1e-9)
    with pytest.raises(ValueError, match=r"\(N, 10\)"):
        tr.bleu_from_statistics(stats[:, :4])


def test_paired_bleu_is_the_difference_with_a_bootstrap_standard_error():
    good = [["le", "chat", "est", "noir"], ["il", "pleut"], ["bonjour"], ["je", "suis", "ici", "."]] * 30
    bad = [["le", "chien", "est", "noir"], ["il", "neige"], ["bonjour"], ["je", "suis", "là", "."]] * 30
    refs = [["le chat est noir"], ["il pleut"], ["bonjour"], ["je suis ici ."]] * 30
    d = tr.paired_bleu(good, bad, refs, samples=200, seed=0)
    assert d["a"] == pytest.approx(tr.corpus_bleu(good, refs)) and d["mean"] == pytest.approx(d["a"] - d["b"])
    assert d["n"] == 120 and 0 < d["se"] < d["mean"] / 4
    assert tr.paired_bleu(good, bad, refs, samples=200, seed=0) == d            # the seed decides
    same = tr.paired_bleu(good, good, refs, samples=50)
    assert same["mean"] == 0 and same["se"] == 0                                         # paired: no noise
    # the noise shrinks with more sentences (the same sentences four times over)
    assert tr.paired_bleu(good * 4, bad * 4, refs * 4, samples=200)["se"] < d["se"]
    with pytest.raises(ValueError, match="the same sentences"):
        tr.paired_bleu(good, bad[:-1], refs)


def test_paired_bleu_over_seeds_adds_the_seeds_spread_to_the_sentences_noise():
    good = [["le", "chat", "est", "noir"], ["il", "pleut"], ["bonjour"], ["je", "suis", "ici", "."]] * 30
    bad = [["le", "chien", "est", "noir"], ["il", "neige"], ["bonjour"], ["je", "suis", "là", "."]] * 30
    worse = [["le", "chien", "est", "blanc"], ["il", "neige"], ["salut"], ["je", "suis", "là", "."]] * 30
    refs = [["le chat est noir"], ["il pleut"], ["bonjour"], ["je suis ici ."]] * 30
    # three seeds of a against three of b: the mean of the seeds' BLEUs and differences
    d = tr.paired_bleu_seeds([good, good, bad], [bad, worse, worse], refs, samples=200)
    bleu = {k: tr.corpus_bleu(h, refs) for k, h in (("good", good), ("bad", bad), ("worse", worse))}
    assert d["a"] == pytest.approx((2 * bleu["good"] + bleu["bad"]) / 3)
    assert d["by_seed"] == pytest.approx([bleu["good"] - bleu["bad"], bleu["good"] - bleu["worse"],
                                          bleu["bad"] - bleu["worse"]])
    assert d["mean"] == pytest.approx(sum(d["by_seed"]) / 3) and (d["n"], d["items"]) == (3, 120)
    # the seeds' spread is part of the noise: larger than the sentences' bootstrap alone
    seeds_se = transfer.mean_se(d["by_seed"])[1]
    assert seeds_se < d["se"] < seeds_se + 5 and d["df"] >= 2
    assert "3 seeds x 120 items" in transfer.item_sentence(d, "A", "B", "BLEU", unit="bleu")
    # one seed: the paired bootstrap of paired_bleu, with the same resamples
    one = tr.paired_bleu_seeds([good], [bad], refs, samples=200, seed=0)
    assert one["se"] == pytest.approx(tr.paired_bleu(good, bad, refs, samples=200, seed=0)["se"])
    with pytest.raises(ValueError, match="the same seeds"):
        tr.paired_bleu_seeds([good, good], [bad], refs)
    with pytest.raises(ValueError, match="the same sentences"):
        tr.paired_bleu_seeds([good], [bad[:-1]], refs)
