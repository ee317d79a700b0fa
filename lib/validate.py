"""Argument checks shared by the whole of ``lib``: one place for the messages a reader sees.

Every check names the argument, says what was expected and what was given, and returns
the value (converted where that is harmless, e.g. a numpy integer to ``int``), so it can be
used inline::

    batch_size = check_int("batch_size", batch_size, minimum=1)
    p = check_probability("dropout", dropout, allow_one=False)
    check_tensor("src", src, dtype="int", dim=2)

The convention (CONTRIBUTING.md): a value of the wrong *type* raises ``TypeError``, a value
of the right type outside its range raises ``ValueError``.

=====================  ===========================================================
``check_int``          an int (numpy integers too, never a bool), optional bounds
``check_float``        a finite real number (ints accepted), optional bounds
``check_probability``  a number in [0, 1] (or [0, 1) with ``allow_one=False``)
``check_bool``         exactly True or False
``check_choice``       one of a fixed set of values
``check_callable``     something callable
``check_tensor``       a ``torch.Tensor`` of a dtype kind, number of dims and shape
``check_token_ids``    a ``(batch, time)`` tensor of token ids, in the vocabulary's range
``check_id_list``      one sequence of ids (list, tuple, 1-D tensor or array) -> ``list[int]``
=====================  ===========================================================
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Sequence

import torch

__all__ = ["check_int", "check_float", "check_probability", "check_bool", "check_choice",
           "check_callable", "check_tensor", "check_token_ids", "check_id_list"]


def _none_ok(allow_none: bool) -> str:
    return " or None" if allow_none else ""


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
              allow_none: bool = False) -> int | None:
    """``value`` as an ``int``: an int or numpy integer (not a bool) in ``[minimum, maximum]``.

    ``TypeError`` for anything else (a float such as ``2.0`` included), ``ValueError`` when it is
    out of range. ``allow_none=True`` lets ``None`` through (returned as is)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{_none_ok(allow_none)}, got {type(value).__name__} ({value!r})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float(name: str, value: Any, minimum: float | None = None, maximum: float | None = None, *,
                positive: bool = False, allow_none: bool = False) -> float | None:
    """``value`` as a ``float``: a finite real number (int, float, numpy scalar; not a bool) in
    ``[minimum, maximum]``, and ``> 0`` with ``positive=True``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number{_none_ok(allow_none)}, got {type(value).__name__} ({value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_probability(name: str, value: Any, *, allow_one: bool = True, allow_none: bool = False) -> float | None:
    """A number in ``[0, 1]``, or ``[0, 1)`` with ``allow_one=False`` (a dropout rate)."""
    value = check_float(name, value, allow_none=allow_none)
    if value is None:
        return None
    if not (0.0 <= value <= 1.0) or (value == 1.0 and not allow_one):
        raise ValueError(f"{name} must be in [0, 1{']' if allow_one else ')'}, got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Exactly ``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    choices = tuple(choices)
    if not any(value == c and type(value) is type(c) for c in choices):
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def check_callable(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """Something callable (a function, a lambda, an object with ``__call__``)."""
    if value is None and allow_none:
        return None
    if not callable(value):
        raise TypeError(f"{name} must be callable{_none_ok(allow_none)}, got {type(value).__name__}")
    return value


_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_KINDS = {
    "float": ("a floating-point", lambda d: d.is_floating_point),
    "int": ("an integer", lambda d: d in _INT_DTYPES),
    "bool": ("a boolean (torch.bool)", lambda d: d == torch.bool),
}


def check_tensor(name: str, x: Any, *, dtype: str | torch.dtype | Sequence[torch.dtype] | None = None,
                 dim: int | None = None, min_dim: int | None = None,
                 shape: Sequence[int | None] | None = None, what: str = "") -> torch.Tensor:
    """A ``torch.Tensor`` with the expected dtype and shape; returns it.

    dtype    ``"float"`` (any floating point), ``"int"`` (any integer type), ``"bool"``, a
             ``torch.dtype`` or a tuple of them.
    dim      the exact number of dimensions; ``min_dim``: at least that many.
    shape    the exact shape, ``None`` where any size goes (so also the number of dims).
    what     how the dimensions read in a message, e.g. ``"(batch, time)"``.

    ``TypeError`` when ``x`` is not a tensor or has the wrong dtype, ``ValueError`` for the shape.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtype is not None:
        if isinstance(dtype, str):
            if dtype not in _KINDS:
                raise ValueError(f"check_tensor: dtype must be one of {sorted(_KINDS)} or a torch.dtype, got {dtype!r}")
            words, ok = _KINDS[dtype]
            if not ok(x.dtype):
                raise TypeError(f"{name} must be {words} tensor, got dtype {x.dtype}")
        else:
            allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
            if x.dtype not in allowed:
                raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in allowed)}, got {x.dtype}")
    if shape is not None:
        if x.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, x.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
            raise ValueError(f"{name} must have shape {what + '=' if what else ''}{want}, got {tuple(x.shape)}")
    elif dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be {what or f'{dim}-D'}, got shape {tuple(x.shape)}")
    if min_dim is not None and x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def check_token_ids(name: str, x: Any, vocab_size: int | None = None, *, shape: Sequence[int] | None = None,
                    allow_empty: bool = False) -> torch.Tensor:
    """A ``(batch, time)`` integer tensor of token ids; returns it. Every model's inputs go through it.

    vocab_size   the ids must lie in ``[0, vocab_size)``. Checked on CPU tensors only: on a GPU,
                 reading the range back would stall every step (the embedding asserts there).
    shape        the exact shape (e.g. that of ``input_ids`` for ``token_type_ids``).
    allow_empty  accept a sequence of no positions (``time = 0``).
    """
    check_tensor(name, x, dtype="int", shape=shape, dim=None if shape is not None else 2,
                 what="(batch, time) token ids")
    if not allow_empty and x.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one position, got shape {tuple(x.shape)}")
    if vocab_size is not None and x.numel() and not x.is_cuda:
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must be ids in [0, {vocab_size}), got {low}..{high}")
    return x


def check_id_list(name: str, ids: Any, minimum: int | None = None) -> list[int]:
    """One sequence of token ids (a list, tuple, 1-D tensor or numpy array of ints) as ``list[int]``;
    ``minimum``: the smallest id allowed (e.g. 0)."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got a tensor of shape {tuple(ids.shape)}")
        if ids.is_floating_point():
            raise TypeError(f"{name} must hold integer ids, got dtype {ids.dtype}")
        ids = ids.tolist()
    elif hasattr(ids, "ndim") and hasattr(ids, "tolist"):  # numpy array
        if ids.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got an array of shape {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of int ids, got {type(ids).__name__}")
    # plain ints in range pass as they are (this runs on every batch a loader pads); anything else
    # goes through check_int, which converts an integer scalar or says what is wrong
    return [t if type(t) is int and (minimum is None or t >= minimum) else check_int(f"{name}[{i}]", _as_index(t), minimum)
            for i, t in enumerate(ids)]


def _as_index(value: Any) -> Any:
    # a 0-d integer tensor (an element of a list of tensors) as an int; anything else unchanged
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        return int(value)
    return value
