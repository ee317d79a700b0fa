"""Product-key search against a brute-force search over all n² keys, on the CPU.

For each number of sub-keys n (so n² memory slots), the same ``ProductKeyMemory`` answers
a batch of queries twice: ``search`` (top-k of each half, then top-k of the k² pairs) and
``brute_force_search`` (score all n² slots, then top-k). Both must return the same slots
(checked before timing). The two are timed interleaved (round-robin, median of
``--repeats`` rounds) so that a busy machine slows both alike; the figure to read is the
ratio brute force / product keys measured in the same run. Written to
``results/bench_pkm.json`` (or ``--out``).

    .venv/bin/python benchmarks/bench_pkm.py
    .venv/bin/python benchmarks/bench_pkm.py --quick --out /tmp/bench_pkm.json

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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lib import device  # noqa: E402
from lib.io import atomic_write  # noqa: E402
from lib.models.memory import ProductKeyMemory  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, nargs="+", default=[128, 256, 512, 1024], help="sub-keys n per half")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--d-key", type=int, default=128)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="two sizes, three rounds")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench_pkm.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.keys, args.repeats = args.keys[:2], 3

    device.seed_everything(0)
    rows = []
    with torch.no_grad():
        for n in args.keys:
            pkm = ProductKeyMemory(d_in=args.d_key, d_out=64, n_keys=n, k=args.k, d_key=args.d_key)
            q = torch.randn(args.queries, args.d_key)
            fast, slow = pkm.search(q), pkm.brute_force_search(q)
            if not torch.equal(fast[1], slow[1]):
                raise SystemExit(f"n={n}: product-key search disagrees with brute force")
            times = {"product": [], "brute_force": []}
            for _ in range(args.repeats):
                for name, fn in (("product", pkm.search), ("brute_force", pkm.brute_force_search)):
                    start = time.perf_counter()
                    fn(q)
                    times[name].append(time.perf_counter() - start)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"sub_keys": n, "slots": n * n, "product_ms": round(1000 * med["product"], 3),
                         "brute_force_ms": round(1000 * med["brute_force"], 3),
                         "speedup": round(med["brute_force"] / med["product"], 2)})
            print(f"n={n:5d}  slots={n * n:>9,}  product {rows[-1]['product_ms']:8.2f} ms  "
                  f"brute force {rows[-1]['brute_force_ms']:9.2f} ms  speed-up {rows[-1]['speedup']:6.1f}x")
    report = {"benchmark": "product-key search vs brute force over n^2 keys (top-k, CPU)",
              "k": args.k, "d_key": args.d_key, "queries": args.queries, "repeats": args.repeats,
              "device": device.summary(torch.device("cpu")), "torch": torch.__version__,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}
    with atomic_write(args.out, "w") as f:
        f.write(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
