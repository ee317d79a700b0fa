"""Transfer results in one format: rows, their means and standard errors, curves and verdicts.

Every Part III experiment that compares a pretrained model with one that was not pretrained
records one row per run under the key ``transfer`` of its chapter's results::

    {"task": "imdb", "model": "minilm", "init": "pretrained", "labels": 64, "seed": 0,
     "metric": "accuracy", "value": 0.751}

``init`` is ``"pretrained"``, ``"random"`` (the same architecture from random initialisation) or
a baseline's name (``"tfidf"``, ``"frozen"``, ...). Rows of one ``(task, metric)`` with the same
``seed`` saw the same labelled examples and the same test items, so two arms are compared
*paired*: the standard error of their difference is taken over the seeds' differences
(:func:`paired_difference`), which removes the luck of the draw that both arms share.

::

    transfer.summary(rows)                       # mean, standard error, n per arm and size
    transfer.plot(rows, recorded=full_rows)      # curves with error bands, log x axis
    transfer.verdict(rows, "pretrained", "random", labels=64)
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["FIELDS", "check_rows", "summary", "paired_difference", "labels_to_match", "verdict", "recorded_rows", "mean_verdict",
           "curve_reading", "plot",
           "emergence_table", "emergence_plot", "emergence_reading"]

FIELDS = ("task", "model", "init", "labels", "seed", "metric", "value")
_TYPES = {"task": str, "model": str, "init": str, "labels": int, "seed": int, "metric": str, "value": float}


def check_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validated copies of ``rows`` (a clear error naming the row and field otherwise); at most one
    row per ``(task, model, init, labels, seed, metric)``."""
    out, seen = [], set()
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"transfer row {i} is a {type(row).__name__}, not a dict")
        if set(row) != set(FIELDS):
            raise ValueError(f"transfer row {i} must have exactly the fields {FIELDS}; "
                             f"missing {sorted(set(FIELDS) - set(row))}, extra {sorted(set(row) - set(FIELDS))}")
        clean = {}
        for f in FIELDS:
            v = row[f]
            if _TYPES[f] is int:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"transfer row {i}: {f} must be a non-negative int, got {v!r}")
            elif _TYPES[f] is float:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"transfer row {i}: value must be a finite number, got {v!r}")
                v = float(v)
            elif not isinstance(v, str) or not v:
                raise ValueError(f"transfer row {i}: {f} must be a non-empty str, got {v!r}")
            clean[f] = v
        key = tuple(clean[f] for f in FIELDS[:-1])
        if key in seen:
            raise ValueError(f"transfer row {i} repeats {dict(zip(FIELDS[:-1], key))}: one row per run")
        seen.add(key)
        out.append(clean)
    return out


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (NaN for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _select(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items() if v is not None)]


def summary(rows: Iterable[Mapping[str, Any]]):
    """A DataFrame, one line per ``(task, model, init, metric, labels)``: ``mean``, ``se`` (standard
    error of the mean over seeds; NaN for one seed) and ``n`` (seeds)."""
    import pandas as pd
    rows = check_rows(rows)
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["model"], r["init"], r["metric"], r["labels"]), []).append(r["value"])
    lines = [(*k, *mean_se(v), len(v)) for k, v in sorted(groups.items())]
    return pd.DataFrame(lines, columns=["task", "model", "init", "metric", "labels", "mean", "se", "n"])


def paired_difference(rows, a: str, b: str, labels: int, task: str | None = None,
                      metric: str | None = None) -> dict[str, Any]:
    """``init`` ``a`` minus ``init`` ``b`` at ``labels``, paired by seed (same draw, same test items):
    ``{"mean", "se", "n", "a", "b", "diffs"}`` with ``a``/``b`` the arms' means over the shared seeds.
    ``se`` is NaN with a single shared seed. Raises when the two arms share no seed."""
    rows = check_rows(rows)
    pick = {}
    for name in (a, b):
        sel = _select(rows, init=name, labels=labels, task=task, metric=metric)
        if len({(r["task"], r["metric"]) for r in sel}) > 1:
            raise ValueError(f"rows of init {name!r} at {labels} labels span several tasks or metrics: "
                             "name task= and metric=")
        pick[name] = {r["seed"]: r["value"] for r in sel}
    seeds = sorted(set(pick[a]) & set(pick[b]))
    if not seeds:
        raise ValueError(f"no seed has both {a!r} and {b!r} at {labels} labels")
    diffs = [pick[a][s] - pick[b][s] for s in seeds]
    mean, se = mean_se(diffs)
    return {"mean": mean, "se": se, "n": len(seeds), "diffs": diffs,
            "a": sum(pick[a][s] for s in seeds) / len(seeds), "b": sum(pick[b][s] for s in seeds) / len(seeds)}


def _curve(rows, init, task=None, metric=None) -> list[tuple[int, float]]:
    sel = _select(check_rows(rows), init=init, task=task, metric=metric)
    by: dict[int, list[float]] = {}
    for r in sel:
        by.setdefault(r["labels"], []).append(r["value"])
    return sorted((n, sum(v) / len(v)) for n, v in by.items())


def labels_to_match(rows, target: float, init: str, task: str | None = None,
                    metric: str | None = None) -> float | None:
    """How many labels arm ``init`` needs to reach ``target`` (its mean curve interpolated linearly in
    log(labels)); None when it stays below ``target`` at every measured size."""
    curve = _curve(rows, init, task, metric)
    if not curve:
        raise ValueError(f"no rows of init {init!r}")
    if curve[0][1] >= target:
        return float(curve[0][0])
    for (n0, v0), (n1, v1) in zip(curve, curve[1:]):
        if v0 < target <= v1:
            t = (target - v0) / (v1 - v0)
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def critical_value(n: float | None) -> float:
    """How many standard errors a mean difference of ``n`` paired values must exceed to count as clear:
    Student's t at 97.5 % with ``n - 1`` degrees of freedom (4.30 for 3 draws, 2.78 for 5, 2.09 for
    20), 2 beyond 60 values or for a normal approximation (``n`` None). With 3 draws the standard
    error is itself uncertain, and a difference of two of them is no evidence. ``n`` may be a
    fraction: one more than an effective number of degrees of freedom (Welch-Satterthwaite)."""
    if n is None or n > 60:
        return 2.0
    if n < 2:
        raise ValueError(f"a standard error needs at least 2 values, got {n}")
    from scipy.stats import t
    return float(t.ppf(0.975, n - 1))


def _interval(mean: float, se: float, n: int | None, scale: float = 100.0, digits: int = 1, unit: str = "points") -> str:
    """``95 % interval a to b unit`` of a mean difference (Student's t, see :func:`critical_value`)."""
    return _interval_around(mean, critical_value(n) * se, scale, digits, unit)


def _interval_around(mean: float, half: float, scale: float = 100.0, digits: int = 1, unit: str = "points") -> str:
    """``95 % interval a to b unit``: ``mean`` plus and minus the half-width ``half``."""
    return f"95 % interval {scale * (mean - half):+.{digits}f} to {scale * (mean + half):+.{digits}f} {unit}"


def _test_sample_se(pa: float, pb: float, test_items: int) -> float:
    """The standard error of the difference of two accuracies measured on ``test_items`` items, as if the
    two were independent (pairing over the same items would make it smaller: this errs on the side of caution)."""
    return math.sqrt(pa * (1 - pa) / test_items + pb * (1 - pb) / test_items)


def _test_sample_judgement(name: str, pa: float, pb: float, test_items: int, why: str) -> str:
    """The difference of two accuracies measured on the same ``test_items`` items, judged by the
    standard error of the test sample alone, ``sqrt(pa(1-pa)/N + pb(1-pb)/N)``."""
    se = _test_sample_se(pa, pb, test_items)
    diff = pa - pb
    text = f"difference {_points(diff)} ± {100 * se:.1f} points ({why}; {_interval(diff, se, None)})"
    if abs(diff) > critical_value(None) * se:
        side = "ahead" if diff > 0 else "behind"
        return f"{text}: {name} is clearly {side}."
    return f"{text}: not distinguishable from the test-sample noise."


def verdict(rows, a: str, b: str, labels: int, names: Mapping[str, str] | None = None, chance: float | None = 0.5,
            task: str | None = None, metric: str | None = None, test_items: int | None = None) -> str:
    """One sentence from the numbers: both arms' means at ``labels``, the paired difference in points
    with its standard error and 95 % interval, whether it is clearly outside the noise (the interval
    excludes zero: more than :func:`critical_value` standard errors, 4.3 of them with 3 draws), and
    "near chance" for an arm within two standard errors (or 2 points) of ``chance``.

    Every draw is scored on the same test set, so the spread over draws leaves out the noise of the
    test sample itself. Given ``test_items`` (the size of the test set an accuracy was measured on),
    its standard error ``sqrt(pa(1-pa)/N + pb(1-pb)/N)`` is added in quadrature to the draws' (with a
    single draw it is all there is, and the sentence says so). Without ``test_items``, draws that all
    give the same difference (standard error 0) are too little to judge, not a clear gap."""
    names = dict(names or {})
    rows = check_rows(rows)
    d = paired_difference(rows, a, b, labels, task, metric)
    na, nb = names.get(a, a), names.get(b, b)

    def arm(name, init):
        vals = [r["value"] for r in _select(rows, init=init, labels=labels, task=task, metric=metric)]
        mean, se = mean_se(vals)
        near = chance is not None and abs(mean - chance) <= max(0.02, 2 * (se if se == se else 0))
        return f"{name} {mean:.3f}" + (f" ± {se:.3f}" if se == se else "") + (" (near chance)" if near else "")

    head = f"At {labels:,} labels: {arm(na, a)} against {arm(nb, b)}"
    if d["n"] < 2 and not test_items:
        return (f"{head}; difference {_points(d['mean'])} points from a single draw, "
                "so no standard error: too few seeds to judge.")
    if d["n"] < 2:
        return f"{head}; " + _test_sample_judgement(na, d["a"], d["b"], test_items, "one draw: the standard error "
                                                     f"of {test_items:,} test items only, not of the draw")
    se, why = d["se"], f"paired over {d['n']} draws"
    half = critical_value(d["n"]) * se if se > 0 else 0.0
    if test_items:       # every draw is scored on the same test sample: its noise adds to the draws' spread
        se = math.sqrt(se ** 2 + _test_sample_se(d["a"], d["b"], test_items) ** 2)
        why += f" and the noise of {test_items:,} test items"
        # Welch-Satterthwaite: the test sample's part of the variance is known from thousands of items, so
        # only the draws' part carries the few degrees of freedom of Student's t; the interval is never
        # narrower than the draws' own
        n_eff = None if d["se"] == 0 else 1 + (d["n"] - 1) * (se / d["se"]) ** 4
        half = max(half, critical_value(n_eff) * se)
    elif se == 0:
        return (f"{head}; difference {_points(d['mean'])} points in every one of {d['n']} draws: the draws do not "
                "vary, and without the size of the test sample its noise is unknown, so too little to judge.")
    diff = f"difference {_points(d['mean'])} ± {100 * se:.1f} points ({why}; {_interval_around(d['mean'], half)})"
    if abs(d["mean"]) > half:
        side = "ahead" if d["mean"] > 0 else "behind"
        return f"{head}; {diff}: {na} is clearly {side}."
    return f"{head}; {diff}: not distinguishable from the noise at this size."


def item_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Two models scored on the same items (``a[i]`` and ``b[i]``: their scores on item ``i``, or in
    run ``i``): ``{"a", "b"}`` their means, ``"mean"`` the mean paired difference ``a - b``, ``"se"`` its
    standard error over the items (NaN for one item) and ``"n"`` the number of items."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) != len(b) or not a:
        raise ValueError(f"a and b must score the same items: got {len(a)} and {len(b)} scores")
    mean, se = mean_se([x - y for x, y in zip(a, b)])
    return {"a": sum(a) / len(a), "b": sum(b) / len(b), "mean": mean, "se": se, "n": len(a)}


def grid_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> dict[str, float]:
    """Two models trained from the same seeds and scored on the same items: ``a[s][i]`` and ``b[s][i]``
    are their scores on item ``i`` in the runs of seed ``s``. ``"mean"`` is the mean paired difference
    ``a - b`` over seeds and items; its standard error ``"se"`` adds the two sources of noise: the
    spread of the seeds' mean differences (another seed could move the difference) and the spread of
    the items' differences averaged over the seeds (another test sample could), ``se**2 =
    var_seeds / S + var_items / I``. ``"n"`` is the number of seeds, ``"items"`` the number of items
    and ``"df"`` the degrees of freedom of Student's t for that sum (Welch-Satterthwaite), at least
    the seeds' ``S - 1``. One seed: the items' standard error alone (``"df"`` from the items)."""
    a = [[float(x) for x in row] for row in a]
    b = [[float(x) for x in row] for row in b]
    if not a or len(a) != len(b):
        raise ValueError(f"a and b must hold the same number of seeds: got {len(a)} and {len(b)}")
    if any(len(x) != len(y) or not x for x, y in zip(a, b)) or len({len(x) for x in a}) != 1:
        raise ValueError("every seed of a and b must be scored on the same items: got "
                         f"{[len(x) for x in a]} and {[len(x) for x in b]} scores")
    seeds, items = len(a), len(a[0])
    diff = [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
    by_seed = [sum(r) / items for r in diff]
    by_item = [sum(diff[s][i] for s in range(seeds)) / seeds for i in range(items)]
    mean = sum(by_seed) / seeds
    _, se_items = mean_se(by_item)
    se, df = combine_noise(mean_se(by_seed)[1] if seeds > 1 else None, seeds, se_items, items)
    return {"a": sum(map(sum, a)) / (seeds * items), "b": sum(map(sum, b)) / (seeds * items), "mean": mean,
            "se": se, "n": seeds, "items": items, "df": df, "by_seed": by_seed}


def combine_noise(se_seeds: float | None, seeds: int, se_items: float, items: int) -> tuple[float, float]:
    """``(se, df)`` of a difference averaged over seeds and test items: the two standard errors added in
    quadrature (the seeds' spread of their mean differences, and the items' noise of the seed-averaged
    difference), and the Welch-Satterthwaite degrees of freedom of that sum, at least ``seeds - 1``. One
    seed (``se_seeds`` None): the items' standard error and ``items - 1``."""
    if seeds == 1 or se_seeds is None:
        return se_items, items - 1
    se = math.sqrt(se_seeds ** 2 + se_items ** 2)
    parts = [(se_seeds ** 2, seeds - 1), (se_items ** 2, items - 1)]
    df = se ** 4 / sum(v ** 2 / k for v, k in parts) if se > 0 else seeds - 1
    return se, max(df, seeds - 1)


def item_sentence(d: Mapping[str, float], name_a: str, name_b: str, what: str, unit: str = "percent",
                  over: str = "items") -> str:
    """One sentence from :func:`item_difference` (also as recorded): both means, the paired difference
    with its standard error and 95 % interval, and whether it is clearly outside the noise (the
    interval excludes zero: Student's t, :func:`critical_value`). ``what`` names the items ("entities restored whole"). ``unit``: ``"percent"`` (scores are
    shares: means in %, the difference in points, higher is better), ``"bleu"`` (BLEU scores, 0 to
    100: means and difference in BLEU points, higher is better) or ``"nats"`` (a loss: means and
    difference in nats, lower is better, so the model with the lower loss is the one ahead).
    ``over`` names what was paired: ``"items"`` (test items), ``"seeds"`` (runs with the same seed) or
    ``"sentences"`` (held-out sentences, e.g. a paired bootstrap of BLEU: :func:`lib.translation.paired_bleu`).
    A :func:`grid_difference` (seeds and items) is read with its own count and degrees of freedom."""
    if unit not in ("percent", "bleu", "nats"):
        raise ValueError(f"unit must be 'percent', 'bleu' or 'nats', got {unit!r}")
    if over not in ("items", "seeds", "sentences"):
        raise ValueError(f"over must be 'items', 'seeds' or 'sentences', got {over!r}")
    mean, se, one, n = d["mean"], d["se"], over[:-1], int(d["n"])
    count = f"{n:,} {one if n == 1 else over}"
    if "df" in d:          # a grid_difference: its t has df degrees of freedom (critical_value takes df + 1)
        count = f"{n:,} seed{'' if n == 1 else 's'} x {int(d['items']):,} items"
        over, one, n = "items" if n == 1 else "seeds and the items", "item", d["df"] + 1
    if unit == "percent":
        scale, digits, name = 100.0, 1, "points"
        head = (f"{what} ({count}): {name_a} {100 * d['a']:.1f}%, {name_b} {100 * d['b']:.1f}%; "
                f"difference {_points(mean)}" + (f" ± {100 * se:.1f}" if se == se else "") + " points")
    elif unit == "bleu":
        scale, digits, name = 1.0, 1, "BLEU"
        head = (f"{what} ({count}): {name_a} {d['a']:.1f}, {name_b} {d['b']:.1f} BLEU; "
                f"difference {mean:+.1f}" + (f" ± {se:.1f}" if se == se else "") + " BLEU")
    else:
        scale, digits, name = 1.0, 3, "nats"
        head = (f"{what} ({count}): {name_a} {d['a']:.3f}, {name_b} {d['b']:.3f} nats per token; "
                f"difference {mean:+.3f}" + (f" ± {se:.3f}" if se == se else "") + " nats")
    head += f" (paired over the {over}" + (f"; {_interval(mean, se, n, scale, digits, name)})" if se == se and se > 0
                                           else ")")
    if se != se:
        return f"{head}: one {one}, no standard error."
    if se == 0 and mean == 0:
        return f"{head}: the two agree on every {one}."
    result = outcome(d, unit)                          # a lower loss is ahead
    return f"{head}: not distinguishable from the noise." if result == "level" else f"{head}: {name_a} is clearly {result}."


def outcome(d: Mapping[str, float], unit: str = "percent") -> str:
    """``"ahead"``, ``"behind"`` or ``"level"``: model a against model b in a difference of
    :func:`item_difference`, :func:`grid_difference` or a paired BLEU, by the rule of
    :func:`item_sentence` (the 95 % interval excludes zero); for ``unit="nats"`` a lower loss is ahead."""
    mean, se = d["mean"], d["se"]
    n = d["df"] + 1 if "df" in d else int(d["n"])
    if se != se or (se == 0 and mean == 0) or (se > 0 and abs(mean) <= critical_value(n) * se):
        return "level"
    return "ahead" if (-mean if unit == "nats" else mean) > 0 else "behind"


def difference_clause(d: Mapping[str, float], name_a: str, unit: str = "percent") -> str:
    """A short reading of a difference for a sentence that states the two scores itself:
    ``"+1.5 ± 0.3 BLEU, pretrained clearly ahead"``, ``"-0.1 ± 1.9 points, not distinguishable from the
    noise"`` (units as :func:`item_sentence`)."""
    if unit not in ("percent", "bleu", "nats"):
        raise ValueError(f"unit must be 'percent', 'bleu' or 'nats', got {unit!r}")
    mean, se = d["mean"], d["se"]
    if unit == "percent":
        diff = f"{_points(mean)} ± {100 * se:.1f} points"
    elif unit == "bleu":
        diff = f"{mean:+.1f} ± {se:.1f} BLEU"
    else:
        diff = f"{mean:+.3f} ± {se:.3f} nats"
    result = outcome(d, unit)
    return diff + (", not distinguishable from the noise" if result == "level" else f", {name_a} clearly {result}")


def item_verdict(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, what: str,
                 unit: str = "percent", over: str = "items") -> str:
    """:func:`item_sentence` of :func:`item_difference` of ``a`` and ``b`` (``over="seeds"`` when
    ``a[i]`` and ``b[i]`` are two models' scores from run ``i`` rather than on test item ``i``)."""
    return item_sentence(item_difference(a, b), name_a, name_b, what, unit, over)


def curve_reading(rows, pretrained: str = "pretrained", other: str = "random", at: int = 64,
                  names: Mapping[str, str] | None = None, task: str | None = None,
                  metric: str | None = None) -> str:
    """ULMFiT's reading of a learning curve: "``pretrained`` at ``at`` labels is matched by ``other``
    at about N labels (k times as many)", "not reached at the largest size measured", or matched
    already at the smallest size measured (no saving of labels)."""
    names = dict(names or {})
    curve = dict(_curve(rows, pretrained, task, metric))
    if at not in curve:
        raise ValueError(f"no rows of {pretrained!r} at {at} labels")
    target = curve[at]
    need = labels_to_match(rows, target, other, task, metric)
    np_, no = names.get(pretrained, pretrained), names.get(other, other)
    first_n, first_v = _curve(rows, other, task, metric)[0]
    if first_v >= target and first_n <= at:
        return (f"{np_} with {at:,} labels ({target:.3f}) is matched by {no} already at the smallest size "
                f"measured, {first_n:,} labels ({first_v:.3f}): no saving of labels against {no} here.")
    if need is None:
        largest = max(n for n, _ in _curve(rows, other, task, metric))
        return (f"{np_} with {at:,} labels ({target:.3f}) is not reached by {no} at any measured size, "
                f"up to {largest:,} labels: more than {largest / at:.0f} times as many labels.")
    return (f"{np_} with {at:,} labels ({target:.3f}) is matched by {no} at about {need:,.0f} labels, "
            f"{need / at:.0f} times as many.")


def plot(rows, ax=None, recorded=None, names: Mapping[str, str] | None = None, task: str | None = None,
         metric: str | None = None, chance: float | None = 0.5, order: Sequence[str] | None = None):
    """Mean ± standard error per arm against the number of labels (log x axis): ``rows`` solid with
    bands, ``recorded`` (e.g. the full recipe's rows) dashed with bands, same colour per ``init``.
    Returns the axes."""
    import matplotlib.pyplot as plt
    names = dict(names or {})
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    sources = [(recorded, "--", "recorded"), (rows, "-", "this run")] if recorded else [(rows, "-", None)]
    sources = [(check_rows(src), style, label) for src, style, label in sources]     # checked once
    inits = list(order or [])
    for src, _, _ in sources:
        for r in src:
            if r["init"] not in inits:
                inits.append(r["init"])
    colours = {init: f"C{i}" for i, init in enumerate(inits)}
    for src, style, label in sources:
        table = summary(src)
        if task is not None:
            table = table[table.task == task]
        if metric is not None:
            table = table[table.metric == metric]
        for init in inits:
            t = table[table.init == init].sort_values("labels")
            if t.empty:
                continue
            name = names.get(init, init) + (f" ({label})" if label else "")
            ax.plot(t["labels"], t["mean"], style, marker="o" if style == "-" else ".", ms=7 if style == "-" else 5,
                    color=colours[init], label=name)
            se = t["se"].fillna(0)
            ax.fill_between(t["labels"], t["mean"] - se, t["mean"] + se, color=colours[init], alpha=0.15, lw=0)
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator
    sizes = sorted({r["labels"] for src, _, _ in sources for r in src})
    ax.xaxis.set_major_locator(FixedLocator(sizes))           # a tick at each size measured, written out
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{n:,}" for n in sizes])
    shown = {r["metric"] for src, _, _ in sources for r in src} if metric is None else {metric}
    ax.set(xlabel="labelled examples (log scale)", ylabel=shown.pop() if len(shown) == 1 else "metric")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


# ----------------------------------------------------------------------------- how transfer emerges
def _emergence_rows(rows, tokens: Mapping[str, int], random: str):
    """(tokens read, row) for every row of a checkpoint named in ``tokens`` (``init="pretrained"``)
    and of the ``random`` arm (0 tokens)."""
    out = []
    for r in check_rows(rows):
        if r["init"] == random:
            out.append((0, r))
        elif r["init"] == "pretrained" and r["model"] in tokens:
            out.append((int(tokens[r["model"]]), r))
    return out


def emergence_table(rows, tokens: Mapping[str, int], random: str = "random"):
    """Fine-tuning results against the tokens read in pretraining: ``rows`` hold the runs of the
    snapshots saved along one pretraining run and of its final checkpoint (``init="pretrained"``,
    ``model`` a key of ``tokens``: name -> tokens read) and of the same network from random weights
    (init ``random``: 0 tokens). A DataFrame, one line per ``(labels, tokens)``: ``model``,
    ``mean``, ``se`` (over seeds), ``n``, and ``gain``/``gain_se``: the difference to random weights
    paired over the seeds (same draws, same test items)."""
    import pandas as pd
    picked = _emergence_rows(rows, tokens, random)
    if not any(t == 0 for t, _ in picked) or not any(t > 0 for t, _ in picked):
        raise ValueError(f"emergence needs rows of the {random!r} arm and of at least one checkpoint named in tokens "
                         f"({', '.join(tokens)})")
    groups: dict[tuple[int, int], dict[int, float]] = {}
    names: dict[int, str] = {}
    for t, r in picked:
        groups.setdefault((r["labels"], t), {})[r["seed"]] = r["value"]
        names[t] = r["model"] if t else random
    lines = []
    for (n, t), by_seed in sorted(groups.items()):
        base = groups.get((n, 0), {})
        seeds = sorted(set(by_seed) & set(base))
        gain, gain_se = mean_se([by_seed[s] - base[s] for s in seeds]) if seeds else (math.nan, math.nan)
        lines.append((n, t, names[t], *mean_se(list(by_seed.values())), len(by_seed), gain, gain_se))
    return pd.DataFrame(lines, columns=["labels", "tokens", "model", "mean", "se", "n", "gain", "gain_se"])


def emergence_plot(table, ax=None, chance: float | None = 0.5, label: str = "random weights"):
    """:func:`emergence_table` drawn: accuracy (mean ± standard error) against the tokens read in
    pretraining (log x axis), one line per number of labels, with the random-weight level of the
    same colour dashed across. Returns the axes."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 4))[1]
    for i, (n, t) in enumerate(table.groupby("labels")):
        colour = f"C{i}"
        base, read = t[t.tokens == 0], t[t.tokens > 0].sort_values("tokens")
        ax.errorbar(read["tokens"], read["mean"], yerr=read["se"].fillna(0), marker="o", color=colour, capsize=3,
                    label=f"{n:,} labels, pretrained")
        if not base.empty:
            m, se = float(base["mean"].iloc[0]), float(base["se"].fillna(0).iloc[0])
            ax.axhline(m, color=colour, ls="--", lw=1, label=f"{n:,} labels, {label}")
            ax.axhspan(m - se, m + se, color=colour, alpha=0.12, lw=0)
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xscale("log")
    ax.set(xlabel="tokens read in pretraining (log scale)", ylabel="test accuracy")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def _tokens(t: int) -> str:
    return f"{t / 1e6:.0f}M" if t >= 1e6 else f"{t / 1e3:.0f}k"


def emergence_reading(table, labels: int) -> str:
    """One sentence on :func:`emergence_table` at ``labels``: the gain over random weights after each
    amount of pretraining (paired, ± standard error), and the first amount after which the gain is
    clearly positive (more than :func:`critical_value` standard errors for its number of draws), or
    that it never is."""
    t = table[(table.labels == labels) & (table.tokens > 0)].sort_values("tokens")
    if t.empty:
        raise ValueError(f"no emergence rows at {labels} labels")
    steps = [f"{_points(g)} ± {100 * se:.1f} after {_tokens(int(n))} tokens" if se == se
             else f"{_points(g)} after {_tokens(int(n))} tokens" for n, g, se in zip(t.tokens, t.gain, t.gain_se)]
    clear = [int(n) for n, g, se, k in zip(t.tokens, t.gain, t.gain_se, t.n)
             if se == se and g > critical_value(int(k)) * se]
    head = f"At {labels:,} labels, the gain over random weights is " + ", ".join(steps) + " (points, paired over draws)"
    if not clear:
        return head + ": at no amount of pretraining measured is it clearly positive."
    first = clear[0]
    before = [int(n) for n in t.tokens if n < first]
    tail = f"; it is first clearly positive after {_tokens(first)} tokens"
    return head + tail + (f" (not yet after {_tokens(before[-1])})." if before else ".")


# ----------------------------------------------------------------------------- runs recorded before the row format
def recorded_rows(values: Mapping[str, float], labels: int, task: str, model: str, metric: str = "accuracy",
                  seed: int = 0) -> list[dict[str, Any]]:
    """Rows for a full run recorded before this format existed, with one number per arm: one row
    per ``init`` -> recorded ``value``, all of one draw (``seed``), for ``verdict(..., test_items=N)``."""
    if not values:
        raise ValueError("no recorded values: expected a dict init -> value")
    return check_rows({"task": task, "model": model, "init": init, "labels": labels, "seed": seed,
                       "metric": metric, "value": value} for init, value in values.items())


def mean_verdict(a_name: str, a: float, b_name: str, b: float, labels: int, test_items: int, draws: int,
                 chance: float | None = 0.5) -> str:
    """One sentence on two recorded accuracies, each the mean over ``draws`` runs scored on the same
    ``test_items`` test items, when only the means were recorded: the difference judged by the test
    sample's standard error alone (the runs' spread is unknown, so the real uncertainty is larger)."""
    if test_items < 1 or draws < 1:
        raise ValueError(f"test_items and draws must be positive, got {test_items} and {draws}")
    for name, p in ((a_name, a), (b_name, b)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name}: an accuracy between 0 and 1 is needed, got {p}")

    def arm(name, p):
        near = chance is not None and abs(p - chance) <= max(0.02, 2 * math.sqrt(p * (1 - p) / test_items))
        return f"{name} {p:.3f}" + (" (near chance)" if near else "")

    head = (f"At {labels:,} labels (mean of {draws} runs; their spread was not recorded): "
            f"{arm(a_name, a)} against {arm(b_name, b)}")
    return f"{head}; " + _test_sample_judgement(a_name, a, b, test_items,
                                                f"the standard error of {test_items:,} test items only")
