"""RNN encoder–decoder, with and without attention.

Two models share one encoder and differ only in how the decoder sees the source:

* ``FixedContextDecoder`` (Sutskever et al., 2014; Cho et al., 2014): the whole source
  sentence is squeezed into one vector ``c``, the encoder's final hidden state. ``c``
  starts the decoder and is fed to it again at every step.
* ``LuongDecoder`` (Luong et al., 2015, global attention with the "dot" score): at every
  step t the decoder state ``s_t`` scores every encoder state ``h_i`` with ``s_t · h_i``,
  a masked softmax turns the scores into the attention distribution ``a_t``, the context
  is the weighted sum ``c_t = Σ_i a_ti h_i``, and the output is
  ``h̃_t = tanh(W_c [c_t; s_t])`` followed by a linear layer to the vocabulary.

The fixed-context decoder computes its output the same way, ``tanh(W_c [c; s_t])``, so the
only difference between the two models is a fixed ``c`` against an attended ``c_t``.
Neither feeds ``h̃_{t-1}`` back into the next input ("input feeding"), so the teacher-forced
forward pass runs the decoder RNN over the whole target in one call, and decoding one
token at a time with ``forward`` on length-1 inputs gives the same numbers.

Conventions: batch-first tensors; ``src (B, S)`` and ``tgt (B, T)`` are integer ids padded
with ``pad_id``; ``src_len (B,)`` are the true source lengths; masks are bool, True at
real tokens (see ``lib.attention``).

    cfg = Seq2SeqConfig(src_vocab_size=8000, tgt_vocab_size=8000, attention=True)
    model = Seq2Seq(cfg)
    src, src_len, tgt_in, tgt_out = collate(pairs, cfg)         # teacher-forcing shift
    loss = model.loss(src, src_len, tgt_in, tgt_out)            # padding ignored
    tokens, attn = model.greedy_decode(src, src_len, max_len=30)

Explained in chapters/01_seq2seq_attention.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lib.config import ModelConfig
from lib.attention import DotAttention, padding_mask
from lib.layers import num_parameters
from lib.validate import check_choice, check_int, check_probability, check_tensor, check_token_ids
from lib.text import collate_pairs

__all__ = ["Seq2SeqConfig", "Encoder", "FixedContextDecoder", "LuongDecoder", "Memory",
           "Seq2Seq", "collate", "strip_special"]


# ----------------------------------------------------------------------------- config

@dataclass
class Seq2SeqConfig(ModelConfig):
    src_vocab_size: int
    tgt_vocab_size: int
    emb_dim: int = 128
    hidden_dim: int = 256
    num_layers: int = 1
    cell: str = "gru"            # "gru" or "lstm"
    attention: bool = True       # False: one fixed context vector
    dropout: float = 0.0
    pad_id: int = 0              # lib.text.SPECIAL_TOKENS order: pad 0, unk 1, bos 2, eos 3
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "emb_dim", "hidden_dim", "num_layers"):
            check_int(f"Seq2SeqConfig.{name}", getattr(self, name), 1)
        check_choice("Seq2SeqConfig.cell", self.cell, ("gru", "lstm"))
        check_probability("Seq2SeqConfig.dropout", self.dropout, allow_one=False)



def _rnn(cfg: Seq2SeqConfig, input_size: int) -> nn.RNNBase:
    cls = nn.GRU if cfg.cell == "gru" else nn.LSTM
    return cls(input_size, cfg.hidden_dim, num_layers=cfg.num_layers, batch_first=True,
               dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)


def _top_hidden(state) -> torch.Tensor:
    """The last layer's hidden state ``(B, H)`` of a GRU state or an LSTM ``(h, c)`` pair."""
    h = state[0] if isinstance(state, tuple) else state
    return h[-1]


# ----------------------------------------------------------------------------- checks

def _check_ids(name: str, x, batch: int | None = None) -> None:
    check_token_ids(name, x, allow_empty=True)
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name} has batch size {x.shape[0]}, but src has {batch}")


def _check_lengths(src: torch.Tensor, src_len) -> torch.Tensor:
    check_tensor("src_len", src_len, shape=(src.shape[0],), what="(batch,)")
    if src_len.numel() and (int(src_len.min()) < 1 or int(src_len.max()) > src.shape[1]):
        raise ValueError(f"src_len must be between 1 and the padded source length {src.shape[1]}, "
                         f"got min {int(src_len.min())}, max {int(src_len.max())}")
    return src_len


# ----------------------------------------------------------------------------- modules

class Encoder(nn.Module):
    """Embedding + GRU/LSTM over the source; packed, so padding never enters the RNN."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.src_vocab_size, cfg.emb_dim, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = _rnn(cfg, cfg.emb_dim)

    def forward(self, src: torch.Tensor, src_len: torch.Tensor):
        """-> ``outputs (B, S, H)`` (zeros at padded positions) and the final state."""
        x = self.drop(self.embed(src))
        packed = pack_padded_sequence(x, src_len.cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return out, state


class Memory(NamedTuple):
    """What the decoder may read about the source."""
    outputs: torch.Tensor      # (B, S, H) encoder states h_i
    mask: torch.Tensor         # (B, S) bool, True at real source tokens
    context: torch.Tensor      # (B, H) the final encoder state: the fixed context vector
    state: object              # the encoder's final RNN state (starts the decoder)


class FixedContextDecoder(nn.Module):
    """Sees the source only through ``c`` = the encoder's final state.

    ``s_t = RNN([emb(y_{t-1}); c], s_{t-1})``, ``s_0`` = encoder final state,
    ``logits_t = W_o tanh(W_c [c; s_t])``.
    """

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.tgt_vocab_size, cfg.emb_dim, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = _rnn(cfg, cfg.emb_dim + cfg.hidden_dim)
        self.combine = nn.Linear(2 * cfg.hidden_dim, cfg.hidden_dim)      # W_c
        self.out = nn.Linear(cfg.hidden_dim, cfg.tgt_vocab_size)          # W_o

    def forward(self, tgt_in: torch.Tensor, state, memory: Memory):
        """``tgt_in (B, T)`` -> ``h̃ (B, T, H)``, new state, ``None`` (no attention).

        ``self.out(h̃)`` gives the logits; ``Seq2Seq`` applies it (only where the loss needs it)."""
        e = self.drop(self.embed(tgt_in))
        c = memory.context[:, None, :].expand(-1, tgt_in.shape[1], -1)
        s, state = self.rnn(torch.cat([e, c], dim=-1), state)
        h_tilde = torch.tanh(self.combine(torch.cat([c, s], dim=-1)))
        return self.drop(h_tilde), state, None


class LuongDecoder(nn.Module):
    """Global attention with the dot score (Luong et al., 2015).

    ``s_t = RNN(emb(y_{t-1}), s_{t-1})``; ``a_t = masked_softmax(s_t · h_i)``;
    ``c_t = Σ_i a_ti h_i``; ``logits_t = W_o tanh(W_c [c_t; s_t])``.
    """

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.tgt_vocab_size, cfg.emb_dim, padding_idx=cfg.pad_id)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = _rnn(cfg, cfg.emb_dim)
        self.attention = DotAttention()
        self.combine = nn.Linear(2 * cfg.hidden_dim, cfg.hidden_dim)      # W_c
        self.out = nn.Linear(cfg.hidden_dim, cfg.tgt_vocab_size)          # W_o

    def forward(self, tgt_in: torch.Tensor, state, memory: Memory):
        """``tgt_in (B, T)`` -> ``h̃ (B, T, H)``, new state, ``weights (B, T, S)``."""
        e = self.drop(self.embed(tgt_in))
        s, state = self.rnn(e, state)                                      # (B, T, H)
        context, weights = self.attention(s, memory.outputs, memory.mask)  # (B, T, H), (B, T, S)
        h_tilde = torch.tanh(self.combine(torch.cat([context, s], dim=-1)))
        return self.drop(h_tilde), state, weights


class Seq2Seq(nn.Module):
    """Encoder + one of the two decoders, with a teacher-forced loss and greedy decoding."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = LuongDecoder(cfg) if cfg.attention else FixedContextDecoder(cfg)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """All parameters; ``exclude_embeddings=True`` leaves out the source and target embedding
        tables and the output layer to the target vocabulary."""
        d = self.decoder
        return num_parameters(self, (self.encoder.embed, d.embed, d.out) if exclude_embeddings else ())

    def encode(self, src: torch.Tensor, src_len: torch.Tensor | None = None) -> Memory:
        _check_ids("src", src)
        if src_len is None:
            src_len = (src != self.cfg.pad_id).sum(dim=1)
        src_len = _check_lengths(src, src_len)
        outputs, state = self.encoder(src, src_len)
        mask = padding_mask(src_len.to(src.device), src.shape[1])
        return Memory(outputs, mask, _top_hidden(state), state)

    def forward(self, src: torch.Tensor, src_len: torch.Tensor | None, tgt_in: torch.Tensor):
        """Teacher forcing: the decoder reads the true previous tokens ``tgt_in`` (BOS y_1 … y_{T-1}).

        Returns ``logits (B, T, V)`` and the attention weights ``(B, T, S)`` (``None`` without attention).
        """
        _check_ids("src", src)
        _check_ids("tgt_in", tgt_in, batch=src.shape[0])
        memory = self.encode(src, src_len)
        h_tilde, _, weights = self.decoder(tgt_in, memory.state, memory)
        return self.decoder.out(h_tilde), weights

    def loss(self, src, src_len, tgt_in, tgt_out) -> torch.Tensor:
        """Mean cross-entropy over the real target tokens (padding in ``tgt_out`` is ignored)."""
        _check_ids("src", src)
        _check_ids("tgt_out", tgt_out)
        if tgt_out.shape != tgt_in.shape:
            raise ValueError(f"tgt_out {tuple(tgt_out.shape)} must have the shape of tgt_in {tuple(tgt_in.shape)}")
        _check_ids("tgt_in", tgt_in, batch=src.shape[0])
        memory = self.encode(src, src_len)
        h_tilde, _, _ = self.decoder(tgt_in, memory.state, memory)
        real = tgt_out != self.cfg.pad_id                 # the output layer (the costly part on
        logits = self.decoder.out(h_tilde[real])          # a CPU) runs on real tokens only
        return F.cross_entropy(logits, tgt_out[real])

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, src_len: torch.Tensor | None = None, max_len: int = 50):
        """Pick the most likely token at every step, feeding it back in, until EOS or ``max_len``.

        Returns ``tokens (B, T)`` (T <= max_len; the EOS is kept, positions after it are
        ``pad_id``) and the attention weights ``(B, T, S)`` (zero rows after EOS), or ``None``
        for the fixed-context model.
        """
        check_int("max_len", max_len, 1)
        cfg = self.cfg
        memory = self.encode(src, src_len)
        B = src.shape[0]
        y = torch.full((B, 1), cfg.bos_id, dtype=torch.long, device=src.device)
        state = memory.state
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        tokens, weights = [], []
        for _ in range(max_len):
            h_tilde, state, w = self.decoder(y, state, memory)
            y = self.decoder.out(h_tilde[:, -1]).argmax(dim=-1, keepdim=True)   # (B, 1)
            y = y.masked_fill(done[:, None], cfg.pad_id)
            tokens.append(y)
            if w is not None:
                weights.append(w * (~done)[:, None, None].to(w.dtype))
            done = done | (y[:, 0] == cfg.eos_id)
            if bool(done.all()):
                break
        tokens = torch.cat(tokens, dim=1)
        return tokens, (torch.cat(weights, dim=1) if weights else None)


# ----------------------------------------------------------------------------- batching

def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], cfg: Seq2SeqConfig):
    """List of ``(src_ids, tgt_ids)`` -> ``src, src_len, tgt_in, tgt_out`` (``lib.text.collate_pairs``).

    The teacher-forcing shift: ``tgt_in = [BOS] + y`` and ``tgt_out = y + [EOS]``, so the
    decoder learns to predict token t from the true tokens before it.
    """
    pairs = list(pairs)
    for i, pair in enumerate(pairs):
        if len(pair[0]) == 0:
            raise ValueError(f"pair {i} has an empty source sentence (the encoder needs at least one token)")
    return collate_pairs(cfg.pad_id, cfg.bos_id, cfg.eos_id)(pairs)


def strip_special(ids: Sequence[int], cfg: Seq2SeqConfig) -> list[int]:
    """Token ids up to (not including) the first EOS, without BOS/pad."""
    out = []
    for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
        if i == cfg.eos_id:
            break
        if i not in (cfg.pad_id, cfg.bos_id):
            out.append(i)
    return out
