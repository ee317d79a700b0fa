"""A chapter's training step beside a busy process: how much slower, for each CPU thread count.

Chapter 04 took 80 s alone and did not finish in 600 s with one other busy process on the
2-core CI machine. This benchmark measures the cause. It times training steps of the
chatbot chapter's CI-recipe Transformer (vocabulary 8192, d_model 256, 2 + 2 pre-LN layers,
8 heads, d_ff 512, shared embeddings, batch 32, random tokens of length ``--seq-len``: speed
does not depend on the data) with PyTorch's intra-op threads set to each of ``--threads``
(default: 1 and the number of cores, PyTorch's default), first alone and then beside a busy
process started by the benchmark (``--busy spin``: one pure-Python loop, one core busy;
``--busy torch``: another PyTorch process doing matrix products with its default threads,
like a second chapter). The numbers to read are the slowdown ratio
``seconds per step beside the busy process / seconds per step alone`` for each thread count,
and, for each condition, the time per step of every thread count divided by that of the
fewest threads (which thread count is fastest under load); ``lib.device.default_cpu_threads()`` is the
policy the chapters use. Written to ``results/bench_threads.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_threads.py
    .venv/bin/python benchmarks/bench_threads.py --steps 5 --busy torch --out /tmp/t.json

Not part of the test pass. "Alone" means without the benchmark's own busy process: on a
shared machine other work may be running; the load average is recorded with the result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
from lib.io import atomic_write  # noqa: E402
from lib.models.transformer import Transformer, TransformerConfig  # noqa: E402

BUSY = {
    "spin": "while True: pass",
    "torch": "import torch\na = torch.randn(512, 512)\nwhile True: a = (a @ a).tanh()",
}


def step_seconds(model, opt, batches, steps: int) -> list[float]:
    """Seconds of each of ``steps`` training steps (forward, backward, Adam), after one warm-up step."""
    times = []
    for i in range(steps + 1):
        src, tgt = batches[i % len(batches)]
        start = time.perf_counter()
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=sorted({1, cores}))
    ap.add_argument("--steps", type=int, default=10, help="timed steps per setting (the median is used)")
    ap.add_argument("--seq-len", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--busy", choices=sorted(BUSY), default="spin")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_threads.json")
    args = ap.parse_args(argv)

    device.setup(seed=0, prefer="cpu")
    cfg = TransformerConfig(src_vocab_size=8192, tgt_vocab_size=8192, d_model=256, num_heads=8,
                            num_encoder_layers=2, num_decoder_layers=2, d_ff=512, dropout=0.1, max_len=64,
                            norm_first=True, share_embeddings=True)
    model = Transformer(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(7, 8192, (args.batch_size, args.seq_len), generator=g),
                torch.randint(7, 8192, (args.batch_size, args.seq_len + 1), generator=g)) for _ in range(4)]

    rows, load_before = [], list(os.getloadavg())
    for busy in (False, True):
        proc = None
        if busy:
            proc = subprocess.Popen([sys.executable, "-c", BUSY[args.busy]], stdout=subprocess.DEVNULL)
            time.sleep(1.0)
        try:
            for n in args.threads:
                torch.set_num_threads(n)
                times = step_seconds(model, opt, batches, args.steps)
                rows.append({"threads": n, "busy": busy, "median_s": statistics.median(times), "all_s": times})
                print(f"threads={n} {'beside a busy process' if busy else 'alone':>22}: "
                      f"{statistics.median(times) * 1000:7.0f} ms per step", flush=True)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()

    median = {(r["threads"], r["busy"]): r["median_s"] for r in rows}
    slowdown = {n: median[n, True] / median[n, False] for n in args.threads}
    fastest_busy = min(args.threads, key=lambda n: median[n, True])
    versus_one = {f"{n}/{min(args.threads)}": {"alone": median[n, False] / median[min(args.threads), False],
                                                "busy": median[n, True] / median[min(args.threads), True]}
                  for n in args.threads}
    for n in args.threads:
        print(f"threads={n}: {slowdown[n]:.1f}x slower beside the busy process; per step "
              f"{versus_one[f'{n}/{min(args.threads)}']['alone']:.1f}x (alone) and "
              f"{versus_one[f'{n}/{min(args.threads)}']['busy']:.1f}x (busy) the time with "
              f"{min(args.threads)} thread(s)")
    result = {
        "benchmark": "bench_threads",
        "what": "median seconds per training step of chapter 04's CI-recipe Transformer, alone and beside a "
                f"busy process ({args.busy!r}), for each intra-op thread count; slowdown = busy / alone",
        "cores": cores, "busy": args.busy, "steps": args.steps, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "results": rows,
        "slowdown": {str(n): s for n, s in slowdown.items()},
        "time_ratio_to_fewest_threads": versus_one,
        "fastest_threads_when_busy": fastest_busy,
        "policy_threads": device.default_cpu_threads(),
        "torch": torch.__version__, "parallel": torch.__config__.parallel_info().splitlines()[-1].strip(),
        "load_average_before": load_before, "load_average_at_end": list(os.getloadavg()),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
