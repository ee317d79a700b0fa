"""lib.attention against hand-written formulas and the PyTorch references.

Every score function is checked against the formula written out with loops or explicit
tensor algebra; the scaled dot-product and multi-head attention against
``F.scaled_dot_product_attention`` and ``torch.nn.MultiheadAttention`` (weights copied in).
Masks are bool, True = may attend.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lib import attention as A

ATOL = 1e-5



def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=gen(seed))


# ----------------------------------------------------------------------------- masks

def test_padding_mask_values():
    m = A.padding_mask(torch.tensor([3, 1, 0]), 4)
    assert m.dtype == torch.bool
    assert m.tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]
    assert A.padding_mask(torch.tensor([2, 3])).shape == (2, 3)        # max_len defaults to the longest


@pytest.mark.parametrize("lengths, max_len, match", [
    (torch.tensor([[1, 2]]), None, "1-D"),
    (torch.tensor([2, -1]), None, "non-negative"),
    (torch.tensor([5, 1]), 3, "exceeds max_len"),
])
def test_padding_mask_errors(lengths, max_len, match):
    with pytest.raises(ValueError, match=match):
        A.padding_mask(lengths, max_len)


def test_padding_mask_from_tokens():
    tokens = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert A.padding_mask_from_tokens(tokens, 0).tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(TypeError, match="integer ids"):
        A.padding_mask_from_tokens(tokens.float(), 0)


def test_look_ahead_mask():
    m = A.look_ahead_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    for i in range(4):
        for j in range(4):
            assert bool(m[i, j]) == (j <= i)
    with pytest.raises(ValueError, match="positive"):
        A.look_ahead_mask(0)


def test_combine_masks():
    pad = A.padding_mask(torch.tensor([2, 3]), 3)[:, None, :]      # (B, 1, S)
    causal = A.look_ahead_mask(3)                                   # (T, T)
    both = A.combine_masks(pad, None, causal)
    assert both.shape == (2, 3, 3)
    assert torch.equal(both, pad & causal)
    assert A.combine_masks(None, None) is None
    assert A.combine_masks(None, causal) is causal


# ----------------------------------------------------------------------------- masked softmax

def test_masked_softmax_without_mask_is_softmax():
    x = randn(2, 3, 5)
    assert torch.allclose(A.masked_softmax(x), torch.softmax(x, -1))


def test_masked_positions_get_exactly_zero_and_rest_renormalised():
    scores = randn(3, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    w = A.masked_softmax(scores, mask)
    assert torch.all(w[~mask] == 0.0)                              # exactly zero, not just small
    for b in range(3):                                             # softmax over the kept scores only
        keep = mask[b]
        assert torch.allclose(w[b, keep], torch.softmax(scores[b, keep], -1), atol=1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(3))


def test_masked_softmax_with_huge_scores_still_exact_zero():
    scores = torch.tensor([[1e30, -1e30, 3.0]])
    mask = torch.tensor([[False, True, True]])
    w = A.masked_softmax(scores, mask)
    assert w[0, 0].item() == 0.0 and torch.isfinite(w).all()
    assert torch.allclose(w.sum(-1), torch.ones(1))


def test_all_masked_row_gives_zeros_not_nan():
    scores = randn(2, 4).requires_grad_()
    mask = torch.tensor([[False] * 4, [True, True, False, False]])
    w = A.masked_softmax(scores, mask)
    assert not torch.isnan(w).any()
    assert torch.all(w[0] == 0.0)
    assert torch.allclose(w[1].sum(), torch.tensor(1.0))
    w.sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[0] == 0.0)                        # no gradient into a dead row


def test_masked_softmax_rejects_non_bool_and_unbroadcastable_masks():
    scores = randn(2, 3)
    with pytest.raises(TypeError, match="torch.bool"):
        A.masked_softmax(scores, torch.ones(2, 3))
    with pytest.raises(TypeError, match="torch.bool"):
        A.masked_softmax(scores, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="boolean torch.Tensor"):
        A.masked_softmax(scores, [[True, True, True]] * 2)
    with pytest.raises(ValueError, match="does not broadcast"):
        A.masked_softmax(scores, torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- Luong / Bahdanau

def test_dot_scores_match_the_formula():
    q, k = randn(2, 4, seed=1), randn(2, 5, 4, seed=2)
    s = A.dot_scores(q, k)
    assert s.shape == (2, 5)
    for b in range(2):
        for i in range(5):
            assert torch.allclose(s[b, i], (q[b] * k[b, i]).sum(), atol=1e-6)
    q3 = randn(2, 3, 4, seed=3)                                    # several queries at once
    assert torch.allclose(A.dot_scores(q3, k), torch.stack([A.dot_scores(q3[:, t], k) for t in range(3)], 1),
                          atol=1e-6)


@pytest.mark.parametrize("q, k, exc, match", [
    (randn(2, 4), randn(2, 5, 3), ValueError, "query size 4 != key size 3"),
    (randn(3, 4), randn(2, 5, 4), ValueError, "batch sizes differ"),
    (randn(2, 4), randn(5, 4), ValueError, "keys must have at least 3 dimensions"),
    (randn(4), randn(2, 5, 4), ValueError, "query must have at least 2 dimensions"),
    (torch.ones(2, 4, dtype=torch.long), randn(2, 5, 4), TypeError, "query must be a floating-point"),
    ([[1.0] * 4] * 2, randn(2, 5, 4), TypeError, "query must be a torch.Tensor"),
])
def test_dot_scores_errors_name_the_argument(q, k, exc, match):
    with pytest.raises(exc, match=match):
        A.dot_scores(q, k)


def test_dot_attention_context_is_weighted_sum_and_padding_gets_zero():
    q, k, v = randn(2, 4, seed=1), randn(2, 5, 4, seed=2), randn(2, 5, 6, seed=3)
    mask = A.padding_mask(torch.tensor([5, 2]), 5)
    ctx, w = A.DotAttention()(q, k, mask)
    ref_w = torch.softmax(torch.einsum("bd,bsd->bs", q, k).masked_fill(~mask, float("-inf")), -1)
    assert torch.allclose(w, ref_w, atol=1e-6)
    assert torch.all(w[1, 2:] == 0.0)
    assert torch.allclose(ctx, torch.einsum("bs,bsd->bd", ref_w, k), atol=1e-6)
    ctx_v, _ = A.DotAttention()(q, k, mask, values=v)              # separate values
    assert ctx_v.shape == (2, 6)
    assert torch.allclose(ctx_v, torch.einsum("bs,bsd->bd", ref_w, v), atol=1e-6)


def test_dot_attention_many_queries_with_2d_padding_mask():
    q, k = randn(2, 3, 4, seed=1), randn(2, 5, 4, seed=2)
    mask = A.padding_mask(torch.tensor([5, 3]), 5)
    ctx, w = A.DotAttention()(q, k, mask)
    assert ctx.shape == (2, 3, 4) and w.shape == (2, 3, 5)
    assert torch.all(w[1, :, 3:] == 0.0)
    for t in range(3):                                              # same as one query at a time
        c1, w1 = A.DotAttention()(q[:, t], k, mask)
        assert torch.allclose(w[:, t], w1, atol=1e-6) and torch.allclose(ctx[:, t], c1, atol=1e-6)


def test_general_attention_matches_the_formula():
    torch.manual_seed(0)
    att = A.GeneralAttention(query_dim=4, key_dim=3)
    q, k = randn(2, 4, seed=1), randn(2, 5, 3, seed=2)
    W = att.W.weight                                                # (query_dim, key_dim)
    expected = torch.stack([torch.stack([q[b] @ (W @ k[b, i]) for i in range(5)]) for b in range(2)])
    assert torch.allclose(att.scores(q, k), expected, atol=1e-5)
    ctx, w = att(q, k)
    assert torch.allclose(w, torch.softmax(expected, -1), atol=1e-5)
    assert torch.allclose(ctx, torch.einsum("bs,bsd->bd", w, k), atol=1e-5)
    with pytest.raises(ValueError, match="key_dim=3"):
        att(q, randn(2, 5, 4))


def test_additive_attention_matches_the_formula_by_hand():
    torch.manual_seed(0)
    att = A.AdditiveAttention(query_dim=4, key_dim=3, hidden_dim=6)
    q, k = randn(2, 4, seed=1), randn(2, 5, 3, seed=2)
    Wq, Wk, v = att.W_q.weight, att.W_k.weight, att.v.weight[0]
    expected = torch.empty(2, 5)
    for b in range(2):
        for i in range(5):                                          # v · tanh(W_q s + W_k h_i)
            expected[b, i] = v @ torch.tanh(Wq @ q[b] + Wk @ k[b, i])
    assert torch.allclose(att.scores(q, k), expected, atol=1e-5)
    mask = A.padding_mask(torch.tensor([5, 3]), 5)
    ctx, w = att(q, k, mask)
    ref_w = torch.softmax(expected.masked_fill(~mask, float("-inf")), -1)
    assert torch.allclose(w, ref_w, atol=1e-5)
    assert torch.all(w[1, 3:] == 0.0)
    assert torch.allclose(ctx, torch.einsum("bs,bsd->bd", ref_w, k), atol=1e-5)
    # several queries at once give the same scores as one at a time
    q3 = randn(2, 3, 4, seed=3)
    s3 = att.scores(q3, k)
    assert s3.shape == (2, 3, 5)
    assert torch.allclose(s3, torch.stack([att.scores(q3[:, t], k) for t in range(3)], 1), atol=1e-5)


def test_additive_attention_with_bias_and_errors():
    att = A.AdditiveAttention(4, 3, 6, bias=True)
    assert att.W_q.bias is not None and att.W_k.bias is not None
    with pytest.raises(ValueError, match="query_dim=4"):
        att(randn(2, 5), randn(2, 5, 3))
    with pytest.raises(ValueError, match="key_dim=3"):
        att(randn(2, 4), randn(2, 5, 2))
    with pytest.raises(ValueError, match="batch sizes differ"):
        att(randn(3, 4), randn(2, 5, 3))
    with pytest.raises(TypeError, match="keys must be a floating-point"):
        att(randn(2, 4), torch.ones(2, 5, 3, dtype=torch.long))


# ----------------------------------------------------------------------------- scaled dot-product

@pytest.mark.parametrize("mask_kind", [None, "padding", "causal", "both"])
def test_scaled_dot_product_matches_torch(mask_kind):
    B, H, T, S, D = 2, 3, 4, 4, 8
    q, k, v = randn(B, H, T, D, seed=1), randn(B, H, S, D, seed=2), randn(B, H, S, D, seed=3)
    pad = A.padding_mask(torch.tensor([4, 2]), S)[:, None, None, :]     # (B, 1, 1, S)
    causal = A.look_ahead_mask(T)
    mask = {None: None, "padding": pad, "causal": causal, "both": A.combine_masks(pad, causal)}[mask_kind]
    out, w = A.scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=ATOL)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        assert torch.all(w.masked_select(~mask.expand_as(w)) == 0.0)
    assert torch.allclose(w, torch.softmax(scores, -1), atol=ATOL)


def test_scaled_dot_product_all_masked_query_gives_zero_output():
    q, k, v = randn(1, 2, 4, seed=1), randn(1, 3, 4, seed=2), randn(1, 3, 5, seed=3)
    mask = torch.tensor([[[False, False, False], [True, False, True]]])
    out, w = A.scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.all(out[0, 0] == 0.0) and torch.all(w[0, 0] == 0.0)


@pytest.mark.parametrize("q, k, v, exc, match", [
    (randn(2, 3, 4), randn(2, 5, 6), randn(2, 5, 4), ValueError, "share the last dimension d_k"),
    (randn(2, 3, 4), randn(2, 5, 4), randn(2, 6, 4), ValueError, "same number of positions"),
    (randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 4).double(), TypeError, "share a dtype"),
    (torch.ones(2, 3, 4, dtype=torch.long), randn(2, 5, 4), randn(2, 5, 4), TypeError, "q must be a floating"),
    (randn(4), randn(2, 5, 4), randn(2, 5, 4), ValueError, "q must have at least 2 dimensions"),
])
def test_scaled_dot_product_errors(q, k, v, exc, match):
    with pytest.raises(exc, match=match):
        A.scaled_dot_product_attention(q, k, v)


def test_scaled_dot_product_dropout_only_in_training():
    q = k = v = randn(1, 4, 8)
    out_eval, w_eval = A.scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    ref, _ = A.scaled_dot_product_attention(q, k, v)
    assert torch.equal(out_eval, ref)
    torch.manual_seed(0)
    _, w_train = A.scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    assert (w_train == 0).any() and not torch.allclose(w_train, w_eval)


# ----------------------------------------------------------------------------- heads

def test_split_and_merge_heads_are_inverse():
    x = randn(2, 5, 12)
    h = A.split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    assert torch.equal(h[:, 1], x[..., 4:8])                         # head 1 = features 4..7
    assert torch.equal(A.merge_heads(h), x)
    with pytest.raises(ValueError, match="not divisible by num_heads=5"):
        A.split_heads(x, 5)


def _copy_into_torch_mha(ours: A.MultiHeadAttention) -> torch.nn.MultiheadAttention:
    ref = torch.nn.MultiheadAttention(ours.d_model, ours.num_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)
    return ref.eval()


@pytest.mark.parametrize("case", ["none", "padding", "causal", "both", "cross"])
def test_multihead_matches_torch(case):
    torch.manual_seed(0)
    d, H, B, T = 16, 4, 3, 5
    ours = A.MultiHeadAttention(d, H).eval()
    ref = _copy_into_torch_mha(ours)
    x = randn(B, T, d, seed=1)
    mem = randn(B, 7, d, seed=2) if case == "cross" else x
    S = mem.shape[1]
    kpm = A.padding_mask(torch.tensor([S, S - 2, 2]), S) if case in ("padding", "both", "cross") else None
    causal = A.look_ahead_mask(T) if case in ("causal", "both") else None
    out, w = ours(x, mem, mem, mask=causal, key_padding_mask=kpm)
    # torch's bool masks mean the opposite: True = NOT allowed to attend
    ref_out, ref_w = ref(x, mem, mem, key_padding_mask=None if kpm is None else ~kpm,
                         attn_mask=None if causal is None else ~causal, average_attn_weights=False)
    assert out.shape == (B, T, d) and w.shape == (B, H, T, S)
    assert torch.allclose(out, ref_out, atol=ATOL)
    assert torch.allclose(w, ref_w, atol=ATOL)
    if kpm is not None:
        assert torch.all(w[2, :, :, 2:] == 0.0)
    fused, none_w = ours(x, mem, mem, mask=causal, key_padding_mask=kpm, fused=True)
    assert none_w is None and torch.allclose(fused, out, atol=ATOL)


def test_multihead_errors():
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        A.MultiHeadAttention(16, 3)
    mha = A.MultiHeadAttention(8, 2)
    x = randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"query must be \(batch, time, d_model=8\)"):
        mha(randn(2, 4, 6), x, x)
    with pytest.raises(ValueError, match="key must have at least 3 dimensions"):
        mha(x, randn(4, 8), x)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        mha(x, x, x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.bool"):
        mha(x, x, x, mask=torch.ones(4, 4))
    with pytest.raises(TypeError, match="value must be a floating-point"):
        mha(x, x, torch.ones(2, 4, 8, dtype=torch.long))


def test_gradients_flow_through_every_parameter():
    torch.manual_seed(0)
    x = randn(2, 4, 8).requires_grad_()
    mem = randn(2, 4, 8, seed=1).requires_grad_()
    mha = A.MultiHeadAttention(8, 2)
    kpm = A.padding_mask(torch.tensor([4, 2]), 4)
    out, _ = mha(x, mem, mem, mask=A.look_ahead_mask(4), key_padding_mask=kpm)
    out.square().sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # the padded key/value positions of sequence 1 get no gradient at all
    assert torch.all(mem.grad[1, 2:] == 0.0) and mem.grad[1, :2].abs().sum() > 0

    add = A.AdditiveAttention(4, 3, 5)
    q, k = randn(2, 4).requires_grad_(), randn(2, 6, 3).requires_grad_()
    ctx, _ = add(q, k, A.padding_mask(torch.tensor([6, 3]), 6))
    ctx.sum().backward()
    for name, p in add.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert torch.all(k.grad[1, 3:] == 0.0)                          # masked keys: no gradient
    assert q.grad.abs().sum() > 0


def test_is_causal_equals_an_explicit_look_ahead_mask_also_over_a_cache():
    torch.manual_seed(0)
    mha = A.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    causal, w = mha(x, x, x, is_causal=True)
    explicit, _ = mha(x, x, x, mask=A.look_ahead_mask(5))
    torch.testing.assert_close(causal, explicit)
    assert (w[..., ~A.look_ahead_mask(5)] == 0).all()
    last, _ = mha(x[:, -2:], x, x, is_causal=True)             # the last two queries over all five keys
    torch.testing.assert_close(last, causal[:, -2:])
    fused, _ = mha(x, x, x, is_causal=True, fused=True)
    torch.testing.assert_close(fused, causal)
    assert A.look_ahead_mask(2, num_keys=4).tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="num_keys=1 must be >= size=2"):
        A.look_ahead_mask(2, num_keys=1)


def test_reweight_changes_the_weights_after_the_softmax():
    torch.manual_seed(0)
    mha = A.MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    first_only = lambda w: torch.zeros_like(w).index_fill(-1, torch.tensor([0]), 1.0)  # noqa: E731
    out, w = mha(x, x, x, reweight=first_only)
    assert (w[..., 0] == 1).all() and (w[..., 1:] == 0).all()
    v = mha.w_v(x[:, :1])                                      # every query reads the first value only
    torch.testing.assert_close(out, mha.w_o(v).expand(-1, 4, -1))
    with pytest.raises(ValueError, match="fused=True"):
        mha(x, x, x, reweight=first_only, fused=True)
    with pytest.raises(TypeError, match="reweight must be callable"):
        mha(x, x, x, reweight=3)
