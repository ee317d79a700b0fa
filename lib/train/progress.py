"""Progress: a tqdm bar when a person watches, short text lines otherwise (CI, the book build,
nbval), and only from the main process under ``torchrun``."""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

__all__ = ["show_bar", "format_metrics", "Progress"]


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def show_bar(progress: bool | None) -> bool:
    """Whether to draw a tqdm bar. ``COURSE_PROGRESS=0`` always wins (CI, book build);
    ``COURSE_PROGRESS=1`` forces it. Automatic: on a terminal, or in a Jupyter kernel that a
    Jupyter server started for a person (it sets JPY_SESSION_NAME; nbval / nbclient / the book
    build do not), so executed notebooks get text lines instead of widget output."""
    env = os.environ.get("COURSE_PROGRESS", "").strip()
    if env == "0" or progress is False:
        return False
    if env == "1" or progress is True:
        return True
    if _in_kernel():
        return bool(os.environ.get("JPY_SESSION_NAME"))
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def format_metrics(metrics: Mapping[str, Any]) -> str:
    parts = []
    for k, v in metrics.items():
        if k in ("step", "epoch"):
            continue
        if isinstance(v, float):
            parts.append(f"{k} {v:.2e}" if k == "lr" else f"{k} {v:.4g}")
        else:
            parts.append(f"{k} {v}")
    return " | ".join(parts)



class Progress:
    """Where ``fit`` reports: a bar (``bar=True``) or text lines (every ``log_every`` steps, and
    evaluations); silent in processes other than rank 0. Use as a context manager."""

    def __init__(self, *, bar: bool, total: int | None, initial: int, log_every: int | None,
                 quiet: bool, rank: int, summary: bool = False):
        self.total, self.log_every, self.rank = total, log_every, rank
        # summary: no line per log or evaluation, one line at the end with the last metrics
        self.summary, self.last = summary, {}
        # text lines are printed when there is a logging interval or progress=False asked for them
        self.print_lines = log_every is not None or quiet
        self.bar = None
        if bar and rank == 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True, leave=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def say(self, line: str) -> None:
        if self.rank != 0:
            return
        if self.bar is not None:
            self.bar.write(line)
        elif self.print_lines:
            print(line, flush=True)

    def logged(self, step: int, epoch: int, record: Mapping[str, Any]) -> None:
        """A history record was written for the training window ending at ``step``."""
        self.last.update(record)
        if self.bar is None and self.summary:
            return
        if self.bar is None:
            self.say(f"step {step}" + (f"/{self.total}" if self.total else "") + f" (epoch {epoch + 1}): "
                     f"{format_metrics(record)}")
        else:
            self.bar.set_postfix(loss=f"{record['train_loss']:.4g}", lr=f"{record['lr']:.2e}", refresh=False)

    def evaluated(self, step: int, epoch: int, metrics: Mapping[str, Any]) -> None:
        self.last.update(metrics)
        if not (self.bar is None and self.summary):
            self.say(f"eval  step {step} (epoch {epoch + 1}): {format_metrics(metrics)}")

    def stepped(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def finished(self, steps: int, epochs: int, seconds: float, precision: str = "") -> None:
        if steps > 0 and self.bar is None and self.summary:
            last = {k: v for k, v in self.last.items() if k not in ("lr", "epoch", "step")}
            self.say(f"trained {steps} steps ({epochs} epoch{'' if epochs == 1 else 's'} complete) in {seconds:.1f} s"
                     + (f" ({precision})" if precision else "")
                     + (f"; last: {format_metrics(last)}" if last else ""))
            return
        if steps > 0 and self.bar is None and self.log_every is not None:
            self.say(f"done: {steps} steps, {epochs} epochs complete, {seconds:.1f} s this call")
