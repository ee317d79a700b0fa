"""lib.generate: greedy, beam search, top-k / nucleus sampling, and the KV cache.

The cache tests run on the course Transformer (lib.models.transformer) and on a tiny stand-in
encoder-decoder written here (its own self-attention cache), so that they do not depend on
one implementation.
"""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lib import generate as gen

PAD, BOS, EOS = 0, 2, 3
VOCAB = 23


# ----------------------------------------------------------------------------- models

class TinySeq2Seq(nn.Module):
    """A one-layer encoder-decoder with a self-attention KV cache (a stand-in for the Transformer)."""

    def __init__(self, vocab=VOCAB, d=16, max_len=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.enc = nn.Linear(d, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.cross_q = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab)

    def encode(self, src, src_key_padding_mask):
        return torch.tanh(self.enc(self.emb(src) + self.pos(torch.arange(src.shape[1]))))

    def decode(self, tgt, memory, memory_key_padding_mask, cache=None):
        start = 0 if cache is None else cache["k"].shape[1]
        x = self.emb(tgt) + self.pos(torch.arange(start, start + tgt.shape[1]))
        k, v = self.k(x), self.v(x)
        if cache is not None:
            k, v = torch.cat([cache["k"], k], 1), torch.cat([cache["v"], v], 1)
        T, S = x.shape[1], k.shape[1]
        causal = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        h = x + F.scaled_dot_product_attention(self.q(x), k, v, attn_mask=causal)
        cross_mask = memory_key_padding_mask[:, None, :]
        h = h + F.scaled_dot_product_attention(self.cross_q(h), memory, memory, attn_mask=cross_mask)
        return self.out(h), {"k": k, "v": v}


def course_transformer():
    mod = pytest.importorskip("lib.models.transformer")
    cfg = mod.TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, num_heads=4,
                                num_encoder_layers=2, num_decoder_layers=2, d_ff=64, dropout=0.1,
                                max_len=64, pad_id=PAD)
    return mod.Transformer(cfg)


MODELS = {"tiny": lambda: TinySeq2Seq(), "transformer": course_transformer}


@pytest.fixture(params=sorted(MODELS))
def model(request):
    torch.manual_seed(0)
    m = MODELS[request.param]()
    m.eval()
    return m


def batch(seed=1, B=4, S=7):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (B, S), generator=g)
    src[1, 5:] = PAD        # some padding
    src[2, 3:] = PAD
    return src


class ToyLM:
    """Hand-built next-token table, ignoring the source: greedy goes wrong, beam search does not.

    tokens: 0 pad, 1 A, 2 B, 3 eos, 4 bos.  P(A)=0.6, P(B)=0.4 first; after A: eos 0.4, A 0.3, B 0.3;
    after B: eos 0.9, A 0.05, B 0.05; afterwards always eos 0.9.
    Greedy: A eos (p = 0.24). Best: B eos (p = 0.36).
    The cache is the prefix itself (a (B, t) tensor), so beam search has to reorder it.
    """
    V, A, B_, EOS, BOS = 5, 1, 2, 3, 4

    def __init__(self):
        self.calls = []

    def encode(self, src, mask):
        return torch.zeros(src.shape[0], src.shape[1], 1)

    def _dist(self, prefix):
        t = len(prefix)
        if t == 1:
            p = {self.A: 0.6, self.B_: 0.4}
        elif t == 2 and prefix[-1] == self.A:
            p = {self.EOS: 0.4, self.A: 0.3, self.B_: 0.3}
        elif t == 2 and prefix[-1] == self.B_:
            p = {self.EOS: 0.9, self.A: 0.05, self.B_: 0.05}
        else:
            p = {self.EOS: 0.9, self.A: 0.05, self.B_: 0.05}
        row = torch.full((self.V,), -1e9)
        for k, v in p.items():
            row[k] = math.log(v)
        return row

    def decode(self, tgt, memory, mask, cache=None):
        self.calls.append(tgt.shape[1])
        full = tgt if cache is None else torch.cat([cache, tgt], 1)
        rows = []
        for b in range(full.shape[0]):
            rows.append(torch.stack([self._dist(full[b, :i + 1].tolist()) for i in range(full.shape[1])]))
        logits = torch.stack(rows)[:, -tgt.shape[1]:]
        return logits, full


def _ts(g):
    """tokens and scores of a beam-search Generation."""
    assert isinstance(g, gen.Generation)
    return g.tokens, g.scores


def _greedy(*args, **kw):
    g = gen.greedy(*args, **kw)
    assert isinstance(g, gen.Generation)
    return g.tokens


def _sample(*args, **kw):
    g = gen.sample(*args, **kw)
    assert isinstance(g, gen.Generation)
    return g.tokens


# ----------------------------------------------------------------------------- cache == no cache

def test_greedy_cache_matches_no_cache(model):
    src = batch()
    a = _greedy(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, use_cache=True)
    b = _greedy(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, use_cache=False)
    assert a.shape[0] == src.shape[0] and a.shape[1] >= 1
    assert torch.equal(a, b)
    # forced length (eos ignored): exactly max_new_tokens tokens, still identical
    a = _greedy(model, src, bos_id=BOS, eos_id=None, max_new_tokens=30, use_cache=True)
    b = _greedy(model, src, bos_id=BOS, eos_id=None, max_new_tokens=30, use_cache=False)
    assert a.shape == (4, 30) and torch.equal(a, b)


def test_beam_cache_matches_no_cache(model):
    src = batch(seed=2)
    ra = gen.beam_search(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=15, num_beams=4,
                         use_cache=True, num_return_sequences=3)
    rb = gen.beam_search(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=15, num_beams=4,
                         use_cache=False, num_return_sequences=3)
    (ta, sa), (tb, sb) = (ra.tokens, ra.scores), (rb.tokens, rb.scores)
    assert torch.equal(ra.lengths, rb.lengths)
    assert ta.shape[:2] == (4, 3)
    assert torch.equal(ta, tb)
    torch.testing.assert_close(sa, sb)
    assert bool((sa[:, :-1] >= sa[:, 1:]).all()), "returned hypotheses must be sorted best first"


def test_sampling_cache_matches_no_cache(model):
    src = batch(seed=3)
    for kw in (dict(), dict(top_k=5), dict(top_p=0.9, temperature=0.7), dict(top_k=8, top_p=0.8)):
        a = _sample(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, use_cache=True,
                       generator=torch.Generator().manual_seed(7), **kw)
        b = _sample(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, use_cache=False,
                       generator=torch.Generator().manual_seed(7), **kw)
        assert torch.equal(a, b), kw
    c = _sample(model, src, bos_id=BOS, eos_id=None, max_new_tokens=20,
                   generator=torch.Generator().manual_seed(8))
    d = _sample(model, src, bos_id=BOS, eos_id=None, max_new_tokens=20,
                   generator=torch.Generator().manual_seed(9))
    assert not torch.equal(c, d), "different seeds should give different samples"


def test_cache_feeds_one_token_per_step():
    toy = ToyLM()
    src = torch.ones(1, 3, dtype=torch.long)
    _greedy(toy, src, bos_id=ToyLM.BOS, eos_id=None, max_new_tokens=4, use_cache=True)
    assert toy.calls == [1, 1, 1, 1]
    toy.calls.clear()
    _greedy(toy, src, bos_id=ToyLM.BOS, eos_id=None, max_new_tokens=4, use_cache=False)
    assert toy.calls == [1, 2, 3, 4]


# ----------------------------------------------------------------------------- equivalences

def test_beam_size_one_is_greedy(model):
    src = batch(seed=4)
    g = _greedy(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20)
    b, _ = _ts(gen.beam_search(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, num_beams=1,
                           length_penalty_alpha=0.0))
    assert torch.equal(b[:, :g.shape[1]], g)
    assert bool((b[:, g.shape[1]:] == PAD).all())


def test_top_k_one_is_greedy(model):
    src = batch(seed=5)
    g = _greedy(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20)
    s = _sample(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, top_k=1, temperature=1.3,
                   generator=torch.Generator().manual_seed(0))
    assert torch.equal(s, g)


def test_padding_after_eos(model):
    src = batch(seed=6)
    out = _greedy(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=20, min_new_tokens=2)
    assert bool((out[:, :2] != EOS).all()), "min_new_tokens must forbid an early eos"
    for row in out.tolist():
        if EOS in row:
            assert all(t == PAD for t in row[row.index(EOS) + 1:])


# ----------------------------------------------------------------------------- beam search beats greedy

def test_beam_finds_the_best_sequence_greedy_misses():
    toy, src = ToyLM(), torch.ones(1, 2, dtype=torch.long)
    kw = dict(bos_id=ToyLM.BOS, eos_id=ToyLM.EOS, max_new_tokens=5, pad_id=0)
    g = _greedy(toy, src, **kw)
    assert g.tolist() == [[ToyLM.A, ToyLM.EOS]]
    for use_cache in (True, False):
        tokens, score = _ts(gen.beam_search(toy, src, num_beams=2, length_penalty_alpha=0.0,
                                        use_cache=use_cache, **kw))
        assert tokens.tolist() == [[ToyLM.B_, ToyLM.EOS]]
        assert score.item() == pytest.approx(math.log(0.36), abs=1e-5)
    # with a length penalty the score is log p / ((5 + 2) / 6) ** alpha
    _, score = _ts(gen.beam_search(toy, src, num_beams=2, length_penalty_alpha=1.0, **kw))
    assert score.item() == pytest.approx(math.log(0.36) / (7 / 6), abs=1e-5)
    # the two best hypotheses, best first: B eos (0.36), A eos (0.24)
    tokens, scores = _ts(gen.beam_search(toy, src, num_beams=3, length_penalty_alpha=0.0,
                                     num_return_sequences=2, **kw))
    assert tokens[0].tolist() == [[ToyLM.B_, ToyLM.EOS], [ToyLM.A, ToyLM.EOS]]
    torch.testing.assert_close(scores[0], torch.tensor([math.log(0.36), math.log(0.24)]))


def test_min_new_tokens_forbids_an_early_eos():
    toy, src = ToyLM(), torch.ones(1, 2, dtype=torch.long)
    kw = dict(bos_id=ToyLM.BOS, eos_id=ToyLM.EOS, max_new_tokens=5, pad_id=0, min_new_tokens=2)
    out = _greedy(toy, src, **kw)
    assert out[0, :2].tolist() == [ToyLM.A, ToyLM.A] and out[0, 2].item() == ToyLM.EOS
    tokens, _ = _ts(gen.beam_search(toy, src, num_beams=2, length_penalty_alpha=0.0, **kw))
    assert len(tokens[0]) == 3 and tokens[0, 2].item() == ToyLM.EOS and ToyLM.EOS not in tokens[0, :2].tolist()


def test_beam_without_eos_returns_live_prefixes():
    toy, src = ToyLM(), torch.ones(1, 2, dtype=torch.long)
    # one step: nothing can finish, the best prefix is A (0.6)
    tokens, score = _ts(gen.beam_search(toy, src, bos_id=ToyLM.BOS, eos_id=ToyLM.EOS, max_new_tokens=1,
                                    num_beams=2, length_penalty_alpha=0.0, pad_id=0))
    assert tokens.tolist() == [[ToyLM.A]] and score.item() == pytest.approx(math.log(0.6), abs=1e-5)


# ----------------------------------------------------------------------------- filters

def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.125, 0.5, 0.0625, 0.25, 0.0625])      # sorted: 0.5, 0.25, 0.125, 0.0625, 0.0625
    logits = probs.log()
    kept = lambda p: (gen.top_p_filter(logits, p) > float("-inf")).nonzero().flatten().tolist()
    assert kept(0.3) == [1]                  # 0.5 >= 0.3 already
    assert kept(0.7) == [1, 3]               # 0.5 + 0.25 = 0.75 >= 0.7
    assert kept(0.8) == [0, 1, 3]            # 0.875 >= 0.8
    k = kept(0.9)                            # 0.875 < 0.9 <= 0.9375: one of the two tied 0.0625s
    assert len(k) == 4 and {0, 1, 3} <= set(k)
    assert kept(0.95) == [0, 1, 2, 3, 4]     # 0.9375 < 0.95
    assert kept(1.0) == [0, 1, 2, 3, 4]
    # batched and unchanged where kept
    two = torch.stack([logits, logits.flip(0)])
    out = gen.top_p_filter(two, 0.7)
    assert (out[0] > float("-inf")).sum() == 2 and (out[1] > float("-inf")).sum() == 2
    assert torch.equal(out[0][[1, 3]], logits[[1, 3]])


def test_top_k_filter():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert (gen.top_k_filter(logits, 2) > float("-inf")).tolist() == [[False, True, True, False]]
    assert torch.equal(gen.top_k_filter(logits, 10), logits)


def test_length_penalty():
    assert gen.length_penalty(1, 0.0) == 1.0
    assert gen.length_penalty(7, 1.0) == pytest.approx(2.0)


# ----------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("fn, kw, exc, words", [
    ("greedy", dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    ("greedy", dict(max_new_tokens=2.5), TypeError, "max_new_tokens"),
    ("greedy", dict(bos_id=-1), ValueError, "bos_id"),
    ("greedy", dict(use_cache="yes"), TypeError, "use_cache"),
    ("greedy", dict(min_new_tokens=9, max_new_tokens=3), ValueError, "min_new_tokens"),
    ("beam_search", dict(num_beams=0), ValueError, "num_beams"),
    ("beam_search", dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences"),
    ("beam_search", dict(eos_id=None), ValueError, "eos_id"),
    ("sample", dict(temperature=0.0), ValueError, "temperature"),
    ("sample", dict(top_k=0), ValueError, "top_k"),
    ("sample", dict(top_p=1.5), ValueError, "top_p"),
    ("sample", dict(top_p=0.0), ValueError, "top_p"),
    ("sample", dict(generator=0), TypeError, "generator"),
])
def test_bad_arguments(fn, kw, exc, words):
    toy = TinySeq2Seq()
    args = dict(bos_id=BOS, eos_id=EOS, max_new_tokens=5)
    args.update(kw)
    with pytest.raises(exc, match=words):
        getattr(gen, fn)(toy, batch(), **args)


def test_bad_inputs():
    toy = TinySeq2Seq()
    kw = dict(bos_id=BOS, eos_id=EOS, max_new_tokens=5)
    with pytest.raises(ValueError, match="src"):
        _greedy(toy, torch.ones(5, dtype=torch.long), **kw)
    with pytest.raises(TypeError, match="src"):
        _greedy(toy, torch.ones(2, 5), **kw)
    with pytest.raises(TypeError, match="src_key_padding_mask"):
        _greedy(toy, batch(), src_key_padding_mask=torch.ones(4, 7), **kw)
    with pytest.raises(TypeError, match="encode"):
        _greedy(object(), batch(), **kw)
    with pytest.raises(ValueError, match="method"):
        gen.generate(toy, batch(), method="viterbi", **kw)


# ----------------------------------------------------------------------------- decoder-only models

class TinyCache:
    """A decoder-only cache with the protocol's ``length`` and ``reorder(index)``."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    @property
    def length(self):
        return self.k.shape[1]

    def reorder(self, index):
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        return self


class TinyGPT(nn.Module):
    """One causal self-attention layer and an MLP: ``decode(tokens, cache=None) -> (logits, cache)``,
    positions continuing from ``cache.length`` (the decoder-only side of lib.generate's protocol)."""

    def __init__(self, vocab=VOCAB, d=16, max_len=64):
        super().__init__()
        self.cfg = type("Cfg", (), {"max_len": max_len})()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.5), nn.Linear(2 * d, d))
        self.out = nn.Linear(d, vocab)

    def decode(self, tokens, cache=None):
        start = 0 if cache is None else cache.length
        x = self.emb(tokens) + self.pos(torch.arange(start, start + tokens.shape[1]))
        k, v = self.k(x), self.v(x)
        if cache is not None:
            k, v = torch.cat([cache.k, k], 1), torch.cat([cache.v, v], 1)
        T, S = x.shape[1], k.shape[1]
        h = x + F.scaled_dot_product_attention(self.q(x), k, v, attn_mask=torch.ones(T, S, dtype=torch.bool).tril(S - T))
        h = h + self.mlp(h)
        return self.out(h), TinyCache(k, v)


@pytest.fixture
def gpt():
    torch.manual_seed(0)
    return TinyGPT().eval()


def prompt(seed=1, B=4, T=5):
    return torch.randint(4, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_decoder_only_greedy_continues_the_prompt(gpt):
    """Greedy on a decoder-only model = argmax of a full forward pass over prompt + tokens so far;
    only the new tokens come back, with their lengths and summed log-probabilities."""
    p = prompt()
    # an end token this random model does produce: row 0's third token, so that rows end at different times
    eos = gen.greedy(gpt, p, eos_id=None, max_new_tokens=3).tokens[0, 2].item()
    g = gen.greedy(gpt, p, eos_id=eos, max_new_tokens=12)
    assert isinstance(g, gen.Generation) and g.tokens.shape[0] == 4
    assert g.lengths[0].item() <= 3 and g.lengths.max().item() == g.tokens.shape[1] > 3
    for b in range(4):
        seq, logp = p[b:b + 1], 0.0
        for t in range(g.lengths[b].item()):
            logits = gpt.decode(seq)[0][0, -1]
            nxt = logits.argmax().item()
            assert g.tokens[b, t].item() == nxt
            logp += F.log_softmax(logits, -1)[nxt].item()
            seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
        n = g.lengths[b].item()
        assert (eos in g.tokens[b, :n].tolist()) == (g.tokens[b, n - 1].item() == eos)
        assert bool((g.tokens[b, n:] == PAD).all())
        assert g.scores[b].item() == pytest.approx(logp, abs=1e-4)
        assert g.sequences()[b] == g.tokens[b, :n].tolist()


@pytest.mark.parametrize("method, kw", [
    ("greedy", dict(eos_id=EOS, max_new_tokens=20)),
    ("greedy", dict(eos_id=None, max_new_tokens=25)),
    ("beam", dict(eos_id=EOS, max_new_tokens=12, num_beams=3, num_return_sequences=2)),
    ("sample", dict(eos_id=EOS, max_new_tokens=20, top_k=8, top_p=0.9, temperature=0.8)),
    ("greedy", dict(eos_id=EOS, max_new_tokens=20, repetition_penalty=1.5, no_repeat_ngram_size=2)),
    ("beam", dict(eos_id=EOS, max_new_tokens=12, num_beams=3, no_repeat_ngram_size=2, repetition_penalty=1.3)),
])
def test_decoder_only_cache_matches_no_cache(gpt, method, kw):
    runs = []
    for use_cache in (True, False):
        extra = dict(generator=torch.Generator().manual_seed(3)) if method == "sample" else {}
        runs.append(gen.generate(gpt, prompt(seed=2), method=method, use_cache=use_cache, **kw, **extra))
    a, b = runs
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.scores, b.scores)
    if kw["eos_id"] is None:
        assert a.tokens.shape == (4, kw["max_new_tokens"])


def test_decoder_only_beam_one_is_greedy(gpt):
    g = gen.greedy(gpt, prompt(seed=3), eos_id=EOS, max_new_tokens=15)
    b = gen.beam_search(gpt, prompt(seed=3), eos_id=EOS, max_new_tokens=15, num_beams=1, length_penalty_alpha=0.0)
    assert torch.equal(b.tokens[:, :g.tokens.shape[1]], g.tokens) and torch.equal(b.lengths, g.lengths)
    torch.testing.assert_close(b.scores, g.scores)


def test_decoder_only_input_errors(gpt):
    p = prompt()
    with pytest.raises(ValueError, match="bos_id"):
        gen.greedy(gpt, p, bos_id=BOS, eos_id=EOS, max_new_tokens=3)
    ragged = p.clone()
    ragged[1, :2] = PAD                               # a left-padded row
    with pytest.raises(ValueError, match=r"prompt rows \[1\].*pad_id"):
        gen.greedy(gpt, ragged, eos_id=EOS, max_new_tokens=3, pad_id=PAD)
    with pytest.raises(ValueError, match="padding mask"):
        gen.greedy(gpt, p, eos_id=EOS, max_new_tokens=3, src_key_padding_mask=torch.ones_like(p, dtype=torch.bool))
    with pytest.raises(ValueError, match="prompt"):
        gen.greedy(gpt, p[0], eos_id=EOS, max_new_tokens=3)
    with pytest.raises(ValueError, match="max_len=64"):
        gen.greedy(gpt, p, eos_id=EOS, max_new_tokens=61)     # 5 prompt + 60 fed positions > 64
    gen.greedy(gpt, p, eos_id=EOS, max_new_tokens=60)         # 64 positions: fits


def test_encoder_decoder_needs_bos(model):
    with pytest.raises(ValueError, match="bos_id"):
        gen.greedy(model, batch(), eos_id=EOS, max_new_tokens=3)


def test_decoding_runs_in_eval_mode_and_restores_training(gpt):
    expected = gen.greedy(gpt, prompt(), eos_id=None, max_new_tokens=10).tokens
    gpt.train()
    got = gen.greedy(gpt, prompt(), eos_id=None, max_new_tokens=10).tokens
    assert torch.equal(got, expected), "dropout must be off while decoding"
    assert gpt.training, "the model must be given back in training mode"


# ----------------------------------------------------------------------------- repetition control

def test_repetition_penalty_follows_ctrl():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 4.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    context = torch.tensor([[0, 1, 1], [4, 4, 4]])
    out = gen.apply_repetition_penalty(logits, context, 2.0)
    # row 0: tokens 0 (positive: halved) and 1 (negative: doubled); row 1: token 4 only
    assert out.tolist() == [[1.0, -2.0, 0.5, -3.0, 4.0], [1.0, 1.0, 1.0, 1.0, 0.5]]
    assert torch.equal(gen.apply_repetition_penalty(logits, context, 1.0), logits)
    assert logits[0, 0].item() == 2.0, "the input must not be changed in place"
    with pytest.raises(ValueError, match="repetition_penalty"):
        gen.apply_repetition_penalty(logits, context, 0.0)


def test_block_repeated_ngrams():
    logits = torch.zeros(2, 8)
    context = torch.tensor([[1, 2, 3, 1, 2, 5, 1, 2], [4, 4, 4, 4, 4, 4, 4, 6]])
    banned = lambda n: [sorted((row == float("-inf")).nonzero().flatten().tolist())
                        for row in gen.block_repeated_ngrams(logits, context, n)]
    # n=3: row 0 ends in (1, 2), seen before followed by 3 and 5; row 1 ends in (4, 6), never seen
    assert banned(3) == [[3, 5], []]
    assert banned(2) == [[3, 5], []]           # after 2 came 3 and 5; 6 never came before
    assert banned(1) == [[1, 2, 3, 5], [4, 6]]
    assert banned(9) == [[], []]               # longer than the context: nothing to repeat


def _ngrams(seq, n):
    return [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]


@pytest.mark.parametrize("method", ["greedy", "beam", "sample"])
def test_no_repeat_ngram_size_holds_for_every_decoder(gpt, model, method):
    """Without the option the tiny random models repeat themselves; with it no 2-gram occurs twice
    (decoder-only: counting the prompt too)."""
    extra = dict(num_beams=3) if method == "beam" else {}
    for m, x, kw, with_prompt in ((gpt, prompt(seed=5), {}, True), (model, batch(seed=5), dict(bos_id=BOS), False)):
        def run(**opts):
            if method == "sample":
                opts["generator"] = torch.Generator().manual_seed(0)
            return gen.generate(m, x, method=method, eos_id=None if method != "beam" else EOS,
                                max_new_tokens=30, **kw, **extra, **opts)
        repeats = 0
        for b, seq in enumerate(run().sequences()):
            full = (x[b].tolist() if with_prompt else []) + seq
            repeats += len(_ngrams(full, 2)) - len(set(_ngrams(full, 2)))
        assert repeats > 0, "the check needs a model that repeats itself without the option"
        for b, seq in enumerate(run(no_repeat_ngram_size=2).sequences()):
            full = (x[b].tolist() if with_prompt else []) + seq
            assert len(set(_ngrams(full, 2))) == len(_ngrams(full, 2)), (method, full)


def test_repetition_penalty_in_greedy_matches_manual_loop(gpt):
    p = prompt(seed=6)
    g = gen.greedy(gpt, p, eos_id=None, max_new_tokens=8, repetition_penalty=1.8)
    seq = p
    for t in range(8):
        logits = gpt.decode(seq)[0][:, -1]
        for b in range(seq.shape[0]):
            for tok in set(seq[b].tolist()):
                logits[b, tok] = logits[b, tok] / 1.8 if logits[b, tok] > 0 else logits[b, tok] * 1.8
        nxt = logits.argmax(-1)
        assert torch.equal(g.tokens[:, t], nxt)
        seq = torch.cat([seq, nxt[:, None]], 1)
    assert not torch.equal(g.tokens, gen.greedy(gpt, p, eos_id=None, max_new_tokens=8).tokens)


@pytest.mark.parametrize("kw, exc", [(dict(repetition_penalty=-1.0), ValueError),
                                     (dict(repetition_penalty="2"), TypeError),
                                     (dict(no_repeat_ngram_size=0), ValueError),
                                     (dict(no_repeat_ngram_size=2.0), TypeError)])
def test_bad_repetition_options(gpt, kw, exc):
    name = next(iter(kw))
    with pytest.raises(exc, match=name):
        gen.greedy(gpt, prompt(), eos_id=EOS, max_new_tokens=3, **kw)
