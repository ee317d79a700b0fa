"""What a run writes: weights, vocabularies, the card (JSON and Markdown), snapshots, the registry
entries, and the provenance (commit) they record."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lib import checkpoints, device
from lib.io import atomic_write, sha256 as file_sha256
from tools.pretrain import translation
from tools.pretrain.evaluation import DTYPE_TOLERANCE, DTYPES, rounded_losses, storage_dtype
from tools.pretrain.recipes import token_label

if TYPE_CHECKING:
    from tools.pretrain.loop import Run


def _read_json(file: Path, default):
    return json.loads(file.read_text()) if file.is_file() else default


def _write_json(file: Path, payload) -> None:
    with atomic_write(file, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, ensure_ascii=False)
        f.write("\n")


def _copy_tokenizer(run: Run, file: str = "tokenizer.json") -> str:
    """Put a vocabulary file of the prepared data beside the checkpoint (unless it is there already);
    its path relative to the output folder."""
    relative = f"{run.recipe.name}/{file}"
    src, dst = run.scratch / "data" / file, run.out / relative
    if not dst.is_file() or file_sha256(dst) != file_sha256(src):
        with atomic_write(dst, "wb") as f:
            f.write(src.read_bytes())
    return relative


def _tokenizer_files(run: Run) -> dict:
    """The registry entries of a checkpoint's vocabularies: its tokenizer, and a translation model's target side.
    A run that started from a checkpoint registered in the same folder (``init_from``) with the same tokenizer
    file registers that file, not a copy."""
    source = checkpoints.registry(run.out).get(run.recipe.init_from) if run.recipe.init_from else None
    if source is not None and "tokenizer" in source.files and \
            source.files["tokenizer"].sha256 == file_sha256(run.scratch / "data" / "tokenizer.json"):
        return {"tokenizer": source.files["tokenizer"]}
    files = {"tokenizer": checkpoints.file_entry(run.out, _copy_tokenizer(run))}
    if (run.scratch / "data" / translation.TARGET_TOKENIZER).is_file():
        files["target_tokenizer"] = checkpoints.file_entry(run.out, _copy_tokenizer(run, translation.TARGET_TOKENIZER))
    return files


def _weights_metadata(run: Run, model, tokens: int, step: int, losses: dict, dtype: str) -> dict:
    return {"name": run.recipe.name, "kind": run.recipe.kind, "config": checkpoints.config_dict(model.cfg),
            "tokens_seen": tokens, "steps": step, "heldout_loss": losses, "stored_dtype": dtype}


def check_budget(run: Run, model, dtype: str, extra: int = 100_000) -> None:
    """Refuse before writing anything when the output would break the folder's size budget."""
    if run.out != checkpoints.CHECKPOINT_DIR.resolve():
        return
    others = {k: v for k, v in checkpoints.registry(run.out).items() if k.split("@")[0] != run.recipe.name}
    weights = checkpoints.stored_bytes(model, DTYPES[dtype])
    planned = checkpoints.total_size(others) + weights * (1 + len(run.snapshot_steps())) + extra
    if planned > checkpoints.BUDGET_BYTES:
        raise SystemExit(f"{run.recipe.name} would bring {run.out} to about {planned / 1e6:.0f} MB, over its budget "
                         f"of {checkpoints.BUDGET_BYTES / 1e6:.0f} MB: fewer snapshots, or --out elsewhere")


def write_snapshot(run: Run, model, heldout, step: int, tokens: int, meta: dict, say) -> None:
    losses = rounded_losses(model, heldout, run.recipe.kind)
    dtype = storage_dtype(losses)
    check_budget(run, model, dtype)
    name = f"{run.recipe.name}@{token_label(tokens)}"
    relative = f"{run.recipe.name}/snapshots/{run.recipe.name}-{token_label(tokens)}.safetensors"
    checkpoints.save_weights(model, run.out / relative, DTYPES[dtype],
                             _weights_metadata(run, model, step * run.recipe.tokens_per_step, step, losses, dtype))
    files = {"weights": checkpoints.file_entry(run.out, relative), **_tokenizer_files(run)}
    checkpoints.register(checkpoints.CheckpointInfo(
        name=name, kind=run.recipe.kind, config=checkpoints.config_dict(model.cfg), files=files,
        command=run.command, description=f"{run.recipe.description}: snapshot after {token_label(tokens)} tokens"),
        run.out)
    say(f"snapshot {name}: {run.out / relative} ({dtype}, held-out loss {losses['float32']:.4f})")


def git_commit() -> dict:
    """The commit the code runs from, and whether tracked code has uncommitted changes (besides the
    results and the checkpoints, which runs write themselves: a snapshot registered by this run is not
    a change to the code that trains it)."""
    from lib.results import _provenance
    commit, dirty = _provenance(exclude=("results", "checkpoints"))
    return {"commit": commit, "uncommitted_changes": dirty}


def code_version(invocations: list[dict]) -> dict:
    """The code a run trained with, from its invocations (each records the commit it started from):
    ``commit`` the first one's, ``uncommitted_changes`` whether any had changes, and ``commits`` every
    commit when the invocations ran from different ones."""
    commits = list(dict.fromkeys(i["commit"] for i in invocations))
    out = {"commit": commits[0], "uncommitted_changes": any(i["uncommitted_changes"] for i in invocations)}
    return {**out, "commits": commits} if len(commits) > 1 else out


def write_output(run: Run, result: dict, say: Callable[[str], None] = print) -> dict:
    """Weights, tokenizer, card (JSON and Markdown), then the registry entry; returns the card."""
    recipe, model, meta = run.recipe, result["model"], result["meta"]
    folder = run.out / recipe.name
    losses = rounded_losses(model, result["heldout"], recipe.kind)
    dtype = storage_dtype(losses)
    tokens_seen = run.steps * recipe.tokens_per_step
    kept = result.get("kept")          # keep_best: the weights of the evaluation with the lowest held-out loss
    kept_step = kept["step"] if kept else run.steps
    check_budget(run, model, dtype)
    weights = f"{recipe.name}/model.safetensors"
    checkpoints.save_weights(model, run.out / weights, DTYPES[dtype],
                             _weights_metadata(run, model, kept_step * recipe.tokens_per_step, kept_step, losses,
                                               dtype))
    records = result["history"].records
    curve = [{"step": r["step"], "tokens": r["step"] * recipe.tokens_per_step,
              "train_loss": round(r["train_loss"], 4) if "train_loss" in r else None,
              "heldout_loss": round(r["eval_loss"], 4),
              **({"heldout_loss_other_input": round(r["eval_loss_other_input"], 4)}
                 if "eval_loss_other_input" in r else {})} for r in records if "eval_loss" in r]
    clock = result["clock"]
    card = {
        "name": recipe.name, "description": recipe.description, "kind": recipe.kind,
        "command": run.command, **code_version(clock["invocations"]),
        "data": {"datasets": meta["datasets"], "corpus": recipe.corpus, "corpus_sha256": meta["corpus_sha256"],
                 "documents": meta["documents"], "heldout_documents": meta["heldout_documents"],
                 "train_tokens": meta["train_tokens"], "heldout_tokens": meta["heldout_tokens"],
                 "counts": meta["counts"], "passes": round(tokens_seen / meta["train_tokens"], 3),
                 **({"heldout_rule": meta["heldout_rule"]} if "heldout_rule" in meta else {}),
                 **({"init_from": meta["init_from"]} if "init_from" in meta else {})},
        "tokenizer": {"kind": recipe.tokenizer, "vocab_size": meta["vocab_size"], "lowercase": recipe.lowercase,
                      "file": "tokenizer.json", "sha256": meta["tokenizer_sha256"],
                      **({"target_vocab_size": meta["target_vocab_size"], "target_file": translation.TARGET_TOKENIZER,
                          "target_sha256": meta["target_tokenizer_sha256"]} if "target_vocab_size" in meta else {})},
        "model": {"config": checkpoints.config_dict(model.cfg), "parameters": model.num_parameters()},
        "training": {"tokens_seen": tokens_seen, "tokens_target": run.tokens, "unit": recipe.unit, "steps": run.steps,
                     "global_batch": recipe.batch_size, "seq_len": recipe.seq_len,
                     "optimizer": recipe.optimizer, "lr": recipe.lr,
                     "schedule": (f"linear warm-up over {recipe.warmup:.0%} of the steps, cosine to "
                                  f"{recipe.min_lr_ratio:g} x lr" if recipe.schedule == "cosine" else
                                  "constant (Adafactor's relative step: min(lr, 1/sqrt(step)))"
                                  if recipe.schedule == "constant" and recipe.optimizer == "adafactor" else
                                  "constant" if recipe.schedule == "constant" else
                                  f"the Transformer's: warm-up over {recipe.warmup:.0%} of the steps, then 1/sqrt(step), "
                                  f"x d_model^-0.5 x {recipe.lr:g}"),
                     "label_smoothing": recipe.label_smoothing, "weight_decay": recipe.weight_decay,
                     **({"kept": {"step": kept["step"], "tokens": kept["step"] * recipe.tokens_per_step,
                                  "heldout_loss": round(kept["heldout_loss"], 4),
                                  "rule": "the evaluation with the lowest held-out loss"}} if kept else {}),
                     "wall_seconds": round(clock["seconds"], 1), "prepare_seconds": meta["seconds"],
                     "invocations": clock["invocations"],
                     "device": clock["invocations"][-1]["device"], "precision": device.precision(run.dev, model).name,
                     "recipe": dataclasses.asdict(recipe)},
        "heldout": {"loss": losses["float32"], "by_stored_dtype": losses, "stored_dtype": dtype,
                    "tolerance_nats": DTYPE_TOLERANCE, "curve": curve},
        "snapshots": [f"{recipe.name}@{token_label(t)}" for t in run.snapshots if t < run.tokens],
    }
    _write_json(folder / "card.json", card)
    with atomic_write(folder / "card.md", "w", encoding="utf-8") as f:
        f.write(card_markdown(card))
    files = {"weights": checkpoints.file_entry(run.out, weights), **_tokenizer_files(run),
             "card": checkpoints.file_entry(run.out, f"{recipe.name}/card.json"),
             "card_md": checkpoints.file_entry(run.out, f"{recipe.name}/card.md")}
    checkpoints.register(checkpoints.CheckpointInfo(name=recipe.name, kind=recipe.kind,
                                                    config=checkpoints.config_dict(model.cfg), files=files,
                                                    command=run.command, description=recipe.description), run.out)
    say(f"wrote {folder}: {dtype} weights ({files['weights'].size / 1e6:.1f} MB), held-out loss "
        f"{losses['float32']:.4f} (float32) / {losses[dtype]:.4f} ({dtype}); registered in {run.out / 'registry.json'}")
    return card


def counts_text(counts: dict) -> str:
    """A corpus's counts in words: ``documents 5,410, nsmc (rows 712,404, ...)``, nested ones in brackets."""
    return ", ".join(f"{k.replace('_', ' ')} ({counts_text(v)})" if isinstance(v, dict) else f"{k.replace('_', ' ')} {v:,}"
                     for k, v in counts.items())


#: what a held-out loss is per, by the budget's unit
HELDOUT_UNIT = {"tokens": "token", "pairs": "target word", "reviews": "review"}


def card_markdown(card: dict) -> str:
    t, h, d = card["training"], card["heldout"], card["data"]
    unit = t.get("unit", "tokens")          # what the budget counts: tokens, or pairs for a translation model
    per_step = f"{t['global_batch']} {unit}" if unit in ("pairs", "reviews") else f"{t['global_batch']} x {t['seq_len']} tokens"
    vocab = (f"words, {card['tokenizer']['vocab_size']:,} English and {card['tokenizer']['target_vocab_size']:,} "
             f"French entries (`tokenizer.json` and `{card['tokenizer']['target_file']}`, shipped with the weights)"
             if "target_vocab_size" in card["tokenizer"] else
             f"{card['tokenizer']['kind']}, {card['tokenizer']['vocab_size']:,} entries (`tokenizer.json`, shipped "
             "with the weights)")
    files = ", ".join(f"`{x['dataset']}/{x['file']}` (sha256 `{x['sha256'][:12]}…`)" for x in d["datasets"])
    lines = [f"# {card['name']}", "", card["description"] + ".", "",
             f"- **Model**: {card['kind']}, {card['model']['parameters']:,} parameters; configuration in `card.json`.",
             f"- **Data**: {files}; corpus `{d['corpus']}`: {d['documents']:,} documents (sha256 of the text "
             f"`{d['corpus_sha256'][:12]}…`), {d['train_tokens']:,} training {unit}, "
             + (d["heldout_rule"] if "heldout_rule" in d else
                f"every {t['recipe']['heldout_every']}th document held out" if unit == "tokens" else
                "the pairs of every held-out English sentence held out (lib.translation.is_held_out)")
             + f" ({d['heldout_tokens']:,} {unit}). Counts: " + counts_text(d["counts"]) + ".",
             f"- **Tokenizer**: {vocab}.",
             f"- **Training**: {t['tokens_seen']:,} {unit} ({d['passes']:g} passes), {t['steps']:,} steps of "
             f"{per_step}, {t.get('optimizer', 'adamw')} at lr {t['lr']:g} "
             f"({t['schedule']}), "
             f"{t['wall_seconds'] / 60:.1f} minutes of training in {len(t['invocations'])} invocation(s)."
             + (f" The weights are those of step {t['kept']['step']:,}, {t['kept']['rule']} "
                f"({t['kept']['heldout_loss']})." if "kept" in t else ""),
             *([f"- **Starts from**: `{d['init_from']['name']}`'s network and tokenizer"
                + (f", and its weights (sha256 `{d['init_from']['weights_sha256'][:12]}…`)."
                   if d["init_from"]["weights"] else ", from random weights.")] if "init_from" in d else []),
             f"- **Device**: {t['device']}; precision {t['precision']} (training), weights stored in "
             f"{h['stored_dtype']}.",
             f"- **Held-out loss**: {h['loss']:.4f} nats/{HELDOUT_UNIT.get(unit, 'token')} in float32; "
             "with the stored weights "
             + ", ".join(f"{k} {v:.4f}" for k, v in h["by_stored_dtype"].items())
             + f" (a dtype is used when within {h['tolerance_nats']:g} nats).",
             "- **Commit**: " + ", ".join(f"`{c}`" for c in card.get("commits", [card["commit"]]))
             + (" (with uncommitted changes)" if card["uncommitted_changes"] else ""),
             *([f"- **Stored again** ({card['restored']['date']}, `python -m tools.pretrain.restore`, commit "
                f"`{card['restored']['commit']}`): from {card['restored']['from']} to {card['restored']['to']}, held-out "
                f"loss {card['restored']['losses'][card['restored']['to']]:.4f}."] if "restored" in card else []),
             f"- **Rebuild**: `{card['command']}`", ""]
    # encoder-decoder kinds: the held-out targets also after another example's input (does it read it?)
    other = bool(h["curve"]) and all("heldout_loss_other_input" in c for c in h["curve"])
    lines += [f"| step | {unit} | train loss | held-out loss |" + (" after another input |" if other else ""),
              "|---:|---:|---:|---:|" + ("---:|" if other else "")]
    lines += [f"| {c['step']:,} | {c['tokens']:,} | {c['train_loss'] if c['train_loss'] is not None else '—'} | "
              f"{c['heldout_loss']} |" + (f" {c['heldout_loss_other_input']} |" if other else "") for c in h["curve"]]
    return "\n".join(lines) + "\n"
