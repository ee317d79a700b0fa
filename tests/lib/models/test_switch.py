"""The Switch layer (lib/models/switch.py): equal to Hugging Face's SwitchTransformersSparseMLP
with weights copied, the capacity and load-balancing properties, the float32 router, the
Switch GPT, and expert parallelism over two Gloo processes equal to one process."""
import pytest
import torch
import torch.nn.functional as F

from lib.layers import ACTIVATIONS
from lib.models.gpt import GPT, GPTConfig
from lib.models.switch import (SwitchFFN, SwitchGPT, SwitchGPTConfig, expert_capacity,
                               load_balancing_loss, load_hf_switch, route_top1)

from lib.models.reference import randomise
from lib.models import switch_parallel_check


# ----------------------------------------------------------------------------- Hugging Face

def hf_layer(d_model, d_ff, experts, capacity, seed):
    st = pytest.importorskip("transformers.models.switch_transformers.modeling_switch_transformers")
    from transformers import SwitchTransformersConfig
    cfg = SwitchTransformersConfig(d_model=d_model, d_ff=d_ff, num_experts=experts, expert_capacity=capacity,
                                   dropout_rate=0.0, router_dtype="float32", dense_act_fn="relu",
                                   router_jitter_noise=0.0)
    hf = st.SwitchTransformersSparseMLP(cfg).eval()
    randomise(hf, std=0.5, seed=seed, norm_scales_at_one=False)   # large enough that routing differs between tokens
    return st, hf


@pytest.mark.parametrize("capacity,experts", [(2, 4), (3, 4), (40, 4), (5, 8)])
def test_equals_hugging_face_sparse_mlp(capacity, experts):
    st, hf = hf_layer(16, 24, experts, capacity, seed=capacity)
    ours = SwitchFFN(16, 24, experts, capacity=capacity, activation="relu", bias=False).eval()
    load_hf_switch(ours, hf)
    x = torch.randn(3, 20, 16, generator=torch.Generator().manual_seed(capacity))
    with torch.no_grad():
        y, y_hf = ours(x), hf(x)
        dispatch_hf, gate_hf, logits_hf = hf.router(x)
        r = ours.route(x)
    # same routing: which token goes to which expert, and which are dropped
    dispatch = F.one_hot(r.expert, experts) * r.kept[..., None]
    assert torch.equal(dispatch, dispatch_hf)
    assert torch.allclose(r.gate, gate_hf.squeeze(-1), atol=1e-6)
    # same outputs (0 for the dropped tokens on both sides)
    assert torch.allclose(y, y_hf, atol=1e-5), (y - y_hf).abs().max()
    # same auxiliary loss (Hugging Face's load_balancing_loss_func, before alpha)
    aux_hf = st.load_balancing_loss_func(torch.softmax(logits_hf, -1), logits_hf.argmax(-1))
    assert torch.allclose(ours.stats.balance, aux_hf, atol=1e-6)
    assert torch.allclose(ours.stats.aux_loss, 0.01 * aux_hf, atol=1e-8)
    if capacity == 2:
        assert ours.stats.dropped_fraction > 0.3           # the small capacity does drop tokens


def test_copy_fails_when_an_expert_is_missing():
    from lib.models.reference import WeightCopyError
    _, hf = hf_layer(8, 12, 4, 3, seed=0)
    ours = SwitchFFN(8, 12, 3, capacity=3, activation="relu", bias=False)      # theirs has 4 experts
    with pytest.raises(WeightCopyError, match="never uses.*expert_3"):
        load_hf_switch(ours, hf)


# ----------------------------------------------------------------------------- routing

def confident(expert_ids, num_experts, p=0.9):
    """Router probabilities (1, T, E) that put p on the given expert of each token."""
    e = torch.tensor(expert_ids)
    probs = torch.full((1, len(expert_ids), num_experts), (1 - p) / (num_experts - 1))
    probs[0, torch.arange(len(e)), e] = p
    return probs


def test_expert_capacity_is_tokens_over_experts_times_factor():
    assert expert_capacity(64, 4, 1.0) == 16
    assert expert_capacity(64, 4, 1.25) == 20
    assert expert_capacity(64, 4, 2.0) == 32
    assert expert_capacity(64, 4, 1.1) == 18             # 17.6 rounded up
    assert expert_capacity(100, 10, 1.1) == 11           # 11.000000000000002 in floating point: not 12
    assert expert_capacity(10, 4, 1.0) == 3              # 2.5 rounded up
    assert expert_capacity(3, 8, 0.5) == 1               # never zero
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(64, 4, 0.0)
    with pytest.raises(ValueError, match="num_experts"):
        expert_capacity(64, 0, 1.0)


def test_capacity_overflow_drops_exactly_the_tokens_past_capacity_in_order():
    #          0  1  2  3  4  5  6  7  8  9
    choice = [2, 0, 2, 2, 1, 2, 0, 2, 0, 0]
    r = route_top1(confident(choice, 3), capacity=2)
    assert r.expert[0].tolist() == choice
    assert r.position[0].tolist() == [0, 0, 1, 2, 0, 3, 1, 4, 2, 3]
    # expert 2 keeps its first two tokens (0, 2), expert 0 its first two (1, 6), expert 1 its only one
    assert r.kept[0].tolist() == [True, True, True, False, True, False, True, False, False, False]
    # in order: the first tokens win even when a later one is more confident
    probs = confident([0, 0, 0], 2, p=0.6)
    probs[0, 2] = torch.tensor([0.99, 0.01])
    assert route_top1(probs, capacity=2).kept[0].tolist() == [True, True, False]


def test_capacity_is_per_group():
    probs = torch.cat([confident([1, 1, 1, 0], 2), confident([0, 1, 1, 1], 2)])   # two sequences
    r = route_top1(probs, capacity=2)
    assert r.kept.tolist() == [[True, True, False, True], [True, True, True, False]]
    assert r.dropped_fraction() == pytest.approx(0.25)


def test_dropped_tokens_get_zero_and_kept_tokens_gate_times_their_expert():
    torch.manual_seed(0)
    layer = SwitchFFN(8, 16, 4, 0.5, init_scale=1.0).eval()
    x = torch.randn(2, 16, 8)
    with torch.no_grad():
        y = layer(x)
        r = layer.route(x)
    assert not r.kept.all() and r.kept.any()
    assert torch.equal(y[~r.kept], torch.zeros_like(y[~r.kept]))
    for b, t in r.kept.nonzero().tolist():          # the naive loop: one token, its expert
        e = r.expert[b, t]
        h = ACTIVATIONS["gelu_tanh"](x[b, t] @ layer.w_in[e] + layer.b_in[e])
        expected = r.gate[b, t] * (h @ layer.w_out[e] + layer.b_out[e])
        assert torch.allclose(y[b, t], expected, atol=1e-5)


def test_dropped_tokens_pass_through_the_residual_of_a_switch_gpt_block():
    torch.manual_seed(0)
    model = SwitchGPT(SwitchGPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8,
                                      num_experts=4, capacity_factor=0.5)).eval()
    block = model.blocks[1]
    x = torch.randn(2, 16, 8)
    with torch.no_grad():
        h = x + block.self_attention(block.ln_1(x), None, None, True)
        out = block(x)
        kept = block.mlp.route(block.ln_2(h)).kept
    assert not kept.all()
    assert torch.equal(out[~kept], h[~kept])          # unchanged by the feed-forward sub-layer
    assert not torch.allclose(out[kept], h[kept])


# ----------------------------------------------------------------------------- load balancing

def test_balance_is_one_for_uniform_routing_and_grows_as_routing_collapses():
    n, t = 4, 64
    uniform = confident([i % n for i in range(t)], n, p=0.7)
    loss = load_balancing_loss(uniform, uniform.argmax(-1))
    assert loss.item() == pytest.approx(1.0, abs=1e-6)          # so the auxiliary loss is alpha there
    values = []
    for to_zero in (16, 32, 48, 64):                            # more and more tokens choose expert 0
        ids = [0] * to_zero + [i % n for i in range(t - to_zero)]
        probs = confident(ids, n, p=0.7)
        values.append(load_balancing_loss(probs, probs.argmax(-1)).item())
    assert all(a < b for a, b in zip(values, values[1:])), values
    assert values[0] > 1.0
    # complete collapse with certainty: N
    collapsed = confident([0] * t, n, p=1.0)
    assert load_balancing_loss(collapsed, collapsed.argmax(-1)).item() == pytest.approx(n)


def test_aux_loss_of_a_layer_with_uniform_routing_is_alpha():
    layer = SwitchFFN(4, 8, 4, 1.0)
    with torch.no_grad():
        layer.router.weight.copy_(3.0 * torch.eye(4))          # token t goes to expert t % 4
    x = F.one_hot(torch.arange(12) % 4, 4).float()[None].repeat(2, 1, 1)
    layer(x)
    assert layer.stats.dropped_fraction == 0.0
    assert torch.allclose(layer.stats.expert_fraction, torch.full((4,), 0.25))
    assert layer.stats.balance.item() == pytest.approx(1.0, abs=1e-6)
    assert layer.stats.aux_loss.item() == pytest.approx(0.01, abs=1e-8)


def test_balance_gradient_moves_probability_away_from_the_overloaded_expert():
    logits = torch.zeros(1, 8, 4)
    logits[0, :6, 0] = 1.0          # six of eight tokens prefer expert 0
    logits[0, 6:, 1] = 1.0
    logits.requires_grad_(True)
    probs = logits.softmax(-1)
    load_balancing_loss(probs, probs.argmax(-1)).backward()
    p0 = probs[..., 0].mean().item()
    new = (logits - 1.0 * logits.grad).softmax(-1)
    assert new[..., 0].mean().item() < p0


def test_switch_gpt_loss_adds_alpha_times_balance_of_every_switch_layer():
    torch.manual_seed(0)
    cfg = SwitchGPTConfig(vocab_size=13, block_size=8, n_layer=4, n_head=2, n_embd=8, num_experts=4)
    model = SwitchGPT(cfg)
    assert cfg.sparse_layers() == [1, 3] and len(model.switch_layers()) == 2
    idx = torch.randint(0, 13, (3, 8))
    logits, loss = model(idx, idx)
    ce = F.cross_entropy(logits.flatten(0, 1), idx.flatten())
    balance = sum(layer.stats.balance for layer in model.switch_layers())
    assert torch.allclose(loss, ce + 0.01 * balance)
    loss.backward()
    assert model.switch_layers()[0].router.weight.grad.abs().sum() > 0


def test_switch_gpt_has_the_flops_of_the_dense_gpt():
    kw = dict(vocab_size=65, block_size=32, n_layer=4, n_head=4, n_embd=32)
    dense = GPT(GPTConfig(**kw))
    sparse = SwitchGPT(SwitchGPTConfig(**kw, num_experts=8))
    routers = sum(layer.router.weight.numel() for layer in sparse.switch_layers())
    # a token uses one expert per Switch layer: the dense model's parameters plus the routers
    assert sparse.num_active_parameters() == dense.num_parameters() + routers
    ffn = sum(p.numel() for p in dense.blocks[1].mlp.parameters())
    assert sparse.num_parameters() == dense.num_parameters() + routers + 2 * 7 * ffn


# ----------------------------------------------------------------------------- precision, init, dropout

def test_router_runs_in_float32_for_bfloat16_inputs():
    torch.manual_seed(0)
    layer = SwitchFFN(16, 32, 4, 2.0, init_scale=1.0).to(torch.bfloat16)
    assert layer.router.weight.dtype == torch.bfloat16        # whatever the module's dtype ...
    x = torch.randn(2, 10, 16).to(torch.bfloat16)
    r = layer.route(x)
    assert r.probs.dtype == torch.float32                      # ... the softmax is float32
    expected = torch.softmax(x.float() @ layer.router.weight.float().t(), -1)
    assert torch.allclose(r.probs, expected, atol=1e-6)
    assert not torch.allclose(r.probs, expected.to(torch.bfloat16).float(), atol=1e-6)   # finer than bf16
    assert layer(x).dtype == torch.bfloat16


def test_smaller_initialisation():
    torch.manual_seed(0)
    layer = SwitchFFN(256, 512, 4, init_scale=0.1)
    for w, fan_in in ((layer.w_in, 256), (layer.w_out, 512), (layer.router.weight, 256)):
        std = (0.1 / fan_in) ** 0.5
        assert w.abs().max() <= 2 * std + 1e-7                       # truncated at two std
        # a normal truncated at +-2 sigma has std 0.880 sigma
        assert w.std().item() == pytest.approx(0.880 * std, rel=0.05)
    big = SwitchFFN(256, 512, 4, init_scale=1.0)
    assert big.w_in.std().item() == pytest.approx(10 ** 0.5 * layer.w_in.std().item(), rel=0.05)


def test_expert_dropout_only_in_training():
    torch.manual_seed(0)
    layer = SwitchFFN(8, 64, 2, 2.0, expert_dropout=0.4, init_scale=1.0)
    x = torch.randn(2, 6, 8)
    layer.train()
    a, b = layer(x), layer(x)
    assert not torch.allclose(a, b)
    layer.eval()
    assert torch.equal(layer(x), layer(x))


def test_bad_inputs_are_refused_with_clear_messages():
    layer = SwitchFFN(8, 16, 4)
    with pytest.raises(ValueError, match="d_model=8"):
        layer(torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match="batch, time, d_model"):
        layer(torch.randn(3, 8))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(2, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="activation"):
        SwitchFFN(8, 16, 4, activation="swish")
    with pytest.raises(ValueError, match="capacity"):
        route_top1(torch.rand(1, 4, 2), capacity=0)
    with pytest.raises(ValueError, match="expert"):
        load_balancing_loss(torch.rand(1, 4, 2), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="SwitchGPTConfig"):
        SwitchGPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))


# ----------------------------------------------------------------------------- expert parallelism

@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="this torch build has no Gloo backend")
def test_expert_parallel_over_two_processes_equals_one_process():
    parts = switch_parallel_check.launch(processes=2, capacity_factor=1.0)
    assert [p["rank"] for p in parts] == [0, 1] and all(p["world"] == 2 for p in parts)
    ref = switch_parallel_check.reference(1.0)
    assert 0 < ref["dropped"] < 1                               # the capacity path is exercised
    # each process's outputs and input gradients are its rows of the one-process ones
    assert torch.allclose(torch.cat([p["y"] for p in parts]), ref["y"], atol=1e-6)
    assert torch.allclose(torch.cat([p["x_grad"] for p in parts]), ref["x_grad"], atol=1e-6)
    for name, g in ref["grads"].items():
        if name.startswith("router"):    # replicated: the data-parallel sum of the processes' gradients
            got = parts[0]["grads"][name] + parts[1]["grads"][name]
        else:                            # process r holds experts 2r, 2r + 1: its gradients are theirs
            got = torch.cat([p["grads"][name] for p in parts])
            assert parts[0]["grads"][name].shape[0] == switch_parallel_check.EXPERTS // 2
        assert torch.allclose(got, g, atol=1e-5), f"{name}: {(got - g).abs().max()}"


def test_expert_parallel_launch_rejects_a_process_count_that_does_not_split_the_experts():
    with pytest.raises(ValueError, match="must divide the 4 experts"):
        switch_parallel_check.launch(processes=3)
