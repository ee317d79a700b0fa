"""lib.models.bilstm_attention: the BiLSTM + Bahdanau-attention classifier of chapter 02."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lib.layers import num_parameters
from lib.models.bilstm_attention import BiLSTM, BiLSTMAttentionClassifier, BiLSTMConfig, reverse_padded


def small_config(**kw):
    base = dict(vocab_size=50, embed_dim=16, hidden=12, layers=2, attn_hidden=10, dense=8)
    base.update(kw)
    return BiLSTMConfig(**base)


def random_batch(B=6, S=9, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    tokens = torch.randint(2, vocab, (B, S), generator=g)
    tokens[torch.arange(S)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def test_reverse_padded_reverses_only_the_real_part():
    x = torch.tensor([[1., 2., 3., 0.], [4., 5., 0., 0.]])[:, :, None]
    out = reverse_padded(x, torch.tensor([3, 2]))[:, :, 0]
    assert out.tolist() == [[3., 2., 1., 0.], [5., 4., 0., 0.]]
    assert torch.equal(reverse_padded(reverse_padded(x, torch.tensor([3, 2])), torch.tensor([3, 2])), x)


def test_bilstm_equals_packed_bidirectional_lstm():
    torch.manual_seed(0)
    ours = BiLSTM(7, 5, 2)
    ref = torch.nn.LSTM(7, 5, num_layers=2, bidirectional=True, batch_first=True)
    with torch.no_grad():
        for layer in range(2):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(ref, f"{name}_l{layer}").copy_(getattr(ours.fwd[layer], f"{name}_l0"))
                getattr(ref, f"{name}_l{layer}_reverse").copy_(getattr(ours.bwd[layer], f"{name}_l0"))
    x = torch.randn(5, 8, 7)
    lengths = torch.tensor([8, 3, 1, 6, 5])
    out, final = ours(x, lengths)
    packed, (h_n, _) = ref(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    ref_out, _ = pad_packed_sequence(packed, batch_first=True, total_length=8)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(final, torch.cat([h_n[-2], h_n[-1]], dim=-1), atol=1e-6, rtol=0)
    assert torch.all(out[1, 3:] == 0)       # padding positions are exactly zero


def test_padded_positions_get_exactly_zero_attention():
    torch.manual_seed(0)
    model = BiLSTMAttentionClassifier(small_config()).eval()
    tokens, lengths = random_batch()
    logits, weights = model(tokens, lengths)
    assert weights.shape == tokens.shape
    pad = torch.arange(tokens.shape[1])[None, :] >= lengths[:, None]
    assert pad.any()
    assert torch.all(weights[pad] == 0)
    assert torch.all(weights[~pad] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(tokens)))
    # more padding (even with non-pad ids in it) changes nothing: padding is never read
    extra = torch.cat([tokens, torch.randint(2, 50, (len(tokens), 4))], dim=1)
    logits2, weights2 = model(extra, lengths)
    torch.testing.assert_close(logits2, logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights2[:, :tokens.shape[1]], weights, atol=1e-6, rtol=0)
    assert torch.all(weights2[:, tokens.shape[1]:] == 0)


def test_baseline_has_no_attention_and_reads_the_final_states():
    torch.manual_seed(0)
    model = BiLSTMAttentionClassifier(small_config(attention=False)).eval()
    tokens, lengths = random_batch()
    logits, weights = model(tokens, lengths)
    assert weights is None and model.attention is None
    assert logits.shape == (len(tokens),)
    _, query = model.bilstm(model.embedding(tokens), lengths)
    torch.testing.assert_close(logits, model.head(query).squeeze(-1))
    attn = BiLSTMAttentionClassifier(small_config())
    assert attn.num_parameters() - model.num_parameters() == num_parameters(attn.attention)
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - 50 * 16


@pytest.mark.parametrize("attention", [True, False])
def test_each_model_overfits_one_small_batch(attention):
    torch.manual_seed(0)
    model = BiLSTMAttentionClassifier(small_config(attention=attention))
    tokens, lengths = random_batch(B=8, S=10, seed=1)
    y = torch.tensor([0., 1., 1., 0., 1., 0., 0., 1.])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        logits, _ = model(tokens, lengths)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        final = F.binary_cross_entropy_with_logits(model(tokens, lengths)[0], y).item()
    assert final < 0.01, f"could not overfit one batch: loss {final:.4f}"


@pytest.mark.parametrize("tokens, lengths, error, words", [
    (torch.zeros(4, dtype=torch.long), torch.tensor([4]), ValueError, "(batch, seq_len)"),
    (torch.zeros(2, 4), torch.tensor([4, 4]), TypeError, "tokens must have dtype torch.int64"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([4, 4, 4]), ValueError, "shape (batch,)"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([[4, 4]]), ValueError, "shape (batch,)"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([4., 4.]), TypeError, "lengths"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([5, 4]), ValueError, "seq_len=4"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 4]), ValueError, "lengths must lie"),
    (torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, dtype=torch.long), ValueError, "empty"),
])
def test_wrong_inputs_raise_clear_errors(tokens, lengths, error, words):
    model = BiLSTMAttentionClassifier(small_config())
    with pytest.raises(error, match=None) as info:
        model(tokens, lengths)
    assert words in str(info.value)


@pytest.mark.parametrize("kw, words", [
    (dict(hidden=0), "hidden"), (dict(vocab_size=-1), "vocab_size"), (dict(dropout=1.0), "dropout"),
    (dict(pad_id=50), "pad_id"), (dict(attention="yes"), "attention"), (dict(layers=1.5), "layers"),
])
def test_bad_config_raises(kw, words):
    with pytest.raises((ValueError, TypeError), match=words):
        small_config(**kw)
    with pytest.raises(TypeError, match="BiLSTMConfig"):
        BiLSTMAttentionClassifier(dict(vocab_size=10))


def test_single_layer_and_paper_sizes():
    one = BiLSTMAttentionClassifier(small_config(layers=1))
    tokens, lengths = random_batch()
    logits, weights = one(tokens, lengths)
    assert logits.shape == (len(tokens),) and weights.shape == tokens.shape
    # the seed experiment's sizes: 10,007 x 128 embedding, BiLSTM 64 per direction
    cfg = BiLSTMConfig()
    model = BiLSTMAttentionClassifier(cfg)
    lstm1 = 2 * 4 * 64 * (128 + 64 + 2)       # two directions, four gates, two biases
    lstm2 = 2 * 4 * 64 * (128 + 64 + 2)       # input 2 x 64 = 128
    assert num_parameters(model.bilstm) == lstm1 + lstm2
    assert num_parameters(model.embedding) == 10_007 * 128
    assert num_parameters(model.attention) == 128 * 64 * 2 + 64
