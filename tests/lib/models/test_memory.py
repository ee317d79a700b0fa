"""lib.models.memory: adaptive span, persistent memory, product-key memory."""
from __future__ import annotations

import pytest
import torch

from lib.models.memory import (AdaptiveSpanMask, CausalSelfAttention, CharLM, CharLMConfig,
                               ProductKeyMemory)


# ----------------------------------------------------------------------------- adaptive span

def test_span_mask_is_the_soft_ramp_formula():
    m = AdaptiveSpanMask(num_heads=2, max_span=40, ramp=4)
    with torch.no_grad():
        m.span_ratio[0] = 10 / 40   # z = 10
        m.span_ratio[1] = 1.0       # z = 40
    x = torch.arange(50, dtype=torch.float32)
    got = m.mask(x)
    for h, z in enumerate((10.0, 40.0)):
        expected = [min(max((4 + z - xi) / 4, 0.0), 1.0) for xi in x.tolist()]
        assert torch.allclose(got[h].flatten(), torch.tensor(expected))
    assert got[0, 0, 13] > 0 and got[0, 0, 14] == 0          # z + R = 14 is the first zero
    assert torch.allclose(m.spans(), torch.tensor([10.0, 40.0]))


def test_span_mask_renormalises_and_cuts_far_keys():
    torch.manual_seed(0)
    m = AdaptiveSpanMask(num_heads=1, max_span=16, ramp=2, init_ratio=0.25)   # z = 4
    T = 12
    w = torch.softmax(torch.randn(1, 1, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -1e9), -1)
    out = m(w)
    assert torch.allclose(out.sum(-1), torch.ones(1, 1, T))
    t = torch.arange(T)
    distance = t[:, None] - t[None, :]
    assert (out[0, 0][distance >= 6] == 0).all()              # beyond z + R
    assert (out[0, 0][(distance >= 0) & (distance <= 4)] > 0).all()


def test_span_penalty_shrinks_unneeded_spans():
    m = AdaptiveSpanMask(num_heads=3, max_span=64, ramp=8, init_ratio=0.5)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    before = m.spans().clone()
    for _ in range(5):
        opt.zero_grad()
        m.penalty().backward()
        opt.step()
    assert (m.spans() < before).all()


def test_a_span_pushed_below_zero_can_grow_back():
    # The penalty (with Adam's momentum) easily pushes a ratio a little below 0. The loss must
    # still reach it: a clamp inside the graph would give it zero gradient for good.
    m = AdaptiveSpanMask(num_heads=1, max_span=32, ramp=4)
    with torch.no_grad():
        m.span_ratio.fill_(-0.05)
    T = 8
    causal = torch.ones(T, T).tril()
    weights = (causal / causal.sum(-1, keepdim=True))[None, None]          # uniform causal attention
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for _ in range(20):
        opt.zero_grad()
        out = m(weights)
        loss = -out[0, 0, 7, 4]                                              # wants the key 3 back
        loss.backward()
        assert m.span_ratio.grad.abs().sum() > 0, "no gradient reaches a span at 0"
        opt.step()
    assert float(m.spans().detach()) > 1.0
    assert 0.0 <= float(m.span_ratio.detach()) <= 1.0


def test_span_ratio_stays_in_range():
    m = AdaptiveSpanMask(num_heads=2, max_span=10, ramp=2)
    with torch.no_grad():
        m.span_ratio.copy_(torch.tensor([-0.5, 1.5]).view(2, 1, 1))
    assert torch.equal(m.spans(), torch.tensor([0.0, 10.0]))
    assert torch.equal(m.mask(torch.tensor([0.0, 11.0, 12.0])).reshape(2, 3),
                       torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.5, 0.0]]))


def test_adaptive_model_spans_receive_gradient_from_the_loss():
    torch.manual_seed(0)
    cfg = CharLMConfig(vocab_size=11, block_size=16, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                       dropout=0.0, attention="adaptive", max_span=16, span_ramp=4, span_init=0.3)
    model = CharLM(cfg)
    x = torch.randint(0, 11, (4, 16))
    _, loss = model(x, x)
    loss.backward()
    assert model.blocks[0].attn.span.span_ratio.grad.abs().sum() > 0
    assert model.spans().shape == (1, 2)


# ----------------------------------------------------------------------------- the layer

@pytest.mark.parametrize("kwargs", [{}, {"span": (8, 2, 1.0)}, {"num_persistent": 3}])
def test_causal_attention_never_looks_ahead(kwargs):
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, **kwargs).eval()
    x = torch.randn(2, 10, 16)
    y = x.clone()
    y[:, 6:] = torch.randn(2, 4, 16)             # change the future only
    assert torch.allclose(attn(x)[:, :6], attn(y)[:, :6], atol=1e-6)
    assert not torch.allclose(attn(x)[:, 6:], attn(y)[:, 6:])


def test_persistent_vectors_are_attended_by_every_query():
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, num_persistent=5).eval()
    _, w = attn(torch.randn(2, 7, 16), return_weights=True)
    assert w.shape == (2, 4, 7, 5 + 7)
    assert (w[..., :5] > 0).all()                              # memory slots are always visible
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 7))
    assert (w[..., 5:][..., ~torch.ones(7, 7, dtype=torch.bool).tril()] == 0).all()


def test_all_attention_layer_replaces_the_feed_forward_block():
    common = dict(vocab_size=50, block_size=32, d_model=32, num_heads=4, num_layers=2, d_ff=128, dropout=0.0)
    standard = CharLM(CharLMConfig(**common))
    persistent = CharLM(CharLMConfig(**common, attention="persistent", num_persistent=16))
    assert all(b.ffn is None for b in persistent.blocks)
    d, f, N, L = 32, 128, 16, 2
    ffn = d * f + f + f * d + d + 2 * d                      # two linears + the second LayerNorm
    memory = 2 * N * d                                        # keys and values, all heads
    assert standard.num_parameters() - persistent.num_parameters() == L * (ffn - memory)


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="attention must be"):
        CharLMConfig(vocab_size=5, attention="sparse")
    with pytest.raises(ValueError, match="num_persistent"):
        CharLMConfig(vocab_size=5, attention="persistent")
    with pytest.raises(ValueError, match="exceeds block_size"):
        CharLMConfig(vocab_size=5, block_size=16, attention="adaptive", max_span=32)
    with pytest.raises(ValueError, match="no adaptive span"):
        CharLM(CharLMConfig(vocab_size=5)).spans()
    with pytest.raises(ValueError, match="block_size"):
        CharLM(CharLMConfig(vocab_size=5, block_size=8))(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("attention", ["standard", "adaptive", "persistent"])
def test_each_language_model_overfits_one_batch(attention):
    torch.manual_seed(0)
    cfg = CharLMConfig(vocab_size=12, block_size=12, d_model=32, num_heads=2, num_layers=2, d_ff=32,
                       dropout=0.0, attention=attention, max_span=12, span_ramp=4, span_init=1.0,
                       num_persistent=8 if attention == "persistent" else 0)
    model = CharLM(cfg)
    x = torch.randint(0, 12, (2, 13))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(250):
        opt.zero_grad()
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


# ----------------------------------------------------------------------------- product keys

@pytest.mark.parametrize("n_keys,k,d_key", [(16, 4, 8), (64, 8, 32), (32, 32, 16), (50, 1, 6)])
def test_product_key_search_is_exactly_the_brute_force_top_k(n_keys, k, d_key):
    torch.manual_seed(n_keys + k)
    pkm = ProductKeyMemory(d_in=8, d_out=4, n_keys=n_keys, k=k, d_key=d_key)
    q = torch.randn(200, d_key)
    with torch.no_grad():
        scores, idx = pkm.search(q)
        ref_scores, ref_idx = pkm.brute_force_search(q)
    assert torch.allclose(scores, ref_scores, atol=1e-6)
    assert torch.equal(idx, ref_idx)


def test_product_key_indices_address_the_right_sub_keys():
    torch.manual_seed(0)
    pkm = ProductKeyMemory(d_in=4, d_out=3, n_keys=10, k=3, d_key=4)
    q = torch.randn(5, 4)
    with torch.no_grad():
        scores, idx = pkm.search(q)
    i, j = idx // 10, idx % 10
    q1, q2 = q.chunk(2, dim=-1)
    direct = (q1[:, None, :] * pkm.sub_keys[0][i]).sum(-1) + (q2[:, None, :] * pkm.sub_keys[1][j]).sum(-1)
    assert torch.allclose(scores, direct.detach(), atol=1e-6)


def test_product_key_memory_forward_and_gradients():
    torch.manual_seed(0)
    pkm = ProductKeyMemory(d_in=12, d_out=6, n_keys=8, k=2, d_key=4)
    out = pkm(torch.randn(3, 5, 12))
    assert out.shape == (3, 5, 6)
    out.sum().backward()
    assert pkm.sub_keys.grad.abs().sum() > 0 and pkm.values.weight.grad.abs().sum() > 0
    assert (pkm.values.weight.grad.abs().sum(-1) > 0).sum() <= 3 * 5 * 2   # only the chosen slots


def test_product_key_memory_rejects_bad_arguments():
    with pytest.raises(ValueError, match="even"):
        ProductKeyMemory(4, 4, n_keys=8, k=2, d_key=5)
    with pytest.raises(ValueError, match="k must be"):
        ProductKeyMemory(4, 4, n_keys=8, k=9, d_key=4)
    with pytest.raises(ValueError, match="d_key=4"):
        ProductKeyMemory(4, 4, n_keys=8, k=2, d_key=4).search(torch.randn(3, 6))


def test_non_embedding_count_leaves_out_the_tied_token_table_and_the_positions():
    model = CharLM(CharLMConfig(vocab_size=50, block_size=32, d_model=16, num_heads=2, num_layers=1, d_ff=32))
    assert model.head.weight is model.tok.weight
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - 50 * 16 - 32 * 16


def test_the_layer_is_lib_multi_head_attention_with_a_causal_mask():
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 4).eval()
    assert [n for n, _ in layer.named_children()] == ["mha"]    # no projections of its own
    x = torch.randn(2, 6, 16)
    expected, _ = layer.mha(x, x, x, mask=torch.ones(6, 6, dtype=torch.bool).tril())
    torch.testing.assert_close(layer(x), expected)
