"""Training in float32 against bfloat16 autocast: tokens per second and model-FLOPs utilisation.

For each of four course models, at the sizes of its chapter's recipe (``--size cpu``: the recipe
the recorded CPU numbers come from; ``--size gpu``: the chapter's GPU recipe; default: the one
for ``--device``), two copies start from the same weights and run the same training step
(forward, loss, backward, AdamW step) on the same batch: one in float32, one with its forward
pass and loss under ``torch.autocast(dtype=torch.bfloat16)``, weights and optimizer state in
float32 (what ``lib.device.autocast`` does). The two are timed in alternation in one process
(``--repeats`` rounds of ``--steps`` steps after a warm-up step each), at every thread count of
``--threads`` on a CPU. The same for evaluation (forward and loss without grad).

    GPT          chapter 07, the character model (cpu: 4 x 128, block 64, batch 12; gpu: 6 x 384, block 256, batch 64)
    BERT         chapter 08, MLM + NSP pretraining (cpu: 2 x 128, 32 tokens, batch 64; gpu: 4 x 256, 64 tokens, batch 128)
    T5           chapter 11 (cpu: 2 + 2 layers x 128, batch 32 of 48 -> 32 tokens; gpu: 6 + 6 x 512, batch 128 of 128 -> 64)
    Transformer  chapter 03, the course Transformer (cpu: 2 + 2 x 128, batch 64 of 25 -> 26 tokens; gpu: 3 + 3 x 256, batch 128)

Model-FLOPs utilisation (MFU): the matrix-product FLOPs of one forward and backward pass
(counted by ``torch.utils.flop_counter``; the optimizer step not counted) per second, divided by
the measured matmul peak of the dtype the products run in: the best of ``n x n`` products in the
three layouts ``a @ b``, ``a @ b.T``, ``a.T @ b`` (on some CPUs bfloat16 speed depends on it), at
the same thread count.

    .venv/bin/python benchmarks/bench_precision.py                           # all, results/bench_precision.json
    .venv/bin/python benchmarks/bench_precision.py --device cuda --quick --out /tmp/p.json   # under 2 minutes
    .venv/bin/python benchmarks/bench_precision.py --models gpt bert --threads 1 --steps 2 --repeats 2
    .venv/bin/python benchmarks/bench_precision.py --threads 1 2 --widths 128 256 384   # also the width sweep

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
import _report  # noqa: E402  (benchmarks/_report.py)
from lib.models.bert import BertConfig, BertForPreTraining  # noqa: E402
from lib.models.gpt import GPT, GPTConfig  # noqa: E402
from lib.models.t5 import T5, T5Config  # noqa: E402
from lib.models.transformer import Transformer, TransformerConfig  # noqa: E402

SIZES = {
    "gpt": {"cpu": dict(vocab=65, layers=4, heads=4, width=128, block=64, batch=12, dropout=0.0),
            "gpu": dict(vocab=65, layers=6, heads=6, width=384, block=256, batch=64, dropout=0.2)},
    "bert": {"cpu": dict(vocab=4000, layers=2, heads=4, width=128, ffn=512, seq=32, batch=64),
             "gpu": dict(vocab=16000, layers=4, heads=4, width=256, ffn=1024, seq=64, batch=128)},
    "t5": {"cpu": dict(vocab=6000, layers=2, heads=4, width=128, ffn=512, src=48, tgt=32, batch=32),
           "gpu": dict(vocab=16000, layers=6, heads=8, width=512, ffn=2048, src=128, tgt=64, batch=128)},
    "transformer": {"cpu": dict(src_vocab=5000, tgt_vocab=6000, layers=2, heads=4, width=128, ffn=512, src=25,
                                tgt=26, batch=64),
                    "gpu": dict(src_vocab=10000, tgt_vocab=12000, layers=3, heads=4, width=256, ffn=1024, src=25,
                                tgt=26, batch=128)},
}


def build(name: str, s: dict, g: torch.Generator):
    """(model, batch, loss_fn(model, batch) -> loss, tokens per step) for one model at sizes ``s``."""
    if name == "gpt":
        model = GPT(GPTConfig(vocab_size=s["vocab"], block_size=s["block"], n_layer=s["layers"], n_head=s["heads"],
                              n_embd=s["width"], dropout=s["dropout"]))
        x = torch.randint(0, s["vocab"], (s["batch"], s["block"] + 1), generator=g)
        return model, (x[:, :-1], x[:, 1:]), lambda m, b: m(*b)[1], s["batch"] * s["block"]
    if name == "bert":
        model = BertForPreTraining(BertConfig(vocab_size=s["vocab"], hidden_size=s["width"], num_layers=s["layers"],
                                              num_heads=s["heads"], intermediate_size=s["ffn"],
                                              max_position=s["seq"]))
        B, T = s["batch"], s["seq"]
        ids = torch.randint(8, s["vocab"], (B, T), generator=g)
        chosen = torch.rand(B, T, generator=g) < 0.15
        batch = dict(input_ids=ids, token_type_ids=(torch.arange(T) >= T // 2).long().expand(B, T).clone(),
                     attention_mask=torch.ones(B, T, dtype=torch.long), mlm_labels=ids.masked_fill(~chosen, -100),
                     nsp_labels=torch.randint(0, 2, (B,), generator=g))
        return model, batch, lambda m, b: m(**b, only_masked=True).loss, B * T
    if name == "t5":
        model = T5(T5Config(vocab_size=s["vocab"], d_model=s["width"], d_kv=s["width"] // s["heads"], d_ff=s["ffn"],
                            num_heads=s["heads"], num_layers=s["layers"], dropout=0.0))
        src = torch.randint(2, s["vocab"], (s["batch"], s["src"]), generator=g)
        labels = torch.randint(2, s["vocab"], (s["batch"], s["tgt"]), generator=g)
        return model, (src, labels), lambda m, b: m(*b)[1], s["batch"] * (s["src"] + s["tgt"])
    if name == "transformer":
        model = Transformer(TransformerConfig(s["src_vocab"], s["tgt_vocab"], d_model=s["width"], num_heads=s["heads"],
                                              num_encoder_layers=s["layers"], num_decoder_layers=s["layers"],
                                              d_ff=s["ffn"], dropout=0.1, max_len=64, tie_output=True))
        src = torch.randint(4, s["src_vocab"], (s["batch"], s["src"]), generator=g)
        tgt = torch.randint(4, s["tgt_vocab"], (s["batch"], s["tgt"] + 1), generator=g)

        def loss(m, b):
            logits = m(b[0], b[1][:, :-1])
            return F.cross_entropy(logits.flatten(0, 1), b[1][:, 1:].flatten(), label_smoothing=0.1)
        return model, (src, tgt), loss, s["batch"] * (s["src"] + s["tgt"])
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(SIZES)}")


def to(batch, dev):
    if isinstance(batch, dict):
        return {k: v.to(dev) for k, v in batch.items()}
    return tuple(v.to(dev) for v in batch)


def matmul_peak(dtype: torch.dtype, n: int, dev: torch.device, seconds: float = 0.5) -> dict:
    """GFLOP/s of ``n x n`` products in three layouts (each run for about ``seconds``); the best is the peak."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dev, dtype) for _ in range(2))
    layouts = {"a@b": lambda: a @ b, "a@b.T": lambda: a @ b.t(), "a.T@b": lambda: a.t() @ b}
    out = {}
    for name, fn in layouts.items():
        fn()
        reps, elapsed = 0, 0.0
        while elapsed < seconds:
            _sync(dev)
            t = time.perf_counter()
            fn()
            _sync(dev)
            elapsed += time.perf_counter() - t
            reps += 1
        out[name] = 2 * n ** 3 * reps / elapsed / 1e9
    return {"gflops_by_layout": out, "peak_gflops": max(out.values())}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def step_flops(model, batch, loss_fn) -> int:
    """Matrix-product FLOPs of one forward and backward pass (float32, not timed)."""
    m = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        loss_fn(m, batch).backward()
    return counter.get_total_flops()


def widened(name: str, size: str, width: int) -> dict:
    """``name``'s sizes of recipe ``size`` at another width: heads of 32, a feed-forward 4x wide."""
    s = dict(SIZES[name][size], width=width, heads=max(1, width // 32))
    if "ffn" in s:
        s["ffn"] = 4 * width
    return s


def bench_model(name: str, size: str, dev: torch.device, args, peaks: dict, s: dict | None = None) -> dict:
    s = SIZES[name][size] if s is None else s
    torch.manual_seed(0)
    model, batch, loss_fn, tokens = build(name, s, torch.Generator().manual_seed(0))
    model, batch = model.to(dev).train(), to(batch, dev)
    flops = step_flops(model, batch, loss_fn)
    copies = {"fp32": model, "bf16": copy.deepcopy(model)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in copies.items()}

    def context(kind):
        return torch.autocast(dev.type, dtype=torch.bfloat16) if kind == "bf16" else torch.autocast(dev.type,
                                                                                                   enabled=False)

    def train_step(kind):
        opts[kind].zero_grad(set_to_none=True)
        with context(kind):
            loss = loss_fn(copies[kind], batch)
        loss.backward()
        opts[kind].step()
        return loss

    def eval_step(kind):
        with torch.no_grad(), context(kind):
            return loss_fn(copies[kind], batch)

    for m in copies.values():                   # the first losses, before any step, in eval mode
        m.eval()
    first = {k: eval_step(k).item() for k in copies}
    for m in copies.values():
        m.train()
    train_s = _report.alternate({k: (lambda k=k: train_step(k)) for k in copies}, args.steps, args.repeats, dev)
    for m in copies.values():
        m.eval()
    eval_s = _report.alternate({k: (lambda k=k: eval_step(k)) for k in copies}, args.steps, args.repeats, dev)
    row = {"model": name, "size": size, "config": s, "parameters": sum(p.numel() for p in model.parameters()),
           "tokens_per_step": tokens, "matmul_flops_per_step": flops,
           "first_loss": first, "first_loss_abs_diff": abs(first["bf16"] - first["fp32"])}
    for phase, secs in (("train", train_s), ("eval", eval_s)):
        tps = {k: args.steps * tokens / statistics.median(v) for k, v in secs.items()}
        row[phase] = {"tokens_per_s": tps, "speedup_bf16": tps["bf16"] / tps["fp32"], "seconds_per_round": secs}
    sps = {k: row["train"]["tokens_per_s"][k] / tokens for k in copies}          # train steps per second
    row["train"]["model_tflops"] = {k: flops * sps[k] / 1e12 for k in copies}
    row["train"]["mfu"] = {k: flops * sps[k] / 1e9 / peaks[k]["peak_gflops"] for k in copies}
    print(f"  {name:12s} train {row['train']['tokens_per_s']['fp32']:10.0f} -> {row['train']['tokens_per_s']['bf16']:10.0f}"
          f" tokens/s (x{row['train']['speedup_bf16']:.2f}), MFU {row['train']['mfu']['fp32']:.1%} -> "
          f"{row['train']['mfu']['bf16']:.1%} | eval x{row['eval']['speedup_bf16']:.2f} | first-loss diff "
          f"{row['first_loss_abs_diff']:.2e}", flush=True)
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--size", choices=["cpu", "gpu"], default=None, help="recipe sizes (default: the device's)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU thread counts (ignored on cuda)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed round (default 5 cpu, 20 cuda)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per precision, alternating")
    ap.add_argument("--peak-n", type=int, default=None, help="matmul size for the peak (default 1024 cpu, 8192 cuda)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (a GPU run in under 2 minutes)")
    ap.add_argument("--widths", type=int, nargs="+", default=None,
                    help="also time each model at these widths (heads of 32, feed-forward 4x), at the first "
                         "thread count: where bfloat16 starts to pay (lib.device.CPU_BF16_MIN_WIDTH)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_precision.json")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU available")
    if cuda and not torch.cuda.is_bf16_supported():
        raise SystemExit("--device cuda: this GPU does not support bfloat16")
    size = args.size or ("gpu" if cuda else "cpu")
    if args.steps is None:
        args.steps = (10 if cuda else 2) if args.quick else (20 if cuda else 5)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    n = args.peak_n or (8192 if cuda else 1024)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1")
    dev = device.setup(seed=0, prefer=args.device)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False     # float32 means float32 (no TF32)
        torch.backends.cudnn.allow_tf32 = False
    threads = [None] if cuda else args.threads
    runs = []
    for t in threads:
        if t is not None:
            torch.set_num_threads(t)
        peaks = {"fp32": matmul_peak(torch.float32, n, dev), "bf16": matmul_peak(torch.bfloat16, n, dev)}
        print(f"threads {t if t is not None else '-'}: matmul peak {n}x{n} fp32 {peaks['fp32']['peak_gflops']:.0f}, "
              f"bf16 {peaks['bf16']['peak_gflops']:.0f} GFLOP/s", flush=True)
        rows = [bench_model(name, size, dev, args, peaks) for name in args.models]
        runs.append({"threads": t, "matmul_n": n, "matmul": peaks, "models": rows})
    sweep = []
    if args.widths:
        if threads[0] is not None:
            torch.set_num_threads(threads[0])
        peaks = runs[0]["matmul"]
        print(f"widths {args.widths}, threads {threads[0] if threads[0] is not None else '-'}:", flush=True)
        for w in args.widths:
            for name in args.models:
                print(f"  width {w:4d}", end="")
                sweep.append(bench_model(name, size, dev, args, peaks, widened(name, size, w)))
    result = {
        "benchmark": "bench_precision",
        "what": "training (forward, loss, backward, AdamW) and evaluation (forward, loss) tokens per second, float32 vs "
                "bfloat16 autocast (weights and optimizer state float32), two copies of each model alternating in one "
                "process; MFU = matmul FLOPs of forward+backward per second / measured matmul peak of the dtype",
        "size": size, "steps_per_round": args.steps, "repeats": args.repeats, "quick": args.quick,
        "cpu_bf16_flag": device.cpu_bf16_flag(), "tf32": False if cuda else None,
        "runs": runs, "width_sweep": {"threads": threads[0], "rows": sweep} if sweep else None,
        "goal": "train speed-up >= 2x for GPT and BERT on a CPU with native bfloat16",
    }
    return _report.write(args.out, result)


if __name__ == "__main__":
    main()
