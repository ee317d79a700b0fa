"""The set-up, the book configuration and the build tools do what the README promises."""
from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import execute_chapters  # noqa: E402
import strip_outputs  # noqa: E402


# ----------------------------------------------------------------------------- set-up

def requirement_lines(path: Path) -> list[str]:
    return [l.split("#")[0].strip() for l in path.read_text().splitlines() if l.split("#")[0].strip()]


def test_torch_is_pinned_through_the_constraints_file():
    assert "torch==2.13.0" in requirement_lines(ROOT / "constraints.txt")
    setup = (ROOT / "tools" / "setup.sh").read_text()
    assert re.search(r"pip install [^\n]*-c constraints\.txt -r requirements\.txt", setup), \
        "tools/setup.sh must install the requirements under the constraints file"
    assert torch.__version__.startswith("2.13.0")


def test_every_requirement_is_pinned():
    for line in requirement_lines(ROOT / "requirements.txt"):
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][A-Za-z0-9.+\-]*", line), f"not pinned: {line!r}"


def test_readme_gives_the_two_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash tools/build.sh" in readme and "bash tools/test.sh" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash tools/test\.sh$", ci, re.M)
    for script in ("build.sh", "test.sh", "setup.sh"):
        assert (ROOT / "tools" / script).exists()


# ----------------------------------------------------------------------------- the book

def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] for c in part["chapters"]]


def test_toc_has_the_three_parts_of_the_syllabus_and_every_file_exists():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    captions = [p["caption"] for p in toc["parts"]]
    for part in ("Part I", "Part II", "Part III"):
        assert any(c.startswith(part) for c in captions), f"{part} missing from _toc.yml"
    for f in [toc["root"], *toc_files()]:
        assert (ROOT / f"{f}.md").exists() or (ROOT / f"{f}.ipynb").exists(), f"{f} is in _toc.yml but missing"


def test_config_executes_with_cache_and_serves_its_own_javascript():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["execute"]["execute_notebooks"] == "cache"
    assert cfg["execute"]["timeout"] > 0
    sphinx = cfg["sphinx"]["config"]
    assert not re.match(r"^(https?:)?//", sphinx["mathjax_path"])
    for url in sphinx["nb_ipywidgets_js"]:
        assert not re.match(r"^(https?:)?//", url), f"widget JS from another host: {url}"
    assert "book/_static_vendor" in sphinx["html_static_path"]


def test_bibliography_has_the_papers_of_the_syllabus():
    from pybtex.database import parse_file

    keys = set(parse_file(str(ROOT / "references.bib")).entries)
    for key in ("bahdanau2015neural", "luong2015effective", "vaswani2017attention", "maas2011learning",
                "sukhbaatar2019adaptive", "sukhbaatar2019augmenting", "lample2019large", "peters2018deep",
                "radford2018improving", "devlin2019bert", "dai2019transformer", "yang2019xlnet",
                "lewis2020bart", "lan2020albert", "raffel2020exploring", "fedus2022switch", "sun2019ernie"):
        assert key in keys, key


def test_every_paper_in_the_bibliography_has_author_title_and_year():
    """A paper without a year builds with a warning, and -W turns it into a failed build."""
    from pybtex.database import parse_file

    for key, entry in parse_file(str(ROOT / "references.bib")).entries.items():
        if entry.type in ("article", "inproceedings", "book", "incollection"):
            missing = [f for f in ("title", "year") if f not in entry.fields]
            missing += [] if entry.persons.get("author") else ["author"]
            assert not missing, f"{key}: missing {', '.join(missing)}"


# Entries with no identifier a reader could follow, each with the reason (none at present: every
# paper has its arXiv number or DOI, every report, corpus and program its address).
UNLINKED_REFERENCES: dict[str, str] = {}


def test_every_reference_links_to_the_paper():
    # A reader of the bibliography can open each paper: an arXiv number (eprint), a DOI or an
    # address (url), which the bibliography style renders as a link (the site test checks that).
    from pybtex.database import parse_file

    entries = parse_file(str(ROOT / "references.bib")).entries
    unlinked = sorted(k for k, e in entries.items() if not {"eprint", "doi", "url"} & {f.lower() for f in e.fields})
    assert unlinked == sorted(UNLINKED_REFERENCES), f"entries without a link: {sorted(set(unlinked) - set(UNLINKED_REFERENCES))}"
    for key, entry in entries.items():
        fields = {f.lower(): v for f, v in entry.fields.items()}
        if "eprint" in fields:
            assert re.fullmatch(r"\d{4}\.\d{4,5}", fields["eprint"]), f"{key}: eprint {fields['eprint']!r} is not an arXiv number"
            assert fields.get("archiveprefix", "").lower() == "arxiv", f"{key}: eprint without archiveprefix = {{arXiv}}"
        if "doi" in fields:
            assert re.fullmatch(r"10\.\d{4,9}/\S+", fields["doi"]), f"{key}: {fields['doi']!r} is not a DOI"
        if "url" in fields:
            assert re.fullmatch(r"https?://\S+", fields["url"]), f"{key}: {fields['url']!r} is not an address"


def test_every_citation_in_the_book_is_in_the_bibliography():
    from pybtex.database import parse_file

    keys = set(parse_file(str(ROOT / "references.bib")).entries)
    sources = [*ROOT.glob("*.md"), *(ROOT / "chapters").glob("*.ipynb")]
    for src in sources:
        for group in re.findall(r"\{cite(?::[a-z]+)?\}`([^`]+)`", src.read_text(encoding="utf-8")):
            for key in group.split(","):
                assert key.strip() in keys, f"{src.name} cites {key.strip()!r}, not in references.bib"


def test_the_glossary_covers_every_chapter_in_both_languages():
    # Each chapter's key terms, in English and Korean, with a link to where the chapter defines
    # them (the site test checks that every link's section exists).
    rows = [r for r in (ROOT / "glossary.md").read_text(encoding="utf-8").splitlines()
            if r.startswith("| ") and "](chapters/" in r]
    per_chapter: dict[str, int] = {}
    for r in rows:
        english, korean, where = (c.strip() for c in r.strip("|").split("|"))
        assert english and re.search("[\uac00-\ud7a3]", korean), f"a glossary row without its Korean term: {r}"
        chapter = re.search(r"\]\(chapters/([^.#)]+)\.ipynb", where).group(1)
        per_chapter[chapter] = per_chapter.get(chapter, 0) + 1
    chapters = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))
    thin = {c: per_chapter.get(c, 0) for c in chapters if per_chapter.get(c, 0) < 3}
    assert not thin, f"chapters with fewer than three glossary terms: {thin}"


def test_chapters_are_committed_without_stray_outputs():
    for nb in (ROOT / "chapters").glob("*.ipynb"):
        assert strip_outputs.main(["--check", str(nb)]) == 0, f"{nb.name}: run tools/strip_outputs.py"


def test_model_modules_re_export_nothing_from_data_or_train():
    """lib.models sits beside lib.data and lib.train: a model module's public names are its own."""
    import importlib
    import pkgutil

    import lib.models
    for info in pkgutil.iter_modules(lib.models.__path__):
        module = importlib.import_module(f"lib.models.{info.name}")
        for name in getattr(module, "__all__", []):
            origin = getattr(getattr(module, name), "__module__", None) or ""
            assert not origin.startswith(("lib.data", "lib.train")), f"lib.models.{info.name}.{name} is {origin}'s"


def test_every_chapter_cell_has_a_unique_id():
    """nbformat 4.5 cells carry an ``id`` (nbformat warns without one, and will refuse the notebook)."""
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        ids = [cell.get("id") for cell in nb["cells"]]
        missing = [i for i, cid in enumerate(ids) if not cid]
        assert not missing, f"{path.name}: cells {missing} have no id"
        assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids"


# ----------------------------------------------------------------------------- tools

def make_notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_strip_outputs_keeps_only_checked_cells(tmp_path):
    nb = nbformat.v4.new_notebook()
    kept = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)", execution_count=1,
                                     outputs=[nbformat.v4.new_output("stream", text="1\n")])
    dropped = nbformat.v4.new_code_cell("print(2)", execution_count=2,
                                        outputs=[nbformat.v4.new_output("stream", text="2\n")])
    nb.cells = [kept, dropped]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert strip_outputs.main(["--check", str(path)]) == 1
    strip_outputs.main([str(path)])
    out = json.loads(path.read_text())
    assert out["cells"][0]["outputs"] and out["cells"][0]["execution_count"] == 1
    assert out["cells"][1]["outputs"] == [] and out["cells"][1]["execution_count"] is None
    assert strip_outputs.main(["--check", str(path)]) == 0


def cached_notebook(cache: Path, path: Path):
    """The executed notebook the cache holds for ``path``."""
    from jupyter_cache import get_cache

    record = get_cache(str(cache)).match_cache_notebook(nbformat.read(path, as_version=4))
    return get_cache(str(cache)).get_cache_bundle(record.pk).nb


def test_execute_chapters_caches_a_notebook_and_kills_one_over_budget(tmp_path, capsys):
    cache = tmp_path / "cache"
    quick = make_notebook(tmp_path / "quick.ipynb", "x = 6 * 7\nprint(x)")
    slow = make_notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(600)")
    execute_chapters.ROOT, root = tmp_path, execute_chapters.ROOT
    try:
        assert execute_chapters.execute([quick], budget=120, cache_dir=cache) == 0
        cached = cached_notebook(cache, quick)
        assert "42" in cached.cells[0].outputs[0]["text"]
        assert execute_chapters.execute([quick], budget=120, cache_dir=cache) == 0
        assert "cached, not run again" in capsys.readouterr().out
        start = time.perf_counter()
        assert execute_chapters.execute([slow], budget=8, cache_dir=cache) == 1
        assert time.perf_counter() - start < 60
        assert "over its budget" in capsys.readouterr().out
    finally:
        execute_chapters.ROOT = root


def test_execute_chapters_reports_each_cells_time_and_caches_no_timestamps(tmp_path, capsys):
    """The slow cell is named with its seconds (printed and in _build/cell_timings.json); the
    timestamps nbclient records to measure it stay out of the cached notebook; a cached run keeps
    the timings of the run that measured them."""
    cache = tmp_path / "cache"
    nap = make_notebook(tmp_path / "nap.ipynb", "import time\ntime.sleep(1.5)")
    execute_chapters.ROOT, root = tmp_path, execute_chapters.ROOT
    try:
        assert execute_chapters.execute([nap], budget=120, cache_dir=cache) == 0
        cached = cached_notebook(cache, nap)
        assert "execution" not in cached.cells[0].metadata
        [[index, seconds, line]] = json.loads((tmp_path / "_build" / "cell_timings.json").read_text())["nap.ipynb"]
        assert index == 0 and 1.4 <= seconds < 30 and line == "import time"
        assert f"slowest cells: cell 0 {seconds:.1f} s (import time)" in capsys.readouterr().out
        # a later run that finds it cached (the book build after the test pass) keeps what was measured
        assert execute_chapters.execute([nap], budget=120, cache_dir=cache) == 0
        assert "cached, not run again" in capsys.readouterr().out
        timings = json.loads((tmp_path / "_build" / "chapter_timings.json").read_text())
        assert timings["nap.ipynb"] >= 1.4
        assert json.loads((tmp_path / "_build" / "cell_timings.json").read_text())["nap.ipynb"][0][1] == seconds
    finally:
        execute_chapters.ROOT = root


def test_execute_chapters_runs_chapters_side_by_side(tmp_path, capsys):
    """--jobs 2: two chapters run at once (two 6-second notebooks take well under 12 s), each
    result is cached, and a failing or over-budget one among them is still reported."""
    cache = tmp_path / "cache"
    naps = [make_notebook(tmp_path / f"nap{i}.ipynb", f"import time\ntime.sleep(6)\nprint({i})") for i in (1, 2)]
    broken = make_notebook(tmp_path / "broken.ipynb", "raise ValueError('boom')")
    slow = make_notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(600)")
    execute_chapters.ROOT, root = tmp_path, execute_chapters.ROOT
    try:
        start = time.perf_counter()
        assert execute_chapters.execute(naps, budget=120, cache_dir=cache, jobs=2) == 0
        both = time.perf_counter() - start
        assert execute_chapters.execute(naps, budget=120, cache_dir=cache, jobs=2) == 0
        assert capsys.readouterr().out.count("cached, not run again") == 2
        start = time.perf_counter()
        assert execute_chapters.execute([naps[0]], budget=120, cache_dir=cache, force=True) == 0
        one = time.perf_counter() - start
        assert both < 1.6 * one, (both, one)
        assert execute_chapters.execute([broken, slow, naps[1]], budget=15, cache_dir=cache, force=True,
                                        jobs=2) == 1
        out = capsys.readouterr().out
        assert "broken.ipynb: FAILED after" in out and "slow.ipynb: FAILED, over its budget" in out
        assert "nap2.ipynb: " in out and "nap2.ipynb: FAILED" not in out
    finally:
        execute_chapters.ROOT = root


def test_toc_notebooks_lists_chapters_in_reading_order():
    names = [p.name for p in execute_chapters.toc_notebooks()]
    assert names == sorted(names)
    assert all(p.suffix == ".ipynb" for p in execute_chapters.toc_notebooks())


def test_checked_cells_keep_a_reference_output():
    # nbval passes a `# NBVAL_CHECK_OUTPUT` cell that has no stored output without checking
    # anything, so every checked cell must carry the output a fresh run is compared with.
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    assert chapters
    for path in chapters:
        nb = nbformat.read(path, as_version=4)
        checked = [c for c in nb.cells if c.cell_type == "code" and strip_outputs.is_checked(c)]
        assert checked, f"{path.name} has no `# NBVAL_CHECK_OUTPUT` cell"
        for cell in checked:
            assert cell.outputs, f"{path.name}: checked cell without a stored output:\n{cell.source[:200]}"


def checked_notebook(path: Path, stored: str, *more: str) -> Path:
    """A notebook whose checked cell prints 42 but stores ``stored`` as its output."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)", execution_count=1,
                                          outputs=[nbformat.v4.new_output("stream", name="stdout", text=stored)]),
                nbformat.v4.new_code_cell("import random\nprint(random.random())")]       # unchecked: varies
    nb.cells += [nbformat.v4.new_code_cell(s) for s in more]
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# A chapter"))   # the cache keeps code cells only
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_execute_chapters_check_compares_checked_cells_and_fails_on_errors(tmp_path, capsys):
    """``--check`` replaces nbval: a checked cell must reproduce its stored output, an error fails,
    unchecked cells may print anything; the verdicts land in a JUnit report."""
    cache, junit = tmp_path / "cache", tmp_path / "report.xml"
    good = checked_notebook(tmp_path / "good.ipynb", "42\n")
    changed = checked_notebook(tmp_path / "changed.ipynb", "43\n")
    broken = checked_notebook(tmp_path / "broken.ipynb", "42\n", "raise RuntimeError('boom')")
    execute_chapters.ROOT, root = tmp_path, execute_chapters.ROOT
    try:
        assert execute_chapters.execute([good], budget=120, cache_dir=cache, check=True, junit=junit) == 0
        assert "every checked cell gives its stored output" in capsys.readouterr().out
        assert execute_chapters.execute([changed], budget=120, cache_dir=cache, check=True, junit=junit) == 1
        out = capsys.readouterr().out
        assert "outputs differ" in out and "-43" in out and "+42" in out
        failure = ET.parse(junit).getroot().find("testcase/failure")
        assert failure is not None and "outputs differ" in failure.text
        assert execute_chapters.execute([broken], budget=120, cache_dir=cache, check=True) == 1
        assert "FAILED" in capsys.readouterr().out
        # a cached notebook is checked against the cache; --force runs it again
        assert execute_chapters.execute([changed], budget=120, cache_dir=cache, check=True) == 1
        assert "cached, not run again" in capsys.readouterr().out
        assert execute_chapters.execute([good], budget=120, cache_dir=cache, check=True) == 0
        out = capsys.readouterr().out
        assert "cached, not run again" in out and "every checked cell gives its stored output" in out
        assert execute_chapters.execute([good], budget=120, cache_dir=cache, check=True, force=True,
                                        junit=junit) == 0
        out = capsys.readouterr().out
        assert "cached" not in out and "good.ipynb: " in out
        suite = ET.parse(junit).getroot()
        assert suite.get("tests") == "1" and suite.get("failures") == "0"
    finally:
        execute_chapters.ROOT = root


def test_output_comparison_follows_nbval():
    def nb(*outputs, source="# NBVAL_CHECK_OUTPUT\nx", count=1):
        n = nbformat.v4.new_notebook()
        n.cells = [nbformat.v4.new_code_cell(source, execution_count=count, outputs=list(outputs))]
        return n

    stream = lambda text: nbformat.v4.new_output("stream", name="stdout", text=text)
    result = lambda text, png=None: nbformat.v4.new_output(
        "execute_result", data={"text/plain": text, **({"image/png": png} if png else {})}, execution_count=3)
    compare = execute_chapters.compare_outputs
    assert compare(nb(stream("a\nb\n")), nb(stream("a\n"), stream("b\n"))) == []        # streams merged
    assert compare(nb(result("1", "AAAA")), nb(result("1", "BBBB"))) == []             # images ignored
    assert compare(nb(result("1")), nb(result("2")))                                  # values compared
    assert compare(nb(stream("1\n")), nb(result("1")))                                # kinds compared
    assert compare(nb(stream("1\n"), source="x"), nb(stream("2\n"), source="x")) == []  # unchecked
    tagged = nb(stream("1\n"), source="x")
    tagged.cells[0].metadata["tags"] = ["nbval-check-output"]
    assert compare(tagged, nb(stream("2\n")))
    assert compare(nb(stream("1\n"), count=None), nb(stream("2\n")))                  # unrun but has output


# ----------------------------------------------------------------------------- back-links

def _toc_chapters() -> set[str]:
    return {f"{c['file']}.ipynb" for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]
            for c in part["chapters"] if c["file"].startswith("chapters/")}


@pytest.mark.parametrize("module", sorted(
    [p for p in (ROOT / "lib" / "models").glob("*.py") if p.name != "__init__.py"]
    + [ROOT / "lib" / name for name in ("attention.py", "generate.py", "layers.py")]),
    ids=lambda p: str(p.relative_to(ROOT)))
def test_lib_modules_link_back_to_the_chapters_that_explain_them(module):
    """A reader of lib's code finds the chapter that explains it: the module docstring ends
    with "Explained in chapters/....ipynb", every chapter named is in the book, and it uses
    the module."""
    import ast
    doc = ast.get_docstring(ast.parse(module.read_text())) or ""
    line = next((l for l in doc.splitlines() if l.startswith("Explained in ")), None)
    assert line, f"{module.name}: its docstring has no 'Explained in chapters/...' line"
    named = re.findall(r"chapters/[\w]+\.ipynb", line)
    assert named, line
    dotted = ".".join(module.relative_to(ROOT).with_suffix("").parts)
    uses = (dotted, f"from {dotted.rsplit('.', 1)[0]} import {module.stem}", str(module.relative_to(ROOT)))
    for chapter in named:
        assert chapter in _toc_chapters(), f"{module.name} links to {chapter}, which is not in the book"
        text = (ROOT / chapter).read_text(encoding="utf-8")
        assert any(u in text for u in uses), f"{chapter} does not use {dotted}"


def test_default_jobs_fill_the_cores_at_the_chapters_thread_count(monkeypatch):
    monkeypatch.delenv("COURSE_NOTEBOOK_JOBS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)), raising=False)
    monkeypatch.setenv("COURSE_CPU_THREADS", "1")
    assert execute_chapters.default_jobs() == 2
    monkeypatch.setenv("COURSE_CPU_THREADS", "2")
    assert execute_chapters.default_jobs() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert execute_chapters.default_jobs() == 4
    monkeypatch.setenv("COURSE_NOTEBOOK_JOBS", "3")
    assert execute_chapters.default_jobs() == 3
    monkeypatch.setenv("COURSE_NOTEBOOK_JOBS", "two")
    with pytest.raises(SystemExit, match="COURSE_NOTEBOOK_JOBS='two'"):
        execute_chapters.default_jobs()


def test_a_kernel_that_dies_before_the_first_cell_is_started_again(tmp_path, monkeypatch):
    # two chapters started side by side can pick the same TCP port: the one whose kernel died before
    # running anything gets another kernel; a failure after a cell ran is not retried
    import jupyter_cache.executors.utils as utils
    real, calls = utils.single_nb_execution, []

    def flaky(nb, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("Kernel died before replying to kernel_info")
        return real(nb, **kwargs)

    monkeypatch.setattr(utils, "single_nb_execution", flaky)
    monkeypatch.setattr(execute_chapters.time, "sleep", lambda s: None)
    src = make_notebook(tmp_path / "nap.ipynb", "print(6 * 7)")
    execute_chapters.run_one(src, tmp_path / "out.ipynb")
    assert len(calls) == 2 and "42" in (tmp_path / "out.ipynb").read_text()

    def always(nb, **kwargs):
        calls.append(1)
        raise RuntimeError("Kernel didn't respond in 60 seconds")

    monkeypatch.setattr(utils, "single_nb_execution", always)
    calls.clear()
    with pytest.raises(RuntimeError, match="respond"):
        execute_chapters.run_one(src, tmp_path / "out2.ipynb")
    assert len(calls) == execute_chapters.KERNEL_STARTS
