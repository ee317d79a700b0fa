"""lib.models.transformer (and lib.attention.MultiHeadAttention) against torch.nn references,
the KV cache, masks, the post-LN/pre-LN structure and the parameter count at the base config."""
import pytest
import torch
import torch.nn as nn

from lib import generate
from lib.attention import MultiHeadAttention, look_ahead_mask
from lib.models.reference import WeightCopyError
from lib.models.transformer import (DecoderLayer, EncoderLayer, Transformer, TransformerConfig,
                                    TransformerCore, copy_from_torch_mha, copy_from_torch_transformer)


pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")


def _lengths_to_mask(lengths, T):
    return torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]


def small_cfg(**kw):
    base = dict(src_vocab_size=40, tgt_vocab_size=45, d_model=32, num_heads=4, num_encoder_layers=2,
                num_decoder_layers=2, d_ff=48, dropout=0.0, max_len=64)
    base.update(kw)
    return TransformerConfig(**base)


# ----------------------------------------------------------------------------- multi-head attention

@pytest.mark.parametrize("self_attention", [True, False])
def test_mha_equals_torch_multihead_attention(self_attention):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(24, 3, batch_first=True)
    ours = copy_from_torch_mha(MultiHeadAttention(24, 3), ref)
    q = torch.randn(2, 5, 24, requires_grad=True)
    kv = q if self_attention else torch.randn(2, 7, 24)
    Tk = kv.shape[1]
    pad = _lengths_to_mask([Tk, 3], Tk)
    attn_mask = look_ahead_mask(5) if self_attention else None
    out, w = ours(q, kv, kv, mask=attn_mask, key_padding_mask=pad)
    ref_out, ref_w = ref(q, kv, kv, key_padding_mask=~pad,
                         attn_mask=None if attn_mask is None else ~attn_mask, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    g, = torch.autograd.grad(out.square().sum(), q)
    ref_g, = torch.autograd.grad(ref_out.square().sum(), q)
    torch.testing.assert_close(g, ref_g, atol=1e-5, rtol=1e-4)


def test_torch_copies_use_every_weight_exactly_once():
    with pytest.raises(WeightCopyError, match="our keys with no source.*w_o.bias"):
        copy_from_torch_mha(MultiHeadAttention(8, 2), nn.MultiheadAttention(8, 2, bias=False))
    with pytest.raises(WeightCopyError, match="never uses.*bias_k"):
        copy_from_torch_mha(MultiHeadAttention(8, 2), nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="layer counts differ"):
        copy_from_torch_transformer(TransformerCore(8, 2, 1, 1, 16), nn.Transformer(8, 2, 1, 2, 16))
    with pytest.raises(WeightCopyError, match="shape"):
        copy_from_torch_transformer(TransformerCore(8, 2, 1, 1, 16), nn.Transformer(8, 2, 1, 1, 32))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_copy_puts_every_layer_norm_in_its_place(norm_first):
    torch.manual_seed(0)
    ref = nn.Transformer(16, 2, 2, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
    with torch.no_grad():                                   # fresh LayerNorms are all alike: make them differ
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    core = copy_from_torch_transformer(TransformerCore(16, 2, 2, 2, 32, dropout=0.0, norm_first=norm_first), ref)
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    torch.testing.assert_close(core(src, tgt, tgt_mask=look_ahead_mask(4)),
                               ref(src, tgt, tgt_mask=~look_ahead_mask(4)), atol=1e-5, rtol=1e-5)


def test_mha_projected_path_equals_forward():
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 4)
    q, kv = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    mask = _lengths_to_mask([6, 2], 6)[:, None, None, :]
    a, wa = mha(q, kv, kv, mask=mask)
    b, wb = mha.attend_projected(q, *mha.project_kv(kv, kv), mask=mask)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(wa, wb)
    with pytest.raises(ValueError, match="heads"):
        mha.attend_projected(q, torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4))


# ----------------------------------------------------------------------------- nn.Transformer

@pytest.mark.parametrize("norm_first", [False, True])
def test_core_equals_torch_transformer_with_masks(norm_first):
    torch.manual_seed(0)
    ref = nn.Transformer(32, 4, 2, 3, 64, dropout=0.0, batch_first=True, norm_first=norm_first)
    core = copy_from_torch_transformer(TransformerCore(32, 4, 2, 3, 64, dropout=0.0, norm_first=norm_first), ref)
    src, tgt = torch.randn(3, 7, 32), torch.randn(3, 5, 32, requires_grad=True)
    sp, tp = _lengths_to_mask([7, 4, 2], 7), _lengths_to_mask([5, 3, 1], 5)
    la = look_ahead_mask(5)
    ours = core(src, tgt, src_key_padding_mask=sp, tgt_key_padding_mask=tp, memory_key_padding_mask=sp, tgt_mask=la)
    theirs = ref(src, tgt, tgt_mask=~la, src_key_padding_mask=~sp, tgt_key_padding_mask=~tp,
                 memory_key_padding_mask=~sp)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    g, = torch.autograd.grad(ours.sum(), tgt)
    ref_g, = torch.autograd.grad(theirs.sum(), tgt)
    torch.testing.assert_close(g, ref_g, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_parameter_count_at_base_config_equals_torch(norm_first):
    ref = nn.Transformer(512, 8, 6, 6, 2048, batch_first=True, norm_first=norm_first)
    core = TransformerCore(512, 8, 6, 6, 2048, norm_first=norm_first)
    n_ref = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in core.parameters()) == n_ref == 44_140_544
    model = Transformer(TransformerConfig(src_vocab_size=100, tgt_vocab_size=120))
    assert model.num_parameters(exclude_embeddings=True) == n_ref
    assert model.num_parameters() == n_ref + 100 * 512 + 120 * 512 + 120 * 512 + 120


def test_shared_embeddings_counted_once():
    m = Transformer(small_cfg(src_vocab_size=40, tgt_vocab_size=40, share_embeddings=True))
    assert m.src_embed.weight is m.tgt_embed.weight is m.generator.weight
    assert m.num_parameters() == m.num_parameters(exclude_embeddings=True) + 40 * 32 + 40
    t = Transformer(small_cfg(tie_output=True))
    assert t.generator.weight is t.tgt_embed.weight and t.src_embed.weight is not t.tgt_embed.weight
    with pytest.raises(ValueError, match="shared vocabulary"):
        small_cfg(share_embeddings=True)


# ----------------------------------------------------------------------------- KV cache

def _model_and_batch(seed=0, **kw):
    torch.manual_seed(seed)
    m = Transformer(small_cfg(**kw)).eval()
    src = torch.randint(1, 40, (3, 8))
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(1, 45, (3, 7))
    return m, src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_kv_cache_equals_full_decode(norm_first):
    m, src, tgt = _model_and_batch(norm_first=norm_first)
    sp = src != 0
    with torch.no_grad():
        memory = m.encode(src, sp)
        full, full_cache = m.decode(tgt, memory, sp)
        assert full_cache.length == tgt.shape[1]
        step_logits, cache = [], None
        for t in range(tgt.shape[1]):
            logits, cache = m.decode(tgt[:, t:t + 1], memory, sp, cache=cache)
            step_logits.append(logits)
            if t == 0:
                cross_k = cache.layers[0]["cross_k"]
        assert cache.layers[0]["cross_k"] is cross_k          # the memory is projected once
        assert cache.length == tgt.shape[1]
        torch.testing.assert_close(torch.cat(step_logits, 1), full, atol=1e-5, rtol=1e-5)
        # a prefix of 4, then 3 more at once
        a, c2 = m.decode(tgt[:, :4], memory, sp)
        b, c2 = m.decode(tgt[:, 4:], memory, sp, cache=c2)
        torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-5, rtol=1e-5)
        k = c2.layers[1]["self_k"]
        assert k.shape == (3, 4, 7, 8)


def test_kv_cache_reorder_selects_rows():
    m, src, tgt = _model_and_batch(seed=3)
    sp = src != 0
    with torch.no_grad():
        memory = m.encode(src, sp)
        _, cache = m.decode(tgt[:, :3], memory, sp)
        idx = torch.tensor([2, 0])
        cache.reorder(idx)
        nxt, _ = m.decode(tgt[idx, 3:4], memory[idx], sp[idx], cache=cache)
        full, _ = m.decode(tgt[idx, :4], memory[idx], sp[idx])
    torch.testing.assert_close(nxt[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- masks in the model

def test_decoder_does_not_look_ahead():
    m, src, tgt = _model_and_batch(seed=1)
    with torch.no_grad():
        a = m(src, tgt)
        tgt2 = tgt.clone()
        tgt2[:, 4] = (tgt2[:, 4] % 44) + 1
        b = m(src, tgt2)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_is_ignored():
    m, src, tgt = _model_and_batch(seed=2)
    with torch.no_grad():
        a = m(src, tgt)
        longer = torch.cat([src, torch.zeros(3, 4, dtype=torch.long)], dim=1)   # more padding
        b = m(longer, tgt)
        changed = src.clone()
        changed[1, 6] = 7            # a token that was padding becomes real
        c = m(changed, tgt)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[1], c[1], atol=1e-4)
    torch.testing.assert_close(a[0], c[0])


# ----------------------------------------------------------------------------- structure

def test_pre_ln_keeps_identity_path_post_ln_normalises():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16) * 3 + 1
    for layer_cls, args in ((EncoderLayer, ()), (DecoderLayer, (torch.randn(2, 4, 16),))):
        pre = layer_cls(16, 4, 32, dropout=0.0, norm_first=True)
        post = layer_cls(16, 4, 32, dropout=0.0, norm_first=False)
        for layer in (pre, post):             # every sublayer now outputs 0
            for name, p in layer.named_parameters():
                if "norm" not in name:
                    nn.init.zeros_(p)
        torch.testing.assert_close(pre(x, *args), x)
        ln = nn.functional.layer_norm(x, (16,))
        torch.testing.assert_close(post(x, *args), ln)    # (LN of LN of LN is LN)


def test_forward_shapes_and_errors():
    m, src, tgt = _model_and_batch()
    assert m(src, tgt).shape == (3, 7, 45)
    with pytest.raises(TypeError, match="src"):
        m.encode(src.float())
    with pytest.raises(ValueError, match="memory"):
        m.decode(tgt, torch.randn(2, 8, 32))
    with pytest.raises(ValueError, match="divisible"):
        small_cfg(num_heads=5)
    with pytest.raises(TypeError, match="TransformerConfig"):
        Transformer(dict(src_vocab_size=3))


def test_greedy_decoding_uses_cache_consistently():
    m, src, _ = _model_and_batch(seed=4)
    out = generate.greedy(m, src, bos_id=2, eos_id=3, max_new_tokens=6).tokens
    assert out.shape[0] == 3 and out.shape[1] <= 6
    # re-score the greedy output without cache: each token is the argmax given its prefix
    with torch.no_grad():
        dec_in = torch.cat([torch.full((3, 1), 2), out[:, :-1]], dim=1)
        logits = m(src, dec_in)
    first_eos = [(row == 3).nonzero()[0, 0].item() if (row == 3).any() else len(row) for row in out]
    for b in range(3):
        n = min(first_eos[b] + 1, out.shape[1])
        assert torch.equal(logits[b, :n].argmax(-1), out[b, :n])


def test_attention_weights_rows_sum_to_one():
    m, src, tgt = _model_and_batch()
    w = m.attention_weights(src, tgt)
    assert len(w["encoder_self"]) == 2 and w["cross"][0].shape == (3, 4, 7, 8)
    torch.testing.assert_close(w["cross"][1].sum(-1), torch.ones(3, 4, 7))
    assert (w["cross"][0][2, :, :, 2:] == 0).all()               # padded source keys
    assert (w["decoder_self"][0][0].triu(1) == 0).all()           # no look-ahead


def test_tiny_transformer_learns_to_reverse():
    """A real training signal: 2-layer model learns sequence reversal (loss must drop a lot)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(12, 12, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                            d_ff=64, dropout=0.0, max_len=16)
    m = Transformer(cfg)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(120):
        src = torch.randint(4, 12, (32, 6))
        tgt = torch.cat([torch.full((32, 1), 2), src.flip(1)], 1)
        logits = m(src, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 12), tgt[:, 1:].reshape(-1))
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    src = torch.randint(4, 12, (16, 6))
    out = generate.greedy(m, src, bos_id=2, eos_id=3, max_new_tokens=6).tokens
    assert (out == src.flip(1)).float().mean() > 0.9


def test_warmup_schedule_values():
    """lib.train's schedule is the paper's formula: linear rise, peak at warmup, then 1/sqrt(step)."""
    from lib.train import transformer_lr
    d, w = 512, 4000
    assert transformer_lr(1, d, w) == pytest.approx(d ** -0.5 * w ** -1.5)
    assert transformer_lr(w, d, w) == pytest.approx((d * w) ** -0.5)
    assert transformer_lr(4 * w, d, w) == pytest.approx(transformer_lr(w, d, w) / 2)
    assert transformer_lr(w // 2, d, w) == pytest.approx(transformer_lr(w, d, w) / 2)
    values = [transformer_lr(s, d, w) for s in range(1, 3 * w)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == w
