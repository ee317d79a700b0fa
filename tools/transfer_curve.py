#!/usr/bin/env python
"""The few-label learning curves of Part III: a pretrained model fine-tuned, the same network from
random weights, its frozen vectors and TF-IDF with logistic regression.

Three curves (``--curve``):

* ``imdb-minilm`` (the default): all-MiniLM-L6-v2 on IMDB, recorded in ``results/08_bert_transfer.json``;
* ``nsmc-ko-bert``: the course's own Korean BERT checkpoint (``python -m tools.pretrain ko-bert``) on
  the course's NSMC split, recorded in ``results/08_bert_nsmc.json``, with the *emergence* runs: the
  snapshots saved along its pretraining (``ko-bert@3M`` ...), fine-tuned at the recipe's
  ``emergence_sizes``, each with its learning rate chosen on the validation split;
* ``nsmc-ernie-ko`` (chapter 13): ``ernie-ko`` (ko-bert's twin pretrained with ERNIE's knowledge
  masking) and its snapshots on the same split, recorded in ``results/13_ernie_nsmc.json``;
* ``imdb-gpt`` (chapter 7): the course's GPT checkpoint (``python -m tools.pretrain gpt-imdb``) on
  IMDB with GPT-1's fine-tuning (the auxiliary language-model loss), recorded in
  ``results/07_gpt_imdb.json``.

Chapter 8 runs the CI recipe in the notebook. The full recipe (8 sizes x 3 draws x 3 learning rates
per arm, 10,000 test reviews) is sized for a GPU and is run with this script, which records it in
``results/08_bert_transfer.json``::

    python tools/transfer_curve.py all --mode full               # everything, one process
    # or in parallel processes (several fit on one GPU), then merge and record:
    python tools/transfer_curve.py trials --mode full --shard 0/4 --out _build/curve   # ... 1/4, 2/4, 3/4
    python tools/transfer_curve.py baselines --mode full --out _build/curve
    python tools/transfer_curve.py all-labels --mode full --out _build/curve
    python tools/transfer_curve.py merge --mode full --out _build/curve --record

On a machine without the course's data folder or the MiniLM package (a rented GPU), ``bundle``
writes what the run reads into one folder (the IMDB rows it uses and the MiniLM files, its weights
as float16 in an xz archive) and ``--bundle DIR`` reads it from there.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import lzma
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib import config, device, finetune, results  # noqa: E402
from lib.io import atomic_write  # noqa: E402

CURVES = {
    "imdb-minilm": dict(chapter="08_bert_transfer", task="imdb", model="minilm", recipe=finetune.imdb_curve_recipe),
    "nsmc-ko-bert": dict(chapter="08_bert_nsmc", task="nsmc", model="ko-bert", recipe=finetune.nsmc_curve_recipe),
    "imdb-gpt": dict(chapter="07_gpt_imdb", task="imdb", model="gpt-imdb", recipe=finetune.imdb_gpt_curve_recipe),
    # ko-bert's twin with ERNIE's knowledge masking (chapter 13): the same split, draws and grid as
    # nsmc-ko-bert, so its runs pair with ko-bert's seed by seed; its random-weight arm and baselines
    # would be ko-bert's exactly (same tokenizer and configuration), so they are not run twice
    "nsmc-ernie-ko": dict(chapter="13_ernie_nsmc", task="nsmc", model="ernie-ko", recipe=finetune.nsmc_curve_recipe),
}


def recipe(mode: str | None = None, curve: str = "imdb-minilm"):
    return CURVES[curve]["recipe"](mode)


# ----------------------------------------------------------------------------- data and weights

def load_rows(bundle: Path | None, hp, curve: str = "imdb-minilm"):
    """(training rows, test rows) of the curve's task: dicts with ``text`` and ``label``."""
    if curve in ("nsmc-ko-bert", "nsmc-ernie-ko"):
        from lib.data import nsmc
        split = nsmc.sentiment_split()
        return split.train, split.test
    if bundle is None or curve != "imdb-minilm":
        from lib import data
        return data.load_imdb("train"), data.load_imdb("test")
    file = bundle / "imdb_rows.json.gz"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: make the bundle with `python tools/transfer_curve.py bundle`")
    blob = json.loads(gzip.decompress(file.read_bytes()))
    if blob["test_size"] != hp.test_size:
        raise ValueError(f"the bundle holds {blob['test_size']} test reviews, the recipe wants {hp.test_size}")
    return blob["train"], blob["test"]


def load_encoder(bundle: Path | None, curve: str = "imdb-minilm", checkpoint: str | None = None):
    """(encoder, tokenizer) of the curve: MiniLM, or a course checkpoint (``checkpoint``, default the
    curve's model) with its shipped tokenizer (the ``tokenizers.Tokenizer`` inside it)."""
    if curve != "imdb-minilm":
        return finetune.checkpoint_encoder(checkpoint or CURVES[curve]["model"])
    return load_minilm(bundle)


def load_minilm(bundle: Path | None):
    """(encoder, tokenizer): from the package, or from a bundle's float16 weights."""
    from lib import minilm
    from lib.models import bert
    if bundle is None:
        return minilm.load_minilm(), minilm.minilm_tokenizer()
    import torch
    from safetensors.torch import load
    from tokenizers import Tokenizer
    folder = bundle / "minilm"
    cfg = bert.BertConfig.from_hf(json.loads((folder / "config.json").read_text()))
    model = bert.BertModel(cfg)
    state = {k: v.to(torch.float32) for k, v in load(lzma.decompress((folder / "model.fp16.safetensors.xz").read_bytes())).items()}
    bert.load_hf_bert(model, state)
    return model.eval(), Tokenizer.from_file(str(folder / "tokenizer.json"))


def make_bundle(out: Path, hp, xz_preset: int = 6) -> None:
    import torch
    from safetensors.torch import load_file, save
    from lib import data, minilm
    train_rows, test_rows = data.load_imdb("train"), data.load_imdb("test")
    test = finetune.balanced_sample(test_rows, hp.test_size, 12345) if hp.test_size < len(test_rows) else test_rows
    keep = ("text", "label")
    blob = {"train": [{k: r[k] for k in keep} for r in train_rows], "test": [{k: r[k] for k in keep} for r in test],
            "test_size": hp.test_size}
    (out / "minilm").mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "imdb_rows.json.gz", "wb") as f:
        f.write(gzip.compress(json.dumps(blob).encode(), 6))
    src = minilm.minilm_dir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(src / name, out / "minilm" / name)
    half = {k: v.to(torch.float16) for k, v in load_file(str(src / "model.safetensors")).items()}
    with atomic_write(out / "minilm" / "model.fp16.safetensors.xz", "wb") as f:
        f.write(lzma.compress(save(half), preset=xz_preset))


# ----------------------------------------------------------------------------- the runs

def curve_data(hp, bundle, tok, curve: str = "imdb-minilm"):
    return finetune.CurveData.from_recipe(hp, *load_rows(bundle, hp, curve), tok)


def all_trials(hp, curve: str = "imdb-minilm") -> list[dict]:
    """Every fine-tuning run of the curve: :func:`lib.finetune.curve_trials`, each with the
    ``checkpoint`` it starts from (None: the curve's model), then the emergence runs: every registered
    snapshot at ``hp.emergence_sizes``, seeds and the pretrained arm's learning rates."""
    trials = [{**t, "checkpoint": None} for t in finetune.curve_trials(hp.sizes, hp.seeds, hp.lrs)]
    sizes = getattr(hp, "emergence_sizes", None) or []
    if sizes:
        from lib import checkpoints
        for name in checkpoints.snapshots(CURVES[curve]["model"]):
            trials += [{**t, "checkpoint": name}
                       for t in finetune.curve_trials(sizes, hp.seeds, {"pretrained": hp.lrs["pretrained"]})]
    return trials


def _key(t: dict) -> tuple:
    return t.get("checkpoint"), t["init"], t["labels"], t["seed"], t["lr"]


def _wanted(t: dict, only: set[str] | None) -> bool:
    """Whether trial ``t`` is one of ``only``: its ``init`` (``random``, ``pretrained``: the curve's
    model) or the snapshot it starts from (``ko-bert@3M``); None: every trial."""
    if only is None:
        return True
    return (t["init"] in only and t.get("checkpoint") is None) or t.get("checkpoint") in only


def run_trials(hp, dev, bundle=None, shard=(0, 1), log=print, file: Path | None = None,
               curve: str = "imdb-minilm", only: set[str] | None = None) -> list[dict]:
    """The fine-tuning runs of shard ``i`` of ``k`` (round-robin over the list, largest first), or of
    those only that ``only`` names (see :func:`_wanted`). With ``file``, the runs already in it are
    kept and skipped, and the file is rewritten after every run: an interrupted shard continues
    where it stopped. A checkpoint is loaded when a run needs it, so the random-weight runs and a
    snapshot's runs can start while its pretraining is still going (every snapshot ships the same
    tokenizer and configuration)."""
    trials = [t for t in all_trials(hp, curve)[shard[0]::shard[1]] if _wanted(t, only)]
    out = json.loads(file.read_text()) if file is not None and file.is_file() else []
    done = {_key(r) for r in out}
    todo = [t for t in trials if _key(t) not in done]
    if not todo:
        return out
    if curve == "imdb-minilm":
        encoder, tok = load_encoder(bundle, curve)
        encoders = {None: encoder}
    else:
        from lib import checkpoints
        model = CURVES[curve]["model"]
        present = [n for n in (model, *checkpoints.snapshots(model)) if n in checkpoints.registry()]
        if not present:
            raise SystemExit(f"no checkpoint {model!r} or snapshot of it is registered: pretrain it first")
        encoders = {}
        first, tok = load_encoder(bundle, curve, present[0])
        encoders[present[0] if present[0] != model else None] = first
    data = curve_data(hp, bundle, tok, curve)
    for i, t in enumerate(todo):
        name = t["checkpoint"]
        if t["init"] == "random" and encoders:          # only its configuration is used
            encoder = next(iter(encoders.values()))
        else:
            if name not in encoders:
                encoders[name] = load_encoder(bundle, curve, name)[0]
            encoder = encoders[name]
        (result,) = finetune.run_trials(hp, data, encoder, [t], dev)
        out.append(result)
        log(f"[{len(done) + i + 1}/{len(trials)}] {json.dumps(result)}")
        if file is not None:
            _write(file, out)
    return out


def run_baselines(hp, dev, bundle=None, curve: str = "imdb-minilm") -> tuple[list[dict], dict]:
    encoder, tok = load_encoder(bundle, curve)
    data = curve_data(hp, bundle, tok, curve)
    spec = CURVES[curve]
    return finetune.baseline_rows(data, encoder, hp.sizes, hp.seeds, task=spec["task"], model=spec["model"],
                                  device=dev, char_ngrams=(1, 3) if spec["task"] == "nsmc" else None)


def run_all_labels(hp, dev, bundle=None, log=print) -> dict:
    """MiniLM fine-tuned on every training review outside the validation split (the headline IMDB
    number), the learning rate chosen on the validation split."""
    a = hp.all_labels
    encoder, tok = load_minilm(bundle)
    train_rows, test_rows = load_rows(bundle, hp)
    data = finetune.CurveData(train_rows, test_rows, val_size=hp.val_size, test_size=hp.test_size,
                              max_len=a["max_len"], head=a["head"], tokenizer=tok, sizes=[2], seeds=[a["seed"]])
    seqs = finetune.encode_reviews(tok, data.pool, a["max_len"], a["head"])
    labels = [int(r["label"]) for r in data.pool]
    runs = {}
    for lr in a["lrs"]:
        start = time.perf_counter()
        model = finetune.classifier(encoder, seed=a["seed"])
        steps = finetune.steps_for(len(seqs), a["epochs"], a["batch_size"], 1)
        finetune.fine_tune(model, seqs, labels, lr=lr, head_lr=max(hp.head_lr, lr), steps=steps,
                           batch_size=a["batch_size"], seed=a["seed"], device=dev)
        runs[lr] = {"lr": lr, "steps": steps,
                    "val_accuracy": finetune.accuracy(model, *data.encoded(data.val), device=dev, batch_size=256),
                    "test_accuracy": finetune.accuracy(model, *data.encoded(data.test), device=dev, batch_size=256),
                    "seconds": round(time.perf_counter() - start, 1)}
        log(json.dumps(runs[lr]))
    best = max(runs, key=lambda lr: (runs[lr]["val_accuracy"], -lr))
    acc = runs[best]["test_accuracy"]
    return {"accuracy": acc, "std_error": (acc * (1 - acc) / len(data.test)) ** 0.5, "train_reviews": len(seqs),
            "test_reviews": len(data.test), "max_len": a["max_len"], "head_tokens": a["head"], "epochs": a["epochs"],
            "lr": best, "by_lr": {f"{lr:g}": r for lr, r in runs.items()}}


def merge(hp, trials: list[dict], baselines: tuple[list[dict], dict], all_labels: dict | None,
          curve: str = "imdb-minilm") -> dict:
    """What the curve records: :func:`lib.finetune.curve_metrics` of the runs from the curve's model,
    and for the emergence runs ``emergence``: their transfer rows (``model`` the snapshot's name),
    the learning rates chosen and the tokens each snapshot had read."""
    spec = CURVES[curve]
    main = [t for t in trials if t.get("checkpoint") is None]
    metrics = finetune.curve_metrics(hp, main, baselines, spec["task"], spec["model"])
    if any(t.get("checkpoint") is not None for t in trials):
        metrics["emergence"] = emergence_metrics(trials, curve)
    return {**metrics, **({"all_labels": all_labels} if all_labels else {})}


def emergence_metrics(trials: list[dict], curve: str) -> dict:
    """The runs from the snapshots: their transfer rows (``model`` the snapshot's name), the learning
    rates chosen on the validation split and the tokens each snapshot (and the final model, when
    registered) had read."""
    from lib import checkpoints
    spec = CURVES[curve]
    later = sorted({t["checkpoint"] for t in trials if t.get("checkpoint") is not None}, key=str)
    rows, chosen = [], {}
    for name in later:
        r, c = finetune.select_by_validation([t for t in trials if t.get("checkpoint") == name], spec["task"], name)
        rows += r
        chosen[name] = c["pretrained"]
    names = [*later, *([spec["model"]] if spec["model"] in checkpoints.registry() else [])]
    return {"transfer": rows, "lr_choice": chosen,
            "tokens": {name: checkpoints.tokens_seen(name) for name in names}}


# ----------------------------------------------------------------------------- command line

def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["all", "trials", "baselines", "all-labels", "merge", "bundle"])
    ap.add_argument("--mode", choices=config.MODES, default=None, help="the recipe (default: COURSE_MODE)")
    ap.add_argument("--curve", choices=sorted(CURVES), default="imdb-minilm", help="which learning curve")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the partial results (default: _build/transfer_curve, or _build/curve-<curve>)")
    ap.add_argument("--shard", default="0/1", help="i/k: run every k-th trial starting at i (trials)")
    ap.add_argument("--bundle", type=Path, default=None, help="read data and weights from a bundle folder")
    ap.add_argument("--record", action="store_true", help="merge: record in results/ (with the recipe's mode)")
    ap.add_argument("--only", default=None,
                    help="trials: only these, comma-separated: random, pretrained, or a snapshot's name (ko-bert@3M)")
    ap.add_argument("--snapshots-only", action="store_true",
                    help="merge: only the snapshots' runs (the emergence part), before the final checkpoint exists")
    args = ap.parse_args(argv)
    curve = args.curve
    if args.snapshots_only and args.command != "merge":
        ap.error("--snapshots-only goes with merge")
    if args.out is None:
        args.out = Path("_build/transfer_curve" if curve == "imdb-minilm" else f"_build/curve-{curve}")
    if args.mode:              # the recipe asked for is the one device.summary and the record name
        os.environ[config.ENV_VAR] = args.mode
    hp = recipe(args.mode, curve)
    if args.command == "bundle":
        if curve != "imdb-minilm":
            ap.error("bundle packs the imdb-minilm curve's data and weights only")
        make_bundle(args.out, hp)
        print(f"bundle written to {args.out}")
        return 0
    dev = device.setup(seed=0)
    print(device.summary(), flush=True)
    try:
        i, k = (int(x) for x in args.shard.split("/"))
        assert 0 <= i < k
    except (ValueError, AssertionError):
        ap.error(f"--shard must be i/k with 0 <= i < k, got {args.shard!r}")
    if args.command == "trials":
        only = set(args.only.split(",")) if args.only else None
        tag = f"-{args.only.replace(',', '+').replace('@', '_')}" if args.only else ""
        run_trials(hp, dev, args.bundle, (i, k), file=args.out / f"trials-{i}-of-{k}{tag}.json", curve=curve, only=only)
    elif args.command == "baselines":
        rows, chosen = run_baselines(hp, dev, args.bundle, curve)
        _write(args.out / "baselines.json", {"rows": rows, "chosen": chosen})
    elif args.command == "all-labels":
        if hp.all_labels is None:
            ap.error(f"the {hp.mode} recipe has no all-labels run")
        _write(args.out / "all_labels.json", run_all_labels(hp, dev, args.bundle))
    else:
        if args.command == "all":
            trials = run_trials(hp, dev, args.bundle, curve=curve)
            base = run_baselines(hp, dev, args.bundle, curve)
            every = run_all_labels(hp, dev, args.bundle) if hp.all_labels else None
        else:
            files = sorted(glob.glob(str(args.out / "trials-*-of-*.json")))
            if not files:
                ap.error(f"no trials-*.json in {args.out}: run the trials first")
            trials = list({_key(t): t for f in files for t in json.loads(Path(f).read_text())}.values())
            if args.snapshots_only:
                trials = [t for t in trials if t.get("checkpoint") is not None]
            else:
                b = json.loads((args.out / "baselines.json").read_text())
                base = (b["rows"], b["chosen"])
                al = args.out / "all_labels.json"
                every = json.loads(al.read_text()) if al.is_file() else None
        expected = [t for t in all_trials(hp, curve) if t.get("checkpoint") is not None or not args.snapshots_only]
        if len(trials) != len(expected):
            raise SystemExit(f"{len(trials)} trials found, the recipe has {len(expected)}: a shard is missing")
        if args.snapshots_only:
            metrics = {"emergence": emergence_metrics(trials, curve)}
        else:
            metrics = merge(hp, trials, base, every, curve)
        _write(args.out / "merged.json", metrics)
        if args.record or args.command == "all":
            notes = os.environ.get("COURSE_RUN_NOTES", "")
            print("recorded:", results.record(CURVES[curve]["chapter"], metrics, hp, notes=notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
