#!/usr/bin/env python
"""Execute the book's notebooks, each under a wall-clock budget, into the build cache.

Jupyter Book's own execution only knows a per-cell timeout. This script runs every
notebook listed in ``_toc.yml`` in a child process that is killed when the notebook as
a whole exceeds its budget (``COURSE_NOTEBOOK_TIMEOUT`` seconds, default 900 in the CI
recipe and 6 hours in the full recipe), and stores the executed notebook in the
jupyter-cache that ``jupyter-book build`` reads (``execute_notebooks: cache``).
A notebook whose code has not changed since it was cached is not run again.

    python tools/execute_chapters.py            # all chapters in _toc.yml
    python tools/execute_chapters.py chapters/01_seq2seq_attention.ipynb

Prints the time each notebook took and writes them to ``_build/chapter_timings.json``.
Exit status 1 if any notebook failed or ran out of time.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"


def toc_notebooks(toc: Path = ROOT / "_toc.yml") -> list[Path]:
    """Every ``.ipynb`` file the table of contents names, in reading order."""
    data = yaml.safe_load(toc.read_text())
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def default_budget() -> int:
    if os.environ.get("COURSE_NOTEBOOK_TIMEOUT"):
        return int(os.environ["COURSE_NOTEBOOK_TIMEOUT"])
    sys.path.insert(0, str(ROOT))
    from lib import config

    return 6 * 3600 if config.is_full() else 900


def run_one(src: Path, out: Path) -> None:
    """Child process: execute ``src`` (cwd = its folder) and write the result to ``out``."""
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(src, as_version=4)
    result = single_nb_execution(nb, cwd=str(src.parent), timeout=None, allow_errors=False,
                                 meta_override=True)
    if result.err is not None:
        print(result.exc_string, file=sys.stderr)
        sys.exit(1)
    nbformat.write(nb, out)


def execute(paths: list[Path], budget: int, cache_dir: Path = CACHE) -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(cache_dir))
    timings, failed = {}, []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        nb = nbformat.read(path, as_version=4)
        try:
            cache.match_cache_notebook(nb)
            print(f"[execute] {rel}: cached, not run again", flush=True)
            continue
        except KeyError:
            pass
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / path.name
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, __file__, "--one", str(path), "--out", str(out)],
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the kernel too: it is in the same session
                proc.wait()
                code = None
            seconds = time.perf_counter() - start
            timings[rel] = round(seconds, 1)
            if code is None:
                print(f"[execute] {rel}: FAILED, over its budget of {budget} s", flush=True)
                failed.append(rel)
                continue
            if code != 0:
                print(f"[execute] {rel}: FAILED after {seconds:.0f} s (see the traceback above)", flush=True)
                failed.append(rel)
                continue
            executed = nbformat.read(out, as_version=4)
            cache.cache_notebook_bundle(CacheBundleIn(executed, str(path), data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"[execute] {rel}: {seconds:.0f} s", flush=True)
    (ROOT / "_build").mkdir(exist_ok=True)
    (ROOT / "_build" / "chapter_timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    if failed:
        print("[execute] failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in _toc.yml")
    ap.add_argument("--budget", type=int, default=None, help="seconds per notebook")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        run_one(args.one, args.out)
        return 0
    paths = [p.resolve() for p in args.notebooks] or toc_notebooks()
    for p in paths:
        if not p.exists():
            ap.error(f"no such notebook: {p}")
    return execute(paths, args.budget or default_budget())


if __name__ == "__main__":
    sys.exit(main())
