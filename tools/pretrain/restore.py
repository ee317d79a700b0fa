"""Store registered checkpoints again, smaller, without training them again.

::

    python -m tools.pretrain.restore chatbot-ko s2s-attention-fra-eng   # each in the smallest dtype that holds
    python -m tools.pretrain.restore --share-tokenizers                 # one copy of each tokenizer file

``NAME ...``: the checkpoint's weights are read back (float32), its recipe's held-out batches are built
again, and the weights are rounded to every storage dtype (``evaluation.DTYPES``; int8 with a scale per
``lib.checkpoints.INT8_GROUP`` values). The smallest dtype whose held-out loss is within
``DTYPE_TOLERANCE`` of the card's float32 loss (measured when it was trained) is written, atomically,
with the card (``restored``: from which dtype, the losses, the commit) and the registry entry updated.
A checkpoint already in that dtype is left alone; a snapshot, or a recipe whose held-out data cannot be
rebuilt (ELMo), is refused with the reason. Every other family qualifies:

* sentence pairs (chapters 1, 3, 4, 10 and 11): the split and the shipped vocabularies;
* reviews (chapter 2): the validation share of the training reviews, encoded with the shipped
  tokenizer after the reviews' SHA-256 is checked;
* language models: the held-out documents (every ``heldout_every``-th of the corpus), encoded with the
  shipped tokenizer after the corpus's SHA-256 is checked (not ELMo's word streams);
* characters (chapters 5, 9 and 12): the vocabulary rebuilt from the text and checked against the
  shipped one, the validation windows drawn again.

``--share-tokenizers``: checkpoints that ship the same tokenizer file (the same SHA-256: the seeds of a
recipe, the arms trained on one dataset, a checkpoint and the one it started from) register one copy
and the others are deleted. Nothing a page reads changes: the same bytes, one copy.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lib import checkpoints, device
from lib.io import atomic_write, sha256 as file_sha256
from tools.pretrain import characters, corpora, reviews, tasks, translation
from tools.pretrain.card import _write_json, card_markdown, git_commit
from tools.pretrain.evaluation import DTYPE_TOLERANCE, DTYPES, rounded_losses
from tools.pretrain.recipes import RECIPES


def _heldout(name: str, root: Path) -> list:
    """The held-out batches of the recipe that trained checkpoint ``name``, rebuilt from its split and
    its shipped vocabularies."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise SystemExit(f"{name}: no recipe of that name, so its held-out data cannot be rebuilt")
    info = checkpoints.info(name, root)
    if recipe.unit == "reviews" or (recipe.unit != "pairs" and recipe.tokenizer != "characters"):
        from lib.text import load_vocabulary
        tok = load_vocabulary(checkpoints.path(name, "tokenizer", root))
        digest = json.loads((root / name / "card.json").read_text())["data"]["corpus_sha256"]
        if recipe.unit == "reviews":       # the validation share of the training reviews, encoded again
            return reviews.validation_batches(recipe, tok, digest)
        return corpora.rebuild_heldout(recipe, tok, digest)    # the held-out documents, encoded again
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if recipe.tokenizer == "characters":      # the vocabulary is the text's characters: rebuilt, then checked
            characters.prepare(recipe, folder, fingerprint={})
            if file_sha256(folder / "tokenizer.json") != info.files["tokenizer"].sha256:
                raise SystemExit(f"{name}: the characters of {recipe.corpus} give another vocabulary than the "
                                 "checkpoint's tokenizer.json: is this the data it was trained on?")
            return characters.build_training(recipe, folder)[2]
        shutil.copy(checkpoints.path(name, "tokenizer", root), folder / "tokenizer.json")
        if "target_tokenizer" in info.files:
            shutil.copy(checkpoints.path(name, "target_tokenizer", root), folder / translation.TARGET_TOKENIZER)
        if recipe.kind == tasks.KIND:
            return tasks.build_training(recipe, folder, init=False)[2]
        return translation.build_training(recipe, folder, init=False)[2]


def restore(name: str, root: Path, say=print) -> str:
    """Store checkpoint ``name`` in the smallest dtype that keeps its held-out loss; returns that dtype."""
    if "@" in name:
        raise SystemExit(f"{name}: a snapshot is stored with its run's dtype rule when it is taken, and recorded "
                         "curves name its hash; it is not re-stored")
    info = checkpoints.info(name, root)
    card_file = root / name / "card.json"
    card = json.loads(card_file.read_text())
    reference = card["heldout"]["by_stored_dtype"]["float32"]
    current = card["heldout"]["stored_dtype"]
    model = checkpoints.load(name, root=root).model.float()
    losses = rounded_losses(model, _heldout(name, root), info.kind)
    sizes = {d: checkpoints.stored_bytes(model, DTYPES[d]) for d in DTYPES}
    fits = [d for d in DTYPES if abs(losses[d] - reference) <= DTYPE_TOLERANCE]
    if not fits:
        raise SystemExit(f"{name}: no dtype keeps its held-out loss within {DTYPE_TOLERANCE} nats of the trained "
                         f"float32 weights' {reference:.4f} ({losses}): is this the recipe that trained it?")
    dtype = min(fits, key=lambda d: sizes[d])
    if sizes[dtype] >= sizes[current]:
        say(f"{name}: stays in {current} (held-out loss {losses[current]:.4f})")
        return current
    weights = root / info.files["weights"].path
    _, meta = checkpoints.read_weights(weights)
    meta.update(stored_dtype=dtype, heldout_loss={**meta.get("heldout_loss", {}), **losses})
    checkpoints.save_weights(model, weights, DTYPES[dtype], meta)
    card["heldout"].update(stored_dtype=dtype, by_stored_dtype={**card["heldout"]["by_stored_dtype"],
                                                                dtype: losses[dtype]})
    card["restored"] = {"from": current, "to": dtype, "losses": {d: round(v, 6) for d, v in losses.items()},
                        "date": time.strftime("%Y-%m-%d", time.gmtime()), **git_commit()}
    _write_json(card_file, card)
    with atomic_write(root / name / "card.md", "w", encoding="utf-8") as f:
        f.write(card_markdown(card))
    files = {**info.files, "weights": checkpoints.file_entry(root, info.files["weights"].path)}
    for key in ("card", "card_md"):
        if key in files:
            files[key] = checkpoints.file_entry(root, files[key].path)
    checkpoints.register(checkpoints.CheckpointInfo(name=info.name, kind=info.kind, config=info.config, files=files,
                                                    command=info.command, description=info.description), root)
    say(f"{name}: {current} -> {dtype} ({sizes[current] / 1e6:.1f} -> {files['weights'].size / 1e6:.1f} MB), held-out "
        f"loss {losses[dtype]:.4f} against {reference:.4f} trained")
    return dtype


def share_tokenizers(root: Path, say=print) -> int:
    """Register one file for every group of checkpoints that ship the same tokenizer (``tokenizer``,
    ``target_tokenizer``: the same SHA-256), and delete the other copies; returns the bytes saved.

    The seeds of a recipe, the arms of a comparison trained on the same data and a checkpoint that
    started from another (``init_from``) ship byte-identical vocabularies. The copy kept is the one
    most entries already name, then the shortest path (``bart-ko/`` before ``chatbot-bart/``, a recipe
    before its ``-seed1``)."""
    saved = 0
    registry = checkpoints.registry(root)
    groups: dict[str, set[str]] = {}
    for info in registry.values():
        for key, entry in info.files.items():
            if key not in ("weights", "card", "card_md"):
                groups.setdefault(entry.sha256, set()).add(entry.path)
    for digest, paths in groups.items():
        if len(paths) < 2:
            continue
        users = {p: sum(f.path == p for e in registry.values() for f in e.files.values()) for p in paths}
        kept = min(paths, key=lambda p: (-users[p], len(p), p))
        kept_entry = checkpoints.file_entry(root, kept)
        if kept_entry.sha256 != digest:
            raise SystemExit(f"{root / kept}: its SHA-256 is not the registry's (the folder changed since it "
                             "was registered): stopped before sharing it")
        for name, info in registry.items():
            moved = {k: kept_entry for k, f in info.files.items() if f.sha256 == digest and f.path != kept}
            if moved:
                registry[name] = info = checkpoints.CheckpointInfo(
                    name=info.name, kind=info.kind, config=info.config, files={**info.files, **moved},
                    command=info.command, description=info.description)
                checkpoints.register(info, root)
                say(f"{name}: {', '.join(moved)} -> {kept} (the same file)")
        for p in sorted(paths - {kept}):
            (root / p).unlink(missing_ok=True)
            saved += kept_entry.size
    return saved


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.pretrain.restore", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="registered checkpoints to store again in the smallest dtype that holds")
    ap.add_argument("--share-tokenizers", action="store_true",
                    help="one copy of every tokenizer file that several checkpoints ship")
    ap.add_argument("--root", type=Path, default=checkpoints.CHECKPOINT_DIR, help="the checkpoint folder")
    args = ap.parse_args(argv)
    if not args.names and not args.share_tokenizers:
        ap.error("name checkpoints to re-store, or --share-tokenizers")
    device.setup(seed=0)
    root = args.root.resolve()
    for name in args.names:
        restore(name, root)
    if args.share_tokenizers:
        print(f"{share_tokenizers(root) / 1e6:.2f} MB of duplicate tokenizers removed")
    print(f"{root}: {checkpoints.total_size(checkpoints.registry(root)) / 1e6:.1f} MB of "
          f"{checkpoints.BUDGET_BYTES / 1e6:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
