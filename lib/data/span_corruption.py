"""T5's span corruption (Raffel et al., 2020, sections 3.1.4 and 3.3.4), on lists of token ids.

The unsupervised objective of T5: drop 15 % of the tokens of a text in spans of mean length
3, replace each dropped span by one sentinel token in the input, and make the target the
dropped spans, each after its sentinel, closed by a final sentinel. The paper's Figure 2::

    original:  Thank you for inviting me to your party last week .
    inputs:    Thank you <X> me to your party <Y> week .
    targets:   <X> for inviting <Y> last <Z>

How the spans are drawn (as in T5's ``random_spans_noise_mask``), for a text of ``n`` tokens:

* ``num_noise = round(n * noise_density)`` tokens are dropped (at least 1, at most ``n - 1``);
* they form ``num_spans = round(num_noise / mean_span_length)`` spans (at least 1);
* the dropped tokens are cut into ``num_spans`` non-empty runs, and the kept tokens into
  ``num_spans`` non-empty runs, each cut uniformly at random among all ways to do it;
* kept and dropped runs alternate, starting with a kept one, so the text never starts with a
  sentinel and no two spans touch; as in T5's code, the last run is then always a dropped one
  (the last token of a text is always in a span).

::

    from lib.data.span_corruption import noise_mask, span_corrupt
    inputs, targets = span_corrupt(ids, sentinels=[32099, 32098, ...], eos_id=1, generator=g)

Explained in chapters/11_t5.ipynb.
"""
from __future__ import annotations

from typing import Sequence

import torch

from lib.validate import check_float, check_int

__all__ = ["noise_counts", "noise_mask", "span_corrupt", "spans"]


def noise_counts(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """``(dropped tokens, spans)`` for a text of ``length`` tokens (see the module docstring)."""
    check_int("length", length, 2)
    check_float("noise_density", noise_density, 0.0, 1.0, positive=True)
    check_float("mean_span_length", mean_span_length, 1.0)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_span_length), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)


def _segments(total: int, parts: int, generator: torch.Generator | None) -> list[int]:
    """``total`` items cut into ``parts`` non-empty runs, uniformly over all such cuts."""
    cuts = (torch.randperm(total - 1, generator=generator)[:parts - 1] + 1).sort().values.tolist()
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def noise_mask(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """``(length,)`` bool, True at the tokens to drop: ``noise_counts`` of them, in spans that
    alternate with kept runs, the first run kept."""
    num_noise, num_spans = noise_counts(length, noise_density, mean_span_length)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    noise = _segments(num_noise, num_spans, generator)
    kept = _segments(length - num_noise, num_spans, generator)
    mask = torch.zeros(length, dtype=torch.bool)
    pos = 0
    for k, d in zip(kept, noise):
        pos += k
        mask[pos:pos + d] = True
        pos += d
    return mask


def spans(mask: torch.Tensor) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each run of True in a 1-D bool mask (end exclusive)."""
    m = mask.tolist()
    out, start = [], None
    for i, v in enumerate(m + [False]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            out.append((start, i))
            start = None
    return out


def span_corrupt(tokens: Sequence[int], sentinels: Sequence[int], eos_id: int | None = None,
                 noise_density: float = 0.15, mean_span_length: float = 3.0,
                 generator: torch.Generator | None = None,
                 mask: torch.Tensor | None = None) -> tuple[list[int], list[int]]:
    """``(inputs, targets)`` of one text (a list of ids) as in the paper's Figure 2.

    ``sentinels[i]`` replaces the i-th span (T5 uses the last ids of its vocabulary,
    ``<extra_id_0>``, ``<extra_id_1>``, ...); the target ends with the sentinel after the last
    span. ``eos_id`` (if given) ends both. ``mask`` overrides the random :func:`noise_mask`."""
    tokens = list(tokens)
    if mask is None:
        mask = noise_mask(len(tokens), noise_density, mean_span_length, generator)
    elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (len(tokens),):
        raise ValueError(f"mask must be a bool tensor of shape ({len(tokens)},), got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    runs = spans(mask)
    if len(sentinels) < len(runs) + 1:
        raise ValueError(f"{len(runs)} spans need {len(runs) + 1} sentinel ids, got {len(sentinels)}")
    inputs, targets, pos = [], [], 0
    for i, (a, b) in enumerate(runs):
        inputs += tokens[pos:a] + [sentinels[i]]
        targets += [sentinels[i]] + tokens[a:b]
        pos = b
    inputs += tokens[pos:]
    targets.append(sentinels[len(runs)])
    if eos_id is not None:
        inputs.append(eos_id)
        targets.append(eos_id)
    return inputs, targets
