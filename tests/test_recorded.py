"""lib.recorded: verdicts for full runs recorded before the transfer row format."""
import pytest

from lib import recorded, transfer


def test_rows_feed_the_single_draw_verdict():
    rows = recorded.rows({"pretrained": 0.70, "random": 0.60}, labels=100, task="imdb", model="gpt")
    assert {r["init"]: r["value"] for r in rows} == {"pretrained": 0.70, "random": 0.60}
    # 0.1 apart on 1,000 items: se = sqrt(.21/1000 + .24/1000) = 0.0212, 4.7 standard errors
    text = transfer.verdict(rows, "pretrained", "random", labels=100, test_items=1000)
    assert "+10.0 ± 2.1 points" in text and "clearly ahead" in text
    with pytest.raises(ValueError, match="no recorded values"):
        recorded.rows({}, labels=1, task="t", model="m")


def test_mean_verdict_noise_gap_and_chance():
    close = recorded.mean_verdict("A", 0.617, "B", 0.636, labels=8000, test_items=4000, draws=3)
    assert "-1.9 ± 1.1 points" in close and "not distinguishable" in close and "mean of 3 runs" in close
    far = recorded.mean_verdict("A", 0.795, "B", 0.617, labels=8000, test_items=4000, draws=3)
    assert "A is ahead" in far and "near chance" not in far
    low = recorded.mean_verdict("A", 0.51, "B", 0.70, labels=50, test_items=4000, draws=3)
    assert "A 0.510 (near chance)" in low and "A is behind" in low
    with pytest.raises(ValueError, match="between 0 and 1"):
        recorded.mean_verdict("A", 61.7, "B", 0.6, labels=1, test_items=10, draws=1)
