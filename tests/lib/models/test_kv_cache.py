"""lib.kv_cache: the one key/value cache of every decoder (the models' cached == uncached decoding
is tested with each model)."""
import torch

from lib import kv_cache
from lib.kv_cache import KVCache


def _kv(t, fill):
    return torch.full((2, 3, t, 4), float(fill)), torch.full((2, 3, t, 4), -float(fill))


def test_update_appends_along_time_and_stores_back():
    layer = {}
    k, v = kv_cache.update(layer, "self", *_kv(2, 1))
    assert k.shape == (2, 3, 2, 4) and layer["self_k"] is k and layer["self_v"] is v
    k, v = kv_cache.update(layer, "self", *_kv(1, 2))
    assert k.shape == (2, 3, 3, 4) and torch.equal(k[:, :, 2], torch.full((2, 3, 4), 2.0))
    assert torch.equal(v[:, :, :2], torch.full((2, 3, 2, 4), -1.0))
    assert set(layer) == {"self_k", "self_v"}


def test_update_without_a_cache_returns_the_new_keys():
    k0, v0 = _kv(2, 1)
    k, v = kv_cache.update(None, "self", k0, v0)
    assert k is k0 and v is v0


def test_memo_computes_once_then_reads_the_cache():
    calls = []

    def compute():
        calls.append(1)
        return _kv(5, 3)

    layer = {}
    first = kv_cache.memo(layer, "cross", compute)
    again = kv_cache.memo(layer, "cross", compute)
    assert len(calls) == 1 and again[0] is first[0] and again[1] is first[1]
    kv_cache.memo(None, "cross", compute)            # no cache: computed every time
    assert len(calls) == 2


def test_length_and_reorder():
    cache = KVCache(2)
    assert cache.length == 0
    for layer in cache.layers:
        kv_cache.update(layer, "self", torch.arange(2.0).view(2, 1, 1, 1).expand(2, 3, 4, 4).clone(),
                        torch.zeros(2, 3, 4, 4))
    cache.tgt_padding = torch.tensor([[True] * 4, [False] * 4])
    assert cache.length == 4 and repr(cache) == "KVCache(layers=2, length=4)"
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.layers[1]["self_k"][:, 0, 0, 0].tolist() == [1.0, 1.0, 0.0]
    assert cache.tgt_padding[:, 0].tolist() == [False, False, True]
