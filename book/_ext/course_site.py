"""The course's Sphinx extension (sphinx.local_extensions in _config.yml).

* Inline scripts are written once per page. Sphinx 7.4 (the newest Jupyter Book 1.x
  allows) registers an inline script added after the builder started twice: once under
  the file name None, once under '' (sphinx-doc/sphinx#13402, fixed in Sphinx 8.2). Every
  page then declared sphinx-thebe's ``const THEBE_JS_URL`` twice, a SyntaxError in the
  reader's browser. The builder's add_js_file is given '' for None, as Sphinx 8.2 does.
* The search page typesets the formulas in its result snippets (``_static/search_math.js``,
  with the MathJax the site serves) instead of showing their LaTeX source.
* ``{exercise-sets}``: the list of every graded exercise set, discovered from the master
  notebooks in exercises/ (the same discovery as tools/exercises.py), with what each
  covers, its chapter and the student notebook to download.
"""
from __future__ import annotations

import importlib.util
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


def _exercises_tool():
    """tools/exercises.py, imported once (its dataclasses need it in sys.modules)."""
    name = "course_exercises_tool"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "exercises.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


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


def setup(app: Sphinx) -> dict:
    # Before any extension's builder-inited handler adds its inline scripts.
    app.connect("builder-inited", _one_name_for_inline_scripts, priority=1)
    app.add_directive("exercise-sets", ExerciseSets)
    app.connect("html-page-context", _search_page_math)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
