"""Whole chapters in the CI recipe: one at a time or two side by side, one thread or two each.

The thread policy (``lib.device.default_cpu_threads``: half the cores, one thread on a 2-core
machine) leaves a core idle while the test pass executes one chapter at a time. This runs the
same chapters (CI recipe, the course's precision policy) three ways and records the wall time of
the whole set and of each chapter:

    sequential, 1 thread    what the test pass did (``--jobs 1``, ``COURSE_CPU_THREADS=1``)
    sequential, 2 threads   every core for one chapter
    side by side, 1 thread  two chapters at a time (``--jobs 2``)

Chapter timings under load are what they are on a shared machine: the file records the load
average before each configuration, so a reader can tell a quiet measurement from a busy one.

    .venv/bin/python benchmarks/bench_chapters_side_by_side.py        # chapters 05, 09, 12, 13
    .venv/bin/python benchmarks/bench_chapters_side_by_side.py chapters/05_attention_variants.ipynb ...

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import _report  # noqa: E402  (benchmarks/_report.py)
import execute_chapters  # noqa: E402

DEFAULT = ["05_attention_variants", "09_transformer_xl_xlnet", "12_switch", "13_ernie"]
CONFIGS = (("sequential, 1 thread", 1, 1), ("sequential, 2 threads", 2, 1), ("side by side, 1 thread", 1, 2))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_chapters_side_by_side.json")
    args = ap.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or [REPO / "chapters" / f"{n}.ipynb" for n in DEFAULT]
    for p in paths:
        if not p.is_file():
            raise SystemExit(f"no such notebook: {p}")
    os.environ.setdefault("COURSE_MODE", "ci")
    rows = []
    timings_file = REPO / "_build" / "chapter_timings.json"
    for name, threads, jobs in CONFIGS:
        os.environ["COURSE_CPU_THREADS"] = str(threads)
        load = list(os.getloadavg())
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            code = execute_chapters.execute(paths, budget=1800, cache_dir=Path(cache), force=True, jobs=jobs)
            wall = time.perf_counter() - start
        if code != 0:
            raise SystemExit(f"{name}: a chapter failed")
        ran = {p.relative_to(REPO).as_posix() for p in paths}
        per = {k: v for k, v in json.loads(timings_file.read_text()).items() if k in ran}
        rows.append({"config": name, "threads_per_chapter": threads, "jobs": jobs, "wall_s": round(wall, 1),
                     "chapter_s": per, "load_average_before": load})
        print(f"{name:24s} {wall:7.1f} s  " + "  ".join(f"{Path(k).stem[:2]} {v:.0f}" for k, v in per.items()),
              flush=True)
    base = rows[0]["wall_s"]
    for r in rows:
        r["speedup_vs_sequential_1_thread"] = round(base / r["wall_s"], 3)
    return _report.write(args.out, {"benchmark": "bench_chapters_side_by_side", "cores": os.cpu_count(),
                                    "chapters": [p.name for p in paths], "recipe": os.environ["COURSE_MODE"],
                                    "configs": rows})


if __name__ == "__main__":
    main()
