"""Chapter 07's character-level GPT, full recipe, trained in float32 and in bfloat16 autocast.

The question is quality, not speed: does the model trained under bfloat16 autocast reach the
same validation loss as the float32 one? The script runs chapter 07's own cells (the set-up,
the recipe, the character data and ``train_lm``, found by what they contain, not by position)
with ``COURSE_MODE=full`` in one process per precision (``COURSE_PRECISION=fp32`` and ``bf16``;
the two run side by side, one thread each), and records both validation curves, losses and
wall times in ``results/bench_char_precision.json``. Chapter 07 prints the comparison from it.

    .venv/bin/python benchmarks/char_lm_precision.py            # both precisions, about 20 minutes
    .venv/bin/python benchmarks/char_lm_precision.py --steps 50 --out /tmp/c.json   # a quick check

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import _report  # noqa: E402  (benchmarks/_report.py)

CHAPTER = REPO / "chapters" / "07_gpt.ipynb"
# what the cells to run contain: set-up, recipe, the character data with train_lm and its run
CELLS = ("dev = device.setup(", "hp = config.recipe(", "char_model, char_hist, char_seconds = train_lm(")
PRECISIONS = ("fp32", "bf16")


def chapter_code(steps: int | None) -> str:
    """The source of chapter 07's cells named by CELLS, in order; ``steps`` shortens the run."""
    cells = json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]
    code = []
    for marker in CELLS:
        found = [c for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"])]
        if len(found) != 1:
            raise SystemExit(f"{CHAPTER.name}: expected one code cell containing {marker!r}, found {len(found)}")
        code.append("".join(found[0]["source"]))
    if steps is not None:                      # after the recipe cell: a shorter run of the same model
        code.insert(2, f"char_cfg = dict(char_cfg, steps={steps})")
    code.append("import json as _j\n"
                "frame = char_hist.to_frame().dropna(subset=['eval_loss'])\n"
                "print('RESULT ' + _j.dumps({'val_loss': char_val, 'seconds': char_seconds, "
                "'steps': char_cfg['steps'], 'device': device.summary(), "
                "'curve': {'step': frame['step'].tolist(), 'eval_loss': frame['eval_loss'].tolist()}}))")
    return "\n\n".join(code)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="fewer steps than the full recipe (a quick check)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_char_precision.json")
    args = ap.parse_args(argv)
    code = chapter_code(args.steps)
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "char_lm.py"
        script.write_text(code, encoding="utf-8")
        for p in PRECISIONS:
            env = {**os.environ, "COURSE_MODE": "full", "COURSE_PRECISION": p,
                   "COURSE_CI_RESULTS_DIR": tmp, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
            procs[p] = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        runs = {}
        for p, proc in procs.items():
            out, _ = proc.communicate()
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise SystemExit(f"the {p} run failed (exit {proc.returncode}):\n{out[-3000:]}")
            runs[p] = json.loads(lines[-1][len("RESULT "):])
            print(f"{p}: validation loss {runs[p]['val_loss']:.4f} after {runs[p]['steps']} steps, "
                  f"{runs[p]['seconds']:.0f} s | {runs[p]['device']}")
    diff = runs["bf16"]["val_loss"] - runs["fp32"]["val_loss"]
    print(f"bf16 - fp32: {diff:+.4f} nats/character")
    return _report.write(args.out, {"chapter": "07_gpt", "model": "char_lm", "runs": runs,
                                    "bf16_minus_fp32": diff, "side_by_side": True,
                                    "full_recipe": args.steps is None})


if __name__ == "__main__":
    main()
