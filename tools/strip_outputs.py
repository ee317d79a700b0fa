#!/usr/bin/env python
"""Clear notebook outputs before commit, except in cells nbval checks.

A cell whose source starts with ``# NBVAL_CHECK_OUTPUT`` keeps its outputs: they are
the reference nbval compares a fresh run against. Every other cell loses its outputs
and execution count, and notebook metadata that changes from run to run is dropped.

    python tools/strip_outputs.py chapters/*.ipynb          # rewrite in place
    python tools/strip_outputs.py --check chapters/*.ipynb  # exit 1 if any would change
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARKER = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell: dict) -> bool:
    src = cell.get("source", "")
    src = "".join(src) if isinstance(src, list) else src
    return src.lstrip().startswith(MARKER)


def strip(nb: dict) -> dict:
    for cell in nb.get("cells", []):
        cell.get("metadata", {}).pop("execution", None)
        if cell.get("cell_type") != "code":
            continue
        if is_checked(cell):
            continue
        cell["outputs"] = []
        cell["execution_count"] = None
    meta = nb.get("metadata", {})
    meta.pop("widgets", None)
    meta.pop("papermill", None)
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="report notebooks that are not stripped")
    args = ap.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        new = json.dumps(strip(nb), indent=1, ensure_ascii=False) + "\n"
        if new != text:
            dirty.append(path)
            if not args.check:
                tmp = path.with_suffix(".ipynb.tmp")
                tmp.write_text(new, encoding="utf-8")
                tmp.replace(path)
    if args.check and dirty:
        print("not stripped (run tools/strip_outputs.py):", *map(str, dirty), sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
