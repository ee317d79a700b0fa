#!/usr/bin/env python
"""Execute a notebook without the cells that carry a given tag, and save the executed copy.

For recording one section of a chapter with the full recipe when another section's full
recipe is too long to re-run at the same time. Chapter 02 tags its IMDB cells ``imdb``; its
NSMC section only needs the untagged cells (imports, definitions, the NSMC cells):

    COURSE_MODE=full python tools/execute_section.py chapters/02_bahdanau_imdb.ipynb \\
        --skip-tag imdb --out _build/02_nsmc_full.ipynb

The notebook runs from its own folder, as ``tools/execute_chapters.py`` runs it; the first
failing cell stops the run (exit status 1) and the partial notebook is still written.
The results the skipped cells would record are left as they are.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat


def without_tag(nb, tag: str):
    """A copy of ``nb`` without the cells tagged ``tag``; ValueError if no cell has the tag."""
    kept = [c for c in nb.cells if tag not in c.get("metadata", {}).get("tags", [])]
    if len(kept) == len(nb.cells):
        raise ValueError(f"no cell is tagged {tag!r}: check the tag")
    out = nbformat.from_dict(nb)
    out.cells = kept
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--skip-tag", required=True, help="leave out the cells with this tag")
    ap.add_argument("--out", type=Path, required=True, help="where to write the executed notebook")
    args = ap.parse_args(argv)
    if not args.notebook.is_file():
        ap.error(f"no notebook at {args.notebook}")
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = without_tag(nbformat.read(args.notebook, as_version=4), args.skip_tag)
    client = NotebookClient(nb, timeout=None, kernel_name="python3",
                            resources={"metadata": {"path": str(args.notebook.resolve().parent)}})
    status = 0
    try:
        client.execute()
    except CellExecutionError as e:
        print(e, file=sys.stderr)
        status = 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, args.out)
    print(f"{'failed' if status else 'executed'}: {len(nb.cells)} cells of {args.notebook} "
          f"without the {args.skip_tag!r} cells -> {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
