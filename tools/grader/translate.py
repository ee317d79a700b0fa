"""The student notebooks in other languages: a master's Markdown cells cut into messages (its
paragraphs), and the English student notebook with each message replaced by its translation.

Only the text of Markdown cells changes: code and raw cells, ids, metadata (the public tests) and
the autograder zip are the English ones, so a translated notebook is graded exactly as the English
one. The translations are gettext catalogs, ``locales/<lang>/exercises/<chapter>/<name>.po``, kept
by tools/i18n.py (``update``, ``check``); see locales/README.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

LANGUAGES = ("ko",)      # the languages a student notebook is translated into (besides English)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def segments(markdown: str) -> list[tuple[str, bool]]:
    """A Markdown cell cut into pieces that join to it again: (text, is a message).

    A message is a paragraph: lines between blank lines, without its final line break. A fenced
    code block (blank lines inside it included), a display formula on its own (``$$ ... $$``), the
    blank lines and the line breaks between paragraphs are not messages."""
    out: list[tuple[str, bool]] = []
    block: list[str] = []

    def paragraph() -> None:
        if block:
            text = "".join(block)
            body = text.rstrip("\r\n")
            display = body.strip().startswith("$$") and body.strip().endswith("$$")
            out.append((body, bool(re.search(r"[^\W\d_]", body)) and not display))
            if text[len(body):]:
                out.append((text[len(body):], False))
            block.clear()

    fence = None
    for line in markdown.splitlines(keepends=True):
        if fence is not None:           # inside a fenced code block: until its closing fence
            block.append(line)
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                out.append(("".join(block), False))
                block.clear()
                fence = None
            continue
        m = _FENCE.match(line)
        if m:
            paragraph()
            block.append(line)
            fence = m.group(1)
        elif not line.strip():
            paragraph()
            out.append((line, False))
        else:
            block.append(line)
    if fence is not None:               # an unclosed fence runs to the end of the cell
        out.append(("".join(block), False))
    else:
        paragraph()
    return out


def messages(notebook: Path) -> list[tuple[str, int]]:
    """The messages of a notebook's Markdown cells, in order: (paragraph, number of its cell from 1)."""
    nb = nbformat.read(str(notebook), as_version=4)
    return [(text, i) for i, cell in enumerate(nb.cells, 1) if cell.cell_type == "markdown"
            for text, is_message in segments(cell.source) if is_message]


def translate(english: Path, out: Path, translations: dict[str, str]) -> int:
    """Write the notebook ``english`` to ``out`` with every message of its Markdown cells replaced by
    its translation (a message without one stays English); -> the number of messages left English."""
    nb = nbformat.read(str(english), as_version=4)
    missing = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        parts = []
        for text, is_message in segments(cell.source):
            if is_message and not translations.get(text):
                missing += 1
            parts.append(translations.get(text) or text if is_message else text)
        cell.source = "".join(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return missing


def differences(english: Path, translated: Path) -> list[str]:
    """Where a translated student notebook differs from the English one other than in the text of a
    Markdown cell (nothing else may differ: the grade would not be the same)."""
    en, tr = (json.loads(p.read_text(encoding="utf-8")) for p in (english, translated))
    out = [f"its notebook field {k!r} differs from the English notebook's"
           for k in sorted(set(en) | set(tr)) if k != "cells" and en.get(k) != tr.get(k)]
    cells_en, cells_tr = en.get("cells", []), tr.get("cells", [])
    if len(cells_en) != len(cells_tr):
        return out + [f"it has {len(cells_tr)} cells, the English notebook {len(cells_en)}"]
    for n, (a, b) in enumerate(zip(cells_en, cells_tr), 1):
        if a.get("cell_type") == "markdown" == b.get("cell_type"):
            a, b = ({k: v for k, v in c.items() if k != "source"} for c in (a, b))
        if a != b:
            out.append(f"cell {n} ({b.get('cell_type')}) differs from the English notebook's "
                       "(only the text of Markdown cells may)")
    return out
