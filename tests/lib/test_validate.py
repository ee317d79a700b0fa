import math

import numpy as np
import pytest
import torch

from lib import validate as V


def test_check_int_accepts_and_converts():
    assert V.check_int("n", 3) == 3
    out = V.check_int("n", np.int64(4), minimum=0)
    assert out == 4 and type(out) is int
    assert V.check_int("n", None, allow_none=True) is None
    assert V.check_int("n", 5, minimum=5, maximum=5) == 5


@pytest.mark.parametrize("value, exc, match", [
    (True, TypeError, r"n must be an int, got bool \(True\)"),
    (2.0, TypeError, r"n must be an int, got float \(2.0\)"),
    ("3", TypeError, "got str"),
    (None, TypeError, "got NoneType"),
    (0, ValueError, "n must be >= 1, got 0"),
    (11, ValueError, "n must be <= 10, got 11"),
])
def test_check_int_rejects(value, exc, match):
    with pytest.raises(exc, match=match):
        V.check_int("n", value, minimum=1, maximum=10)


def test_check_int_none_message_mentions_none():
    with pytest.raises(TypeError, match="an int or None"):
        V.check_int("seed", "x", allow_none=True)


def test_check_float():
    assert V.check_float("lr", 1) == 1.0 and type(V.check_float("lr", 1)) is float
    assert V.check_float("lr", np.float32(0.5)) == 0.5
    assert V.check_float("lr", None, allow_none=True) is None
    with pytest.raises(TypeError, match="lr must be a number"):
        V.check_float("lr", "0.1")
    with pytest.raises(TypeError, match="bool"):
        V.check_float("lr", False)
    with pytest.raises(ValueError, match="finite"):
        V.check_float("lr", math.inf)
    with pytest.raises(ValueError, match="finite"):
        V.check_float("lr", math.nan)
    with pytest.raises(ValueError, match="lr must be > 0, got 0.0"):
        V.check_float("lr", 0.0, positive=True)
    with pytest.raises(ValueError, match=">= -1"):
        V.check_float("x", -2, minimum=-1)
    with pytest.raises(ValueError, match="<= 1"):
        V.check_float("x", 2, maximum=1)


def test_check_probability():
    assert V.check_probability("p", 0) == 0.0
    assert V.check_probability("p", 1.0) == 1.0
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\), got 1.0"):
        V.check_probability("p", 1.0, allow_one=False)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        V.check_probability("p", -0.1)
    with pytest.raises(TypeError):
        V.check_probability("p", "half")


def test_check_bool_choice_callable():
    assert V.check_bool("flag", False) is False
    with pytest.raises(TypeError, match=r"flag must be True or False, got int \(1\)"):
        V.check_bool("flag", 1)
    assert V.check_choice("kind", "bpe", ("bpe", "wordpiece")) == "bpe"
    with pytest.raises(ValueError, match="kind must be one of 'bpe', 'wordpiece', got 'unigram'"):
        V.check_choice("kind", "unigram", ("bpe", "wordpiece"))
    with pytest.raises(ValueError):
        V.check_choice("mode", True, (1, 0))          # True == 1, but it is not the choice 1
    assert V.check_callable("fn", len) is len
    assert V.check_callable("fn", None, allow_none=True) is None
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        V.check_callable("fn", 3)


def test_check_tensor_dtype_kinds():
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert V.check_tensor("src", ids, dtype="int", dim=2) is ids
    V.check_tensor("m", torch.ones(2, dtype=torch.bool), dtype="bool")
    V.check_tensor("x", torch.ones(2, dtype=torch.float16), dtype="float")
    V.check_tensor("x", ids, dtype=(torch.int32, torch.int64))
    with pytest.raises(TypeError, match="src must be a torch.Tensor, got list"):
        V.check_tensor("src", [[1, 2]])
    with pytest.raises(TypeError, match="src must be an integer tensor, got dtype torch.float32"):
        V.check_tensor("src", ids.float(), dtype="int")
    with pytest.raises(TypeError, match="must be an integer tensor"):
        V.check_tensor("src", ids.bool(), dtype="int")         # bool is not an integer id type
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        V.check_tensor("x", ids, dtype="float")
    with pytest.raises(TypeError, match="x must have dtype torch.int32, got torch.int64"):
        V.check_tensor("x", ids, dtype=torch.int32)
    with pytest.raises(ValueError, match="dtype must be one of"):
        V.check_tensor("x", ids, dtype="complex")


def test_check_tensor_shapes():
    x = torch.zeros(2, 3)
    V.check_tensor("x", x, shape=(2, None))
    V.check_tensor("x", x, min_dim=2)
    with pytest.raises(ValueError, match=r"src must be \(batch, time\), got shape \(2, 3, 1\)"):
        V.check_tensor("src", x[..., None], dim=2, what="(batch, time)")
    with pytest.raises(ValueError, match=r"x must be 3-D, got shape \(2, 3\)"):
        V.check_tensor("x", x, dim=3)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        V.check_tensor("x", x, min_dim=3)
    with pytest.raises(ValueError, match=r"lengths must have shape \(5,\), got \(2,\)"):
        V.check_tensor("lengths", torch.zeros(2), shape=(5,))
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 4\), got \(2, 3\)"):
        V.check_tensor("x", x, shape=(None, 4))
    with pytest.raises(ValueError, match=r"lengths must have shape \(batch,\)=\(2,\), got \(1, 2\)"):
        V.check_tensor("lengths", torch.zeros(1, 2), shape=(2,), what="(batch,)")


def test_check_token_ids_accepts_and_returns():
    x = torch.tensor([[0, 4, 2]])
    assert V.check_token_ids("ids", x, 5) is x
    assert V.check_token_ids("ids", x.int(), 5) is not None              # int32 ids too
    assert V.check_token_ids("ids", torch.zeros(2, 0, dtype=torch.long), 5, allow_empty=True).shape == (2, 0)
    assert V.check_token_ids("types", torch.zeros(1, 3, dtype=torch.long), 2, shape=(1, 3)) is not None


@pytest.mark.parametrize("x, kwargs, exc, match", [
    ([[1, 2]], {}, TypeError, "ids must be a torch.Tensor, got list"),
    (torch.zeros(1, 3), {}, TypeError, "ids must be an integer tensor, got dtype torch.float32"),
    (torch.zeros(3, dtype=torch.long), {}, ValueError, r"ids must be \(batch, time\) token ids, got shape \(3,\)"),
    (torch.zeros(2, 0, dtype=torch.long), {}, ValueError, r"ids must hold at least one position, got shape \(2, 0\)"),
    (torch.tensor([[0, 5]]), {"vocab_size": 5}, ValueError, r"ids must be ids in \[0, 5\), got 0\.\.5"),
    (torch.tensor([[-1, 2]]), {"vocab_size": 5}, ValueError, r"in \[0, 5\), got -1\.\.2"),
    (torch.zeros(1, 3, dtype=torch.long), {"shape": (1, 4)}, ValueError, r"must have shape .*\(1, 4\), got \(1, 3\)"),
])
def test_check_token_ids_rejects(x, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        V.check_token_ids("ids", x, **kwargs)


def test_check_id_list_takes_lists_tensors_and_arrays():
    assert V.check_id_list("ids", [3, np.int64(4)]) == [3, 4]
    assert V.check_id_list("ids", torch.tensor([1, 2])) == [1, 2]
    assert V.check_id_list("ids", np.array([5, 6])) == [5, 6]
    assert V.check_id_list("ids", [torch.tensor(7)]) == [7]            # 0-d integer tensors
    assert V.check_id_list("ids", (i for i in [0, 1]), minimum=0) == [0, 1]


@pytest.mark.parametrize("ids, minimum, exc, match", [
    ("abc", None, TypeError, "ids must be a sequence of int ids, got str"),
    (torch.tensor([[1, 2]]), None, ValueError, r"ids must be 1-D, got a tensor of shape \(1, 2\)"),
    (np.zeros((2, 2), dtype=int), None, ValueError, "must be 1-D, got an array"),
    (torch.tensor([1.0]), None, TypeError, "must hold integer ids, got dtype torch.float32"),
    ([1, 2.0], None, TypeError, r"ids\[1\] must be an int, got float"),
    ([0, -1], 0, ValueError, r"ids\[1\] must be >= 0, got -1"),
])
def test_check_id_list_rejects(ids, minimum, exc, match):
    with pytest.raises(exc, match=match):
        V.check_id_list("ids", ids, minimum)
