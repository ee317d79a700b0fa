#!/usr/bin/env python
"""The exercise grader's command line (the code is the package tools/grader/; see
exercises/README.md).

    python tools/exercises.py build [--out exercises/_dist] [--only CHAPTER/NAME]
    python tools/exercises.py prove [--no-build] [--only CHAPTER/NAME] [--timeout S] [--jobs N]
    python tools/exercises.py grade SUBMISSIONS_DIR --autograder ZIP [--timeout S] [--out grades.csv]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tools.grader

from tools.grader import build, cli, grade, kernel, masters, prove, remote, sandbox, translate, wire  # noqa: E402

# the grader's names, for the tests and the book's extension that load this file
# (``E.parse_master``, ``E.Kernel``, ...); the code lives in tools/grader/
for _module in (masters, translate, build, sandbox, wire, kernel, remote, grade, prove, cli):
    globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(cli.main())
