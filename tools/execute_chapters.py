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

Prints the time each notebook took and its five slowest cells, and records them in
``_build/chapter_timings.json`` and ``_build/cell_timings.json`` (every code cell's seconds): a notebook
that runs replaces its entry, a cached one keeps the entry of its last run.
Chapters run side by side where the machine has the cores for it (``--jobs``, see
``default_jobs``): each chapter's time is then measured beside another chapter.
Exit status 1 if any notebook failed or ran out of time.

The test pass (``tools/test.sh``) runs every chapter once, here, with ``--force --check``:

    python tools/execute_chapters.py --force --check --junit _build/test-reports/notebooks.xml

``--force`` executes even a notebook the cache already holds (the cache key is the
notebook's code, not ``lib``'s). ``--check`` then does what ``pytest --nbval-lax`` did:
every cell marked for checking (``# NBVAL_CHECK_OUTPUT``, or the ``nbval-check-output``
tag) must give the output stored in the notebook, compared as nbval compares (streams
merged, images, metadata and execution counts ignored), and any error fails the notebook
(execution stops at the first one). The book build that follows finds every chapter in
the cache and does not run it again.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
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


def default_jobs() -> int:
    """Chapters side by side: ``COURSE_NOTEBOOK_JOBS``, else the cores this process may use divided
    by the threads each chapter takes (``lib.device.default_cpu_threads``), at least 1.

    Why: a chapter trains on one thread of a 2-core machine (on a shared core every operator of
    a small model waits for the slower thread), so one chapter at a time leaves a core idle;
    two chapters, one thread each, use both without making either wait for the other's core
    (``benchmarks/bench_chapters_side_by_side.py`` measures it)."""
    value = os.environ.get("COURSE_NOTEBOOK_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"COURSE_NOTEBOOK_JOBS={value!r}: expected a whole number of at least 1")
        return int(value)
    sys.path.insert(0, str(ROOT))
    from lib import device

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // device.default_cpu_threads())


KERNEL_STARTS = 3      # a chapter's kernel is started at most this many times when it dies before the first cell


def run_one(src: Path, out: Path) -> None:
    """Child process: execute ``src`` (cwd = its folder) and write the result to ``out``."""
    from jupyter_cache.executors.utils import single_nb_execution

    for attempt in range(KERNEL_STARTS):
        nb = nbformat.read(src, as_version=4)
        try:
            result = single_nb_execution(nb, cwd=str(src.parent), timeout=None, allow_errors=False,
                                         meta_override=True, record_timing=True)
            break
        except RuntimeError as e:    # the kernel died or did not answer before the first cell: start another
            # (chapters started side by side each pick a free TCP port, then bind it: now and then both
            # picked the same one and a kernel dies with "Address already in use")
            if attempt == KERNEL_STARTS - 1 or any(c.get("outputs") for c in nb.cells if c.cell_type == "code"):
                raise
            print(f"[execute] {src.name}: the kernel did not start ({e}); starting another", file=sys.stderr, flush=True)
            time.sleep(1 + attempt)
    if result.err is not None:
        print(result.exc_string, file=sys.stderr)
        sys.exit(1)
    out.with_suffix(".cells.json").write_text(json.dumps(cell_seconds(nb)))
    nbformat.write(nb, out)


def cell_seconds(nb) -> list[list]:
    """``[[cell number, seconds, first line], ...]`` of the executed code cells, from the timestamps
    nbclient records; the timestamps are taken out of the notebook (the cache and the page keep none)."""
    from datetime import datetime

    rows = []
    for i, cell in enumerate(nb.cells):
        stamps = cell.get("metadata", {}).pop("execution", None)
        if cell.cell_type != "code" or not stamps:
            continue
        try:
            start, end = (datetime.fromisoformat(stamps[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
        except KeyError:
            continue
        first = next((line for line in cell.source.splitlines() if line.strip() and not line.startswith("#")), "")
        rows.append([i, round((end - start).total_seconds(), 1), first[:60]])
    return rows


def slowest_cells(rows: list[list], n: int = 5) -> str:
    """The ``n`` slowest cells as one line: ``cell 33 82.1 s (for n in hp.clf_sizes:), ...``."""
    top = sorted(rows, key=lambda r: -r[1])[:n]
    return ", ".join(f"cell {i} {s:.1f} s ({line.strip()})" for i, s, line in top)


# ----------------------------------------------------------------------------- the output check

# what nbval (lax mode, without nbdime) leaves out of the comparison
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")


def is_checked(cell) -> bool:
    """Whether nbval (``--nbval-lax``) compares this cell's outputs: a ``# NBVAL_CHECK_OUTPUT``
    comment or an ``nbval-check-output`` tag (a later ``NBVAL_IGNORE_OUTPUT`` wins, as in nbval)."""
    from nbval.plugin import find_comment_markers, find_metadata_tags

    options = dict(find_comment_markers(cell.source))
    options.update(find_metadata_tags(cell.metadata))
    return bool(options.get("check", False))


def _flatten(outputs) -> dict[str, list]:
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    flat = defaultdict(list)
    for out in transform_streams_for_comparison(coalesce_streams(copy.deepcopy(list(outputs)))):
        for key, value in out.items():
            if key in SKIP_COMPARE:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP_COMPARE:
                        flat[mime].append(data)
            else:
                flat[key].append(value)
    return flat


def compare_outputs(stored, executed) -> list[str]:
    """Compare the checked cells of the notebook as stored with the same notebook executed; one
    message per cell whose outputs differ (empty: all agree). A checked cell that was never run
    in the stored notebook is not compared, but it must not carry outputs (as in nbval)."""
    if len(stored.cells) != len(executed.cells):
        return [f"the executed notebook has {len(executed.cells)} cells, the stored one {len(stored.cells)}"]
    problems = []
    for i, (ref, run) in enumerate(zip(stored.cells, executed.cells)):
        if ref.cell_type != "code" or not is_checked(ref):
            continue
        if ref.get("execution_count") is None:
            if ref.outputs:
                problems.append(f"cell {i}: unrun reference cell has outputs")
            continue
        want, got = _flatten(ref.outputs), _flatten(run.outputs)
        if want == got:
            continue
        code = next((l for l in ref.source.splitlines() if l.strip() and not l.lstrip().startswith("#")), "")
        lines = [f"cell {i} ({code[:60]!r}): outputs differ from the stored ones"]
        if set(want) != set(got):
            lines.append(f"  output fields: stored {sorted(want)}, executed {sorted(got)}")
        for key in sorted(set(want) & set(got)):
            if want[key] != got[key]:
                a = "".join(str(v) for v in want[key]).splitlines()
                b = "".join(str(v) for v in got[key]).splitlines()
                diff = list(difflib.unified_diff(a, b, "stored", "executed", lineterm="", n=1))
                lines += [f"  {key}:"] + ["    " + l for l in diff[:40]]
        problems.append("\n".join(lines))
    return problems


def write_junit(path: Path, results: dict[str, tuple[float, str | None]]) -> None:
    """One JUnit test case per notebook: ``results[name] = (seconds, failure message or None)``."""
    suite = ET.Element("testsuite", name="notebooks", tests=str(len(results)),
                      failures=str(sum(msg is not None for _, msg in results.values())), errors="0", skipped="0")
    for name, (seconds, msg) in results.items():
        case = ET.SubElement(suite, "testcase", classname="notebooks", name=name, time=f"{seconds:.1f}")
        if msg is not None:
            ET.SubElement(case, "failure", message=msg.splitlines()[0][:200]).text = msg
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    ET.ElementTree(suite).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- execution

def record_timings(path: Path, new: dict) -> None:
    """Merge ``new`` (notebook -> its timing) into the JSON file ``path``: a notebook that ran now
    replaces its entry, the others keep theirs (a later run that finds every chapter cached, as the book
    build's does after the test pass's, must not erase what the test pass measured). Written with
    ``lib.io.atomic_write`` (a temporary file, then renamed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lib.io import atomic_write

    try:
        old = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        old = {}                           # unreadable: start again
    merged = {**(old if isinstance(old, dict) else {}), **new}
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(merged, indent=1, ensure_ascii=False) + "\n")


def execute(paths: list[Path], budget: int, cache_dir: Path = CACHE, *, force: bool = False,
            check: bool = False, junit: Path | None = None, jobs: int = 1) -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(cache_dir))
    timings, cell_timings, failed, report = {}, {}, [], {}

    def checked(rel, nb, executed, seconds):
        problems = compare_outputs(nb, executed) if check else []
        for p in problems:
            print(f"[check] {rel}: {p}", flush=True)
        if problems:
            failed.append(rel)
        elif check:
            print(f"[check] {rel}: every checked cell gives its stored output", flush=True)
        report[rel] = (seconds, "\n".join(problems) if problems else None)

    todo = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        nb = nbformat.read(path, as_version=4)
        if not force:
            try:
                # the cache keeps the code cells only: their outputs merged into the whole notebook
                _, merged = cache.merge_match_into_notebook(nb)
                print(f"[execute] {rel}: cached, not run again", flush=True)
                if check:
                    checked(rel, nb, merged, 0.0)
                continue
            except KeyError:
                pass
        todo.append((path, rel, nb))

    def finish(job, code) -> None:
        path, rel, nb, tmp, out, started = job
        seconds = time.perf_counter() - started
        timings[rel] = round(seconds, 1)
        if code is None:
            print(f"[execute] {rel}: FAILED, over its budget of {budget} s", flush=True)
            failed.append(rel)
            report[rel] = (seconds, f"over its budget of {budget} s")
        elif code != 0:
            print(f"[execute] {rel}: FAILED after {seconds:.0f} s (see the traceback above)", flush=True)
            failed.append(rel)
            report[rel] = (seconds, f"failed after {seconds:.0f} s (an error in a cell, see the log)")
        else:
            executed = nbformat.read(out, as_version=4)
            cells_file = out.with_suffix(".cells.json")
            if cells_file.exists():
                cell_timings[rel] = json.loads(cells_file.read_text())
                print(f"[execute] {rel}: slowest cells: {slowest_cells(cell_timings[rel])}", flush=True)
            cache.cache_notebook_bundle(CacheBundleIn(executed, str(path), data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"[execute] {rel}: {seconds:.0f} s", flush=True)
            checked(rel, nb, executed, seconds)
        tmp.cleanup()

    running = {}                       # proc -> job; at most `jobs` chapters side by side
    while todo or running:
        while todo and len(running) < jobs:
            path, rel, nb = todo.pop(0)
            tmp = tempfile.TemporaryDirectory()
            out = Path(tmp.name) / path.name
            proc = subprocess.Popen([sys.executable, __file__, "--one", str(path), "--out", str(out)],
                                    start_new_session=True)
            running[proc] = (path, rel, nb, tmp, out, time.perf_counter())
        time.sleep(0.2)
        for proc, job in list(running.items()):
            code = proc.poll()                   # None: still running, or killed below (over budget)
            if code is None:
                if time.perf_counter() - job[5] <= budget:
                    continue
                os.killpg(proc.pid, signal.SIGKILL)  # the kernel too: it is in the same session
                proc.wait()
            del running[proc]
            finish(job, code)
    (ROOT / "_build").mkdir(exist_ok=True)
    record_timings(ROOT / "_build" / "chapter_timings.json", timings)
    record_timings(ROOT / "_build" / "cell_timings.json", cell_timings)
    if junit is not None:
        write_junit(junit, report)
    if failed:
        print("[execute] failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in _toc.yml")
    ap.add_argument("--budget", type=int, default=None, help="seconds per notebook")
    ap.add_argument("--force", action="store_true", help="execute even the notebooks the cache holds")
    ap.add_argument("--check", action="store_true",
                    help="compare the checked cells' outputs with the stored ones (as nbval --nbval-lax)")
    ap.add_argument("--junit", type=Path, default=None, help="write a JUnit XML report (one case per notebook)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="chapters executed side by side (default: COURSE_NOTEBOOK_JOBS, else as many as "
                         "the cores hold at lib.device's threads per chapter: 2 on a 2-core machine)")
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
    jobs = args.jobs if args.jobs is not None else default_jobs()
    if jobs < 1:
        ap.error(f"--jobs must be at least 1, not {jobs}")
    return execute(paths, args.budget or default_budget(), force=args.force, check=args.check, junit=args.junit,
                   jobs=jobs)


if __name__ == "__main__":
    sys.exit(main())
