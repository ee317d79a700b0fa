"""KV-cache decoding of lib's GPT against decoding without a cache, measured in one run.

A GPT of 4 layers, 4 heads, width 256 and vocabulary 8192 (random weights:
speed does not depend on what the model learned) continues a 16-token prompt greedily by
``--new-tokens`` tokens with ``lib.generate.greedy`` (``eos_id=None``: forced length), once with
``use_cache=True`` (``model.decode(token, cache)``: only the newest token) and once with
``use_cache=False`` (``model.decode(sequence)``: the whole sequence at every step). Both must give
the same tokens. The result is the ratio of the two times (goal: at least 5x at 512 new tokens),
written to ``results/bench_gpt_kv_cache.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_gpt_kv_cache.py            # 128 and 512 new tokens
    .venv/bin/python benchmarks/bench_gpt_kv_cache.py --new-tokens 64 --repeats 1 --out /tmp/b.json

Not part of the test pass. The absolute times are noisy on a shared machine; the ratio is
measured back to back in the same process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device, generate  # noqa: E402
from lib.io import atomic_write  # noqa: E402
from lib.models.gpt import GPT, GPTConfig  # noqa: E402


def greedy(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> torch.Tensor:
    return generate.greedy(model, prompt, eos_id=None, max_new_tokens=new_tokens, use_cache=use_cache).tokens


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="timings per setting (the median is used)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_gpt_kv_cache.json")
    args = ap.parse_args(argv)

    dev = device.setup(seed=0, cpu_threads=args.threads)
    cfg = GPTConfig(vocab_size=8192, block_size=args.prompt_len + max(args.new_tokens) + 1,
                    n_layer=4, n_head=4, n_embd=256)
    model = GPT(cfg).to(dev).eval()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (args.batch_size, args.prompt_len), generator=g).to(dev)
    greedy(model, prompt, 8, True), greedy(model, prompt, 8, False)          # warm-up

    rows = []
    for n in args.new_tokens:
        t_cache, all_cache, a = timed(lambda: greedy(model, prompt, n, True), args.repeats)
        t_plain, all_plain, b = timed(lambda: greedy(model, prompt, n, False), args.repeats)
        if not torch.equal(a, b):
            raise SystemExit(f"cache and no-cache decoding disagree at {n} new tokens")
        row = {"new_tokens": n, "seconds_cache": t_cache, "seconds_no_cache": t_plain,
               "speedup": t_plain / t_cache, "tokens_per_s_cache": n * args.batch_size / t_cache,
               "tokens_per_s_no_cache": n * args.batch_size / t_plain,
               "all_seconds_cache": all_cache, "all_seconds_no_cache": all_plain, "same_tokens": True}
        rows.append(row)
        print(f"{n:4d} new tokens: cache {t_cache:7.2f} s, no cache {t_plain:7.2f} s, speed-up {row['speedup']:.1f}x",
              flush=True)

    result = {
        "benchmark": "bench_gpt_kv_cache",
        "what": "greedy continuation of a prompt by a forced number of new tokens, lib.generate.greedy on lib GPT, "
                "use_cache=True (newest token only) vs use_cache=False (whole sequence every step), same model "
                "and inputs, same process",
        "model": {"vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "n_layer": cfg.n_layer,
                  "n_head": cfg.n_head, "n_embd": cfg.n_embd, "parameters": model.num_parameters()},
        "batch_size": args.batch_size, "prompt_len": args.prompt_len, "repeats": args.repeats,
        "results": rows,
        "goal": "speed-up >= 5 at 512 new tokens",
        "device": device.summary(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
