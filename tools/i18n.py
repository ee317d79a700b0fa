"""The Korean edition: message catalogs, their checks, and the Korean site.

The book is translated with Sphinx's gettext machinery (what Jupyter Book 1.x builds on): every
page's messages (paragraphs, headings, list items, table cells, the Markdown cells of the
notebooks) are extracted, translated in one catalog per page under ``locales/ko/LC_MESSAGES/``
(``intro.po``, ``chapters/03_transformer.po``, ...), and the Korean site is built from the same
sources and the same executed notebooks (the jupyter-cache), with the catalogs applied. Code,
math and outputs are never messages. Each graded exercise set's student notebook has a catalog too,
``locales/ko/exercises/<chapter>/<name>.po`` (its messages: the paragraphs of the master's Markdown
cells; tools/exercises.py build writes the Korean notebook from it), checked by the same rules.
``locales/README.md`` explains the workflow.

    python tools/i18n.py update          # re-extract and merge into the catalogs (new pages get one)
    python tools/i18n.py check           # what the test pass checks (tests/i18n/test_i18n.py), as a report
    python tools/i18n.py build           # the Korean site into _build/html/ko (after the English build)
    python tools/i18n.py build --lang en --no-execute   # a site from the notebooks as stored (no outputs)

Pages whose translation is not done yet are listed in ``locales/ko/PENDING``: their catalogs may be
empty or behind their page, the Korean site shows them in English (Sphinx's fallback) under a note
saying so. Every other page's catalog must be complete (no untranslated or fuzzy message), up to
date with its page, and use the glossary's Korean term wherever its English message uses a term of
``glossary.md`` (exceptions: ``locales/ko/glossary-exceptions.txt``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # lib (lib.io), also when Sphinx loads this file by path
    sys.path.insert(0, str(ROOT))
LANGUAGES = ("en", "ko")          # the book's language first
#: catalogs in LC_MESSAGES that belong to no page: the themes' own words (book/_ext/course_site.py)
THEME_CATALOGS = ("sphinx", "booktheme")
LANG = "ko"
LOCALES = ROOT / "locales"


def catalogs_dir(lang: str = LANG) -> Path:
    return LOCALES / lang / "LC_MESSAGES"


def exercise_catalog(key: str, lang: str = LANG) -> Path:
    """The catalog of an exercise set's student notebook, ``key`` = ``exercises/<chapter>/<name>``:
    ``locales/<lang>/exercises/<chapter>/<name>.po`` (beside LC_MESSAGES, which holds the pages')."""
    return LOCALES / lang / f"{key}.po"


def html_dir(lang: str) -> Path:
    """Where a language's site is written: English at the root, every other language in a folder."""
    return ROOT / "_build" / "html" if lang == LANGUAGES[0] else ROOT / "_build" / "html" / lang


# ----------------------------------------------------------------------------- the pending list

def pending(lang: str = LANG, root: Path | None = None) -> list[str]:
    """The pages (docnames) whose translation into ``lang`` is not done yet, from locales/<lang>/PENDING
    (of the checkout ``root``; by default this one's): one docname a line, ``#`` starts a comment."""
    path = (root / "locales" if root is not None else LOCALES) / lang / "PENDING"
    if not path.exists():
        return []
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


# ----------------------------------------------------------------------------- Sphinx

def sphinx(builder: str, outdir: Path, doctreedir: Path, overrides: dict | None = None, *,
           execute: bool = True, quiet: bool = False) -> int:
    """One Sphinx build of the book as ``jupyter-book build . --all --warningiserror --keep-going``
    runs it (the same _config.yml and _toc.yml), with ``overrides`` on top of the configuration.
    ``execute=False``: the notebooks as stored, without running them or reading the cache."""
    from jupyter_book.sphinx import build_sphinx

    os.chdir(ROOT)       # the configuration's paths (book/_ext, references.bib, ...) are relative to it
    conf = {"external_toc_path": (ROOT / "_toc.yml").as_posix(), "latex_individualpages": False,
            **(overrides or {})}
    if not execute:
        conf["nb_execution_mode"] = "off"
    result = build_sphinx(ROOT, outdir, noconfig=True, path_config=str(ROOT / "_config.yml"),
                          confoverrides=conf, doctreedir=doctreedir, builder=builder, freshenv=True,
                          warningiserror=True, keep_going=True, quiet=quiet)
    return 1 if isinstance(result, Exception) else int(result or 0)


def extract(dest: Path | None = None, quiet: bool = True) -> dict[str, object]:
    """Every page's messages, freshly extracted (``sphinx-build -b gettext``): {docname: babel Catalog}.
    The notebooks are read as stored (their Markdown cells are the messages; outputs never are), so
    extracting runs no chapter."""
    from babel.messages.pofile import read_po

    dest = dest or ROOT / "_build" / "gettext"
    # the exercise sets page links the student notebooks: built first, as the book build does (seconds)
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "tools" / "exercises.py"), "build"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    # the static folders are the HTML pages' business: the one fetched by the build (MathJax, from npm)
    # is not there yet when the test pass extracts, and a missing one would be a warning
    static = [p for p in ("book/_static_vendor", "book/_static") if (ROOT / p).is_dir()]
    rc = sphinx("gettext", dest, ROOT / "_build" / ".doctrees-gettext", {"html_static_path": static},
                execute=False, quiet=quiet)
    if rc:
        raise SystemExit(f"i18n: extracting the messages failed (sphinx-build -b gettext exit {rc})")
    templates = {}
    for pot in sorted(dest.rglob("*.pot")):
        docname = pot.relative_to(dest).with_suffix("").as_posix()
        if docname == "sphinx":      # Sphinx's own catalog, not a page
            continue
        with pot.open("rb") as f:
            templates[docname] = read_po(f)
    return templates


def exercise_templates(root: Path | None = None) -> dict[str, object]:
    """Every exercise master's messages (the paragraphs of its Markdown cells, as its student notebook
    shows them; tools/grader/translate.py): {"exercises/<chapter>/<name>": babel Catalog}."""
    from babel.messages.catalog import Catalog

    from tools.grader.masters import EXERCISES, discover
    from tools.grader.translate import messages as notebook_messages

    templates = {}
    for master in discover(root or EXERCISES):
        template = Catalog(fuzzy=False)
        for text, cell in notebook_messages(master.path):
            template.add(text, locations=[(master.path.name, cell)])
        templates[f"exercises/{master.key}"] = template
    return templates


# ----------------------------------------------------------------------------- catalogs

FIXED_DATE = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)   # no churn from dates


def read_catalog(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return read_po(f, locale=LANG)


def write_catalog(path: Path, catalog, what: str = "one page") -> None:
    """Written to a temporary file beside it and renamed: never half a catalog."""
    from babel.messages.pofile import write_po

    catalog.creation_date = catalog.revision_date = FIXED_DATE
    catalog.project, catalog.version = "Attention and Transformers, executed", ""
    catalog.language_team = catalog.last_translator = "the course's translators"
    catalog.header_comment = (f"# {catalog.locale_identifier or LANG} messages of {what} of the course "
                              "(tools/i18n.py; locales/README.md).\n#")
    from lib.io import atomic_write

    with atomic_write(path, "wb") as f:
        write_po(f, catalog, width=0, no_location=True, ignore_obsolete=True, include_previous=False)


def translations(key: str, lang: str = LANG) -> dict[str, str] | None:
    """An exercise set's translated messages, English -> ``lang`` (none untranslated or fuzzy: those
    stay English); None when the set has no catalog. tools/grader/build.py writes the student
    notebook in ``lang`` from them."""
    path = exercise_catalog(key, lang)
    if not path.exists():
        return None
    return {m.id: m.string for m in messages(read_catalog(path)) if m.string and not m.fuzzy}


def _merge(path: Path, template, what: str) -> bool:
    """Merge a fresh template into the catalog at ``path`` (a new catalog if there is none): new
    messages untranslated, changed ones fuzzy guesses, vanished ones dropped. -> whether it changed."""
    from babel.messages.catalog import Catalog

    if path.exists():
        catalog = read_catalog(path)
        before = path.read_bytes()
        catalog.update(template, update_header_comment=False)
    else:
        catalog, before = Catalog(locale=LANG, fuzzy=False), None
        catalog.update(template)
    catalog.fuzzy = False
    write_catalog(path, catalog, what)
    return path.read_bytes() != before


def update(templates: dict, exercises: dict | None = None) -> list[str]:
    """Merge fresh templates into the catalogs: new messages added untranslated, changed ones kept
    as fuzzy guesses for the translator to confirm, vanished ones dropped; a new page or exercise set
    gets a catalog, a vanished one's catalog goes. Returns what changed."""
    exercises = exercise_templates() if exercises is None else exercises
    changed = []
    for docname, template in templates.items():
        if _merge(catalogs_dir() / f"{docname}.po", template, "one page"):
            changed.append(f"{docname}.po")
    for key, template in exercises.items():
        if _merge(exercise_catalog(key), template, "one exercise set's student notebook"):
            changed.append(f"{key}.po")
    for path in sorted(catalogs_dir().rglob("*.po")):
        docname = path.relative_to(catalogs_dir()).with_suffix("").as_posix()
        if docname not in templates and docname not in THEME_CATALOGS:
            path.unlink()
            changed.append(f"{docname}.po (removed: no such page)")
    for path in _exercise_catalogs():
        key = path.relative_to(LOCALES / LANG).with_suffix("").as_posix()
        if key not in exercises:
            path.unlink()
            changed.append(f"{key}.po (removed: no such exercise set)")
    return changed


def _exercise_catalogs() -> list[Path]:
    return sorted((LOCALES / LANG / "exercises").rglob("*.po"))


def _short(text: str) -> str:
    """A message as a report names it: its start and its end, where most edits show."""
    return repr(text if len(text) <= 120 else f"{text[:70]} … {text[-45:]}")


def messages(catalog) -> list:
    return [m for m in catalog if m.id]


# ----------------------------------------------------------------------------- the glossary

@dataclass
class Term:
    english: tuple[str, ...]        # the forms the English text may use
    korean: tuple[str, ...]         # the forms the Korean text may use (any one will do)


_PARENS = re.compile(r"\s*\(([^()]*)\)")


def _split_top(cell: str) -> list[str]:
    """A cell's comma-separated items, commas inside parentheses kept."""
    items, depth, cur = [], 0, ""
    for ch in cell:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [i for i in [*items, cur.strip()] if i]


def _forms(item: str, english: bool) -> list[str]:
    """A glossary item's forms: without its parentheses, and what they hold ("additive (Bahdanau)
    attention": "additive attention", "Bahdanau attention"; "BERT (버트)": both)."""
    main = re.sub(r"\s+", " ", _PARENS.sub("", item)).strip()
    forms = [main] if main else []
    for m in _PARENS.finditer(item):
        inner = m.group(1).strip()
        if not inner or inner.endswith("-") or inner in ("n²",):
            continue
        tail = item[m.end():].strip()
        if english and tail and not tail.startswith(","):
            # a parenthesis in the middle names a variant of the word before it
            head = item[:m.start()].split()
            forms.append(" ".join([*head[:-1], inner, tail]) if head else f"{inner} {tail}")
        else:
            forms += [f.strip() for f in inner.split(",") if f.strip()]
    return forms


def glossary_rows(text: str) -> list[list[str]]:
    """The cells of every term row of glossary.md's tables (English | Korean | Defined in), in order."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not line.lstrip().startswith("|") or set(cells[0]) <= set("-: ") \
                or cells[0] == "English":
            continue
        rows.append(cells)
    return rows


def row_terms(cells: list[str]) -> list[Term]:
    """The terms of one glossary row: one term each when both sides list as many
    (``encoder, decoder`` | ``인코더, 디코더``), else the row as one term."""
    en, ko = _split_top(cells[0]), _split_top(cells[1])
    pairs = list(zip(en, ko)) if len(en) == len(ko) else [(cells[0], cells[1])]
    terms = []
    for e, k in pairs:
        eng = tuple(dict.fromkeys(_forms(e, True)))
        kor = [f for f in _forms(k, False)]
        # a Latin name the Korean writes as such (LSTM, BPE, MoE, RMSNorm) also counts
        kor += [w for w in re.findall(r"[A-Za-z][A-Za-z0-9-]*", k)]
        terms.append(Term(eng, tuple(dict.fromkeys(kor))))
    return terms


def glossary_terms(text: str) -> list[Term]:
    """The terms of glossary.md's tables, row after row (:func:`glossary_rows`, :func:`row_terms`)."""
    return [term for cells in glossary_rows(text) for term in row_terms(cells)]


# inline code, math, link targets, roles' targets, URLs: never words of the prose
_NOT_PROSE = re.compile(r"``.*?``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|<[^>]*>|https?://\S+", re.S)


def prose(text: str) -> str:
    return _NOT_PROSE.sub(" ", text)


def _english_pattern(form: str) -> re.Pattern:
    words = [re.escape(w) for w in re.split(r"[\s-]+", form) if w]
    body = r"[\s-]*".join(words)
    return re.compile(rf"(?<![\w-]){body}(?:s|es)?(?![\w-])", re.I)


def _squash(text: str) -> str:
    return re.sub(r"[\s-]+", "", text).lower()


def _a_name(form: str) -> bool:
    """A name written with capitals (BERT, BLEU, NSP, MoE, RMSNorm): Korean texts keep it in Latin letters."""
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*", form)) and sum(c.isupper() for c in form) >= 2


def glossary_problems(docname: str, catalog, terms: list[Term], exceptions: list[tuple[str, str]]) -> list[str]:
    """Every translated message of the page whose English uses a glossary term (any of its forms, any
    case, plural too) must use the term's Korean (any of its forms; spaces and hyphens ignored), or keep
    it in Latin letters where it is a name (BERT). A phrase of glossary-exceptions.txt is taken out of
    the English first (a model's name such as "Switch Transformer")."""
    problems = []
    patterns = [(t, [(_english_pattern(f), f) for f in t.english]) for t in terms]
    skip = [re.compile(re.escape(phrase), re.I) for page, phrase in exceptions if page in ("*", docname)]
    for msg in messages(catalog):
        if not msg.string or msg.string == msg.id:     # a string kept as it is (a name, a Korean cell)
            continue
        source, target = prose(msg.id), _squash(prose(msg.string))
        for pattern in skip:
            source = pattern.sub(" ", source)
        for term, pats in patterns:
            hit = next((m.group(0) for p, f in pats for m in [p.search(source)] if m), None)
            if hit is None or (_a_name(hit) and hit in msg.string):
                continue
            if not any(_squash(k) in target for k in term.korean):
                problems.append(f"{docname}: {hit!r} is in the English but none of {list(term.korean)} is in "
                                f"the Korean: {msg.string[:100]!r}")
    return problems


def glossary_exceptions(lang: str = LANG) -> list[tuple[str, str]]:
    """locales/<lang>/glossary-exceptions.txt: ``page | English phrase | why`` a line (``*``: every page);
    the phrase is not looked at for glossary terms on that page."""
    path = LOCALES / lang / "glossary-exceptions.txt"
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                page, phrase, *_ = [c.strip() for c in line.split("|")]
                out.append((page, phrase))
    return out


# ----------------------------------------------------------------------------- the check

def check(templates: dict, exercises: dict | None = None) -> list[str]:
    """Everything wrong with the Korean catalogs, one line each (empty: all is well). ``exercises``:
    the exercise sets' templates (by default extracted now from the masters, which takes no build);
    their catalogs follow the pages' rules."""
    exercises = exercise_templates() if exercises is None else exercises
    problems = []
    todo = pending()
    for name in todo:
        if name not in templates and name not in exercises:
            problems.append(f"locales/{LANG}/PENDING names {name!r}, which is not a page of the book or an exercise set")
    for path in sorted(catalogs_dir().rglob("*.po")):
        docname = path.relative_to(catalogs_dir()).with_suffix("").as_posix()
        if docname not in templates and docname not in THEME_CATALOGS:
            problems.append(f"{path.relative_to(LOCALES.parent)}: no page {docname!r} (run python tools/i18n.py update)")
    for path in _exercise_catalogs():
        key = path.relative_to(LOCALES / LANG).with_suffix("").as_posix()
        if key not in exercises:
            problems.append(f"{path.relative_to(LOCALES.parent)}: no exercise set {key!r} "
                            "(run python tools/i18n.py update)")
    terms = glossary_terms((ROOT / "glossary.md").read_text(encoding="utf-8"))
    if len(terms) < 50:
        problems.append(f"glossary.md: only {len(terms)} terms were read from its tables")
    exceptions = glossary_exceptions()
    catalogs = [(d, t, catalogs_dir() / f"{d}.po") for d, t in templates.items()]
    catalogs += [(k, t, exercise_catalog(k)) for k, t in exercises.items()]
    for docname, template, path in catalogs:
        if docname in todo:
            continue
        if not path.exists():
            problems.append(f"{docname}: no Korean catalog {path.relative_to(LOCALES.parent)} and not in locales/{LANG}/PENDING")
            continue
        catalog = read_catalog(path)
        want = {(m.context, m.id) for m in messages(template)}
        have = {(m.context, m.id) for m in messages(catalog)}
        for ctx, mid in sorted(want - have, key=str):
            problems.append(f"{docname}: out of date, the page has a message the catalog lacks: {_short(mid)}")
        for ctx, mid in sorted(have - want, key=str):
            problems.append(f"{docname}: out of date, the catalog has a message the page no longer has: {_short(mid)}")
        for m in messages(catalog):
            if m.fuzzy:
                problems.append(f"{docname}: fuzzy (a guess to confirm): {_short(m.id)}")
            elif not m.string:
                problems.append(f"{docname}: untranslated: {_short(m.id)}")
        problems += glossary_problems(docname, catalog, terms, exceptions)
    return problems


# ----------------------------------------------------------------------------- the sites

def build(lang: str, execute: bool = True) -> int:
    """One language's site, from the same sources and the same jupyter-cache as the English one."""
    out = html_dir(lang)
    doctrees = ROOT / "_build" / (".doctrees" if lang == LANGUAGES[0] else f".doctrees-{lang}")
    overrides = {} if lang == LANGUAGES[0] else {"language": lang}
    return sphinx("html", out, doctrees, overrides, execute=execute)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("update", help="re-extract every page's messages and merge them into the Korean catalogs")
    sub.add_parser("check", help="report untranslated, fuzzy, out-of-date messages and glossary misses")
    sub.add_parser("count", help="the number of messages of every page")
    b = sub.add_parser("build", help="build a language's site (default: Korean, into _build/html/ko)")
    b.add_argument("--lang", choices=LANGUAGES, default=LANG)
    b.add_argument("--no-execute", action="store_true",
                   help="render the notebooks as stored (no outputs) instead of from the jupyter-cache")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.lang, execute=not args.no_execute)
    templates, exercises = extract(), exercise_templates()
    if args.command == "count":
        for docname, template in {**templates, **exercises}.items():
            print(f"{len(messages(template)):5d}  {docname}{'  (pending)' if docname in pending() else ''}")
        print(f"{sum(len(messages(t)) for t in [*templates.values(), *exercises.values()]):5d}  in all")
        return 0
    if args.command == "update":
        changed = update(templates, exercises)
        print("i18n: " + ("updated " + ", ".join(changed) if changed else "every catalog was up to date"))
        return 0
    problems = check(templates, exercises)
    for p in problems:
        print(p)
    print(f"i18n: {len(problems)} problems" if problems else "i18n: every translated page is complete and current")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
