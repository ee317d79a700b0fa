#!/usr/bin/env python
"""Pretrain a course checkpoint from committed code: one command per model, resumable, torchrun-ready.

::

    python -m tools.pretrain --list                                 # the recipes
    python -m tools.pretrain ko-bert                                # the recipe's token budget
    python -m tools.pretrain ko-bert --tokens 40M --snapshots 3M,10M --minutes 150
    torchrun --nproc_per_node 2 -m tools.pretrain ko-bert           # data parallel (CPU: gloo)

What a run does
---------------
1. Prepares the data once, in the scratch folder (``--scratch``, default ``.pretrain/<name>/``,
   ignored by git): the recipe's corpus (never a test review), a subword tokenizer trained on it
   and saved (the vocabulary every later use of the checkpoint shares), and the corpus encoded and
   packed into sequences of ``seq_len`` tokens. Every ``heldout_every``-th document is held out
   for the held-out loss.
2. Trains with ``lib.train.fit`` in chunks that end at every evaluation and snapshot: each chunk
   resumes from the checkpoint the previous one left in the scratch folder, so an interrupted run
   (Ctrl-C, a killed job, ``--minutes`` spent) continues exactly where its last checkpoint was when
   the same command runs again: same data order, masks, dropout and learning rate, the result of a run
   never interrupted. The data order is a function of (seed, epoch) and the global batch
   (``lib.train.GlobalBatchSampler``), the masks a function of each example's index, so under
   ``torchrun`` N processes train on exactly the batches one process would (``fit`` averages the
   gradients). One line per chunk: step, tokens, training and held-out loss, tokens per second.
3. Writes the output (``--out``, default ``checkpoints/``, the repository's folder; rank 0 only):
   ``<name>/model.safetensors`` (weights only, in float16 or bfloat16 when the held-out loss with the
   rounded weights is within ``DTYPE_TOLERANCE`` of float32's, else float32), ``tokenizer.json``,
   ``card.json`` and ``card.md``, ``snapshots/`` at the ``--snapshots`` token counts, and the
   registry entries (``lib.checkpoints``), each file to a temporary name first, then renamed.
   Optimizer state never leaves the scratch folder.

The package
-----------
One command, one loop, one card writer; a file per recipe family:

* ``recipes.py``: ``Recipe`` (everything a run depends on), the optimizers and schedules a recipe can
  name, and ``RECIPES``, every recipe of the course;
* ``corpora.py``: the language-model family (pretraining corpora, tokenizers, packed streams, the
  datasets and steps of each pretraining objective);
* ``translation.py``: the sentence-pair family (the chapters' translators and chatbot, whose budget
  counts pairs);
* ``evaluation.py``: the held-out loss of any family, and the dtype weights are stored in;
* ``loop.py``: ``Run`` and ``train_run``, the one resumable loop;
* ``card.py``: weights, vocabularies, cards, snapshots and registry entries;
* this file: the command line.

``--tokens`` sets the length of the learning-rate schedule (warm-up, then cosine); ``--minutes``
stops this invocation after that much wall time, at a checkpoint (run the command again to go on).
A resumed run must keep the recipe, ``--tokens``, ``--snapshots`` and the number of processes;
``--fresh`` starts over (reusing the prepared data when the recipe's data settings are unchanged).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from lib import checkpoints, device  # noqa: E402
from tools.pretrain import translation  # noqa: E402,F401
from tools.pretrain.card import (card_markdown, code_version, counts_text, git_commit, write_output,  # noqa: E402,F401
                                 write_snapshot)
from tools.pretrain.corpora import (CORPORA, DATASETS, STEP_FNS, PackedDenoising, PackedKnowledgeMLM,  # noqa: E402,F401
                                    PackedLM, PackedMLM, PackedSpanCorruption, PackedWordLM, make_dataset, mlm_step,
                                    prepare)
from tools.pretrain.evaluation import DTYPE_TOLERANCE, DTYPES, heldout_loss, rounded_losses, storage_dtype  # noqa: E402,F401
from tools.pretrain.loop import Run, _barrier, build_training, canonical_command, train_run  # noqa: E402,F401
from tools.pretrain.recipes import (OPTIMIZERS, RECIPES, SCHEDULES, T5_SENTINELS, Recipe, parse_tokens,  # noqa: E402,F401
                                   token_label, with_overrides)

SCRATCH = REPO / ".pretrain"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.pretrain", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", help="a recipe name (--list shows them)")
    ap.add_argument("--list", action="store_true", help="list the recipes and exit")
    ap.add_argument("--tokens", type=parse_tokens, help="length of the schedule in tokens (default: the recipe's)")
    ap.add_argument("--minutes", type=float, help="stop this invocation after this much wall time (resumable)")
    ap.add_argument("--snapshots", default="", help="token counts at which to save weights too, e.g. 2M,6M,15M")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe field (or model.<field>), e.g. --set lr=5e-4")
    ap.add_argument("--out", type=Path, default=checkpoints.CHECKPOINT_DIR,
                    help="where the checkpoint goes (default: the repository's checkpoints/)")
    ap.add_argument("--scratch", type=Path, default=SCRATCH, help="resume state and prepared data (default .pretrain/)")
    ap.add_argument("--fresh", action="store_true",
                    help="delete this recipe's resume state and start over (the prepared data is kept)")
    ap.add_argument("--threads", type=int, help="CPU threads per process (default: lib.device's policy)")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"),
                    help="training precision (sets COURSE_PRECISION; default: lib.device's policy)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.list or not args.recipe:
        for r in RECIPES.values():
            print(f"{r.name:22s} {r.kind:12s} {token_label(r.tokens):>5s} {r.unit:6s}  {r.description}")
        return None
    if args.recipe not in RECIPES:
        raise SystemExit(f"unknown recipe {args.recipe!r}: expected one of {', '.join(RECIPES)}")
    if args.precision:
        os.environ[device.PRECISION_ENV] = args.precision
    recipe = with_overrides(RECIPES[args.recipe], args.set)
    tokens = args.tokens or recipe.tokens
    snapshots = sorted(parse_tokens(s) for s in args.snapshots.split(",") if s.strip())
    scratch, out = args.scratch.resolve() / recipe.name, args.out.resolve()
    if out == scratch or out in scratch.parents or scratch in out.parents:
        raise SystemExit(f"--out {out} and --scratch {scratch} must be separate folders (optimizer state never "
                         "goes into the output)")
    dev = device.setup(seed=recipe.seed, cpu_threads=args.threads)
    main_process = device.is_main_process()
    say = print if main_process else (lambda line: None)
    if args.fresh and main_process:           # the prepared data (checked against the recipe) is kept
        for name in ("state.pt", "run.json", "clock.json", "best.pt"):
            (scratch / name).unlink(missing_ok=True)
    _barrier()
    run = Run(recipe, tokens, snapshots, scratch, out, canonical_command(recipe.name, tokens, snapshots, args.set), dev,
              provenance=git_commit())
    per_step = (f"{recipe.batch_size} {recipe.unit}" if recipe.unit in ("pairs", "reviews") else
                f"{recipe.batch_size} x {recipe.seq_len} tokens")
    say(f"{recipe.name}: {run.steps:,} steps of {per_step} = {token_label(run.steps * recipe.tokens_per_step)} "
        f"{recipe.unit} | {device.summary(dev, recipe=False)}")
    result = train_run(run, args.minutes, say)
    card = None
    if result is not None and main_process:
        card = write_output(run, result, say)
    _barrier()
    return {"card": card, **(result or {})}


if __name__ == "__main__":
    main()
