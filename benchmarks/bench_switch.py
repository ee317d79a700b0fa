"""The Switch layer against the dense feed-forward block of the same FLOPs per token, in one process.

For each width d, number of experts N and capacity factor, a ``SwitchFFN`` (N experts of width
4d, top-1) and GPT's dense ``MLP`` (width 4d) process the same batch of ``--batch`` sequences of
``--time`` tokens: forward only, and forward + backward. Every token costs the same matrix
products in both (one expert of the dense block's size); the Switch layer adds the router,
the dispatch and combine copies and the empty places of a capacity factor above 1. The two are
timed interleaved (round-robin, median of ``--repeats`` rounds) so that a busy machine slows
both alike; the figure to read is the ratio of tokens per second, Switch / dense, measured in
the same run (1.0 = no routing overhead). Written to ``results/bench_switch.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_switch.py
    .venv/bin/python benchmarks/bench_switch.py --quick --out /tmp/bench_switch.json

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402
from lib import device  # noqa: E402
from lib.models.gpt import MLP, GPTConfig  # noqa: E402
from lib.models.switch import SwitchFFN  # noqa: E402


def run_pass(layer, x, backward: bool) -> None:
    if backward:
        layer.zero_grad(set_to_none=True)
        layer(x).square().mean().backward()
    else:
        with torch.no_grad():
            layer(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--experts", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--capacity-factors", type=float, nargs="+", default=[1.0, 1.25, 2.0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--time", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one width, two configurations, five rounds")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_switch.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.widths, args.experts, args.capacity_factors, args.repeats = args.widths[:1], [4], [1.0, 1.25], 5

    device.setup(seed=0, prefer="cpu", cpu_threads=args.threads)
    tokens = args.batch * args.time
    rows = []
    for d in args.widths:
        dense = MLP(GPTConfig(vocab_size=1, block_size=1, n_layer=1, n_head=1, n_embd=d))
        x = torch.randn(args.batch, args.time, d)
        for n in args.experts:
            for factor in args.capacity_factors:
                switch = SwitchFFN(d, 4 * d, n, factor, init_scale=1.0)
                for backward in (False, True):
                    for layer in (dense, switch):            # warm-up
                        run_pass(layer, x, backward)
                    times = {"dense": [], "switch": []}
                    for _ in range(args.repeats):
                        for name, layer in (("dense", dense), ("switch", switch)):
                            start = time.perf_counter()
                            run_pass(layer, x, backward)
                            times[name].append(time.perf_counter() - start)
                    med = {k: statistics.median(v) for k, v in times.items()}
                    row = {"d_model": d, "d_ff": 4 * d, "experts": n, "capacity_factor": factor,
                           "pass": "forward+backward" if backward else "forward",
                           "capacity": switch.stats.capacity,
                           "expert_rows_per_token": round(n * switch.stats.capacity * args.batch / tokens, 3),
                           "dropped_fraction": round(switch.stats.dropped_fraction, 4),
                           "dense_tokens_per_s": round(tokens / med["dense"]),
                           "switch_tokens_per_s": round(tokens / med["switch"]),
                           "switch_over_dense_throughput": round(med["dense"] / med["switch"], 3),
                           "dense_ms_all": [round(1000 * t, 3) for t in times["dense"]],
                           "switch_ms_all": [round(1000 * t, 3) for t in times["switch"]]}
                    rows.append(row)
                    print(f"d={d:4d} N={n:2d} cf={factor:4.2f} {row['pass']:16s} dense {row['dense_tokens_per_s']:>9,} "
                          f"tok/s  switch {row['switch_tokens_per_s']:>9,} tok/s  ratio "
                          f"{row['switch_over_dense_throughput']:.2f}  (expert rows per token "
                          f"{row['expert_rows_per_token']})", flush=True)
    write(args.out, {"benchmark": "Switch layer (top-1, N experts of width 4d) vs dense MLP (width 4d): tokens/s, "
                                  "one process, CPU",
                     "batch": args.batch, "time": args.time, "repeats": args.repeats, "torch": torch.__version__,
                     "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
