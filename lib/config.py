"""The two recipes every chapter runs in, chosen by one environment variable.

``COURSE_MODE=ci``   the CPU recipe: small, about two minutes a chapter on 2 cores,
                     still a real result. The default when no GPU is present.
``COURSE_MODE=full`` the recipe behind the recorded headline numbers (each chapter says where
                     and at what size its recorded run was made). The default when a GPU is present.

A chapter writes both recipes side by side and lets ``lib`` choose::

    hp = config.recipe(ci=dict(epochs=1, max_len=200), full=dict(epochs=3, max_len=500))
    hp.epochs, hp.mode   # -> 1, "ci" on a laptop

Chapters never read the environment themselves.

Every model's hyper-parameters are a dataclass that derives from :class:`ModelConfig`, which gives
them the same two methods: ``cfg.asdict()`` (plain values, e.g. for a checkpoint's card) and
``cfg.replace(**changes)`` (a copy with some fields changed, checked again by its ``__post_init__``).

Some chapters also write a GPU-sized full recipe that has never been run and recorded. A CUDA
machine does not run it silently: ``gpu_recipe(dev.type)`` is True only when it is asked for with
``COURSE_GPU_RECIPE=1`` (and the full recipe runs on CUDA); otherwise the CPU-sized full recipe
runs, and the call prints how to ask for the larger one.
"""
from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType
from collections.abc import Mapping
from typing import Any

ENV_VAR = "COURSE_MODE"
GPU_ENV_VAR = "COURSE_GPU_RECIPE"
MODES = ("ci", "full")

__all__ = ["ENV_VAR", "GPU_ENV_VAR", "MODES", "mode", "is_full", "gpu_recipe", "Recipe", "recipe", "ModelConfig", "hf_reader"]


class ModelConfig:
    """The base of every model configuration (a dataclass): ``asdict()`` and ``replace()``."""

    def asdict(self) -> dict[str, Any]:
        """The fields as plain values (nested dataclasses become dicts)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any):
        """A copy with ``changes`` applied; the copy's ``__post_init__`` checks it again."""
        return dataclasses.replace(self, **changes)


def hf_reader(hf_config: Any, model: str):
    """``get(key, default)`` over a ``transformers`` configuration or its ``config.json`` as a dict,
    and ``need(key, allowed, default)``, which raises ValueError, naming ``model`` and the key, when a
    setting the course's model does not implement has another value (the ``from_hf`` of each model)."""
    if isinstance(hf_config, Mapping):
        get = hf_config.get
    elif hasattr(hf_config, "to_dict"):
        get = lambda key, default=None: getattr(hf_config, key, default)    # noqa: E731
    else:
        raise TypeError(f"{model}: expected a transformers configuration or a dict, got {type(hf_config).__name__}")

    def need(key: str, allowed: tuple, default: Any = None) -> Any:
        value = get(key, default)
        if value not in allowed:
            raise ValueError(f"{model} implements only {key} in {allowed}, got {value!r}")
        return value
    return get, need


def mode() -> str:
    """The active recipe: the value of COURSE_MODE, else "full" with a GPU and "ci" without."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value:
        if value not in MODES:
            raise ValueError(f"{ENV_VAR}={value!r} is not a recipe: use one of {', '.join(MODES)}")
        return value
    import torch

    return "full" if torch.cuda.is_available() else "ci"


def is_full() -> bool:
    return mode() == "full"


def gpu_recipe(device_type: str) -> bool:
    """Whether a chapter runs its GPU-sized full recipe (one never run for the recorded numbers):
    only for the full recipe on a CUDA device, and only when ``COURSE_GPU_RECIPE=1``. On CUDA
    without it, prints that the CPU-sized full recipe runs and how to ask for the larger one."""
    asked = os.environ.get(GPU_ENV_VAR, "").strip()
    if asked not in ("", "0", "1"):
        raise ValueError(f"{GPU_ENV_VAR}={asked!r}: use 1 to run the GPU-sized recipe, 0 or unset for the recorded one")
    if device_type != "cuda" or mode() != "full":
        return False
    if asked == "1":
        print(f"{GPU_ENV_VAR}=1: running the GPU-sized full recipe, which has no recorded run to compare with")
        return True
    print(f"CUDA: running the CPU-sized full recipe (the recorded one); the GPU-sized recipe has never been "
          f"run and recorded: set {GPU_ENV_VAR}=1 to run it")
    return False


class Recipe:
    """Read-only hyper-parameters of the active recipe: attribute and item access."""

    def __init__(self, mode: str, values: dict[str, Any]):
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_values":
            # dunder look-ups (copy, pickle) and a half-built object must not recurse
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"recipe ({self.mode}) has no hyper-parameter {name!r}; "
                                 f"it has {sorted(self._values)}") from None

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __setattr__(self, name, value):
        raise AttributeError("a recipe is read-only: change it where it is defined")

    def __reduce__(self):
        # a MappingProxyType cannot be pickled or deep-copied: rebuild from a plain dict
        return (Recipe, (self.mode, dict(self._values)))

    def asdict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Recipe[{self.mode}]({items})"


def recipe(ci: dict[str, Any], full: dict[str, Any], mode_: str | None = None) -> Recipe:
    """Return the hyper-parameters of the active recipe.

    Both dicts must name the same hyper-parameters, so that a typo in one of them
    cannot silently fall back to something else.
    """
    if set(ci) != set(full):
        raise ValueError(f"the ci and full recipes name different hyper-parameters: "
                         f"only in ci {sorted(set(ci) - set(full))}, only in full {sorted(set(full) - set(ci))}")
    m = mode_ or mode()
    if m not in MODES:
        raise ValueError(f"unknown recipe {m!r}: use one of {', '.join(MODES)}")
    return Recipe(m, ci if m == "ci" else full)
