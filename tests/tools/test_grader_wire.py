"""The grader's wire format (tools/grader/wire.py), the one definition of what crosses the sandbox
boundary: values and messages survive a round trip unchanged, the size cap holds, and anything
malformed is refused with a WireError that says what is wrong. (The kernel server and the grader's
end, which both use it, are tested in tests/exercises/test_exercises.py, in-process and in a real sandbox.)"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tools.grader import wire


def _same(a, b) -> bool:
    """Equal values of the same types (tensors: dtype, shape and bits; arrays likewise)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _through(x, **kw):
    """x encoded, sent as JSON text, decoded."""
    return wire.decode(json.loads(json.dumps(wire.encode(x, **kw))))


@pytest.mark.parametrize("dtype", wire.DTYPES)
def test_tensors_of_every_allowed_dtype_round_trip(dtype):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, generator=g) * 50).to(dt)
    for t in (x, x[:, 1], x.t(), x[0, 0], x[:0]):   # views, a transpose, a 0-d tensor, an empty one
        back = _through(t)
        assert back.dtype == dt and back.shape == t.shape and torch.equal(back, t), (dtype, t.shape)
        assert not back.requires_grad


def test_values_round_trip():
    value = {"none": None, "flags": [True, False], "n": -3, "x": 2.5, "s": "é\n@@", "empty": [],
             "nested": (1, [2, (3, {"k": "v"})]), "dtype": torch.int64,
             "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.array([1 + 2j]), np.zeros((0, 2), bool)],
             "scalar": np.float32(1.5)}
    back = _through(value)
    expected = dict(value, scalar=1.5)   # a numpy scalar crosses as a number
    assert _same(back, expected), back
    assert isinstance(back["nested"], tuple) and isinstance(back["nested"][1][1], tuple)


def test_requires_grad_crosses_only_when_asked():
    t = torch.ones(2, requires_grad=True)
    assert not _through(t).requires_grad             # answers are plain data
    back = _through([t, torch.ones(2)], grad=True)    # the grader's arguments it differentiates
    assert back[0].requires_grad and not back[1].requires_grad


def test_objects_that_are_not_data_cross_as_handles_only_when_the_sides_allow():
    kept = []

    def ref(obj):
        kept.append(obj)
        return wire.handle_ref(len(kept), type(obj).__name__)

    value = wire.encode({"f": len, "data": [1]}, ref)
    assert value == {"__dict__": [["f", {"__h__": 1, "type": "builtin_function_or_method"}], ["data", [1]]]}
    back = wire.decode(value, lambda h, type_name: (kept[h - 1], type_name))
    assert back == {"f": (len, "builtin_function_or_method"), "data": [1]}
    with pytest.raises(TypeError, match="cannot send a builtin_function_or_method"):
        wire.encode(len)
    with pytest.raises(wire.WireError, match="handle where none can be resolved"):
        wire.decode(value)


def test_mutables_lists_what_a_call_may_change_in_place_in_one_order():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    inner = [b]
    d = {"k": inner, "t": c}
    args = (a, (inner, 3), "s")
    got = wire.mutables(args, {"d": d, "n": 1})
    # a container before what it holds; tuples are walked but cannot change; nothing twice
    assert [id(x) for x in got] == [id(a), id(inner), id(b), id(d), id(c)]
    assert wire.mutables((), {}) == []
    loop = []
    loop.append(loop)
    assert wire.mutables((loop,), {}) == [loop]


@pytest.mark.parametrize("op", sorted(wire.REQUESTS))
def test_every_request_kind_round_trips(op):
    samples = {str: "name", int: 7, bool: True, wire.VALUE: wire.encode([torch.ones(1), {"a": 1}])}
    fields = {k: samples[kind] for k, kind in wire.REQUESTS[op].items()}
    text = wire.request(op, **fields)
    assert wire.parse_request(text) == {"op": op, **fields}
    cell = wire.request_cell("_runner", "@@N@@", text)
    assert cell == f"_runner('@@N@@', {text!r})"


def test_replies_are_framed_and_the_last_framed_line_counts():
    nonce = wire.new_nonce()
    assert nonce != wire.new_nonce()
    value = {"value": wire.encode(torch.arange(3)), "changed": [[0, wire.encode(torch.zeros(1))]], "gid": 4}
    noise = "printed by the notebook\n" + "@@RPC-forged@@" + json.dumps({"value": 1}) + "\n"
    out = noise + wire.frame(nonce, json.dumps({"value": 0})) + "more output" + wire.frame(nonce, wire.dump_reply(value))
    got = wire.read_reply(out, nonce)
    assert got["gid"] == 4 and torch.equal(wire.decode(got["value"]), torch.arange(3))
    assert wire.read_reply(noise, nonce) is None    # no reply: the caller says the notebook gave none
    err = wire.read_reply(wire.frame(nonce, wire.dump_reply(wire.error_reply(KeyError("x" * 900)))), nonce)
    assert err["exc"][0] == "KeyError" and len(err["exc"][1]) == 500


def test_the_size_cap():
    limit = 1000
    ok = torch.zeros(250)                        # 1000 bytes of data: at the limit
    assert wire.encode(ok, budget=wire.Budget(limit))["__t__"][1] == [250]
    with pytest.raises(wire.AnswerTooLarge, match="limit of 1000 bytes"):
        wire.encode(torch.zeros(251), budget=wire.Budget(limit))
    budget = wire.Budget(limit)                  # one budget for the whole reply, containers included
    with pytest.raises(wire.AnswerTooLarge):
        wire.encode([torch.zeros(200), np.zeros(20), "x" * 100], budget=budget)
    with pytest.raises(wire.AnswerTooLarge, match="limit of 16 MB"):
        wire.encode(torch.zeros(wire.MAX_ANSWER // 4 + 1))
    # many small items carry no data but a long text: the reply's text is capped at twice the limit
    many = {"value": wire.encode(list(range(2000)), budget=wire.Budget(limit))}
    with pytest.raises(wire.AnswerTooLarge):
        wire.dump_reply(many, limit)
    assert json.loads(wire.dump_reply(many, 10 * limit)) == many
    # the grader refuses a reply over its message limit whatever the kernel says
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.read_reply("@@N@@" + json.dumps({"value": "x" * 200}), "@@N@@", limit=100)
    assert wire.MAX_MESSAGE > 2 * wire.MAX_ANSWER


_ONE = wire.encode(torch.ones(1))["__t__"]


@pytest.mark.parametrize("text, match", [
    ("not json", "request: not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"op": "delete"}', "unknown request kind 'delete'"),
    ('{"name": "x"}', "unknown request kind None"),
    ('{"op": "get"}', "request 'get': missing field"),
    ('{"op": "get", "name": 1}', "field 'name' must be str"),
    ('{"op": "len", "h": true}', "field 'h' must be an int, not bool"),
    ('{"op": "get", "name": "x", "path": "/etc"}', "unknown field 'path'"),
])
def test_a_malformed_request_says_what_is_wrong(text, match):
    with pytest.raises(wire.WireError, match=match):
        wire.parse_request(text)


@pytest.mark.parametrize("reply, match", [
    ({}, "exactly one of value, missing, exc, has none"),
    ({"value": 1, "exc": ["E", "m"]}, "exactly one of value, missing, exc, has value, exc"),
    ({"exc": ["ValueError"]}, "'exc' must be \\[exception type name, message\\]"),
    ({"exc": [1, 2]}, "'exc' must be"),
    ({"missing": True, "gid": 1}, "only with a value"),
    ({"value": 1, "changed": [[-1, 0]]}, "each 'changed' item"),
    ({"value": 1, "changed": [0]}, "each 'changed' item"),
    ({"value": 1, "score": 100}, "unknown field 'score'"),
])
def test_a_malformed_reply_says_what_is_wrong(reply, match):
    with pytest.raises(wire.WireError, match=match):
        wire.read_reply("@@N@@" + json.dumps(reply), "@@N@@")
    with pytest.raises(wire.WireError, match=match):    # and the kernel side cannot send it
        wire.dump_reply(reply)


def _nested(n):
    v = 1
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("value, match", [
    ({"__t__": ["float32", [2], _ONE[2], False]}, "4 bytes of data do not fit the shape \\[2\\]"),
    ({"__t__": ["float32", [-1], _ONE[2], False]}, "a shape must be a list of sizes"),
    ({"__t__": ["object", [1], _ONE[2], False]}, "unsupported tensor dtype 'object'"),
    ({"__t__": ["float32", [1], "not base64!", False]}, "not valid base64"),
    ({"__t__": ["float32", [1], _ONE[2]]}, "__t__ needs a list of 4 items"),
    ({"__a__": ["|O", [1], ""]}, "unsupported array dtype"),
    ({"__a__": ["<f4", [3], _ONE[2]]}, "do not fit the shape"),
    ({"__dtype__": "Tensor"}, "unsupported dtype 'Tensor'"),
    ({"__tuple__": [1], "__dict__": []}, "exactly one tag"),
    ({"a": 1}, "exactly one tag"),
    ({"__h__": 1, "type": "f", "x": 2}, "exactly one tag"),
    ({"__h__": "1"}, "a handle is"),
    ({"__dict__": [[1, 2]]}, "string key"),
    (_nested(wire.MAX_DEPTH + 2), "nested too deeply"),
])
def test_a_malformed_value_says_what_is_wrong(value, match):
    with pytest.raises(wire.WireError, match=match):
        wire.decode(value, lambda h, t: None)
