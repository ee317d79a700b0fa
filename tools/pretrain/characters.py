"""The character family: chapter checkpoints that model Tiny Shakespeare one character at a time.

Chapter 5's character models with standard attention, adaptive attention spans and all-attention
layers (``char-lm``) and chapter 12's dense GPT and its Switch twins (``gpt-lm`` and ``switch-gpt``) are
trained by the same command, loop, resume and card as the pretrained models (``python -m tools.pretrain
switch-shakespeare``).
What differs from a subword recipe is the data:

* the vocabulary is the text's characters (``WordVocab`` over characters: the special tokens, then
  every character of the training part, most frequent first), saved as ``tokenizer.json``;
* the text is split as nanoGPT and the chapters split it: the first 90 % of the characters for
  training, the rest held out (``SPLIT``);
* a training example is a window of ``seq_len + 1`` characters at any position of the training part
  (inputs and their next characters), each epoch one permutation of all positions
  (``lib.train.GlobalBatchSampler``), so a run resumes exactly and a seed names its data order;
* the held-out loss is measured on the chapters' validation windows: ``heldout_sequences`` windows
  drawn by ``lib.data.random_windows`` with seed ``HELDOUT_SEED`` from the held-out part, the same
  windows for every seed of a recipe (the chapter's ``val_batches``).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from lib import checkpoints, train
from lib.io import sha256 as file_sha256
from lib.train.loaders import epoch_seed

#: chapter 9's kinds: relative positions (no length in the configuration) and data of their own
RELATIVE_KINDS = frozenset({"txl-lm", "xlnet-plm"})
#: checkpoint kinds this family trains (lib.checkpoints.MODEL_KINDS keys)
CHAR_KINDS = frozenset({"gpt-lm", "switch-gpt", "char-lm"}) | RELATIVE_KINDS
HELDOUT_STREAMS = 8    # txl-lm: the held-out characters are read as 8 streams side by side (the chapter's)
PREDICT_SHARE = 6      # xlnet-plm: the loss is on the last sixth of each order (the chapter's)
#: corpus name -> the data files it reads
CHAR_CORPORA = {"tinyshakespeare": (("tinyshakespeare", "input.txt"),)}
SPLIT = 0.9            # the share of the characters trained on (nanoGPT's split)
HELDOUT_SEED = 2       # the chapters' validation windows: lib.data.random_windows(..., seed=2)


def text(recipe) -> str:
    if recipe.corpus not in CHAR_CORPORA:
        raise SystemExit(f"recipe {recipe.name}: unknown character corpus {recipe.corpus!r} (expected one of "
                         f"{', '.join(CHAR_CORPORA)})")
    from lib import data
    return data.load_tinyshakespeare()


def split_point(n: int) -> int:
    return int(SPLIT * n)


def prepare(recipe, folder: Path, fingerprint: dict) -> dict:
    """The character vocabulary of the training part (``tokenizer.json``) and the two id streams
    (``streams.pt``); returns what ``data.json`` holds."""
    from lib import data
    from lib.io import atomic_write
    from lib.text import WordVocab
    start = time.perf_counter()
    full = text(recipe)
    cut = split_point(len(full))
    vocab = WordVocab.build([list(full[:cut])])
    ids = torch.tensor(vocab.encode(list(full)), dtype=torch.int16)
    folder.mkdir(parents=True, exist_ok=True)
    vocab.save(folder / "tokenizer.json")
    with atomic_write(folder / "streams.pt", "wb") as f:
        torch.save({"train": ids[:cut].clone(), "heldout": ids[cut:].clone()}, f)
    unknown = int((ids[cut:] == vocab.unk_id).sum())
    return {"fingerprint": fingerprint, "documents": 1, "heldout_documents": 0, "train_tokens": cut,
            "heldout_tokens": len(full) - cut,
            "heldout_rule": f"the last {1 - SPLIT:.0%} of the characters held out",
            "counts": {"characters": len(full), "distinct_characters": len(set(full)),
                       "heldout_characters_unknown": unknown},
            "corpus_sha256": hashlib.sha256(full.encode("utf-8")).hexdigest(),
            "datasets": [{"dataset": d, "file": name, "sha256": data.REGISTRY[d].files[name].sha256}
                         for d, name in CHAR_CORPORA[recipe.corpus]],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": vocab.vocab_size,
            "seconds": round(time.perf_counter() - start, 1)}


class Windows(torch.utils.data.Dataset):
    """Example ``i``: the ``length`` characters from position ``i`` as input, the next ones as target."""

    def __init__(self, stream: torch.Tensor, length: int):
        if len(stream) <= length + 1:
            raise ValueError(f"a stream of {len(stream)} characters holds no window of {length + 1}")
        self.stream, self.length = stream.long(), length

    def __len__(self) -> int:
        return len(self.stream) - self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.stream[i:i + self.length + 1]
        return w[:-1], w[1:]


def heldout_windows(stream: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """The chapters' validation windows of ``length + 1`` characters (``HELDOUT_SEED``)."""
    from lib import data
    return data.random_windows(stream.long(), length + 1, count, seed=HELDOUT_SEED)


class PermutedWindows(torch.utils.data.Dataset):
    """xlnet-plm: example ``i`` is the window of ``length`` characters at position ``i`` and a factorisation
    order of its positions, drawn from the example's index (``GlobalBatchSampler(tag_epoch=True)``
    makes it new in every epoch), as the masks of ``corpora.PackedMLM`` are."""

    def __init__(self, stream: torch.Tensor, length: int, seed: int):
        if len(stream) < length:
            raise ValueError(f"a stream of {len(stream)} characters holds no window of {length}")
        self.stream, self.length, self.seed = stream.long(), length, seed
        self.positions = len(stream) - length + 1

    def __len__(self) -> int:
        return self.positions

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = index % self.positions
        g = torch.Generator().manual_seed(epoch_seed(self.seed, index))
        return self.stream[i:i + self.length], torch.randperm(self.length, generator=g)


def segments(stream: torch.Tensor, batch_size: int, seg_len: int) -> list[tuple]:
    """txl-lm: the training text as ``batch_size`` contiguous streams side by side
    (``lib.models.transformer_xl.batchify``), cut into segments in order: ``(inputs, targets, first)``,
    ``first`` True for the segment that starts a pass (no memory before it). The chapter's layout."""
    from lib.models.transformer_xl import batchify
    rows = batchify(stream.long(), batch_size)
    return [(rows[:, s:s + seg_len], rows[:, s + 1:s + seg_len + 1], torch.tensor(s == 0))
            for s in range(0, rows.shape[1] - seg_len - 1, seg_len)]


class MemoryStep:
    """txl-lm's training step: the memory each step returns is the next step's, and a pass over the
    text starts without one. It carries state, so it gives ``lib.train.fit`` its ``state_dict`` (saved in
    every checkpoint: a resumed run continues with the memory the interrupted one had)."""

    def __init__(self):
        self.mems = None

    def __call__(self, model, batch):
        x, y, first = batch
        if first:
            self.mems = None
        _, loss, self.mems = model(x, y, mems=self.mems)
        return loss, {}

    def state_dict(self) -> dict:
        return {"mems": None if self.mems is None else [m.detach().cpu() for m in self.mems]}

    def load_state_dict(self, state: dict) -> None:
        mems = state["mems"]
        self.mems = None if mems is None else list(mems)


def build_training(recipe, folder: Path) -> tuple:
    """(vocabulary, the training loader, the fixed held-out batches, the model from the seed)."""
    from lib.text import WordVocab
    vocab = WordVocab.load(folder / "tokenizer.json")
    streams = torch.load(folder / "streams.pt", weights_only=True)
    if recipe.kind == "txl-lm":
        from lib.models.transformer_xl import batchify
        loader = segments(streams["train"], recipe.batch_size, recipe.seq_len)
        held = streams["heldout"][:recipe.heldout_sequences * recipe.seq_len].long()
        heldout = [(batchify(held, HELDOUT_STREAMS), torch.tensor(recipe.seq_len))]
    elif recipe.kind == "xlnet-plm":
        dataset = PermutedWindows(streams["train"], recipe.seq_len, recipe.seed)
        sampler = train.GlobalBatchSampler(len(dataset), recipe.batch_size, recipe.seed, tag_epoch=True)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
        held = heldout_windows(streams["heldout"], recipe.seq_len - 1, recipe.heldout_sequences)
        orders = torch.argsort(torch.rand(held.shape, generator=torch.Generator().manual_seed(HELDOUT_SEED)), dim=-1)
        predict = torch.tensor(recipe.seq_len // PREDICT_SHARE)
        heldout = [(w, o, predict) for w, o in zip(held.split(recipe.batch_size), orders.split(recipe.batch_size))]
    else:
        dataset = Windows(streams["train"], recipe.seq_len)
        sampler = train.GlobalBatchSampler(len(dataset), recipe.batch_size, recipe.seed)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
        held = heldout_windows(streams["heldout"], recipe.seq_len, recipe.heldout_sequences)
        heldout = [(w[:, :-1], w[:, 1:]) for w in held.split(recipe.batch_size)]
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(recipe.kind, recipe.model_config(vocab.vocab_size))
    return vocab, loader, heldout, model


def step_fn(recipe):
    """The training step: the next-character cross-entropy (a Switch model's forward adds its
    load-balancing losses); an adaptive span adds ``span_loss`` x the mean span of its heads."""
    if recipe.kind == "txl-lm":
        return MemoryStep()
    if recipe.kind == "xlnet-plm":
        return lambda model, batch: (model.permutation_lm_loss(*batch, recipe.seq_len // PREDICT_SHARE), {})

    def step(model, batch):
        x, y = batch
        loss = model(x, y)[1]
        if recipe.kind != "char-lm" or not recipe.span_loss:
            return loss, {}
        penalty = model.span_penalty()
        return loss + recipe.span_loss * penalty, {"lm_loss": loss.item(), "mean_span": float(penalty.detach())}
    return step


def parameter_groups(recipe, model) -> list[dict]:
    """The optimizer's parameter groups: an adaptive span's span ratios with their own learning rate
    (``span_lr``) and no weight decay, everything else at the recipe's."""
    spans = [p for n, p in model.named_parameters() if n.endswith("span_ratio")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("span_ratio")]
    groups = [{"params": rest}]
    if spans:
        groups.append({"params": spans, "lr": recipe.span_lr or recipe.lr, "weight_decay": 0.0})
    return groups
