"""lib.device: device choice, precision, seeding, determinism and the summary line.

GPUs are simulated by monkeypatching ``torch.cuda`` / ``torch.backends.mps``; nothing here
needs one.
"""
import os
import random

import numpy as np
import pytest
import torch

from lib import device as D


@pytest.fixture
def machine(monkeypatch):
    """Simulate a machine: machine(cuda=..., mps=..., bf16=...)."""
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.delenv("COURSE_MODE", raising=False)
    monkeypatch.delenv("COURSE_PRECISION", raising=False)

    def make(cuda=False, mps=False, bf16=True, name="Fake GPU", cpu_bf16=None):
        monkeypatch.setattr(D, "cpu_bf16_flag", lambda: cpu_bf16)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: name)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return make


@pytest.fixture
def restore_determinism():
    """Leave torch's global determinism settings (and the cuBLAS variable) as they were."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    if torch.are_deterministic_algorithms_enabled() != before[0]:
        torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
    if before[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[3]


# ----------------------------------------------------------------------------- pick_device

@pytest.mark.parametrize("cuda, mps, expected", [
    (True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu"),
])
def test_pick_device_order_cuda_mps_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert D.pick_device() == torch.device(expected)


def test_course_device_overrides_the_choice(machine, monkeypatch):
    machine(cuda=True, mps=True)
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert D.pick_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "mps")
    assert D.pick_device() == torch.device("mps")
    # an explicit argument wins over the environment
    assert D.pick_device("cuda") == torch.device("cuda")
    assert D.pick_device("cuda:1") == torch.device("cuda", 1)


def test_unavailable_or_unknown_device_is_an_error(machine, monkeypatch):
    machine(cuda=False, mps=False)
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="'cuda' was requested but is not available"):
        D.pick_device()
    with pytest.raises(RuntimeError, match="'mps' was requested but is not available"):
        D.pick_device("mps")
    with pytest.raises(ValueError, match="unknown device 'tpu'.*cpu, cuda, mps"):
        D.pick_device("tpu")


# ----------------------------------------------------------------------------- precision

def test_precision_bf16_where_supported(machine):
    machine(cuda=True, bf16=True)
    p = D.precision("cuda")
    assert (p.device_type, p.dtype, p.grad_scaler, p.name) == ("cuda", torch.bfloat16, False, "bfloat16")
    assert D.autocast_dtype(torch.device("cuda")) == torch.bfloat16
    assert not D.needs_grad_scaler("cuda")


def test_precision_fp16_with_scaler_on_older_gpus(machine):
    machine(cuda=True, bf16=False)
    p = D.precision(torch.device("cuda", 0))
    assert (p.dtype, p.grad_scaler, p.name) == (torch.float16, True, "float16")
    assert D.needs_grad_scaler("cuda")


def test_precision_none_on_cpu(machine):
    machine(cuda=True, bf16=True)  # a GPU elsewhere does not change what the cpu does
    p = D.precision("cpu")
    assert (p.dtype, p.grad_scaler, p.name) == (None, False, "fp32")
    a = torch.randn(4, 4)
    with D.autocast("cpu"):
        assert (a @ a).dtype == torch.float32  # no autocast on cpu


def test_cpu_with_native_bf16_autocasts_to_bf16(machine):
    machine(cpu_bf16="avx512_bf16")
    p = D.precision("cpu")
    assert (p.dtype, p.grad_scaler) == (torch.bfloat16, False)
    a = torch.randn(4, 4)
    with D.autocast("cpu"):
        assert (a @ a).dtype == torch.bfloat16
    assert "precision=bfloat16 (auto: avx512_bf16, for models of width >= 256; fp32 below)" in D.summary("cpu")


def _linear_stack(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(10, width), torch.nn.Linear(width, 4 * width),
                               torch.nn.Linear(4 * width, width), torch.nn.Linear(width, width),
                               torch.nn.Linear(width, 10))


def test_model_width_is_the_common_input_size_of_its_products():
    from lib.models.gpt import GPT, GPTConfig
    gpt = GPT(GPTConfig(vocab_size=65, block_size=8, n_layer=2, n_head=2, n_embd=48))
    assert D.model_width(gpt) == 48
    assert D.model_width(_linear_stack(128)) == 128
    assert D.model_width(torch.nn.LSTM(32, 300, num_layers=2)) == 300
    assert D.model_width(torch.nn.Embedding(10, 512)) == 0


def test_cpu_bf16_only_for_models_wide_enough(machine):
    """On a CPU with native bfloat16, narrow models train in float32 (bf16 measured slower
    there) and models of width CPU_BF16_MIN_WIDTH or more in bfloat16; the reason says which."""
    machine(cpu_bf16="amx_bf16")
    narrow, wide = _linear_stack(D.CPU_BF16_MIN_WIDTH // 2), _linear_stack(D.CPU_BF16_MIN_WIDTH)
    p = D.precision("cpu", narrow)
    assert p.dtype is None and p.reason == "auto: amx_bf16, but width 128 < 256, where bf16 is not faster"
    with D.autocast("cpu", narrow):
        assert not torch.is_autocast_enabled("cpu")
    p = D.precision("cpu", wide)
    assert p.dtype == torch.bfloat16 and p.reason == "auto: amx_bf16, width 256"
    with D.autocast("cpu", wide):
        assert torch.is_autocast_enabled("cpu")
    machine(cpu_bf16=None)                       # no native bf16: float32 whatever the width
    assert D.precision("cpu", wide).dtype is None
    machine(cuda=True)                           # a GPU ignores the width
    assert D.precision("cuda", narrow).dtype == torch.bfloat16


def test_fit_trains_in_the_precision_chosen_for_its_model(machine):
    """lib.train.fit decides once per call from the model: the step of a narrow model runs
    without autocast, that of a wide one under bf16 autocast, on the same native-bf16 CPU."""
    from lib import train
    machine(cpu_bf16="avx512_bf16")
    seen = {}
    for name, width in (("narrow", 64), ("wide", 256)):
        model = _linear_stack(width)
        x = torch.randint(0, 10, (4, 3))

        def step(m, batch, name=name):
            seen[name] = torch.is_autocast_enabled("cpu")
            return m(batch).float().logsumexp(-1).mean(), {}
        train.fit(model, [x], optimizer=torch.optim.SGD(model.parameters(), lr=0.0), step_fn=step,
                  device="cpu", progress=False, log_every=None)
    assert seen == {"narrow": False, "wide": True}


def test_cpu_without_native_bf16_stays_float32(machine):
    machine(cpu_bf16=None)
    p = D.precision("cpu")
    assert (p.dtype, p.reason) == (None, "auto: no native bf16 on this CPU")
    with D.autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    assert "precision=fp32 (auto: no native bf16 on this CPU)" in D.summary("cpu")


def test_course_precision_overrides_the_policy(machine, monkeypatch):
    machine(cuda=True, bf16=True, cpu_bf16="amx_bf16")
    monkeypatch.setenv("COURSE_PRECISION", "fp32")
    for dev in ("cpu", "cuda", "mps"):
        p = D.precision(dev)
        assert (p.dtype, p.grad_scaler, p.reason) == (None, False, "COURSE_PRECISION=fp32")
    with D.autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    machine(cuda=True, bf16=False, cpu_bf16=None)
    monkeypatch.setenv("COURSE_PRECISION", " BF16 ")            # case and spaces do not matter
    p = D.precision("cpu")
    assert p.dtype == torch.bfloat16 and "no native bf16 on this CPU: slow" in p.reason
    with pytest.raises(RuntimeError, match="COURSE_PRECISION=bf16 but this GPU does not support bfloat16"):
        D.precision("cuda")
    monkeypatch.setenv("COURSE_PRECISION", "auto")
    assert D.precision("cuda").dtype == torch.float16
    monkeypatch.setenv("COURSE_PRECISION", "half")
    with pytest.raises(ValueError, match="COURSE_PRECISION='half': expected one of auto, fp32, bf16"):
        D.precision("cpu")


def test_setup_rejects_a_bad_course_precision_at_once(machine, monkeypatch):
    machine()
    monkeypatch.setenv("COURSE_PRECISION", "fp64")
    try:
        with pytest.raises(ValueError, match="COURSE_PRECISION='fp64'"):
            D.setup(seed=0, cpu_threads=1)
    finally:
        D._current = None


CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 {extra}\nbugs\t\t: none\n"


@pytest.mark.parametrize("extra, mkldnn, expected", [
    ("avx512f avx512_bf16", True, "avx512_bf16"), ("amx_tile amx_bf16 avx512_bf16", True, "amx_bf16"),
    ("avx512f avx512_vnni", True, None),         # AVX-512 without its bf16 instructions
    ("avx512_bf16", False, None),                # the CPU has them, but PyTorch's oneDNN cannot use them
    ("", True, None),
])
def test_native_bf16_flag_reads_the_cpu_flags(extra, mkldnn, expected):
    assert D.native_bf16_flag(CPUINFO.format(extra=extra), mkldnn) == expected
    assert D.native_bf16_flag("", True) is None   # not Linux, or no flags line


def test_cpu_bf16_flag_is_decided_once_per_process():
    assert D.cpu_bf16_flag() is D.cpu_bf16_flag()
    assert D.cpu_bf16_flag.cache_info().hits >= 1


def test_precision_mps_fp16(machine):
    machine(mps=True)
    p = D.precision("mps")
    assert (p.dtype, p.grad_scaler) == (torch.float16, True)


# ----------------------------------------------------------------------------- seeding

def _draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.randint(0, 1000, (2,)).tolist())


def test_seed_everything_repeats_python_numpy_and_torch(restore_determinism):
    D.seed_everything(123)
    first = _draws()
    D.seed_everything(123)
    assert _draws() == first
    D.seed_everything(124)
    other = _draws()
    for a, b in zip(first, other):  # each generator is reseeded, not just one of them
        assert a != b


def test_seed_everything_rejects_bad_seeds():
    with pytest.raises(ValueError, match="seed must be >= 0, got -1"):
        D.seed_everything(-1)
    for bad in (1.5, "0", True):
        with pytest.raises(TypeError, match="seed must be an int"):
            D.seed_everything(bad)


def test_deterministic_switch_toggles_torch(restore_determinism):
    D.seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    D.seed_everything(0, deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic


def test_setup_seeds_and_returns_the_device(machine, restore_determinism):
    machine(cuda=False, mps=False)
    dev = D.setup(seed=7)
    first = _draws()
    assert dev == torch.device("cpu")
    assert D.setup(seed=7) == dev and _draws() == first


# ----------------------------------------------------------------------------- summary

def test_summary_is_one_line_naming_device_precision_recipe(machine, restore_determinism):
    machine(cuda=False, mps=False)
    D.setup(seed=0)
    line = D.summary()
    assert "\n" not in line
    assert "device=cpu" in line and "precision=fp32" in line and "recipe=ci" in line
    assert f"torch {torch.__version__.split('+')[0]}" in line
    assert f"{torch.get_num_threads()} threads" in line


def test_summary_follows_course_mode_and_given_device(machine, monkeypatch):
    machine(cuda=True, bf16=False, name="Tesla T4")
    monkeypatch.setenv("COURSE_MODE", "ci")
    line = D.summary(torch.device("cuda"))
    assert line.startswith("device=cuda (Tesla T4)")
    assert "precision=float16" in line and "recipe=ci" in line
    monkeypatch.setenv("COURSE_MODE", "full")
    assert "recipe=full" in D.summary("cpu")


def test_setup_sets_cpu_threads_only_on_the_cpu(monkeypatch):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        D.setup(seed=0, prefer="cpu", cpu_threads=1)
        assert torch.get_num_threads() == 1
        assert "1 threads" in D.summary()
        torch.set_num_threads(2)
        monkeypatch.setattr(D, "pick_device", lambda prefer=None: torch.device("cuda"))
        D.setup(seed=0, cpu_threads=1)
        assert torch.get_num_threads() == 2            # a GPU run keeps PyTorch's default
        with pytest.raises(ValueError, match="cpu_threads"):
            D.setup(seed=0, cpu_threads=0)
    finally:
        torch.set_num_threads(before)
        D._current = None


@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_default_cpu_threads_is_half_the_usable_cores(monkeypatch, cores, expected):
    monkeypatch.delenv("COURSE_CPU_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert D.default_cpu_threads() == expected


def test_default_cpu_threads_follows_the_environment(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("COURSE_CPU_THREADS", raising=False)
    assert D.default_cpu_threads() == 3                 # e.g. torchrun's one thread per process
    monkeypatch.setenv("COURSE_CPU_THREADS", "2")
    assert D.default_cpu_threads() == 2                 # the course's own switch wins
    for bad in ("0", "two", "1.5", "-1"):
        monkeypatch.setenv("COURSE_CPU_THREADS", bad)
        with pytest.raises(ValueError, match="COURSE_CPU_THREADS"):
            D.default_cpu_threads()


def test_setup_applies_the_thread_policy_on_the_cpu(monkeypatch, restore_determinism):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("COURSE_CPU_THREADS", "1")
    try:
        torch.set_num_threads(2)
        D.setup(seed=0, prefer="cpu")
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("COURSE_CPU_THREADS", "2")
        D.setup(seed=0, prefer="cpu")
        assert torch.get_num_threads() == 2
        D.setup(seed=0, prefer="cpu", cpu_threads=1)    # an explicit choice beats the policy
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        D._current = None


def test_torchrun_env_reads_the_variables(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert D.torchrun_env() is None                               # a plain python process
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert D.torchrun_env() is None                               # torchrun with one process
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert D.torchrun_env() == (3, 1, 4)
    assert D.world_size() == 1 and D.rank() == 0 and D.is_main_process()   # no process group joined yet


@pytest.mark.parametrize("rank, local, world, match", [
    (None, "0", "2", "start the script with torchrun"),
    ("x", "0", "2", "not both integers"),
    ("2", "0", "2", "inconsistent"),
    ("1", "2", "2", "inconsistent"),
])
def test_torchrun_env_rejects_malformed_variables(monkeypatch, rank, local, world, match):
    for k, v in (("RANK", rank), ("LOCAL_RANK", local), ("WORLD_SIZE", world)):
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match=match):
        D.torchrun_env()
    with pytest.raises(RuntimeError, match=match):
        D.setup(seed=0)                                           # setup fails before touching anything
