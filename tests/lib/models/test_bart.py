"""lib.models.bart against Hugging Face's BartForConditionalGeneration, its KV cache and classifier."""
import pytest
import torch

from lib import generate
from lib.models import bart
from lib.models.bart import Bart, BartClassifier, BartConfig, hf_bart_table, load_hf_bart
from lib.models.reference import WeightCopyError, randomise

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=61, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=3, d_ff=48, max_len=40)
BOS, EOS = 2, 3


def _pair(seed=0):
    torch.manual_seed(seed)
    hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=SMALL["vocab_size"], d_model=SMALL["d_model"], encoder_layers=SMALL["encoder_layers"],
        decoder_layers=SMALL["decoder_layers"], encoder_attention_heads=SMALL["num_heads"],
        decoder_attention_heads=SMALL["num_heads"], encoder_ffn_dim=SMALL["d_ff"], decoder_ffn_dim=SMALL["d_ff"],
        max_position_embeddings=SMALL["max_len"], dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=0, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS)).eval()
    randomise(hf, seed=seed + 1)
    cfg = BartConfig.from_hf(hf.config)
    assert cfg == BartConfig(**SMALL, dropout=0.0)
    ours = Bart(cfg).eval()
    load_hf_bart(ours, hf)
    return ours, hf


def test_from_hf_refuses_what_the_course_bart_does_not_implement():
    hf = transformers.BartConfig(vocab_size=61, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4)
    assert BartConfig.from_hf(hf).num_heads == 4 and BartConfig.from_hf(hf.to_dict()) == BartConfig.from_hf(hf)
    for change in ({"decoder_attention_heads": 2}, {"scale_embedding": True}, {"activation_function": "relu"}):
        with pytest.raises(ValueError, match=next(iter(change))):
            BartConfig.from_hf({**hf.to_dict(), **change})


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, SMALL["vocab_size"], (3, 11), generator=g)
    src[1, 7:] = 0                 # right padding
    src[2, 9:] = 0
    tgt = torch.randint(4, SMALL["vocab_size"], (3, 9), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


def test_logits_equal_hugging_face():
    ours, hf = _pair()
    src, tgt = _batch()
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
        got = ours(src, tgt)
        enc = hf.model.encoder(input_ids=src, attention_mask=(src != 0).long()).last_hidden_state
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    mask = src != 0
    torch.testing.assert_close(ours.encode(src)[mask], enc[mask], atol=1e-5, rtol=1e-5)


def test_copy_uses_every_weight_and_drops_only_the_position_offset(monkeypatch):
    ours, hf = _pair()
    assert torch.equal(ours.enc_pos.weight, hf.model.encoder.embed_positions.weight[2:])
    assert ours.lm_head.weight.data_ptr() == ours.embed.weight.data_ptr()
    table = hf_bart_table(ours.cfg)
    del table["decoder.layers.1.cross_block.norm.weight"]
    monkeypatch.setattr(bart, "hf_bart_table", lambda cfg: table)          # the loader, with one entry lost
    with pytest.raises(WeightCopyError, match="cross_block.norm.weight"):
        load_hf_bart(ours, hf)


def test_post_ln_without_final_norm():
    """BART normalises the embeddings and every sub-layer's output: no extra LayerNorm at the end."""
    ours = Bart(BartConfig(**SMALL))
    assert isinstance(ours.encoder.norm, torch.nn.Identity) and isinstance(ours.decoder.norm, torch.nn.Identity)
    assert not ours.encoder.layers[0].attn_block.norm_first


def test_cache_decoding_equals_full_decode():
    ours, _ = _pair()
    src, tgt = _batch()
    memory = ours.encode(src)
    pad = src != 0
    with torch.no_grad():
        full, _ = ours.decode(tgt, memory, pad)
        cache, steps = None, []
        for t in range(tgt.shape[1]):
            logits, cache = ours.decode(tgt[:, t:t + 1], memory, pad, cache=cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    a = generate.greedy(ours, src, bos_id=BOS, eos_id=EOS, max_new_tokens=8, use_cache=True)
    b = generate.greedy(ours, src, bos_id=BOS, eos_id=EOS, max_new_tokens=8, use_cache=False)
    assert torch.equal(a.tokens, b.tokens)


def test_decoder_does_not_look_ahead_and_source_padding_is_ignored():
    ours, _ = _pair()
    src, tgt = _batch()
    with torch.no_grad():
        base = ours(src, tgt)
        changed = tgt.clone(); changed[:, 5] = 7
        assert torch.allclose(ours(src, changed)[:, :5], base[:, :5], atol=1e-6)
        assert not torch.allclose(ours(src, changed)[:, 5:], base[:, 5:], atol=1e-3)
        alone = ours(src[1:2, :7], tgt[1:2])
    torch.testing.assert_close(alone, base[1:2], atol=1e-5, rtol=1e-5)


def test_classifier_reads_the_decoder_state_at_eos():
    ours, _ = _pair()
    clf = BartClassifier(ours, num_classes=2, bos_id=BOS, eos_id=EOS).eval()
    ids = torch.tensor([[5, 6, 7, EOS, 0, 0], [8, 9, 10, 11, 12, EOS]])
    with torch.no_grad():
        state = clf.final_state(ids)
        memory = ours.encode(ids[:1, :4])
        h, _ = ours.decoder_states(torch.tensor([[BOS, 5, 6, 7, EOS]]), memory)
        torch.testing.assert_close(state[0], h[0, -1], atol=1e-5, rtol=1e-5)
        assert clf(ids).shape == (2, 2)
    with pytest.raises(ValueError, match="end with eos_id"):
        clf.final_state(torch.tensor([[5, 6, 7, 0]]))


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="divisible"):
        BartConfig(vocab_size=10, d_model=30, num_heads=4)
    with pytest.raises(TypeError, match="BartConfig"):
        Bart(dict(vocab_size=10))
    ours = Bart(BartConfig(**SMALL))
    with pytest.raises(TypeError, match="src"):
        ours.encode(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="max_len"):
        ours.encode(torch.ones(1, 41, dtype=torch.long))


def test_tied_embedding_counted_once():
    cfg = BartConfig(**SMALL)
    ours = Bart(cfg)
    d, V = cfg.d_model, cfg.vocab_size
    assert ours.num_parameters() - ours.num_parameters(exclude_embeddings=True) == V * d + 2 * cfg.max_len * d
