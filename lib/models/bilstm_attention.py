"""A bidirectional-LSTM sentence classifier with Bahdanau (additive) attention.

The model of the chapter "Bahdanau attention with a bidirectional LSTM", top to bottom
in the order the chapter explains it:

    tokens (B, S) ──Embedding──▶ (B, S, E)
        ──BiLSTM 1──▶ (B, S, 2H) ──BiLSTM 2──▶ h_1 … h_S (B, S, 2H)   padding never enters a state
        query s = [final forward state ; final backward state] of layer 2  (B, 2H)
        score_i = vᵀ tanh(W_q s + W_k h_i), α = masked softmax(score)     padding gets α_i = 0 exactly
        context c = Σ_i α_i h_i                                            (B, 2H)
        ──Dense 20 + ReLU──Dropout 0.5──Linear 1──▶ logit (B,)             sigmoid(logit) = P(positive)

With ``attention=False`` the same network is the baseline: the query vector ``s`` itself
(final states only) goes to the dense head, and no attention weights exist.

Padding. Sequences are right-padded. A forward LSTM reads left to right, so its outputs at
the real positions never see the padding that follows them. For the backward direction we
reverse the *real part* of every sequence (padding stays at the end), run a forward LSTM
over that, and reverse its outputs back. This computes exactly what
``pack_padded_sequence`` + a bidirectional ``nn.LSTM`` computes (a test checks it), but it
runs the dense cuDNN/oneDNN kernels: on a CPU the packed path is 10-20x slower.

The model returns a logit, so train it with ``BCEWithLogitsLoss``; apply the sigmoid
only to read a probability.

Explained in chapters/02_bahdanau_imdb.ipynb, which trains it on IMDB (English words) and on
NSMC (Korean WordPiece pieces).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from lib.config import ModelConfig
from lib.attention import AdditiveAttention, padding_mask
from lib.layers import num_parameters
from lib.validate import check_bool, check_int, check_probability, check_tensor

__all__ = ["BiLSTMConfig", "reverse_padded", "BiLSTM", "BiLSTMAttentionClassifier"]


@dataclass
class BiLSTMConfig(ModelConfig):
    vocab_size: int = 10_007          # 7 special tokens + 10,000 words (lib.text.WordVocab)
    embed_dim: int = 128
    hidden: int = 64                  # units per direction
    layers: int = 2                   # stacked bidirectional LSTMs
    attention: bool = True            # False: the final-states baseline
    attn_hidden: int = 64             # size of W_q s + W_k h_i in the additive score
    dense: int = 20
    dropout: float = 0.5
    pad_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "hidden", "layers", "attn_hidden", "dense"):
            check_int(f"BiLSTMConfig.{name}", getattr(self, name), 1)
        check_bool("BiLSTMConfig.attention", self.attention)
        check_probability("BiLSTMConfig.dropout", self.dropout, allow_one=False)
        check_int("BiLSTMConfig.pad_id", self.pad_id, 0, self.vocab_size - 1)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse the first ``lengths[b]`` steps of every sequence of ``x (B, S, D)``; padding stays put.

    ``[a, b, c, PAD] -> [c, b, a, PAD]``. Applying it twice gives ``x`` back.
    """
    B, S = x.shape[:2]
    t = torch.arange(S, device=x.device)[None, :]
    lengths = lengths.to(x.device)[:, None]
    idx = torch.where(t < lengths, lengths - 1 - t, t)                       # (B, S)
    return x.gather(1, idx[:, :, None].expand(B, S, x.shape[2]))


class BiLSTM(nn.Module):
    """Stacked bidirectional LSTM over right-padded batches.

    ``forward(x (B, S, D), lengths (B,))`` -> ``outputs (B, S, 2H)`` (zeros at padding) and
    ``final (B, 2H)`` = last layer's final forward state ‖ final backward state, where the
    forward state is read after the last *real* token and the backward one after the first.
    """

    def __init__(self, input_size: int, hidden: int, layers: int):
        super().__init__()
        sizes = [input_size] + [2 * hidden] * (layers - 1)
        self.fwd = nn.ModuleList(nn.LSTM(d, hidden, batch_first=True) for d in sizes)
        self.bwd = nn.ModuleList(nn.LSTM(d, hidden, batch_first=True) for d in sizes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = padding_mask(lengths.to(x.device), x.shape[1])[:, :, None].to(x.dtype)    # (B, S, 1)
        last = (lengths.to(x.device) - 1)[:, None, None]
        for fwd, bwd in zip(self.fwd, self.bwd):
            out_f, _ = fwd(x)                                           # real steps never see padding
            out_b_rev, _ = bwd(reverse_padded(x, lengths))
            final_f = out_f.gather(1, last.expand(-1, 1, out_f.shape[2])).squeeze(1)
            final_b = out_b_rev.gather(1, last.expand(-1, 1, out_b_rev.shape[2])).squeeze(1)
            x = torch.cat([out_f, reverse_padded(out_b_rev, lengths)], dim=-1) * mask
        return x, torch.cat([final_f, final_b], dim=-1)


class BiLSTMAttentionClassifier(nn.Module):
    """Binary classifier: ``forward(tokens, lengths) -> (logits (B,), weights (B, S) or None)``."""

    def __init__(self, cfg: BiLSTMConfig):
        super().__init__()
        if not isinstance(cfg, BiLSTMConfig):
            raise TypeError(f"cfg must be a BiLSTMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id)
        self.bilstm = BiLSTM(cfg.embed_dim, cfg.hidden, cfg.layers)
        d = 2 * cfg.hidden
        # query s = [final fwd ; final bwd] (2H); keys h_i = the last layer's outputs (2H)
        self.attention = AdditiveAttention(d, d, cfg.attn_hidden) if cfg.attention else None
        self.head = nn.Sequential(
            nn.Linear(d, cfg.dense), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.dense, 1))

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters; ``exclude_embeddings=True`` leaves out the word embedding table."""
        return num_parameters(self, (self.embedding,) if exclude_embeddings else ())

    def _check(self, tokens, lengths) -> None:
        check_tensor("tokens", tokens, dtype=(torch.int64, torch.int32), dim=2, what="(batch, seq_len)")
        if tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(f"tokens is empty: shape {tuple(tokens.shape)}")
        check_tensor("lengths", lengths, dtype="int", shape=(tokens.shape[0],), what="(batch,)")
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 1 or hi > tokens.shape[1]:
            raise ValueError(f"lengths must lie in [1, seq_len={tokens.shape[1]}], got min {lo}, max {hi}")

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tokens (B, S)`` right-padded ids, ``lengths (B,)`` real lengths.

        Returns ``(logits (B,), weights (B, S))``; ``weights`` is None for the baseline.
        """
        self._check(tokens, lengths)
        lengths = lengths.to(tokens.device)
        outputs, query = self.bilstm(self.embedding(tokens), lengths)
        if self.attention is None:
            features, weights = query, None
        else:
            mask = padding_mask(lengths, tokens.shape[1])                     # True at real tokens
            features, weights = self.attention(query, outputs, mask)
        return self.head(features).squeeze(-1), weights
