"""Forward speed: lib's T5 against Hugging Face's T5ForConditionalGeneration, same configuration and batch.

Both models are built from the same configuration (T5-small's shape by default, random
weights; ours gets the reference's weights through the name table, and the script checks that
the logits agree before timing). Both run the same teacher-forced forward pass in eval mode
under ``torch.no_grad()``: encoder over the padded source, decoder over the shifted target,
logits over the vocabulary. The two are timed in alternation, ``--repeats`` rounds of
``--steps`` passes each, after a warm-up, and the result is the ratio of the median
(source + target) tokens per second (goal: ours at least as fast, ratio >= 1). Hugging Face
uses its default attention (``sdpa``), ours ``F.scaled_dot_product_attention`` with the
position bias as a float mask.

    .venv/bin/python benchmarks/bench_t5.py
    .venv/bin/python benchmarks/bench_t5.py --layers 2 --steps 2 --repeats 2 --out /tmp/b.json

Not part of the test pass; written to ``results/bench_t5.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.models.t5 import T5, T5Config, load_hf_t5  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=32128)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--feed-forward", choices=("relu", "gated-gelu"), default="relu")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--src-len", type=int, default=128)
    ap.add_argument("--tgt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="forward passes per timed round")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per model, alternating")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the course's policy)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_t5.json")
    args = ap.parse_args(argv)

    import transformers

    dev = device.setup(seed=0, cpu_threads=args.threads)
    sizes = dict(vocab_size=args.vocab_size, d_model=args.d_model, d_kv=args.d_model // args.heads, d_ff=args.d_ff,
                 num_heads=args.heads, num_layers=args.layers)
    tie = args.feed_forward == "relu"               # T5 (ReLU, tied) or T5 v1.1 (gated GELU)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        **sizes, feed_forward_proj=args.feed_forward, tie_word_embeddings=tie, dropout_rate=0.0,
        decoder_start_token_id=0))
    cfg = T5Config(**sizes, feed_forward=args.feed_forward, tie_word_embeddings=tie, dropout=0.0)
    ours = T5(cfg)
    load_hf_t5(ours, hf)
    ours, hf = ours.to(dev).eval(), hf.to(dev).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(2, args.vocab_size, (args.batch_size, args.src_len), generator=g)
    lengths = torch.randint(args.src_len // 2, args.src_len + 1, (args.batch_size,), generator=g)
    src = src.masked_fill(torch.arange(args.src_len) >= lengths[:, None], 0).to(dev)     # right padding
    mask = src != 0
    labels = torch.randint(2, args.vocab_size, (args.batch_size, args.tgt_len), generator=g).to(dev)
    dec_in = ours.shift_right(labels)

    def forward_ours():
        return ours(src, decoder_input_ids=dec_in, attention_mask=mask)[0]

    def forward_hf():
        return hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=dec_in).logits

    with torch.no_grad():
        diff = (forward_ours() - forward_hf()).abs().max().item()
    if diff > 1e-3:
        raise SystemExit(f"the two models disagree: max |logit difference| {diff}")

    runs = {"lib T5": forward_ours, "HF T5ForConditionalGeneration": forward_hf}
    with torch.no_grad():
        seconds = _report.alternate(runs, args.steps, args.repeats, dev)
    tokens = args.steps * args.batch_size * (args.src_len + args.tgt_len)
    tps = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    ratio = tps["lib T5"] / tps["HF T5ForConditionalGeneration"]
    for name in runs:
        print(f"{name:30s} {tps[name]:10.0f} tokens/s")
    print(f"ratio lib / HF: {ratio:.3f}  (max |logit difference| {diff:.1e})")

    result = {
        "benchmark": "bench_t5",
        "what": "forward tokens per second (teacher forcing, no grad, eval mode), lib.models.t5.T5 vs "
                "transformers.T5ForConditionalGeneration with the same configuration, weights and batch, "
                "alternating in one process",
        "model": {**sizes, "feed_forward": args.feed_forward, "parameters": ours.num_parameters()},
        "batch_size": args.batch_size, "src_len": args.src_len, "tgt_len": args.tgt_len,
        "steps_per_round": args.steps, "repeats": args.repeats,
        "max_abs_logit_difference": diff,
        "tokens_per_s": tps, "seconds_per_round": seconds,
        "ratio_lib_over_hf": ratio,
        "goal": "ratio >= 1 (ours at least as fast)",
        "transformers": transformers.__version__,
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
