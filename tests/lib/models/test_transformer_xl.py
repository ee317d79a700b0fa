"""lib.models.transformer_xl against its definitions and against Hugging Face's XLNet (causal).

transformers 5.x has no Transformer-XL; its XLNet keeps the same relative attention and
memory, and ``XLNetModel`` with ``attn_type="uni"`` and no permutation is a Transformer-XL in
XLNet's layer layout, which is what our model is.
"""
import pytest
import torch

from lib.attention import look_ahead_mask, split_heads
from lib.models.reference import randomise
from lib.models.transformer_xl import (RelativeMultiHeadAttention, TransformerXL, TransformerXLConfig,
                                       load_hf_transformer_xl, rel_shift, relative_distances, relative_sinusoid,
                                       update_memory)

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=41, n_layer=2, n_head=4, d_model=32, d_inner=48)


# ----------------------------------------------------------------------------- relative shift

@pytest.mark.parametrize("T,K,bidirectional", [(1, 1, False), (4, 4, False), (3, 7, False), (5, 5, True), (3, 8, True)])
def test_rel_shift_moves_each_row_by_its_query_offset(T, K, bidirectional):
    P = len(relative_distances(T, K, bidirectional))
    x = torch.randn(2, 3, T, P, generator=torch.Generator().manual_seed(T * K))
    out = rel_shift(x, K)
    assert out.shape == (2, 3, T, K)
    for i in range(T):
        for j in range(K):
            if bidirectional or j <= K - T + i:          # causal: the future columns are don't-care
                assert torch.equal(out[..., i, j], x[..., i, j + T - i])


@pytest.mark.parametrize("mem,bidirectional", [(0, False), (3, False), (0, True), (4, True)])
def test_scores_equal_every_term_computed_directly(mem, bidirectional):
    """The shifted score equals (q_i + u).k_j + (q_i + v).(R_{i-j} W_kR), one (i, j) at a time."""
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    T, D, H = 5, 16, 2
    K = mem + T
    attn = randomise(RelativeMultiHeadAttention(D, H, D // H), seed=2)
    x, context = torch.randn(2, T, D, generator=g), torch.randn(2, K, D, generator=g)
    pos = relative_sinusoid(relative_distances(T, K, bidirectional), D)
    q, k = split_heads(attn.w_q(x), attn.n_head), split_heads(attn.w_k(context), attn.n_head)
    r = attn.w_r(pos).unflatten(-1, (H, D // H)).transpose(0, 1)
    got = attn.scores(q, k, r)
    for i in range(T):
        for j in range(K):
            if not bidirectional and j > mem + i:
                continue
            d = mem + i - j                                               # query position - key position
            r_d = attn.w_r(relative_sinusoid(torch.tensor([float(d)]), D)).view(H, D // H)
            a_c = ((q[:, :, i] + attn.u) * k[:, :, j]).sum(-1)
            b_d = ((q[:, :, i] + attn.v) * r_d).sum(-1)
            assert torch.allclose(got[:, :, i, j], (a_c + b_d) * attn.scale, atol=1e-5), (i, j)


def test_rel_shift_rejects_wrong_width():
    with pytest.raises(ValueError, match="k_len"):
        rel_shift(torch.zeros(4, 20), 5)
    with pytest.raises(TypeError, match="x must be"):
        rel_shift(torch.zeros(4, 5, dtype=torch.long), 3)


# ----------------------------------------------------------------------------- recurrence

def _model(mem_len, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return randomise(TransformerXL(TransformerXLConfig(**SMALL, mem_len=mem_len, dropout=dropout)), std=0.2).eval()


@pytest.mark.parametrize("L,mem_len", [(4, 4), (4, 6), (3, 5), (5, 2)])
def test_segments_with_memory_equal_one_pass_with_the_band(L, mem_len):
    """Segment by segment with memory = one pass where position i sees keys
    start(i) - mem_len .. i (start(i) = first position of i's segment)."""
    model = _model(mem_len)
    x = torch.randint(0, SMALL["vocab_size"], (2, 4 * L), generator=torch.Generator().manual_seed(1))
    mems, parts = None, []
    with torch.no_grad():
        for s in range(4):
            h, mems = model.hidden_states(x[:, s * L:(s + 1) * L], mems)
            parts.append(h)
        N = x.shape[1]
        i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
        band = (j <= i) & (j >= (i // L) * L - mem_len)
        whole, _ = model.hidden_states(x, mask=band)
    assert torch.allclose(torch.cat(parts, 1), whole, atol=1e-5)
    # and the band matters: the plain causal mask over the whole sequence gives other states
    with torch.no_grad():
        full, _ = model.hidden_states(x)
    assert not torch.allclose(torch.cat(parts, 1), full, atol=1e-3)


def test_memory_carries_no_gradient():
    model = _model(mem_len=4).train()
    captured = []

    def keep(module, inputs, output):
        output.retain_grad()
        captured.append(output)
    hook = model.word_embedding.register_forward_hook(keep)
    x = torch.randint(0, SMALL["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(2))
    _, _, mems = model(x[:, :4], x[:, 1:5])
    _, loss, _ = model(x[:, 4:7], x[:, 5:8], mems=mems)
    hook.remove()
    assert all(not m.requires_grad for m in mems)
    loss.backward()
    assert captured[1].grad is not None and captured[1].grad.abs().sum() > 0
    assert captured[0].grad is None, "gradient reached the previous segment through the memory"


def test_memory_changes_the_prediction():
    """The memory is used: the same segment after two different histories gives other logits."""
    model = _model(mem_len=4)
    g = torch.Generator().manual_seed(3)
    seg = torch.randint(0, SMALL["vocab_size"], (1, 4), generator=g)
    with torch.no_grad():
        outs = []
        for seed in (4, 5):
            hist = torch.randint(0, SMALL["vocab_size"], (1, 4), generator=torch.Generator().manual_seed(seed))
            _, _, mems = model(hist)
            outs.append(model(seg, mems=mems)[0])
    assert not torch.allclose(outs[0], outs[1], atol=1e-3)


def test_update_memory_keeps_the_last_positions_detached():
    a = torch.arange(12.0, requires_grad=True).view(1, 6, 2)
    m = update_memory(a[:, :2], a[:, 2:], 3)
    assert torch.equal(m, a[:, 3:].detach()) and not m.requires_grad
    assert update_memory(a, a, 0) is None
    with pytest.raises(ValueError, match="mem_len"):
        update_memory(a, a, -1)


# ----------------------------------------------------------------------------- Hugging Face

def _hf_pair(mem_len=5):
    torch.manual_seed(1)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=SMALL["vocab_size"], d_model=SMALL["d_model"], n_layer=SMALL["n_layer"], n_head=SMALL["n_head"],
        d_inner=SMALL["d_inner"], dropout=0.0, attn_type="uni", mem_len=mem_len, ff_activation="gelu")).eval()
    randomise(hf, std=0.2)
    ours = TransformerXL(TransformerXLConfig(**SMALL, mem_len=mem_len)).eval()
    load_hf_transformer_xl(ours, hf)
    return hf, ours


def test_relative_attention_equals_hf_xlnet_core():
    """Our attention weights and output equal XLNetRelativeAttention's (rel_attn_core and the
    post-attention LayerNorm), with a memory, weights copied."""
    hf, ours = _hf_pair()
    hf_attn, layer = hf.transformer.layer[0].rel_attn, ours.layers[0]
    g = torch.Generator().manual_seed(5)
    B, T, M, D = 2, 4, 3, SMALL["d_model"]
    x, mem = torch.randn(B, T, D, generator=g), torch.randn(B, M, D, generator=g)
    pos = relative_sinusoid(relative_distances(T, M + T), D)
    mask = look_ahead_mask(T, num_keys=M + T)
    with torch.no_grad():
        hf_out, _, probs = hf_attn(x.transpose(0, 1), None, (~mask).float()[:, :, None, None], None,
                                   pos[:, None].expand(-1, B, -1), None, mems=mem.transpose(0, 1),
                                   output_attentions=True)
        context = torch.cat([mem, x], 1)
        a, w = layer.attn(x, context, pos, mask)
        ours_out = layer.ln_attn(x + a)
    assert torch.allclose(w, probs.permute(2, 3, 0, 1), atol=1e-6)
    assert torch.allclose(ours_out, hf_out.transpose(0, 1), atol=1e-5)


def test_equals_hf_xlnet_uni_over_segments_with_memory():
    hf, ours = _hf_pair(mem_len=5)
    x = torch.randint(0, SMALL["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(6))
    hf_mems, mems = None, None
    with torch.no_grad():
        for s in range(3):
            seg = x[:, 4 * s:4 * s + 4]
            out = hf(seg, mems=hf_mems, use_mems=True)
            logits, _, mems = ours(seg, mems=mems)
            hf_mems = out.mems
            assert torch.allclose(logits, out.logits, atol=1e-4), f"segment {s}"
            for a, b in zip(mems, hf_mems):
                assert torch.allclose(a, b.transpose(0, 1), atol=1e-5)
    assert logits.abs().max() > 1.0       # the comparison is not of near-zero numbers


def test_bad_inputs_say_what_is_wrong():
    model = _model(mem_len=2)
    with pytest.raises(ValueError, match=r"idx must be ids in \[0, "):
        model(torch.tensor([[0, 99]]))
    with pytest.raises(ValueError, match="one tensor per layer"):
        model(torch.tensor([[0, 1]]), mems=[torch.zeros(1, 2, SMALL["d_model"])])
    with pytest.raises(ValueError, match="mems\\[0\\]"):
        model(torch.tensor([[0, 1]]), mems=[torch.zeros(1, 2, 5)] * 2)
    with pytest.raises(ValueError, match="divisible"):
        TransformerXLConfig(d_model=30, n_head=4)
    with pytest.raises(TypeError):
        TransformerXL(dict(SMALL))


def test_num_parameters():
    model = TransformerXL(TransformerXLConfig(**SMALL))
    D, F, V, L = SMALL["d_model"], SMALL["d_inner"], SMALL["vocab_size"], SMALL["n_layer"]
    per_layer = 5 * D * D + 2 * D + 2 * D + (D * F + F) + (F * D + D) + 2 * D
    assert model.num_parameters() == V * D + V + L * per_layer
    assert model.num_parameters(exclude_embeddings=True) == L * per_layer


# ----------------------------------------------------------------------------- evaluation helpers

def test_batchify_lays_out_contiguous_streams():
    from lib.models.transformer_xl import batchify
    s = batchify(torch.arange(11), 3)
    assert s.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError, match="batch_size"):
        batchify(torch.arange(3), 2)


def test_evaluate_with_memory_equals_one_pass_when_the_memory_holds_everything():
    """Segments of 4 with a memory longer than the stream see the whole past: the loss is the
    one-pass causal loss; with no memory and one segment per stream it is the same too."""
    from lib.models.transformer_xl import evaluate_with_memory
    model = _model(mem_len=4)
    stream = torch.randint(0, SMALL["vocab_size"], (2, 13), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, _, _ = model(stream[:, :-1], mem_len=0)
        one_pass = torch.nn.functional.cross_entropy(logits.flatten(0, 1), stream[:, 1:].flatten()).item()
    assert evaluate_with_memory(model, stream, 4, 64)["loss"] == pytest.approx(one_pass, abs=1e-5)
    assert evaluate_with_memory(model, stream, 12, 0)["loss"] == pytest.approx(one_pass, abs=1e-5)
    short = evaluate_with_memory(model, stream, 4, 0)          # fragmented: differs
    assert short["loss"] != pytest.approx(one_pass, abs=1e-3)
    assert short["tokens"] == 24 and len(short["loss_by_offset"]) == 4
    # each row's segments: 12 predicted characters in segments of 4, each segment's own mean loss
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(model(stream[:, :4], mem_len=0)[0].flatten(0, 1),
                                                  stream[:, 1:5].flatten(), reduction="none").view(2, 4).mean(1)
    assert short["segment_losses"].shape == (2, 3)
    assert torch.allclose(short["segment_losses"][:, 0].float(), first, atol=1e-5)
    assert short["segment_losses"].mean().item() == pytest.approx(short["loss"], abs=1e-5)


def test_sliding_window_predicts_from_the_window_before_each_token():
    from lib.models.transformer_xl import evaluate_sliding_window
    model = _model(mem_len=4)
    ids = torch.randint(0, SMALL["vocab_size"], (12,), generator=torch.Generator().manual_seed(8))
    C = 5
    with torch.no_grad():
        expected = [torch.nn.functional.cross_entropy(model(ids[None, t - C:t], mem_len=0)[0][:, -1], ids[t:t + 1]).item()
                    for t in range(C, C + 3)]
        # the first window is the whole prefix: the one-pass prediction at position C - 1
        first = model(ids[None, :C + 3], mem_len=0)[0][0, C - 1]
    assert expected[0] == pytest.approx(torch.nn.functional.cross_entropy(first[None], ids[C:C + 1]).item(), abs=1e-5)
    got = evaluate_sliding_window(model, ids, C, 3)
    assert got["loss"] == pytest.approx(sum(expected) / 3, abs=1e-5) and got["tokens"] == 3
    with pytest.raises(ValueError, match="positions"):
        evaluate_sliding_window(model, ids, C, 20)
