"""A bidirectional-LSTM sentence classifier with Bahdanau (additive) attention.

The model of the chapter "Bahdanau attention with a bidirectional LSTM", top to bottom
in the order the chapter explains it:

    tokens (B, S) ──Embedding──▶ (B, S, E)
        ──BiLSTM 1──▶ (B, S, 2H) ──BiLSTM 2──▶ h_1 … h_S (B, S, 2H)      packed: padding never enters
        query s = [final forward state ; final backward state] of layer 2  (B, 2H)
        score_i = vᵀ tanh(W_q s + W_k h_i), α = masked softmax(score)       padding gets α_i = 0 exactly
        context c = Σ_i α_i h_i                                              (B, 2H)
        ──Dense 20 + ReLU──Dropout 0.5──Linear 1──▶ logit (B,)               sigmoid(logit) = P(positive)

With ``attention=False`` the same network is the baseline: the query vector ``s`` itself
(final states only) goes to the dense head, and no attention weights exist.

The model returns a logit, so train it with ``BCEWithLogitsLoss``; apply the sigmoid
only to read a probability.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lib.attention import AdditiveAttention

__all__ = ["BiLSTMConfig", "BiLSTMAttentionClassifier", "count_parameters"]


@dataclass
class BiLSTMConfig:
    vocab_size: int = 10_002          # 10,000 words + [PAD] and [UNK]
    embed_dim: int = 128
    hidden: int = 64                  # units per direction
    layers: int = 2                   # stacked bidirectional LSTMs
    attention: bool = True            # False: the final-states baseline
    attn_hidden: int = 64             # size of the additive-attention hidden layer (W_q, W_k outputs)
    dense: int = 20
    dropout: float = 0.5
    pad_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "hidden", "layers", "attn_hidden", "dense"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BiLSTMConfig.{name} must be a positive int, got {value!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"BiLSTMConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"BiLSTMConfig.pad_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}")


class BiLSTMAttentionClassifier(nn.Module):
    """Binary classifier: ``forward(tokens, lengths) -> (logits (B,), weights (B, S) or None)``."""

    def __init__(self, cfg: BiLSTMConfig):
        super().__init__()
        if not isinstance(cfg, BiLSTMConfig):
            raise TypeError(f"cfg must be a BiLSTMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.lstm = nn.LSTM(cfg.embed_dim, cfg.hidden, num_layers=cfg.layers,
                            bidirectional=True, batch_first=True)
        d = 2 * cfg.hidden
        # query = [final fwd ; final bwd] (2H), keys = layer-2 outputs h_i (2H)
        self.attention = AdditiveAttention(d, d, cfg.attn_hidden) if cfg.attention else None
        self.head = nn.Sequential(
            nn.Linear(d, cfg.dense), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.dense, 1))

    def _check(self, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
            got = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise TypeError(f"tokens must be an integer (int64/int32) tensor of ids, got {got}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq_len), got shape {tuple(tokens.shape)}")
        if not isinstance(lengths, torch.Tensor) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise TypeError("lengths must be an integer tensor of shape (batch,)")
        if lengths.shape != tokens.shape[:1]:
            raise ValueError(f"lengths must have shape (batch,)=({tokens.shape[0]},), got {tuple(lengths.shape)}")
        if tokens.shape[0] == 0:
            raise ValueError("tokens is an empty batch")
        if int(lengths.min()) < 1 or int(lengths.max()) > tokens.shape[1]:
            raise ValueError(f"lengths must be in [1, seq_len={tokens.shape[1]}], got min {int(lengths.min())} "
                             f"max {int(lengths.max())}")

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the stacked BiLSTMs on the real tokens only.

        Returns ``outputs (B, S, 2H)`` (zeros at padded positions) and the query
        ``(B, 2H)`` = last layer's final forward state ‖ final backward state.
        """
        self._check(tokens, lengths)
        x = self.embedding(tokens)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h_n, _) = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        # h_n: (layers * 2, B, H), ordered layer 0 fwd, layer 0 bwd, ..., last fwd, last bwd
        query = torch.cat([h_n[-2], h_n[-1]], dim=-1)
        return out, query

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tokens (B, S)`` ids, ``lengths (B,)`` real lengths -> ``(logits (B,), weights (B, S) | None)``."""
        out, query = self.encode(tokens, lengths)
        if self.attention is None:
            features, weights = query, None
        else:
            mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths.to(tokens.device)[:, None]
            features, weights = self.attention(query, out, mask)
        return self.head(features).squeeze(-1), weights


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
