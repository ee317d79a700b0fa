"""How a reader runs a chapter. The "Run this chapter yourself" box of book/_ext/course_site.py, in
both settings of ``course_repository``: a small Sphinx project (one chapter notebook, the course's
extension) built twice, without and with the repository's address. And a chapter notebook run
outside the repository (no ``lib``) stops at its first cell with one message saying what it needs."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "03_transformer"     # a chapter with exercises, so that the box links them


def build(tmp: Path, repository: str, language: str = "en") -> str:
    sphinx = pytest.importorskip("sphinx.application")
    src, out = tmp / "src", tmp / "out"
    (src / "chapters").mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter\n\nSome prose."),
                                         nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, src / "chapters" / f"{CHAPTER}.ipynb")
    for master in (ROOT / "exercises" / CHAPTER).glob("*.ipynb"):   # where the built student notebooks lie
        student = src / "exercises" / "_dist" / CHAPTER / master.stem / "student" / master.name
        student.parent.mkdir(parents=True)
        nbformat.write(nbformat.v4.new_notebook(), student)
    (src / "index.md").write_text(
        "# Index\n\nFrom the root of {{ repository }}.\n\n```{toctree}\nchapters/" + CHAPTER + "\n```\n")
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'course_site']\n"
        "nb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['substitution']\n"
        f"course_repository = {repository!r}\n"
        f"language = {language!r}\n")
    app = sphinx.Sphinx(str(src), str(src), str(out), str(tmp / "doctrees"), "html", status=None, warning=None,
                        freshenv=True)
    app.build()
    return (out / "chapters" / f"{CHAPTER}.html").read_text(encoding="utf-8") + \
        (out / "index.html").read_text(encoding="utf-8")


def test_no_box_and_no_address_until_the_repository_is_set(tmp_path):
    html = build(tmp_path, "")
    assert "course-run-box" not in html, "a chapter shows the run box though no repository is set"
    assert "the course's repository (the folder this book was built from)" in html.replace("’", "'")


def test_every_chapter_opens_with_the_box_once_the_repository_is_set(tmp_path):
    url = "https://example.org/course-repo"
    html = build(tmp_path, url)
    assert html.count('class="course-run-box') == 1, "the chapter has no run box (or more than one)"
    box = html[html.index("course-run-box"):]
    box = box[:box.index("</div>")]
    assert f'href="{url}"' in box, "the box does not link the repository"
    assert "tools/setup.sh" in box and "otter-grader" in box
    downloads = re.findall(r'href="([^"]*_downloads/[^"]+\.ipynb)"', box)
    names = {d.rsplit("/", 1)[1] for d in downloads}
    exercises = {p.stem + ".ipynb" for p in (ROOT / "exercises" / CHAPTER).glob("*.ipynb")}
    assert f"{CHAPTER}.ipynb" in names and exercises and exercises <= names, names
    assert html.index("course-run-box") < html.index("Some prose"), "the box is not under the title"
    assert f'href="{url}"' in html[html.index("From the root of"):], "the index does not name the repository"


def test_the_korean_site_s_box_is_in_korean(tmp_path):
    url = "https://example.org/course-repo"
    html = build(tmp_path, url, language="ko")
    box = html[html.index("course-run-box"):]
    box = re.sub(r"<[^>]+>", "", box[:box.index("</div>")])
    assert "이 장을 직접 실행해 보세요." in box and "내려받기:" in box and "연습 문제:" in box, box
    assert url in box and "bash tools/setup.sh" in box and f"chapters/{CHAPTER}.ipynb" in box
    english = [w for w in ("Run this chapter", "Download", "its exercises", "graded with", "clone it") if w in box]
    assert not english, f"the Korean box says {english}"


@pytest.mark.parametrize("chapter", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.stem)
def test_a_chapter_run_outside_the_repository_says_what_it_needs(chapter, monkeypatch):
    # A downloaded notebook in a Python without the course's package: its first cell raises one
    # error that names the repository and its setup command, not "No module named 'lib'".
    first = next(c for c in nbformat.read(chapter, as_version=4).cells if c.cell_type == "code")
    monkeypatch.setitem(sys.modules, "lib", None)        # `import lib` fails as where it is not installed
    with pytest.raises(ModuleNotFoundError) as missing:
        exec(compile(first.source, chapter.name, "exec"), {})
    message = str(missing.value)
    assert "repository" in message and "bash tools/setup.sh" in message, message
    assert missing.value.__cause__ is None and missing.value.__suppress_context__, "two chained tracebacks"
