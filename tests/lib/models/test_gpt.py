"""lib.models.gpt against Hugging Face's GPT-2 and GPT-1, the KV cache, parameter counts."""
import pytest
import torch

from lib.kv_cache import KVCache
from lib.layers import count_parameters
from lib.models.gpt import GPT, PUBLISHED, GPTClassifier, GPTConfig, load_hf_gpt
from lib.models.reference import randomise

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=53, block_size=24, n_layer=3, n_head=4, n_embd=32)


def _tokens_and_mask(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, SMALL["vocab_size"], (4, 13), generator=g)
    mask = torch.ones(4, 13, dtype=torch.bool)
    mask[1, 9:] = False           # right padding of different lengths
    mask[2, 4:] = False
    mask[3, :3] = False           # left padding: these queries have no real key at or before them
    return x, mask


def _gpt2_pair():
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=SMALL["vocab_size"], n_positions=SMALL["block_size"], n_embd=SMALL["n_embd"],
        n_layer=SMALL["n_layer"], n_head=SMALL["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0)).eval()
    randomise(hf)
    cfg = GPTConfig.from_hf(hf.config)
    assert cfg == GPTConfig(**SMALL)
    ours = GPT(cfg).eval()
    load_hf_gpt(ours, hf)
    return ours, hf


def _gpt1_pair():
    torch.manual_seed(2)
    hf = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(
        vocab_size=SMALL["vocab_size"], n_positions=SMALL["block_size"], n_embd=SMALL["n_embd"],
        n_layer=SMALL["n_layer"], n_head=SMALL["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)).eval()
    randomise(hf)
    cfg = GPTConfig.from_hf(hf.config)
    assert cfg == GPTConfig(**SMALL, norm_first=False)
    ours = GPT(cfg).eval()
    load_hf_gpt(ours, hf)
    return ours, hf


@pytest.mark.parametrize("pair", [_gpt2_pair, _gpt1_pair], ids=["gpt2", "gpt1"])
@pytest.mark.parametrize("fused", [True, False])
def test_logits_equal_hugging_face(pair, fused):
    ours, hf = pair()
    x, mask = _tokens_and_mask()
    with torch.no_grad():
        ref = hf(x).logits
        torch.testing.assert_close(ours.lm_head(ours.hidden_states(x, fused=fused)), ref, atol=1e-5, rtol=1e-5)
        ref_masked = hf(x, attention_mask=mask.long()).logits
        got = ours.lm_head(ours.hidden_states(x, attention_mask=mask, fused=fused))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[mask], ref_masked[mask], atol=1e-5, rtol=1e-5)   # real tokens only
    # a real token's logits do not depend on the padding after it
    torch.testing.assert_close(got[2, :4], ours(x[2:3, :4])[0][0].detach(), atol=1e-5, rtol=1e-5)


def test_post_ln_and_pre_ln_differ():
    """The layouts are really different computations (so the two reference checks test both)."""
    torch.manual_seed(0)
    pre = GPT(GPTConfig(**SMALL)).eval()
    post = GPT(GPTConfig(**SMALL, norm_first=False)).eval()
    post.load_state_dict({k: v for k, v in pre.state_dict().items() if not k.startswith("ln_f")})
    x, _ = _tokens_and_mask()
    assert not torch.allclose(pre(x)[0], post(x)[0], atol=1e-3)


def test_parameter_count_equals_gpt2_small():
    with torch.device("meta"):
        hf = transformers.GPT2Model(transformers.GPT2Config())
    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_hf == 124_439_808
    assert count_parameters(GPT, PUBLISHED["GPT-2 small"]) == n_hf
    cfg = PUBLISHED["GPT-2 small"]
    emb = (cfg.vocab_size + cfg.block_size) * cfg.n_embd
    assert count_parameters(GPT, cfg, exclude_embeddings=True) == n_hf - emb


def test_parameter_count_of_gpt1_equals_hugging_face():
    cfg = PUBLISHED["GPT-1"]
    with torch.device("meta"):
        hf = transformers.OpenAIGPTModel(transformers.OpenAIGPTConfig())
    assert count_parameters(GPT, cfg) == sum(p.numel() for p in hf.parameters())


def test_weight_tying_counts_once_and_shares_storage():
    m = GPT(GPTConfig(**SMALL))
    assert m.lm_head.weight is m.wte.weight
    untied = GPT(GPTConfig(**SMALL, tie_weights=False))
    V, d = SMALL["vocab_size"], SMALL["n_embd"]
    assert untied.num_parameters() - m.num_parameters() == V * d


def test_residual_projections_start_smaller():
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=8, n_head=4, n_embd=256))
    std_o = m.blocks[0].attn.w_o.weight.std().item()
    std_q = m.blocks[0].attn.w_q.weight.std().item()
    assert abs(std_q - 0.02) < 0.002
    assert abs(std_o - 0.02 / 4) < 0.001          # 1 / sqrt(2 * 8) = 1 / 4


@pytest.mark.parametrize("norm_first", [True, False])
def test_token_by_token_with_cache_equals_one_pass(norm_first):
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SMALL, norm_first=norm_first)).eval()
    x, _ = _tokens_and_mask()
    with torch.no_grad():
        full, _ = m(x)
        cache = None
        steps = []
        for t in range(x.shape[1]):
            logits, cache = m.decode(x[:, t:t + 1], cache)
            steps.append(logits)
            assert cache.length == t + 1
        # and a prompt of 5 then the rest in one chunk
        first, cache2 = m.decode(x[:, :5])
        rest, cache2 = m.decode(x[:, 5:], cache2)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    assert isinstance(cache, KVCache)


def test_cache_reorder_selects_rows():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SMALL)).eval()
    x, _ = _tokens_and_mask()
    with torch.no_grad():
        _, cache = m.decode(x[:, :6])
        cache.reorder(torch.tensor([2, 2, 0]))
        got, _ = m.decode(x[[2, 2, 0], 6:8], cache)
        want, _ = m(x[[2, 2, 0], :8])
    torch.testing.assert_close(got, want[:, 6:8], atol=1e-5, rtol=1e-5)


def test_loss_is_next_token_cross_entropy_and_ignores_minus_100():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SMALL)).eval()
    x, _ = _tokens_and_mask()
    y = x.roll(-1, 1)
    y[:, -1] = -100
    logits, loss = m(x, y)
    want = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), y[:, :-1].flatten())
    torch.testing.assert_close(loss, want)


def test_classifier_reads_the_last_real_token():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**SMALL)).eval()
    clf = GPTClassifier(gpt, num_classes=3).eval()
    x, mask = _tokens_and_mask()
    with torch.no_grad():
        logits, lm = clf(x, mask)
        alone, _ = clf(x[2:3, :4], mask[2:3, :4])
    assert logits.shape == (4, 3) and lm.shape == (4, 13, SMALL["vocab_size"])
    torch.testing.assert_close(logits[2:3], alone, atol=1e-5, rtol=1e-5)


def test_bad_input_is_rejected_with_a_message():
    m = GPT(GPTConfig(**SMALL))
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, SMALL["block_size"] + 1, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens must be an integer tensor"):
        m(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"tokens must be ids in \[0, 53\)"):
        m(torch.full((1, 3), 53))
    _, cache = m.decode(torch.zeros(1, SMALL["block_size"] - 1, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed block_size"):
        m.decode(torch.zeros(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="attention_mask must be bool"):
        m(torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3))


def test_fused_qkv_projection_equals_the_three_linear_layers():
    from lib.attention import MultiHeadAttention, split_heads
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 5, 32)
    q, k, v = mha.project_qkv(x)
    for got, layer in ((q, mha.w_q), (k, mha.w_k), (v, mha.w_v)):
        torch.testing.assert_close(got, split_heads(layer(x), 4))
    out, _ = mha.attend_heads(q, k, v, mask=torch.ones(5, 5, dtype=torch.bool).tril())
    ref, _ = mha(x, x, x, mask=torch.ones(5, 5, dtype=torch.bool).tril())
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="d_model=32"):
        mha.project_qkv(torch.randn(2, 5, 31))


@pytest.mark.parametrize("method,kw", [("greedy", {}),
                                       ("sample", dict(temperature=0.8, top_k=10, top_p=0.9)),
                                       ("beam", dict(num_beams=3))])
def test_lib_generate_gives_the_same_tokens_with_and_without_the_cache(method, kw):
    from lib import generate as gen
    torch.manual_seed(0)
    m = GPT(GPTConfig(**SMALL)).eval()
    prompt = torch.randint(7, SMALL["vocab_size"], (2, 4), generator=torch.Generator().manual_seed(1))
    runs = []
    for use_cache in (True, False):
        extra = {"generator": torch.Generator().manual_seed(5)} if method == "sample" else {}
        eos = {"eos_id": 3} if method == "beam" else {"eos_id": None}
        runs.append(gen.generate(m, prompt, method=method, max_new_tokens=12, use_cache=use_cache,
                                 **eos, **kw, **extra).tokens)
    assert torch.equal(runs[0], runs[1])
    if method == "greedy":      # and greedy is the argmax of a plain forward pass, step by step
        seq = prompt
        for _ in range(12):
            seq = torch.cat([seq, m(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(runs[0], seq[:, 4:])
