"""Course checkpoints: the models the course pretrains itself, found by name and checked before use.

Like the dataset registry (``lib.data``), every checkpoint file is listed with its size and
SHA-256, here together with the model's configuration and the command that rebuilds it::

    from lib import checkpoints
    ckpt = checkpoints.load("ko-bert")                # model (float32, eval mode), tokenizer, card
    ckpt.model, ckpt.tokenizer, ckpt.card["tokens_seen"]
    checkpoints.load("ko-bert", config=B.BertConfig(...))   # and check it is the configuration you expect

Where the files live
--------------------
``checkpoints/`` in the repository holds them, ``<name>/model.safetensors``, ``<name>/tokenizer.json``,
``<name>/card.json`` and ``card.md`` (and ``<name>/snapshots/`` for the few intermediate weights an
emergence plot needs), with ``checkpoints/registry.json``, the registry itself. A tokenizer that
several checkpoints ship byte for byte (the seeds of a recipe) is stored once: the registry names
the one file each uses (``python -m tools.pretrain.restore --share-tokenizers``). A model trained on
top of another checkpoint with most of its weights left as they were can be stored as an overlay
(:class:`Base`): its file holds the tensors it changed, and ``load`` takes the others from the base
after checking that the base's weights are the ones it was trained on. Only
``python -m tools.pretrain <recipe>`` writes them (the registry entry last, once its files are in
place). When ``COURSE_CHECKPOINT_MIRROR`` names a folder with the same layout (a published copy,
a shared disk), a file missing from the repository is looked for there.

The size budget
---------------
All the registered files together stay under :data:`BUDGET_BYTES` (250 MB). The course's
models have about 5M parameters: 10 to 12 MB each in bfloat16 / float16, about 6 MB in int8 with a
float16 scale per 64 values (weights only, the tied output layer stored once). ``tools.pretrain``
stores each in the smallest of int8, float16 and bfloat16 whose held-out loss is within 0.001 nats of
float32's (the card gives all four). The budget was first set at 100 MB, for seven pretrained models and
three emergence snapshots. It was raised to 140 MB once the two emergence series were in
(``ko-bert`` and ``ernie-ko`` with three snapshots each: chapter 8's emergence plot and chapter 13's
comparison along the runs, about 64 MB together), so that the remaining models of Part III (BART,
ELMo, T5) fit beside them, and to 250 MB when the chapters' own trained models joined them
(chapter 1's translators, then every model a chapter's headline rests on, evaluated on its page):
small enough that a clone stays quick and every file is far below
GitHub's 50 MB warning, large enough for what the chapters load. ``total_size(registry())`` says
how much is registered now.
Every rebuild adds its files to the git history, so rebuild rarely. ``register`` refuses an
entry that would break the budget.

What ``load`` refuses, each with one message naming the file and the command that rebuilds it
--------------------------------------------------------------------------------------------
* a missing file (in the repository and in the mirror);
* a file whose SHA-256 is not the registered one (a half-copied file, a rebuild that was not
  registered, a file changed by hand);
* a configuration that does not match: the one the caller asks for, the registry's, and the one
  written into the weights file's metadata must agree (dropout rates excepted: they are settings of
  a run, not of the weights, so ``load(name, config=...)`` builds the model with the caller's).

Nothing half-written is ever read: every file is written to a temporary file beside its
final name and renamed (``lib.io.atomic_write``), and a file is read only after its checksum
matched, so an interrupted write leaves either the previous file or none.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from lib.io import atomic_write, folder_from_env, sha256 as file_sha256

__all__ = ["CheckpointError", "CHECKPOINT_DIR", "MIRROR_ENV", "BUDGET_BYTES", "REGISTRY_FILE", "FileEntry",
           "CheckpointInfo", "Checkpoint", "registry", "info", "path", "load", "load_state", "save_weights",
           "register", "total_size", "config_dict", "MODEL_KINDS", "build_model", "weights_state", "as_stored",
           "stored_bytes", "INT8_GROUP", "INT8_EMBEDDINGS", "Base", "storage_plan", "rounded_copy",
           "file_entry", "summary"]

CHECKPOINT_DIR = Path(__file__).resolve().parent.parent / "checkpoints"
REGISTRY_FILE = "registry.json"
MIRROR_ENV = "COURSE_CHECKPOINT_MIRROR"
BUDGET_BYTES = 250_000_000
FORMAT = "lib.checkpoints/1"
#: configuration fields that are settings of a run, not of the weights: a caller may ask for others
RUNTIME_FIELDS = frozenset({"dropout", "attention_dropout"})
META_KEY = "lib.checkpoints"     # the safetensors metadata entry that holds ours (one JSON string)


class CheckpointError(RuntimeError):
    """A course checkpoint that cannot be used: missing, corrupt, or not the configuration asked for."""


@dataclass(frozen=True)
class FileEntry:
    """One registered file: its path relative to the checkpoint folder, size and SHA-256."""
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class CheckpointInfo:
    """A registry entry: the model kind and configuration, its files, and how to rebuild it."""
    name: str
    kind: str
    config: dict
    files: dict[str, FileEntry]
    command: str
    description: str = ""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


@dataclass
class Checkpoint:
    """What ``load`` returns."""
    name: str
    model: nn.Module
    tokenizer: Any
    card: dict                  # card.json, or for a snapshot the metadata of its weights file
    info: CheckpointInfo
    target_tokenizer: Any = None  # a translation model's target-side vocabulary (its "target_tokenizer" file)


# ----------------------------------------------------------------------------- models by kind

def _bert(config: Mapping[str, Any]) -> nn.Module:
    from lib.models import bert as B
    return B.BertForPreTraining(B.BertConfig(**config))


def _gpt(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.gpt import GPT, GPTConfig
    return GPT(GPTConfig(**config))


def _switch_gpt(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.switch import SwitchGPT, SwitchGPTConfig
    return SwitchGPT(SwitchGPTConfig(**config))


def _char_lm(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.memory import CharLM, CharLMConfig
    return CharLM(CharLMConfig(**config))


def _txl(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.transformer_xl import TransformerXL, TransformerXLConfig
    return TransformerXL(TransformerXLConfig(**config))


def _xlnet(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.xlnet import XLNet, XLNetConfig
    return XLNet(XLNetConfig(**config))


def _bilstm(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.bilstm_attention import BiLSTMAttentionClassifier, BiLSTMConfig
    return BiLSTMAttentionClassifier(BiLSTMConfig(**config))


def _bart(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.bart import Bart, BartConfig
    return Bart(BartConfig(**config))


def _elmo(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.elmo import BiLM, ELMoConfig
    return BiLM(ELMoConfig(**config))


def _t5(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.t5 import T5, T5Config
    return T5(T5Config(**config))


def _seq2seq(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.seq2seq import Seq2Seq, Seq2SeqConfig
    return Seq2Seq(Seq2SeqConfig(**config))


def _transformer(config: Mapping[str, Any]) -> nn.Module:
    from lib.models.transformer import Transformer, TransformerConfig
    return Transformer(TransformerConfig(**config))


#: kind -> a function that builds the (untrained) model from the registered configuration.
MODEL_KINDS: dict[str, Callable[[Mapping[str, Any]], nn.Module]] = {"bert-mlm": _bert, "gpt-lm": _gpt,
                                                                     "switch-gpt": _switch_gpt, "char-lm": _char_lm,
                                                                     "txl-lm": _txl, "xlnet-plm": _xlnet, "bilstm-classify": _bilstm,
                                                                     "bart-denoise": _bart, "bart-chat": _bart, "elmo-bilm": _elmo,
                                                                     "t5-span": _t5, "t5-task": _t5, "seq2seq": _seq2seq,
                                                                     "transformer": _transformer}


def build_model(kind: str, config: Mapping[str, Any]) -> nn.Module:
    if kind not in MODEL_KINDS:
        raise CheckpointError(f"unknown checkpoint kind {kind!r}: expected one of {', '.join(MODEL_KINDS)}")
    return MODEL_KINDS[kind](dict(config))


def config_dict(config: Any) -> dict:
    """A configuration as a plain dict (a dataclass such as ``BertConfig``, or a mapping), as JSON
    holds it (tuples as lists), so that it compares equal to the registry's."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return json.loads(json.dumps(dataclasses.asdict(config)))
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))
    raise TypeError(f"config must be a dataclass (e.g. BertConfig) or a dict, got {type(config).__name__}")


# ----------------------------------------------------------------------------- the registry

def _root(root: str | os.PathLike | None) -> Path:
    return Path(root) if root is not None else CHECKPOINT_DIR


def registry(root: str | os.PathLike | None = None) -> dict[str, CheckpointInfo]:
    """Every registered checkpoint, by name (``<root>/registry.json``; empty when there is none)."""
    from lib.text import _read_json

    file = _root(root) / REGISTRY_FILE
    if not file.is_file():
        return {}
    try:
        raw = _read_json(file, FORMAT, "checkpoint registry", "lib.checkpoints.register")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{e}; restore it from git") from None
    out = {}
    for name, e in raw["checkpoints"].items():
        files = {k: FileEntry(**f) for k, f in e["files"].items()}
        out[name] = CheckpointInfo(name=name, kind=e["kind"], config=e["config"], files=files,
                                   command=e["command"], description=e.get("description", ""))
    return out


def info(name: str, root: str | os.PathLike | None = None) -> CheckpointInfo:
    entries = registry(root)
    if name not in entries:
        known = ", ".join(sorted(entries)) or "none yet"
        raise CheckpointError(f"no checkpoint named {name!r} in {_root(root) / REGISTRY_FILE} (registered: {known}). "
                              f"A pretraining recipe is built and registered with `python -m tools.pretrain "
                              f"{name.split('@')[0]}`")
    return entries[name]


def total_size(entries: Mapping[str, CheckpointInfo]) -> int:
    """Bytes of all the files of ``entries``, each distinct file counted once (snapshots share a tokenizer)."""
    return sum({f.path: f.size for e in entries.values() for f in e.files.values()}.values())


def file_entry(root: str | os.PathLike | None, relative: str) -> FileEntry:
    """The registry line of a file just written under ``root``: its path, SHA-256 and size."""
    full = _root(root) / relative
    return FileEntry(relative, file_sha256(full), full.stat().st_size)


def register(entry: CheckpointInfo, root: str | os.PathLike | None = None,
             budget: int | None = BUDGET_BYTES) -> Path:
    """Add or replace ``entry`` in ``<root>/registry.json`` (atomically), after checking that each
    of its files is in place with the registered checksum and that the folder stays within ``budget``."""
    root = _root(root)
    for key, f in entry.files.items():
        full = root / f.path
        if not full.is_file() or full.stat().st_size != f.size or file_sha256(full) != f.sha256:
            raise CheckpointError(f"cannot register {entry.name!r}: its {key} file {full} is missing or is not "
                                  f"the file described (size {f.size}, sha256 {f.sha256[:12]}...)")
    entries = {**registry(root), entry.name: entry}
    if budget is not None and total_size(entries) > budget:
        raise CheckpointError(f"registering {entry.name!r} would bring {root} to {total_size(entries) / 1e6:.1f} MB, "
                              f"over its budget of {budget / 1e6:.0f} MB: store fewer snapshots, write to another "
                              f"folder (--out) and publish it as a mirror ({MIRROR_ENV}), or raise the budget "
                              "with a reason")
    payload = {"format": FORMAT, "checkpoints": {
        n: {"kind": e.kind, "description": e.description, "command": e.command, "config": e.config,
            "files": {k: dataclasses.asdict(f) for k, f in e.files.items()}}
        for n, e in sorted(entries.items())}}
    with atomic_write(root / REGISTRY_FILE, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return root / REGISTRY_FILE


# ----------------------------------------------------------------------------- finding and checking files

def _mirror() -> Path | None:
    return folder_from_env(MIRROR_ENV, CheckpointError, ": point it at a copy of checkpoints/ or unset it")


def path(name: str, key: str = "weights", root: str | os.PathLike | None = None) -> Path:
    """The local path of file ``key`` (``weights``, ``tokenizer``, ``card``) of checkpoint ``name``,
    after its SHA-256 was checked: in the checkpoint folder, else in the mirror."""
    entry = info(name, root)
    if key not in entry.files:
        raise CheckpointError(f"checkpoint {name!r} has no {key!r} file (it has {', '.join(entry.files)})")
    f = entry.files[key]
    mirror = _mirror()
    candidates = [_root(root) / f.path] + ([mirror / f.path] if mirror is not None else [])
    rebuild = f"rebuild it with `{entry.command}`"
    for candidate in candidates:
        if candidate.is_file():
            actual = file_sha256(candidate)
            if actual != f.sha256:
                raise CheckpointError(f"{candidate} (the {key} of checkpoint {name!r}) is corrupt or not the "
                                      f"registered file: its sha256 is {actual}, the registry says {f.sha256}. Restore it from "
                                      f"git or {rebuild}")
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    no_mirror = "" if mirror is not None else f" ({MIRROR_ENV} is unset)"
    raise CheckpointError(f"the {key} file of checkpoint {name!r} is missing: looked for {looked}{no_mirror}. "
                          f"Restore it from git, set {MIRROR_ENV} to a folder that has it, or {rebuild}")


def _check_config(name: str, entry: CheckpointInfo, expected: Mapping[str, Any], where: str, file: Path) -> None:
    keys = sorted((set(expected) | set(entry.config)) - RUNTIME_FIELDS)
    diff = [f"{k}: {where} {expected.get(k, '(absent)')!r}, registered {entry.config.get(k, '(absent)')!r}"
            for k in keys if expected.get(k, None) != entry.config.get(k, None)]
    if diff:
        raise CheckpointError(f"checkpoint {name!r} ({file}) does not have the configuration {where}: "
                              + "; ".join(diff) + f". Rebuild it with `{entry.command}` or ask for the registered one")


# ----------------------------------------------------------------------------- weights in safetensors

def weights_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The model's state dict without the names of tied parameters (stored once) and the tied names."""
    state = model.state_dict()
    first = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    tied = [n for n in state if n not in first]
    return {n: t for n, t in state.items() if n in first}, tied


#: int8 storage: a floating tensor of two or more dimensions is stored as int8 values with one float16
#: scale per group of ``INT8_GROUP`` consecutive values of a row (its largest magnitude / 127; a row whose
#: length is not a multiple is one group), under its own name plus ``INT8_SCALE``; other floating tensors
#: (biases, norms) in float16. About a quarter of float32's bytes, where 16 bits take a half.
INT8_GROUP = 64
INT8_SCALE = ".int8_scale"


def _int8_groups(t: torch.Tensor) -> torch.Tensor:
    size = INT8_GROUP if t.shape[-1] % INT8_GROUP == 0 else t.shape[-1]
    return t.detach().float().reshape(-1, size)


def _stored(name: str, t: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The safetensors entries that store tensor ``t`` in ``dtype`` (see ``INT8_GROUP`` for torch.int8)."""
    t = t.detach()
    if not t.is_floating_point():
        return {name: t}
    if dtype != torch.int8:
        return {name: t.to(dtype)}
    if t.dim() < 2:
        return {name: t.to(torch.float16)}
    groups = _int8_groups(t)
    scale = (groups.abs().amax(1, keepdim=True) / 127).to(torch.float16)
    safe = scale.float().clamp_min(torch.finfo(torch.float16).tiny)
    q = (groups / safe).round().clamp(-127, 127).to(torch.int8)
    return {name: q.reshape(t.shape), name + INT8_SCALE: scale.flatten()}


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.float().reshape(scale.numel(), -1) * scale.float()[:, None]).reshape(q.shape)


def as_stored(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as ``save_weights`` stores it in ``dtype`` and ``read_weights`` reads it back (float32)."""
    entries = _stored("t", t, dtype)
    if "t" + INT8_SCALE in entries:
        return _dequantize(entries["t"], entries["t" + INT8_SCALE])
    return entries["t"].float() if t.is_floating_point() else entries["t"]


#: mixed storage: the embedding tables (every ``nn.Embedding``'s weights, where most of a small model's
#: bytes are and where rounding costs least) in int8 with scales, every other tensor in float16. For the
#: models whose held-out loss int8 moves just past the tolerance (chapter 2's IMDB BiLSTM without
#: attention: int8 +0.0012 nats, its embedding alone +0.0007), at little more than int8's size.
INT8_EMBEDDINGS = "int8-embeddings"
Storage = torch.dtype | str
STORAGE_WORDS = {INT8_EMBEDDINGS: "int8 embedding tables and float16 elsewhere"}


def storage_plan(model: nn.Module, dtype: Storage) -> dict[str, torch.dtype]:
    """{stored tensor name: the dtype it is stored in} (``torch.int8``: with scales) for the storage
    ``dtype``: a torch dtype for every tensor, or :data:`INT8_EMBEDDINGS`."""
    state, _ = weights_state(model)
    if isinstance(dtype, torch.dtype):
        return {name: dtype for name in state}
    if dtype != INT8_EMBEDDINGS:
        raise ValueError(f"unknown storage {dtype!r}: a torch dtype or {INT8_EMBEDDINGS!r}")
    tables = {f"{m}.weight" for m, module in model.named_modules() if isinstance(module, nn.Embedding)}
    return {name: torch.int8 if name in tables else torch.float16 for name in state}


def rounded_copy(model: nn.Module, dtype: Storage, base: "Base | None" = None) -> nn.Module:
    """A copy of ``model`` whose weights are what ``save_weights(model, ..., dtype, base=base)`` stores
    and ``load`` reads back: the model a page evaluates (the tensors an overlay takes from its base
    stay as they are)."""
    import copy
    plan, twin = storage_plan(model, dtype), copy.deepcopy(model)
    kept = set(_own_tensors(model, base)[1])
    with torch.no_grad():
        for name, t in twin.state_dict().items():
            if name in plan and name not in kept and t.is_floating_point():
                t.copy_(as_stored(t, plan[name]))
    return twin


@dataclass(frozen=True)
class Base:
    """The registered checkpoint a model was trained on top of, for weights stored as an overlay: only
    the tensors that differ from ``state`` (the base's weights as ``load_state`` gives them) are written,
    the others are read from the base when the overlay is loaded. A fine-tuning that trains a few
    layers (chapter 13's dialogue model on ``ernie-ko``, Part IV's adapters) stores those layers only."""
    name: str
    sha256: str                        # the base's weights file, as registered when the overlay was made
    state: Mapping[str, torch.Tensor]

    @classmethod
    def of(cls, name: str, root: str | os.PathLike | None = None) -> "Base":
        state, entry, _ = load_state(name, root=root)
        return cls(name, entry.files["weights"].sha256, state)


def _own_tensors(model: nn.Module, base: Base | None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(the tensors to write, the names read from ``base`` instead: equal to the base's, bit for bit)."""
    state, _ = weights_state(model)
    if base is None:
        return state, []
    same = [k for k, t in state.items() if k in base.state and t.shape == base.state[k].shape
            and torch.equal(t.detach().float().cpu(), base.state[k].float())]
    return {k: t for k, t in state.items() if k not in same}, sorted(same)


def stored_bytes(model: nn.Module, dtype: Storage, base: Base | None = None) -> int:
    """The bytes of the weights' tensors as ``save_weights`` would store them in ``dtype`` (no header)."""
    state, _ = _own_tensors(model, base)
    plan = storage_plan(model, dtype)
    return sum(v.numel() * v.element_size() for k, t in state.items() for v in _stored(k, t, plan[k]).values())


def save_weights(model: nn.Module, file: str | os.PathLike, dtype: Storage, metadata: Mapping[str, Any],
                 base: Base | None = None) -> Path:
    """Write the weights (floating tensors in ``dtype``, or int8 with scales for ``torch.int8``: see
    ``INT8_GROUP``; :data:`INT8_EMBEDDINGS` for int8 tables and float16 elsewhere; tied ones once) as
    safetensors, atomically, with ``metadata`` (JSON values) in the file's header. With ``base``: an
    overlay (see :class:`Base`), the base's name, weights hash and the names taken from it in the header."""
    from safetensors.torch import save

    state, from_base = _own_tensors(model, base)
    if base is not None:
        metadata = {**metadata, "base": {"name": base.name, "sha256": base.sha256, "tensors": from_base}}
    plan = storage_plan(model, dtype)
    state = {k: v.contiguous().cpu() for name, t in state.items() for k, v in _stored(name, t, plan[name]).items()}
    # one metadata entry: safetensors writes several in a random order, and the same weights must
    # give the same bytes (and so the same SHA-256) every time
    header = {META_KEY: json.dumps({"format": FORMAT, **metadata}, sort_keys=True, ensure_ascii=False)}
    blob = save(state, metadata=header)
    with atomic_write(file, "wb") as fh:
        fh.write(blob)
    return Path(file)


def read_weights(file: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state in float32, metadata) of a file written by ``save_weights``."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    blob = file.read_bytes()
    try:
        state = load(blob)
        n = int.from_bytes(blob[:8], "little")
        meta = json.loads(json.loads(blob[8:8 + n]).get("__metadata__", {}).get(META_KEY, "{}"))
    except (SafetensorError, ValueError) as e:
        raise CheckpointError(f"{file} is not a safetensors file ({e})") from None
    if meta.pop("format", None) != FORMAT:
        raise CheckpointError(f"{file} was not written by lib.checkpoints.save_weights")
    scales = {k[:-len(INT8_SCALE)]: state.pop(k) for k in [k for k in state if k.endswith(INT8_SCALE)]}
    out = {k: _dequantize(v, scales[k]) if k in scales else v.float() if v.is_floating_point() else v
           for k, v in state.items()}
    return out, meta


def load_state(name: str, config: Any = None, root: str | os.PathLike | None = None
               ) -> tuple[dict[str, torch.Tensor], CheckpointInfo, dict]:
    """The checked float32 weights of checkpoint ``name``, its registry entry and the metadata of its
    weights file (no model built).
    ``config``: the configuration the caller expects (a dataclass or dict); a mismatch is an error."""
    entry = info(name, root)
    file = path(name, "weights", root)
    if config is not None:
        _check_config(name, entry, config_dict(config), "asked for", file)
    state, meta = read_weights(file)
    if meta.get("config") != entry.config or meta.get("kind") != entry.kind:
        raise CheckpointError(f"{file} holds a {meta.get('kind')} model with configuration {meta.get('config')}, "
                              f"but the registry says {entry.kind} {entry.config}: rebuild it with `{entry.command}`")
    if "base" in meta:                     # an overlay: the tensors it does not hold are its base's
        base = meta["base"]
        if base["name"] not in registry(root):
            raise CheckpointError(f"checkpoint {name!r} stores only what it changed from {base['name']!r}, which is "
                                  f"not registered in {_root(root)}: restore it, or rebuild {name!r} with "
                                  f"`{entry.command}`")
        base_state, base_entry, _ = load_state(base["name"], root=root)
        if base_entry.files["weights"].sha256 != base["sha256"]:
            raise CheckpointError(f"checkpoint {name!r} was trained on top of {base['name']!r} with weights "
                                  f"{base['sha256'][:12]}..., but the registered {base['name']!r} has "
                                  f"{base_entry.files['weights'].sha256[:12]}...: rebuild {name!r} with "
                                  f"`{entry.command}`")
        state = {**{k: base_state[k] for k in base["tensors"]}, **state}
    return state, entry, meta


def load(name: str, config: Any = None, root: str | os.PathLike | None = None) -> Checkpoint:
    """Checkpoint ``name``: the model (float32, eval mode), its tokenizer and its card, every file
    checked against the registry first (see the module docstring for what is refused)."""
    from lib.text import load_vocabulary

    state, entry, meta = load_state(name, config, root)
    asked = config_dict(config) if config is not None else {}
    model = build_model(entry.kind, {**entry.config, **{k: asked[k] for k in RUNTIME_FIELDS if k in asked}})
    _, tied = weights_state(model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) != set(tied) or unexpected:
        raise CheckpointError(f"the weights of checkpoint {name!r} do not fit its {entry.kind} model (missing "
                              f"{sorted(set(missing) - set(tied))}, unexpected {unexpected}): rebuild it with "
                              f"`{entry.command}`")
    tokenizer, target = (load_vocabulary(path(name, key, root)) if key in entry.files else None
                         for key in ("tokenizer", "target_tokenizer"))
    card = json.loads(path(name, "card", root).read_text(encoding="utf-8")) if "card" in entry.files else meta
    return Checkpoint(name, model.eval(), tokenizer, card, entry, target)


def tokens_seen(name: str, root: str | os.PathLike | None = None) -> int:
    """How many tokens checkpoint or snapshot ``name`` read in pretraining: its card, or for a
    snapshot the metadata of its weights file (checked against the registry, no model built)."""
    if "card" in info(name, root).files:
        card = json.loads(path(name, "card", root).read_text(encoding="utf-8"))
        return int(card["training"]["tokens_seen"])
    return int(read_weights(path(name, "weights", root))[1]["tokens_seen"])


def along_the_run(name: str, root: str | os.PathLike | None = None) -> dict[int, str]:
    """Tokens read -> name, fewest first, for the snapshots of ``name`` and, once it is registered,
    the final checkpoint: the points at which two twin runs can be compared."""
    names = [n for n in registry(root) if n == name or n.startswith(name + "@")]
    return dict(sorted((tokens_seen(n, root), n) for n in names))


def snapshots(name: str, root: str | os.PathLike | None = None) -> list[str]:
    """The registered snapshots of checkpoint ``name`` (``"ko-bert@3M"`` ...), fewest tokens first;
    the final checkpoint itself is not among them."""
    return [n for n in along_the_run(name, root).values() if n != name]


def summary(ckpt: Checkpoint) -> str:
    """One sentence from a checkpoint's card: how it was made (the command, what it read, how long, on
    which device and in which precision) and how it is stored, for the page that loads it."""
    card = ckpt.card
    t, h = card.get("training"), card.get("heldout")
    if not t or not h:
        raise CheckpointError(f"checkpoint {ckpt.name!r} has no card to summarise (a snapshot?)")
    unit = t.get("unit", "tokens")
    device = str(t["device"]).split("|")[0].replace("device=", "").strip()
    passes = card["data"]["passes"]
    per_step = f"{t['global_batch']} pairs" if unit == "pairs" else f"{t['global_batch']} x {t['seq_len']} tokens"
    commit = card["commit"] + (" with uncommitted changes" if card.get("uncommitted_changes") else "")
    return (f"{ckpt.name}: {t['steps']:,} steps of {per_step} ({t['tokens_seen']:,} {unit}, {passes:g} passes over "
            f"the training data) in {t['wall_seconds'] / 60:.1f} minutes on {device} in {t['precision']}, "
            f"commit {commit}, by `{card['command']}`; "
            + (f"it kept the weights of step {t['kept']['step']:,}, {t['kept']['rule']}; " if "kept" in t else "")
            + f"stored in {STORAGE_WORDS.get(h['stored_dtype'], h['stored_dtype'])} ({ckpt.info.size / 1e6:.1f} MB).")
