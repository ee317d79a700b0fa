"""Copy weights from a reference implementation (Hugging Face, ``torch.nn``) into ours.

Every model of the course is checked the same way: build the reference from a small config
with random weights, copy its weights into ours with a *name table*, and compare outputs.
The copy is strict, in the spirit of nanoGPT's ``from_pretrained``: every tensor on both
sides is used exactly once and every pair of shapes matches, so a renamed or forgotten
parameter fails loudly instead of leaving a randomly initialised tensor behind.

A name table maps each of *our* state-dict keys to a :class:`Source`: one or more keys of
the reference state dict and how to turn them into our tensor::

    table = {
        "wte.weight": "transformer.wte.weight",                    # same tensor
        "blocks.0.attn.qkv.weight": Source("h.0.attn.c_attn.weight", transform=t),
        "blocks.0.attn.q.weight": Source("h.0.attn.c_attn.weight", transform=split(0, 3, 0)),
    }
    copy_weights(ours, theirs, table)

A reference key may feed several of our keys (a fused ``c_attn`` split into q, k, v) when
each use takes a different part of it; it is declared with ``shared=True`` on each use so
that the "used once" check still catches a key that was simply named twice by mistake.
Keys that are the same tensor on one side (tied weights) are listed in ``tied`` and
skipped on that side.

Before a comparison, :func:`randomise` redraws a reference's weights: at the references' own
initialisation (standard deviation 0.02, norm scales exactly 1, biases 0) a swapped weight, a
forgotten norm scale or the wrong activation changes the outputs too little to be seen.

This file is only the mechanism. Each model file owns its name table and one loader that knows
its tied and ignored keys, ``load_hf_<model>(ours, theirs)``: ``lib.models.gpt.load_hf_gpt``,
``bert.load_hf_bert``, ``albert.load_hf_albert``, ``ernie.load_hf_ernie``, ``bart.load_hf_bart``,
``t5.load_hf_t5``, ``transformer_xl.load_hf_transformer_xl``, ``xlnet.load_hf_xlnet``,
``switch.load_hf_switch``; ``lib.models.transformer`` has the ``torch.nn`` copies of chapter 3
(``copy_from_torch_mha``, ``copy_from_torch_transformer``).

Explained in chapters/08_bert.ipynb.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

__all__ = ["Source", "copy_weights", "split", "transpose", "WeightCopyError", "as_state_dict", "randomise"]


class WeightCopyError(ValueError):
    """A name table that does not account for every weight exactly once, or a shape mismatch."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where one of our tensors comes from: reference ``keys`` combined by ``transform``.

    ``transform`` receives the reference tensors in the order of ``keys`` and returns our
    tensor; without it there must be exactly one key, copied as it is. ``shared=True``
    allows the same reference key to appear in other entries (each taking a part of it).
    """
    keys: tuple[str, ...] | str
    transform: Callable[..., torch.Tensor] | None = None
    shared: bool = False

    def key_tuple(self) -> tuple[str, ...]:
        return (self.keys,) if isinstance(self.keys, str) else tuple(self.keys)


def transpose(t: torch.Tensor) -> torch.Tensor:
    """A Hugging Face ``Conv1D`` stores (in, out); ``nn.Linear`` stores (out, in)."""
    return t.t()


def split(index: int, parts: int, dim: int = 0, then: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """Transform taking chunk ``index`` of ``parts`` equal chunks along ``dim`` (after ``then``)."""
    def take(t: torch.Tensor) -> torch.Tensor:
        if then is not None:
            t = then(t)
        if t.shape[dim] % parts:
            raise WeightCopyError(f"cannot split dim {dim} of size {t.shape[dim]} into {parts} equal parts")
        return t.chunk(parts, dim=dim)[index]
    return take


def as_state_dict(module_or_state: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict of a model, or a copy of a state dict (e.g. a ``model.safetensors``)."""
    if isinstance(module_or_state, nn.Module):
        return dict(module_or_state.state_dict())
    if isinstance(module_or_state, Mapping):
        return dict(module_or_state)
    raise TypeError(f"expected an nn.Module or a state dict, got {type(module_or_state).__name__}")


def copy_weights(ours: nn.Module, theirs: nn.Module | Mapping[str, torch.Tensor],
                 table: Mapping[str, str | Source], *, tied: Iterable[str] = (),
                 tied_theirs: Iterable[str] = (), ignore_theirs: Iterable[str] = ()) -> nn.Module:
    """Copy ``theirs`` into ``ours`` by ``table`` (our key -> reference key or :class:`Source`).

    Checks before anything is written: every key of our state dict is in ``table`` or in
    ``tied`` (our keys that share storage with a key in the table, e.g. an output layer
    tied to the embeddings); every reference key is used by the table, or named in
    ``tied_theirs`` (their tied duplicates) or ``ignore_theirs`` (buffers that are not
    weights, e.g. a cached causal mask); no reference key is used twice unless every use
    says ``shared=True``; every resulting shape equals ours. Raises :class:`WeightCopyError`
    listing every problem at once. Returns ``ours``.
    """
    if not isinstance(ours, nn.Module):
        raise TypeError(f"ours must be an nn.Module, got {type(ours).__name__}")
    mine = as_state_dict(ours)
    ref = as_state_dict(theirs)
    tied, tied_theirs, ignore_theirs = set(tied), set(tied_theirs), set(ignore_theirs)
    problems: list[str] = []

    sources = {k: (Source(v) if isinstance(v, str) else v) for k, v in table.items()}
    for k, s in sources.items():
        if not isinstance(s, Source):
            problems.append(f"table[{k!r}] must be a reference key or a Source, got {type(s).__name__}")
    if problems:
        raise WeightCopyError("\n".join(problems))

    unknown_ours = sorted(set(sources) - set(mine))
    if unknown_ours:
        problems.append(f"table names keys our model does not have: {unknown_ours}")
    bad_tied = sorted(tied - set(mine))
    if bad_tied:
        problems.append(f"tied names keys our model does not have: {bad_tied}")
    missing_ours = sorted(set(mine) - set(sources) - tied)
    if missing_ours:
        problems.append(f"our keys with no source in the table: {missing_ours}")

    uses: dict[str, list[tuple[str, bool]]] = {}
    for k, s in sources.items():
        for rk in s.key_tuple():
            uses.setdefault(rk, []).append((k, s.shared))
            if rk not in ref:
                problems.append(f"table[{k!r}] reads {rk!r}, which the reference does not have")
    for rk, who in uses.items():
        if len(who) > 1 and not all(shared for _, shared in who):
            problems.append(f"reference key {rk!r} is used by {[k for k, _ in who]} without shared=True")
    unused = sorted(set(ref) - set(uses) - tied_theirs - ignore_theirs)
    if unused:
        problems.append(f"reference keys the table never uses: {unused}")
    if problems:
        raise WeightCopyError("\n".join(problems))

    new: dict[str, torch.Tensor] = {}
    for k, s in sources.items():
        tensors = [ref[rk] for rk in s.key_tuple()]
        if s.transform is None:
            if len(tensors) != 1:
                problems.append(f"table[{k!r}] combines {len(tensors)} keys but has no transform")
                continue
            value = tensors[0]
        else:
            value = s.transform(*tensors)
        if tuple(value.shape) != tuple(mine[k].shape):
            problems.append(f"{k}: ours has shape {tuple(mine[k].shape)}, the reference gives "
                            f"{tuple(value.shape)} (from {list(s.key_tuple())})")
            continue
        new[k] = value
    if problems:
        raise WeightCopyError("\n".join(problems))

    params = dict(ours.named_parameters(remove_duplicate=False))
    buffers = dict(ours.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for k, value in new.items():
            target = params.get(k, buffers.get(k))
            if target is None:   # a state-dict entry that is neither (e.g. extra state)
                raise WeightCopyError(f"{k} is in our state dict but is not a parameter or buffer")
            target.copy_(value.to(dtype=target.dtype, device=target.device))
    return ours


def randomise(model: nn.Module, std: float = 0.3, seed: int = 3, norm_scales_at_one: bool = True,
              only: str | None = None) -> nn.Module:
    """Redraw ``model``'s parameters for a comparison with ours, in place (returns ``model``).

    Each becomes ``std * N(0, 1)`` from a generator seeded with ``seed``, in the order of
    ``named_parameters()``; the scale (``weight``) of every normalisation layer (a module whose class
    name has "Norm" in it: ``LayerNorm``, ``T5LayerNorm``, our ``RMSNorm``) gets 1 added, unless
    ``norm_scales_at_one=False``. With ``only`` (a regular expression), only the parameters whose names
    it finds are redrawn. A weight of standard deviation 0.3 puts GELU's and tanh's inputs in their
    non-linear range and makes every norm scale and bias count, so that a mistake shows."""
    import re

    scales = {f"{prefix}.weight" if prefix else "weight" for prefix, module in model.named_modules()
              if "Norm" in type(module).__name__ and isinstance(getattr(module, "weight", None), nn.Parameter)}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is not None and not re.search(only, name):
                continue
            shift = 1.0 if norm_scales_at_one and name in scales else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * std + shift)
    return model
