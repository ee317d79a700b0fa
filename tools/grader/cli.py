"""Build, prove and grade the course's otter-grader exercises (see exercises/README.md).

    python tools/exercises.py build [--out exercises/_dist] [--only CHAPTER/NAME]
    python tools/exercises.py prove [--no-build] [--only CHAPTER/NAME] [--timeout S] [--jobs N]
    python tools/exercises.py grade SUBMISSIONS_DIR --autograder ZIP [--timeout S] [--out grades.csv]

No Docker, no PDFs, no network. Grading drives a Jupyter kernel cell by cell (per-cell time limit,
interrupt then kill, replay without a cell that killed the kernel). The kernel runs in a bubblewrap
sandbox (no network, read-only system + Python only, its own temporary folder, its own PID
namespace killed when its grading ends). Each question's otter test file (``otter.test_files``)
runs in the grader, with the notebook's names fetched as data or proxies, so tests, expected values
and verdicts never enter the student's process; one broken question costs only its own points.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .masters import DIST
from .build import build
from .grade import grade_dir
from .prove import prove


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="otter assign every master into the dist folder")
    b.add_argument("--out", type=Path, default=DIST)
    b.add_argument("--only", action="append", help="CHAPTER/NAME (repeatable)")
    p = sub.add_parser("prove", help="check every exercise set (the CI proof)")
    p.add_argument("--out", type=Path, default=DIST)
    p.add_argument("--only", action="append", help="CHAPTER/NAME (repeatable)")
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0, help="per cell / per question, seconds")
    p.add_argument("--jobs", type=int, default=2, help="notebooks graded in parallel")
    g = sub.add_parser("grade", help="grade a folder of submissions (no Docker)")
    g.add_argument("submissions", type=Path)
    g.add_argument("--autograder", type=Path, required=True, help="the <name>-autograder.zip")
    g.add_argument("--timeout", type=float, default=60.0, help="per cell / per question, seconds")
    g.add_argument("--out", type=Path, default=Path("grades.csv"))
    g.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        masters = build(a.out, a.only, quiet=False)
        print(f"{len(masters)} exercise set(s) built")
        return 0
    if a.cmd == "prove":
        return prove(a.out, a.only, a.timeout, a.jobs, do_build=not a.no_build)
    grades = grade_dir(a.submissions, a.autograder, a.timeout, a.out, a.jobs)
    for gr in grades:
        print(f"{gr.file:40s} {gr.total:g}/{gr.total_possible:g} ({gr.percent:.1f} %)"
              + (f"  [{' | '.join(gr.notes)}]" if gr.notes else ""))
    print(f"wrote {a.out}")
    return 0
