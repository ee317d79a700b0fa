"""Measured numbers, recorded by the code that measured them (never typed by hand).

A chapter ends with::

    metrics = {"val_loss": val_loss, "bleu": bleu, "accuracy": {"pos": 0.91, "neg": 0.88}}
    results.record("07_transformer", metrics, hp)     # hp = config.recipe(ci=..., full=...)
    results.show("07_transformer", live=metrics)      # full-recipe numbers beside this run's

``record`` writes ``<results dir>/<chapter>.json``, one entry per recipe::

    {"ci":   {"metrics": {...}, "hparams": {...}, "device": "...", "date": "...",
              "commit": "abc1234", "dirty": false, "notes": ""},
     "full": {...}}

and replaces only the entry of the active recipe, so a CI run never erases the numbers of a
full (GPU) run. Where ``record`` writes is decided when it writes, from the recipe's mode:

* ``$COURSE_RESULTS_DIR``, if set, for every recipe (an explicit choice);
* else ``$COURSE_CI_RESULTS_DIR``, if set, for the CI recipe only: ``tools/env.sh`` points it
  at ``_build/results`` so that executing the chapters never modifies the committed files,
  while a full run started from the same shell (``COURSE_MODE=full`` set before or after
  sourcing it) still writes ``<repo>/results``;
* else ``<repo>/results`` (committed).

``load`` reads the committed file and lays the scratch file's entries over it.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from lib.io import atomic_write

__all__ = ["ENV_VAR", "CI_ENV_VAR", "REPO", "COMMITTED_DIR", "results_dir", "path", "record", "RecordedFile", "load", "full",
           "stale", "provenance", "table", "show", "flatten", "Reading", "conclude"]

ENV_VAR = "COURSE_RESULTS_DIR"
CI_ENV_VAR = "COURSE_CI_RESULTS_DIR"
REPO = Path(__file__).resolve().parent.parent
COMMITTED_DIR = REPO / "results"
MISSING = "—"
_MODES = ("ci", "full")
_CHAPTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def results_dir(mode: str = "ci") -> Path:
    """Where ``record`` writes a ``mode`` ("ci" or "full") entry: ``$COURSE_RESULTS_DIR`` if
    set; else, for the CI recipe, ``$COURSE_CI_RESULTS_DIR`` if set; else ``<repo>/results``."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    ci = os.environ.get(CI_ENV_VAR, "").strip()
    if ci and mode == "ci":
        return Path(ci).expanduser()
    return COMMITTED_DIR


def _check_chapter(chapter: Any) -> str:
    if not isinstance(chapter, str) or not _CHAPTER_RE.match(chapter) or ".." in chapter:
        raise ValueError(f"chapter must be a name like '07_transformer' (letters, digits, _ . -), got {chapter!r}")
    return chapter


def path(chapter: str, directory: str | os.PathLike | None = None, mode: str = "ci") -> Path:
    """The results file of ``chapter`` in ``directory`` (default: ``results_dir(mode)``)."""
    _check_chapter(chapter)
    return Path(directory if directory is not None else results_dir(mode)) / f"{chapter}.json"


# --------------------------------------------------------------------------------------------
# Validation: only finite numbers, strings and nested dicts/lists of them
# --------------------------------------------------------------------------------------------

def _clean(value: Any, where: str, allow_none: bool = False) -> Any:
    """A JSON-safe copy of ``value``; raises naming ``where`` for NaN/inf or unsupported types."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy scalar or 0-d tensor
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}: results must be finite numbers "
                             "(a NaN or inf usually means the run diverged; record something else or fix it)")
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a key {k!r} of type {type(k).__name__}: keys must be str")
            out[k] = _clean(v, f"{where}[{k!r}]", allow_none)
        return out
    if isinstance(value, (list, tuple)):
        return [_clean(v, f"{where}[{i}]", allow_none) for i, v in enumerate(value)]
    raise TypeError(f"{where} is a {type(value).__name__}, which cannot be recorded: use numbers, strings "
                    "and dicts/lists of them (convert tensors with .item() or .tolist())")


# --------------------------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------------------------

def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _provenance(exclude: tuple[str, ...] = ("results",)) -> tuple[str, bool | None]:
    """(short commit or "unknown", whether tracked code outside the ``exclude`` folders (what runs
    write themselves) has uncommitted changes; None when git cannot tell)."""
    commit = _git("rev-parse", "--short", "HEAD")
    if not commit:
        # a copy of the tree without git (a rented GPU machine): the commit it was copied from, if given
        return os.environ.get("COURSE_SOURCE_COMMIT", "").strip() or "unknown", None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":(exclude){d}" for d in exclude))
    return commit, (None if status is None else bool(status))


# --------------------------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------------------------

def _read(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON ({e}); fix or delete it") from e
    if not isinstance(data, dict) or set(data) - set(_MODES):
        raise ValueError(f"{file} is not a results file: expected an object with keys among {_MODES}, "
                         f"got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    for mode, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise ValueError(f"{file}: the {mode!r} entry has no 'metrics' object")
    return data


class RecordedFile(type(Path())):
    """The path ``record`` returns: a ``Path`` whose repr (what a notebook shows when the
    call ends a cell) names the file relative to the repository, not the machine's path."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_display_path(self)!r})"


def record(chapter: str, metrics: Mapping[str, Any], recipe, notes: str = "") -> Path:
    """Write ``metrics`` (measured with ``recipe``) as the ``recipe.mode`` entry of the chapter's
    results file, keeping the other recipe's entry. Returns the file's path (a ``RecordedFile``).

    ``metrics``: numbers (finite), strings, and nested dicts/lists of them.
    """
    _check_chapter(chapter)
    mode = getattr(recipe, "mode", None)
    if mode not in _MODES or not callable(getattr(recipe, "asdict", None)):
        raise TypeError(f"recipe must be a lib.config.Recipe (from config.recipe(ci=..., full=...)), got {recipe!r}")
    if not isinstance(metrics, Mapping) or not metrics:
        raise ValueError(f"metrics must be a non-empty dict, got {metrics!r}")
    if not isinstance(notes, str):
        raise TypeError(f"notes must be a str, got {type(notes).__name__}")
    from lib import device

    clean_metrics = _clean(metrics, "metrics")
    hparams = _clean(recipe.asdict(), "recipe hyper-parameter", allow_none=True)
    commit, dirty = _provenance()
    entry = {
        "metrics": clean_metrics,
        "hparams": hparams,
        "device": device.summary(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "notes": notes,
    }
    file = path(chapter, mode=mode)
    data = _read(file)
    data[mode] = entry
    text = json.dumps({m: data[m] for m in _MODES if m in data}, indent=2, ensure_ascii=False, allow_nan=False)
    with atomic_write(file, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return RecordedFile(file)


def load(chapter: str) -> dict[str, Any]:
    """The chapter's recorded entries, ``{"ci": {...}, "full": {...}}`` (either may be absent):
    the committed ``<repo>/results/<chapter>.json``, with the entries of
    ``$COURSE_RESULTS_DIR/<chapter>.json`` laid over it when that variable names another folder
    (of ``$COURSE_CI_RESULTS_DIR/<chapter>.json`` only its CI entry: a full entry there was left
    by an older version of the scripts and must not hide the committed one).
    Each entry also gets ``source``: the file it was read from. Nothing recorded: ``{}``."""
    committed = path(chapter, COMMITTED_DIR)
    data = _read(committed)
    for entry in data.values():
        entry.setdefault("source", _display_path(committed))
    scratch = path(chapter)
    explicit = bool(os.environ.get(ENV_VAR, "").strip())
    if scratch.resolve() != committed.resolve():
        for mode, entry in _read(scratch).items():
            if mode == "full" and not explicit:
                continue   # the CI scratch folder takes CI runs only: a full entry there is stale
            entry.setdefault("source", _display_path(scratch))
            data[mode] = entry
    return data


def full(chapter: str) -> dict[str, Any] | None:
    """The full-recipe metrics of ``chapter``, or None when no full run was recorded."""
    entry = load(chapter).get("full")
    return entry["metrics"] if entry else None


#: the metrics entries that name the checkpoints a page evaluated, ``{name: sha256 of the weights}``
CHECKPOINT_KEYS = ("checkpoints", "checkpoint")


def stale(chapter: str, live: Mapping[str, Any]) -> str | None:
    """A sentence when the recorded full run of ``chapter`` is older than the page that shows it:
    the top-level rows it has that ``live`` (this run's metrics) lacks, the ones it lacks, and the
    checkpoints whose weights differ (a ``checkpoints`` entry, ``{name: sha256}``, in both); None when
    both have the same rows and weights, or nothing full was recorded."""
    recorded = full(chapter)
    if not recorded:
        return None
    gone, new = sorted(set(recorded) - set(live)), sorted(set(live) - set(recorded))
    parts = []
    if gone:
        parts.append(f"its rows {', '.join(gone)} come from sections the page no longer has")
    if new:
        parts.append(f"it lacks {', '.join(new)}")
    for key in CHECKPOINT_KEYS:             # which weights the numbers came from: {name: sha256}
        theirs, ours = recorded.get(key), live.get(key)
        if isinstance(theirs, Mapping) and isinstance(ours, Mapping) and theirs != ours:
            other = sorted(n for n in set(theirs) | set(ours) if theirs.get(n) != ours.get(n))
            parts.append(f"it evaluated other weights of {', '.join(other)} than the page loads now")
    if not parts:
        return None
    return "the recorded full run predates this version of the page: " + " and ".join(parts)


def provenance(chapter: str) -> str | None:
    """A sentence when the recorded full run of ``chapter`` was not made as this page runs: with another
    PyTorch than the one running here (its device line names the version), or from a tree with
    uncommitted changes. None when it was, or when nothing is recorded."""
    entry = load(chapter).get("full")
    if not entry:
        return None
    import torch
    here = torch.__version__.split("+")[0]           # "2.13.0+cpu" -> "2.13.0", as device summaries write it
    reasons = []
    m = re.search(r"torch ([0-9][^\s|]*)", str(entry.get("device", "")))
    if m and m.group(1) != here:
        reasons.append(f"with PyTorch {m.group(1)}, not the {here} this page runs")
    if entry.get("dirty"):
        reasons.append(f"from commit {entry.get('commit', '?')} with uncommitted changes")
    if not reasons:
        return None
    return f"The recorded run in results/{chapter}.json was made " + ", and ".join(reasons) + "."


def _display_path(p: Path) -> str:
    """``p`` relative to the repository; outside it, relative to ``$COURSE_RESULTS_DIR`` or
    ``$COURSE_CI_RESULTS_DIR`` when it lies there (the build machine's folders are nobody else's business)."""
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        pass
    for var in (ENV_VAR, CI_ENV_VAR):
        folder = os.environ.get(var, "").strip()
        if folder:
            try:
                return str(Path(f"${var}") / p.resolve().relative_to(Path(folder).expanduser().resolve()))
            except ValueError:
                pass
    return str(p)


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}`` (lists are kept as values)."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        text = f"{value:.4g}"
        if "e" in text and 1.0 <= abs(value) < 1e15:  # 12345.6 -> "12346", not "1.235e+04"
            text = f"{value:.0f}"
        return text
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_format(v) for v in value) + "]"
    return str(value)


def _where(entry: Mapping[str, Any]) -> str:
    """'cuda (NVIDIA H100 80GB HBM3), 2026-11-22' from an entry's device summary and date."""
    dev = str(entry.get("device", "?"))
    m = re.match(r"device=([^|]+?)\s*(\||$)", dev)
    dev = m.group(1) if m else dev
    return f"{dev}, {str(entry.get('date', '?'))[:10]}"


def table(chapter: str, live: Mapping[str, Any] | None = None):
    """A DataFrame, one row per metric (nested dicts flattened to dotted names), one column per
    source: ``full recipe (device, date)`` from the results file, and ``this run (<mode>)`` for
    ``live`` (the metrics measured just now) or, without ``live``, the recorded CI entry.
    Values are formatted as text; a metric a column lacks shows "—". ``df.attrs["caption"]``
    says where the numbers come from."""
    import pandas as pd

    from lib import config

    data = load(chapter)
    columns: dict[str, dict[str, Any]] = {}
    notes = []
    if "full" in data:
        columns[f"full recipe ({_where(data['full'])})"] = flatten(data["full"]["metrics"])
        e = data["full"]
        notes.append(f"full recipe: {e.get('source')} (commit {e.get('commit')}"
                     f"{', uncommitted changes' if e.get('dirty') else ''}; {e.get('device')})")
    if live is not None:
        if not isinstance(live, Mapping):
            raise TypeError(f"live must be a dict of metrics or None, got {type(live).__name__}")
        columns[f"this run ({config.mode()})"] = flatten(_clean(live, "live"))
        notes.append("this run: measured by the cells above")
    elif "ci" in data:
        columns[f"recorded ci ({_where(data['ci'])})"] = flatten(data["ci"]["metrics"])
        e = data["ci"]
        notes.append(f"ci recipe: {e.get('source')} (commit {e.get('commit')}; {e.get('device')})")
    rows: list[str] = []
    for col in columns.values():
        rows.extend(k for k in col if k not in rows)
    df = pd.DataFrame({name: [_format(col[r]) if r in col else MISSING for r in rows]
                       for name, col in columns.items()}, index=pd.Index(rows, name="metric"))
    if not columns:
        notes.append(f"no results recorded yet for {chapter!r} (expected {_display_path(path(chapter, COMMITTED_DIR))})")
    df.attrs["caption"] = f"Results of {chapter}. " + "; ".join(notes)
    return df


class _Shown:
    """What ``show`` displays: the caption above the table, as HTML and as plain text."""

    def __init__(self, df, caption: str):
        self.df, self.caption = df, caption

    def _repr_html_(self) -> str:
        import html

        return (f"<div><p style='font-size:smaller'>{html.escape(self.caption)}</p>"
                f"{self.df.to_html()}</div>")

    def __repr__(self) -> str:
        return f"{self.caption}\n{self.df.to_string()}"


def show(chapter: str, live: Mapping[str, Any] | None = None) -> None:
    """Display ``table(chapter, live)`` with a caption naming the file, commit and device."""
    df = table(chapter, live)
    shown = _Shown(df, df.attrs["caption"])
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover
        print(repr(shown))
        return
    if get_ipython() is None:
        print(repr(shown))
    else:
        display(shown)


# --------------------------------------------------------------------------------------------
# Conclusions, as prose
# --------------------------------------------------------------------------------------------

class Reading:
    """An experiment's conclusion as the page shows it: one or two generated sentences as a paragraph
    (wrapped text, readable on a phone), and the secondary readings in a collapsed block under it.
    ``str()`` is the plain text (what a terminal prints)."""

    def __init__(self, sentences: Sequence[str], more: Sequence[str] = (), more_title: str = "More readings"):
        self.sentences = _sentences("sentences", sentences)
        if not self.sentences:
            raise ValueError("a reading needs at least one sentence")
        self.more = _sentences("more", more)
        self.more_title = more_title

    def _repr_html_(self) -> str:
        import html
        body = "<p>" + " ".join(html.escape(t) for t in self.sentences) + "</p>"
        if self.more:
            body += (f"<details><summary>{html.escape(self.more_title)}</summary>"
                     + "".join(f"<p>{html.escape(t)}</p>" for t in self.more) + "</details>")
        return f'<div class="course-reading">{body}</div>'

    def __str__(self) -> str:
        return "\n".join([" ".join(self.sentences), *(f"  {t}" for t in self.more)])

    __repr__ = __str__


def _sentences(name: str, texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not all(isinstance(t, str) and t.strip() for t in texts):
        raise TypeError(f"{name} must be a list of non-empty sentences (str), got {texts!r:.120}")
    return [t.strip() for t in texts]


def conclude(*sentences: str, more: Sequence[str] = (), more_title: str = "More readings") -> Reading:
    """Show an experiment's conclusion (see :class:`Reading`) and return it."""
    reading = Reading(list(sentences), more, more_title)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(reading)
    else:
        print(reading)
    return reading
