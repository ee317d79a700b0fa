"""ELMo (Peters et al., 2018): deep contextualised word vectors from a bidirectional LM.

Read top to bottom, in the paper's order:

1. **Bytes of a word.** Each word is its UTF-8 bytes between a begin-of-word and an
   end-of-word marker, padded to ``max_chars``. "밥" is one syllable and three bytes
   (235 176 165): the bytes of the whole syllable, not of its jamo ㅂ ㅏ ㅂ.
   Character ids: 0 = padding, byte b -> b + 1 (1..256), 257 = begin of word,
   258 = end of word, 259 / 260 = the sentence markers ``<S>`` / ``</S>`` (each a whole
   word of its own, between the word markers).
2. **Character CNN** (:class:`CharCNN`): a byte embedding, one 1-d convolution per filter
   width, max-pooling over the positions, ReLU, highway layers
   ``y = g * relu(W_h x) + (1 - g) * x`` with ``g = sigmoid(W_g x)``, and a linear
   projection. The paper: 7 widths with 32, 32, 64, 128, 256, 512, 1024 filters
   (2048 channels), 2 highway layers, a projection to 512.
3. **Two language models** (:class:`BiLM`): a forward LSTM stack reads left to right and
   predicts the next word, a backward stack reads right to left and predicts the previous
   word. They share the token representation (the char CNN) and the softmax, and nothing
   else: no state passes between them. Every LSTM layer has ``hidden`` cells whose output
   is projected to ``proj`` dimensions (``nn.LSTM(proj_size=...)``), and from the second
   layer on a residual connection adds the layer's input (the paper: 2 layers, 4096 cells,
   512 projection).
4. **The task's scalar mix** (:class:`ScalarMix`):
   ``ELMo_k = γ · Σ_j softmax(s)_j · h_{k,j}`` over layer 0 (the char CNN output, used
   twice to match the 2·proj width) and every biLSTM layer ``[→h; ←h]``. ``s`` and ``γ`` are
   learned by the downstream task while the biLM stays frozen.

Interface
---------
``encode_word(word, max_chars) -> list[int]`` and ``encode_batch(sentences, max_chars)
    -> (chars (B, T, C), lengths (B,))``: the byte encoding (``<S>``/``</S>`` are
    ``BOS``/``EOS``; pass words, add the sentence markers yourself or with ``add_markers``).
``ELMoConfig``: sizes; ``PUBLISHED["ELMo"]`` is the published configuration.
``BiLM(cfg)``: ``layers(chars, lengths) -> list of L+1 tensors (B, T, 2·proj)``;
    ``lm_loss(chars, lengths, targets) -> (loss, (forward_loss, backward_loss))``, mean
    cross-entropy per predicted word (``targets`` (B, T) word ids of the same sentences, with
    ``<S>``/``</S>`` at both ends, padding ``-100`` or anything past ``lengths``);
    ``num_parameters(exclude_embeddings=False)`` (excluding: the byte table and the softmax).
``ScalarMix(num_layers)``: ``forward(list of tensors) -> γ·Σ softmax(s)_j h_j``; ``.weights()``.

Explained in chapters/06_transfer_elmo.ipynb.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib.config import ModelConfig
from lib.layers import num_parameters
from lib.models.bilstm_attention import reverse_padded

# PyTorch's CPU build says once per process that oneDNN has no LSTM with projections and that it
# uses its own kernel instead: the results are the same, so the notice is not shown to readers.
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN",
                        category=UserWarning)

__all__ = ["PAD", "BOW", "EOW", "BOS", "EOS", "CHAR_VOCAB", "encode_word", "encode_batch",
           "ELMoConfig", "PUBLISHED", "CharCNN", "Highway", "BiLM", "ScalarMix"]

PAD, BOW, EOW = 0, 257, 258
BOS, EOS = "<S>", "</S>"               # sentence markers (words of their own)
_SENTENCE_CHAR = {BOS: 259, EOS: 260}
CHAR_VOCAB = 261


# ----------------------------------------------------------------------------- 1. bytes
def encode_word(word: str, max_chars: int = 50) -> list[int]:
    """``[BOW, byte+1, ..., EOW, PAD, ...]`` of length ``max_chars`` (long words lose their tail)."""
    if not isinstance(word, str) or not word:
        raise ValueError(f"word must be a non-empty str, got {word!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 3:
        raise ValueError(f"max_chars must be an int >= 3 (two markers and a byte), got {max_chars!r}")
    if word in _SENTENCE_CHAR:
        body = [_SENTENCE_CHAR[word]]
    else:
        body = [b + 1 for b in word.encode("utf-8")][:max_chars - 2]
    ids = [BOW, *body, EOW]
    return ids + [PAD] * (max_chars - len(ids))


def encode_batch(sentences: list[list[str]], max_chars: int = 50, add_markers: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte ids ``(B, T, max_chars)`` of word lists (padding words are all ``PAD``) and lengths ``(B,)``."""
    if not isinstance(sentences, (list, tuple)) or not sentences:
        raise ValueError("sentences must be a non-empty list of lists of words")
    if add_markers:
        sentences = [[BOS, *s, EOS] for s in sentences]
    lengths = [len(s) for s in sentences]
    if min(lengths) == 0:
        raise ValueError(f"sentence {lengths.index(0)} has no words")
    chars = torch.full((len(sentences), max(lengths), max_chars), PAD, dtype=torch.long)
    for b, s in enumerate(sentences):
        chars[b, :len(s)] = torch.tensor([encode_word(w, max_chars) for w in s])
    return chars, torch.tensor(lengths)


# ----------------------------------------------------------------------------- config
@dataclass
class ELMoConfig(ModelConfig):
    vocab_size: int                                    # words the softmax predicts
    max_chars: int = 50                                # bytes per word, markers included
    char_dim: int = 16                                 # byte embedding
    filters: tuple = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))   # (width, channels)
    highway: int = 2
    proj: int = 512                                    # token vector and LSTM output size
    hidden: int = 4096                                 # LSTM cells per layer
    lstm_layers: int = 2
    dropout: float = 0.1
    # () : one softmax over every word (the paper). Otherwise an adaptive softmax (Grave et al., 2017)
    # with these cutoffs: the most frequent words in the head, rarer ones in clusters of smaller width,
    # still one normalised distribution over the vocabulary (word ids must run most frequent first)
    softmax_cutoffs: tuple = ()

    def __post_init__(self):
        self.filters = tuple(tuple(int(v) for v in f) for f in self.filters)
        for name in ("vocab_size", "max_chars", "char_dim", "proj", "hidden", "lstm_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ELMoConfig.{name} must be a positive int, got {value!r}")
        if not self.filters or any(len(f) != 2 or min(f) < 1 for f in self.filters):
            raise ValueError(f"ELMoConfig.filters must be (width, channels) pairs of positive ints, got {self.filters}")
        if max(w for w, _ in self.filters) > self.max_chars:
            raise ValueError(f"ELMoConfig: a filter of width {max(w for w, _ in self.filters)} is wider than "
                             f"max_chars={self.max_chars}")
        if self.proj > self.hidden:
            raise ValueError(f"ELMoConfig.proj ({self.proj}) must be <= hidden ({self.hidden}) for nn.LSTM")
        self.softmax_cutoffs = tuple(int(c) for c in self.softmax_cutoffs)
        if self.softmax_cutoffs and (list(self.softmax_cutoffs) != sorted(set(self.softmax_cutoffs))
                                     or self.softmax_cutoffs[0] < 1 or self.softmax_cutoffs[-1] >= self.vocab_size):
            raise ValueError(f"ELMoConfig.softmax_cutoffs must increase strictly within (0, vocab_size="
                             f"{self.vocab_size}), got {self.softmax_cutoffs}")
        if not 0 <= self.dropout < 1 or self.highway < 0:
            raise ValueError(f"ELMoConfig: dropout must be in [0, 1) and highway >= 0, got {self.dropout}, {self.highway}")

    @property
    def channels(self) -> int:
        return sum(c for _, c in self.filters)



# Peters et al. (2018): 2048 filters, 2 highways, 512 projection, 2 x 4096-cell LSTMs (the defaults),
# over the 793,471 words of the 1 Billion Word benchmark.
PUBLISHED: dict[str, ELMoConfig] = {"ELMo": ELMoConfig(vocab_size=793_471)}


# ----------------------------------------------------------------------------- 2. char CNN
class Highway(nn.Module):
    """``y = g * relu(W_h x) + (1 - g) * x``, ``g = sigmoid(W_g x)`` (one layer)."""

    def __init__(self, dim: int):
        super().__init__()
        self.transform, self.gate = nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.constant_(self.gate.bias, -1.0)        # start close to carrying x through

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = torch.sigmoid(self.gate(x))
        return g * F.relu(self.transform(x)) + (1 - g) * x


class CharCNN(nn.Module):
    """Byte ids ``(B, T, C)`` -> context-free token vectors ``(B, T, proj)``."""

    def __init__(self, cfg: ELMoConfig):
        super().__init__()
        self.embed = nn.Embedding(CHAR_VOCAB, cfg.char_dim, padding_idx=PAD)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.char_dim, c, kernel_size=w) for w, c in cfg.filters)
        self.highways = nn.ModuleList(Highway(cfg.channels) for _ in range(cfg.highway))
        self.proj = nn.Linear(cfg.channels, cfg.proj)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        B, T, C = chars.shape
        x = self.embed(chars.reshape(B * T, C)).transpose(1, 2)          # (B*T, char_dim, C)
        x = torch.cat([conv(x).max(dim=-1).values for conv in self.convs], dim=-1)   # max over positions
        x = F.relu(x)
        for hw in self.highways:
            x = hw(x)
        return self.proj(x).reshape(B, T, -1)


# ----------------------------------------------------------------------------- 3. the biLM
class LSTMStack(nn.Module):
    """Layers of ``nn.LSTM(proj_size=proj)``, residual from the second layer on; all layer outputs."""

    def __init__(self, cfg: ELMoConfig):
        super().__init__()
        self.layers = nn.ModuleList(nn.LSTM(cfg.proj, cfg.hidden, proj_size=cfg.proj if cfg.proj < cfg.hidden else 0,
                                            batch_first=True) for _ in range(cfg.lstm_layers))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i, lstm in enumerate(self.layers):
            h, _ = lstm(self.drop(x))
            x = h + x if i > 0 else h
            outs.append(x)
        return outs


class BiLM(nn.Module):
    def __init__(self, cfg: ELMoConfig):
        super().__init__()
        self.cfg = cfg
        self.char_cnn = CharCNN(cfg)
        self.forward_lm, self.backward_lm = LSTMStack(cfg), LSTMStack(cfg)    # separate weights
        if cfg.softmax_cutoffs:                                               # shared by both directions
            self.softmax = nn.AdaptiveLogSoftmaxWithLoss(cfg.proj, cfg.vocab_size, list(cfg.softmax_cutoffs),
                                                         div_value=4.0)
        else:
            self.softmax = nn.Linear(cfg.proj, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)

    def _check(self, chars: torch.Tensor, lengths: torch.Tensor) -> None:
        if not isinstance(chars, torch.Tensor) or chars.dim() != 3 or chars.dtype != torch.long:
            raise ValueError(f"chars must be a LongTensor (B, T, max_chars), got "
                             f"{getattr(chars, 'dtype', type(chars))} {tuple(getattr(chars, 'shape', ()))}")
        if chars.shape[2] != self.cfg.max_chars:
            raise ValueError(f"chars has {chars.shape[2]} bytes per word, the config says max_chars={self.cfg.max_chars}")
        if chars.numel() and (chars.min() < 0 or chars.max() >= CHAR_VOCAB):
            raise ValueError(f"chars must be byte ids in [0, {CHAR_VOCAB}), got {chars.min().item()}..{chars.max().item()}")
        if not isinstance(lengths, torch.Tensor) or lengths.shape != (chars.shape[0],):
            raise ValueError(f"lengths must be a tensor of shape ({chars.shape[0]},), got "
                             f"{tuple(getattr(lengths, 'shape', ()))}")
        if lengths.min() < 1 or lengths.max() > chars.shape[1]:
            raise ValueError(f"lengths must be in [1, {chars.shape[1]}], got {lengths.tolist()}")

    def _states(self, chars: torch.Tensor, lengths: torch.Tensor):
        self._check(chars, lengths)
        x = self.char_cnn(chars)                                             # (B, T, proj)
        fwd = self.forward_lm(x)                                             # reads left to right
        bwd = [reverse_padded(h, lengths) for h in self.backward_lm(reverse_padded(x, lengths))]
        return x, fwd, bwd

    def layers(self, chars: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """``[[x; x], [→h_1; ←h_1], ...]``: the L + 1 layers ELMo mixes, each ``(B, T, 2·proj)``."""
        x, fwd, bwd = self._states(chars, lengths)
        return [torch.cat([x, x], dim=-1)] + [torch.cat([f, b], dim=-1) for f, b in zip(fwd, bwd)]

    def lm_loss(self, chars: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor):
        """Mean cross-entropy of both LMs: forward predicts word t+1 from t, backward t-1 from t."""
        if targets.shape != chars.shape[:2]:
            raise ValueError(f"targets must have shape {tuple(chars.shape[:2])}, got {tuple(targets.shape)}")
        _, fwd, bwd = self._states(chars, lengths)
        T = chars.shape[1]
        real = torch.arange(T, device=chars.device)[None, :] < lengths.to(chars.device)[:, None]
        targets = targets.masked_fill(~real, -100)
        back_targets = targets[:, :-1].masked_fill(~real[:, 1:], -100)      # the predicting word must be real too
        loss_f = self._nll(self.drop(fwd[-1][:, :-1]), targets[:, 1:])      # predicts the next word
        loss_b = self._nll(self.drop(bwd[-1][:, 1:]), back_targets)         # predicts the previous word
        return (loss_f + loss_b) / 2, (loss_f, loss_b)

    def _nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood of ``targets`` (-100: not predicted) given the states ``h``."""
        h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        if isinstance(self.softmax, nn.Linear):
            return F.cross_entropy(self.softmax(h), targets, ignore_index=-100)
        keep = targets != -100                     # the adaptive softmax has no ignore_index
        with torch.autocast(h.device.type, enabled=False):      # its clusters write into one float32 output
            return self.softmax(h[keep].float(), targets[keep]).loss

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """``log p(word | state)`` over the whole vocabulary, ``(..., vocab_size)``, for either softmax."""
        if isinstance(self.softmax, nn.Linear):
            return F.log_softmax(self.softmax(h).float(), dim=-1)
        with torch.autocast(h.device.type, enabled=False):
            return self.softmax.log_prob(h.reshape(-1, h.shape[-1]).float()).reshape(*h.shape[:-1], -1)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude=(self.char_cnn.embed, self.softmax) if exclude_embeddings else ())


# ----------------------------------------------------------------------------- 4. scalar mix
class ScalarMix(nn.Module):
    """``γ · Σ_j softmax(s)_j · h_j``: s starts at 0 (equal weights), γ at 1; both learned by the task."""

    def __init__(self, num_layers: int):
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        self.s = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def weights(self) -> torch.Tensor:
        return torch.softmax(self.s, dim=0)

    def forward(self, layers) -> torch.Tensor:
        if isinstance(layers, torch.Tensor):            # stacked: (..., L, D) with L on dim -2
            if layers.dim() < 2 or layers.shape[-2] != len(self.s):
                raise ValueError(f"a stacked input must have the {len(self.s)} layers on dim -2, got {tuple(layers.shape)}")
            return self.gamma * (self.weights()[:, None] * layers).sum(dim=-2)
        if len(layers) != len(self.s):
            raise ValueError(f"expected {len(self.s)} layers, got {len(layers)}")
        if len({tuple(h.shape) for h in layers}) != 1:
            raise ValueError(f"all layers must have the same shape, got {[tuple(h.shape) for h in layers]}")
        w = self.weights()
        return self.gamma * sum(w[j] * h for j, h in enumerate(layers))
