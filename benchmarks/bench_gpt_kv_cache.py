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
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device, generate  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.models.gpt import GPT, GPTConfig  # noqa: E402


def greedy(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> torch.Tensor:
    return generate.greedy(model, prompt, eos_id=None, max_new_tokens=new_tokens, use_cache=use_cache).tokens


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
    rows = _report.kv_cache_rows(lambda n, use_cache: greedy(model, prompt, n, use_cache),
                                 args.new_tokens, args.batch_size, args.repeats)

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
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
