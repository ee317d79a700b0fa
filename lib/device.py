"""Where the code runs: device choice, mixed precision, seeding, a one-line summary.

Every chapter starts with::

    from lib import device
    dev = device.setup(seed=0)      # picks cuda > mps > cpu, seeds everything
    print(device.summary())         # one line: device, precision and why, recipe, threads

The same notebook then runs unchanged on a laptop CPU and on a GPU.

Precision
---------
Training steps run their forward pass under ``autocast(dev, model)``: bfloat16 autocast on GPUs
with bfloat16 and, for models at least :data:`CPU_BF16_MIN_WIDTH` wide, on CPUs that multiply
bfloat16 natively (``amx_bf16`` / ``avx512_bf16``); float16 with a grad scaler on older GPUs;
float32 elsewhere. ``COURSE_PRECISION=fp32|bf16|auto`` overrides it; ``summary()`` says which
precision runs and why. ``lib.train.fit`` uses it; a chapter's own loop writes
``with device.autocast(dev, model): loss = ...``. See :func:`precision`.

Several processes (``torchrun``)
--------------------------------
A script started with ``torchrun --nproc_per_node=N script.py`` runs N copies of itself;
torchrun tells each its ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``. ``setup`` then joins
the process group (NCCL on GPUs, Gloo on CPUs), gives process ``LOCAL_RANK`` its own GPU
``cuda:LOCAL_RANK``, and seeds every process with the same seed, so the replicas start
identical. ``lib.train.make_loader`` and ``lib.train.fit`` do the rest (each process
trains on its share of every batch; gradients are averaged). ``rank()``,
``world_size()`` and ``is_main_process()`` tell a script which copy it is.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from lib.validate import check_int

__all__ = ["pick_device", "autocast_dtype", "needs_grad_scaler", "autocast", "seed_everything",
           "setup", "summary", "Precision", "precision", "requested_precision", "cpu_bf16_flag",
           "native_bf16_flag", "model_width", "CPU_BF16_MIN_WIDTH", "rank", "world_size", "is_main_process",
           "torchrun_env", "default_cpu_threads"]


def pick_device(prefer: str | None = None) -> torch.device:
    """Return the best available device: cuda, then mps, then cpu.

    ``prefer`` (or the environment variable ``COURSE_DEVICE``) forces one, e.g. "cpu";
    asking for a device that is not available raises a ``RuntimeError`` saying so.
    """
    prefer = prefer or os.environ.get("COURSE_DEVICE") or None
    if prefer is not None:
        kind = prefer.split(":")[0]
        available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": _mps_available()}
        if kind not in available:
            raise ValueError(f"unknown device {prefer!r}: expected one of cpu, cuda, mps")
        if not available[kind]:
            raise RuntimeError(f"device {prefer!r} was requested but is not available on this machine")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


PRECISION_ENV = "COURSE_PRECISION"
PRECISION_CHOICES = ("auto", "fp32", "bf16")
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# Below this width a CPU's bfloat16 autocast does not pay for itself. Measured with
# benchmarks/bench_precision.py --widths on a 2-core Xeon with amx_bf16, one thread, training
# steps at the chapters' CPU sizes (results/bench_precision_xeon_native.json): bf16 ran 0.79x
# (GPT) to 1.32x (BERT) the tokens/s of float32 at width 128; 0.95x (GPT) to 1.77x (BERT) at 256;
# 1.33x to 1.90x at 384. Every weight is cast to bfloat16 on every forward pass, work that only
# wide matrices amortise.
CPU_BF16_MIN_WIDTH = 256


@dataclass(frozen=True)
class Precision:
    """How a device trains: the autocast dtype (None = full fp32), whether a GradScaler is
    needed, and why this precision was chosen (printed by ``summary``)."""
    device_type: str
    dtype: torch.dtype | None
    grad_scaler: bool
    reason: str = ""

    def autocast(self):
        """The context manager for a training step's forward pass in this precision."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    @property
    def name(self) -> str:
        return "fp32" if self.dtype is None else str(self.dtype).replace("torch.", "")


def requested_precision() -> str:
    """``COURSE_PRECISION`` (``auto`` when unset): ``auto``, ``fp32`` or ``bf16``; anything else
    is an error naming the variable."""
    value = os.environ.get(PRECISION_ENV, "").strip().lower() or "auto"
    if value not in PRECISION_CHOICES:
        raise ValueError(f"{PRECISION_ENV}={os.environ[PRECISION_ENV]!r}: expected one of "
                         f"{', '.join(PRECISION_CHOICES)}")
    return value


@functools.cache
def cpu_bf16_flag() -> str | None:
    """The CPU flag saying this x86 CPU multiplies bfloat16 natively (``amx_bf16`` or
    ``avx512_bf16``), or None. Read once per process from ``/proc/cpuinfo``.

    Why flags and not a timed matmul: the flags are free to read and give the same answer in
    every run, whereas a timing taken on a shared machine can flip with the neighbours' load,
    and with it the arithmetic of every chapter. Why these two flags: they are the x86
    instructions that multiply bfloat16 (AVX-512 BF16 dot products, AMX tiles), and without
    them PyTorch's bfloat16 matmul is slow. On this course's 2-core AMD EPYC without them, a 1024 x 1024
    matmul runs at about 90 GFLOP/s in float32 and under 1 GFLOP/s in bfloat16, and a
    ``Linear`` under autocast about 9x slower than in float32 (``benchmarks/bench_precision.py``
    measures whole training steps). The flag must also be usable by PyTorch: its oneDNN
    must report bfloat16 support (``torch.ops.mkldnn._is_mkldnn_bf16_supported``).
    Arm CPUs with bfloat16 instructions are not switched on automatically (not measured
    here): try ``COURSE_PRECISION=bf16`` and ``benchmarks/bench_precision.py`` there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return native_bf16_flag(f.read(), _mkldnn_bf16_usable())
    except OSError:
        return None


def native_bf16_flag(cpuinfo: str, mkldnn_bf16: bool) -> str | None:
    """The first of :data:`CPU_BF16_FLAGS` on the ``flags`` line of ``cpuinfo`` (the text of
    ``/proc/cpuinfo``), provided PyTorch's oneDNN can use it (``mkldnn_bf16``); else None."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags") and ":" in line), [])
    found = next((flag for flag in CPU_BF16_FLAGS if flag in flags), None)
    return found if found is not None and mkldnn_bf16 else None


def _mkldnn_bf16_usable() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def precision(device: torch.device | str, model: torch.nn.Module | None = None) -> Precision:
    """The course's precision policy for training on ``device``.

    ``COURSE_PRECISION=auto`` (the default):

    * cuda: bfloat16 autocast where the GPU supports it, else float16 with a grad scaler;
    * mps: float16 with a grad scaler;
    * cpu: bfloat16 autocast where the CPU multiplies bfloat16 natively (:func:`cpu_bf16_flag`)
      and the ``model`` is at least :data:`CPU_BF16_MIN_WIDTH` wide (:func:`model_width`; without
      a model, the device's policy for wide models), float32 elsewhere, so that no training is
      made slower.

    ``COURSE_PRECISION=fp32`` trains in float32 everywhere; ``COURSE_PRECISION=bf16`` asks for
    bfloat16 autocast (an error on a GPU without bfloat16; on a CPU without native bfloat16 it
    runs, slowly, and the reason says so). Autocast changes only the arithmetic inside the
    forward pass: the weights, gradients and optimizer state stay float32.
    """
    device = torch.device(device)
    asked = requested_precision()
    kind = device.type
    if asked == "fp32":
        return Precision(kind, None, False, f"{PRECISION_ENV}=fp32")
    if asked == "bf16":
        if kind == "cuda" and not torch.cuda.is_bf16_supported():
            raise RuntimeError(f"{PRECISION_ENV}=bf16 but this GPU does not support bfloat16; "
                               f"use {PRECISION_ENV}=auto (float16) or fp32")
        slow = ", no native bf16 on this CPU: slow" if kind == "cpu" and cpu_bf16_flag() is None else ""
        return Precision(kind, torch.bfloat16, False, f"{PRECISION_ENV}=bf16{slow}")
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision("cuda", torch.bfloat16, False, "auto: the GPU supports bf16")
        return Precision("cuda", torch.float16, True, "auto: no bf16 on this GPU")
    if kind == "mps":
        return Precision("mps", torch.float16, True, "auto")
    if kind == "cpu":
        flag = cpu_bf16_flag()
        if flag is not None:
            width = model_width(model) if model is not None else None
            if width is not None and width < CPU_BF16_MIN_WIDTH:
                return Precision("cpu", None, False,
                                 f"auto: {flag}, but width {width} < {CPU_BF16_MIN_WIDTH}, where bf16 is not faster")
            if width is None:
                return Precision("cpu", torch.bfloat16, False,
                                 f"auto: {flag}, for models of width >= {CPU_BF16_MIN_WIDTH}; fp32 below")
            return Precision("cpu", torch.bfloat16, False, f"auto: {flag}, width {width}")
        return Precision("cpu", None, False, "auto: no native bf16 on this CPU")
    return Precision(kind, None, False, "auto")


def model_width(model: torch.nn.Module) -> int:
    """The width of a model's matrix products: the most common input size of its ``nn.Linear``
    layers and recurrent layers (the larger on a tie), e.g. ``n_embd`` for GPT; 0 without any."""
    sizes = Counter()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            sizes[m.in_features] += 1
        elif isinstance(m, torch.nn.RNNBase):
            sizes[m.hidden_size] += 1
    if not sizes:
        return 0
    return max(sizes, key=lambda w: (sizes[w], w))


def autocast_dtype(device: torch.device | str, model: torch.nn.Module | None = None) -> torch.dtype | None:
    return precision(device, model).dtype


def needs_grad_scaler(device: torch.device | str) -> bool:
    return precision(device).grad_scaler


def autocast(device: torch.device | str, model: torch.nn.Module | None = None):
    """A context manager for the forward pass of a training step: autocast to the dtype
    :func:`precision` chose for ``device``, or nothing where it chose float32.

    Evaluation and generation run outside it, in float32 (``lib.train.fit`` does so), so
    that recorded metrics and checked outputs do not depend on the machine."""
    return precision(device, model).autocast()


def seed_everything(seed: int = 0, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all cuda devices too).

    ``deterministic=True`` also asks PyTorch for deterministic kernels (slower on GPU;
    an op without a deterministic implementation then raises instead of silently varying).
    """
    check_int("seed", seed, 0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        # only when needed: the call imports torch._inductor (seconds on a small CPU)
        if torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


_current: torch.device | None = None


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, local_rank, world_size)`` when ``torchrun`` started this process with more than
    one process in all, else None. Malformed variables raise a ``RuntimeError`` naming them."""
    raw = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    if raw["WORLD_SIZE"] in (None, "", "1"):
        return None
    try:
        r, local, world = (int(raw[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    except (TypeError, ValueError):
        raise RuntimeError(f"WORLD_SIZE={raw['WORLD_SIZE']!r} asks for several processes, but RANK={raw['RANK']!r} "
                           f"and LOCAL_RANK={raw['LOCAL_RANK']!r} are not both integers: start the script "
                           "with torchrun") from None
    if not (0 <= r < world and 0 <= local <= r):
        raise RuntimeError(f"inconsistent torchrun variables: RANK={r}, LOCAL_RANK={local}, WORLD_SIZE={world}")
    return r, local, world


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size() -> int:
    """How many processes train together (1 without ``torchrun``)."""
    return torch.distributed.get_world_size() if _dist_ready() else 1


def rank() -> int:
    """This process's rank, 0 to ``world_size() - 1`` (0 without ``torchrun``)."""
    return torch.distributed.get_rank() if _dist_ready() else 0


def is_main_process() -> bool:
    """True in the process that prints, writes checkpoints and records results (rank 0)."""
    return rank() == 0


def _init_distributed(device: torch.device, local_rank: int) -> torch.device:
    """Join the process group torchrun set up (once) and return this process's device."""
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but this machine has {torch.cuda.device_count()} GPU(s): "
                               "start at most one process per GPU (torchrun --nproc_per_node)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    elif device.type == "mps":
        raise RuntimeError("several processes (torchrun) are not supported on mps; use one process")
    if not _dist_ready():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def _positive_int(name: str, value) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(value).strip() != str(n):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n


def default_cpu_threads() -> int:
    """The number of PyTorch intra-op threads every chapter uses on a CPU: the one thread policy.

    In order: ``COURSE_CPU_THREADS`` if set; else ``OMP_NUM_THREADS`` if set (``torchrun``
    sets it to 1 per process); else half the cores this process may use, at least 1 (one
    thread on the 2-core CI machine). Why not one thread per core, PyTorch's default: every
    operator then splits its work across all cores and waits at a barrier for the slowest
    part. When another process holds one of the cores, the thread on that core runs only
    when the scheduler gives it a turn, and every operator of a small model waits for it:
    ``benchmarks/bench_threads.py`` measures the slowdown. Leaving cores free costs little
    for the course's small models (their operators are too small to split well) and keeps
    the chapters steady on a shared machine.
    """
    for name in ("COURSE_CPU_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").strip():
            return _positive_int(name, os.environ[name].strip())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


def setup(seed: int = 0, deterministic: bool = False, prefer: str | None = None,
          cpu_threads: int | None = None) -> torch.device:
    """Pick the device, seed everything, and remember the device for ``summary()``.

    On the CPU it sets PyTorch's intra-op threads to ``cpu_threads``, or when None to
    :func:`default_cpu_threads` (the course's one policy: half the cores, one on the 2-core
    CI machine; ``COURSE_CPU_THREADS`` overrides it). Models made of many small sequential
    steps, such as an LSTM over a long sequence, train fastest on one thread: each step is
    too small to split.

    Under ``torchrun`` with several processes it also joins the process group and gives each
    process its own GPU (see the module docstring); every process gets the same seed.
    """
    global _current
    _current = pick_device(prefer)
    env = torchrun_env()
    if env is not None:
        _current = _init_distributed(_current, env[1])
    if cpu_threads is not None:
        check_int("cpu_threads", cpu_threads, 1)
    if _current.type == "cpu":
        torch.set_num_threads(cpu_threads if cpu_threads is not None else default_cpu_threads())
    precision(_current)             # a bad COURSE_PRECISION fails here, at the top of the notebook
    seed_everything(seed, deterministic)
    return _current


def summary(device: torch.device | str | None = None, recipe: bool = True) -> str:
    """One line saying where this notebook runs, e.g.
    ``device=cpu (x86_64, 2 threads) | precision=fp32 (auto: no native bf16 on this CPU) | recipe=ci |
    torch 2.13.0``; the reason in brackets says why this precision (see :func:`precision`).
    ``recipe=False`` leaves the chapter recipe out (for a run that has none of its own, like pretraining)."""
    from lib import config  # local import: config imports device

    device = torch.device(device) if device is not None else (_current or pick_device())
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        where = "Apple GPU"
    else:
        where = f"{platform.machine()}, {torch.get_num_threads()} threads"
    procs = f" | process {rank()} of {world_size()}" if world_size() > 1 else ""
    p = precision(device)
    mode = f"recipe={config.mode()} | " if recipe else ""
    return (f"device={device.type} ({where}) | precision={p.name} ({p.reason}) | "
            f"{mode}torch {torch.__version__.split('+')[0]}{procs}")
