"""Tests of lib.train: the training loop, schedules, history and exact-resume checkpoints."""
from __future__ import annotations

import collections
import json
import math
import os
import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

from lib import device as lib_device
from lib import train
from lib.train.loaders import start_epoch
from lib.train.progress import show_bar



# --------------------------------------------------------------------------------------------
# A tiny regression problem
# --------------------------------------------------------------------------------------------

def regression_data(n=96, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    y = x @ w + 0.05 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def make_model(seed=0, dropout=0.3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))


def mse_step(model, batch):
    x, y = batch
    pred = model(x)
    return nn.functional.mse_loss(pred, y), {"mae": (pred - y).abs().mean().item()}


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

def test_loss_decreases_on_regression():
    ds = regression_data()
    model = make_model(dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    hist = train.fit(model, train.make_loader(ds, 16, seed=0), optimizer=opt, step_fn=mse_step,
                     epochs=8, log_every=6, progress=False)
    losses = hist.values("train_loss")
    assert len(losses) == 8  # 6 batches per epoch, one record per log_every=6 steps
    assert losses[-1] < 0.1 * losses[0]
    assert hist.last("step") == 48 and hist.last("epoch") == 8
    x, y = ds.tensors
    assert nn.functional.mse_loss(model(x), y).item() < 0.1 * y.var().item()


class NormSpy:
    """Wraps optimizer.step to measure the global gradient norm the optimizer actually sees."""

    def __init__(self, model, optimizer):
        self.norms = []
        inner = optimizer.step

        def step(*args, **kwargs):
            grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
            self.norms.append(torch.cat(grads).norm().item())
            return inner(*args, **kwargs)

        optimizer.step = step


@pytest.mark.parametrize("with_scaler", [False, True], ids=["plain", "grad_scaler"])
def test_clipping_bounds_the_gradient_norm(monkeypatch, with_scaler):
    if with_scaler:  # exercise the GradScaler branch on cpu (scale, unscale_, clip, step, update)
        monkeypatch.setattr(lib_device, "precision", lambda dev, model=None: lib_device.Precision("cpu", None, True))
    x = torch.randn(64, 4)
    ds = torch.utils.data.TensorDataset(x, 100.0 * x.sum(1, keepdim=True))  # big targets, big gradients
    norms = {}
    for clip in (None, 0.5):
        model = make_model(dropout=0.0)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        spy = NormSpy(model, opt)
        train.fit(model, train.make_loader(ds, 16), optimizer=opt, step_fn=mse_step, epochs=2,
                  clip_grad=clip, log_every=None, progress=False)
        norms[clip] = spy.norms
    assert len(norms[0.5]) == 8
    assert min(norms[None]) > 5.0            # without clipping the gradients are large ...
    assert max(norms[0.5]) <= 0.5 * (1 + 1e-5)  # ... and clipping bounds what the optimizer sees
    assert max(norms[0.5]) > 0.45


def test_fit_trains_under_the_precision_policy_and_evaluates_in_float32(monkeypatch):
    monkeypatch.setenv("COURSE_PRECISION", "bf16")          # bf16 autocast on any CPU
    ds = regression_data(n=32)
    model = make_model(dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = {"train": set(), "eval": set()}

    def step(model, batch):
        seen["train"].add((torch.is_autocast_enabled("cpu"), model(batch[0]).dtype))
        return mse_step(model, batch)

    def evaluate(model):
        seen["eval"].add((torch.is_autocast_enabled("cpu"), model(ds.tensors[0]).dtype))
        return {"loss": mse_step(model, ds.tensors)[0]}

    hist = train.fit(model, train.make_loader(ds, 8), optimizer=opt, step_fn=step, epochs=2, eval_fn=evaluate,
                     log_every=None, progress=False)
    assert seen == {"train": {(True, torch.bfloat16)}, "eval": {(False, torch.float32)}}
    assert hist.values("train_loss")[-1] < hist.values("train_loss")[0]
    # master weights and optimizer state stay float32
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(v.dtype == torch.float32 for st in opt.state.values() for k, v in st.items() if k != "step")

    monkeypatch.setenv("COURSE_PRECISION", "fp32")
    seen["train"].clear()
    train.fit(model, train.make_loader(ds, 8), optimizer=opt, step_fn=step, max_steps=1, progress=False)
    assert seen["train"] == {(False, torch.float32)}


def test_non_finite_loss_is_an_error():
    ds = regression_data(n=16)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def bad_step(model, batch):
        loss, _ = mse_step(model, batch)
        return loss * float("nan"), {}

    with pytest.raises(FloatingPointError, match="step 1"):
        train.fit(model, train.make_loader(ds, 8), optimizer=opt, step_fn=bad_step, progress=False)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------

def test_transformer_lr_matches_the_paper_formula():
    d, w = 512, 4000
    # d^-0.5 = 1/sqrt(512) = 0.04419417..., written out rather than recomputed the same way
    inv_sqrt_d = 0.044194173824159216
    assert train.transformer_lr(1, d, w) == pytest.approx(inv_sqrt_d * 1 / 4000 ** 1.5)
    assert train.transformer_lr(100, d, w) == pytest.approx(inv_sqrt_d * 100 / 4000 ** 1.5)
    assert train.transformer_lr(4000, d, w) == pytest.approx(6.987712429686844e-4)  # the peak
    assert train.transformer_lr(16000, d, w) == pytest.approx(inv_sqrt_d / 126.49110640673517)
    lrs = [train.transformer_lr(s, d, w) for s in range(1, 12001, 7)] + [train.transformer_lr(4000, d, w)]
    assert max(lrs) == train.transformer_lr(4000, d, w)
    assert train.transformer_lr(3999, d, w) < train.transformer_lr(4000, d, w) > train.transformer_lr(4001, d, w)


def test_transformer_schedule_steps_from_one():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)  # the base lr multiplies the schedule
    sched = train.transformer_schedule(opt, d_model=64, warmup_steps=5)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])  # the lr the next optimizer step uses
        opt.step()
        sched.step()
    expected = [2.0 * 64 ** -0.5 * min(k ** -0.5, k * 5 ** -1.5) for k in range(1, 13)]
    assert seen == pytest.approx(expected)
    assert int(np.argmax(seen)) == 4  # the 5th step (step == warmup) is the peak


def test_warmup_cosine_endpoints():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = train.warmup_cosine(opt, warmup_steps=4, total_steps=14, min_ratio=0.1)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.5 / 4)          # step 1
    assert lrs[3] == pytest.approx(0.5)              # step == warmup: the peak
    assert lrs[8] == pytest.approx(0.5 * (0.1 + 0.9 * 0.5))  # half-way through the decay
    assert lrs[13] == pytest.approx(0.05)            # step == total: min_ratio * base
    assert lrs[19] == pytest.approx(0.05)            # and it stays there
    assert all(a >= b for a, b in zip(lrs[3:14], lrs[4:14]))
    assert train.warmup_cosine_factor(1, 0, 10) == pytest.approx(1 - (1 - math.cos(math.pi / 10)) / 2)


# --------------------------------------------------------------------------------------------
# Evaluation hook and history
# --------------------------------------------------------------------------------------------

def test_eval_hook_runs_at_epoch_ends_and_every_n_steps():
    ds = regression_data(n=40)  # 5 batches of 8 per epoch
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps_done = [0]
    calls = []

    def step_fn(model, batch):
        assert model.training and torch.is_grad_enabled()
        steps_done[0] += 1
        return mse_step(model, batch)

    def eval_fn(model):
        assert not model.training and not torch.is_grad_enabled()
        calls.append(steps_done[0])
        return {"loss": 10.0 + steps_done[0], "eval_count": len(calls)}

    hist = train.fit(model, train.make_loader(ds, 8), optimizer=opt, step_fn=step_fn, epochs=2,
                     eval_fn=eval_fn, eval_every=2, log_every=3, progress=False)
    assert calls == [2, 4, 5, 6, 8, 10]  # every 2 steps, plus the epoch ends (5, 10), never twice at a step
    assert model.training
    evals = [r for r in hist.records if "eval_loss" in r]
    assert [r["step"] for r in evals] == calls
    assert [r["eval_loss"] for r in evals] == [10.0 + s for s in calls]
    assert [r["eval_count"] for r in evals] == [1, 2, 3, 4, 5, 6]  # an existing eval_ prefix is kept
    # training metrics are averaged into the same records (log_every=3 adds 3 and 9)
    assert [r["step"] for r in hist.records] == [2, 3, 4, 5, 6, 8, 9, 10]
    assert all("train_loss" in r and "lr" in r for r in hist.records)
    assert [r["epoch"] for r in hist.records] == [1, 1, 1, 1, 2, 2, 2, 2]

    # max_steps in the middle of an epoch: one final evaluation at the last step
    calls.clear()
    steps_done[0] = 0
    model2 = make_model()
    hist2 = train.fit(model2, train.make_loader(ds, 8), optimizer=torch.optim.SGD(model2.parameters(), lr=0.01),
                      step_fn=step_fn, epochs=3, max_steps=7, eval_fn=eval_fn, log_every=None, progress=False)
    assert calls == [5, 7]
    assert hist2.last("step") == 7


def test_history_queries_and_json_round_trip():
    h = train.History([{"step": 1, "train_loss": 3.0}, {"step": 2, "train_loss": 1.0, "eval_acc": 0.5},
                       {"step": 3, "train_loss": 2.0, "eval_acc": 0.75}])
    assert h.last("train_loss") == 2.0
    assert h.best("train_loss") == 1.0
    assert h.best("eval_acc", mode="max") == 0.75
    assert h.best_record("train_loss")["step"] == 2
    assert h.series("eval_acc") == ([2, 3], [0.5, 0.75])
    frame = h.to_frame()
    assert list(frame.columns) == ["step", "train_loss", "eval_acc"]
    assert math.isnan(frame["eval_acc"][0]) and frame["eval_acc"][2] == 0.75
    back = train.History.from_dict(json.loads(json.dumps(h.to_dict())))
    assert back == h and back.records is not h.records
    with pytest.raises(KeyError, match="nope"):
        h.last("nope")
    with pytest.raises(ValueError, match="mode"):
        h.best("train_loss", mode="smallest")
    with pytest.raises(ValueError, match="records"):
        train.History.from_dict({"rows": []})


# --------------------------------------------------------------------------------------------
# Exact resume
# --------------------------------------------------------------------------------------------

class Crash(Exception):
    pass


def noisy_collate(items):
    x = torch.stack([i[0] for i in items])
    y = torch.stack([i[1] for i in items])
    return x + 0.1 * torch.randn_like(x), y


class Counting(torch.utils.data.Dataset):
    loads = 0

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        Counting.loads += 1
        return self.ds[i]


class EagerShuffle:
    def __init__(self, ds, batch_size):
        self.ds, self.batch_size = ds, batch_size

    def __len__(self):
        return math.ceil(len(self.ds) / self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.ds))
        return iter([self.ds[order[i:i + self.batch_size]] for i in range(0, len(self.ds), self.batch_size)])


class SelfShuffling(torch.utils.data.IterableDataset):
    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __iter__(self):
        for i in torch.randperm(len(self.ds)).tolist():
            yield self.ds[i]


def _run(loader_kind, ckpt, *, max_steps=None, crash_at=None, resume=False):
    """Train the dropout model for 3 epochs of 6 batches (18 steps) with shuffling, a scheduler,
    an eval_fn that draws random numbers, and a checkpoint every 4 steps."""
    ds = regression_data()
    model = make_model(seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = train.warmup_cosine(opt, warmup_steps=3, total_steps=18, min_ratio=0.1)
    if loader_kind == "make_loader":
        loader = train.make_loader(ds, 16, shuffle=True, seed=5)
    elif loader_kind == "random_collate":  # augmentation drawn from the global torch RNG, as BERT masking is
        loader = train.make_loader(ds, 16, shuffle=True, seed=5, collate_fn=noisy_collate)
    elif loader_kind == "dataloader_generator":  # one generator shared by the sampler and the workers' seed
        loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator())
    elif loader_kind == "counting":
        loader = train.make_loader(Counting(ds), 16, shuffle=True, seed=5)
    elif loader_kind == "eager":  # not a DataLoader: shuffles with the global RNG as soon as iter() is called
        loader = EagerShuffle(ds, 16)
    elif loader_kind == "iterable":  # shuffles itself with the global RNG: fit restores the epoch's RNG state
        loader = torch.utils.data.DataLoader(SelfShuffling(ds), batch_size=16)
    else:  # a plain DataLoader: fit gives it a generator and re-seeds it per epoch
        loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)
    count = [0]

    def step_fn(model, batch):
        count[0] += 1
        if crash_at is not None and count[0] == crash_at:
            raise Crash
        return mse_step(model, batch)

    def eval_fn(model):
        x, y = ds.tensors
        return {"mse": nn.functional.mse_loss(model(x), y).item(), "noise": torch.rand(()).item()}

    hist = train.fit(model, loader, optimizer=opt, step_fn=step_fn, epochs=3, max_steps=max_steps,
                     scheduler=sched, eval_fn=eval_fn, eval_every=5, log_every=4, checkpoint=ckpt,
                     checkpoint_every=4, resume=resume, progress=False)
    return model, hist


def _scramble_rngs():
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)


@pytest.mark.parametrize("loader_kind,interrupt", [
    ("make_loader", "crash"),           # an exception in step 11: resume from the step-8 checkpoint
    ("make_loader", "max_steps=7"),     # stopped mid-epoch and mid logging window
    ("dataloader", "max_steps=12"),     # stopped exactly at an epoch end, plain DataLoader(shuffle=True)
    ("dataloader", "crash"),
    ("dataloader_generator", "crash"),
    ("random_collate", "crash"),
    ("iterable", "max_steps=12"),
    ("iterable", "crash"),
    ("eager", "max_steps=12"),
    ("eager", "crash"),
])
def test_resume_is_exact(tmp_path, loader_kind, interrupt):
    torch.manual_seed(0)
    ref_model, ref_hist = _run(loader_kind, tmp_path / "ref.pt")

    ckpt = tmp_path / "run.pt"
    torch.manual_seed(0)
    if interrupt == "crash":
        with pytest.raises(Crash):
            _run(loader_kind, ckpt, crash_at=11)
        assert train.load_checkpoint(ckpt, make_model())["step"] == 8
    else:
        k = int(interrupt.split("=")[1])
        _, part = _run(loader_kind, ckpt, max_steps=k)
        assert part.last("step") == k
    _scramble_rngs()  # a new session: the global random state is whatever it is
    model, hist = _run(loader_kind, ckpt, resume=True)

    assert hist.records == ref_hist.records
    for (name, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    # resuming a finished run trains no further and returns the same history
    _scramble_rngs()
    again_model, again_hist = _run(loader_kind, ckpt, resume=True)
    assert again_hist.records == ref_hist.records
    assert all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), again_model.parameters()))


def test_resume_does_not_load_the_skipped_batches(tmp_path):
    torch.manual_seed(0)
    ref_model, ref_hist = _run("counting", tmp_path / "ref.pt")
    torch.manual_seed(0)
    with pytest.raises(Crash):
        _run("counting", tmp_path / "run.pt", crash_at=11)
    Counting.loads = 0
    model, hist = _run("counting", tmp_path / "run.pt", resume=True)
    assert Counting.loads == (18 - 8) * 16  # steps 9..18 only: the 2 done batches of epoch 2 are not read
    assert hist.records == ref_hist.records
    assert all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), model.parameters()))


def test_resume_without_a_checkpoint_file_starts_fresh(tmp_path):
    torch.manual_seed(0)
    a, ha = _run("make_loader", tmp_path / "a.pt", max_steps=5)
    torch.manual_seed(0)
    b, hb = _run("make_loader", tmp_path / "missing.pt", max_steps=5, resume=True)
    assert ha.records == hb.records
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_data_order_depends_on_seed_and_epoch():
    ds = torch.utils.data.TensorDataset(torch.arange(12.0))
    seen = []

    def step_fn(model, batch):
        seen.append(batch[0].tolist())
        return model(batch[0][:, None]).sum(), {}

    def order(seed):
        seen.clear()
        model = nn.Linear(1, 1)
        train.fit(model, train.make_loader(ds, 4, seed=seed), optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                  step_fn=step_fn, epochs=2, log_every=None, progress=False)
        return [list(map(int, b)) for b in seen]

    o = order(3)
    assert sorted(sum(o[:3], [])) == list(range(12))   # each epoch is a permutation
    assert o[:3] != o[3:]                               # a new order each epoch
    assert order(3) == o                                # a function of the seed only
    assert order(4) != o


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

def test_checkpoint_round_trip(tmp_path):
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = train.transformer_schedule(opt, d_model=16, warmup_steps=4)
    loss, _ = mse_step(model, regression_data(n=8)[:])
    loss.backward()
    opt.step()
    sched.step()
    hist = train.History([{"step": 1, "train_loss": loss.item()}])
    path = train.save_checkpoint(tmp_path / "c.pt", model, opt, sched, step=1, extra={"note": "hi", "ids": [1, 2]},
                                 epoch=0, history=hist)
    model2 = make_model(seed=9)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    sched2 = train.transformer_schedule(opt2, d_model=16, warmup_steps=4)
    info = train.load_checkpoint(path, model2, opt2, sched2)
    assert info["step"] == 1 and info["extra"] == {"note": "hi", "ids": [1, 2]} and info["history"] == hist
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    assert sched2.last_epoch == 1 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])

    # restore_rng brings back the random streams as they were at save time
    train.save_checkpoint(path, model, rng=True)
    expected = (torch.rand(3), np.random.rand(), random.random())
    _scramble_rngs()
    train.load_checkpoint(path, model2, restore_rng=True)
    got = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]

    with pytest.raises(TypeError, match=r"extra\['obj'\]"):
        train.save_checkpoint(path, model, extra={"obj": object()})
    with pytest.raises(train.CheckpointError, match="does not match"):
        train.load_checkpoint(path, nn.Linear(2, 2))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    model = make_model()
    path = tmp_path / "model.pt"
    train.save_checkpoint(path, model, step=1)
    train.save_checkpoint(path, model, step=2)
    assert os.listdir(tmp_path) == ["model.pt"]  # no temporary files left behind
    before = path.read_bytes()
    real_save = torch.save

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        train.save_checkpoint(path, model, step=3)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.pt"]
    assert train.load_checkpoint(path, make_model())["step"] == 2


EXECUTED = []


def _side_effect():
    EXECUTED.append("pickle ran code")
    return {}


class Payload:
    def __reduce__(self):
        return (_side_effect, ())


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_load_checkpoint_is_weights_only(tmp_path):
    model = make_model()
    path = tmp_path / "evil.pt"
    torch.save({"format": train.CHECKPOINT_FORMAT, "model": model.state_dict(), "step": 0, "epoch": 0,
                "extra": Payload()}, path)
    with pytest.raises(train.CheckpointError, match="weights-only"):
        train.load_checkpoint(path, model)
    assert EXECUTED == []
    # a plain pickle is not a checkpoint either
    bad = tmp_path / "plain.pt"
    bad.write_bytes(pickle.dumps({"model": 1}))
    with pytest.raises(train.CheckpointError):
        train.load_checkpoint(bad, model)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train.load_checkpoint(tmp_path / "absent.pt", model)


# --------------------------------------------------------------------------------------------
# Helpers and argument checks
# --------------------------------------------------------------------------------------------

def test_to_device_moves_nested_batches():
    Pair = collections.namedtuple("Pair", "a b")
    batch = {"x": torch.ones(2), "pair": Pair(torch.zeros(1), "label"), "list": [torch.ones(1), 3],
             "tuple": (torch.ones(1),)}
    moved = train.to_device(batch, "meta")
    assert moved["x"].device.type == "meta"
    assert isinstance(moved["pair"], Pair) and moved["pair"].a.device.type == "meta" and moved["pair"].b == "label"
    assert isinstance(moved["list"], list) and moved["list"][0].device.type == "meta" and moved["list"][1] == 3
    assert isinstance(moved["tuple"], tuple) and moved["tuple"][0].device.type == "meta"
    assert batch["x"].device.type == "cpu"  # the input is not modified


def test_progress_choice(monkeypatch):
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    assert show_bar(False) is False
    assert show_bar(True) is True
    monkeypatch.setenv("COURSE_PROGRESS", "0")
    assert show_bar(True) is False
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    assert show_bar(None) is True
    monkeypatch.delenv("COURSE_PROGRESS")
    assert show_bar(None) is False  # pytest captures stdout: not a terminal, not a kernel


def test_text_log_lines_when_no_bar(capsys):
    ds = regression_data(n=32)
    model = make_model()
    train.fit(model, train.make_loader(ds, 8), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
              step_fn=mse_step, epochs=2, log_every=3, progress=False)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["3/8", "6/8"]
    assert "train_loss" in lines[0]


def _fit_kwargs(**over):
    model = make_model()
    kw = dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step_fn=mse_step, progress=False)
    kw.update(over)
    return model, kw


@pytest.mark.parametrize("over,exc,match", [
    (dict(epochs=0), ValueError, "epochs"),
    (dict(epochs=None), ValueError, "max_steps"),
    (dict(max_steps=-1), ValueError, "max_steps"),
    (dict(clip_grad=0), ValueError, "clip_grad"),
    (dict(clip_grad=float("inf")), ValueError, "clip_grad"),
    (dict(eval_every=2), ValueError, "eval_fn"),
    (dict(resume=True), ValueError, "checkpoint"),
    (dict(checkpoint_every=3), ValueError, "checkpoint"),
    (dict(log_every=0), ValueError, "log_every"),
    (dict(optimizer="adam"), TypeError, "optimizer"),
    (dict(step_fn=lambda m, b: 1.0), TypeError, "step_fn must return"),
    (dict(step_fn=lambda m, b: (1.0, {})), TypeError, "scalar loss"),
    (dict(step_fn=lambda m, b: (mse_step(m, b)[0].detach(), {})), ValueError, "require grad"),
    (dict(step_fn=lambda m, b: (mse_step(m, b)[0], {"lr": 1.0})), ValueError, "reserves"),
    (dict(progress="yes"), TypeError, "progress"),
])
def test_fit_rejects_bad_arguments(over, exc, match):
    model, kw = _fit_kwargs(**over)
    with pytest.raises(exc, match=match):
        train.fit(model, train.make_loader(regression_data(n=16), 8), **kw)


def test_fit_rejects_one_shot_iterators():
    model, kw = _fit_kwargs()
    with pytest.raises(TypeError, match="one-shot"):
        train.fit(model, iter(train.make_loader(regression_data(n=16), 8)), **kw)


@pytest.mark.parametrize("call,match", [
    (lambda: train.transformer_lr(0, 512, 4000), "step"),
    (lambda: train.transformer_lr(1, 512, 0), "warmup_steps"),
    (lambda: train.transformer_lr(1, 0, 10), "d_model"),
    (lambda: train.transformer_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 512, 0),
     "warmup_steps"),
    (lambda: train.warmup_cosine(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 10, 10),
     "total_steps"),
    (lambda: train.warmup_cosine(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 1, 10, 1.5),
     "min_ratio"),
    (lambda: train.make_loader(regression_data(n=8), 0), "batch_size"),
])
def test_schedules_and_loader_reject_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_progress_bar_path_gives_the_same_history(capsys):
    def run(progress):
        model = make_model(dropout=0.0)
        torch.manual_seed(0)
        return train.fit(model, train.make_loader(regression_data(n=32), 8), progress=progress, log_every=2,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.01), step_fn=mse_step, epochs=2,
                         eval_fn=lambda m: {"one": 1.0})

    quiet = run(False)
    capsys.readouterr()
    with_bar = run(True)
    out = capsys.readouterr()
    assert "train: 100%" in out.err and "8/8" in out.err  # the tqdm bar, on stderr
    assert "eval  step 4" in out.out                     # eval lines written above the bar
    assert with_bar.records == quiet.records


# ---------------------------------------------------------------------------- LengthBucketSampler

BUCKET_LENGTHS = [(i * 7) % 23 + 1 for i in range(1000)]


@pytest.mark.parametrize("kw", [dict(), dict(rng="numpy"), dict(generator=torch.Generator().manual_seed(5))])
def test_bucket_sampler_gives_every_index_once_in_batches_of_similar_length(kw):
    sampler = train.LengthBucketSampler(BUCKET_LENGTHS, batch_size=32, seed=3, window=5, **kw)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == math.ceil(1000 / 32)
        assert sorted(i for b in batches for i in b) == list(range(1000))
        assert all(1 <= len(b) <= 32 for b in batches) and sum(len(b) < 32 for b in batches) <= 1000 // (32 * 5) + 1
        spread = np.mean([max(BUCKET_LENGTHS[i] for i in b) - min(BUCKET_LENGTHS[i] for i in b) for b in batches])
        rand = np.random.default_rng(0).permutation(1000)
        random_spread = np.mean([np.ptp(np.asarray(BUCKET_LENGTHS)[rand[k:k + 32]]) for k in range(0, 1000, 32)])
        assert spread < random_spread / 4


def test_bucket_sampler_with_one_window_cuts_the_sorted_order():
    lengths = [5, 1, 4, 1, 3, 9, 2, 2]
    batches = list(train.LengthBucketSampler(lengths, batch_size=3, window=10, seed=1))
    ranges = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))
    assert sorted(len(b) for b in batches) == [2, 3, 3]


@pytest.mark.parametrize("rng", ["torch", "numpy"])
def test_bucket_sampler_order_is_a_function_of_seed_and_epoch(rng):
    def batches(seed, epoch):
        s = train.LengthBucketSampler(BUCKET_LENGTHS, batch_size=16, seed=seed, rng=rng)
        s.set_epoch(epoch)
        return list(s)

    first = batches(0, 0)
    assert first == batches(0, 0)                         # a fresh sampler: the same batches
    assert first != batches(0, 1) and first != batches(1, 0)
    s = train.LengthBucketSampler(BUCKET_LENGTHS, batch_size=16, seed=0, rng=rng)
    assert list(s) == list(s) == first                    # iterating again does not move on


def test_bucket_sampler_generator_is_reseeded_by_fit():
    sampler = train.LengthBucketSampler(BUCKET_LENGTHS, batch_size=16, generator=torch.Generator())
    loader = torch.utils.data.DataLoader(list(range(1000)), batch_sampler=sampler)
    start_epoch(loader, seed=7, epoch=0)
    a = list(sampler)
    assert list(sampler) != a                             # the caller's generator moves on ...
    start_epoch(loader, seed=7, epoch=0)
    assert list(sampler) == a                             # ... and fit re-seeds it from (seed, epoch)
    start_epoch(loader, seed=7, epoch=1)
    assert list(sampler) != a


@pytest.mark.parametrize("args, kw, exc, match", [
    ((BUCKET_LENGTHS, 0), {}, ValueError, "batch_size must be >= 1"),
    ((BUCKET_LENGTHS, 2.0), {}, TypeError, "batch_size must be an int"),
    (("abc", 2), {}, TypeError, "lengths must be a sequence of ints"),
    (([], 2), {}, ValueError, "lengths is empty"),
    (([3, -1], 2), {}, ValueError, r"lengths\[1\] must be >= 0"),
    ((BUCKET_LENGTHS, 2), dict(window=0), ValueError, "window"),
    ((BUCKET_LENGTHS, 2), dict(seed=-1), ValueError, "seed"),
    ((BUCKET_LENGTHS, 2), dict(rng="python"), ValueError, "rng must be one of 'torch', 'numpy'"),
    ((BUCKET_LENGTHS, 2), dict(generator=3), TypeError, "generator must be a torch.Generator"),
])
def test_bucket_sampler_rejects_bad_arguments(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        train.LengthBucketSampler(*args, **kw)


def test_summary_progress_prints_one_line_and_keeps_the_history(capsys):
    ds = regression_data(n=32)
    model = make_model()
    hist = train.fit(model, train.make_loader(ds, 8), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                     step_fn=mse_step, epochs=2, log_every=3, progress="summary",
                     eval_fn=lambda m: {"loss": 1.0}, eval_every=4)
    out = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(out) == 1 and out[0].startswith("trained 8 steps (2 epochs complete)"), out
    assert "train_loss" in out[0] and "eval_loss" in out[0]
    assert {3, 6} <= set(hist.series("train_loss")[0])    # the history still has every log
    with pytest.raises(TypeError, match="'summary'"):
        train.fit(model, train.make_loader(ds, 8), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                  step_fn=mse_step, epochs=1, progress="quiet")


class CarriedStep:
    """A step that carries state to the next, as Transformer-XL's memory does: the loss adds the
    previous batch's (detached) mean output, so a resume that lost the state trains otherwise."""

    def __init__(self, crash_at=None):
        self.memory, self.count, self.crash_at = None, 0, crash_at

    def __call__(self, model, batch):
        self.count += 1
        if self.count == self.crash_at:
            raise Crash
        x, y = batch
        out = model(x)
        loss = nn.functional.mse_loss(out + (0 if self.memory is None else self.memory), y)
        self.memory = out.detach().mean()
        return loss, {}

    def state_dict(self):
        return {"memory": self.memory}

    def load_state_dict(self, state):
        self.memory = state["memory"]


def _carried_run(ckpt, step, resume=False):
    model = make_model(seed=1, dropout=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = train.make_loader(regression_data(), 16, shuffle=True, seed=5)
    hist = train.fit(model, loader, optimizer=opt, step_fn=step, epochs=2, log_every=1, checkpoint=ckpt,
                     checkpoint_every=4, resume=resume, progress=False)
    return model, hist


def test_a_stateful_step_resumes_from_its_saved_state(tmp_path):
    ref_model, ref_hist = _carried_run(tmp_path / "ref.pt", CarriedStep())
    with pytest.raises(Crash):
        _carried_run(tmp_path / "run.pt", CarriedStep(crash_at=11))
    saved = train.load_checkpoint(tmp_path / "run.pt", make_model(dropout=0.0))
    assert saved["step"] == 8 and saved["extra"]["step_state"]["memory"] is not None
    model, hist = _carried_run(tmp_path / "run.pt", CarriedStep(), resume=True)     # a new process: no memory
    assert hist.records == ref_hist.records
    assert all(torch.equal(a, b) for a, b in zip(ref_model.parameters(), model.parameters()))
    # a checkpoint written by a step without state cannot resume a stateful one
    _carried_run(tmp_path / "plain.pt", lambda m, b: mse_step(m, b))
    with pytest.raises(train.CheckpointError, match="holds no state of the step function"):
        _carried_run(tmp_path / "plain.pt", CarriedStep(), resume=True)
