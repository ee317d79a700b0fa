"""Training throughput: lib's GPT against Hugging Face's GPT2LMHeadModel, same configuration and batch.

Both models are built from the same configuration with random weights (ours gets the
reference's weights through the name table, so both compute the same function; the script
checks that the losses agree), and both run the same training step: forward, next-token
cross-entropy, backward, AdamW step. The two are timed in alternation, ``--repeats`` rounds of
``--steps`` steps each, after a warm-up, and the result is the ratio of the median tokens per
second (goal: ours at least as fast, ratio >= 1). Hugging Face uses its default attention
(``sdpa``), ours ``F.scaled_dot_product_attention`` too.

    .venv/bin/python benchmarks/bench_gpt_train.py
    .venv/bin/python benchmarks/bench_gpt_train.py --n-layer 2 --steps 3 --repeats 2 --out /tmp/b.json

Not part of the test pass; written to ``results/bench_gpt_train.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.models.gpt import GPT, GPTConfig, load_hf_gpt  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5, help="training steps per timed round")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per model, alternating")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_gpt_train.json")
    args = ap.parse_args(argv)

    import transformers

    dev = device.setup(seed=0, cpu_threads=args.threads)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=args.vocab_size, n_positions=args.block_size, n_embd=args.n_embd, n_layer=args.n_layer,
        n_head=args.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    cfg = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    ours = GPT(cfg)
    load_hf_gpt(ours, hf)
    ours, hf = ours.to(dev).train(), hf.to(dev).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size + 1), generator=g).to(dev)
    inp, tgt = x[:, :-1], x[:, 1:]

    def loss_ours():
        return ours(inp, tgt)[1]

    def loss_hf():
        logits = hf(inp).logits
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    with torch.no_grad():
        diff = abs(loss_ours().item() - loss_hf().item())
    if diff > 1e-4:
        raise SystemExit(f"the two models disagree before training: loss difference {diff}")

    runs = {"lib GPT": (ours, loss_ours), "HF GPT2LMHeadModel": (hf, loss_hf)}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, (m, _) in runs.items()}

    def train_step(name):
        opts[name].zero_grad(set_to_none=True)
        runs[name][1]().backward()
        opts[name].step()

    seconds = _report.alternate({name: (lambda n=name: train_step(n)) for name in runs}, args.steps, args.repeats, dev)
    tokens = args.steps * args.batch_size * args.block_size
    tps = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    ratio = tps["lib GPT"] / tps["HF GPT2LMHeadModel"]
    for name in runs:
        print(f"{name:20s} {tps[name]:10.0f} tokens/s")
    print(f"ratio lib / HF: {ratio:.3f}")

    result = {
        "benchmark": "bench_gpt_train",
        "what": "training tokens per second (forward, cross-entropy, backward, AdamW step), lib.models.gpt.GPT vs "
                "transformers.GPT2LMHeadModel with the same configuration, weights and batch, alternating in one process",
        "model": {**{k: getattr(cfg, k) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")},
                  "parameters": ours.num_parameters()},
        "batch_size": args.batch_size, "steps_per_round": args.steps, "repeats": args.repeats,
        "tokens_per_s": tps, "seconds_per_round": seconds,
        "ratio_lib_over_hf": ratio,
        "goal": "ratio >= 1 (ours at least as fast)",
        "transformers": transformers.__version__,
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
