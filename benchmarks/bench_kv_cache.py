"""KV-cache decoding against decoding without a cache (lib.generate), measured in one run.

A Transformer sized like the chatbot chapter's (vocabulary 8192, d_model 256, 2 + 2 layers,
8 heads, d_ff 512; random weights: speed does not depend on what the model learned) decodes
``--new-tokens`` tokens greedily with ``eos_id=None`` (forced length, the end token is ignored)
for a batch of questions, once with ``use_cache=True`` and once with ``use_cache=False``. Both
must produce the same tokens. The result is the ratio of the two times (goal: at least 5x at 512
new tokens), written to ``results/bench_kv_cache.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_kv_cache.py            # 128 and 512 new tokens
    .venv/bin/python benchmarks/bench_kv_cache.py --new-tokens 64 --repeats 1 --out /tmp/b.json

Not part of the test pass. On a shared machine the absolute times are noisy; the ratio is
measured back to back in the same process and is the number to read.
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
from lib.models.transformer import Transformer, TransformerConfig  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--src-len", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3, help="timings per setting (the median is used)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_kv_cache.json")
    args = ap.parse_args(argv)

    dev = device.setup(seed=0)
    longest = max(args.new_tokens)
    cfg = TransformerConfig(src_vocab_size=8192, tgt_vocab_size=8192, d_model=256, num_heads=8,
                            num_encoder_layers=2, num_decoder_layers=2, d_ff=512, dropout=0.1,
                            max_len=longest + 1)
    model = Transformer(cfg).to(dev).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(7, cfg.src_vocab_size, (args.batch_size, args.src_len), generator=g).to(dev)
    kw = dict(bos_id=2, eos_id=None, pad_id=0)

    def decode(n, use_cache):
        return generate.greedy(model, src, max_new_tokens=n, use_cache=use_cache, **kw).tokens

    rows = _report.kv_cache_rows(decode, args.new_tokens, args.batch_size, args.repeats)

    result = {
        "benchmark": "bench_kv_cache",
        "what": "greedy decoding of a forced number of new tokens (eos ignored), lib.generate.greedy "
                "use_cache=True vs use_cache=False, same model and inputs, same process",
        "model": {**cfg.asdict(), "parameters": model.num_parameters()},
        "batch_size": args.batch_size, "src_len": args.src_len, "repeats": args.repeats,
        "results": rows,
        "goal": "speed-up >= 5 at 512 new tokens",
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
