"""Decoding: greedy, beam search, top-k and nucleus sampling, repetition control, KV cache.

The model protocol
------------------
Every function here drives two kinds of model through one small protocol; which kind a
model is follows from whether it has an ``encode`` method.

* **encoder-decoder** (:class:`lib.models.transformer.Transformer`)::

      memory = model.encode(src, src_key_padding_mask)                      # (B, S, d_model)
      logits, cache = model.decode(tgt, memory, memory_key_padding_mask, cache=None)

  The input is the source ``src`` (B, S) (padded with ``pad_id``; the padding mask defaults
  to ``src != pad_id``). Decoding starts from ``bos_id``, which is required.

* **decoder-only** (``lib.models.gpt.GPT``): no ``encode``, and::

      logits, cache = model.decode(tokens, cache=None)                      # tokens (B, t) long

  ``logits`` is ``(B, t, V)``. With a cache, ``tokens`` holds only the new tokens and their
  positions continue from ``cache.length``. The input is a **prompt** ``(B, T)``: every
  row the same length, no padding. A prompt that contains ``pad_id`` (when ``pad_id`` is
  given or the model's ``cfg.pad_id`` exists) is rejected: left-padded prompts are not
  supported, generate each prompt length separately. ``bos_id`` must not be given (the
  prompt says how to start; put ``[BOS]`` in it if the model was trained with one).

In both, ``decode`` returns ``(logits, cache)``; the cache is any object the model gets
back on the next call. Beam search reorders it with ``model.reorder_cache(cache, index)``
if the model has one, else ``cache.reorder(index)`` (as
:class:`lib.kv_cache.KVCache` has), else by selecting rows of every tensor inside
it (:func:`reorder_cache`). A ``cache.length`` property (positions cached so far) is part of
the protocol for the models' own use. When ``model.cfg.max_len`` exists, decoding that would
need more positions (decoder-only: the prompt and the new tokens) raises a ``ValueError``
before anything runs.

Every function takes ``use_cache``:

* ``use_cache=False`` feeds the whole sequence so far at every step (``cache=None``) and
  keeps the logits of the last position: ``T`` steps cost ``O(T^2)`` decoder positions.
* ``use_cache=True`` feeds the start (``[BOS]`` or the prompt) once, keeps the cache the
  model returns, then feeds only the newest token: ``O(T)``.

Both give the same tokens; the tests check it for both kinds of model. The model is put
in ``eval()`` mode while decoding (no dropout) and given back in the mode it was in.

The result: :class:`Generation`
-------------------------------
:func:`greedy`, :func:`sample`, :func:`beam_search` and :func:`generate` all return a
:class:`Generation` with

* ``tokens``: the new tokens only, ``(B, T)`` long, **without** the start token or the
  prompt. A sequence that produced ``eos_id`` keeps it and is padded with ``pad_id`` after
  it. ``beam_search(..., num_return_sequences=n)`` with ``n > 1`` gives ``(B, n, T)``,
  best first.
* ``lengths``: ``(B,)`` (or ``(B, n)``) long, the tokens of each sequence up to and
  including its ``eos`` (``T`` where none came).
* ``scores``: ``(B,)`` (or ``(B, n)``) float. For :func:`greedy` and :func:`sample` the
  total log-probability of the chosen tokens (through ``eos``): at each step ``log_softmax``
  of the model's logits after the repetition controls (before ``min_new_tokens`` forbids
  ``eos``, and before ``temperature``/``top_k``/``top_p``). For
  :func:`beam_search` the same total divided by the GNMT length penalty (its ranking score).
* ``sequences()``: the rows as lists of ids, cut after ``eos`` (pad dropped).

The decoders
------------
* :func:`greedy`: argmax at every step.
* :func:`beam_search`: the ``num_beams`` best prefixes, scored by log-probability divided
  by the GNMT length penalty ``((5 + |Y|) / 6) ** length_penalty`` (Wu et al., 2016).
* :func:`sample`: draw from ``softmax(logits / temperature)``, optionally restricted to the
  ``top_k`` most likely tokens (Fan et al., 2018) and/or to the smallest set of tokens whose
  probability adds up to at least ``top_p`` (nucleus sampling, Holtzman et al., 2020).
  Pass a seeded ``torch.Generator`` to make it reproducible.

Repetition control (all three decoders)
---------------------------------------
Applied to the next-token logits before anything else, with the *context*: the generated
tokens (encoder-decoder; not ``[BOS]``) or the prompt and the generated tokens (decoder-only).

* ``repetition_penalty`` (CTRL, Keskar et al., 2019): every token already in the context
  has its logit divided by the penalty if positive, multiplied by it if negative
  (:func:`apply_repetition_penalty`); ``1.0`` changes nothing, ``> 1`` discourages repeats.
* ``no_repeat_ngram_size=n``: a token that would complete an ``n``-gram already in the
  context is forbidden, so no ``n``-gram occurs twice (:func:`block_repeated_ngrams`;
  as in Paulus et al., 2018, and the ``transformers`` option of the same name).

Explained in chapters/03_transformer.ipynb, chapters/04_transformer_chatbot.ipynb, chapters/07_gpt.ipynb.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
import torch.nn.functional as F

from lib.validate import check_bool, check_float, check_int, check_tensor, check_token_ids

__all__ = ["Generation", "greedy", "beam_search", "sample", "generate", "top_k_filter", "top_p_filter",
           "length_penalty", "apply_repetition_penalty", "block_repeated_ngrams", "reorder_cache",
           "is_decoder_only", "Stepper", "decode_loop"]


@dataclasses.dataclass
class Generation:
    """What every decoder returns; see the module docstring for the exact meaning of each field."""
    tokens: torch.Tensor        # (B, T) or (B, n, T) long: new tokens only, pad after eos
    lengths: torch.Tensor       # (B,) or (B, n) long: tokens up to and including eos
    scores: torch.Tensor        # (B,) or (B, n) float: log-probability (beam: length-normalised)

    def sequences(self) -> list:
        """``tokens`` as nested lists of ids, each cut at its length (eos kept, pad dropped)."""
        def cut(toks, lens):
            if toks.dim() == 1:
                return toks[:int(lens)].tolist()
            return [cut(t, n) for t, n in zip(toks, lens)]
        return cut(self.tokens, self.lengths)


# ----------------------------------------------------------------------------- checks

def _check_tokens(name: str, x: Any) -> None:
    check_token_ids(name, x)
    if x.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one sequence, got shape {tuple(x.shape)}")


def is_decoder_only(model: Any) -> bool:
    """True for a decoder-only model (``decode`` but no ``encode``), False for an encoder-decoder.
    A model without ``decode`` raises a ``TypeError`` describing the protocol."""
    if not callable(getattr(model, "decode", None)):
        raise TypeError(f"model must have decode(tokens, cache) (decoder-only) or encode(src, "
                        f"src_key_padding_mask) and decode(tgt, memory, memory_key_padding_mask, cache) "
                        f"(encoder-decoder); {type(model).__name__} has no decode()")
    return not callable(getattr(model, "encode", None))


def _pad_id(model: Any, pad_id: int | None) -> tuple[int, bool]:
    """The pad id and whether it is known (given, or the model's ``cfg.pad_id``) rather than the default 0."""
    if pad_id is not None:
        check_int("pad_id", pad_id, 0)
        return pad_id, True
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    value = getattr(cfg, "pad_id", None)
    return (int(value), True) if isinstance(value, int) and not isinstance(value, bool) else (0, False)


@contextlib.contextmanager
def _eval_mode(model):
    was_training = getattr(model, "training", None)
    if callable(getattr(model, "eval", None)) and was_training is not None:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train(True)


# ----------------------------------------------------------------------------- the cache

def reorder_cache(cache: Any, index: torch.Tensor, batch_size: int, model: Any = None) -> Any:
    """Select rows ``index`` (dim 0) of every tensor in ``cache`` whose dim 0 is ``batch_size``.

    Beam search uses it to follow the beams that survive a step. The cache may be any nesting
    of lists, tuples, dicts and dataclasses/objects holding tensors; non-tensors (e.g. a cached
    length) are kept. A model with a ``reorder_cache(cache, index)`` method, or a cache with a
    ``reorder(index)`` method (``lib.kv_cache.KVCache``), is asked instead.
    """
    if model is not None and callable(getattr(model, "reorder_cache", None)):
        return model.reorder_cache(cache, index)
    if callable(getattr(cache, "reorder", None)):                 # e.g. lib.kv_cache.KVCache
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


class Stepper:
    """Feeds a model one token at a time, with or without a cache; the same logits either way.

    ``prefix`` holds every token fed so far, starting with ``start`` ([BOS] or the prompt);
    ``context()`` is what the repetition controls look at (``prefix`` without [BOS])."""

    def __init__(self, model, start: torch.Tensor, memory, memory_mask, use_cache: bool, context_from: int):
        self.model, self.memory, self.memory_mask, self.use_cache = model, memory, memory_mask, use_cache
        self.prefix, self.context_from = start, context_from
        self.cache, self.cached = None, 0            # tokens of prefix already inside the cache

    def _decode(self, tokens, cache):
        if self.memory is None:
            return self.model.decode(tokens, cache=cache)
        return self.model.decode(tokens, self.memory, self.memory_mask, cache=cache)

    def next_logits(self) -> torch.Tensor:
        """The next-token logits ``(N, V)`` (float32) after the whole prefix."""
        if self.use_cache:
            new = self.prefix[:, self.cached:]
            logits, cache = self._decode(new, self.cache)
            if cache is None:
                raise RuntimeError("use_cache=True but model.decode(..., cache=None) returned no cache; "
                                   "use use_cache=False with this model")
            self.cache, self.cached = cache, self.prefix.shape[1]
        else:
            new = self.prefix
            logits, _ = self._decode(self.prefix, None)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != new.shape:
            raise RuntimeError(f"model.decode must return logits (batch, time, vocab) for tokens of shape "
                               f"{tuple(new.shape)}, got {tuple(getattr(logits, 'shape', ()))}")
        return logits[:, -1, :].float()

    def append(self, tokens: torch.Tensor) -> None:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)

    def context(self) -> torch.Tensor:
        return self.prefix[:, self.context_from:]

    def reorder(self, index: torch.Tensor) -> None:
        n = self.prefix.shape[0]
        self.prefix = self.prefix.index_select(0, index)
        if self.cache is not None:
            self.cache = reorder_cache(self.cache, index, n, self.model)


def _start(model, inputs, *, bos_id, pad_id, pad_known, src_key_padding_mask, max_new_tokens, use_cache,
           repeat: int = 1) -> Stepper:
    """Check the input for the model's kind, encode (encoder-decoder) and return a ready stepper;
    every row repeated ``repeat`` times (beam search)."""
    cfg = getattr(model, "cfg", None)
    max_len = getattr(cfg, "max_len", None)
    if is_decoder_only(model):
        _check_tokens("prompt", inputs)
        if bos_id is not None:
            raise ValueError("bos_id is for encoder-decoder models; a decoder-only model continues its prompt "
                             "(put the start token in the prompt)")
        if src_key_padding_mask is not None:
            raise ValueError("a decoder-only prompt has no padding mask: every row must be the same length")
        if pad_known and bool((inputs == pad_id).any()):
            rows = sorted(set((inputs == pad_id).nonzero()[:, 0].tolist()))
            raise ValueError(f"prompt rows {rows} contain pad_id={pad_id}: padded (ragged) prompts are not "
                             "supported; generate each prompt length separately")
        positions = inputs.shape[1] + max_new_tokens - 1
        start, memory, mask, context_from = inputs.long(), None, None, 0
    else:
        _check_tokens("src", inputs)
        if bos_id is None:
            raise ValueError("an encoder-decoder model needs bos_id, the token decoding starts from")
        check_int("bos_id", bos_id, 0)
        if src_key_padding_mask is None:
            src_key_padding_mask = inputs != pad_id
        # True = real token; the shape of src
        check_tensor("src_key_padding_mask", src_key_padding_mask, dtype="bool", shape=tuple(inputs.shape))
        memory = model.encode(inputs, src_key_padding_mask)
        memory = memory.repeat_interleave(repeat, dim=0)
        mask = src_key_padding_mask.repeat_interleave(repeat, dim=0)
        positions = max_new_tokens
        start = torch.full((inputs.shape[0], 1), bos_id, dtype=torch.long, device=inputs.device)
        context_from = 1
    if isinstance(max_len, int) and positions > max_len:
        raise ValueError(f"the model has max_len={max_len} positions but decoding needs {positions} "
                         f"(max_new_tokens={max_new_tokens}{'' if memory is not None else ' plus the prompt'}); "
                         "lower max_new_tokens")
    return Stepper(model, start.repeat_interleave(repeat, dim=0), memory, mask, use_cache, context_from)


# ----------------------------------------------------------------------------- repetition control

def _check_logits(logits: Any) -> None:
    check_tensor("logits", logits, dtype="float")


def apply_repetition_penalty(logits: torch.Tensor, context: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al., 2019): for every token id in ``context`` (N, t),
    the logit in ``logits`` (N, V) is divided by ``penalty`` if positive and multiplied by it if
    negative. Returns a new tensor."""
    _check_logits(logits)
    check_float("repetition_penalty", penalty, positive=True)
    if context.shape[1] == 0 or penalty == 1.0:
        return logits
    seen = logits.gather(1, context)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, context, seen)


def block_repeated_ngrams(logits: torch.Tensor, context: torch.Tensor, n: int) -> torch.Tensor:
    """Set to ``-inf`` the logit of every token that would complete an ``n``-gram already present
    in its row of ``context`` (N, t): the last ``n - 1`` tokens followed by that token. ``n = 1``
    forbids every token already present. Returns a new tensor."""
    _check_logits(logits)
    check_int("no_repeat_ngram_size", n, 1)
    out = logits.clone()
    for row, ids in enumerate(context.tolist()):
        L = len(ids)
        if L < n - 1:
            continue
        last = ids[L - n + 1:] if n > 1 else []
        banned = {ids[i + n - 1] for i in range(L - n + 1) if ids[i:i + n - 1] == last}
        if banned:
            out[row, list(banned)] = float("-inf")
    return out


def _controls(repetition_penalty, no_repeat_ngram_size) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Check the repetition options and return ``f(logits, context) -> logits``."""
    if repetition_penalty is not None:
        check_float("repetition_penalty", repetition_penalty, positive=True)
    if no_repeat_ngram_size is not None:
        check_int("no_repeat_ngram_size", no_repeat_ngram_size, 1)

    def apply(logits, context):
        if repetition_penalty is not None and repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, context, repetition_penalty)
        if no_repeat_ngram_size is not None:
            logits = block_repeated_ngrams(logits, context, no_repeat_ngram_size)
        return logits
    return apply


# ----------------------------------------------------------------------------- greedy and sampling

def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of the last dimension; set the rest to ``-inf``."""
    check_int("top_k", k, 1)
    _check_logits(logits)
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability sums to >= ``p``.

    A token is dropped when the tokens more likely than it already reach ``p``; the most likely
    token is always kept. The rest get ``-inf``.
    """
    check_float("top_p", p, positive=True, maximum=1.0)
    _check_logits(logits)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs            # probability of the strictly more likely tokens
    drop_sorted = before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _prepare(model, inputs, *, bos_id, eos_id, pad_id, max_new_tokens, min_new_tokens, use_cache,
             src_key_padding_mask, repetition_penalty, no_repeat_ngram_size, repeat=1):
    """The checks every decoder shares; returns (stepper, pad_id, controls)."""
    is_decoder_only(model)
    pad_id, pad_known = _pad_id(model, pad_id)
    if eos_id is not None:
        check_int("eos_id", eos_id, 0)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("min_new_tokens", min_new_tokens, 0)
    if min_new_tokens > max_new_tokens:
        raise ValueError(f"min_new_tokens={min_new_tokens} is larger than max_new_tokens={max_new_tokens}")
    check_bool("use_cache", use_cache)
    controls = _controls(repetition_penalty, no_repeat_ngram_size)
    stepper = _start(model, inputs, bos_id=bos_id, pad_id=pad_id, pad_known=pad_known,
                     src_key_padding_mask=src_key_padding_mask, max_new_tokens=max_new_tokens,
                     use_cache=use_cache, repeat=repeat)
    return stepper, pad_id, controls


@torch.no_grad()
def decode_loop(stepper: Stepper, choose, controls, *, eos_id, pad_id, max_new_tokens,
                 min_new_tokens) -> Generation:
    B, device = stepper.prefix.shape[0], stepper.prefix.device
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    scores = torch.zeros(B, device=device)
    out = []
    for t in range(max_new_tokens):
        logits = controls(stepper.next_logits(), stepper.context())
        logp_all = F.log_softmax(logits, dim=-1)
        if eos_id is not None and t < min_new_tokens:
            logits[:, eos_id] = float("-inf")
        nxt = choose(logits)
        logp = logp_all.gather(1, nxt[:, None]).squeeze(1)
        scores += torch.where(done, torch.zeros_like(logp), logp)
        lengths += (~done).long()
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        out.append(nxt)
        if eos_id is not None:
            done = done | (nxt == eos_id)
            if bool(done.all()):
                break
        stepper.append(nxt)
    return Generation(torch.stack(out, dim=1), lengths, scores)


def greedy(model, inputs: torch.Tensor, *, eos_id: int | None, max_new_tokens: int, bos_id: int | None = None,
           pad_id: int | None = None, src_key_padding_mask: torch.Tensor | None = None,
           use_cache: bool = True, min_new_tokens: int = 0, repetition_penalty: float | None = None,
           no_repeat_ngram_size: int | None = None) -> Generation:
    """Greedy decoding: the most likely token at every step.

    ``inputs`` is the source (encoder-decoder, then ``bos_id`` is required) or the prompt
    (decoder-only); see the module docstring. ``eos_id=None`` ignores the end token and always
    produces ``max_new_tokens`` tokens (used by the KV-cache benchmark). ``pad_id`` defaults
    to ``model.cfg.pad_id`` (else 0). Returns a :class:`Generation`.
    """
    stepper, pad_id, controls = _prepare(
        model, inputs, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens, use_cache=use_cache, src_key_padding_mask=src_key_padding_mask,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)
    with _eval_mode(model):
        return decode_loop(stepper, lambda logits: logits.argmax(dim=-1), controls, eos_id=eos_id,
                            pad_id=pad_id, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)


def sample(model, inputs: torch.Tensor, *, eos_id: int | None, max_new_tokens: int, bos_id: int | None = None,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, pad_id: int | None = None,
           src_key_padding_mask: torch.Tensor | None = None, use_cache: bool = True,
           min_new_tokens: int = 0, repetition_penalty: float | None = None,
           no_repeat_ngram_size: int | None = None) -> Generation:
    """Sample from ``softmax(logits / temperature)`` restricted by ``top_k`` and/or ``top_p``.

    ``top_k`` is applied before ``top_p`` when both are given. With the same seeded
    ``generator`` the result is the same, with or without the cache. Returns a :class:`Generation`.
    """
    check_float("temperature", temperature, positive=True)     # the temperature-0 limit is greedy()
    if top_k is not None:
        check_int("top_k", top_k, 1)
    if top_p is not None:
        top_p_filter(torch.zeros(1), top_p)          # validates p
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    stepper, pad_id, controls = _prepare(
        model, inputs, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens, use_cache=use_cache, src_key_padding_mask=src_key_padding_mask,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)

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

    with _eval_mode(model):
        return decode_loop(stepper, choose, controls, eos_id=eos_id, pad_id=pad_id,
                            max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)


# ----------------------------------------------------------------------------- beam search

def length_penalty(length: int | torch.Tensor, alpha: float):
    """The GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(model, inputs: torch.Tensor, *, eos_id: int, max_new_tokens: int, bos_id: int | None = None,
                num_beams: int = 4, length_penalty_alpha: float = 0.6, early_stopping: bool = False,
                num_return_sequences: int = 1, pad_id: int | None = None,
                src_key_padding_mask: torch.Tensor | None = None, use_cache: bool = True,
                min_new_tokens: int = 0, repetition_penalty: float | None = None,
                no_repeat_ngram_size: int | None = None) -> Generation:
    """Beam search. Returns a :class:`Generation` whose ``scores`` are the ranking scores.

    A hypothesis ``Y`` is scored ``log P(Y | X) / ((5 + |Y|) / 6) ** length_penalty_alpha`` where
    ``|Y|`` counts its tokens including ``eos``. At every step each input keeps the
    ``num_beams`` best unfinished prefixes; a candidate that ends in ``eos_id`` and ranks among
    the ``num_beams`` best candidates of the step becomes a finished hypothesis. An input is
    done when ``early_stopping`` and it has ``num_beams`` finished hypotheses, or (default) when
    no unfinished prefix can still beat the worst of its ``num_beams`` kept finished ones.
    At ``max_new_tokens`` the unfinished prefixes compete with the finished ones.

    ``tokens`` is ``(B, T)`` (``lengths``, ``scores``: ``(B,)``) for ``num_return_sequences=1``,
    else ``(B, n, T)`` (``(B, n)``), best first, padded with ``pad_id`` after ``eos``.
    """
    if eos_id is None:
        raise ValueError("beam_search needs an eos_id (use greedy(..., eos_id=None) for forced-length decoding)")
    check_int("num_beams", num_beams, 1)
    check_int("num_return_sequences", num_return_sequences, 1)
    if num_return_sequences > num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must be <= num_beams={num_beams}")
    check_float("length_penalty_alpha", length_penalty_alpha)
    check_bool("early_stopping", early_stopping)
    stepper, pad_id, controls = _prepare(
        model, inputs, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens, use_cache=use_cache, src_key_padding_mask=src_key_padding_mask,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size, repeat=num_beams)
    with _eval_mode(model), torch.no_grad():
        return _beam_loop(stepper, controls, B=inputs.shape[0], K=num_beams, alpha=float(length_penalty_alpha),
                          eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens,
                          min_new_tokens=min_new_tokens, early_stopping=early_stopping, n=num_return_sequences)


def _beam_loop(stepper, controls, *, B, K, alpha, eos_id, pad_id, max_new_tokens, min_new_tokens,
               early_stopping, n) -> Generation:
    device = stepper.prefix.device
    # live beams: (B, K) raw log-probs; only beam 0 is live at the start (the others are copies)
    beam_scores = torch.full((B, K), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0
    seqs = torch.empty(B * K, 0, dtype=torch.long, device=device)       # generated tokens per beam
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(B)]  # (norm, raw, tokens)
    done = [False] * B

    def worst_kept(b):
        kept = sorted(finished[b], key=lambda h: -h[0])[:K]
        return kept[-1][0] if len(kept) == K else float("-inf")

    for t in range(max_new_tokens):
        logp = F.log_softmax(controls(stepper.next_logits(), stepper.context()), dim=-1)   # (B*K, V)
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
            # is this input done?
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
        stepper.append(next_tok.view(-1))
        beam_scores = next_scores
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

    best = [sorted(f, key=lambda h: -h[0])[:n] for f in finished]
    T = max(len(h[2]) for hyps in best for h in hyps) if any(best) else 0
    out = torch.full((B, n, T), pad_id, dtype=torch.long, device=device)
    lengths = torch.zeros((B, n), dtype=torch.long, device=device)
    scores = torch.full((B, n), float("-inf"), device=device)
    for b, hyps in enumerate(best):
        for i, (norm, _, toks) in enumerate(hyps):
            out[b, i, :len(toks)] = torch.tensor(toks, dtype=torch.long, device=device)
            lengths[b, i], scores[b, i] = len(toks), norm
    if n == 1:
        return Generation(out[:, 0], lengths[:, 0], scores[:, 0])
    return Generation(out, lengths, scores)


# ----------------------------------------------------------------------------- one entry point

def generate(model, inputs: torch.Tensor, *, method: str = "greedy", **kwargs) -> Generation:
    """``method`` = "greedy" | "beam" | "sample": calls :func:`greedy`, :func:`beam_search` or
    :func:`sample` with ``kwargs``; all return a :class:`Generation`."""
    decoders = {"greedy": greedy, "beam": beam_search, "sample": sample}
    if method not in decoders:
        raise ValueError(f"method must be 'greedy', 'beam' or 'sample', got {method!r}")
    return decoders[method](model, inputs, **kwargs)
