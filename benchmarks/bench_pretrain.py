"""Tokens per second of a ``tools.pretrain`` recipe's training step, bfloat16 autocast against float32.

The step is the one ``lib.train.fit`` takes in ``python -m tools.pretrain`` (the recipe's model,
batches from its prepared data, its loss, backward, clipping at 1.0, AdamW), without the evaluations
and checkpoints. Two copies start from the same weights; they train in alternation, ``--rounds``
rounds of ``--seconds / --rounds`` seconds each per precision, so that a neighbour's load on a shared
machine falls on both; the CPU time of the process is recorded too (tokens per CPU second: nearer what
a core of one's own would give when neighbours take turns on it). The data is prepared first when
``.pretrain/<recipe>/data`` does not have it yet (what ``python -m tools.pretrain <recipe>`` does).

    .venv/bin/python benchmarks/bench_pretrain.py ko-bert --threads 1 --seconds 60   # results/bench_pretrain_ko-bert.json

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import _report  # noqa: E402  (benchmarks/_report.py)
from lib import device  # noqa: E402
from tools import pretrain  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", choices=list(pretrain.RECIPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=60.0, help="training time per precision")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scratch", type=Path, default=pretrain.SCRATCH)
    ap.add_argument("--out", type=Path, help="default: results/bench_pretrain_<recipe>.json")
    args = ap.parse_args(argv)
    recipe = pretrain.RECIPES[args.recipe]
    dev = device.setup(seed=0, cpu_threads=args.threads)
    data = args.scratch / recipe.name / "data"
    pretrain.prepare(recipe, data)
    tok, loader, _, model = pretrain.build_training(recipe, data)
    step_fn = pretrain.STEP_FNS[recipe.kind]
    arms = {}
    for kind in ("bf16", "fp32"):
        m = copy.deepcopy(model).to(dev).train()
        arms[kind] = {"model": m, "opt": torch.optim.AdamW(m.parameters(), lr=recipe.lr),
                      "batches": iter(loader), "steps": 0, "seconds": 0.0, "cpu_seconds": 0.0, "losses": []}

    def step(arm, kind):
        batch = next(arm["batches"])
        arm["opt"].zero_grad(set_to_none=True)
        ctx = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=kind == "bf16")
        with ctx:
            loss, _ = step_fn(arm["model"], batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(arm["model"].parameters(), 1.0)
        arm["opt"].step()
        arm["losses"].append(loss.item())

    for kind, arm in arms.items():   # warm-up, not timed
        step(arm, kind)
    for _ in range(args.rounds):
        for kind, arm in arms.items():
            start, cpu = time.perf_counter(), time.process_time()
            while time.perf_counter() - start < args.seconds / args.rounds:
                step(arm, kind)
                arm["steps"] += 1
            arm["seconds"] += time.perf_counter() - start
            arm["cpu_seconds"] += time.process_time() - cpu
    rows = {kind: {"steps": a["steps"], "seconds": round(a["seconds"], 1), "cpu_seconds": round(a["cpu_seconds"], 1),
                   "tokens_per_second": round(a["steps"] * recipe.tokens_per_step / a["seconds"]),
                   "tokens_per_cpu_second": round(a["steps"] * recipe.tokens_per_step / a["cpu_seconds"]),
                   "last_loss": round(a["losses"][-1], 3)} for kind, a in arms.items()}
    for kind, r in rows.items():
        print(f"{recipe.name} {kind}: {r['tokens_per_second']:,} tokens/s, {r['tokens_per_cpu_second']:,} per CPU "
              f"second ({r['steps']} steps of {recipe.tokens_per_step} tokens in {r['seconds']} s, "
              f"{r['cpu_seconds']} s of CPU), threads {args.threads}")
    ratio = rows["bf16"]["tokens_per_second"] / rows["fp32"]["tokens_per_second"]
    print(f"bf16 / fp32: {ratio:.2f}")
    out = args.out or REPO / "results" / f"bench_pretrain_{recipe.name}.json"
    return _report.write(out, {"recipe": recipe.name, "tokens_per_step": recipe.tokens_per_step,
                                    "parameters": model.num_parameters(), "threads": args.threads,
                                    "rounds": args.rounds, "results": rows, "bf16_over_fp32": round(ratio, 3)})


if __name__ == "__main__":
    main()
