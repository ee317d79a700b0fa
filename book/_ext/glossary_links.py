"""Glossary links: every chapter links the first use of each glossary term to its entry.

``glossary.md`` is one table per part (English | Korean | Defined in). This extension gives each
row of those tables an anchor (``term-<first English form>``, the same in both languages) and, on
every chapter page, turns the first use of each term in the prose into a link to it, with the term
in the other language as the link's title. It works on the page as the reader gets it, after the
translation is applied: the English site links the English words, the Korean site the Korean ones
(the glossary's forms of each term, read by ``tools/i18n.py``, the same forms its glossary check
uses). No message of any page changes, so the catalogs are not touched.

What is prose: text inside paragraphs, list items and table cells; never headings, code, math,
outputs of code cells, existing links, or the run box. A term inside a longer term ("attention" in
"multi-head attention") is not linked on its own: the longer one wins.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = "glossary"
PAGES = ("chapters/", "part3")          # the pages whose prose is linked (docname prefixes)
# Rows whose words are everyday English as often as they are the term ("the value of", "a key
# fact", "GPU memory"): linking every first "value" would mislead more than help.
EVERYDAY = {"query", "key", "value", "memory"}
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
# what is never prose: code, math, links, headings, raw HTML, the cells' outputs, the run box
_SKIP_NODES = (nodes.FixedTextElement, nodes.literal, nodes.math, nodes.reference, nodes.title,
               nodes.raw, nodes.target, nodes.footnote_reference, nodes.citation_reference,
               nodes.image, nodes.caption, nodes.rubric)
_SKIP_CLASSES = {"cell_output", "cell_input", "output", "course-run-box", "course-translation-pending"}


@dataclass(frozen=True)
class Entry:
    anchor: str                          # the row's id on the glossary page
    english: tuple[str, ...]             # the forms the English prose may use
    korean: tuple[str, ...]              # the forms the Korean prose may use
    title: dict                          # {"en": ..., "ko": ...}: the link's title per language

    @property
    def key(self) -> tuple[str, str]:
        """One term (a row such as ``encoder, decoder`` has two, each linked at its first use)."""
        return self.anchor, self.english[0]


def _i18n():
    from course_site import _tool

    return _tool("i18n")


@functools.lru_cache(maxsize=4)
def entries(text: str) -> tuple[tuple[str, tuple[Entry, ...]], ...]:
    """Per table row of glossary.md (``text``), its anchor and its terms (``encoder, decoder`` is one
    row, two terms, one anchor); a row of everyday words has an anchor and no term to link. Read once
    per build, not once per page."""
    i18n = _i18n()
    out = []
    for cells in i18n.glossary_rows(text):
        english_cell, korean_cell = cells[:2]
        terms = i18n.row_terms(cells)
        anchor = "term-" + nodes.make_id(terms[0].english[0] if terms and terms[0].english else english_cell)
        row = []
        for term in terms:
            english = tuple(f for f in term.english if f.split()[0].lower() not in ("of", "the", "a", "an"))
            if not english or english[0].lower() in EVERYDAY:
                continue
            # the Korean forms in Hangul, or a Latin name that is also an English form (MoE, AR)
            korean = tuple(f for f in term.korean if _HANGUL.search(f) or f in term.english)
            row.append(Entry(anchor, english, korean, {"en": f"{english_cell} · {korean_cell}",
                                                       "ko": f"{korean_cell} · {english_cell}"}))
        out.append((anchor, tuple(row)))
    return tuple(out)


def _pattern(form: str, lang: str) -> re.Pattern:
    """One form as the prose writes it: English words with spaces or hyphens between them, a plural
    ending, whole words only, any case unless the form has capitals (Transformer, BLEU); Korean forms
    with or without their spaces, not inside a longer Hangul word but followed by any particle."""
    words = [re.escape(w) for w in re.split(r"[\s-]+", form) if w]
    if lang == "ko" and _HANGUL.search(form):
        return re.compile(r"(?<![\uac00-\ud7a3])" + r"[\s-]?".join(words))
    body = r"[\s-]".join(words)
    flags = 0 if any(c.isupper() for c in form) else re.I
    return re.compile(rf"(?<![\w-]){body}(?:s|es)?(?![\w-])", flags)


def matches(text: str, patterns: list[tuple[Entry, re.Pattern]]) -> list[tuple[int, int, Entry]]:
    """Every use of a term in ``text``, the longer one where two overlap: (start, end, entry)."""
    found = [(m.start(), m.end(), entry) for entry, p in patterns for m in p.finditer(text)]
    found.sort(key=lambda f: (f[0], -(f[1] - f[0])))
    kept, end = [], -1
    for start, stop, entry in found:
        if start >= end:
            kept.append((start, stop, entry))
            end = stop
    return kept


def _is_prose(node: nodes.Node) -> bool:
    parent = node.parent
    in_block = False
    while parent is not None:
        if isinstance(parent, _SKIP_NODES):
            return False
        if isinstance(parent, nodes.Element) and _SKIP_CLASSES & set(parent.get("classes", [])):
            return False
        if isinstance(parent, (nodes.paragraph, nodes.list_item, nodes.entry)):
            in_block = True
        parent = parent.parent
    return in_block


def link_terms(doctree: nodes.document, rows, lang: str, href: str) -> list[str]:
    """Link the first use of every term on the page; returns the anchors linked, in page order."""
    forms = "korean" if lang == "ko" else "english"
    patterns = [(e, _pattern(f, lang)) for _, row in rows for e in row for f in getattr(e, forms)]
    done: set[str] = set()
    linked = []
    for text in [t for t in doctree.findall(nodes.Text) if _is_prose(t)]:
        hits = [h for h in matches(str(text), patterns) if h[2].key not in done]
        first = {}
        for start, stop, entry in hits:
            first.setdefault(entry.key, (start, stop, entry))
        if not first:
            continue
        pieces, at = [], 0
        for start, stop, entry in sorted(first.values(), key=lambda h: h[0]):
            word = str(text)[start:stop]
            pieces.append(nodes.Text(str(text)[at:start]))
            pieces.append(nodes.reference(word, word, refuri=f"{href}#{entry.anchor}",
                                          reftitle=entry.title.get(lang, entry.title["en"]),
                                          classes=["glossary-term"], internal=True))
            done.add(entry.key)
            linked.append(entry.anchor)
            at = stop
        pieces.append(nodes.Text(str(text)[at:]))
        text.parent.replace(text, [p for p in pieces if not (isinstance(p, nodes.Text) and not str(p))])
    return linked


def _anchor_rows(doctree: nodes.document, rows) -> None:
    """Give each row of the glossary's tables its anchor (the rows in source order)."""
    body_rows = [r for tbody in doctree.findall(nodes.tbody) for r in tbody.children if isinstance(r, nodes.row)]
    if len(body_rows) != len(rows):
        raise RuntimeError(f"glossary_links: glossary.md has {len(rows)} term rows but its page "
                           f"{len(body_rows)}: is every table of it English | Korean | Defined in?")
    for row, (anchor, _) in zip(body_rows, rows):
        row["ids"].append(anchor)


def _on_resolved(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if app.builder.format != "html":         # the gettext builder extracts messages: leave them be
        return
    from course_site import site_language

    rows = entries((ROOT / f"{GLOSSARY}.md").read_text(encoding="utf-8"))
    if docname == GLOSSARY:
        _anchor_rows(doctree, rows)
    elif docname.startswith(PAGES):
        link_terms(doctree, rows, site_language(app.config), app.builder.get_relative_uri(docname, GLOSSARY))


def setup(app: Sphinx) -> dict:
    app.connect("doctree-resolved", _on_resolved)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
