"""lib.models.xlnet: the two-stream masks against their definition, the query stream's blindness
to its own token, and equality with Hugging Face's XLNetModel / XLNetLMHeadModel."""
import pytest
import torch

from lib.models.xlnet import XLNet, XLNetConfig, load_hf_xlnet, partial_targets, permutation_masks
from lib.models.reference import randomise

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=37, n_layer=2, n_head=4, d_model=32, d_inner=48)


# ----------------------------------------------------------------------------- masks

@pytest.mark.parametrize("seed", range(4))
def test_permutation_masks_follow_the_definition(seed):
    T = 6
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
    content, query = permutation_masks(perm)
    order = perm.tolist()
    for i in range(T):
        for j in range(T):
            # position i is predicted at step order.index(i); it may use the positions before it in z
            assert bool(content[i, j]) == (order.index(j) <= order.index(i))
            assert bool(query[i, j]) == (order.index(j) < order.index(i))


def test_permutation_masks_examples():
    content, query = permutation_masks(torch.tensor([2, 1, 3, 0]))     # the paper's 3 -> 2 -> 4 -> 1, 0-based
    assert query[2].tolist() == [False, False, False, False]          # first in the order: sees nothing
    assert query[0].tolist() == [False, True, True, True]             # last: sees all the others
    assert content[1].tolist() == [False, True, True, False]
    ident_c, ident_q = permutation_masks(torch.arange(4))               # the left-to-right order = GPT's mask
    assert torch.equal(ident_c, torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(ident_q, torch.ones(4, 4, dtype=torch.bool).tril(-1))


def test_permutation_masks_batched_and_bad_input():
    perm = torch.stack([torch.tensor([1, 0, 2]), torch.tensor([2, 1, 0])])
    c, q = permutation_masks(perm)
    assert c.shape == (2, 3, 3) and torch.equal(c[1], permutation_masks(perm[1])[0])
    with pytest.raises(ValueError, match="permutation"):
        permutation_masks(torch.tensor([0, 0, 2]))
    with pytest.raises(TypeError, match="perm"):
        permutation_masks(torch.tensor([0.0, 1.0]))


def test_partial_targets_are_the_last_of_the_order():
    t = partial_targets(torch.tensor([3, 0, 2, 1, 4]), 2)
    assert t.tolist() == [False, True, False, False, True]      # steps 4 and 5 predict positions 1 and 4
    with pytest.raises(ValueError, match="num_predict"):
        partial_targets(torch.tensor([1, 0]), 2)


# ----------------------------------------------------------------------------- two streams

def _model(mem_len=0, seed=0):
    torch.manual_seed(seed)
    return randomise(XLNet(XLNetConfig(**SMALL, mem_len=mem_len)), std=0.2).eval()


@pytest.mark.parametrize("seed", range(3))
def test_query_stream_never_sees_its_own_token(seed):
    model = _model()
    g = torch.Generator().manual_seed(seed)
    T = 7
    x = torch.randint(0, SMALL["vocab_size"], (1, T), generator=g)
    perm = torch.randperm(T, generator=g)
    rank = perm.argsort()
    for i in range(T):
        y = x.clone()
        y[0, i] = (x[0, i] + 1 + seed) % SMALL["vocab_size"]
        with torch.no_grad():
            a, b = model(x, perm), model(y, perm)
        assert torch.allclose(a.query[0, i], b.query[0, i], atol=1e-6), f"g at {i} moved with its own token"
        assert not torch.allclose(a.content[0, i], b.content[0, i], atol=1e-4), "h must see its own token"
        later = rank > rank[i]
        before = rank < rank[i]
        if later.any():     # the tokens after i in the order do use it
            assert not torch.allclose(a.query[0, later], b.query[0, later], atol=1e-4)
        # nothing before i in the order may depend on i, in either stream
        assert torch.allclose(a.content[0, before], b.content[0, before], atol=1e-6)
        assert torch.allclose(a.query[0, before], b.query[0, before], atol=1e-6)


def test_no_permutation_is_bidirectional_without_query_stream():
    model = _model()
    x = torch.randint(0, SMALL["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, 4] = (y[:, 4] + 1) % SMALL["vocab_size"]
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.query is None and a.mems is None
    assert not torch.allclose(a.content[:, 0], b.content[:, 0], atol=1e-4)   # the first sees the last


def test_permutation_lm_loss_trains_only_the_targets():
    model = _model().train()
    x = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(2))
    loss = model.permutation_lm_loss(x, torch.randperm(6, generator=torch.Generator().manual_seed(3)), 2)
    assert loss.dim() == 0 and loss.item() > 0
    loss.backward()
    assert model.mask_emb.grad.abs().sum() > 0


# ----------------------------------------------------------------------------- Hugging Face

def _hf_pair(mem_len=5):
    torch.manual_seed(1)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=SMALL["vocab_size"], d_model=SMALL["d_model"], n_layer=SMALL["n_layer"], n_head=SMALL["n_head"],
        d_inner=SMALL["d_inner"], dropout=0.0, mem_len=mem_len, ff_activation="gelu")).eval()
    randomise(hf, std=0.2)
    ours = XLNet(XLNetConfig(**SMALL, mem_len=mem_len)).eval()
    load_hf_xlnet(ours, hf)
    return hf, ours


@pytest.mark.parametrize("with_memory,with_segments", [(False, False), (True, False), (True, True)])
def test_equals_hf_xlnet(with_memory, with_segments):
    """Content stream = XLNetModel with perm_mask; query stream = XLNetModel with target_mapping;
    logits = XLNetLMHeadModel; memories = its mems."""
    hf, ours = _hf_pair()
    g = torch.Generator().manual_seed(7)
    B, T = 2, 7
    first, x = (torch.randint(0, SMALL["vocab_size"], (B, T), generator=g) for _ in range(2))
    types = torch.randint(0, 2, (B, T), generator=g) if with_segments else None
    perm = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])
    _, query = permutation_masks(perm)
    perm_mask = (~query).float()                       # HF: 1 = may NOT attend (itself included)
    # predict every position but the first of each order (with no memory its query sees nothing,
    # which HF turns into a uniform average and we into zero weights)
    rank = perm.argsort(-1)
    targets = [[i for i in range(T) if rank[b, i] > 0] for b in range(B)]
    mapping = torch.zeros(B, T - 1, T)
    for b in range(B):
        mapping[b, torch.arange(T - 1), torch.tensor(targets[b])] = 1.0
    with torch.no_grad():
        hf_mems, mems = None, None
        if with_memory:
            hf_mems = hf.transformer(first, token_type_ids=types, use_mems=True).mems
            mems = ours(first, token_type_ids=types).mems
            for a, b in zip(mems, hf_mems):
                assert torch.allclose(a, b.transpose(0, 1), atol=1e-5)
        kw = dict(mems=hf_mems, perm_mask=perm_mask, token_type_ids=types)
        hf_h = hf.transformer(x, **kw).last_hidden_state
        hf_g = hf.transformer(x, target_mapping=mapping, **kw).last_hidden_state
        hf_logits = hf(x, target_mapping=mapping, **kw).logits
        out = ours(x, perm, mems=mems, token_type_ids=types)
    our_g = torch.stack([out.query[b, targets[b]] for b in range(B)])
    assert torch.allclose(out.content, hf_h, atol=1e-5)
    assert torch.allclose(our_g, hf_g, atol=1e-5)
    assert torch.allclose(ours.lm_logits(our_g), hf_logits, atol=1e-4)
    assert hf_logits.abs().max() > 1.0


def test_bidirectional_fine_tuning_mode_equals_hf():
    hf, ours = _hf_pair()
    x = torch.randint(0, SMALL["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.allclose(ours(x).content, hf.transformer(x).last_hidden_state, atol=1e-5)


def test_bad_inputs():
    model = _model()
    with pytest.raises(ValueError, match="perm must order"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.arange(3))
    with pytest.raises(ValueError, match="token_type_ids"):
        model(torch.zeros(1, 4, dtype=torch.long), token_type_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(TypeError):
        XLNet(dict(SMALL))
