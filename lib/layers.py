"""The pieces a Transformer layer is built from, besides attention.

Interface
---------
``sinusoidal_positional_encoding(max_len, d_model) -> Tensor (max_len, d_model)``
    PE[pos, 2i] = sin(pos / 10000^(2i/d_model)),  PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).
``shift_matrix(k, d_model) -> Tensor (d_model, d_model)``
    The block-diagonal rotation M_k with ``PE[pos + k] = PE[pos] @ M_k.T`` for every ``pos``:
    the encoding of a shifted position is a *linear* function of the encoding of the position.
``PositionalEncoding(d_model, max_len=512, dropout=0.0)``
    ``forward(x, offset=0)``: ``x (B, T, d_model)`` are token embeddings that the caller has
    already scaled by sqrt(d_model); returns ``dropout(x + PE[offset : offset + T])``.
    ``offset`` is the position of ``x[:, 0]`` (incremental decoding with a KV cache).
``PositionwiseFeedForward(d_model, d_ff, dropout=0.0, activation="relu")``
    ``linear2(dropout(act(linear1(x))))``, applied to every position independently.
``ResidualBlock(d_model, dropout=0.0, norm_first=False, eps=1e-5)``
    ``forward(x, sublayer)`` with ``sublayer`` a callable ``x -> y``:
    post-LN (the paper):  ``norm(x + dropout(sublayer(x)))``;
    pre-LN (norm_first):  ``x + dropout(sublayer(norm(x)))``.
    The block owns its ``LayerNorm`` (``.norm``).
``layer_norm(d_model, eps=1e-5) -> nn.LayerNorm``  (the LayerNorm every model in ``lib`` uses).
``num_parameters(module, exclude=()) -> int``
    The parameter count behind every model's ``num_parameters(exclude_embeddings=False)``: a
    tensor shared by several modules (tied weights) counts once; ``exclude`` leaves modules out.

The dropout placement and the LayerNorm epsilon follow ``torch.nn.Transformer`` so that
``lib.models.transformer`` can be checked against it with weights copied in.

Explained in chapters/03_transformer.ipynb.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.validate import check_int

__all__ = ["sinusoidal_positional_encoding", "shift_matrix", "PositionalEncoding",
           "PositionwiseFeedForward", "ResidualBlock", "layer_norm", "num_parameters", "count_parameters",
           "ACTIVATIONS"]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "gelu": F.gelu,
    # GELU's tanh approximation (Hendrycks & Gimpel, 2016), Hugging Face's "gelu_new" (GPT-2, ALBERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def _frequencies(d_model: int) -> torch.Tensor:
    """omega_i = 1 / 10000^(2i / d_model) for i = 0 .. ceil(d_model/2) - 1 (float64)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return torch.exp(-math.log(10000.0) * two_i / d_model)


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """The sinusoidal table of Vaswani et al. (2017), shape ``(max_len, d_model)``, float32.

    Even columns hold sines, odd columns cosines, of ``pos * omega_i``. An odd ``d_model`` is
    allowed (the last column is a sine).
    """
    check_int("max_len", max_len, 1)
    check_int("d_model", d_model, 1)
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angles = pos * _frequencies(d_model)[None, :]            # (max_len, ceil(d/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def shift_matrix(k: int, d_model: int) -> torch.Tensor:
    """The matrix ``M_k`` with ``PE[pos + k] = PE[pos] @ M_k.T`` (``d_model`` even).

    Each (sin, cos) pair at frequency omega is rotated by the angle ``k * omega``:
    sin(a + b) = sin a cos b + cos a sin b,  cos(a + b) = cos a cos b - sin a sin b.
    It depends on ``k`` only, not on ``pos``.
    """
    check_int("k", k)
    check_int("d_model", d_model, 1)
    if d_model % 2:
        raise ValueError(f"d_model must be even for the (sin, cos) pairs, got {d_model}")
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    phi = k * _frequencies(d_model)
    c, s = torch.cos(phi), torch.sin(phi)
    idx = torch.arange(0, d_model, 2)
    m[idx, idx] = c            # new sin <- sin * cos(phi)
    m[idx, idx + 1] = s        #          + cos * sin(phi)
    m[idx + 1, idx] = -s       # new cos <- -sin * sin(phi)
    m[idx + 1, idx + 1] = c    #          + cos * cos(phi)
    return m


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table to (already scaled) embeddings, then dropout.

    ``forward(x, offset=0)``: ``x (B, T, d_model)``; row ``t`` gets ``PE[offset + t]``.
    The table is a non-persistent buffer (it is not in the state dict: it is a formula).
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("max_len", max_len, 1)
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be (batch, time, d_model={self.d_model}), got {shape}")
        offset = int(offset)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        T = x.shape[1]
        if offset + T > self.max_len:
            raise ValueError(f"positions {offset}..{offset + T - 1} exceed max_len={self.max_len}; "
                             "build the model with a larger max_len")
        return self.dropout(x + self.pe[offset: offset + T].to(x.dtype))


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W2 · dropout(act(W1 x + b1)) + b2, the same MLP at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("d_ff", d_ff, 1)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(ACTIVATIONS[self.activation](self.linear1(x))))


def layer_norm(d_model: int, eps: float = 1e-5) -> nn.LayerNorm:
    """LayerNorm over the last dimension (Ba et al., 2016), torch's default epsilon."""
    return nn.LayerNorm(d_model, eps=eps)


class ResidualBlock(nn.Module):
    """A residual connection around a sublayer, with LayerNorm after (post-LN) or before (pre-LN).

    post-LN (``norm_first=False``, the paper): ``y = LayerNorm(x + Dropout(F(x)))``
    pre-LN  (``norm_first=True``):            ``y = x + Dropout(F(LayerNorm(x)))``

    In pre-LN the identity path from the input to the output is never normalised, so the
    gradient reaches the early layers undiminished; that is why it trains without warmup
    more easily (Xiong et al., 2020). A pre-LN stack needs a final LayerNorm on its output.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm_first = bool(norm_first)
        self.norm = layer_norm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


def num_parameters(module: nn.Module, exclude: Iterable[nn.Module] = ()) -> int:
    """The number of parameters of ``module`` (trainable or not), a tensor shared by several
    submodules (tied weights) counted once, leaving out every parameter of the modules in ``exclude``.

    Every model in ``lib.models`` has ``num_parameters(exclude_embeddings=False)``, which calls this
    with its embedding tables (and the output projection to the vocabulary, often tied to one) as
    ``exclude`` when ``exclude_embeddings=True``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    skip = {id(p) for m in exclude for p in m.parameters()}
    return sum(p.numel() for p in module.parameters() if id(p) not in skip)


def count_parameters(model_class: Callable[..., nn.Module], cfg, exclude_embeddings: bool = False) -> int:
    """``model_class(cfg).num_parameters(exclude_embeddings)`` without allocating a weight: the model
    is built on PyTorch's ``meta`` device, where tensors have shapes but no storage (GPT-3's 175B
    are counted in milliseconds)."""
    with torch.device("meta"):
        return model_class(cfg).num_parameters(exclude_embeddings)
