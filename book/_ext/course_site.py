"""The course's Sphinx extension (sphinx.local_extensions in _config.yml).

* Inline scripts are written once per page. Sphinx 7.4 (the newest Jupyter Book 1.x
  allows) registers an inline script added after the builder started twice: once under
  the file name None, once under '' (sphinx-doc/sphinx#13402, fixed in Sphinx 8.2). Every
  page then declared sphinx-thebe's ``const THEBE_JS_URL`` twice, a SyntaxError in the
  reader's browser. The builder's add_js_file is given '' for None, as Sphinx 8.2 does.
* The search page typesets the formulas in its result snippets (``_static/search_math.js``,
  with the MathJax the site serves) instead of showing their LaTeX source.
* Korean text is drawn with one web font built here: at the end of the build, every Hangul
  character the site shows (pages, outputs, search sources) is cut out of the NanumGothic the
  ``koreanize-matplotlib`` wheel ships (the font the plots use) with fontTools, renamed (the
  font's license, SIL OFL 1.1, reserves its name for the unmodified font) and written to
  ``_static/fonts/course-hangul-{400,700}.woff``; every page that shows Hangul preloads it.
  One small file per weight instead of a web font split into slices: Chromium did not redraw
  text laid out before a later slice arrived, and drew it as empty boxes. Code and outputs get
  their own pair, cut to what the pages' ``<pre>`` and ``<code>`` hold: "Course Mono" (DejaVu Sans
  Mono from matplotlib) and "Course Hangul Mono" (NanumGothic with each syllable centred in exactly
  two Course Mono columns), so that a printed table padded by display width (``lib.viz.pad``)
  lines up on the page whatever monospaced font the reader's machine has.
* The comments that mark a cell for the output check (``# NBVAL_CHECK_OUTPUT``, read by
  tools/execute_chapters.py) are taken out of the code the page shows: they are for the test
  pass, not the reader. The notebooks keep them.
* "How to run this chapter": a box under each chapter's title, shown only when the course's
  repository is set (``course_repository`` in _config.yml's sphinx config; empty until the
  course is published). It says what the notebook needs (the repository, set up by its one
  command: the notebook imports ``lib`` and reads the repository's data), how long its outputs
  took to compute (the ``execution_seconds`` that tools/execute_chapters.py stores with each
  executed notebook in the jupyter cache the build reads), and links the notebook and its
  exercises. No Colab or Binder links: a chapter notebook does not run outside the repository.
  The same setting names the repository in Getting started (the ``{{ repository }}`` substitution).
* Weight: the theme loads Font Awesome twice, as web fonts from its CSS (what draws the icons)
  and as a 1.5 MB script that blocks the first paint ("so that users can add custom icons":
  the course adds none); the script tag is taken out of every page and the file out of the
  site. A chapter's interactive widgets (chapter 04's chat box) need a live kernel: on the
  static page the widget manager (3.6 MB of script) drew a box that did nothing, so a page
  shows a sentence saying so instead, and loads no widget script.
* Plots get alt text: a plot an executed cell drew is described by its kind (line plot, heatmap,
  bar chart) and what its code names (titles, axis labels; else the panel titles it loops over, or
  what the ``lib.viz`` function it calls draws), instead of the image's file path the page showed.
* The Korean edition (tools/i18n.py, locales/README.md): the same sources built with
  ``language = "ko"`` into ``_build/html/ko``. Every page carries a switcher to the same page in
  the other language (a relative link: the site works from any folder and from file://); a page
  still listed in ``locales/ko/PENDING`` says at its top, in Korean, that it is shown in English;
  display math is never a message to translate; the Korean site's search indexes each word also
  without its particle (어텐션은 -> 어텐션), since Sphinx has no Korean search language and Korean
  words carry their particles; the Korean web font is cut from the Korean site's own pages.
* ``{exercise-sets}``: the list of every graded exercise set, discovered from the master
  notebooks in exercises/ (the same discovery as tools/exercises.py), with what each
  covers, its chapter and the student notebook to download.
* The student notebooks in the site's language: on a site built with another ``language`` than
  English, every download link to an English student notebook (the ``{exercise-sets}`` list, the
  run box, a chapter's own links) is pointed at the same set's student notebook in that language
  (``student/ko/<name>.ipynb``, built by tools/exercises.py from the set's catalog) where it was
  built. This is done after Sphinx translated the page, so the messages (which name the English
  notebook) are the same for both sites; the English site is left as it is.
"""
from __future__ import annotations

import html
import importlib.util
import io
import logging
import re
import sys
from pathlib import Path

import nbformat
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


def _one_name_for_inline_scripts(app: Sphinx) -> None:
    builder = app.builder
    if not hasattr(builder, "add_js_file"):
        return
    add = builder.add_js_file

    def add_js_file(filename, **kwargs):
        return add(filename or "", **kwargs)

    builder.add_js_file = add_js_file


def _search_page_math(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """On the search page only: MathJax and the script that typesets the result snippets with it.
    Both deferred, so they run after searchtools.js has defined ``Search`` and before it searches."""
    if pagename != "search" or app.builder.format != "html" or not app.config.mathjax_path:
        return
    app.builder.add_js_file(app.config.mathjax_path, defer="defer")
    app.builder.add_js_file("search_math.js", defer="defer")


# ----------------------------------------------------------------------------- test markers

NBVAL_LINE = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[ \t]*(?:\n|$)", re.M)


def hide_test_markers(source: str) -> str:
    """A cell's code without the lines that are only an nbval marker comment."""
    return NBVAL_LINE.sub("", source)


def _hide_test_markers(app: Sphinx, doctree: nodes.document) -> None:
    for block in list(doctree.findall(nodes.literal_block)):
        parent = block.parent
        if parent is None or "cell_input" not in parent.get("classes", []) or "NBVAL_" not in block.astext():
            continue
        code = hide_test_markers(block.astext())
        block.children = []
        block += nodes.Text(code)
        block.rawsource = code


# ----------------------------------------------------------------------------- how to run a chapter

def _repository(app: Sphinx) -> str:
    return (app.config.course_repository or "").strip().rstrip("/")


def _name_the_repository(app: Sphinx, config) -> None:
    """``{{ repository }}`` in the book's Markdown: a link to the repository, or words saying which."""
    url = (config.course_repository or "").strip().rstrip("/")
    subs = dict(config.myst_substitutions or {})
    if _korean(config):
        subs.setdefault("repository", f"강의 저장소 [{url}]({url})" if url else "강의 저장소(이 책을 빌드한 바로 그 저장소)")
    else:
        subs.setdefault("repository", f"the course's repository, [{url}]({url})" if url
                        else "the course's repository (the folder this book was built from)")
    config.myst_substitutions = subs


# ----------------------------------------------------------------------------- the Korean edition

LANGUAGES = {"en": "English", "ko": "한국어"}     # the book's language first; the others in a folder each
KOREAN_TITLE = "어텐션과 트랜스포머, 직접 실행하며 배우기"
KOREAN_AUTHOR = "강의 저자들"
PENDING_NOTE = ("이 페이지는 아직 한국어로 번역되지 않았습니다. 번역이 끝날 때까지 영어 원문을 보여 드립니다. "
                "코드와 실행 결과는 영어판과 같습니다.")


def _korean(config) -> bool:
    return (config.language or "en").split("_")[0] == "ko"


def _tool(stem: str):
    """``tools/<stem>.py``, imported once (as ``course_<stem>_tool``: its dataclasses need it in
    sys.modules)."""
    name = f"course_{stem}_tool"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _i18n_tool():
    """tools/i18n.py (the pending list, one definition for the build and the checks)."""
    return _tool("i18n")


def _korean_config(app: Sphinx, config) -> None:
    """The Korean site's title, search box text and search language."""
    if not _korean(config):
        return
    config.html_title = KOREAN_TITLE
    config.author = KOREAN_AUTHOR
    options = dict(config.html_theme_options or {})
    options["search_bar_text"] = "강의 검색..."
    config.html_theme_options = options
    config.html_search_language = "ko"


def _theme_words(app: Sphinx) -> None:
    """The themes' words (buttons, tooltips, the author line, "previous page") in the site's language,
    from ``locales/<lang>/LC_MESSAGES/sphinx.po`` and ``booktheme.po`` (``tools/i18n.py``'s
    THEME_CATALOGS), ahead of the themes' own catalogs, which Sphinx would otherwise ask first: a
    theme that registers its catalog early wins, and the book theme's Korean one is a machine's
    ("By" as "으로")."""
    language = site_language(app.config)
    if language == "en":
        return
    import gettext

    from sphinx import locale

    class Words(gettext.NullTranslations):
        def __init__(self, words: dict[str, str], fallback):
            super().__init__()
            self.words = words
            if fallback is not None:
                self.add_fallback(fallback)

        def gettext(self, message: str) -> str:
            if message in self.words:
                return self.words[message]
            return self._fallback.gettext(message) if self._fallback else message

    for domain in _i18n_tool().THEME_CATALOGS:
        path = Path(app.srcdir) / app.config.locale_dirs[0] / language / "LC_MESSAGES" / f"{domain}.po"
        if not path.is_file():
            continue
        words = {m.id: m.string for m in _i18n_tool().read_catalog(path) if m.id and m.string and not m.fuzzy}
        key = ("general", domain)
        locale.translators[key] = Words(words, locale.translators.get(key))


def language_switch_href(pagename: str, language: str) -> str:
    """The relative link from a page of the ``language`` site to the same page in the other language:
    the English site is the root, every other language a folder in it (``ko/``)."""
    up = "../" * pagename.count("/")
    if language == "en":
        return f"{up}ko/{pagename}.html"
    return f"{up}../{pagename}.html"


def _language_switch(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.builder.format != "html":
        return
    language = "ko" if _korean(app.config) else "en"
    other = "en" if language == "ko" else "ko"
    context["course_language_switch"] = {
        "href": language_switch_href(pagename, language), "lang": other, "label": LANGUAGES[other],
        "title": "이 페이지를 한국어로 보기" if other == "ko" else "Read this page in English"}


def _untranslated_math(app: Sphinx, doctree: nodes.document) -> None:
    """Display math is not a message: a translator has nothing to do with a formula."""
    for block in doctree.findall(nodes.math_block):
        block["translatable"] = False


def _translate_toctree_captions(app: Sphinx, doctree: nodes.document) -> None:
    """The captions of the parts in the navigation (_toc.yml) and the titles _toc.yml gives entries, from
    the root page's catalog: the external table of contents inserts its toctrees after Sphinx translated
    the page, so Sphinx leaves them as written."""
    if not app.config.language or app.config.language == "en":
        return
    from sphinx import addnodes
    from sphinx.locale import get_translation
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    trees = list(doctree.findall(addnodes.toctree))
    if not trees:
        return
    dirs = [str(Path(app.srcdir) / d) for d in app.config.locale_dirs]
    catalog, found = init_locale(dirs, app.config.language, docname_to_domain(app.env.docname, app.config.gettext_compact))
    if not found:
        return
    sphinx_words = get_translation("sphinx")

    def translated(text: str) -> str:
        """From the page's catalog, else Sphinx's own (a title such as "Overview" that no page writes)."""
        ours = catalog.gettext(text)
        return ours if ours and ours != text else str(sphinx_words(text))

    for tree in trees:
        if tree.get("caption"):
            tree["caption"] = tree["rawcaption"] = translated(tree["caption"])
        # an entry's own title in _toc.yml (``title: Overview``)
        tree["entries"] = [(translated(title) if title else title, ref) for title, ref in tree["entries"]]


def site_language(config) -> str:
    """The language a build writes: Sphinx's ``language`` (``ko``, ``ko_KR``: ``ko``), English by default."""
    return (config.language or "en").split("_")[0]


def student_notebook(target: Path, language: str, dist: Path | None = None) -> Path:
    """The student notebook a ``language`` site links where the English one links ``target``: an
    exercise set's English student notebook -> its notebook in ``language`` if that was built (else the
    English one); any other file -> itself."""
    if language == "en":
        return target
    tool = _exercises_tool()
    dist = dist or tool.DIST
    for master in tool.discover():
        if target == master.student_nb(dist):
            translated = master.student_nb(dist, language)
            return translated if translated.is_file() else target
    return target


def _student_notebooks_in_the_site_language(app: Sphinx, doctree: nodes.document) -> None:
    """Download links to an English student notebook lead to the site language's one (after the page
    was translated, before Sphinx's download collector reads the links)."""
    from sphinx import addnodes

    language = site_language(app.config)
    if language == "en":
        return
    for ref in doctree.findall(addnodes.download_reference):
        english = Path(app.env.relfn2path(ref["reftarget"], app.env.docname)[1]).resolve()
        target = student_notebook(english, language)
        if target != english:
            ref["reftarget"] = "/" + target.relative_to(Path(app.srcdir).resolve()).as_posix()


def _pending_note(app: Sphinx, doctree: nodes.document) -> None:
    """On the Korean site, a page whose translation is not done says so under its title."""
    if not _korean(app.config) or app.env.docname not in _i18n_tool().pending("ko", Path(app.srcdir)):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    note = nodes.container(classes=["course-translation-pending"])
    note += nodes.paragraph("", "", nodes.strong(text="번역 중인 페이지입니다. "), nodes.Text(PENDING_NOTE))
    title = next(iter(section.findall(nodes.title)), None)
    section.insert(section.index(title) + 1 if title is not None else 0, note)


def _search_language_korean():
    """Sphinx's English search language (its stemmer and stop words for the Latin words of the pages:
    code, names), with Korean words indexed also without their particle, so that a search for 어텐션
    finds 어텐션은 and 어텐션의. The query side needs nothing: a bare word is what is searched for."""
    from sphinx.search.en import SearchEnglish

    particles = sorted("은 는 이 가 을 를 의 에 에서 에게 으로 로 와 과 도 만 까지 부터 처럼 보다 이다 입니다 "
                       "에서는 으로는 에는 와는 과는 이나 나 이란 란 이라는 라는 으로도 로도 에도 만의 들 들은 "
                       "들을 들의 들이".split(), key=len, reverse=True)

    class SearchKorean(SearchEnglish):
        lang = "ko"
        language_name = "Korean"

        def split(self, input: str) -> list[str]:
            words = []
            for word in super().split(input):
                words.append(word)
                if HANGUL.search(word):
                    for p in particles:
                        if word.endswith(p) and len(word) - len(p) >= 2:
                            words.append(word[:-len(p)])
                            break
            return words

    return SearchKorean


def execution_seconds(app: Sphinx, path: Path) -> float | None:
    """How long the outputs of this notebook took to compute, as the jupyter cache recorded it
    (None when the cache has no run of the notebook's current code)."""
    cache_dir = Path(app.srcdir) / (getattr(app.config, "nb_execution_cache_path", "") or "_build/.jupyter_cache")
    if not cache_dir.exists():
        return None
    try:
        from jupyter_cache import get_cache

        record = get_cache(str(cache_dir)).match_cache_notebook(nbformat.read(path, as_version=4))
    except Exception:   # KeyError: no run of this code; anything else: no usable cache
        return None
    seconds = (record.data or {}).get("execution_seconds")
    return float(seconds) if seconds is not None else None


def _recipe() -> str:
    try:
        sys.path.insert(0, str(ROOT))
        from lib import config

        return config.mode()
    except Exception:
        return "ci"


#: The run box's sentences, per site language ({url}, {notebook}, {minutes}, {recipe} filled in).
RUN_BOX = {
    "en": {"title": "Run this chapter yourself.",
           "need": ("It runs inside the course's repository, {url}: clone it and set it up with {setup} (the README's "
                    "command), then open {notebook} there. The notebook imports the course's {lib} package and reads "
                    "the repository's data: a copy on its own stops at its first cell and says so. There are no Colab "
                    "or Binder links for the same reason."),
           "time": ("Time: computing this page's outputs took about {minutes} min ({recipe}; measured when the book "
                    "was built). {full} runs the full recipe, the one behind the recorded numbers; the chapter says "
                    "where and at what size they were run."),
           "recipes": {"ci": "the CI recipe, the default on a CPU", "full": "the full recipe"},
           "download": "Download: ", "exercises": " · its exercises: ",
           "graded": " (graded with otter-grader, which the setup installs)."},
    "ko": {"title": "이 장을 직접 실행해 보세요.",
           "need": ("이 노트북은 강의 저장소 {url} 안에서 실행됩니다. 저장소를 클론하고 {setup} 명령으로 환경을 "
                    "준비한 다음(README에 적힌 명령입니다), 그 안에서 {notebook} 파일을 여세요. 노트북은 강의의 {lib} 패키지를 불러오고 "
                    "저장소의 데이터를 읽습니다. 노트북 파일만 따로 떼어 열면 첫 셀에서 멈추고 그 이유를 알려 줍니다. "
                    "Colab이나 Binder 링크가 없는 것도 같은 이유입니다."),
           "time": ("시간: 이 페이지의 출력을 계산하는 데 약 {minutes}분이 걸렸습니다({recipe}, 책을 빌드할 때 잰 "
                    "시간). {full}로 실행하면 기록된 수치를 낸 전체 레시피가 돌아갑니다. 그 실행을 어디서, 어떤 "
                    "규모로 했는지는 각 장에 적혀 있습니다."),
           "recipes": {"ci": "CI 레시피, CPU에서의 기본값", "full": "전체 레시피"},
           "download": "내려받기: ", "exercises": " · 연습 문제: ",
           "graded": " (otter-grader로 채점합니다. 설정 스크립트가 설치해 줍니다)."},
}


def _sentence(template: str, **parts) -> list[nodes.Node]:
    """``template`` as text nodes, each ``{name}`` replaced by the node ``parts[name]``."""
    out: list[nodes.Node] = []
    for piece in re.split(r"(\{\w+\})", template):
        name = piece[1:-1] if piece.startswith("{") and piece.endswith("}") else None
        if name in parts:
            out.append(parts[name])
        elif piece:
            out.append(nodes.Text(piece))
    return out


def _run_box(app: Sphinx, docname: str, seconds: float | None) -> nodes.container:
    """The box: what the chapter needs, how long it takes, its notebook and exercises to download, in
    the site's language."""
    from sphinx import addnodes

    words = RUN_BOX.get(site_language(app.config), RUN_BOX["en"])
    url, chapter = _repository(app), docname.split("/")[-1]
    box = nodes.container(classes=["course-run-box"])
    box += nodes.paragraph("", "", nodes.strong(text=words["title"]))
    box += nodes.paragraph("", "", *_sentence(
        words["need"], url=nodes.reference(url, url, refuri=url), setup=nodes.literal(text="bash tools/setup.sh"),
        notebook=nodes.literal(text=f"{docname}.ipynb"), lib=nodes.literal(text="lib")))
    if seconds is not None:
        recipe = words["recipes"].get(_recipe(), _recipe())
        minutes = max(1, round(seconds / 60))
        box += nodes.paragraph("", "", *_sentence(words["time"].replace("{minutes}", str(minutes))
                                                  .replace("{recipe}", recipe),
                                                  full=nodes.literal(text="COURSE_MODE=full")))
    get = nodes.paragraph()
    get += nodes.Text(words["download"])
    get += addnodes.download_reference("", "", nodes.literal(text=f"{chapter}.ipynb"),
                                       reftarget=f"/{docname}.ipynb", refdoc=docname, refexplicit=True)
    tool = _exercises_tool()
    masters = [m for m in tool.discover() if m.chapter == chapter]
    if masters:
        get += nodes.Text(words["exercises"])
        for i, master in enumerate(masters):
            if i:
                get += nodes.Text(", ")
            student = master.student_nb(tool.DIST).relative_to(ROOT).as_posix()
            get += addnodes.download_reference("", "", nodes.literal(text=f"{master.name}.ipynb"),
                                               reftarget=f"/{student}", refdoc=docname, refexplicit=True)
        get += nodes.Text(words["graded"])
    box += get
    return box


def _add_run_box(app: Sphinx, doctree: nodes.document) -> None:
    docname = app.env.docname
    if not docname.startswith("chapters/") or not _repository(app):
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    source = Path(app.srcdir) / f"{docname}.ipynb"
    if section is None or not source.exists():
        return
    title = next(iter(section.findall(nodes.title)), None)
    box = _run_box(app, docname, execution_seconds(app, source))
    section.insert(section.index(title) + 1 if title is not None else 0, box)


# ----------------------------------------------------------------------------- alt text of plots

_LABEL_CALL = re.compile(r"""(?:set_title|suptitle|title|set_xlabel|xlabel|set_ylabel|ylabel)\s*[(=]\s*f?(["'])(.+?)\1""")
_STRING = re.compile(r"""(?<![\w.])f?(["'])([^"'\n]{6,}?)\1""")
# What the course's plotting functions draw, for a cell that names no title of its own.
_LIB_PLOTS = {"attention_heatmap": "attention weights, queries down and keys across",
              "attention_grid": "the attention weights of every head",
              "plot_history": "training curves", "transfer.plot": "accuracy against the number of labelled examples",
              "plot_positional_encoding": "a positional encoding, positions down and dimensions across"}
_KINDS = (("heatmap", r"imshow|matshow|pcolormesh|attention_heatmap|attention_grid|plot_positional_encoding"),
          ("bar chart", r"\.barh?\("), ("scatter plot", r"\.scatter\("),
          ("line plot", r"\.plot\(|plot_history|\.semilogy\(|\.loglog\(|\.step\("))


def describe_plot(code: str) -> str:
    """Alt text for the figures a cell's code draws: the kind of plot and its titles and axis labels, as
    written there (an f-string's fields shown as "…"); without any, the strings it draws in a loop (panel
    titles in a tuple) or what the course's plotting function it calls shows."""
    def clean(text: str) -> str:
        return re.sub(r"\{[^{}]*\}", "…", text).replace("$", "").strip()

    labels: list[str] = []
    for _, text in _LABEL_CALL.findall(code):
        text = clean(text)
        if re.search(r"\w", text.replace("…", "")) and text not in labels:
            labels.append(text)
    if not labels and re.search(r"\bfor\b[^\n]*\bzip\(", code):
        labels = [clean(t) for _, t in _STRING.findall(code) if " " in t and not t.startswith(("%", "#"))][:4]
    if not labels:
        labels = [what for name, what in _LIB_PLOTS.items() if re.search(rf"\b{re.escape(name)}\(", code)]
    kinds = [kind for kind, pattern in _KINDS if re.search(pattern, code)]
    kind = {0: "A plot", 1: f"A {kinds[0]}" if kinds else "A plot"}.get(len(kinds), "Plots")
    if not labels:
        return f"{kind} drawn by the code cell above."
    return f"{kind} drawn by the code cell above: " + "; ".join(labels[:8]) + "."


def _alt_text_for_plots(app: Sphinx, doctree: nodes.document) -> None:
    for cell in doctree.findall(lambda n: isinstance(n, nodes.container) and "cell" in n.get("classes", [])):
        images = [img for img in cell.findall(nodes.image) if not img.get("alt")]
        if not images:
            continue
        code = next((b.astext() for b in cell.findall(nodes.literal_block)
                     if "cell_input" in b.parent.get("classes", [])), "")
        for img in images:
            img["alt"] = describe_plot(code)


# ----------------------------------------------------------------------------- weight

WIDGET_VIEW = re.compile(r'<script type="application/vnd\.jupyter\.widget-view\+json">.*?</script>', re.S)
WIDGET_NOTE = ('<p class="course-widget-note">An interactive widget appears here when you run the notebook '
               '(it needs a live Python kernel, which this page does not have).</p>')
FONTAWESOME_SCRIPT = re.compile(r'[ \t]*<script src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>\n?')


def _is_widget_script(js) -> bool:
    attributes = getattr(js, "attributes", {}) or {}
    return "widget-state" in str(attributes.get("type", "")) or "widgets/" in str(getattr(js, "filename", js) or "")


def _static_widgets(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    body = context.get("body") or ""
    if app.builder.format != "html" or not WIDGET_VIEW.search(body):
        return
    context["body"] = WIDGET_VIEW.sub(WIDGET_NOTE, body)
    context["script_files"] = [js for js in context.get("script_files", []) if not _is_widget_script(js)]


def _drop_fontawesome_script(app: Sphinx, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in out.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if "fontawesome.js" in text:
            page.write_text(FONTAWESOME_SCRIPT.sub("", text), encoding="utf-8")
    for path in (out / "_static" / "scripts").glob("fontawesome.js*"):
        path.unlink()


#: words the themes write into their templates and scripts without gettext, for a Korean site
#: (the book theme's navigation labels for screen readers, sphinx-togglebutton's button label)
KOREAN_LITERALS = {"html": {'aria-label="Main"': 'aria-label="강좌 목차"', 'aria-label="Page"': 'aria-label="이 페이지"'},
                   "_static/togglebutton.js": {'"Toggle hidden content"': '"숨긴 내용 보이기/감추기"'}}


def _korean_literals(app: Sphinx, exception) -> None:
    """Put :data:`KOREAN_LITERALS` into a Korean site's pages and the toggle button's script."""
    if exception is not None or app.builder.format != "html" or not _korean(app.config):
        return
    out = Path(app.outdir)
    for where, words in KOREAN_LITERALS.items():
        for page in (out.rglob("*.html") if where == "html" else [out / where]):
            if not page.is_file():
                continue
            text = new = page.read_text(encoding="utf-8")
            for english, korean in words.items():
                new = new.replace(english, korean)
            if new != text:
                page.write_text(new, encoding="utf-8")


# ----------------------------------------------------------------------------- the site's fonts

HANGUL_RANGES = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7A3), (0xD7B0, 0xD7FF))
HANGUL = re.compile("[" + "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in HANGUL_RANGES) + "]")
HANGUL_FAMILY = "Course Hangul"
HANGUL_FONTS = {400: "NanumGothic.ttf", 700: "NanumGothicBold.ttf"}   # weight: file in koreanize-matplotlib
# Code and outputs: a monospaced font the site serves (a reader's own differ in width: Consolas is
# narrower than Menlo), and Hangul exactly two of its columns wide, so that a printed table padded by
# display width (lib.viz.pad, pandas) lines up as it does in a terminal.
MONO_FAMILY = "Course Mono"
MONO_FONT = "DejaVuSansMono.ttf"                  # in matplotlib's data, as the plots' DejaVu Sans
HANGUL_MONO_FAMILY = "Course Hangul Mono"
MONO_ALWAYS = {chr(c) for c in range(0x20, 0x7F)}   # printable ASCII, whatever the pages hold
CODE = re.compile(r"<(pre|code)\b[^>]*>(.*?)</\1>", re.S)


def hangul_font_path(weight: int) -> str:
    """The path of the site's Korean font of one weight, relative to the site's root."""
    return f"_static/fonts/course-hangul-{weight}.woff"


MONO_FONT_PATH = "_static/fonts/course-mono-400.woff"
HANGUL_MONO_FONT_PATH = "_static/fonts/course-hangul-mono-400.woff"


def hangul_in(text: str) -> set[str]:
    """The Hangul characters of an HTML or JS text, also where written as entities or \\u escapes."""
    text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), html.unescape(text))
    return set(HANGUL.findall(text))


def code_text_in(page_html: str) -> str:
    """The text of a page's code blocks, outputs and inline code (what the monospaced font draws)."""
    return "".join(html.unescape(re.sub(r"<[^>]+>", "", body)) for _, body in CODE.findall(page_html))


def _nanum(name: str) -> Path:
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the site's Korean font is cut from the NanumGothic of the package koreanize-matplotlib, "
                           "which is not installed: pip install -c constraints.txt -r requirements.txt")
    path = Path(list(spec.submodule_search_locations)[0]) / "fonts" / name
    if not path.exists():
        raise RuntimeError(f"koreanize-matplotlib has no {path}")
    return path


def _dejavu_mono() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / MONO_FONT


def _subset(src: Path, chars: set[str]):
    """``src`` cut to ``chars`` (unhinted, only the copyright, style and version names kept)."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    options = subset.Options()
    options.hinting = False          # browsers draw these unhinted anyway; the hints were half the file
    options.name_IDs = [0, 2, 5]     # copyright, style, version; the font's own names go (renamed below)
    options.name_languages = [0x409]
    font = TTFont(str(src))
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(sorted(chars)))
    level = logging.getLogger("fontTools").level
    logging.getLogger("fontTools").setLevel(logging.ERROR)   # "TSI* dropped": the VTT sources, as wanted
    try:
        subsetter.subset(font)
    finally:
        logging.getLogger("fontTools").setLevel(level)
    return font


def _woff(font, family: str, weight: int) -> bytes:
    """The font renamed ``family`` (the licenses reserve the original names for unmodified fonts), as WOFF
    (zlib: brotli, for WOFF2, is not installed, and the files are small)."""
    style = "Bold" if weight >= 600 else "Regular"
    name = font["name"]
    for name_id, value in ((1, family), (4, f"{family} {style}"), (6, f"{family.replace(' ', '')}-{style}"),
                           (16, family), (17, style)):
        name.setName(value, name_id, 3, 1, 0x409)
    out = io.BytesIO()
    font.flavor = "woff"
    font.save(out)
    return out.getvalue()


def subset_hangul_font(src: Path, chars: set[str], weight: int) -> bytes:
    """A WOFF font with only ``chars`` of ``src``, named HANGUL_FAMILY (copyright and version kept)."""
    return _woff(_subset(src, chars), HANGUL_FAMILY, weight)


def mono_advance_em() -> float:
    """The width of one column of Course Mono, in em."""
    from fontTools.ttLib import TTFont

    font = TTFont(str(_dejavu_mono()))
    return font["hmtx"][font.getBestCmap()[ord("0")]][0] / font["head"].unitsPerEm


def widen_to_columns(font, chars: set[str], columns: int, column_em: float) -> None:
    """Give every glyph of ``chars`` the advance of ``columns`` monospaced columns of ``column_em`` em
    each, its outline centred in it (a composite glyph is first drawn out into one outline, so that
    glyphs sharing a part are each moved once)."""
    from fontTools.pens.recordingPen import DecomposingRecordingPen
    from fontTools.pens.transformPen import TransformPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    upm = font["head"].unitsPerEm
    advance = round(columns * column_em * upm)
    cmap, glyf, hmtx = font.getBestCmap(), font["glyf"], font["hmtx"]
    glyph_set = font.getGlyphSet()
    names = sorted({cmap[ord(c)] for c in chars if ord(c) in cmap})
    outlines = {}
    for name in names:
        recording = DecomposingRecordingPen(glyph_set)
        glyph_set[name].draw(recording)
        outlines[name] = recording
    for name in names:
        shift = (advance - hmtx[name][0]) / 2
        pen = TTGlyphPen(None)
        outlines[name].replay(TransformPen(pen, (1, 0, 0, 1, shift, 0)))
        glyph = pen.glyph()
        glyph.recalcBounds(glyf)
        glyf[name] = glyph
        hmtx[name] = (advance, getattr(glyph, "xMin", 0))
    font["hhea"].advanceWidthMax = max(font["hhea"].advanceWidthMax, advance)


def hangul_mono_font(chars: set[str]) -> bytes:
    """NanumGothic cut to ``chars``, each two columns of Course Mono wide, named HANGUL_MONO_FAMILY."""
    from fontTools import subset

    font = _subset(_nanum(HANGUL_FONTS[400]), chars)
    widen_to_columns(font, chars, 2, mono_advance_em())
    # the parts the composite glyphs were made of are no longer referenced: cut again
    options = subset.Options()
    options.hinting = False
    options.name_IDs = ["*"]
    options.name_languages = ["*"]
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(sorted(chars)))
    subsetter.subset(font)
    return _woff(font, HANGUL_MONO_FAMILY, 400)


def mono_font(chars: set[str]) -> bytes:
    """DejaVu Sans Mono cut to ``chars`` (and printable ASCII), named MONO_FAMILY."""
    return _woff(_subset(_dejavu_mono(), chars | MONO_ALWAYS), MONO_FAMILY, 400)


def _hangul_shown(context: dict) -> bool:
    return any(HANGUL.search(str(context.get(key) or "")) for key in ("body", "title", "toc", "display_toc"))


def _preload_fonts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Pages that show Hangul (and the search page, whose results may) ask for the Korean font first.
    The code fonts are not preloaded: they would compete with the stylesheets for the first paint
    (chapter 08 on slow 4G: 4.1 s with them), and a browser asks for them when it lays out code."""
    if app.builder.format != "html" or not (pagename == "search" or _hangul_shown(context)):
        return
    links = "".join(f'<link rel="preload" href="{context["pathto"](hangul_font_path(w), 1)}" as="font" '
                    f'type="font/woff" crossorigin="anonymous">\n' for w in HANGUL_FONTS)
    context["metatags"] = context.get("metatags", "") + links


def _write(target: Path, data: bytes) -> None:
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def _write_fonts(app: Sphinx, exception) -> None:
    """After the build: the Korean font, cut to the Hangul of every page and search source, and the
    monospaced fonts, cut to what the pages' code and outputs show."""
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    chars: set[str] = set()
    code: set[str] = set()
    for path in [*out.rglob("*.html"), *out.glob("_sources/**/*.txt"), *out.glob("_sources/**/*.ipynb"),
                 out / "searchindex.js"]:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            chars |= hangul_in(text)
            if path.suffix == ".html":
                code |= set(code_text_in(text))
    code_hangul = {c for c in code if HANGUL.match(c)}
    fonts = out / "_static" / "fonts"
    fonts.mkdir(parents=True, exist_ok=True)
    for weight, name in HANGUL_FONTS.items():
        _write(out / hangul_font_path(weight), subset_hangul_font(_nanum(name), chars or {"\uac00"}, weight))
    _write(out / MONO_FONT_PATH, mono_font({c for c in code if c.isprintable() and not HANGUL.match(c)}))
    _write(out / HANGUL_MONO_FONT_PATH, hangul_mono_font(code_hangul or {"\uac00"}))
    (fonts / "course-hangul.txt").write_text(
        f"{HANGUL_FAMILY}: NanumGothic (regular, bold) (c) NHN Corporation (NAVER), SIL Open Font License 1.1,\n"
        "as shipped by the koreanize-matplotlib wheel, cut by the course's build to the Hangul this site shows\n"
        f"({len(chars)} characters) and renamed, as the license requires of a modified font.\n"
        f"{HANGUL_MONO_FAMILY}: the same NanumGothic (regular), cut to the Hangul of the site's code and outputs\n"
        f"({len(code_hangul)} characters), each glyph centred in two columns of {MONO_FAMILY}, and renamed.\n"
        f"{MONO_FAMILY}: DejaVu Sans Mono (Bitstream Vera license, DejaVu changes in the public domain), as\n"
        "shipped by matplotlib, cut to the characters of the site's code and outputs and renamed, as the\n"
        "license requires of a modified font.\n", encoding="utf-8")


def _exercises_tool():
    """tools/exercises.py."""
    return _tool("exercises")


_SENTENCE_END = re.compile(r"(?<=[a-z0-9`)\]][.:])\s+(?=[A-Z*`$])")


def _first_paragraph(markdown: str) -> str:
    lines = []
    for line in markdown.strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)


def describe(path: Path) -> dict:
    """Title, summary and questions of one master notebook (otter assign format)."""
    nb = nbformat.read(path, as_version=4)
    title, summary, questions = None, "", []
    cells = nb.cells
    for i, cell in enumerate(cells):
        heading = re.match(r"#\s+([^\n]+)\n?(.*)", cell.source.strip(), re.S) if cell.cell_type == "markdown" else None
        if title is None and heading:
            title = re.sub(r"^Exercise:\s*", "", heading.group(1).strip())
            title = title[:1].upper() + title[1:]
            summary = re.sub(r":$", ".", _first_paragraph(heading.group(2)))
        if cell.cell_type == "raw" and cell.source.lstrip().startswith("# BEGIN QUESTION"):
            prompt = next((c for c in cells[i + 1:] if c.cell_type == "markdown"), None)
            if prompt is not None:
                first = _SENTENCE_END.split(_first_paragraph(prompt.source), maxsplit=1)[0]
                questions.append(re.sub(r":$", ".", first))
    return {"title": title or path.stem, "summary": summary, "questions": questions}


class ExerciseSets(SphinxDirective):
    """The list of all exercise sets, one section per set."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        tool = _exercises_tool()
        masters = tool.discover()
        if not masters:
            raise self.error(f"exercise-sets: no master notebook under {tool.EXERCISES}")
        chapters = Path(self.env.srcdir) / "chapters"
        lines: list[str] = []
        for master in masters:
            self.env.note_dependency(str(master.path))
            info = describe(master.path)
            student = master.student_nb(tool.DIST).relative_to(ROOT).as_posix()
            chapter = (f"{{doc}}`/chapters/{master.chapter}`"
                       if (chapters / f"{master.chapter}.ipynb").exists() else f"`{master.chapter}`")
            lines += [f"## {info['title']}", "",
                      f"Chapter: {chapter}. {{download}}`Student notebook ({master.name}.ipynb) </{student}>`", ""]
            if info["summary"]:
                lines += [info["summary"], ""]
            lines += [f"{n}. {q}" for n, q in enumerate(info["questions"], 1)] + [""]
        container = nodes.container(classes=["exercise-sets"])
        self.state.nested_parse(StringList(lines, source="exercises/"), self.content_offset, container)
        return [container]


# ----------------------------------------------------------------------------- translated directive titles

def _keep_heading_slugs(app: Sphinx, doctree: nodes.document) -> None:
    """Keep a page's heading anchors when a translated directive title is parsed.

    In a translated build Sphinx parses each message's translation on its own, and gives a title's
    (an admonition's, such as the "Run it yourself" box's) an underline to make it parse as a title. MyST
    then reads it as a one-heading document and stores that heading as the page's only anchor
    (``env.metadata[docname]["myst_slugs"]``): every link to the page's sections
    (``page.ipynb#the-two-decoders``, the glossary's) became "local id not found". The page's own parse
    kept its anchors on the document: they are put back here, after the translation transforms."""
    slugs = getattr(doctree, "myst_slugs", None)
    if slugs:
        app.env.metadata[app.env.docname]["myst_slugs"] = slugs


def setup(app: Sphinx) -> dict:
    # Before any extension's builder-inited handler adds its inline scripts.
    app.connect("builder-inited", _one_name_for_inline_scripts, priority=1)
    app.add_directive("exercise-sets", ExerciseSets)
    app.connect("html-page-context", _search_page_math)
    app.connect("html-page-context", _preload_fonts)
    app.connect("build-finished", _write_fonts)
    app.connect("build-finished", _drop_fontawesome_script)
    app.connect("build-finished", _korean_literals)
    app.connect("html-page-context", _static_widgets, priority=900)   # after myst-nb added its scripts
    app.connect("doctree-read", _hide_test_markers)
    app.connect("doctree-read", _alt_text_for_plots)
    app.add_config_value("course_repository", "", "env")
    app.connect("config-inited", _name_the_repository)
    app.connect("config-inited", _korean_config)
    app.connect("builder-inited", _theme_words)
    app.add_search_language(_search_language_korean())
    app.connect("html-page-context", _language_switch)
    app.connect("doctree-read", _untranslated_math)
    app.connect("doctree-read", _pending_note)
    app.connect("doctree-read", _translate_toctree_captions)
    app.connect("doctree-read", _keep_heading_slugs)
    # before Sphinx's download collector (priority 500) reads the box's download links
    app.connect("doctree-read", _add_run_box, priority=100)
    # after the run box, before the download collector
    app.connect("doctree-read", _student_notebooks_in_the_site_language, priority=200)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
