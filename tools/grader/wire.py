"""The wire format of the sandbox boundary, defined once: the grader's side (remote.py) and the
kernel server (kernel_server.py, which runs in the sandbox) both import this module. It needs
nothing but the standard library (torch and numpy are used only for values that are theirs), so the
grader sends its source text into the kernel beside the server's (kernel._setup_cell).

A **request** is one JSON object ``{"op": KIND, ...fields}`` (REQUESTS lists each kind's fields).
The grader sends it by executing one line of code in the kernel, ``request_cell``: a call of the
server's runner with a fresh nonce and the request's text.

A **reply** is one JSON object written by the runner to the kernel's stdout on a line of its own,
after the nonce (``frame``); the grader reads the last such line of the execution's output
(``read_reply``). A reply holds exactly one of ``value`` (the answer), ``missing`` (no such name) or
``exc`` (``[exception type name, message]``), and with ``value`` maybe ``changed`` (the tensors,
lists and dicts among a call's arguments that the call changed in place: ``[index, new value]``, the
index counting in ``mutables`` order) and ``gid`` (a handle for the vector-Jacobian product of a
call's tensor arguments, counted in ``tensors`` order).

A **value** is JSON: None, bools, numbers and strings as themselves, lists as lists, and objects
with exactly one tag:

- ``{"__t__": [dtype, shape, base64 bytes, requires_grad]}`` a tensor (dtype in DTYPES; the flag is
  set by the grader only, on the arguments it differentiates);
- ``{"__a__": [numpy dtype string, shape, base64 bytes]}`` a numeric numpy array;
- ``{"__dtype__": name}`` a torch dtype; ``{"__tuple__": [values]}``; ``{"__dict__": [[key, value], ...]}``
  (string keys); ``{"__h__": int, "type": name}`` a handle for an object that is not data (a function,
  a module...), which only the side that made it can resolve.

**Size.** One reply carries at most MAX_ANSWER bytes of data (tensors, arrays, strings: counted by
``Budget`` while encoding) and its text at most twice that (``dump_reply``); the server answers
``AnswerTooLarge`` instead. The grader's sockets drop any message over MAX_MESSAGE, so a submission
that bypasses the server only loses its own answer. Anything that breaks these rules is a
``WireError`` that says what is wrong.
"""
from __future__ import annotations

import base64
import json
import secrets
import sys

MAX_ANSWER = 16 * 2**20       # bytes of data in one reply
MAX_MESSAGE = 4 * MAX_ANSWER  # bytes of one message on the grader's sockets
MAX_DEPTH = 50                # nesting of containers in one value

# torch dtypes that may cross (by name); numpy arrays of these kinds (bool, int, uint, float, complex)
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16",
          "int32", "int64", "uint8", "bool")
ARRAY_KINDS = "biufc"

VALUE = object   # a field that holds a value (see the module docstring)

# request kind -> its fields and their types (all required, no others)
REQUESTS = {
    "get": {"name": str},                                                # a name of the notebook
    "call": {"h": int, "args": VALUE, "kwargs": VALUE, "grad": bool},    # call a handle
    "getattr": {"h": int, "name": str},
    "getitem": {"h": int, "key": VALUE},
    "iter": {"h": int},                                                  # list(obj)
    "len": {"h": int},
    "vjp": {"gid": int, "grads": VALUE},                                 # gradients of a call's inputs
}

# reply fields and their types (exactly one of ANSWERS; the others only beside "value")
REPLY = {"value": VALUE, "missing": bool, "exc": list, "changed": list, "gid": int}
ANSWERS = ("value", "missing", "exc")

_TAGS = ("__t__", "__a__", "__dtype__", "__tuple__", "__dict__", "__h__")


class WireError(ValueError):
    """A message or value that does not follow the wire format."""


class AnswerTooLarge(ValueError):
    """A reply over the size cap (see Budget)."""


class Budget:
    """The bytes of data (tensors, arrays, strings) one reply has used so far, at most ``limit``."""

    def __init__(self, limit: int = MAX_ANSWER):
        self.limit, self.used = int(limit), 0

    def charge(self, nbytes: int) -> None:
        self.used += int(nbytes)
        if self.used > self.limit:
            raise AnswerTooLarge(f"the answer is larger than the grader's limit of {_size(self.limit)}")


def _size(n: int) -> str:
    return f"{n // 2**20} MB" if n >= 2**20 else f"{n} bytes"


def _is(x, kind) -> bool:
    """``x`` has the field type ``kind`` (bool is not an int here)."""
    if kind is VALUE:
        return True
    if kind is int:
        return isinstance(x, int) and not isinstance(x, bool)
    return isinstance(x, kind)


def _fields(msg, spec: dict, what: str) -> None:
    for k, v in msg.items():
        if k not in spec:
            raise WireError(f"{what}: unknown field {k!r}")
        if not _is(v, spec[k]):
            raise WireError(f"{what}: field {k!r} must be {'an int' if spec[k] is int else spec[k].__name__}, "
                            f"not {type(v).__name__}")


def _loads(text, what: str):
    if not isinstance(text, str):
        raise WireError(f"{what}: expected JSON text, got {type(text).__name__}")
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise WireError(f"{what}: not JSON ({e})") from None
    if not isinstance(msg, dict):
        raise WireError(f"{what}: expected a JSON object, got {type(msg).__name__}")
    return msg


# -- requests (grader -> kernel)

def request(op: str, **fields) -> str:
    """The JSON text of one request, checked against REQUESTS."""
    return json.dumps(check_request({"op": op, **fields}))


def check_request(msg: dict) -> dict:
    op = msg.get("op")
    if op not in REQUESTS:
        raise WireError(f"unknown request kind {op!r} (expected one of {', '.join(REQUESTS)})")
    spec = REQUESTS[op]
    rest = {k: v for k, v in msg.items() if k != "op"}
    missing = [k for k in spec if k not in rest]
    if missing:
        raise WireError(f"request {op!r}: missing field(s) {', '.join(missing)}")
    _fields(rest, spec, f"request {op!r}")
    return msg


def parse_request(text: str) -> dict:
    """The request a runner received (a dict with ``op`` and its fields) or a WireError."""
    return check_request(_loads(text, "request"))


def new_nonce() -> str:
    return "@@RPC-" + secrets.token_hex(12) + "@@"


def request_cell(runner: str, nonce: str, text: str) -> str:
    """The line of code the grader executes in the kernel to send one request."""
    return f"{runner}({nonce!r}, {text!r})"


# -- replies (kernel -> grader)

def error_reply(e: BaseException) -> dict:
    return {"exc": [type(e).__name__, str(e)[:500]]}


def dump_reply(reply: dict, limit: int = MAX_ANSWER) -> str:
    """The JSON text of one reply; AnswerTooLarge when the text is over twice ``limit`` (containers
    of many small items, which Budget does not count)."""
    check_reply(reply)
    text = json.dumps(reply)
    if len(text) > 2 * limit:
        raise AnswerTooLarge(f"the answer is larger than the grader's limit of {_size(limit)}")
    return text


def frame(nonce: str, text: str) -> str:
    """What the runner writes to stdout: the reply on a line of its own, after the nonce."""
    return "\n" + nonce + text + "\n"


def check_reply(msg: dict) -> dict:
    _fields(msg, REPLY, "reply")
    answers = [k for k in ANSWERS if k in msg]
    if len(answers) != 1:
        raise WireError(f"reply: needs exactly one of {', '.join(ANSWERS)}, has {', '.join(answers) or 'none'}")
    if answers != ["value"] and ("changed" in msg or "gid" in msg):
        raise WireError("reply: 'changed' and 'gid' come only with a value")
    if "exc" in msg and (len(msg["exc"]) != 2 or not all(isinstance(s, str) for s in msg["exc"])):
        raise WireError("reply: 'exc' must be [exception type name, message]")
    for item in msg.get("changed", ()):
        if not (isinstance(item, list) and len(item) == 2 and _is(item[0], int) and item[0] >= 0):
            raise WireError("reply: each 'changed' item must be [argument index, value]")
    return msg


def read_reply(stdout: str, nonce: str, limit: int = MAX_MESSAGE) -> dict | None:
    """The reply in an execution's output (its last line that starts with the nonce), checked; None
    if there is none."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(nonce)]
    if not lines:
        return None
    text = lines[-1][len(nonce):]
    if len(text) > limit:
        raise WireError(f"reply: {len(text)} characters, over the limit of {limit}")
    return check_reply(_loads(text, "reply"))


# -- values

def handle_ref(h: int, type_name: str | None = None) -> dict:
    return {"__h__": int(h)} if type_name is None else {"__h__": int(h), "type": str(type_name)}


def mutables(args, kwargs) -> list:
    """What a call may change in place: the tensors, lists and dicts among its arguments (``args``
    then the values of ``kwargs``) and inside them (lists, tuples, dict values), depth first, a
    container before what it holds: the order ``changed`` counts in."""
    torch = sys.modules.get("torch")
    out, seen = [], set()

    def walk(x, depth):
        if depth > MAX_DEPTH or id(x) in seen:
            return
        if torch is not None and isinstance(x, torch.Tensor):
            seen.add(id(x))
            out.append(x)
        elif isinstance(x, (list, tuple, dict)):
            seen.add(id(x))
            if not isinstance(x, tuple):
                out.append(x)
            for v in (x.values() if isinstance(x, dict) else x):
                walk(v, depth + 1)

    for v in [*args, *kwargs.values()]:
        walk(v, 0)
    return out


def tensors(x, out=None) -> list:
    """The tensors in ``x`` (lists, tuples and dict values, depth first): the order of a call's
    inputs and outputs in a vector-Jacobian product."""
    torch = sys.modules.get("torch")
    out = [] if out is None else out
    if torch is not None and isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            tensors(v, out)
    return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def encode(x, handle=None, budget: Budget | None = None, grad: bool = False, depth: int = 0):
    """``x`` as a value. ``handle(obj)`` gives the value of an object that is not data (a
    ``handle_ref``) or raises TypeError; without it such objects are a TypeError. ``budget`` counts
    the bytes of data (a fresh Budget(MAX_ANSWER) when None). ``grad``: send each tensor's
    requires_grad (the grader's arguments); otherwise the flag is False."""
    budget = Budget() if budget is None else budget
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        budget.charge(len(x))
        return str.__str__(x)
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(x, torch.Tensor):
        budget.charge(x.numel() * x.element_size())
        t = x.detach().cpu().resolve_conj().resolve_neg().contiguous()
        a = t.view(torch.int16) if t.dtype == torch.bfloat16 else t   # numpy has no bfloat16: its bits
        return {"__t__": [str(t.dtype).replace("torch.", ""), list(t.shape), _b64(a.numpy().tobytes()),
                          bool(grad and x.requires_grad)]}
    if torch is not None and isinstance(x, torch.dtype):
        return {"__dtype__": str(x).replace("torch.", "")}
    if np is not None and isinstance(x, np.generic) and x.dtype.kind in "biuf":
        return encode(x.item(), handle, budget, grad, depth)
    if np is not None and isinstance(x, np.ndarray) and x.dtype.kind in ARRAY_KINDS:
        budget.charge(x.nbytes)
        a = np.ascontiguousarray(x)
        return {"__a__": [a.dtype.str, list(a.shape), _b64(a.tobytes())]}
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v, handle, budget, grad, depth + 1) for v in x]}
    if isinstance(x, list):
        return [encode(v, handle, budget, grad, depth + 1) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {"__dict__": [[str(k), encode(v, handle, budget, grad, depth + 1)] for k, v in x.items()]}
    if handle is None:
        raise TypeError(f"cannot send a {type(x).__name__} across the boundary")
    return handle(x)


def _shape(shape) -> list:
    if not (isinstance(shape, list) and all(_is(s, int) and s >= 0 for s in shape)):
        raise WireError(f"a shape must be a list of sizes, not {shape!r:.80}")
    return shape


def _raw(data, shape, itemsize: int) -> bytearray:
    if not isinstance(data, str):
        raise WireError("tensor or array data must be base64 text")
    try:
        raw = bytearray(base64.b64decode(data, validate=True))
    except ValueError:
        raise WireError("tensor or array data is not valid base64") from None
    n = 1
    for s in shape:
        n *= s
    if n * itemsize != len(raw):
        raise WireError(f"{len(raw)} bytes of data do not fit the shape {shape}")
    return raw


def _parts(x, tag: str, n: int) -> list:
    v = x[tag]
    if not (isinstance(v, list) and len(v) == n):
        raise WireError(f"{tag} needs a list of {n} items")
    return v


def decode(x, handle=None, depth: int = 0):
    """The object a value stands for; WireError for anything that is not a well-formed value.
    ``handle(h, type_name)`` resolves a handle (without it a handle is a WireError)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [decode(v, handle, depth + 1) for v in x]
    if not isinstance(x, dict):
        raise WireError(f"not a value: {type(x).__name__}")
    tags = [k for k in x if k in _TAGS]
    extra = [k for k in x if k not in _TAGS and not (k == "type" and tags == ["__h__"])]
    if len(tags) != 1 or extra:
        raise WireError(f"an object value needs exactly one tag of {', '.join(_TAGS)}; got keys {sorted(x)!r:.120}")
    tag = tags[0]
    if tag == "__t__":
        import torch
        dtype, shape, data, grad = _parts(x, tag, 4)
        if dtype not in DTYPES:
            raise WireError(f"unsupported tensor dtype {dtype!r:.40}")
        dt = getattr(torch, dtype)
        raw = _raw(data, _shape(shape), torch.empty(0, dtype=dt).element_size())
        t = (torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)).reshape(shape).clone()
        return t.requires_grad_(True) if grad is True and (t.is_floating_point() or t.is_complex()) else t
    if tag == "__a__":
        import numpy as np
        dtype, shape, data = _parts(x, tag, 3)
        try:
            dt = np.dtype(str(dtype))
        except TypeError:
            raise WireError(f"unsupported array dtype {dtype!r:.40}") from None
        if dt.kind not in ARRAY_KINDS or dt.hasobject:
            raise WireError(f"unsupported array dtype {dtype!r:.40}")
        raw = _raw(data, _shape(shape), dt.itemsize)
        return np.frombuffer(bytes(raw), dtype=dt).reshape(shape).copy()
    if tag == "__dtype__":
        if x[tag] not in DTYPES:
            raise WireError(f"unsupported dtype {x[tag]!r:.40}")
        import torch
        return getattr(torch, x[tag])
    if tag == "__tuple__":
        if not isinstance(x[tag], list):
            raise WireError("__tuple__ needs a list")
        return tuple(decode(v, handle, depth + 1) for v in x[tag])
    if tag == "__dict__":
        pairs = x[tag]
        if not (isinstance(pairs, list)
                and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs)):
            raise WireError("__dict__ needs a list of [string key, value] pairs")
        return {k: decode(v, handle, depth + 1) for k, v in pairs}
    h, type_name = x[tag], x.get("type", "object")
    if not _is(h, int) or not isinstance(type_name, str):
        raise WireError("a handle is {'__h__': int, 'type': name}")
    if handle is None:
        raise WireError("a handle where none can be resolved")
    return handle(h, type_name)
