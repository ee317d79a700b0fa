"""Transformer-XL evaluation with cached memory against sliding-window re-computation, one run.

A Transformer-XL of 4 layers, 4 heads, width 128 and 65 characters (random weights: speed
does not depend on what the model learned; the chapter's full recipe has this shape) reads a
token stream in two ways, for each context length ``C``:

* cached memory (``evaluate_with_memory``): segments of ``C`` tokens with a memory of ``C``,
  every position computed once, every prediction seeing ``C .. 2C`` tokens;
* sliding window (``evaluate_sliding_window``): for every predicted token, the ``C`` tokens
  before it run through the model from scratch (the vanilla evaluation of Al-Rfou et al.).

Both read one stream (batch 1). The result is the ratio of the times per predicted token,
measured back to back in the same process, written to ``results/bench_txl_eval.json`` (or
``--out``). The paper's anchor: 1,874x at an attention length of 3,800 on a GPU (Dai et al.,
2019, Table 9), for a much larger model.

    .venv/bin/python benchmarks/bench_txl_eval.py                   # contexts 64 .. 1024
    .venv/bin/python benchmarks/bench_txl_eval.py --contexts 32 64 --window-positions 8 --out /tmp/b.json

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.models.transformer_xl import (TransformerXL, TransformerXLConfig, evaluate_sliding_window,  # noqa: E402
                                       evaluate_with_memory)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--window-positions", type=int, default=32, help="tokens predicted by the sliding window")
    ap.add_argument("--cached-tokens", type=int, default=4096, help="at least this many tokens (and 4 segments) cached")
    ap.add_argument("--repeats", type=int, default=3, help="timings per setting (the median is used)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_txl_eval.json")
    args = ap.parse_args(argv)

    dev = device.setup(seed=0, cpu_threads=args.threads)
    cfg = TransformerXLConfig(vocab_size=65, n_layer=4, n_head=4, d_model=128, d_inner=512)
    model = TransformerXL(cfg).to(dev).eval()
    g = torch.Generator().manual_seed(0)
    n = max(args.cached_tokens, 4 * max(args.contexts)) + max(args.contexts) + args.window_positions + 1
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).to(dev)
    evaluate_with_memory(model, ids[None, :256], 64, 64)          # warm-up
    rows = []
    for C in args.contexts:
        stream = ids[None, :max(args.cached_tokens, 4 * C) + 1]
        t_cached, all_cached, cached = _report.timed(lambda: evaluate_with_memory(model, stream, C, C), args.repeats)
        t_window, all_window, window = _report.timed(
            lambda: evaluate_sliding_window(model, ids, C, args.window_positions), args.repeats)
        per_cached, per_window = t_cached / cached["tokens"], t_window / window["tokens"]
        row = {"context": C, "ms_per_token_cached": 1e3 * per_cached, "ms_per_token_window": 1e3 * per_window,
               "speedup": per_window / per_cached, "cached_tokens": cached["tokens"],
               "window_tokens": window["tokens"], "all_seconds_cached": all_cached, "all_seconds_window": all_window}
        rows.append(row)
        print(f"context {C:5d}: sliding window {row['ms_per_token_window']:8.2f} ms/token, cached "
              f"{row['ms_per_token_cached']:7.3f} ms/token, speed-up {row['speedup']:7.1f}x", flush=True)

    result = {
        "benchmark": "bench_txl_eval",
        "what": "time per predicted token: sliding-window re-computation of C tokens per prediction vs "
                "Transformer-XL segments of C with a memory of C, same model, one stream, same process",
        "model": {"vocab_size": cfg.vocab_size, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
                  "d_model": cfg.d_model, "d_inner": cfg.d_inner, "parameters": model.num_parameters()},
        "repeats": args.repeats, "results": rows,
        "anchor": "Dai et al. (2019), Table 9: 1,874x at attention length 3,800, GPU",
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
