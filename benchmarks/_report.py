"""What every benchmark records beside its numbers, and the atomic write of its JSON file."""
from __future__ import annotations

import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from lib import device
from lib.io import atomic_write


def cpu_name() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


def write(out: Path, result: dict) -> dict:
    """Add the device, CPU, thread count, load average and date to ``result``; write it to ``out``."""
    result = {**result,
              "device": device.summary(),
              "cpu": cpu_name(), "cpu_bf16_flag": device.cpu_bf16_flag(),
              "torch_threads": torch.get_num_threads(),
              "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    print(f"wrote {out}")
    return result


def timed(fn, repeats: int):
    """Run ``fn`` ``repeats`` times: (median seconds, every time, the last output)."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, out


def kv_cache_rows(decode, new_tokens: list[int], batch_size: int, repeats: int) -> list[dict]:
    """Time ``decode(n, use_cache) -> tokens`` with and without the cache for each ``n``.

    Both must give the same tokens; a row holds the median times and the speed-up."""
    decode(8, True), decode(8, False)          # warm-up (allocator, kernels)
    rows = []
    for n in new_tokens:
        t_cache, all_cache, a = timed(lambda: decode(n, True), repeats)
        t_plain, all_plain, b = timed(lambda: decode(n, False), repeats)
        if not torch.equal(a, b):
            raise SystemExit(f"cache and no-cache decoding disagree at {n} new tokens")
        row = {"new_tokens": n, "seconds_cache": t_cache, "seconds_no_cache": t_plain,
               "speedup": t_plain / t_cache, "tokens_per_s_cache": n * batch_size / t_cache,
               "tokens_per_s_no_cache": n * batch_size / t_plain,
               "all_seconds_cache": all_cache, "all_seconds_no_cache": all_plain, "same_tokens": True}
        rows.append(row)
        print(f"{n:4d} new tokens: cache {t_cache:7.2f} s, no cache {t_plain:7.2f} s, "
              f"speed-up {row['speedup']:.1f}x", flush=True)
    return rows


def alternate(runs: dict, steps: int, repeats: int, dev: torch.device) -> dict[str, list[float]]:
    """Time each ``runs[name]()`` (one step) in alternation: a warm-up step each, then ``repeats``
    rounds in which every name runs ``steps`` steps. Returns the seconds of every round, by name.
    Alternating spreads a change in the machine's load over all of them alike."""
    def round_(name: str, n: int) -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            runs[name]()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    for name in runs:                      # warm-up
        round_(name, 1)
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name in runs:
            seconds[name].append(round_(name, steps))
    return seconds
