"""lib.models.t5 against Hugging Face's T5, the KV cache, the parameter count of T5-small, and
the span corruption of lib.data.span_corruption (property tests on large samples)."""
import collections

import pytest
import torch

from lib import generate as gen
from lib.data.span_corruption import noise_counts, noise_mask, span_corrupt, spans
from lib.layers import count_parameters
from lib.models.reference import randomise
from lib.models.t5 import (PATTERNS, PUBLISHED, RMSNorm, T5, T5Config, load_hf_t5, mask_pattern,
                           relative_position_bucket)

transformers = pytest.importorskip("transformers")
HFAttention = transformers.models.t5.modeling_t5.T5Attention

SMALL = dict(vocab_size=61, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
             relative_attention_num_buckets=8, relative_attention_max_distance=20)


# ----------------------------------------------------------------------------- buckets

@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (16, 64), (32, 16)])
def test_relative_position_bucket_equals_transformers(bidirectional, num_buckets, max_distance):
    q = torch.arange(0, 200)[:, None]
    k = torch.arange(0, 400)[None, :]
    rel = k - q                                       # every distance from -199 to 399
    ours = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    ref = HFAttention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                max_distance=max_distance)
    assert torch.equal(ours, ref)


def test_relative_position_bucket_shape_of_the_scheme():
    d = torch.arange(-300, 301)
    bi = relative_position_bucket(d, True)
    # 16 buckets per direction: distances 0..7 exact, then logarithmic, >= 128 in the last one
    assert bi[293:301].flip(0).tolist() == list(range(8))               # key 0..7 before: 0..7
    assert bi[301:309].tolist() == [16 + i for i in range(1, 9)]         # keys 1..8 after: 17..24
    assert int(bi[300 - 128]) == 15 and int(bi[0]) == 15                  # far before: last lower bucket
    assert int(bi[300 + 128]) == 31 and int(bi[-1]) == 31
    assert set(bi.tolist()) == set(range(32)) - {16}     # distance 0 is in the lower half
    causal = relative_position_bucket(d, False)
    assert (causal[300:] == 0).all()                                     # the future shares bucket 0
    assert causal[300 - 15:301].flip(0).tolist() == list(range(16))       # 0..15 exact
    assert int(causal[0]) == 31 and set(causal.tolist()) == set(range(32))
    assert (causal.flip(0)[300:].diff() >= 0).all()                       # monotone in the distance


def test_relative_position_bucket_rejects_bad_input():
    with pytest.raises(TypeError, match="relative_position"):
        relative_position_bucket(torch.zeros(3), True)
    with pytest.raises(ValueError, match="num_buckets"):
        relative_position_bucket(torch.zeros(3, dtype=torch.long), True, num_buckets=2)


# ----------------------------------------------------------------------------- RMSNorm

def test_rmsnorm_formula_and_hf():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g) * 3 + 2
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, generator=g))
    expected = norm.weight * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)
    hf = transformers.models.t5.modeling_t5.T5LayerNorm(16)
    hf.weight.data.copy_(norm.weight.data)
    torch.testing.assert_close(norm(x), hf(x))
    # not LayerNorm: the mean is not subtracted
    ln = torch.nn.functional.layer_norm(x, (16,), norm.weight.detach(), None, eps=1e-6)
    assert (norm(x) - ln).abs().max() > 0.1


# ----------------------------------------------------------------------------- against transformers

def _pair(feed_forward, tie, seed=0, **changes):
    sizes = SMALL | changes
    torch.manual_seed(seed)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        **sizes, feed_forward_proj=feed_forward, tie_word_embeddings=tie, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    randomise(hf, seed=seed + 1, only="layer_norm")   # norm weights away from 1, so a forgotten one shows
    cfg = T5Config.from_hf(hf.config)
    assert cfg == T5Config(**sizes, feed_forward=feed_forward, tie_word_embeddings=tie, dropout=0.0)
    assert T5Config.from_hf(hf.config.to_dict()) == cfg
    ours = T5(cfg).eval()
    load_hf_t5(ours, hf)
    return ours, hf


def test_from_hf_refuses_what_the_course_t5_does_not_implement():
    with pytest.raises(ValueError, match="feed_forward_proj"):
        T5Config.from_hf({**SMALL, "feed_forward_proj": "gated-silu"})
    with pytest.raises(TypeError, match="T5Config"):
        T5Config.from_hf(SMALL.items())


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, SMALL["vocab_size"], (3, 30), generator=g)
    src[1, 21:] = 0
    src[2, 6:] = 0
    labels = torch.randint(2, SMALL["vocab_size"], (3, 25), generator=g)   # longer than max_distance 20
    return src, labels


@pytest.mark.parametrize("feed_forward,tie", [("relu", True), ("gated-gelu", False), ("gated-gelu", True)])
def test_logits_equal_hf(feed_forward, tie):
    ours, hf = _pair(feed_forward, tie)
    src, labels = _batch()
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=(src != 0).long(), labels=labels)
        logits, loss = ours(src, labels=labels)
    torch.testing.assert_close(logits, ref.logits, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(loss, ref.loss, atol=1e-5, rtol=1e-5)
    # the encoder outputs too (real positions)
    enc = hf.encoder(input_ids=src, attention_mask=(src != 0).long()).last_hidden_state
    torch.testing.assert_close(ours.encode(src), enc, atol=1e-5, rtol=1e-5)


def test_position_bias_lives_in_first_layers_only():
    cfg = T5Config(**SMALL)
    model = T5(cfg)
    owners = sorted(n for n, _ in model.named_parameters() if "relative_attention_bias" in n)
    assert owners == ["decoder.layers.0.self_attn.relative_attention_bias.weight",
                      "encoder.layers.0.self_attn.relative_attention_bias.weight"]
    # and the shared bias changes every layer's output: zero it and the encoder output moves
    src, _ = _batch()
    before = model.eval().encode(src)
    with torch.no_grad():
        model.encoder.layers[0].self_attn.relative_attention_bias.weight.zero_()
    assert (model.encode(src) - before).abs().max() > 1e-3


def test_t5_small_parameter_count_equals_hf_t5model():
    n_ours = count_parameters(T5, PUBLISHED["T5-small"])
    with torch.device("meta"):
        n_hf = sum(p.numel() for p in transformers.T5Model(transformers.T5Config()).parameters())
    assert n_ours == n_hf == 60_506_624
    # v1.1 layout: gated FFN and an untied output layer change the count as they should
    v11 = T5Config(feed_forward="gated-gelu", tie_word_embeddings=False)
    assert count_parameters(T5, v11) == n_ours + 12 * 512 * 2048 + 32128 * 512
    assert count_parameters(T5, PUBLISHED["T5-small"], exclude_embeddings=True) == n_ours - 32128 * 512


# ----------------------------------------------------------------------------- decoding

def test_cache_gives_the_logits_of_one_pass_and_generate_agrees():
    # (equal layer counts: transformers' generate() sizes its cache by the encoder's layers)
    ours, hf = _pair("gated-gelu", False, seed=3, num_decoder_layers=2)
    src, labels = _batch(1)
    dec_in = ours.shift_right(labels)
    memory = ours.encode(src)
    with torch.no_grad():
        full, _ = ours.decode(dec_in, memory, src != 0)
        cache, steps = None, []
        for t in range(dec_in.shape[1]):
            logits, cache = ours.decode(dec_in[:, t:t + 1], memory, src != 0, cache=cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    kw = dict(eos_id=1, max_new_tokens=12, bos_id=0, pad_id=0)
    a = gen.greedy(ours, src, use_cache=True, **kw)
    b = gen.greedy(ours, src, use_cache=False, **kw)
    assert torch.equal(a.tokens, b.tokens)
    ref = hf.generate(input_ids=src, attention_mask=(src != 0).long(), max_new_tokens=12, do_sample=False,
                      num_beams=1, min_new_tokens=12, eos_token_id=None)[:, 1:]
    assert torch.equal(gen.greedy(ours, src, eos_id=None, max_new_tokens=12, bos_id=0, pad_id=0).tokens, ref)


def test_bad_input_is_rejected():
    model = T5(T5Config(**SMALL))
    with pytest.raises(TypeError, match="src"):
        model.encode(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="src"):
        model.encode(torch.full((2, 3), 99))
    with pytest.raises(ValueError, match="feed_forward"):
        T5Config(feed_forward="gelu")
    with pytest.raises(ValueError, match="labels or decoder_input_ids"):
        model(torch.ones(2, 3, dtype=torch.long))


# ----------------------------------------------------------------------------- attention patterns

def test_mask_patterns():
    assert mask_pattern("fully_visible", 4).all()
    causal = mask_pattern("causal", 5)
    assert torch.equal(causal, torch.ones(5, 5, dtype=torch.bool).tril())
    prefix = mask_pattern("causal_with_prefix", 5, prefix=2)
    assert prefix[:, :2].all() and torch.equal(prefix[:, 2:], causal[:, 2:])
    assert not prefix[0, 2] and prefix[0, 1]         # a prefix position sees the whole prefix, not beyond
    assert torch.equal(mask_pattern("causal_with_prefix", 5, prefix=0), causal)
    assert set(PATTERNS) == {"fully_visible", "causal", "causal_with_prefix"}
    with pytest.raises(ValueError, match="prefix"):
        mask_pattern("causal_with_prefix", 3, prefix=4)


# ----------------------------------------------------------------------------- span corruption

def test_paper_example():
    words = "Thank you for inviting me to your party last week .".split()
    mask = torch.tensor([w in ("for", "inviting", "last") for w in words])
    inputs, targets = span_corrupt(words, sentinels=["<X>", "<Y>", "<Z>"], mask=mask)
    assert " ".join(inputs) == "Thank you <X> me to your party <Y> week ."
    assert " ".join(targets) == "<X> for inviting <Y> last <Z>"


def test_noise_counts():
    assert noise_counts(100) == (15, 5)
    assert noise_counts(10) == (2, 1)        # round(1.5) = 2 tokens, one span
    assert noise_counts(2) == (1, 1)
    with pytest.raises(ValueError, match="length"):
        noise_counts(1)
    with pytest.raises(ValueError, match="noise_density"):
        noise_counts(10, noise_density=0.0)


def test_span_corruption_properties_on_a_large_sample():
    g = torch.Generator().manual_seed(0)
    span_lengths, noise_fraction, starts = collections.Counter(), [], collections.Counter()
    sentinels = list(range(1000, 1100))
    for trial in range(3000):
        n = int(torch.randint(20, 200, (1,), generator=g))
        tokens = list(range(n))                       # distinct tokens: reconstruction is checkable
        mask = noise_mask(n, generator=g)
        num_noise, num_spans = noise_counts(n)
        runs = spans(mask)
        assert int(mask.sum()) == num_noise and len(runs) == num_spans
        assert not mask[0]                            # the text starts with a kept token
        assert all(b < n and not mask[b] for _, b in runs[:-1])    # spans never touch
        inputs, targets = span_corrupt(tokens, sentinels, eos_id=-1, mask=mask)
        assert len(inputs) == n - num_noise + num_spans + 1
        assert len(targets) == num_noise + num_spans + 2
        assert targets[-2] == sentinels[num_spans] and inputs[-1] == targets[-1] == -1
        # putting the spans back after their sentinels gives the original text
        fill = {}
        for s in range(num_spans):
            a, b = targets.index(sentinels[s]), targets.index(sentinels[s + 1])
            fill[sentinels[s]] = targets[a + 1:b]
        rebuilt = [t for x in inputs[:-1] for t in (fill[x] if x in fill else [x])]
        assert rebuilt == tokens
        span_lengths.update(b - a for a, b in runs)
        noise_fraction.append(num_noise / n)
        starts.update(a for a, _ in runs)
    total = sum(span_lengths.values())
    mean_span = sum(k * v for k, v in span_lengths.items()) / total
    assert abs(mean_span - 3.0) < 0.15, mean_span
    assert abs(sum(noise_fraction) / len(noise_fraction) - 0.15) < 0.005
    assert min(span_lengths) == 1 and max(span_lengths) > 6          # lengths vary, not all 3
    assert len(starts) > 150                                          # spans start all over the text


def test_span_positions():
    # over many draws of one length: the first token is always kept and the last always dropped
    # (kept and dropped runs alternate, kept first, as in T5's random_spans_noise_mask); away from
    # the two ends every position is dropped about equally often
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(60)
    for _ in range(4000):
        counts += noise_mask(60, generator=g).float()
    freq = counts / 4000
    assert freq[0] == 0 and freq[-1] == 1
    middle = freq[10:45]
    assert middle.min() > 0.09 and middle.max() < 0.14 and middle.max() - middle.min() < 0.03


def test_span_corrupt_rejects_bad_input():
    with pytest.raises(ValueError, match="sentinel"):
        span_corrupt(list(range(100)), sentinels=[1, 2], generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="mask"):
        span_corrupt([1, 2, 3], sentinels=[7, 8], mask=torch.tensor([True, False]))
