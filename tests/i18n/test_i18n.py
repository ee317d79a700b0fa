"""The Korean edition's catalogs (tools/i18n.py, locales/README.md), without building the site.

Every page not listed in locales/ko/PENDING has a Korean catalog that is complete (no untranslated
or fuzzy message), up to date with its page (its messages extracted again now, with
``sphinx-build -b gettext``, and compared), and uses the glossary's Korean term wherever its English
uses a term of glossary.md. The extraction reads the notebooks as stored: it runs no chapter.
The other tests make the check fail on purpose, on a copy of the catalogs.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import course_site  # noqa: E402


def _load_i18n():
    spec = importlib.util.spec_from_file_location("course_i18n_tool", ROOT / "tools" / "i18n.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("course_i18n_tool", module)
    spec.loader.exec_module(module)
    return module


i18n = _load_i18n()


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Every page's messages, extracted now (a few seconds: the notebooks are read, not run)."""
    return i18n.extract(tmp_path_factory.mktemp("gettext"))


def test_every_page_has_messages_and_the_chapters_are_extracted(templates):
    pages = {p.relative_to(ROOT).with_suffix("").as_posix() for p in ROOT.glob("*.md")} - {"README", "CONTRIBUTING"}
    chapters = {p.relative_to(ROOT).with_suffix("").as_posix() for p in (ROOT / "chapters").glob("*.ipynb")}
    assert pages | chapters <= set(templates), f"pages without a template: {sorted(pages | chapters - set(templates))}"
    assert sum(len(i18n.messages(templates[c])) for c in chapters) > 300, "the chapters' Markdown cells were not extracted"
    # display math and code are never messages
    for docname, template in templates.items():
        for m in i18n.messages(template):
            assert "\\operatorname" not in m.id or "$" in m.id, f"{docname}: a display formula is a message"
            assert not m.id.startswith(("import ", "from ", "bash tools/")), f"{docname}: code is a message: {m.id[:60]}"


def test_the_korean_catalogs_are_complete_current_and_use_the_glossary(templates):
    problems = i18n.check(templates)
    assert not problems, f"{len(problems)} problems (python tools/i18n.py update, then translate):\n  " + \
        "\n  ".join(problems[:20])


def test_the_translated_pages_are_the_non_chapter_pages():
    todo = set(i18n.pending())
    for page in ("intro", "getting_started", "exercise_sets", "bibliography", "glossary"):
        assert page not in todo, f"{page} is listed as pending"
        assert (i18n.catalogs_dir() / f"{page}.po").exists()
    chapters = {f"chapters/{p.stem}" for p in (ROOT / "chapters").glob("*.ipynb")}
    # a chapter is either pending or translated; a translated one has a full catalog (checked above)
    for chapter in chapters - todo:
        assert (i18n.catalogs_dir() / f"{chapter}.po").exists(), f"{chapter} is not pending and has no catalog"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A copy of locales/ that the check reads instead of the real one."""
    copy = tmp_path / "locales"
    shutil.copytree(i18n.LOCALES, copy, ignore=shutil.ignore_patterns("*.mo"))
    monkeypatch.setattr(i18n, "LOCALES", copy)
    return copy


def _edit(path: Path, change) -> None:
    catalog = i18n.read_catalog(path)
    change(catalog)
    i18n.write_catalog(path, catalog)


def _intro(scratch: Path) -> Path:
    return scratch / "ko" / "LC_MESSAGES" / "intro.po"


def test_the_check_fails_on_an_untranslated_message(templates, scratch):
    assert not i18n.check(templates)
    _edit(_intro(scratch), lambda c: setattr(i18n.messages(c)[-1], "string", ""))
    assert any("untranslated" in p for p in i18n.check(templates))


def test_the_check_fails_on_a_fuzzy_message(templates, scratch):
    _edit(_intro(scratch), lambda c: i18n.messages(c)[-1].flags.add("fuzzy"))
    assert any("fuzzy" in p for p in i18n.check(templates))


def test_the_check_fails_when_a_page_changed_and_its_catalog_did_not(templates, scratch):
    changed = dict(templates)
    template = i18n.read_catalog(_intro(scratch))        # a stand-in for a fresh extraction of intro
    message = i18n.messages(template)[-1]
    template.delete(message.id)
    assert message.id.startswith("Each chapter ends")
    template.add(message.id.replace("Each chapter ends", "Every chapter ends"), "")
    changed["intro"] = template
    problems = i18n.check(changed)
    assert any("lacks: 'Every chapter ends" in p for p in problems), problems
    assert any("no longer has: 'Each chapter ends" in p for p in problems), problems


def test_the_check_fails_on_a_missing_catalog_and_on_a_stale_pending_entry(templates, scratch):
    (scratch / "ko" / "LC_MESSAGES" / "getting_started.po").unlink()
    with (scratch / "ko" / "PENDING").open("a", encoding="utf-8") as f:
        f.write("chapters/99_no_such_chapter\n")
    problems = i18n.check(templates)
    assert any("getting_started: no Korean catalog" in p for p in problems), problems
    assert any("99_no_such_chapter" in p for p in problems), problems


def test_the_check_fails_when_a_glossary_term_is_not_used(templates, scratch):
    def drop_term(catalog):
        for m in i18n.messages(catalog):
            if "multi-head attention" in m.id:
                m.string = m.string.replace("멀티 헤드 어텐션", "다중 머리 주의")
                return
        raise AssertionError("intro no longer says multi-head attention")

    _edit(_intro(scratch), drop_term)
    problems = i18n.check(templates)
    assert any("multi-head attention" in p.lower() and "멀티 헤드 어텐션" in p for p in problems), problems


def test_glossary_terms_are_read_with_their_variants():
    terms = i18n.glossary_terms((ROOT / "glossary.md").read_text(encoding="utf-8"))
    by_english = {e.lower(): t for t in terms for e in t.english}
    assert len(terms) >= 100, len(terms)
    assert by_english["query"].korean == ("쿼리",)
    assert set(by_english["value"].korean) == {"값", "밸류"}
    assert by_english["bahdanau attention"] is by_english["additive attention"]
    assert "사전 학습" in by_english["pretraining"].korean
    assert by_english["seq2seq"] is by_english["sequence-to-sequence"]


def test_the_glossary_check_matches_words_not_parts_of_words():
    terms = [i18n.Term(("key",), ("키",))]

    class Message:
        def __init__(self, id, string):
            self.id, self.string, self.context, self.fuzzy = id, string, None, False

    def problems(english, korean):
        return i18n.glossary_problems("p", [Message(english, korean)], terms, [])

    assert problems("the key is here", "값이 여기 있다")            # the term, not its Korean
    assert not problems("the keys are here", "키들이 여기 있다")     # plural, Korean with a particle
    assert not problems("a keyboard", "자판")                        # part of a word
    assert not problems("`key` in code", "코드의 `key`")             # inline code is not prose


def test_korean_search_indexes_words_without_their_particles():
    from sphinx.search.en import SearchEnglish

    # Korean has spaces between words: Sphinx's default splitter finds each Korean word (with its particle)
    assert SearchEnglish({}).split("어텐션은 쿼리와 키를 비교합니다") == ["어텐션은", "쿼리와", "키를", "비교합니다"]
    korean = course_site._search_language_korean()({})
    words = korean.split("어텐션은 트랜스포머의 핵심이다 attention")
    assert {"어텐션은", "어텐션", "트랜스포머의", "트랜스포머", "attention"} <= set(words)
    assert "키" not in korean.split("키를"), "a one-syllable stem is too short to index"
    assert korean.stem("어텐션") == "어텐션" and korean.stem("attentions") == SearchEnglish({}).stem("attentions")


@pytest.mark.parametrize("page", ["intro", "chapters/03_transformer", "search"])
def test_the_language_switch_links_the_same_page_relatively(page):
    there = course_site.language_switch_href(page, "en")
    back = course_site.language_switch_href(page, "ko")
    assert not there.startswith("/") and not back.startswith("/")
    site = Path("/site")
    korean = (site / page).parent / there
    assert korean.resolve() == (site / "ko" / f"{page}.html").resolve()
    assert ((site / "ko" / page).parent / back).resolve() == (site / f"{page}.html").resolve()


# ----------------------------------------------------------------------------- the exercise sets' catalogs

SET = "exercises/03_transformer/sdpa_padding"


def _exercise_catalog(scratch: Path) -> Path:
    return scratch / "ko" / f"{SET}.po"


def test_every_exercise_set_has_a_catalog_beside_the_pages_catalogs():
    exercises = i18n.exercise_templates()
    masters = {f"exercises/{p.parent.name}/{p.stem}" for p in (ROOT / "exercises").glob("*/*.ipynb")}
    assert set(exercises) == masters
    for key, template in exercises.items():
        assert i18n.exercise_catalog(key).relative_to(i18n.LOCALES).as_posix() == f"ko/{key}.po"
        ids = [m.id for m in i18n.messages(template)]
        assert ids[0].startswith("# Exercise"), key
        assert not any(m.startswith(("```", "$$")) for m in ids), f"{key}: code or display math is a message"


def test_the_check_fails_when_an_exercise_master_changed_and_update_keeps_a_fuzzy_guess(templates, scratch, tmp_path):
    import nbformat

    exercises = i18n.exercise_templates()
    assert not i18n.check(templates, exercises)
    (tmp_path / "03_transformer").mkdir()
    nb = nbformat.read(str(ROOT / "exercises" / "03_transformer" / "sdpa_padding.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and "Compare your `attention`" in c.source)
    cell.source = cell.source.replace("Compare your `attention`", "Compare your own `attention`")
    nbformat.write(nb, str(tmp_path / "03_transformer" / "sdpa_padding.ipynb"))
    changed = {**exercises, **i18n.exercise_templates(tmp_path)}
    problems = i18n.check(templates, changed)
    assert any(p.startswith(f"{SET}: out of date, the page has a message the catalog lacks: 'Compare your own")
               for p in problems), problems
    assert any(f"{SET}: out of date, the catalog has a message the page no longer has: 'Compare your `attention`" in p
               for p in problems), problems
    i18n.update(templates, changed)
    assert [p for p in i18n.check(templates, changed)] == \
        [f"{SET}: fuzzy (a guess to confirm): " + i18n._short(next(m.id for m in i18n.messages(changed[SET])
                                                                   if m.id.startswith("Compare your own")))]


def test_the_check_fails_on_a_missing_fuzzy_or_stray_exercise_catalog_and_on_a_glossary_miss(templates, scratch):
    exercises = i18n.exercise_templates()

    def drop_term(catalog):
        message = next(m for m in i18n.messages(catalog) if "padding mask" in m.id and "패딩 마스크" in m.string)
        message.string = message.string.replace("패딩 마스크", "채움 가리개")

    _edit(_exercise_catalog(scratch), drop_term)
    other = scratch / "ko" / "exercises" / "03_transformer" / "transformer_parts.po"
    _edit(other, lambda c: i18n.messages(c)[-1].flags.add("fuzzy"))
    stray = scratch / "ko" / "exercises" / "99_gone" / "old.po"
    stray.parent.mkdir()
    shutil.copy(other, stray)
    (scratch / "ko" / "exercises" / "01_seq2seq_attention" / "luong_step.po").unlink()
    problems = i18n.check(templates, exercises)
    assert any(p.startswith(f"{SET}: 'padding mask' is in the English") for p in problems), problems
    assert any(p.startswith("exercises/03_transformer/transformer_parts: fuzzy") for p in problems), problems
    assert any("exercises/99_gone/old.po: no exercise set 'exercises/99_gone/old'" in p for p in problems), problems
    assert any(p.startswith("exercises/01_seq2seq_attention/luong_step: no Korean catalog") for p in problems), problems
