"""Tests of lib.models.elmo: byte encoding, char CNN, the two LMs' directions, the scalar mix."""
from __future__ import annotations

import pytest
import torch

from lib.models import elmo
from lib.models.elmo import BOW, EOW, PAD, PUBLISHED, BiLM, ELMoConfig, ScalarMix, encode_batch, encode_word


def tiny(**kw) -> ELMoConfig:
    base = dict(vocab_size=40, max_chars=10, char_dim=4, filters=((1, 4), (2, 4), (3, 8)), highway=2,
                proj=6, hidden=12, lstm_layers=2, dropout=0.0)
    return ELMoConfig(**{**base, **kw})


def batch(B=3, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    chars = torch.randint(1, elmo.CHAR_VOCAB, (B, T, 10), generator=g)
    return chars, torch.tensor([T, T - 2, 3][:B])


def test_byte_encoding_of_a_hangul_syllable_is_its_three_utf8_bytes_between_markers():
    assert list("밥".encode("utf-8")) == [235, 176, 165]              # the whole syllable, not ㅂ ㅏ ㅂ
    assert encode_word("밥", 8) == [BOW, 236, 177, 166, EOW, PAD, PAD, PAD]   # byte b -> id b + 1
    assert encode_word("a", 3) == [BOW, 98, EOW]
    assert encode_word("abcdef", 5) == [BOW, 98, 99, 100, EOW]        # truncated, markers kept
    assert encode_word(elmo.BOS, 4) == [BOW, 259, EOW, PAD] and encode_word(elmo.EOS, 4)[1] == 260


def test_encode_batch_pads_words_and_sentences():
    chars, lengths = encode_batch([["나는", "밥"], ["a"]], max_chars=9, add_markers=True)
    assert chars.shape == (2, 4, 9) and lengths.tolist() == [4, 3]
    assert chars[1, 3].eq(PAD).all() and not chars[1, 2].eq(PAD).all()
    assert chars[0, 0].tolist()[:3] == [BOW, 259, EOW] and chars[1, 2].tolist()[:3] == [BOW, 260, EOW]
    assert chars[0, 2].tolist() == encode_word("밥", 9)


def test_shapes_and_parameter_count_of_the_paper_model():
    cfg = tiny()
    model = BiLM(cfg)
    chars, lengths = batch()
    layers = model.layers(chars, lengths)
    assert len(layers) == cfg.lstm_layers + 1 and all(h.shape == (3, 7, 2 * cfg.proj) for h in layers)
    assert torch.equal(layers[0][..., :cfg.proj], layers[0][..., cfg.proj:])
    with torch.device("meta"):
        paper = BiLM(PUBLISHED["ELMo"])
    assert PUBLISHED["ELMo"].channels == 2048
    # Peters et al. (2018): 93.6M parameters without the softmax (and the 262 x 16 byte table)
    assert round(paper.num_parameters(exclude_embeddings=True) / 1e5) == 937
    assert paper.num_parameters() - paper.num_parameters(True) == 261 * 16 + 793_471 * 513


def test_forward_lm_never_sees_the_future_and_backward_lm_never_sees_the_past():
    torch.manual_seed(0)
    cfg = tiny()
    model = BiLM(cfg).eval()
    chars, lengths = batch(B=1, T=7)
    t = 3
    later, earlier = chars.clone(), chars.clone()
    later[0, t + 1:] = torch.randint(1, 256, later[0, t + 1:].shape)
    earlier[0, :t] = torch.randint(1, 256, earlier[0, :t].shape)
    with torch.no_grad():
        base, moved_later, moved_earlier = (model.layers(c, lengths) for c in (chars, later, earlier))
    P = cfg.proj
    for j in range(1, cfg.lstm_layers + 1):
        assert torch.allclose(base[j][0, :t + 1, :P], moved_later[j][0, :t + 1, :P])   # forward: positions <= t
        assert not torch.allclose(base[j][0, t + 1:, :P], moved_later[j][0, t + 1:, :P])
        assert torch.allclose(base[j][0, t:, P:], moved_earlier[j][0, t:, P:])                         # backward: positions >= t
        assert not torch.allclose(base[j][0, t:, :P], moved_earlier[j][0, t:, :P])


def test_padding_does_not_change_the_backward_lm():
    torch.manual_seed(0)
    model = BiLM(tiny()).eval()
    chars, _ = batch(B=1, T=4)
    padded = torch.cat([chars, torch.zeros(1, 3, 10, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model.layers(chars, torch.tensor([4]))
        b = model.layers(padded, torch.tensor([4]))
    for x, y in zip(a, b):
        assert torch.allclose(x, y[:, :4], atol=1e-6)


def test_lm_loss_targets_shift_the_right_way():
    torch.manual_seed(0)
    model = BiLM(tiny(lstm_layers=1)).eval()
    chars, lengths = batch(B=2, T=5)
    targets = torch.randint(0, 40, (2, 5))
    loss, (lf, lb) = model.lm_loss(chars, lengths, targets)
    _, fwd, bwd = model._states(chars, lengths)
    ce = torch.nn.functional.cross_entropy
    want_f = ce(model.softmax(fwd[-1][0, :4]), targets[0, 1:5], reduction="sum") + \
        ce(model.softmax(fwd[-1][1, :2]), targets[1, 1:3], reduction="sum")
    want_b = ce(model.softmax(bwd[-1][0, 1:5]), targets[0, :4], reduction="sum") + \
        ce(model.softmax(bwd[-1][1, 1:3]), targets[1, :2], reduction="sum")
    assert torch.allclose(lf, want_f / 6) and torch.allclose(lb, want_b / 6)
    assert torch.allclose(loss, (lf + lb) / 2)


def test_adaptive_softmax_is_one_distribution_and_lm_loss_reads_it_with_the_same_shift():
    torch.manual_seed(0)
    model = BiLM(tiny(lstm_layers=1, proj=8, hidden=12, softmax_cutoffs=(10, 25))).eval()
    assert isinstance(model.softmax, torch.nn.AdaptiveLogSoftmaxWithLoss)
    chars, lengths = batch(B=2, T=5)
    targets = torch.randint(0, 40, (2, 5))
    targets[0, 2] = -100                                   # a word that is read but not predicted
    _, (lf, lb) = model.lm_loss(chars, lengths, targets)
    _, fwd, bwd = model._states(chars, lengths)
    lp_f, lp_b = model.log_probs(fwd[-1]), model.log_probs(bwd[-1])
    assert lp_f.shape == (2, 5, 40)
    assert torch.allclose(lp_f.exp().sum(-1), torch.ones(2, 5), atol=1e-5)     # normalised over all 40 words
    fwd_pairs = [(0, 0, 1), (0, 2, 3), (0, 3, 4), (1, 0, 1), (1, 1, 2)]        # (row, state, target) without the -100
    bwd_pairs = [(0, 1, 0), (0, 2, 1), (0, 4, 3), (1, 1, 0), (1, 2, 1)]
    want_f = -torch.stack([lp_f[b, t, targets[b, u]] for b, t, u in fwd_pairs]).mean()
    want_b = -torch.stack([lp_b[b, t, targets[b, u]] for b, t, u in bwd_pairs]).mean()
    assert torch.allclose(lf, want_f, atol=1e-5) and torch.allclose(lb, want_b, atol=1e-5)


@pytest.mark.parametrize("cutoffs", [(0, 10), (20, 10), (10, 40), (10, 10)])
def test_adaptive_softmax_cutoffs_are_checked(cutoffs):
    with pytest.raises(ValueError, match="softmax_cutoffs"):
        tiny(softmax_cutoffs=cutoffs)


def test_scalar_mix_matches_its_definition_and_trains_s_and_gamma():
    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(2, 5, 4, generator=g) for _ in range(3)]
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.s.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    w = torch.exp(mix.s) / torch.exp(mix.s).sum()
    want = 1.7 * (w[0] * layers[0] + w[1] * layers[1] + w[2] * layers[2])
    assert torch.allclose(mix(layers), want, atol=1e-6)
    assert torch.allclose(mix(torch.stack(layers, dim=-2)), want, atol=1e-6)
    mix(layers).pow(2).sum().backward()
    assert mix.s.grad is not None and mix.s.grad.abs().sum() > 0 and mix.gamma.grad.abs() > 0
    assert torch.allclose(ScalarMix(4).weights(), torch.full((4,), 0.25))


def test_bad_inputs_raise_clear_errors():
    model = BiLM(tiny())
    chars, lengths = batch()
    with pytest.raises(ValueError, match="max_chars"):
        model.layers(chars[..., :8], lengths)
    with pytest.raises(ValueError, match="LongTensor"):
        model.layers(chars.float(), lengths)
    with pytest.raises(ValueError, match="byte ids"):
        model.layers(chars + 300, lengths)
    with pytest.raises(ValueError, match="lengths must be in"):
        model.layers(chars, torch.tensor([8, 1, 1]))
    with pytest.raises(ValueError, match="targets must have shape"):
        model.lm_loss(chars, lengths, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="wider than max_chars"):
        tiny(max_chars=2)
    with pytest.raises(ValueError, match="proj"):
        tiny(proj=20)
    with pytest.raises(ValueError, match="non-empty str"):
        encode_word("")
    with pytest.raises(ValueError, match="has no words"):
        encode_batch([["a"], []])
    with pytest.raises(ValueError, match="expected 3 layers"):
        ScalarMix(3)([torch.zeros(2)] * 2)
    with pytest.raises(ValueError, match="same shape"):
        ScalarMix(2)([torch.zeros(2), torch.zeros(3)])
