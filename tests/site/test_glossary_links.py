"""book/_ext/glossary_links.py without a build: which words of a page become links to the glossary.
The built pages are checked in tests/site/test_site.py."""
from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from docutils.core import publish_doctree

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import glossary_links as G  # noqa: E402

GLOSSARY = (ROOT / "glossary.md").read_text(encoding="utf-8")
ROWS = G.entries(GLOSSARY)


def _links(rst: str, lang: str = "en"):
    doctree = publish_doctree(rst)
    anchors = G.link_terms(doctree, ROWS, lang, "../glossary.html")
    refs = [(r.astext(), r["refuri"]) for r in doctree.findall(nodes.reference) if "glossary-term" in r["classes"]]
    return anchors, refs, doctree


def test_every_row_of_the_glossary_has_one_anchor_of_its_own():
    anchors = [anchor for anchor, _ in ROWS]
    assert len(ROWS) == len(G._i18n().glossary_rows(GLOSSARY)) >= 90
    assert len(anchors) == len(set(anchors))
    assert "term-multi-head-attention" in anchors and "term-sequence-to-sequence" in anchors


def test_the_first_use_of_a_term_is_linked_and_only_the_first():
    anchors, refs, _ = _links("Multi-head attention runs many heads. Multi-head attention is cheap.\n")
    assert refs == [("Multi-head attention", "../glossary.html#term-multi-head-attention")]
    # the shorter term inside it is not linked on its own; the next lone use of it is
    assert "term-attention" not in anchors
    anchors, refs, _ = _links("Multi-head attention runs heads.\n\nEach attention is one head.\n")
    assert [r[0] for r in refs] == ["Multi-head attention", "attention"]


def test_plurals_any_case_and_names_with_capitals():
    _, refs, _ = _links("Encoders and Decoders; the transformers of BLEU fame; a Transformer.\n")
    assert [r[0] for r in refs] == ["Encoders", "Decoders", "BLEU", "Transformer"]


def test_code_headings_links_and_everyday_words_are_left_alone():
    rst = ("Attention here\n==============\n\n``attention`` in code, `a link <http://x>`_ about attention,\n"
           "the key and the value.\n\n::\n\n    attention in a code block\n")
    anchors, refs, doctree = _links(rst)
    assert [r[0] for r in refs] == ["attention"]                  # the one in the paragraph's prose
    linked = [r for r in doctree.findall(nodes.reference) if "glossary-term" in r["classes"]]
    assert [type(r.parent) for r in linked] == [nodes.paragraph]  # not inside the ``literal``
    assert linked[0].previous_sibling().astext().endswith("about ")  # after the link, not in it
    assert not [r for r in refs if r[0] in ("key", "value")]


def test_korean_pages_link_the_korean_forms_with_their_particles():
    anchors, refs, _ = _links("멀티 헤드 어텐션은 여러 헤드를 씁니다. 셀프 어텐션과 어텐션이 있습니다.\n", "ko")
    assert [r[0] for r in refs] == ["멀티 헤드 어텐션", "셀프 어텐션", "어텐션"]
    # not inside a longer word
    anchors, refs, _ = _links("그래디언트인코더라는 말은 없습니다.\n", "ko")
    assert refs == []
