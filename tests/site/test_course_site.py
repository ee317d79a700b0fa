"""book/_ext/course_site.py without a build: the alt text it gives a plot, and the fonts it cuts for
code and outputs (Hangul exactly two columns of the monospaced font)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_korean_site_links_the_korean_student_notebooks(tmp_path, monkeypatch):
    """A download link to an English student notebook leads, on the Korean site, to the same set's Korean
    notebook where it was built (the {exercise-sets} list and the run box link from the root, a chapter
    from its folder); the English site and every other download are left alone."""
    import os
    from types import SimpleNamespace

    from docutils import nodes
    from sphinx import addnodes

    tool = course_site._exercises_tool()
    dist = tmp_path / "exercises" / "_dist"
    monkeypatch.setattr(tool, "DIST", dist)
    master = next(m for m in tool.discover() if m.key == "03_transformer/sdpa_padding")
    english, korean = master.student_nb(dist), master.student_nb(dist, "ko")
    english.parent.mkdir(parents=True)
    english.touch()
    assert course_site.student_notebook(english, "ko") == english      # not built: the English one
    korean.parent.mkdir()
    korean.touch()
    assert course_site.student_notebook(english, "ko") == korean
    assert course_site.student_notebook(english, "en") == english
    chapter = tmp_path / "chapters" / "03_transformer.ipynb"
    assert course_site.student_notebook(chapter, "ko") == chapter

    def relfn2path(target, docname):   # Sphinx's BuildEnvironment.relfn2path
        rel = target[1:] if target.startswith("/") else os.path.join(os.path.dirname(docname), target)
        return os.path.normpath(rel), os.path.normpath(os.path.join(tmp_path, rel))

    def site(language, docname, targets):
        doctree = nodes.section()
        for target in targets:
            doctree += addnodes.download_reference("", "", reftarget=target)
        app = SimpleNamespace(config=SimpleNamespace(language=language), srcdir=str(tmp_path),
                              env=SimpleNamespace(docname=docname, relfn2path=relfn2path))
        course_site._student_notebooks_in_the_site_language(app, doctree)
        return [ref["reftarget"] for ref in doctree.findall(addnodes.download_reference)]

    listed = "/" + english.relative_to(tmp_path).as_posix()
    from_chapter = "../" + english.relative_to(tmp_path).as_posix()
    ko = "/" + korean.relative_to(tmp_path).as_posix()
    assert site("ko", "exercise_sets", [listed, "/chapters/03_transformer.ipynb"]) == \
        [ko, "/chapters/03_transformer.ipynb"]
    assert site("ko", "chapters/03_transformer", [from_chapter]) == [ko]
    assert site(None, "exercise_sets", [listed]) == [listed]
    assert site("en", "chapters/03_transformer", [from_chapter]) == [from_chapter]
