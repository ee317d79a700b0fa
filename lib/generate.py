"""Decoding an encoder-decoder model: greedy, beam search, top-k and nucleus sampling, KV cache.

Every function works with any model that has the interface of
:class:`lib.models.transformer.Transformer`::

    memory = model.encode(src, src_key_padding_mask)          # (B, S, d_model)
    logits, cache = model.decode(tgt, memory, memory_key_padding_mask, cache=None)

and takes ``use_cache``:

* ``use_cache=False`` feeds the whole target prefix at every step (``cache=None``) and keeps
  the logits of the last position: ``T`` steps cost ``O(T^2)`` decoder positions.
* ``use_cache=True`` feeds ``[BOS]`` once, keeps the cache the model returns (the keys and
  values of every decoder layer so far) and then feeds only the newest token: ``O(T)``.

Both give the same tokens; the tests check it for every decoder here.

All decoders return the generated tokens **without** the start token. A sequence that
produced ``eos_id`` keeps it and is padded with ``pad_id`` after it.

* :func:`greedy`: argmax at every step.
* :func:`beam_search`: the ``num_beams`` best prefixes, scored by log-probability divided
  by the GNMT length penalty ``((5 + |Y|) / 6) ** length_penalty`` (Wu et al., 2016).
* :func:`sample`: draw from ``softmax(logits / temperature)``, optionally restricted to the
  ``top_k`` most likely tokens (Fan et al., 2018) and/or to the smallest set of tokens whose
  probability adds up to at least ``top_p`` (nucleus sampling, Holtzman et al., 2020).
  Pass a seeded ``torch.Generator`` to make it reproducible.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["greedy", "beam_search", "sample", "top_k_filter", "top_p_filter", "length_penalty",
           "reorder_cache", "generate"]


# ----------------------------------------------------------------------------- checks

def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_src(src: Any, src_key_padding_mask: Any) -> None:
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src must be a torch.Tensor of token ids (B, S), got {type(src).__name__}")
    if src.dim() != 2:
        raise ValueError(f"src must be (batch, source length), got shape {tuple(src.shape)}")
    if src.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
        raise TypeError(f"src must hold integer token ids, got dtype {src.dtype}")
    if src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(f"src must not be empty, got shape {tuple(src.shape)}")
    if src_key_padding_mask is not None:
        if not isinstance(src_key_padding_mask, torch.Tensor) or src_key_padding_mask.dtype != torch.bool:
            raise TypeError("src_key_padding_mask must be a bool tensor (True = real token), got "
                            f"{getattr(src_key_padding_mask, 'dtype', type(src_key_padding_mask).__name__)}")
        if src_key_padding_mask.shape != src.shape:
            raise ValueError(f"src_key_padding_mask must have the shape of src {tuple(src.shape)}, "
                             f"got {tuple(src_key_padding_mask.shape)}")


def _check_model(model: Any) -> None:
    for attr in ("encode", "decode"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(f"model must have encode(src, src_key_padding_mask) and "
                            f"decode(tgt, memory, memory_key_padding_mask, cache) methods; "
                            f"{type(model).__name__} has no {attr}()")


def _check_ids(bos_id: Any, eos_id: Any, pad_id: Any) -> None:
    _check_int("bos_id", bos_id, 0)
    if eos_id is not None:
        _check_int("eos_id", eos_id, 0)
    _check_int("pad_id", pad_id, 0)


def _default_pad_id(model: Any, pad_id: int | None) -> int:
    if pad_id is not None:
        return pad_id
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    return int(getattr(cfg, "pad_id", 0) or 0)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({value!r})")


# ----------------------------------------------------------------------------- the cache

def reorder_cache(cache: Any, index: torch.Tensor, batch_size: int, model: Any = None) -> Any:
    """Select rows ``index`` (dim 0) of every tensor in ``cache`` whose dim 0 is ``batch_size``.

    Beam search uses it to follow the beams that survive a step. The cache may be any nesting
    of lists, tuples, dicts and dataclasses/objects holding tensors; non-tensors (e.g. a cached
    length) are kept. A model with a ``reorder_cache(cache, index)`` method, or a cache with a
    ``reorder(index)`` method (``lib.models.transformer.KVCache``), is asked instead.
    """
    if model is not None and callable(getattr(model, "reorder_cache", None)):
        return model.reorder_cache(cache, index)
    if callable(getattr(cache, "reorder", None)):                 # e.g. lib.models.transformer.KVCache
        return cache.reorder(index)
    return _reorder(cache, index, batch_size, set())


def _reorder(obj: Any, index: torch.Tensor, batch_size: int, seen: set) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.dim() > 0 and obj.shape[0] == batch_size:
            return obj.index_select(0, index.to(obj.device))
        return obj
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    if isinstance(obj, dict):
        return type(obj)((k, _reorder(v, index, batch_size, seen)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):        # namedtuple
        return type(obj)(*(_reorder(v, index, batch_size, seen) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_reorder(v, index, batch_size, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _reorder(getattr(obj, f.name), index, batch_size, seen)
                                           for f in dataclasses.fields(obj) if f.init})
    if hasattr(obj, "__dict__") and id(obj) not in seen:           # a plain cache object: update in place
        seen.add(id(obj))
        for k, v in vars(obj).items():
            setattr(obj, k, _reorder(v, index, batch_size, seen))
        return obj
    return obj


class _Stepper:
    """Runs the decoder one token at a time, with or without a cache; same logits either way."""

    def __init__(self, model, memory, memory_mask, use_cache: bool):
        self.model, self.memory, self.memory_mask, self.use_cache = model, memory, memory_mask, use_cache
        self.cache = None
        self.prefix: torch.Tensor | None = None     # (N, t) all tokens fed so far

    def step(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``new_tokens`` (N,) and return the next-token logits (N, V)."""
        new_tokens = new_tokens[:, None]
        self.prefix = new_tokens if self.prefix is None else torch.cat([self.prefix, new_tokens], dim=1)
        if self.use_cache:
            tgt = self.prefix if self.cache is None else new_tokens
            logits, cache = self.model.decode(tgt, self.memory, self.memory_mask, cache=self.cache)
            if cache is None:
                raise RuntimeError("use_cache=True but model.decode(..., cache=None) returned no cache; "
                                   "use use_cache=False with this model")
            self.cache = cache
        else:
            logits, _ = self.model.decode(self.prefix, self.memory, self.memory_mask, cache=None)
        if logits.dim() != 3 or logits.shape[0] != self.prefix.shape[0]:
            raise RuntimeError(f"model.decode must return logits (batch, time, vocab), got {tuple(logits.shape)}")
        return logits[:, -1, :].float()

    def reorder(self, index: torch.Tensor) -> None:
        n = self.prefix.shape[0]
        self.prefix = self.prefix.index_select(0, index)
        if self.cache is not None:
            self.cache = reorder_cache(self.cache, index, n, self.model)


def _encode(model, src, src_key_padding_mask, pad_id):
    if src_key_padding_mask is None:
        src_key_padding_mask = src != pad_id
    memory = model.encode(src, src_key_padding_mask)
    return memory, src_key_padding_mask


# ----------------------------------------------------------------------------- greedy and sampling

def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of the last dimension; set the rest to ``-inf``."""
    _check_int("top_k", k, 1)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability sums to >= ``p``.

    A token is dropped when the tokens more likely than it already reach ``p``; the most likely
    token is always kept. The rest get ``-inf``.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"top_p must be a float in (0, 1], got {type(p).__name__}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs            # probability of the strictly more likely tokens
    drop_sorted = before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@torch.no_grad()
def _decode_loop(model, src, choose, *, bos_id, eos_id, pad_id, max_new_tokens, min_new_tokens,
                 src_key_padding_mask, use_cache):
    memory, mem_mask = _encode(model, src, src_key_padding_mask, pad_id)
    B = src.shape[0]
    stepper = _Stepper(model, memory, mem_mask, use_cache)
    tokens = torch.full((B,), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out = []
    for t in range(max_new_tokens):
        logits = stepper.step(tokens)
        if eos_id is not None and t < min_new_tokens:
            logits[:, eos_id] = float("-inf")
        nxt = choose(logits)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out.append(nxt)
        if eos_id is not None:
            done = done | (nxt == eos_id)
            if bool(done.all()):
                break
        tokens = nxt
    if not out:
        return torch.empty(B, 0, dtype=torch.long, device=src.device)
    return torch.stack(out, dim=1)


def _common_checks(model, src, src_key_padding_mask, bos_id, eos_id, pad_id, max_new_tokens,
                   min_new_tokens, use_cache):
    _check_model(model)
    _check_src(src, src_key_padding_mask)
    _check_ids(bos_id, eos_id, pad_id)
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("min_new_tokens", min_new_tokens, 0)
    if min_new_tokens > max_new_tokens:
        raise ValueError(f"min_new_tokens={min_new_tokens} is larger than max_new_tokens={max_new_tokens}")
    _check_bool("use_cache", use_cache)


def greedy(model, src: torch.Tensor, *, bos_id: int, eos_id: int | None, max_new_tokens: int,
           pad_id: int | None = None, src_key_padding_mask: torch.Tensor | None = None,
           use_cache: bool = True, min_new_tokens: int = 0) -> torch.Tensor:
    """Greedy decoding: the most likely token at every step. Returns ``(B, T)`` token ids.

    ``eos_id=None`` ignores the end token and always produces ``max_new_tokens`` tokens
    (used by the KV-cache benchmark). ``src_key_padding_mask`` defaults to ``src != pad_id``,
    and ``pad_id`` to ``model.cfg.pad_id`` (else 0).
    """
    pad_id = _default_pad_id(model, pad_id)
    _common_checks(model, src, src_key_padding_mask, bos_id, eos_id, pad_id, max_new_tokens,
                   min_new_tokens, use_cache)
    return _decode_loop(model, src, lambda logits: logits.argmax(dim=-1), bos_id=bos_id, eos_id=eos_id,
                        pad_id=pad_id, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                        src_key_padding_mask=src_key_padding_mask, use_cache=use_cache)


def sample(model, src: torch.Tensor, *, bos_id: int, eos_id: int | None, max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, pad_id: int | None = None,
           src_key_padding_mask: torch.Tensor | None = None, use_cache: bool = True,
           min_new_tokens: int = 0) -> torch.Tensor:
    """Sample from ``softmax(logits / temperature)`` restricted by ``top_k`` and/or ``top_p``.

    ``top_k`` is applied before ``top_p`` when both are given. With the same seeded
    ``generator`` the result is the same, with or without the cache. Returns ``(B, T)``.
    """
    pad_id = _default_pad_id(model, pad_id)
    _common_checks(model, src, src_key_padding_mask, bos_id, eos_id, pad_id, max_new_tokens,
                   min_new_tokens, use_cache)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a positive float, got {type(temperature).__name__}")
    if not temperature > 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature} "
                         "(use greedy() for the temperature-0 limit)")
    if top_k is not None:
        _check_int("top_k", top_k, 1)
    if top_p is not None:
        top_p_filter(torch.zeros(1), top_p)          # validates p
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")

    def choose(logits):
        logits = logits / temperature
        if top_k is not None:
            logits = top_k_filter(logits, top_k)
        if top_p is not None:
            logits = top_p_filter(logits, top_p)
        probs = logits.softmax(dim=-1)
        if generator is not None and generator.device != probs.device:
            raise ValueError(f"generator is on {generator.device} but the model runs on {probs.device}")
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return _decode_loop(model, src, choose, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                        src_key_padding_mask=src_key_padding_mask, use_cache=use_cache)


# ----------------------------------------------------------------------------- beam search

def length_penalty(length: int | torch.Tensor, alpha: float):
    """The GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model, src: torch.Tensor, *, bos_id: int, eos_id: int, max_new_tokens: int,
                num_beams: int = 4, length_penalty_alpha: float = 0.6, early_stopping: bool = False,
                num_return_sequences: int = 1, pad_id: int | None = None,
                src_key_padding_mask: torch.Tensor | None = None, use_cache: bool = True,
                min_new_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search. Returns ``(tokens, scores)``.

    A hypothesis ``Y`` is scored ``log P(Y | X) / ((5 + |Y|) / 6) ** length_penalty_alpha`` where
    ``|Y|`` counts its tokens including ``eos``. At every step each source keeps the
    ``num_beams`` best unfinished prefixes; a candidate that ends in ``eos_id`` and ranks among
    the ``num_beams`` best candidates of the step becomes a finished hypothesis. A source is
    done when ``early_stopping`` and it has ``num_beams`` finished hypotheses, or (default) when
    no unfinished prefix can still beat the worst of its ``num_beams`` kept finished ones.
    At ``max_new_tokens`` the unfinished prefixes compete with the finished ones.

    ``tokens``: ``(B, T)`` and ``scores``: ``(B,)`` for ``num_return_sequences=1``, else
    ``(B, n, T)`` and ``(B, n)``, best first, padded with ``pad_id`` after ``eos``.
    """
    pad_id = _default_pad_id(model, pad_id)
    _common_checks(model, src, src_key_padding_mask, bos_id, eos_id, pad_id, max_new_tokens,
                   min_new_tokens, use_cache)
    if eos_id is None:
        raise ValueError("beam_search needs an eos_id (use greedy(..., eos_id=None) for forced-length decoding)")
    _check_int("num_beams", num_beams, 1)
    _check_int("num_return_sequences", num_return_sequences, 1)
    if num_return_sequences > num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must be <= num_beams={num_beams}")
    if isinstance(length_penalty_alpha, bool) or not isinstance(length_penalty_alpha, (int, float)):
        raise TypeError(f"length_penalty_alpha must be a float, got {type(length_penalty_alpha).__name__}")
    if not math.isfinite(length_penalty_alpha):
        raise ValueError(f"length_penalty_alpha must be finite, got {length_penalty_alpha}")
    _check_bool("early_stopping", early_stopping)

    device = src.device
    B, K, alpha = src.shape[0], num_beams, float(length_penalty_alpha)
    memory, mem_mask = _encode(model, src, src_key_padding_mask, pad_id)
    memory = memory.repeat_interleave(K, dim=0)
    mem_mask = mem_mask.repeat_interleave(K, dim=0)
    stepper = _Stepper(model, memory, mem_mask, use_cache)

    # live beams: (B, K) raw log-probs; only beam 0 is live at the start (the others are copies)
    beam_scores = torch.full((B, K), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0
    seqs = torch.empty(B * K, 0, dtype=torch.long, device=device)       # generated tokens per beam
    tokens = torch.full((B * K,), bos_id, dtype=torch.long, device=device)
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(B)]  # (norm, raw, tokens)
    done = [False] * B

    def worst_kept(b):
        kept = sorted(finished[b], key=lambda h: -h[0])[:K]
        return kept[-1][0] if len(kept) == K else float("-inf")

    for t in range(max_new_tokens):
        logp = F.log_softmax(stepper.step(tokens), dim=-1)                # (B*K, V)
        V = logp.shape[-1]
        if t < min_new_tokens:
            logp[:, eos_id] = float("-inf")
        cand = (beam_scores.view(B * K, 1) + logp).view(B, K * V)
        top_scores, top_idx = torch.topk(cand, min(2 * K, K * V), dim=-1)  # (B, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        new_len = t + 1
        next_scores = torch.full((B, K), float("-inf"), device=device)
        next_beam = torch.zeros((B, K), dtype=torch.long, device=device)
        next_tok = torch.full((B, K), pad_id, dtype=torch.long, device=device)
        ts, tb, tt = top_scores.tolist(), top_beam.tolist(), top_tok.tolist()
        for b in range(B):
            if done[b]:
                continue
            slot = 0
            for rank in range(len(ts[b])):
                score, beam, tok = ts[b][rank], tb[b][rank], tt[b][rank]
                if score == float("-inf"):
                    break
                if tok == eos_id:
                    if rank < K:      # an eos candidate counts only if it ranks among the K best
                        prev = seqs[b * K + beam].tolist()
                        finished[b].append((score / length_penalty(new_len, alpha), score, prev + [eos_id]))
                    continue
                next_scores[b, slot], next_beam[b, slot], next_tok[b, slot] = score, beam, tok
                slot += 1
                if slot == K:
                    break
            # is this source done?
            best_live = next_scores[b, 0].item()
            if early_stopping:
                done[b] = len(finished[b]) >= K
            elif len(finished[b]) >= K:
                # log-probs only fall; with alpha > 0 the penalty helps longer hypotheses most at max length
                best_len = max_new_tokens if alpha > 0 else new_len + 1
                bound = best_live / length_penalty(best_len, alpha) if best_live != float("-inf") else best_live
                done[b] = bound <= worst_kept(b)
            if best_live == float("-inf"):
                done[b] = True
        if all(done):
            break
        flat = (torch.arange(B, device=device)[:, None] * K + next_beam).view(-1)
        seqs = torch.cat([seqs.index_select(0, flat), next_tok.view(-1, 1)], dim=1)
        stepper.reorder(flat)
        beam_scores = next_scores
        tokens = next_tok.view(-1)
    else:
        # max_new_tokens reached: the live prefixes compete with the finished hypotheses
        for b in range(B):
            if done[b]:
                continue
            for k in range(K):
                raw = beam_scores[b, k].item()
                if raw == float("-inf"):
                    continue
                toks = seqs[b * K + k].tolist()
                finished[b].append((raw / length_penalty(len(toks), alpha), raw, toks))

    n = num_return_sequences
    best = [sorted(f, key=lambda h: -h[0])[:n] for f in finished]
    T = max(len(h[2]) for hyps in best for h in hyps) if any(best) else 0
    out = torch.full((B, n, T), pad_id, dtype=torch.long, device=device)
    scores = torch.full((B, n), float("-inf"), device=device)
    for b, hyps in enumerate(best):
        for i, (norm, _, toks) in enumerate(hyps):
            out[b, i, :len(toks)] = torch.tensor(toks, dtype=torch.long, device=device)
            scores[b, i] = norm
    if n == 1:
        return out[:, 0], scores[:, 0]
    return out, scores


# ----------------------------------------------------------------------------- one entry point

def generate(model, src: torch.Tensor, *, method: str = "greedy", **kwargs):
    """``method`` = "greedy" | "beam" | "sample": calls :func:`greedy`, :func:`beam_search`
    (returns only the tokens) or :func:`sample` with ``kwargs``."""
    if method == "greedy":
        return greedy(model, src, **kwargs)
    if method == "beam":
        return beam_search(model, src, **kwargs)[0]
    if method == "sample":
        return sample(model, src, **kwargs)
    raise ValueError(f"method must be 'greedy', 'beam' or 'sample', got {method!r}")
