"""Plots for the course: training curves, attention heatmaps (one head or every head of every
layer), a kernel-free attention explorer in HTML, positional encodings,
token highlighting in HTML, and the source of the ``lib`` code a chapter runs
(:func:`show_code`).

Importing this module registers the NanumGothic font that the ``koreanize-matplotlib``
wheel ships (without importing that package, which would restyle matplotlib) and sets
``font.family`` to ``["DejaVu Sans", "NanumGothic"]``: matplotlib then draws every glyph
with the first font of the list that has it (Latin, digits and the minus sign from
DejaVu Sans, Hangul from NanumGothic), so Korean and English labels mix freely. In a Jupyter
kernel it also makes the figures pixel-doubled PNGs (:func:`setup_inline_figures`: sharp at the
size the page shows them), and lets pandas pad its text tables by display width. Printed tables
with Korean pad with :func:`pad` (a Hangul syllable takes two columns of a monospaced font).

Every function returns the matplotlib ``Axes`` (or a string for HTML) and never calls
``plt.show()``; a notebook shows the figure of the last cell by itself.
"""
from __future__ import annotations

import html
import importlib.util
import inspect
import math
import unicodedata
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib import font_manager

__all__ = ["korean_font", "korean_font_path", "setup_fonts", "plot_history", "attention_heatmap",
           "plot_positional_encoding", "color_text_html", "show_html", "show_code", "SourceCode",
           "attention_grid", "attention_explorer", "attention_explorer_data", "ATTENTION_KINDS",
           "setup_inline_figures", "display_width", "pad", "setup_pandas"]

KOREAN_FONT_NAME = "NanumGothic"
LATIN_FONT_NAME = "DejaVu Sans"  # ships with matplotlib, so it is always there
_FONT_PACKAGE = "koreanize_matplotlib"


# ----------------------------------------------------------------------------- fonts

def korean_font_path() -> Path:
    """Path of ``NanumGothic.ttf`` inside the installed ``koreanize-matplotlib`` package.

    The package is located without being imported (its import restyles matplotlib).
    """
    spec = importlib.util.find_spec(_FONT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Korean font comes with the package 'koreanize-matplotlib', which is not "
                           "installed: pip install -c constraints.txt koreanize-matplotlib")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "fonts" / f"{KOREAN_FONT_NAME}.ttf"
        if path.is_file():
            return path
    raise RuntimeError(f"koreanize-matplotlib is installed at {list(spec.submodule_search_locations)} "
                       f"but has no fonts/{KOREAN_FONT_NAME}.ttf; reinstall it")


_registered = False


def korean_font() -> font_manager.FontProperties:
    """Register NanumGothic with matplotlib (once) and return its ``FontProperties``.

    Pass it as ``fontproperties=`` to force the Korean font on one text; normally
    :func:`setup_fonts` (run on import) makes every text fall back to it by itself.
    """
    global _registered
    path = korean_font_path()
    if not _registered:
        # all weights the wheel ships (Regular, Bold, ...), so bold Korean titles work too
        for ttf in sorted(path.parent.glob("*.ttf")):
            font_manager.fontManager.addfont(str(ttf))
        _registered = True
    return font_manager.FontProperties(family=KOREAN_FONT_NAME, fname=str(path))


def setup_fonts() -> list[str]:
    """Register the Korean font and put it after DejaVu Sans in ``font.family``.

    Returns the new ``font.family`` list. Called when ``lib.viz`` is imported; call it
    again after ``matplotlib.rcdefaults()`` or a style change.
    """
    korean_font()
    families = [LATIN_FONT_NAME, KOREAN_FONT_NAME]
    matplotlib.rcParams["font.family"] = families
    return families


try:
    setup_fonts()
except RuntimeError as _e:  # never make `import lib.viz` fail over a font
    warnings.warn(f"Korean labels will not render: {_e}", RuntimeWarning, stacklevel=2)


# ----------------------------------------------------------------------------- figures in a notebook

INLINE_FIGURE_FORMATS = {"retina"}


def setup_inline_figures() -> bool:
    """In a Jupyter kernel: show figures as pixel-doubled PNGs ("retina": rendered at twice the
    figure's dpi, shown at its size), so that a plot stays sharp on a high-density screen, when
    zoomed, and wherever the page shrinks it to its column. Returns whether a kernel was found
    (outside one, as in a script or a test, nothing changes). Called when ``lib.viz`` is imported,
    before or after pyplot: the inline backend reads the setting when it starts, and applies a
    change made later at once."""
    try:
        from IPython import get_ipython
        from matplotlib_inline.config import InlineBackend
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    InlineBackend.instance(parent=shell).figure_formats = set(INLINE_FIGURE_FORMATS)
    return True


setup_inline_figures()


# ----------------------------------------------------------------------------- text tables

def display_width(text: str) -> int:
    """The columns ``text`` takes in a monospaced font: wide and full-width characters (Hangul,
    CJK) take two, combining marks none, everything else one (Unicode's East Asian Width)."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in str(text))


def pad(text, width: int, align: str = "<") -> str:
    """``text`` padded with spaces to ``width`` display columns (see :func:`display_width`), the
    way ``f"{text:<{width}}"`` pads ASCII: ``align`` is ``"<"`` (left), ``">"`` (right) or ``"^"``.
    A printed table with Korean in a column stays aligned: ``f"{pad(name, 16)} {score:.2f}"``.
    Text wider than ``width`` is returned as it is."""
    if align not in ("<", ">", "^"):
        raise ValueError(f"align must be '<', '>' or '^', got {align!r}")
    text = str(text)
    room = max(0, width - display_width(text))
    left = {"<": 0, ">": room, "^": room // 2}[align]
    return " " * left + text + " " * (room - left)


def setup_pandas() -> bool:
    """Let pandas' text tables (``print(df)``, ``df.to_string()``) pad by display width too
    (``display.unicode.east_asian_width``), so that columns holding Korean line up. Called when
    ``lib.viz`` is imported; returns False where pandas is not installed."""
    try:
        import pandas as pd
    except ImportError:
        return False
    pd.set_option("display.unicode.east_asian_width", True)
    return True


setup_pandas()


# ----------------------------------------------------------------------------- helpers

def _to_numpy(name: str, x) -> np.ndarray:
    try:
        import torch
        if isinstance(x, torch.Tensor):
            x = x.detach().float().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is always installed in the course
        pass
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be an array or tensor of numbers, got {type(x).__name__}")
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an array or tensor of numbers, got {type(x).__name__}") from None
    return arr


def _new_ax(ax, figsize):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=figsize)
    return ax


def _records(history) -> list[dict]:
    """History-like -> list of dicts."""
    if hasattr(history, "records"):
        history = history.records
    if hasattr(history, "to_dict") and hasattr(history, "columns"):  # pandas DataFrame
        return history.to_dict("records")
    if isinstance(history, Mapping) or isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise TypeError("history must be a lib.train.History, a list of dicts or a pandas DataFrame, "
                        f"got {type(history).__name__}")
    for i, r in enumerate(history):
        if not isinstance(r, Mapping):
            raise TypeError(f"history[{i}] must be a dict, got {type(r).__name__}")
    return list(history)


def _is_number(v) -> bool:
    if v is None or isinstance(v, bool):
        return False
    try:
        return not math.isnan(float(v))
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- plots

def plot_history(history, keys: str | Sequence[str] = ("train_loss",), ax=None, x: str = "step",
                 title: str | None = None, logy: bool = False):
    """Plot the metrics ``keys`` of a training history against ``x`` (default ``"step"``).

    ``history``: a ``lib.train.History`` (anything with ``.records``), a list of dicts or
    a DataFrame. Each record that has a key contributes a point, so ``eval_*`` metrics
    logged once an epoch show as their own, sparser, line. Records without ``x`` use
    their position in the list.
    """
    recs = _records(history)
    if not recs:
        raise ValueError("history is empty: nothing to plot")
    if isinstance(keys, str):
        keys = [keys]
    keys = list(keys)
    if not keys:
        raise ValueError("keys is empty: name at least one metric, e.g. keys=['train_loss']")
    available = sorted({k for r in recs for k in r})
    missing = [k for k in keys if not any(_is_number(r.get(k)) for r in recs)]
    if missing:
        raise KeyError(f"history has no values for {missing}; it has {available}")
    ax = _new_ax(ax, (6, 3.5))
    for key in keys:
        xs, ys = [], []
        for i, r in enumerate(recs):
            if _is_number(r.get(key)):
                xs.append(float(r[x]) if _is_number(r.get(x)) else i)
                ys.append(float(r[key]))
        style = "o-" if len(xs) < 30 else "-"
        ax.plot(xs, ys, style, label=key, markersize=3)
    ax.set_xlabel(x)
    ax.set_ylabel(keys[0] if len(keys) == 1 else "value")
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def attention_heatmap(weights, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
                      ax=None, title: str | None = None, cmap: str = "viridis", colorbar: bool = True,
                      vmin: float | None = None, vmax: float | None = None):
    """Show a ``(T_query, T_key)`` attention matrix: rows = queries (``y_labels``),
    columns = keys (``x_labels``, written at 90°). A leading batch/head axis of size 1
    is dropped; larger ones must be indexed first (e.g. ``weights[0, head]``).

    The colour scale starts at 0 for weights (non-negative values), so a masked key
    is as dark as it gets; pass ``vmin``/``vmax`` to fix the scale across plots.
    Tensors may be on any device and require grad.
    """
    w = _to_numpy("weights", weights)
    while w.ndim > 2 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 2:
        raise ValueError(f"weights must be a 2-D (queries, keys) matrix, got shape {tuple(w.shape)}; "
                         "select one example and head first, e.g. weights[0, 0]")
    n_rows, n_cols = w.shape
    if vmin is None and w.size and np.nanmin(w) >= 0:
        vmin = 0.0
    for name, labels, n, what in (("x_labels", x_labels, n_cols, "columns (keys)"),
                                  ("y_labels", y_labels, n_rows, "rows (queries)")):
        if labels is not None:
            if isinstance(labels, str):
                raise TypeError(f"{name} must be a list of strings, got a single str")
            if len(labels) != n:
                raise ValueError(f"{name} has {len(labels)} labels but weights has {n} {what} "
                                 f"(shape {tuple(w.shape)})")
    ax = _new_ax(ax, (max(3.0, 0.45 * n_cols + 1.5), max(2.5, 0.4 * n_rows + 1.0)))
    im = ax.imshow(w, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax, interpolation="nearest")
    if x_labels is not None:
        ax.set_xticks(range(n_cols), [str(t) for t in x_labels], rotation=90)
    if y_labels is not None:
        ax.set_yticks(range(n_rows), [str(t) for t in y_labels])
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def attention_grid(weights, x_labels: Sequence[str] | None = None, y_labels: Sequence[str] | None = None,
                   title: str | None = None, columns: int | None = None, cell_size: float = 1.7,
                   cmap: str = "viridis"):
    """Every head of every layer: ``weights`` ``(layers, heads, queries, keys)`` (or the list of
    per-layer ``(1, heads, q, k)`` tensors ``Transformer.attention_weights`` returns) drawn as a
    grid of heatmaps titled "layer l, head h", all on the colour scale 0..1 (so heads compare).
    Each layer takes a row of ``columns`` heads (default: all of them; fewer wraps a layer over
    several rows, larger maps on a narrow page). Key labels go under the lowest map of each
    column, query labels left of the first column. Returns the ``Figure``. Used in
    chapters/04_transformer_chatbot.ipynb.
    """
    import matplotlib.pyplot as plt

    a = _layers_heads("weights", weights)
    L, H, Q, K = a.shape
    if L == 0 or H == 0:
        raise ValueError(f"weights has no layer or no head: shape {tuple(a.shape)}")
    from lib.validate import check_int

    columns = H if columns is None else min(check_int("columns", columns, minimum=1), H)
    per_layer = -(-H // columns)
    rows = L * per_layer
    fig, axes = plt.subplots(rows, columns, squeeze=False,
                             figsize=(cell_size * columns + 1.2, cell_size * rows * max(Q, 1) / max(K, 1) * 0.9 + 1.2))
    used = np.zeros((rows, columns), dtype=bool)
    for l in range(L):
        for h in range(H):
            r, c = l * per_layer + h // columns, h % columns
            used[r, c] = True
            ax = attention_heatmap(a[l, h], x_labels=x_labels, y_labels=y_labels, ax=axes[r, c], cmap=cmap,
                                   colorbar=False, vmin=0.0, vmax=1.0, title=f"layer {l + 1}, head {h + 1}")
            ax.title.set_fontsize(8)
            ax.tick_params(labelsize=7)
    for r in range(rows):
        for c in range(columns):
            ax = axes[r, c]
            if not used[r, c]:
                ax.set_visible(False)
                continue
            if used[r + 1:, c].any():              # another map below: no key labels here
                ax.set_xlabel("")
                ax.tick_params(labelbottom=False)
            if c > 0:
                ax.set_ylabel("")
                ax.tick_params(labelleft=False)
    fig.colorbar(axes[0, 0].images[0], ax=[ax for ax in axes.flat if ax.get_visible()], fraction=0.015, pad=0.01)
    if title:
        fig.suptitle(title)
    return fig


def plot_positional_encoding(pe, ax=None, title: str | None = "positional encoding", cmap: str = "RdBu"):
    """Show a ``(positions, d_model)`` positional-encoding matrix (a leading axis of size 1
    is dropped): position down, dimension across, values in a diverging colour map."""
    p = _to_numpy("pe", pe)
    while p.ndim > 2 and p.shape[0] == 1:
        p = p[0]
    if p.ndim != 2:
        raise ValueError(f"pe must be a 2-D (positions, d_model) matrix, got shape {tuple(p.shape)}")
    ax = _new_ax(ax, (7, 3.5))
    lim = float(np.nanmax(np.abs(p))) if p.size else 1.0
    im = ax.imshow(p, cmap=cmap, aspect="auto", vmin=-lim, vmax=lim, interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    if title:
        ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


# ----------------------------------------------------------------------------- HTML

def color_text_html(tokens: Sequence[str], weights, color: tuple[int, int, int] = (255, 80, 0),
                    normalize: bool = True) -> str:
    """Tokens as HTML ``<span>``s whose background opacity is proportional to their weight.

    With ``normalize=True`` the largest weight gets opacity 1 (weights must be >= 0);
    otherwise weights are used as opacities and must lie in [0, 1]. Tokens are
    HTML-escaped. Show the result with :func:`show_html`.
    """
    if isinstance(tokens, str):
        raise TypeError("tokens must be a list of strings, got a single str")
    tokens = list(tokens)
    w = _to_numpy("weights", weights)
    if w.ndim != 1:
        raise ValueError(f"weights must be 1-D (one per token), got shape {tuple(w.shape)}")
    if len(w) != len(tokens):
        raise ValueError(f"got {len(tokens)} tokens but {len(w)} weights")
    if not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite (no NaN or inf)")
    if (w < 0).any():
        raise ValueError(f"weights must be non-negative, got min {w.min():.4g}")
    if normalize:
        top = w.max() if w.size else 0.0
        alpha = w / top if top > 0 else np.zeros_like(w)
    else:
        if (w > 1).any():
            raise ValueError(f"with normalize=False weights are opacities in [0, 1], got max {w.max():.4g}")
        alpha = w
    r, g, b = color
    spans = []
    for tok, a, raw in zip(tokens, alpha, w):
        spans.append(f'<span style="background-color: rgba({r}, {g}, {b}, {a:.3f}); padding: 1px 2px; '
                     f'border-radius: 3px" title="{raw:.4f}">{html.escape(str(tok))}</span>')
    return '<div style="line-height: 1.9">' + " ".join(spans) + "</div>"


def show_html(html_text: str):
    """Display an HTML string in a notebook (returns the ``IPython.display.HTML`` object)."""
    if not isinstance(html_text, str):
        raise TypeError(f"html_text must be a str, got {type(html_text).__name__}")
    from IPython.display import HTML, display

    obj = HTML(html_text)
    display(obj)
    return obj


# ----------------------------------------------------------------------------- source code

_REPO = Path(__file__).resolve().parent.parent


class SourceCode:
    """The source of one or more functions, classes or modules, with file and line numbers.

    A Jupyter display object: in a notebook (and in the Jupyter Book page, which renders the
    stored ``text/html`` output) it shows each piece as syntax-highlighted code under a
    heading ``lib/models/transformer.py, lines 131-156``, the line numbers being those of the
    file. ``_repr_markdown_`` gives the same as Markdown code blocks and ``repr`` as plain
    text, for front ends without HTML. ``parts`` holds ``(name, path, first_line, source)``.
    """

    def __init__(self, parts: list[tuple[str, str, int, str]]):
        self.parts = parts

    @staticmethod
    def _title(name: str, path: str, first: int, source: str) -> str:
        last = first + source.count("\n") - (1 if source.endswith("\n") else 0)
        return f"{path}, lines {first}-{last}: {name}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        blocks = []
        for name, path, first, source in self.parts:
            code = highlight(source, PythonLexer(), HtmlFormatter(noclasses=True, linenos="inline",
                                                                   linenostart=first, style="friendly"))
            blocks.append('<div class="lib-source" style="margin: 0.6em 0">'
                          f'<div style="font-family: monospace; font-size: 0.85em; color: #555">'
                          f'{html.escape(self._title(name, path, first, source))}</div>'
                          f'<div style="overflow-x: auto; font-size: 0.85em">{code}</div></div>')
        return "\n".join(blocks)

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"`{self._title(*part)}`\n\n```python\n{part[3].rstrip()}\n```"
                            for part in self.parts)

    def __repr__(self) -> str:
        out = []
        for name, path, first, source in self.parts:
            lines = source.rstrip("\n").split("\n")
            width = len(str(first + len(lines) - 1))
            out.append(f"# {self._title(name, path, first, source)}\n" +
                       "\n".join(f"{first + i:>{width}}  {line}" for i, line in enumerate(lines)))
        return "\n\n".join(out)


def show_code(*objs) -> SourceCode:
    """The source code of ``objs`` (functions, classes, methods, modules), for a chapter to
    show the real ``lib`` code it runs. Put it last in a cell (or pass it to ``display``)::

        viz.show_code(transformer.EncoderLayer, transformer.DecoderLayer)

    Paths inside this repository are given relative to it (``lib/generate.py``). An object
    whose source cannot be found (a built-in, an instance) raises a ``TypeError``.
    """
    if not objs:
        raise TypeError("show_code needs at least one function, class, method or module")
    parts = []
    for obj in objs:
        target = inspect.unwrap(obj) if callable(obj) else obj
        try:
            lines, first = inspect.getsourcelines(target)
            path = Path(inspect.getsourcefile(target) or inspect.getfile(target)).resolve()
        except (TypeError, OSError) as err:
            raise TypeError(f"show_code needs a function, class, method or module defined in a Python "
                            f"file; no source for {obj!r} ({err})") from None
        try:
            shown = path.relative_to(_REPO).as_posix()
        except ValueError:
            shown = str(path)
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(obj))
        parts.append((name, shown, max(first, 1), "".join(lines)))
    return SourceCode(parts)


# ----------------------------------------------------------------------------- attention explorer

_EXPLORER_JS = Path(__file__).with_name("attention_explorer.js")
#: the attention kinds of an encoder-decoder: (label, which tokens are the queries, which the keys)
ATTENTION_KINDS = {"encoder_self": ("encoder self-attention", "source", "source"),
                   "decoder_self": ("decoder self-attention (masked)", "target", "target"),
                   "cross": ("cross-attention (decoder → encoder)", "target", "source")}
_explorer_count = 0


def _layers_heads(name: str, w) -> np.ndarray:
    """``(layers, heads, queries, keys)`` from a 4-D array/tensor or a list of per-layer
    ``(heads, q, k)`` / ``(1, heads, q, k)`` tensors (what ``Transformer.attention_weights`` gives)."""
    if isinstance(w, (list, tuple)):
        if not w:
            raise ValueError(f"{name} is an empty list; give one (heads, queries, keys) per layer")
        layers = []
        for i, layer in enumerate(w):
            a = _to_numpy(f"{name}[{i}]", layer)
            if a.ndim == 4 and a.shape[0] == 1:
                a = a[0]
            if a.ndim != 3:
                raise ValueError(f"{name}[{i}] must be (heads, queries, keys) or (1, heads, queries, "
                                 f"keys), got shape {tuple(a.shape)}")
            layers.append(a)
        if len({a.shape for a in layers}) > 1:
            raise ValueError(f"the layers of {name} differ in shape: {[a.shape for a in layers]}")
        return np.stack(layers)
    a = _to_numpy(f"{name}", w)
    if a.ndim != 4:
        raise ValueError(f"{name} must be (layers, heads, queries, keys), got shape {tuple(a.shape)}")
    return a


def _json_for_script(obj) -> str:
    """JSON that is safe inside ``<script>``: ``<``, ``>`` and ``&`` are written as ``\\u003c`` ...,
    so no token (``</script>``, ``<!--``) can end the element early."""
    import json

    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def attention_explorer_data(weights: Mapping, source_tokens: Sequence[str] | None = None,
                            target_tokens: Sequence[str] | None = None, decimals: int = 4) -> dict:
    """What :func:`attention_explorer` embeds as JSON, checked: ``{"kinds": [...]}``, one entry
    per kind in the order of ``weights``, each with ``name``, ``label``, ``queries`` and ``keys``
    (token strings), ``query_label``, ``key_label`` and ``weights`` as nested lists
    ``[layer][head][query][key]`` rounded to ``decimals``.

    ``weights``: ``{kind: (layers, heads, queries, keys)}`` with kind one of
    ``"encoder_self"`` (source x source), ``"decoder_self"`` (target x target) and ``"cross"``
    (target queries x source keys); a value may also be the list of per-layer tensors
    ``Transformer.attention_weights`` returns (batch of one). Every row must be a
    distribution (non-negative, summing to 1) or all zero (a query whose keys are all masked).
    """
    if not isinstance(weights, Mapping) or not weights:
        raise TypeError(f"weights must be a non-empty dict {{kind: (layers, heads, queries, keys)}}, "
                        f"got {type(weights).__name__ if not isinstance(weights, Mapping) else 'an empty dict'}")
    tokens = {}
    for side, toks in (("source", source_tokens), ("target", target_tokens)):
        if toks is None:
            continue
        if isinstance(toks, str) or not isinstance(toks, Sequence):
            raise TypeError(f"{side}_tokens must be a list of strings, got {type(toks).__name__}")
        tokens[side] = [str(t) for t in toks]
    decimals = int(decimals)
    kinds = []
    for name, w in weights.items():
        if name not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention kind {name!r}; expected one of {sorted(ATTENTION_KINDS)}")
        label, q_side, k_side = ATTENTION_KINDS[name]
        for side in {q_side, k_side}:
            if side not in tokens:
                raise ValueError(f"weights[{name!r}] needs {side}_tokens")
        a = _layers_heads(f"weights[{name!r}]", w)
        L, H, Q, K = a.shape
        if Q != len(tokens[q_side]) or K != len(tokens[k_side]):
            raise ValueError(f"weights[{name!r}] has shape (layers={L}, heads={H}, queries={Q}, keys={K}) but there "
                             f"are {len(tokens[q_side])} {q_side} tokens (queries) and {len(tokens[k_side])} "
                             f"{k_side} tokens (keys)")
        if Q == 0 or K == 0 or L == 0 or H == 0:
            raise ValueError(f"weights[{name!r}] is empty: shape {tuple(a.shape)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"weights[{name!r}] must be finite (no NaN or inf)")
        if (a < 0).any():
            raise ValueError(f"weights[{name!r}] must be non-negative (attention weights), got min {a.min():.4g}")
        sums = a.sum(-1)
        bad = ~(np.isclose(sums, 1.0, atol=1e-3) | np.isclose(sums, 0.0, atol=1e-6))
        if bad.any():
            l, h, q = np.argwhere(bad)[0]
            raise ValueError(f"weights[{name!r}]: every row must sum to 1 (a softmax over the keys) or be all zero; "
                             f"layer {l}, head {h}, query {q} sums to {sums[l, h, q]:.4g}")
        kinds.append({"name": name, "label": label, "queries": tokens[q_side], "keys": tokens[k_side],
                      "query_label": f"queries ({q_side})", "key_label": f"keys ({k_side})",
                      "weights": np.round(a, decimals).tolist()})
    return {"kinds": kinds}


def attention_explorer(weights: Mapping, source_tokens: Sequence[str] | None = None,
                       target_tokens: Sequence[str] | None = None, title: str | None = None, decimals: int = 4):
    """An interactive attention map that needs no kernel: hover (or tab to) a query token and the
    key tokens are shaded by the weight it gives them, with the numbers, for the layer, head
    (or all heads averaged) and attention kind chosen in the selectors.

    Arguments as :func:`attention_explorer_data`. Returns an ``IPython.display.HTML`` holding
    self-contained HTML, CSS, the weights as inline JSON and vanilla JavaScript
    (``lib/attention_explorer.js``; no library, no request), so it works in a notebook, in the
    executed notebook's output and on the static book page. Each call gets its own element ids,
    so several explorers can share a page; token text is inserted as text, never as HTML.
    Explained in chapters/04_transformer_chatbot.ipynb (tested in the built page by tests/site/test_site.py).
    """
    global _explorer_count
    import hashlib

    from IPython.display import HTML

    data = attention_explorer_data(weights, source_tokens, target_tokens, decimals)
    payload = _json_for_script(data)
    _explorer_count += 1
    uid = f"attnx-{hashlib.sha1(payload.encode()).hexdigest()[:10]}-{_explorer_count}"
    # the page's own fonts (on the book's site they include the Korean web font it serves)
    css = (f"#{uid} {{font-family: inherit; border: 1px solid #ccc; border-radius: 6px; padding: 0.6em; "
           f"margin: 0.5em 0; background: #fff; color: #222}}\n"
           f"#{uid} select {{font: inherit; margin-right: 0.8em; color: #222; background: #f6f6f6}}\n"
           f"#{uid} .attnx-row {{display: flex; flex-wrap: wrap; gap: 4px; align-items: flex-start; "
           f"margin: 0.4em 0}}\n"
           f"#{uid} .attnx-label {{width: 9em; font-size: 0.85em; color: #555}}\n"
           f"#{uid} .attnx-token {{display: inline-flex; flex-direction: column; align-items: center; "
           f"padding: 2px 5px; border: 1px solid #ddd; border-radius: 4px; cursor: default; "
           f"white-space: pre}}\n"
           f"#{uid} .attnx-query.attnx-active {{outline: 2px solid #e6550d}}\n"
           f"#{uid} .attnx-w {{font-size: 0.75em; color: #333; font-variant-numeric: tabular-nums}}\n"
           f"#{uid} .attnx-readout {{font-size: 0.85em; color: #444; margin-top: 0.3em}}")
    heading = f'<div class="attnx-title"><b>{html.escape(title)}</b></div>' if title else ""
    body = (f'<div class="attnx" id="{uid}"><style>{css}</style>{heading}'
            '<div><label>attention <select class="attnx-kind"></select></label>'
            '<label>layer <select class="attnx-layer"></select></label>'
            '<label>head <select class="attnx-head"></select></label></div>'
            '<div class="attnx-row"><span class="attnx-label attnx-qlabel"></span>'
            '<span class="attnx-queries attnx-row"></span></div>'
            '<div class="attnx-row"><span class="attnx-label attnx-klabel"></span>'
            '<span class="attnx-keys attnx-row"></span></div>'
            '<div class="attnx-readout"></div>'
            '<div style="font-size: 0.8em; color: #666">Hover over (or tab to) a query token: the keys are '
            'shaded by the weight it gives them, the numbers under them.</div></div>'
            f'<script type="application/json" id="{uid}-data">{payload}</script>'
            f'<script>{_EXPLORER_JS.read_text(encoding="utf-8")}({_json_for_script(uid)});</script>')
    return HTML(body)
