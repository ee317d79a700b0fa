"""lib.models.reference: the strict name-table weight copy."""
import pytest
import torch
from torch import nn

from lib.models.reference import Source, WeightCopyError, copy_weights, split, transpose


class Fused(nn.Module):          # a reference with a fused qkv stored (in, out) like HF Conv1D
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Parameter(torch.randn(4, 12))
        self.bias = nn.Parameter(torch.randn(4))
        self.register_buffer("mask", torch.ones(3, 3))


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(4, 4, bias=False) for _ in range(3))
        self.b = nn.Parameter(torch.zeros(4))


def table():
    return {f"{n}.weight": Source("c_attn", split(i, 3, 0, then=transpose), shared=True)
            for i, n in enumerate("qkv")} | {"b": "bias"}


def test_copies_fused_and_transposed_weights():
    ref, ours = Fused(), Split()
    copy_weights(ours, ref, table(), ignore_theirs=["mask"])
    x = torch.randn(2, 4)
    q, k, v = (x @ ref.c_attn).chunk(3, dim=-1)
    torch.testing.assert_close(ours.q(x), q)
    torch.testing.assert_close(ours.v(x), v)
    torch.testing.assert_close(ours.b, ref.bias)


def test_every_reference_key_must_be_used():
    with pytest.raises(WeightCopyError, match="never uses.*mask"):
        copy_weights(Split(), Fused(), table())


def test_every_key_of_ours_needs_a_source():
    t = table()
    del t["b"]
    with pytest.raises(WeightCopyError, match="no source.*'b'"):
        copy_weights(Split(), Fused(), t, ignore_theirs=["mask"], tied_theirs=["bias"])


def test_a_key_used_twice_without_shared_is_an_error():
    t = table() | {"b": "bias", "k.weight": Source("c_attn", split(1, 3, 0, then=transpose))}
    with pytest.raises(WeightCopyError, match="without shared=True"):
        copy_weights(Split(), Fused(), t, ignore_theirs=["mask"])


def test_shape_mismatch_names_the_key_and_writes_nothing():
    ours = Split()
    before = ours.q.weight.clone()
    t = table() | {"v.weight": Source("c_attn", shared=True)}   # forgot to split
    ref = Fused()
    ref.c_attn.data = torch.randn(4, 12)
    with pytest.raises(WeightCopyError, match=r"v.weight: ours has shape \(4, 4\), the reference gives \(4, 12\)"):
        copy_weights(ours, ref, t, ignore_theirs=["mask"])
    torch.testing.assert_close(ours.q.weight, before)


def test_unknown_reference_key_is_reported():
    t = table() | {"b": "nope"}
    with pytest.raises(WeightCopyError, match="'nope', which the reference does not have"):
        copy_weights(Split(), Fused(), t, ignore_theirs=["mask"], tied_theirs=["bias"])


def test_randomise_draws_weights_around_zero_and_norm_scales_around_one():
    from lib.models.reference import randomise

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))

    m = randomise(model(), std=0.3, seed=5)
    w, gain, bias = m[0].weight, m[1].weight, m[1].bias
    assert abs(w.mean().item()) < 0.02 and abs(w.std().item() - 0.3) < 0.02
    assert abs(gain.mean().item() - 1.0) < 0.15 and gain.std().item() > 0.2     # the norm scale: around 1
    assert abs(bias.mean().item()) < 0.15 and bias.std().item() > 0.2           # its bias: around 0
    again = randomise(model(), std=0.3, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), again.parameters()))
    other = randomise(model(), std=0.3, seed=6)
    assert not torch.equal(m[0].weight, other[0].weight)
    # only= redraws the parameters it names and leaves the others as they were
    before = model()
    part = randomise(model(), only=r"^1\.")
    assert torch.equal(part[0].weight, before[0].weight) and not torch.equal(part[1].weight, before[1].weight)
