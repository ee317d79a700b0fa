"""A translated page keeps its heading anchors (book/_ext/course_site.py, ``_keep_heading_slugs``): a small
Sphinx project in Korean whose page has sections and an admonition with a translated title (the chapters'
"Run it yourself" box), and a second page linking one of those sections, built with warnings as errors."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PAGE = """# A chapter

## The two decoders

Some prose.

:::{admonition} Run it yourself
:class: dropdown

A command.
:::
"""
CATALOG = '''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

msgid "A chapter"
msgstr "한 장"

msgid "The two decoders"
msgstr "두 가지 디코더"

msgid "Some prose."
msgstr "설명."

msgid "Run it yourself"
msgstr "직접 실행해 보기"

msgid "A command."
msgstr "명령."
'''


def build(tmp: Path, extensions: list[str]) -> list[str]:
    """Build the project in a Sphinx process of its own (a Korean build installs Sphinx's translations for
    the whole process); returns the warnings it printed."""
    pytest.importorskip("myst_nb")
    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    src = tmp / "src"
    (src / "locales" / "ko" / "LC_MESSAGES").mkdir(parents=True)
    (src / "chapter.md").write_text(PAGE, encoding="utf-8")
    (src / "index.md").write_text("# Index\n\nSee [the decoders](chapter.md#the-two-decoders).\n\n"
                                  "```{toctree}\nchapter\n```\n", encoding="utf-8")
    with open(src / "locales" / "ko" / "LC_MESSAGES" / "chapter.mo", "wb") as f:
        write_mo(f, read_po(io.StringIO(CATALOG)))
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        f"extensions = {extensions!r}\n"
        "nb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['colon_fence']\n"
        "myst_heading_anchors = 3\n"
        "language = 'ko'\n"
        "locale_dirs = ['locales']\n"
        "gettext_compact = False\n")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "직접 실행해 보기" in (tmp / "out" / "chapter.html").read_text(encoding="utf-8")
    return [line for line in proc.stderr.splitlines() if "WARNING" in line]


def test_a_translated_admonition_title_keeps_the_pages_section_anchors(tmp_path):
    warnings = build(tmp_path, ["myst_nb", "course_site"])
    assert not [w for w in warnings if "xref_missing" in w or "local id not found" in w], warnings


def test_without_the_extension_the_anchor_is_lost(tmp_path):
    # what the extension repairs: MyST alone reports the section as missing in the Korean build
    warnings = build(tmp_path, ["myst_nb"])
    assert any("local id not found" in w and "the-two-decoders" in w for w in warnings), warnings
