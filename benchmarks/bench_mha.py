"""lib's multi-head attention against torch.nn.MultiheadAttention, forward + backward, on the CPU.

For several shapes ``(batch, time, d_model, heads)`` the same weights (copied from a
``torch.nn.MultiheadAttention`` into ``lib.attention.MultiHeadAttention``) run a
self-attention forward pass with a padding mask and a backward pass through the input and
the weights, in three versions:

* ``torch``:     ``torch.nn.MultiheadAttention(..., need_weights=False)`` (PyTorch's kernel);
* ``lib``:       ``lib.attention.MultiHeadAttention`` (explicit softmax, returns the weights);
* ``lib_fused``: the same module with ``fused=True`` (``F.scaled_dot_product_attention``).

The three are timed interleaved (round-robin, ``--repeats`` rounds, median per version), so a
busy machine slows all of them alike; the numbers to read are the ratios ``lib / torch`` and
``lib_fused / torch`` measured in the same run (> 1 means slower than PyTorch). Outputs are
checked to agree before timing. Written to ``results/bench_mha.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_mha.py                 # all shapes
    .venv/bin/python benchmarks/bench_mha.py --quick --out /tmp/bench_mha.json

Not part of the test pass.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
from lib.attention import MultiHeadAttention, padding_mask  # noqa: E402
from lib.io import atomic_write  # noqa: E402
from lib.models.transformer import copy_from_torch_mha  # noqa: E402

SHAPES = [(32, 32, 256, 8), (16, 128, 256, 8), (8, 256, 512, 8), (4, 512, 512, 8)]
QUICK_SHAPES = [(8, 32, 128, 4), (4, 128, 256, 8)]


def make_case(B: int, T: int, D: int, H: int):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    ours = copy_from_torch_mha(MultiHeadAttention(D, H), ref)
    x = torch.randn(B, T, D)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=torch.Generator().manual_seed(1))
    lengths[0] = T
    keep = padding_mask(lengths, T)                       # True = real token

    def run_torch():
        xi = x.detach().requires_grad_(True)
        out, _ = ref(xi, xi, xi, key_padding_mask=~keep, need_weights=False)
        out.square().mean().backward()
        return out

    def run_lib(fused: bool):
        def run():
            xi = x.detach().requires_grad_(True)
            out, _ = ours(xi, xi, xi, key_padding_mask=keep, fused=fused)
            out.square().mean().backward()
            return out
        return run

    fns = {"torch": run_torch, "lib": run_lib(False), "lib_fused": run_lib(True)}
    outs = {k: f().detach() for k, f in fns.items()}
    for k in ("lib", "lib_fused"):
        if not torch.allclose(outs[k], outs["torch"], atol=1e-5, rtol=1e-4):
            raise AssertionError(f"{k} disagrees with torch at shape {(B, T, D, H)}: "
                                 f"max diff {(outs[k] - outs['torch']).abs().max().item():.2e}")
    return fns


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small shapes, few repeats")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per shape (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_mha.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device.seed_everything(0)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    repeats = args.repeats or (5 if args.quick else 15)

    rows = []
    for B, T, D, H in shapes:
        fns = make_case(B, T, D, H)
        for f in fns.values():                            # warm-up
            f()
        times = {k: [] for k in fns}
        for _ in range(repeats):
            for k, f in fns.items():                      # round-robin: same conditions for all
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"batch": B, "time": T, "d_model": D, "heads": H,
               "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
               "ratio_lib_over_torch": med["lib"] / med["torch"],
               "ratio_lib_fused_over_torch": med["lib_fused"] / med["torch"]}
        rows.append(row)
        print(f"B={B:3d} T={T:4d} D={D:4d} H={H:2d} | torch {row['ms']['torch']:8.2f} ms | "
              f"lib {row['ms']['lib']:8.2f} ms ({row['ratio_lib_over_torch']:.2f}x) | "
              f"lib fused {row['ms']['lib_fused']:8.2f} ms ({row['ratio_lib_fused_over_torch']:.2f}x)", flush=True)

    geo = lambda xs: float(torch.tensor(xs).log().mean().exp())
    report = {
        "benchmark": "lib.attention.MultiHeadAttention vs torch.nn.MultiheadAttention, self-attention "
                     "forward + backward with a padding mask, CPU, median of interleaved rounds",
        "device": device.summary(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "shapes": rows,
        "geomean_ratio_lib_over_torch": geo([r["ratio_lib_over_torch"] for r in rows]),
        "geomean_ratio_lib_fused_over_torch": geo([r["ratio_lib_fused_over_torch"] for r in rows]),
        "note": "ratios > 1: slower than torch. Times are wall-clock on a possibly shared machine; "
                "the ratios are measured back to back in one process.",
    }
    print(f"geometric mean ratio: lib {report['geomean_ratio_lib_over_torch']:.2f}x, "
          f"lib fused {report['geomean_ratio_lib_fused_over_torch']:.2f}x (vs torch)")
    with atomic_write(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
