"""lib.transfer (the transfer-result format, its statistics and verdicts) and the pure parts of
lib.finetune (draws, splits, head+tail cuts, validation-based choices)."""
import math

import pytest

from lib import finetune, transfer


def rows_of(init, labels, values, task="imdb", metric="accuracy"):
    return [{"task": task, "model": "m", "init": init, "labels": labels, "seed": s, "metric": metric, "value": v}
            for s, v in enumerate(values)]


def test_check_rows_rejects_bad_rows():
    good = rows_of("pretrained", 64, [0.7])
    assert transfer.check_rows(good)[0]["value"] == 0.7
    with pytest.raises(ValueError, match="missing"):
        transfer.check_rows([{k: v for k, v in good[0].items() if k != "seed"}])
    with pytest.raises(ValueError, match="labels"):
        transfer.check_rows([{**good[0], "labels": 6.4}])
    with pytest.raises(ValueError, match="finite"):
        transfer.check_rows([{**good[0], "value": float("nan")}])
    with pytest.raises(ValueError, match="repeats"):
        transfer.check_rows(good + good)


def test_paired_difference_uses_the_seed_pairs():
    # arm a = arm b + 0.10 exactly on every seed, while the seeds themselves vary a lot:
    # paired, the difference has no spread; unpaired it would have a large one
    b = [0.50, 0.70, 0.60]
    rows = rows_of("pretrained", 64, [v + 0.10 for v in b]) + rows_of("random", 64, b)
    d = transfer.paired_difference(rows, "pretrained", "random", 64)
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.10) and d["se"] == pytest.approx(0.0, abs=1e-12)
    rows = rows_of("pretrained", 64, [0.8, 0.7, 0.9]) + rows_of("random", 64, [0.6, 0.6, 0.6])
    d = transfer.paired_difference(rows, "pretrained", "random", 64)
    diffs = [0.2, 0.1, 0.3]
    sd = math.sqrt(sum((x - 0.2) ** 2 for x in diffs) / 2)
    assert d["mean"] == pytest.approx(0.2) and d["se"] == pytest.approx(sd / math.sqrt(3))
    with pytest.raises(ValueError, match="no seed"):
        transfer.paired_difference(rows, "pretrained", "tfidf", 64)


def test_summary_means_and_standard_errors():
    table = transfer.summary(rows_of("random", 16, [0.5, 0.6]) + rows_of("random", 32, [0.7]))
    line = table[table.labels == 16].iloc[0]
    assert line["mean"] == pytest.approx(0.55) and line["se"] == pytest.approx(0.05) and line["n"] == 2
    assert math.isnan(table[table.labels == 32].iloc[0]["se"])


def test_verdict_says_clear_gap_noise_and_chance():
    rows = rows_of("pretrained", 64, [0.75, 0.76, 0.74]) + rows_of("random", 64, [0.50, 0.52, 0.49])
    text = transfer.verdict(rows, "pretrained", "random", 64, names={"pretrained": "MiniLM", "random": "scratch"})
    assert "clearly ahead" in text and "+24.7" in text and "scratch 0.503" in text and "near chance" in text
    assert "MiniLM 0.750 ± 0.006 against" in text
    noisy = rows_of("pretrained", 64, [0.70, 0.60, 0.80]) + rows_of("random", 64, [0.68, 0.66, 0.70])
    assert "not distinguishable" in transfer.verdict(noisy, "pretrained", "random", 64)
    one = rows_of("pretrained", 64, [0.7]) + rows_of("random", 64, [0.6])
    assert "single draw" in transfer.verdict(one, "pretrained", "random", 64)
    # one draw, 400 test items: se = sqrt(.7*.3/400 + .6*.4/400) = 0.0335, the 10-point gap is 3 of them
    text = transfer.verdict(one, "pretrained", "random", 64, test_items=400)
    assert "± 3.4 points (one draw" in text and "95 % interval +3.3 to +16.7 points): pretrained is clearly ahead" in text
    assert "not distinguishable" in transfer.verdict(one, "pretrained", "random", 64, test_items=40)


def test_three_draws_need_student_s_t_not_two_standard_errors():
    # differences 0.02, 0.03, 0.04: mean 0.03, se 0.00577, 5.2 standard errors (clear at t = 4.30);
    # differences 0.01, 0.03, 0.05: se 0.0115, 2.6 standard errors: clear under a 2-se rule, not at t
    assert transfer.critical_value(3) == pytest.approx(4.303, abs=1e-3)
    assert transfer.critical_value(None) == 2.0 and transfer.critical_value(1000) == 2.0
    clear = rows_of("pretrained", 64, [0.72, 0.73, 0.74]) + rows_of("random", 64, [0.70, 0.70, 0.70])
    assert "clearly ahead" in transfer.verdict(clear, "pretrained", "random", 64)
    wide = rows_of("pretrained", 64, [0.71, 0.73, 0.75]) + rows_of("random", 64, [0.70, 0.70, 0.70])
    text = transfer.verdict(wide, "pretrained", "random", 64)
    assert "+3.0 ± 1.2 points (paired over 3 draws; 95 % interval -2.0 to +8.0 points)" in text
    assert "not distinguishable" in text
    assert "not distinguishable" in transfer.item_verdict([0.71, 0.73, 0.75], [0.70] * 3, "a", "b", "x", over="seeds")
    with pytest.raises(ValueError, match="at least 2"):
        transfer.critical_value(1)


def test_labels_to_match_interpolates_in_log_labels():
    rows = rows_of("random", 16, [0.5]) + rows_of("random", 64, [0.6]) + rows_of("random", 256, [0.8])
    assert transfer.labels_to_match(rows, 0.7, "random") == pytest.approx(128.0)
    assert transfer.labels_to_match(rows, 0.9, "random") is None
    rows += rows_of("pretrained", 64, [0.7])
    assert "about 128 labels, 2 times" in transfer.curve_reading(rows, at=64)
    tfidf = rows_of("tfidf", 64, [0.75]) + rows_of("tfidf", 256, [0.85])
    assert transfer.curve_reading(rows + tfidf, other="tfidf", at=64) == (
        "pretrained with 64 labels (0.700) is matched by tfidf already at the smallest size measured, 64 labels "
        "(0.750): no saving of labels against tfidf here.")


def test_balanced_sample_is_balanced_nested_and_checked():
    rows = [{"text": f"r{i}", "label": i % 2} for i in range(100)]
    small, large = finetune.balanced_sample(rows, 8, seed=3), finetune.balanced_sample(rows, 20, seed=3)
    assert sum(r["label"] for r in small) == 4 and large[:8] == small
    assert finetune.balanced_sample(rows, 8, seed=4) != small
    with pytest.raises(ValueError, match="evenly"):
        finetune.balanced_sample(rows, 7, seed=0)
    with pytest.raises(ValueError, match="fewer"):
        finetune.balanced_sample(rows, 102, seed=0)
    val, rest = finetune.split_validation(rows, 10, seed=0)
    assert len(val) == 10 and len(rest) == 90 and not {id(r) for r in val} & {id(r) for r in rest}


def test_head_tail_keeps_both_ends():
    ids = list(range(100))
    cut = finetune.head_tail(ids, max_len=12, head=3, cls_id=-1, sep_id=-2)
    assert cut == [-1, 0, 1, 2, 93, 94, 95, 96, 97, 98, 99, -2]
    assert finetune.head_tail([5, 6], 12, 3, -1, -2) == [-1, 5, 6, -2]


def test_select_by_validation_picks_on_validation_not_test():
    runs = [{"init": "random", "labels": 16, "seed": s, "lr": lr, "val_accuracy": v, "test_accuracy": t}
            for s in (0, 1) for lr, v, t in ((1e-4, 0.60, 0.90), (1e-3, 0.70, 0.55))]
    rows, chosen = finetune.select_by_validation(runs, "imdb", "m")
    assert chosen["random"]["16"]["lr"] == 1e-3                       # best on validation
    assert [r["value"] for r in rows] == [0.55, 0.55]                 # its test accuracy, not the best test
    with pytest.raises(ValueError, match="different seeds"):
        finetune.select_by_validation(runs[:-1], "imdb", "m")


def test_curve_trials_cover_the_grid_largest_first():
    trials = finetune.curve_trials([16, 64], [0, 1], {"pretrained": [1e-4], "random": [1e-4, 1e-3]})
    assert len(trials) == 2 * 2 * 3 and trials[0]["labels"] == 64 and trials[-1]["labels"] == 16


# ----------------------------------------------------------------------------- runs recorded before the row format
def test_draws_on_one_test_set_add_its_noise_and_equal_draws_are_not_a_clear_gap():
    # chapter 13's case: three draws that all give +1.4 points on the same 5,000 reviews. Their spread is 0,
    # but the test sample's noise is not: se = sqrt(.814*.186/5000 + .8*.2/5000) = 0.0079 and the
    # 1.4-point gap is 1.8 of them, under Student's t for 3 draws (4.30): not a clear gap.
    same = rows_of("pretrained", 300, [0.814, 0.814, 0.814]) + rows_of("random", 300, [0.800, 0.800, 0.800])
    text = transfer.verdict(same, "pretrained", "random", 300, test_items=5000)
    assert "+1.4 ± 0.8 points (paired over 3 draws and the noise of 5,000 test items" in text, text
    assert "not distinguishable" in text
    bare = transfer.verdict(same, "pretrained", "random", 300)
    assert "too little to judge" in bare and "clearly" not in bare, bare
    # adding the test sample's noise never makes a gap clearer than the draws alone say it is
    wide = rows_of("pretrained", 64, [0.71, 0.73, 0.75]) + rows_of("random", 64, [0.70, 0.70, 0.70])
    assert "not distinguishable" in transfer.verdict(wide, "pretrained", "random", 64, test_items=10_000)
    # a wide gap stays clear once the test noise is added
    far = rows_of("pretrained", 300, [0.85, 0.86, 0.84]) + rows_of("random", 300, [0.70, 0.71, 0.69])
    assert "pretrained is clearly ahead" in transfer.verdict(far, "pretrained", "random", 300, test_items=5000)


def test_recorded_rows_feed_the_single_draw_verdict():
    rows = transfer.recorded_rows({"pretrained": 0.70, "random": 0.60}, labels=100, task="imdb", model="gpt")
    assert {r["init"]: r["value"] for r in rows} == {"pretrained": 0.70, "random": 0.60}
    # 0.1 apart on 1,000 items: se = sqrt(.21/1000 + .24/1000) = 0.0212, 4.7 standard errors
    text = transfer.verdict(rows, "pretrained", "random", labels=100, test_items=1000)
    assert "+10.0 ± 2.1 points" in text and "clearly ahead" in text
    with pytest.raises(ValueError, match="no recorded values"):
        transfer.recorded_rows({}, labels=1, task="t", model="m")


def test_mean_verdict_noise_gap_and_chance():
    close = transfer.mean_verdict("A", 0.617, "B", 0.636, labels=8000, test_items=4000, draws=3)
    assert "-1.9 ± 1.1 points" in close and "not distinguishable" in close and "mean of 3 runs" in close
    far = transfer.mean_verdict("A", 0.795, "B", 0.617, labels=8000, test_items=4000, draws=3)
    assert "95 % interval +15.8 to +19.8 points): A is clearly ahead" in far and "near chance" not in far
    low = transfer.mean_verdict("A", 0.51, "B", 0.70, labels=50, test_items=4000, draws=3)
    assert "A 0.510 (near chance)" in low and "A is clearly behind" in low
    with pytest.raises(ValueError, match="between 0 and 1"):
        transfer.mean_verdict("A", 61.7, "B", 0.6, labels=1, test_items=10, draws=1)


def snapshot_rows(model, labels, values):
    return [{"task": "nsmc", "model": model, "init": "pretrained", "labels": labels, "seed": s,
             "metric": "accuracy", "value": v} for s, v in enumerate(values)]


def test_plot_draws_one_line_per_arm_and_names_the_metric_it_shows():
    import matplotlib
    matplotlib.use("Agg")
    rows = rows_of("pretrained", 100, [0.7, 0.72]) + rows_of("pretrained", 1000, [0.8, 0.82]) + rows_of("random", 100, [0.6, 0.6])
    ax = transfer.plot(rows, chance=None)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"pretrained", "random"}
    assert list(lines["pretrained"].get_ydata()) == pytest.approx([0.71, 0.81])
    assert ax.get_ylabel() == "accuracy"                       # the rows' one metric, without being told
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "1,000"]   # the sizes measured, no others
    mixed = rows + rows_of("random", 100, [3.0], metric="bleu")
    assert transfer.plot(mixed, chance=None).get_ylabel() == "metric"
    assert transfer.plot(mixed, metric="bleu", chance=None).get_ylabel() == "bleu"


def test_emergence_table_pairs_each_snapshot_with_random_weights():
    rows = (rows_of("random", 100, [0.55, 0.57, 0.53], task="nsmc")
            + snapshot_rows("bert@3M", 100, [0.56, 0.57, 0.55]) + snapshot_rows("bert", 100, [0.70, 0.68, 0.69])
            + rows_of("tfidf", 100, [0.6, 0.6, 0.6], task="nsmc")            # a baseline: not part of it
            + snapshot_rows("other", 100, [0.9, 0.9, 0.9]))                  # not named in tokens: left out
    table = transfer.emergence_table(rows, {"bert@3M": 3_000_000, "bert": 40_000_000})
    assert list(table.tokens) == [0, 3_000_000, 40_000_000] and list(table.model) == ["random", "bert@3M", "bert"]
    final = table[table.tokens == 40_000_000].iloc[0]
    assert final["mean"] == pytest.approx(0.69) and final["n"] == 3
    assert final["gain"] == pytest.approx(0.14)                       # diffs 0.15, 0.11, 0.16
    assert final["gain_se"] == pytest.approx(math.sqrt(((0.01) ** 2 + 0.03 ** 2 + 0.02 ** 2) / 2 / 3))
    text = transfer.emergence_reading(table, 100)
    assert "+1.0 ± 0.6 after 3M tokens" in text and "+14.0" in text
    assert "first clearly positive after 40M tokens (not yet after 3M)" in text
    with pytest.raises(ValueError, match="random"):
        transfer.emergence_table(snapshot_rows("bert", 100, [0.7]), {"bert": 1})
    with pytest.raises(ValueError, match="no emergence rows at 1,000|1000"):
        transfer.emergence_reading(table, 1000)


def test_emergence_reading_says_when_no_amount_helps():
    rows = rows_of("random", 100, [0.55, 0.57, 0.53], task="nsmc") + snapshot_rows("bert", 100, [0.56, 0.55, 0.54])
    table = transfer.emergence_table(rows, {"bert": 10_000_000})
    assert transfer.emergence_reading(table, 100).endswith("at no amount of pretraining measured is it clearly positive.")
    ax = transfer.emergence_plot(table)
    assert ax.get_xscale() == "log" and len(ax.lines) >= 2


def test_item_verdict_pairs_the_items():
    a = [1.0] * 60 + [0.0] * 40
    b = [1.0] * 40 + [0.0] * 60            # b is right on a subset of a's items: differences 0 or +1
    text = transfer.item_verdict(a, b, "knowledge", "token", "entities restored whole")
    assert "entities restored whole (100 items): knowledge 60.0%, token 40.0%" in text
    assert "+20.0 ± 4.0 points (paired over the items; 95 % interval +12.0 to +28.0 points)" in text
    assert "clearly ahead" in text
    assert "not distinguishable" in transfer.item_verdict([1, 0, 1, 0, 1], [0, 1, 1, 0, 0], "x", "y", "items")
    assert "agree on every item" in transfer.item_verdict([1, 0], [1, 0], "x", "y", "items")
    assert "clearly behind" in transfer.item_verdict(b, a, "token", "knowledge", "entities")
    with pytest.raises(ValueError, match="same items"):
        transfer.item_verdict([1.0], [1.0, 0.0], "x", "y", "items")
    d = transfer.item_difference([1, 1, 0, 0], [1, 0, 0, 0])
    assert d == {"a": 0.5, "b": 0.25, "mean": 0.25, "se": pytest.approx(0.25), "n": 4}
    assert transfer.item_sentence(d, "x", "y", "items") == transfer.item_verdict([1, 1, 0, 0], [1, 0, 0, 0], "x", "y",
                                                                                   "items")


def test_item_sentence_over_seeds_and_in_bleu():
    d = transfer.item_difference([20.0, 22.0, 21.0], [15.0, 16.0, 15.5])
    text = transfer.item_sentence(d, "pretrained", "from scratch", "translation", unit="bleu", over="seeds")
    assert text == ("translation (3 seeds): pretrained 21.0, from scratch 15.5 BLEU; difference +5.5 ± 0.3 BLEU "
                    "(paired over the seeds; 95 % interval +4.3 to +6.7 BLEU): pretrained is clearly ahead.")
    assert "one seed, no standard error" in transfer.item_verdict([0.7], [0.6], "a", "b", "x", over="seeds")
    assert "(1 seed)" in transfer.item_verdict([0.7], [0.6], "a", "b", "x", over="seeds")
    with pytest.raises(ValueError, match="over must be"):
        transfer.item_verdict([0.7], [0.6], "a", "b", "x", over="runs")


def test_item_sentence_in_nats_puts_the_lower_loss_ahead():
    d = transfer.item_difference([2.0, 2.2, 1.9, 2.1], [2.5, 2.6, 2.4, 2.7])
    text = transfer.item_sentence(d, "knowledge", "token", "entity loss", unit="nats")
    assert "knowledge 2.050, token 2.550 nats per token; difference -0.500 ± 0.041 nats" in text
    assert "knowledge is clearly ahead" in text
    assert "clearly behind" in transfer.item_sentence(transfer.item_difference([3, 3.2], [2, 2.1]), "a", "b", "x",
                                                      unit="nats")
    with pytest.raises(ValueError, match="unit must be"):
        transfer.item_sentence(d, "a", "b", "x", unit="points")


def test_grid_difference_adds_the_seeds_spread_to_the_items_noise():
    import random
    rng = random.Random(0)
    # seed effects of +-0.05 and item noise of sd 0.3 around a true difference of -0.03
    shift = [0.05, -0.05, 0.0]
    a = [[1.0 - 0.03 + s + rng.gauss(0, 0.3) for _ in range(400)] for s in shift]
    b = [[1.0 + rng.gauss(0, 0.3) for _ in range(400)] for _ in shift]
    d = transfer.grid_difference(a, b)
    by_seed = [sum(x - y for x, y in zip(ra, rb)) / 400 for ra, rb in zip(a, b)]
    assert d["mean"] == pytest.approx(sum(by_seed) / 3) and d["n"] == 3 and d["items"] == 400
    seeds_only = transfer.mean_se(by_seed)[1]
    items_only = transfer.item_difference([sum(c) / 3 for c in zip(*a)], [sum(c) / 3 for c in zip(*b)])["se"]
    assert d["se"] == pytest.approx((seeds_only ** 2 + items_only ** 2) ** 0.5)
    assert 2 <= d["df"] < 399                   # between the seeds' and the items' degrees of freedom
    sentence = transfer.item_sentence(d, "Switch", "dense", "validation loss per window", unit="nats")
    assert "3 seeds x 400 items" in sentence and "paired over the seeds and the items" in sentence
    # one seed: the items' noise alone, with the items' degrees of freedom
    one = transfer.grid_difference(a[:1], b[:1])
    assert one["se"] == pytest.approx(transfer.item_difference(a[0], b[0])["se"]) and one["df"] == 399
    assert "(1 seed x 400 items)" in transfer.item_sentence(one, "A", "B", "loss", unit="nats")
    assert "paired over the items;" in transfer.item_sentence(one, "A", "B", "loss", unit="nats")
    # a clear gap when both noises are small; the same gap not clear when the seeds disagree
    steady = transfer.grid_difference([[0.9, 0.91, 0.92]] * 3, [[1.0, 1.01, 1.02]] * 3)
    assert transfer.item_sentence(steady, "A", "B", "loss", unit="nats").endswith("A is clearly ahead.")
    shaky = transfer.grid_difference([[0.9, 0.91, 0.92], [1.1, 1.11, 1.12], [0.9, 0.91, 0.92]],
                                     [[1.0, 1.01, 1.02]] * 3)
    assert transfer.item_sentence(shaky, "A", "B", "loss", unit="nats").endswith("not distinguishable from the noise.")
    with pytest.raises(ValueError, match="same number of seeds"):
        transfer.grid_difference([[1.0, 2.0]], [[1.0, 2.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="same items"):
        transfer.grid_difference([[1.0, 2.0], [1.0]], [[1.0, 2.0], [1.0]])


def test_outcome_and_clause_read_a_difference_as_item_sentence_does():
    steady = transfer.grid_difference([[0.9, 0.91, 0.92]] * 3, [[1.0, 1.01, 1.02]] * 3)
    assert transfer.outcome(steady, "nats") == "ahead" and transfer.outcome(steady, "percent") == "behind"
    assert transfer.difference_clause(steady, "A", "nats") == "-0.100 ± 0.000 nats, A clearly ahead"
    shaky = transfer.grid_difference([[0.9, 0.91, 0.92], [1.1, 1.11, 1.12], [0.9, 0.91, 0.92]],
                                     [[1.0, 1.01, 1.02]] * 3)
    assert transfer.outcome(shaky, "nats") == "level"
    assert transfer.difference_clause(shaky, "A", "nats").endswith("nats, not distinguishable from the noise")
    for d, unit in ((steady, "nats"), (shaky, "nats"), (transfer.item_difference([1, 1, 0, 1], [0, 0, 0, 1]), "percent")):
        verdict = transfer.item_sentence(d, "A", "B", "x", unit=unit)
        word = transfer.outcome(d, unit)
        assert (f"A is clearly {word}" in verdict) if word != "level" else verdict.endswith("from the noise.")
    bleu = {"mean": 1.5, "se": 0.3, "n": 3, "items": 1000, "df": 2.5}
    assert transfer.difference_clause(bleu, "pretrained", "bleu") == "+1.5 ± 0.3 BLEU, pretrained clearly ahead"
    assert transfer.difference_clause({"mean": 0.02, "se": 0.015, "n": 300}, "A") == \
        "+2.0 ± 1.5 points, not distinguishable from the noise"
    with pytest.raises(ValueError, match="unit must be"):
        transfer.difference_clause(bleu, "A", "words")
