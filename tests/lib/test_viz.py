"""lib.viz: Korean font fallback, heatmaps, curves, positional encodings, HTML highlighting."""
import html as html_lib
import os
import re
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib import font_manager, ft2font  # noqa: E402

from lib import viz  # noqa: E402

KOREAN = "영화 볼래?"
HANGUL = [c for c in KOREAN if "\uac00" <= c <= "\ud7a3"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _fallback_font_for(char: str) -> str:
    """The file matplotlib uses for ``char``: the first font of the font.family list that has it."""
    for family in matplotlib.rcParams["font.family"]:
        path = font_manager.fontManager.findfont(font_manager.FontProperties(family=family),
                                                 fallback_to_default=False)
        if ft2font.FT2Font(path).get_char_index(ord(char)) != 0:
            return path
    return ""


def _glyph_warnings(text: str) -> list[str]:
    fig, ax = plt.subplots()
    ax.set_title(text)
    ax.set_xticks([0, 1], [text, "plain"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


# ----------------------------------------------------------------------------- fonts

def test_korean_font_is_the_shipped_nanum_gothic():
    prop = viz.korean_font()
    path = Path(prop.get_file())
    assert path.name == "NanumGothic.ttf" and path.parent.parent.name == "koreanize_matplotlib"
    font = ft2font.FT2Font(str(path))
    assert font.family_name == "NanumGothic"
    assert all(font.get_char_index(ord(c)) != 0 for c in HANGUL)
    # located, not imported: importing koreanize_matplotlib would restyle matplotlib
    assert "koreanize_matplotlib" not in sys.modules


def test_font_family_falls_back_per_glyph_latin_then_hangul():
    families = list(matplotlib.rcParams["font.family"])
    assert families[:2] == ["DejaVu Sans", "NanumGothic"]
    for c in HANGUL:
        path = _fallback_font_for(c)
        assert Path(path).name == "NanumGothic.ttf"
        assert ft2font.FT2Font(path).get_char_index(ord(c)) != 0
    # Latin letters, digits and the minus sign keep the default font
    for c in "Aa1?\u2212":
        assert Path(_fallback_font_for(c)).name == "DejaVuSans.ttf"


def test_drawing_korean_raises_no_missing_glyph_warning():
    assert _glyph_warnings(KOREAN + " attention −1") == []


def test_without_the_korean_font_the_glyphs_are_missing():
    # the check above can fail: with the Latin font alone, matplotlib warns about Hangul
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}):
        missing = _glyph_warnings(KOREAN)
    assert missing and any("HANGUL" in m for m in missing)


def test_setup_fonts_restores_after_rcdefaults():
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        assert "NanumGothic" not in matplotlib.rcParams["font.family"]
        assert viz.setup_fonts() == ["DejaVu Sans", "NanumGothic"]
        assert _glyph_warnings(KOREAN) == []


# ----------------------------------------------------------------------------- heatmap

def test_attention_heatmap_labels_and_values():
    keys = ["영화", "볼래", "?", "<eos>"]
    queries = ["want", "a", "movie"]
    w = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    ax = viz.attention_heatmap(w, keys, queries, title="어텐션")
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == keys
    assert [t.get_text() for t in ax.get_yticklabels()] == queries
    assert all(t.get_rotation() == 90 for t in ax.get_xticklabels())
    assert np.allclose(ax.images[0].get_array(), w.numpy())
    assert ax.get_title() == "어텐션"
    assert len(ax.figure.axes) == 2  # the heatmap and its colorbar


def test_attention_heatmap_draws_on_given_axes_and_drops_unit_axes():
    fig, axes = plt.subplots(1, 2)
    w = torch.rand(1, 1, 2, 3)
    out = viz.attention_heatmap(w, ["a", "b", "c"], ["x", "y"], ax=axes[1], colorbar=False, cmap="magma")
    assert out is axes[1] and len(fig.axes) == 2
    assert out.images[0].get_array().shape == (2, 3)
    assert out.images[0].get_cmap().name == "magma"


def test_attention_heatmap_colour_scale():
    w = torch.tensor([[0.2, 0.8], [0.5, 0.5]], requires_grad=True)
    assert viz.attention_heatmap(w).images[0].get_clim() == (0.0, pytest.approx(0.8))
    scores = torch.tensor([[-2.0, 1.0], [0.5, 3.0]])  # raw scores may be negative
    assert viz.attention_heatmap(scores).images[0].get_clim() == (-2.0, 3.0)
    assert viz.attention_heatmap(w.detach(), vmin=0.1, vmax=1.0).images[0].get_clim() == (0.1, 1.0)


@pytest.mark.parametrize("weights, xl, yl, exc, match", [
    (torch.rand(2, 3, 4), None, None, ValueError, r"2-D \(queries, keys\).*\(2, 3, 4\)"),
    (torch.rand(4), None, None, ValueError, "2-D"),
    (torch.rand(2, 3), ["a", "b"], None, ValueError, "x_labels has 2 labels but weights has 3 columns"),
    (torch.rand(2, 3), None, ["a"], ValueError, "y_labels has 1 labels but weights has 2 rows"),
    (torch.rand(2, 3), "abc", None, TypeError, "single str"),
    ("not numbers", None, None, TypeError, "weights must be an array or tensor"),
])
def test_attention_heatmap_rejects_bad_input(weights, xl, yl, exc, match):
    with pytest.raises(exc, match=match):
        viz.attention_heatmap(weights, xl, yl)


# ----------------------------------------------------------------------------- history

RECORDS = [{"step": s, "epoch": 0, "train_loss": 3.0 / s} for s in range(1, 6)]
RECORDS[2]["eval_loss"] = 1.5
RECORDS[4]["eval_loss"] = 1.2


class FakeHistory:
    def __init__(self, records):
        self.records = records


@pytest.mark.parametrize("make", [list, FakeHistory, lambda r: __import__("pandas").DataFrame(r)],
                         ids=["list", "history", "dataframe"])
def test_plot_history_plots_each_metric_against_step(make):
    ax = viz.plot_history(make(RECORDS), ["train_loss", "eval_loss"])
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"train_loss", "eval_loss"}
    assert list(lines["train_loss"].get_xdata()) == [1, 2, 3, 4, 5]
    assert np.allclose(lines["train_loss"].get_ydata(), [3.0 / s for s in range(1, 6)])
    # eval metrics are logged sparsely: only the records that have them
    assert list(lines["eval_loss"].get_xdata()) == [3, 5]
    assert np.allclose(lines["eval_loss"].get_ydata(), [1.5, 1.2])
    assert ax.get_xlabel() == "step"


def test_plot_history_accepts_lib_train_history():
    train = pytest.importorskip("lib.train")
    ax = viz.plot_history(train.History(RECORDS), ["eval_loss"])
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [3, 5] and np.allclose(line.get_ydata(), [1.5, 1.2])


def test_plot_history_single_key_and_errors():
    ax = viz.plot_history(RECORDS, "train_loss", logy=True)
    assert [ln.get_label() for ln in ax.get_lines()] == ["train_loss"] and ax.get_yscale() == "log"
    with pytest.raises(KeyError, match=r"no values for \['val_acc'\].*train_loss"):
        viz.plot_history(RECORDS, ["val_acc"])
    with pytest.raises(ValueError, match="history is empty"):
        viz.plot_history([], "train_loss")
    with pytest.raises(TypeError, match="history must be"):
        viz.plot_history({"train_loss": [1, 2]}, "train_loss")
    with pytest.raises(ValueError, match="keys is empty"):
        viz.plot_history(RECORDS, [])


# ----------------------------------------------------------------------------- positional encoding

def test_plot_positional_encoding():
    pos = torch.arange(20.0)[:, None]
    dim = torch.arange(0, 16, 2.0)
    pe = torch.zeros(20, 16)
    pe[:, 0::2] = torch.sin(pos / 10000 ** (dim / 16))
    pe[:, 1::2] = torch.cos(pos / 10000 ** (dim / 16))
    ax = viz.plot_positional_encoding(pe[None])
    img = ax.images[0]
    assert np.allclose(img.get_array(), pe.numpy())
    vmin, vmax = img.get_clim()
    assert vmin == -vmax == pytest.approx(-float(pe.abs().max()))  # symmetric colour scale
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("dimension", "position")
    with pytest.raises(ValueError, match=r"2-D \(positions, d_model\).*\(2, 20, 16\)"):
        viz.plot_positional_encoding(torch.stack([pe, pe]))


# ----------------------------------------------------------------------------- HTML

def _alphas(html_text: str) -> list[float]:
    return [float(a) for a in re.findall(r"rgba\(\d+, \d+, \d+, ([0-9.]+)\)", html_text)]


def test_color_text_html_escapes_and_orders_alpha_by_weight():
    tokens = ["<script>", "영화", "a&b", '"q"']
    weights = torch.tensor([0.1, 0.6, 0.05, 0.25])
    out = viz.color_text_html(tokens, weights)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "a&amp;b" in out and "&quot;q&quot;" in out and "영화" in out
    alphas = _alphas(out)
    assert len(alphas) == 4
    assert np.argsort(alphas).tolist() == np.argsort(weights.numpy()).tolist()
    assert max(alphas) == 1.0
    assert np.allclose(alphas, (weights / weights.max()).numpy(), atol=1e-3)
    # tokens appear in order
    positions = [out.index(t) for t in ["&lt;script&gt;", "영화", "a&amp;b", "&quot;q&quot;"]]
    assert positions == sorted(positions)


def test_color_text_html_raw_opacities_and_errors():
    assert _alphas(viz.color_text_html(["a", "b"], [0.2, 0.4], normalize=False)) == [0.2, 0.4]
    assert _alphas(viz.color_text_html(["a", "b"], [0.0, 0.0])) == [0.0, 0.0]
    with pytest.raises(ValueError, match="got 2 tokens but 3 weights"):
        viz.color_text_html(["a", "b"], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="non-negative"):
        viz.color_text_html(["a"], [-0.1])
    with pytest.raises(ValueError, match="1-D"):
        viz.color_text_html(["a"], [[0.1]])
    with pytest.raises(ValueError, match="finite"):
        viz.color_text_html(["a"], [float("nan")])
    with pytest.raises(ValueError, match=r"opacities in \[0, 1\]"):
        viz.color_text_html(["a"], [2.0], normalize=False)
    with pytest.raises(TypeError, match="single str"):
        viz.color_text_html("ab", [0.1, 0.2])


def test_show_html_returns_the_html_object(capsys):
    obj = viz.show_html("<b>영화</b>")
    assert obj.data == "<b>영화</b>"
    with pytest.raises(TypeError, match="html_text must be a str"):
        viz.show_html(3)


# ----------------------------------------------------------------------------- show_code

def test_show_code_gives_file_lines_and_the_exact_source():
    import inspect

    from lib import generate

    code = viz.show_code(generate.top_k_filter, generate.Generation)
    lines, first = inspect.getsourcelines(generate.top_k_filter)
    last = first + len(lines) - 1
    title = f"lib/generate.py, lines {first}-{last}: top_k_filter"
    # plain text: the title, then every source line after its line number in the file
    text = repr(code).split("\n\n")[0].splitlines()
    assert text[0] == "# " + title
    assert text[1:] == [f"{first + i:>{len(str(last))}}  {l.rstrip(chr(10))}" for i, l in enumerate(lines)]
    # markdown: a Python code block holding the source exactly
    md = code._repr_markdown_()
    assert f"`{title}`\n\n```python\n{''.join(lines).rstrip()}\n```" in md
    assert "Generation" in md and md.count("```python") == 2
    # html: highlighted (keywords in styled spans), with the file's line numbers, text unchanged
    page = code._repr_html_()
    assert html_lib.escape(title) in page and "lib/generate.py" in page
    assert re.search(r'<span style="[^"]*">def</span>', page)
    numbers = [int(n) for n in re.findall(r'padding-right: 5px;">\s*(\d+)</span>', page)]
    assert numbers[:len(lines)] == list(range(first, last + 1))
    plain = html_lib.unescape(re.sub(r"<[^>]+>", "", page))
    assert "kth = torch.topk(logits, k, dim=-1).values[..., -1:]" in plain


def test_show_code_methods_and_classes_of_the_models():
    from lib.models import transformer

    code = viz.show_code(transformer.Transformer.decode)
    name, path, first, source = code.parts[0]
    assert path == "lib/models/transformer.py" and name == "Transformer.decode"
    assert source.lstrip().startswith("def decode(")
    with open(transformer.__file__) as f:
        assert f.read().splitlines()[first - 1].strip().startswith("def decode(")


@pytest.mark.parametrize("obj", [len, 3, "x"])
def test_show_code_rejects_objects_without_source(obj):
    with pytest.raises(TypeError, match="show_code"):
        viz.show_code(obj)
    with pytest.raises(TypeError, match="at least one"):
        viz.show_code()


# ----------------------------------------------------------------------------- figures in a notebook

_KERNEL_FIGURE = r"""
import json
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
%s
import matplotlib.pyplot as plt
%s
fig, ax = plt.subplots(figsize=(4, 2))
ax.plot([0, 1], [1, 0])
data, meta = shell.display_formatter.format(fig)
from PIL import Image
import io
import base64
png = data["image/png"]
png = Image.open(io.BytesIO(base64.b64decode(png) if isinstance(png, str) else png))
print(json.dumps({"pixels": list(png.size), "shown": meta.get("image/png", {})}))
"""


@pytest.mark.parametrize("order", ["viz before pyplot", "viz after pyplot"])
def test_a_kernel_shows_figures_pixel_doubled_at_their_size(order):
    # In a kernel the inline backend turns a figure into a PNG. After `import lib.viz` (imported
    # before or after pyplot), that PNG has twice the pixels of the figure's size and tells the
    # page to show it at that size: sharp when the page shrinks it, zooms, or on a dense screen.
    import json
    import subprocess

    before = order == "viz before pyplot"
    code = _KERNEL_FIGURE % ("from lib import viz" if before else "", "" if before else "from lib import viz")
    env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}   # as ipykernel sets it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    dpi = matplotlib.rcParams["figure.dpi"]
    width, height = got["pixels"]
    assert got["shown"].get("width") == width // 2 and got["shown"].get("height") == height // 2, got
    assert width >= 2 * 4 * dpi * 0.9, f"{width} px for a 4-inch figure at {dpi} dpi: not pixel-doubled"


def test_setup_inline_figures_outside_a_kernel_changes_nothing():
    assert viz.setup_inline_figures() is False


# ----------------------------------------------------------------------------- text tables

def test_display_width_counts_hangul_as_two_columns():
    assert viz.display_width("abc") == 3
    assert viz.display_width("영화") == 4
    assert viz.display_width("12시 땡!") == 8
    assert viz.display_width("e\u0301") == 1          # a combining accent takes no column


def test_pad_aligns_korean_columns_like_ascii():
    rows = [("영화 정말 [MASK]", "좋다 0.31"), ("a movie", "good 0.20"), ("[MASK] 최고의 영화", "이 0.12")]
    lines = [f"{viz.pad(a, 20)} {b}" for a, b in rows]
    # the second column starts at the same display column on every line
    assert {viz.display_width(line[:line.rindex(b)]) for line, (_, b) in zip(lines, rows)} == {21}
    assert viz.pad("가", 5, ">") == "   가" and viz.pad("가", 6, "^") == "  가  " and viz.pad("ab", 5, "^") == f"{'ab':^5}"
    assert viz.pad("너무 긴 텍스트", 4) == "너무 긴 텍스트"
    # ASCII pads exactly as str.format does
    assert viz.pad("abc", 7) == f"{'abc':<7}" and viz.pad("abc", 7, ">") == f"{'abc':>7}"
    with pytest.raises(ValueError, match="align"):
        viz.pad("x", 3, "=")


def test_pandas_text_tables_pad_korean_by_display_width():
    import pandas as pd

    text = pd.DataFrame({"question": ["12시 땡!", "hello"], "n": [1, 22]}).to_string(index=False)
    lines = text.splitlines()
    assert len({viz.display_width(line) for line in lines}) == 1, text
