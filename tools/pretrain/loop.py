"""The run: the training data and model of a recipe (any family), the run's fixed settings (``Run``)
and the one loop (``train_run``): chunks of ``lib.train.fit`` between evaluations and snapshots,
each resuming from the last checkpoint in the scratch folder."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from lib import checkpoints, device, train
from lib.train.checkpoint import read_checkpoint
from tools.pretrain import card, characters, reviews, tasks, translation
from tools.pretrain.card import _read_json, _write_json, git_commit
from tools.pretrain.corpora import STEP_FNS, heldout_batches, make_dataset, prepare
from tools.pretrain.evaluation import ENCODER_DECODER_KINDS, heldout_loss
from tools.pretrain.recipes import OPTIMIZERS, Recipe, token_label


def build_training(recipe: Recipe, data_folder: Path) -> tuple:
    """From the prepared data: (tokenizer, the training loader, the fixed held-out batches, the model
    initialised from the recipe's seed)."""
    if recipe.kind == tasks.KIND:
        return tasks.build_training(recipe, data_folder)
    if recipe.unit == "pairs":
        return translation.build_training(recipe, data_folder)
    if recipe.unit == "reviews":
        return reviews.build_training(recipe, data_folder)
    if recipe.tokenizer == "characters":
        return characters.build_training(recipe, data_folder)
    from lib.text import SubwordTokenizer, WordVocab
    tok = (WordVocab if recipe.tokenizer == "words" else SubwordTokenizer).load(data_folder / "tokenizer.json")
    streams = torch.load(data_folder / "streams.pt", weights_only=True)
    dataset = make_dataset(recipe, streams, "train", tok, recipe.seed)
    heldout = heldout_batches(recipe, streams, tok)
    sampler = train.GlobalBatchSampler(len(dataset), recipe.batch_size, recipe.seed, tag_epoch=True)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(recipe.kind, recipe.model_config(tok.vocab_size))
    return tok, loader, heldout, model


@dataclass
class Run:
    """A run's fixed settings (``run.json`` in the scratch folder) and where its files go."""
    recipe: Recipe
    tokens: int
    snapshots: list[int]
    scratch: Path
    out: Path
    command: str
    dev: torch.device = torch.device("cpu")
    provenance: dict | None = None  # git_commit() when the command started (the code that runs)
    steps: int = field(init=False)

    def __post_init__(self):
        self.steps = math.ceil(self.tokens / self.recipe.tokens_per_step)

    @property
    def settings(self) -> dict:
        """As ``run.json`` holds them (JSON: a recipe's tuples read back as lists), so a resumed run compares equal."""
        return json.loads(json.dumps({"recipe": dataclasses.asdict(self.recipe), "tokens": self.tokens,
                                      "snapshots": self.snapshots, "steps": self.steps}))

    def snapshot_steps(self) -> dict[int, int]:
        return {math.ceil(t / self.recipe.tokens_per_step): t for t in self.snapshots if t < self.tokens}

    def boundaries(self, eval_every: int) -> list[int]:
        return sorted(set(range(eval_every, self.steps, eval_every)) | set(self.snapshot_steps()) | {self.steps})


def canonical_command(recipe_name: str, tokens: int, snapshots: list[int], sets: list[str]) -> str:
    parts = ["python", "-m", "tools.pretrain", recipe_name, "--tokens", token_label(tokens)]
    if snapshots:
        parts += ["--snapshots", ",".join(token_label(t) for t in snapshots)]
    for s in sets:
        parts += ["--set", s]
    return shlex.join(parts)


def _barrier() -> None:
    if device.world_size() > 1:
        torch.distributed.barrier()


def _agree(flag: bool) -> bool:
    """Rank 0's answer, in every process (so that all stop together)."""
    if device.world_size() == 1:
        return flag
    t = torch.tensor([int(flag)])
    torch.distributed.broadcast(t, src=0)
    return bool(t.item())


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


BEST_FILE = "best.pt"


def _keep_if_best(run: Run, model, history, step: int) -> None:
    """``keep_best``: when the evaluation at ``step`` is the lowest held-out (validation) loss so far (the
    history holds every earlier one), its weights go to ``best.pt`` in the scratch folder (written to a
    temporary file, then renamed)."""
    from lib.io import atomic_write
    evals = [r for r in history.records if "eval_loss" in r and r.get("step", step + 1) <= step]
    record = next((r for r in reversed(evals) if r["step"] == step), None)
    if record is None:
        return
    if all(record["eval_loss"] < r["eval_loss"] for r in evals if r["step"] < step):
        with atomic_write(run.scratch / BEST_FILE, "wb") as fh:
            torch.save({"step": step, "loss": record["eval_loss"],
                        "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}, fh)


def _restore_best(run: Run, model) -> dict:
    """Load the kept weights into ``model``; returns their step and held-out loss."""
    best = torch.load(run.scratch / BEST_FILE, weights_only=True)
    model.load_state_dict(best["model"])
    return {"step": int(best["step"]), "heldout_loss": float(best["loss"])}


def train_run(run: Run, minutes: float | None, say: Callable[[str], None] = print) -> dict | None:
    """Train (resuming from the scratch checkpoint) until the schedule ends or ``minutes`` are spent.
    Returns the final state (model, history, ...) when the schedule ended, None when stopped early."""
    recipe = run.recipe
    rank, world = device.rank(), device.world_size()
    dev = run.dev
    state_file, clock_file = run.scratch / "state.pt", run.scratch / "clock.json"
    if rank == 0:
        saved = _read_json(run.scratch / "run.json", None)
        if saved is not None and saved != run.settings:
            diff = [k for k in run.settings if saved.get(k) != run.settings[k]]
            raise SystemExit(f"{run.scratch} holds a run with other settings ({', '.join(diff)} differ): run the "
                             "same command to resume it, or add --fresh to start over")
        run.scratch.mkdir(parents=True, exist_ok=True)
        _write_json(run.scratch / "run.json", run.settings)
        meta = prepare(recipe, run.scratch / "data")
    _barrier()
    meta = json.loads((run.scratch / "data" / "data.json").read_text())
    tok, loader, heldout, model = build_training(recipe, run.scratch / "data")
    params = characters.parameter_groups(recipe, model) if recipe.tokenizer == "characters" else model.parameters()
    optimizer = OPTIMIZERS[recipe.optimizer](params, recipe.lr, recipe.weight_decay)
    warmup = max(1, round(recipe.warmup * run.steps))
    scheduler = (train.warmup_cosine(optimizer, warmup_steps=warmup, total_steps=max(run.steps, 2),
                                     min_ratio=recipe.min_lr_ratio) if recipe.schedule == "cosine" else
                 torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0) if recipe.schedule == "constant" else
                 train.transformer_schedule(optimizer, d_model=model.cfg.d_model, warmup_steps=warmup))
    eval_every = max(1, round(recipe.eval_every_tokens / recipe.tokens_per_step))
    log_every = max(1, round(recipe.log_every_tokens / recipe.tokens_per_step))
    done = read_checkpoint(state_file)["step"] if state_file.is_file() else 0
    if done:
        say(f"resuming {recipe.name} from {state_file} at step {done:,} ({done * recipe.tokens_per_step:,} {recipe.unit})")
    clock = _read_json(clock_file, {"seconds": 0.0, "invocations": []})
    clock["invocations"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 "from_step": done, "to_step": done, "seconds": 0.0,
                                 "device": device.summary(dev, recipe=False), "world_size": world,
                                 **(run.provenance or git_commit())})
    started = time.perf_counter()
    snapshot_steps = run.snapshot_steps()
    history = None
    step_fn = (tasks.step if recipe.kind == tasks.KIND else translation.step_fn(recipe) if recipe.unit == "pairs" else
               reviews.step if recipe.unit == "reviews" else
               characters.step_fn(recipe) if recipe.tokenizer == "characters" else STEP_FNS[recipe.kind])

    def evaluate(m):
        out = {"loss": heldout_loss(m, heldout, recipe.kind)}
        if recipe.kind in ENCODER_DECODER_KINDS:     # does the decoder read its input? (lower is: yes)
            out["loss_other_input"] = heldout_loss(m, heldout, recipe.kind, other_input=True)
        return out

    if recipe.keep_best and done and rank == 0:     # stopped between the state and the kept weights: keep now
        _keep_if_best(run, model, train.load_checkpoint(state_file, model)["history"], done)
    if done in snapshot_steps and rank == 0 and f"{recipe.name}@{token_label(snapshot_steps[done])}" not in \
            checkpoints.registry(run.out):    # stopped between the checkpoint and the snapshot: write it now
        train.load_checkpoint(state_file, model)
        card.write_snapshot(run, model, heldout, done, snapshot_steps[done], meta, say)
    for boundary in run.boundaries(eval_every):
        if boundary <= done:
            continue
        chunk_start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):    # fit's "resumed from ..." line, once per chunk
            history = train.fit(model, loader, optimizer=optimizer, scheduler=scheduler, step_fn=step_fn,
                                epochs=None, max_steps=boundary, eval_fn=evaluate, eval_every=eval_every, device=dev,
                                clip_grad=recipe.clip_grad,
                                checkpoint=state_file, resume=True, progress=False, log_every=log_every,
                                seed=recipe.seed)
        seconds = time.perf_counter() - chunk_start
        if rank == 0:
            clock["seconds"] += seconds
            clock["invocations"][-1].update(to_step=boundary, seconds=round(time.perf_counter() - started, 1))
            _write_json(clock_file, clock)
        rate = (boundary - done) * recipe.tokens_per_step / seconds
        last = next(r for r in reversed(history.records) if "eval_loss" in r)
        eta = (run.steps - boundary) * recipe.tokens_per_step / rate
        say(f"{recipe.name} step {boundary:,}/{run.steps:,} | {recipe.unit} {token_label(boundary * recipe.tokens_per_step)}"
            f"/{token_label(run.tokens)} | train {last.get('train_loss', float('nan')):.3f} | held-out "
            f"{last.get('eval_loss', float('nan')):.3f}"
            + (f" (after another input {last['eval_loss_other_input']:.3f})" if "eval_loss_other_input" in last else "")
            + f" | {rate:,.0f} {recipe.unit}/s | {_fmt_time(clock['seconds'])} "
            f"trained, about {_fmt_time(eta)} to go")
        done = boundary
        if recipe.keep_best and rank == 0:
            _keep_if_best(run, model, history, boundary)
        if boundary in snapshot_steps and rank == 0:
            card.write_snapshot(run, model, heldout, boundary, snapshot_steps[boundary], meta, say)
        _barrier()
        if _agree(minutes is not None and time.perf_counter() - started >= minutes * 60) and done < run.steps:
            say(f"stopped after {minutes:g} minutes at step {done:,} of {run.steps:,} (checkpoint {state_file}): "
                "run the same command again to continue from there")
            return None
    if history is None:          # the schedule had ended before this invocation: the model it left
        history = train.load_checkpoint(state_file, model)["history"]
        if history.records[-1].get("step") != run.steps or "eval_loss" not in history.records[-1]:
            history.records.append({"step": run.steps, **{f"eval_{k}": v for k, v in evaluate(model).items()}})
    kept = _restore_best(run, model) if recipe.keep_best else None
    if kept is not None:
        say(f"{recipe.name}: keeps the weights of step {kept['step']:,} (the lowest held-out loss, "
            f"{kept['heldout_loss']:.4f})")
    return {"model": model, "history": history, "heldout": heldout, "meta": meta, "clock": clock,
            "tokenizer": tok, "eval_every": eval_every, "kept": kept}
