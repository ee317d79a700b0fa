"""lib.models.seq2seq: both decoders learn, padding is invisible, decoding is consistent."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lib.models import seq2seq as S

V = 20
PAIRS = [([4, 5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14, 15, 16, 17]), ([6, 5, 4], [11, 10]),
         ([18, 19, 4, 5, 6, 7, 8], [12, 13, 9, 14, 15]), ([7], [8])]



def make(attention=True, cell="gru", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = S.Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, emb_dim=16, hidden_dim=32, cell=cell,
                          attention=attention, **kw)
    return S.Seq2Seq(cfg)


MODELS = [(True, "gru"), (False, "gru"), (True, "lstm"), (False, "lstm")]
IDS = ["attention-gru", "fixed-gru", "attention-lstm", "fixed-lstm"]


# ----------------------------------------------------------------------------- config and batching

@pytest.mark.parametrize("kw, exc, match", [
    (dict(src_vocab_size=0), ValueError, "Seq2SeqConfig.src_vocab_size must be >= 1"),
    (dict(hidden_dim=1.5), TypeError, "Seq2SeqConfig.hidden_dim must be an int"),
    (dict(cell="rnn"), ValueError, "Seq2SeqConfig.cell must be one of 'gru', 'lstm'"),
    (dict(dropout=1.0), ValueError, r"Seq2SeqConfig.dropout must be in \[0, 1\)"),
])
def test_config_errors(kw, exc, match):
    args = dict(src_vocab_size=V, tgt_vocab_size=V) | kw
    with pytest.raises(exc, match=match):
        S.Seq2SeqConfig(**args)


def test_collate_is_the_teacher_forcing_shift():
    cfg = make().cfg
    src, src_len, tgt_in, tgt_out = S.collate([([4, 5, 6], [7, 8]), ([9], [10, 11, 12])], cfg)
    assert src.tolist() == [[4, 5, 6], [9, 0, 0]] and src_len.tolist() == [3, 1]
    assert tgt_in.tolist() == [[cfg.bos_id, 7, 8, 0], [cfg.bos_id, 10, 11, 12]]
    assert tgt_out.tolist() == [[7, 8, cfg.eos_id, 0], [10, 11, 12, cfg.eos_id]]
    assert tgt_in.dtype == torch.long


def test_strip_special():
    cfg = make().cfg
    assert S.strip_special([cfg.bos_id, 5, 6, cfg.eos_id, 7, 0], cfg) == [5, 6]
    assert S.strip_special(torch.tensor([5, 0, 6]), cfg) == [5, 6]


def test_fixed_context_decoder_has_exactly_the_extra_input_weights():
    att, fixed = make(True), make(False)
    H = att.cfg.hidden_dim
    # the fixed-context GRU reads [emb; c]: 3 gates x H x H more input weights, nothing else differs
    assert fixed.num_parameters() - att.num_parameters() == 3 * H * H


# ----------------------------------------------------------------------------- learning

@pytest.mark.parametrize("attention, cell", MODELS, ids=IDS)
def test_each_model_overfits_one_small_batch(attention, cell):
    model = make(attention, cell)
    batch = S.collate(PAIRS, model.cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(200):
        loss = model.loss(*batch)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    final = model.loss(*batch).item()
    assert first > 2.0 and final < 0.02, (first, final)
    # and greedy decoding then reproduces every target exactly: the words, EOS, then only padding
    tokens, _ = model.greedy_decode(batch[0], batch[1], max_len=10)
    longest = max(len(t) for _, t in PAIRS) + 1
    cfg = model.cfg
    assert tokens.tolist() == [t + [cfg.eos_id] + [cfg.pad_id] * (longest - len(t) - 1) for _, t in PAIRS]


def test_luong_decoder_matches_the_formula_by_hand():
    model = make(True).eval()
    src, src_len, tgt_in, _ = S.collate(PAIRS, model.cfg)
    logits, w = model(src, src_len, tgt_in)
    dec = model.decoder
    memory = model.encode(src, src_len)
    s, _ = dec.rnn(dec.embed(tgt_in), memory.state)                  # decoder states s_t
    for b, n in enumerate(src_len.tolist()):
        h = memory.outputs[b, :n]                                    # the real encoder states h_i
        for t in range(tgt_in.shape[1]):
            a = torch.softmax(h @ s[b, t], dim=0)                    # score s_t · h_i, softmax
            c = a @ h                                                # context = weighted sum
            h_tilde = torch.tanh(dec.combine.weight @ torch.cat([c, s[b, t]]) + dec.combine.bias)
            assert torch.allclose(w[b, t, :n], a, atol=1e-5)
            assert torch.allclose(logits[b, t], dec.out(h_tilde), atol=1e-5)


def test_fixed_context_decoder_reads_c_at_every_step():
    model = make(False).eval()
    src, src_len, tgt_in, _ = S.collate(PAIRS, model.cfg)
    memory = model.encode(src, src_len)
    zeroed = memory._replace(context=torch.zeros_like(memory.context))
    _, state, _ = model.decoder(tgt_in, memory.state, memory)
    _, state_zeroed, _ = model.decoder(tgt_in, memory.state, zeroed)  # same start, no c in the input
    assert not torch.allclose(state, state_zeroed, atol=1e-3)
    # and the context is the encoder's final state: the last real position of each sentence
    for b, n in enumerate(src_len.tolist()):
        assert torch.allclose(memory.context[b], memory.outputs[b, n - 1], atol=1e-6)


def test_loss_ignores_padding():
    model = make().eval()
    src, src_len, tgt_in, tgt_out = S.collate(PAIRS, model.cfg)
    logits, _ = model(src, src_len, tgt_in)
    real = tgt_out != 0
    expected = F.cross_entropy(logits[real], tgt_out[real])
    assert torch.allclose(model.loss(src, src_len, tgt_in, tgt_out), expected, atol=1e-6)
    # three more padding columns on every tensor change nothing
    pad = lambda x: F.pad(x, (0, 3), value=0)
    assert torch.allclose(model.loss(pad(src), src_len, pad(tgt_in), pad(tgt_out)), expected, atol=1e-5)


# ----------------------------------------------------------------------------- padding and attention

def test_padded_source_positions_get_exactly_zero_attention():
    model = make(True)
    src, src_len, tgt_in, _ = S.collate(PAIRS, model.cfg)
    _, w = model(src, src_len, tgt_in)
    assert w.shape == (len(PAIRS), tgt_in.shape[1], src.shape[1])
    for b, n in enumerate(src_len.tolist()):
        assert torch.all(w[b, :, n:] == 0.0)
        assert torch.allclose(w[b].sum(-1), torch.ones(tgt_in.shape[1]), atol=1e-5)
    _, w_dec = model.greedy_decode(src, src_len, max_len=6)
    for b, n in enumerate(src_len.tolist()):
        assert torch.all(w_dec[b, :, n:] == 0.0)


@pytest.mark.parametrize("attention, cell", MODELS, ids=IDS)
def test_a_sentence_gives_the_same_output_alone_and_in_a_padded_batch(attention, cell):
    model = make(attention, cell).eval()
    src, src_len, tgt_in, _ = S.collate(PAIRS, model.cfg)
    src = F.pad(src, (0, 4), value=0)                                 # even more padding
    logits, w = model(src, src_len, tgt_in)
    tokens, w_dec = model.greedy_decode(src, src_len, max_len=8)
    for b, (s, t) in enumerate(PAIRS):
        one_src, one_len, one_in, _ = S.collate([(s, t)], model.cfg)
        one_logits, one_w = model(one_src, one_len, one_in)
        T = one_in.shape[1]
        assert torch.allclose(logits[b, :T], one_logits[0], atol=1e-5)
        one_tokens, one_w_dec = model.greedy_decode(one_src, one_len, max_len=8)
        n = one_tokens.shape[1]
        assert torch.equal(tokens[b, :n], one_tokens[0])
        if attention:
            assert torch.allclose(w[b, :T, :len(s)], one_w[0], atol=1e-5)
            assert torch.allclose(w_dec[b, :n, :len(s)], one_w_dec[0], atol=1e-5)


@pytest.mark.parametrize("attention, cell", MODELS, ids=IDS)
def test_teacher_forced_forward_equals_step_by_step_decoding(attention, cell):
    model = make(attention, cell).eval()
    src, src_len, tgt_in, _ = S.collate(PAIRS, model.cfg)
    logits, w = model(src, src_len, tgt_in)
    memory = model.encode(src, src_len)
    state = memory.state
    for t in range(tgt_in.shape[1]):
        h, state, w_t = model.decoder(tgt_in[:, t:t + 1], state, memory)
        assert torch.allclose(model.decoder.out(h)[:, 0], logits[:, t], atol=1e-5)
        if attention:
            assert torch.allclose(w_t[:, 0], w[:, t], atol=1e-6)


def test_greedy_decode_shapes_and_eos_handling():
    model = make(True)
    src, src_len, _, _ = S.collate(PAIRS, model.cfg)
    tokens, w = model.greedy_decode(src, src_len, max_len=7)
    assert tokens.dtype == torch.long and tokens.shape[0] == len(PAIRS) and 1 <= tokens.shape[1] <= 7
    assert w.shape == (len(PAIRS), tokens.shape[1], src.shape[1])
    for b in range(len(PAIRS)):
        row = tokens[b].tolist()
        if model.cfg.eos_id in row:                                  # after EOS only padding, zero attention
            k = row.index(model.cfg.eos_id)
            assert all(x == model.cfg.pad_id for x in row[k + 1:])
            assert torch.all(w[b, k + 1:] == 0.0)
    fixed = make(False)
    tokens_f, w_f = fixed.greedy_decode(src, None, max_len=5)        # lengths from the padding
    assert w_f is None and tokens_f.shape[0] == len(PAIRS) and tokens_f.shape[1] <= 5
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        model.greedy_decode(src, src_len, max_len=0)


def test_greedy_decode_stops_early_when_every_sentence_ended():
    model = make(True)
    with torch.no_grad():                                            # force EOS to win at every step
        model.decoder.out.bias.fill_(-1e4)
        model.decoder.out.bias[model.cfg.eos_id] = 1e4
    src, src_len, _, _ = S.collate(PAIRS, model.cfg)
    tokens, w = model.greedy_decode(src, src_len, max_len=20)
    assert tokens.tolist() == [[model.cfg.eos_id]] * len(PAIRS) and w.shape[1] == 1


# ----------------------------------------------------------------------------- errors

def test_wrong_inputs_raise_clear_errors():
    model = make(True)
    src, src_len, tgt_in, tgt_out = S.collate(PAIRS, model.cfg)
    with pytest.raises(ValueError, match=r"src must be \(batch, time\)"):
        model(src[0], src_len[:1], tgt_in[:1])
    with pytest.raises(TypeError, match="src must be an integer tensor, got dtype torch.float32"):
        model(src.float(), src_len, tgt_in)
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        model(src.tolist(), src_len, tgt_in)
    with pytest.raises(ValueError, match=r"src_len must have shape \(batch,\)=\(5,\)"):
        model(src, src_len[:2], tgt_in)
    with pytest.raises(ValueError, match="src_len must be between 1 and the padded source length"):
        model(src, src_len + 10, tgt_in)
    with pytest.raises(ValueError, match="src_len must be between 1"):
        model(src, src_len * 0, tgt_in)
    with pytest.raises(TypeError, match="src_len must be a torch.Tensor"):
        model(src, src_len.tolist(), tgt_in)
    with pytest.raises(ValueError, match="tgt_in has batch size 2, but src has 5"):
        model(src, src_len, tgt_in[:2])
    with pytest.raises(ValueError, match="tgt_out .* must have the shape of tgt_in"):
        model.loss(src, src_len, tgt_in, tgt_out[:, :-1])
    with pytest.raises(ValueError, match="empty source sentence"):
        S.collate([([], [5])], model.cfg)
