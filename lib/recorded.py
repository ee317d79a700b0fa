"""Verdicts for full runs recorded before ``lib.transfer``'s row format existed.

Those runs stored one number per arm (an accuracy, or a mean over draws) rather than one row per
run. ``rows`` turns such numbers into transfer rows of a single draw, so that
``transfer.verdict(..., test_items=N)`` writes their sentence; ``mean_verdict`` covers the one case
it cannot: means over several runs whose spread was not recorded.
"""
from __future__ import annotations

import math
from typing import Mapping

from lib import transfer

__all__ = ["rows", "mean_verdict"]


def rows(values: Mapping[str, float], labels: int, task: str, model: str, metric: str = "accuracy",
         seed: int = 0) -> list[dict]:
    """Transfer rows, one per ``init`` -> recorded ``value``, all of one draw (``seed``)."""
    if not values:
        raise ValueError("no recorded values: expected a dict init -> value")
    return transfer.check_rows({"task": task, "model": model, "init": init, "labels": labels, "seed": seed,
                                "metric": metric, "value": value} for init, value in values.items())


def mean_verdict(a_name: str, a: float, b_name: str, b: float, labels: int, test_items: int, draws: int,
                 chance: float | None = 0.5) -> str:
    """One sentence on two recorded accuracies, each the mean over ``draws`` runs (draws of the
    labelled set, or seeds) scored on the same ``test_items`` test items, when only the means were
    recorded: the difference judged by the test sample's standard error alone (the runs' spread is
    unknown, so the real uncertainty is larger)."""
    if test_items < 1 or draws < 1:
        raise ValueError(f"test_items and draws must be positive, got {test_items} and {draws}")
    for name, p in ((a_name, a), (b_name, b)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name}: an accuracy between 0 and 1 is needed, got {p}")
    se = math.sqrt(a * (1 - a) / test_items + b * (1 - b) / test_items)
    diff = a - b

    def arm(name, p):
        near = chance is not None and abs(p - chance) <= max(0.02, 2 * math.sqrt(p * (1 - p) / test_items))
        return f"{name} {p:.3f}" + (" (near chance)" if near else "")

    head = (f"At {labels:,} labels (mean of {draws} runs; their spread was not recorded): "
            f"{arm(a_name, a)} against {arm(b_name, b)}; difference {100 * diff:+.1f} ± {100 * se:.1f} points "
            f"(the standard error of {test_items:,} test items only)")
    if abs(diff) > 2 * se:
        side = "ahead" if diff > 0 else "behind"
        return f"{head}: {a_name} is {side}, {abs(diff) / se:.0f} standard errors of the test sample."
    return f"{head}: not distinguishable from the test-sample noise."
