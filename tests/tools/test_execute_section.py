"""tools/execute_section.py: run a notebook without the cells of one tag."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import execute_section  # noqa: E402


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    for source, tags in cells:
        c = nbformat.v4.new_code_cell(source)
        if tags:
            c.metadata["tags"] = tags
        nb.cells.append(c)
    return nb


def test_without_tag_drops_exactly_the_tagged_cells_and_leaves_the_notebook_alone():
    nb = notebook(("a = 1", []), ("b = 2", ["imdb"]), ("c = 3", ["other", "imdb"]), ("d = 4", ["other"]))
    kept = execute_section.without_tag(nb, "imdb")
    assert [c.source for c in kept.cells] == ["a = 1", "d = 4"]
    assert len(nb.cells) == 4


def test_without_tag_refuses_a_tag_no_cell_has():
    with pytest.raises(ValueError, match="no cell is tagged 'nsmc'"):
        execute_section.without_tag(notebook(("a = 1", ["imdb"])), "nsmc")


def test_chapter_02_nsmc_section_needs_no_imdb_cell():
    """Names the NSMC cells use must be defined by untagged cells (or by themselves)."""
    import ast
    import builtins

    nb = execute_section.without_tag(nbformat.read(ROOT / "chapters" / "02_bahdanau_imdb.ipynb", 4), "imdb")
    defined, used = set(dir(builtins)) | {"display"}, []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
                defined |= {a.arg for a in node.args.args + node.args.kwonlyargs} if hasattr(node, "args") else set()
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
        used += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    assert sorted(set(used) - defined) == []
