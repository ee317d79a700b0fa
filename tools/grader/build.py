"""`otter assign` every master into the dist folder (student notebook, autograder zip)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
from pathlib import Path

import nbformat

from .masters import DIST, EXERCISES, Master, ROOT, discover
from .translate import LANGUAGES, translate


def build(dist: Path = DIST, only: list[str] | None = None, quiet: bool = True,
          root: Path = EXERCISES) -> list[Master]:
    """otter assign every master into dist/<chapter>/<name>/{student,autograder}; prune stale sets."""
    from otter.assign import main as assign_main

    masters = discover(root, only=only)
    marker = dist / ".exercises-dist"
    if dist.exists() and any(dist.iterdir()) and not marker.exists():
        raise SystemExit(f"{dist} is not empty and was not made by this tool; refusing to write or prune it")
    dist.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by tools/exercises.py build; stale sets here are deleted\n")
    (dist / ".gitignore").write_text("*\n")
    for m in masters:
        final = m.out_dir(dist)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{m.name}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                assign_main(str(m.path), str(tmp), no_pdfs=True, no_run_tests=True)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"otter assign failed for {m.key}: {type(e).__name__}: {e}\n{out.getvalue()}")
        zips = sorted((tmp / "autograder").glob(f"{m.name}-autograder_*.zip"))
        if len(zips) != 1:
            raise SystemExit(f"{m.key}: expected one autograder zip, found {[z.name for z in zips]}")
        zips[0].rename(tmp / "autograder" / f"{m.name}-autograder.zip")
        for nb_file in (tmp / "student" / f"{m.name}.ipynb", tmp / "autograder" / f"{m.name}.ipynb"):
            stable_cell_ids(nb_file, m.path, m.key)
        student = tmp / "student" / f"{m.name}.ipynb"
        for lang in LANGUAGES:   # the English student notebook with its Markdown translated
            found = translations(m, lang)
            if found is not None:
                translate(student, student.parent / lang / student.name, found)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if not quiet:
            print(f"built {m.key} -> {final.relative_to(ROOT) if final.is_relative_to(ROOT) else final}")
    if not only:  # prune outputs whose master is gone
        keep = {(m.chapter, m.name) for m in masters}
        for chapter in dist.iterdir():
            if not chapter.is_dir():
                continue
            for d in chapter.iterdir():
                if (chapter.name, d.name) not in keep:
                    shutil.rmtree(d) if d.is_dir() else d.unlink()
            if not any(chapter.iterdir()):
                chapter.rmdir()
    return masters


def translations(m: Master, lang: str) -> dict[str, str] | None:
    """The set's messages translated into ``lang`` (tools/i18n.py reads its catalog); None: no catalog."""
    from tools import i18n

    return i18n.translations(f"exercises/{m.key}", lang)


def stable_cell_ids(nb_file: Path, master: Path, salt: str) -> None:
    """Give the cells otter assign adds (random ids) ids derived from their place and text.

    Cells copied from the master keep the master's ids (the grader finds solution cells by
    them); only ids that change from build to build are replaced, so that building twice
    publishes byte-identical notebooks.
    """
    nb = nbformat.read(str(nb_file), as_version=4)
    master_ids = {c.get("id") for c in nbformat.read(str(master), as_version=4).cells}
    taken = {c.get("id") for c in nb.cells if c.get("id") in master_ids}
    for i, cell in enumerate(nb.cells):
        if cell.get("id") in master_ids:
            continue
        digest = hashlib.sha256(f"{salt}|{i}|{cell.cell_type}|{cell.source}".encode()).hexdigest()
        new_id = next(digest[k:k + 8] for k in range(0, 57) if digest[k:k + 8] not in taken)
        cell["id"] = new_id
        taken.add(new_id)
    nbformat.write(nb, str(nb_file))
