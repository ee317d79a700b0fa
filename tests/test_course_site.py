"""book/_ext/course_site.py without a build: the alt text it gives a plot, and the fonts it cuts for
code and outputs (Hangul exactly two columns of the monospaced font)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import course_site  # noqa: E402


def test_alt_text_says_what_kind_of_plot_and_what_it_shows():
    line = 'fig, ax = plt.subplots()\nax.plot(steps, loss)\nax.set(xlabel="step", ylabel=f"loss ({unit})")'
    assert course_site.describe_plot(line) == "A line plot drawn by the code cell above: step; loss (…)."
    panels = ('for ax, m, title in zip(axes, (a, b), ("padding mask (keys)", "look-ahead mask")):\n'
              '    viz.attention_heatmap(m, ax=ax, title=title)')
    assert course_site.describe_plot(panels) == \
        "A heatmap drawn by the code cell above: padding mask (keys); look-ahead mask."
    only_fields = 'viz.attention_heatmap(w, title=f"{prompt} → {answer}")'
    assert course_site.describe_plot(only_fields) == \
        "A heatmap drawn by the code cell above: attention weights, queries down and keys across."


def test_code_text_is_what_pre_and_code_elements_hold():
    page = '<p>영화</p><pre><span class="n">x</span> = &quot;가&quot;</pre><p><code class="literal">lib</code></p>'
    assert course_site.code_text_in(page) == 'x = "가"lib'


def test_hangul_in_code_is_two_columns_of_the_code_font():
    fontTools = pytest.importorskip("fontTools.ttLib")
    text = "영화 정말 재밌어요각"
    hangul = {c for c in text if course_site.HANGUL.match(c)}
    font = fontTools.TTFont(io.BytesIO(course_site.hangul_mono_font(hangul)))
    mono = fontTools.TTFont(io.BytesIO(course_site.mono_font(set("abc"))))
    column = mono["hmtx"][mono.getBestCmap()[ord("a")]][0] / mono["head"].unitsPerEm
    assert column == pytest.approx(0.602, abs=0.001)
    upm, cmap = font["head"].unitsPerEm, font.getBestCmap()
    for ch in hangul:
        name = cmap[ord(ch)]
        advance = font["hmtx"][name][0] / upm
        assert advance == pytest.approx(2 * column, abs=0.5 / upm), f"{ch} is {advance:.4f} em wide"
        glyph = font["glyf"][name]
        assert glyph.numberOfContours > 0, f"{ch} has no outline"
        left, right = glyph.xMin, font["hmtx"][name][0] - glyph.xMax
        assert abs(left - right) < 0.1 * upm, f"{ch} is not centred in its two columns ({left}, {right})"
    assert font["name"].getDebugName(1) == course_site.HANGUL_MONO_FAMILY
    assert mono["name"].getDebugName(1) == course_site.MONO_FAMILY
