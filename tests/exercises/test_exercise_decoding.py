"""Chapter 04's exercise set (exercises/04_transformer_chatbot/decoding.ipynb) against lib.generate.

The set asks for ``top_p_filter``, ``length_penalty`` and ``block_repeated_ngrams`` with the
signatures of their counterparts in ``lib.generate``, and for ``kv_step`` in the layout of
``lib.models.transformer``'s self-attention cache, so that a learner's answer plugs into the
course's decoders. These tests run the master notebook's solution code inside those decoders:
if the exercise's contract and the course's code drift apart, they fail. (The exercise's own
proof, solution 100 % and wrong answers below, is tests/exercises/test_exercises.py.)
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn

import exercises_tool
from lib import generate as gen
from lib.attention import look_ahead_mask, scaled_dot_product_attention

ROOT = Path(__file__).resolve().parents[2]
MASTER = ROOT / "exercises" / "04_transformer_chatbot" / "decoding.ipynb"


@pytest.fixture(scope="module")
def answers() -> dict:
    """The names the master's setup cell and solution cells define (their markers are comments)."""
    info = exercises_tool.load().parse_master(MASTER)
    solution_ids = {i for ids in info.solution_cells.values() for i in ids}
    nb = nbformat.read(str(MASTER), as_version=4)
    first_question = next(i for i, c in enumerate(nb.cells)
                          if c.cell_type == "raw" and c.source.startswith("# BEGIN QUESTION"))
    namespace: dict = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and (i < first_question or cell.get("id") in solution_ids):
            exec(compile(cell.source, f"{MASTER.name}:cell{i}", "exec"), namespace)
    for name in ("top_p_filter", "length_penalty", "best_finished", "kv_step", "block_repeated_ngrams"):
        assert callable(namespace.get(name)), f"the master's solution defines no {name}"
    return namespace


def test_answers_equal_lib_generate(answers):
    g = torch.Generator().manual_seed(0)
    logits = 2.0 * torch.randn(5, 30, generator=g)
    logits[4, :12] = float("-inf")                       # as after top_k_filter
    for p in (0.1, 0.5, 0.9, 0.99):
        assert torch.equal(answers["top_p_filter"](logits, p), gen.top_p_filter(logits, p)), p
    context = torch.randint(0, 6, (4, 15), generator=g)
    for n in (1, 2, 3, 5):
        assert torch.equal(answers["block_repeated_ngrams"](logits[:4, :6], context, n),
                           gen.block_repeated_ngrams(logits[:4, :6], context, n)), n
    lengths = torch.arange(1, 9)
    assert torch.allclose(answers["length_penalty"](lengths, 0.6), gen.length_penalty(lengths, 0.6))
    assert answers["length_penalty"](7, 1.5) == pytest.approx(gen.length_penalty(7, 1.5))


def _tiny_chatbot():
    from lib.models.transformer import Transformer, TransformerConfig
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=17, tgt_vocab_size=17, d_model=16, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, d_ff=32, dropout=0.0, max_len=32, pad_id=0)
    return Transformer(cfg).eval()


def test_answers_plug_into_the_course_decoders(answers, monkeypatch):
    """Sampling with top-p and the n-gram block, and beam search with the length penalty, give the
    same answers from the chapter's kind of model with the exercise's functions as with lib's."""
    model = _tiny_chatbot()
    src = torch.randint(4, 17, (3, 6), generator=torch.Generator().manual_seed(1))
    common = dict(bos_id=1, eos_id=2, pad_id=0, max_new_tokens=12, no_repeat_ngram_size=2)

    def decode():
        sampled = gen.sample(model, src, top_p=0.8, temperature=1.5,
                             generator=torch.Generator().manual_seed(2), **common)
        beam = gen.beam_search(model, src, num_beams=3, length_penalty_alpha=1.0, num_return_sequences=3,
                               **common)
        return sampled.tokens, beam.tokens, beam.scores

    expected = decode()
    with monkeypatch.context() as m:        # the patch takes effect: a filter that keeps everything changes the draw
        m.setattr(gen, "top_p_filter", lambda logits, p: logits)
        assert not torch.equal(decode()[0], expected[0])
    for name in ("top_p_filter", "block_repeated_ngrams", "length_penalty"):
        monkeypatch.setattr(gen, name, answers[name])
    got = decode()
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


class KVStepDecoder(nn.Module):
    """A one-layer decoder-only model whose cached step is the exercise's ``kv_step``; without a
    cache it recomputes causal attention over the whole sequence with lib.attention."""

    def __init__(self, answers, vocab=11, d=12, heads=3, max_len=40):
        super().__init__()
        self.kv_step, self.heads = answers["kv_step"], heads
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, vocab)

    def _heads(self, x):
        B, T, d = x.shape
        return x.view(B, T, self.heads, d // self.heads).transpose(1, 2)       # (B, H, T, d_head)

    def decode(self, tokens, cache=None):
        start = 0 if cache is None else cache["self_k"].shape[2]
        x = self.emb(tokens) + self.pos(torch.arange(start, start + tokens.shape[1]))
        q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        if cache is None:
            mask = look_ahead_mask(tokens.shape[1])
            h, _ = scaled_dot_product_attention(q, k, v, mask=mask)
            cache = {"self_k": k, "self_v": v}
        else:
            assert tokens.shape[1] == 1, "lib.generate feeds one new token per cached step"
            h, cache = self.kv_step(q, k, v, cache)
        h = h.transpose(1, 2).reshape(x.shape)
        return self.out(x + h), cache


def test_kv_step_in_a_cached_decoder(answers):
    """Greedy and beam search with the exercise's cached step give the tokens of the full recomputation,
    and the cache layout the exercise states is lib.models.transformer's."""
    torch.manual_seed(3)
    model = KVStepDecoder(answers).eval()
    prompt = torch.randint(3, 11, (4, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():                     # each cached step's logits are the full pass's last row
        _, cache = model.decode(prompt[:, :2])
        for t in range(2, prompt.shape[1]):
            step, cache = model.decode(prompt[:, t:t + 1], cache)
            full, _ = model.decode(prompt[:, :t + 1])
            assert torch.allclose(step[:, 0], full[:, -1], atol=1e-5), t
    for decode, kw in ((gen.greedy, {}), (gen.beam_search, dict(num_beams=3))):
        cached = decode(model, prompt, eos_id=2, max_new_tokens=10, use_cache=True, **kw)
        full = decode(model, prompt, eos_id=2, max_new_tokens=10, use_cache=False, **kw)
        assert torch.equal(cached.tokens, full.tokens), decode.__name__
    chatbot = _tiny_chatbot()                 # (d_model 16, 2 heads: d_head 8)
    memory = chatbot.encode(torch.full((2, 3), 5), torch.ones(2, 3, dtype=torch.bool))
    _, cache = chatbot.decode(torch.full((2, 4), 1), memory, torch.ones(2, 3, dtype=torch.bool), cache=None)
    assert tuple(cache.layers[0]["self_k"].shape) == (2, 2, 4, 8)   # (B, H, T, d_head), as the exercise says
    assert tuple(cache.layers[0]["self_v"].shape) == (2, 2, 4, 8)
