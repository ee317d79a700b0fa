"""The grader's side of the boundary: requests to the kernel server, answers decoded as data or proxies."""
from __future__ import annotations

import base64
import json
import secrets
import time

from .kernel import Kernel


class QuestionAborted(BaseException):
    """The notebook timed out, hung or died while a question's tests ran: the question scores 0.
    A BaseException so that no ``except Exception`` in a test can swallow it."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


class RemoteError(RuntimeError):
    """An exception raised by the submission's code that has no built-in counterpart."""


_TORCH_DTYPES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16",
                 "int32", "int64", "uint8", "bool"}


_MAX_DEPTH = 50


def _exception_type(name: str) -> type:
    import builtins
    cls = getattr(builtins, str(name), None)
    if (isinstance(cls, type) and issubclass(cls, Exception)
            and not issubclass(cls, (StopIteration, StopAsyncIteration))):
        return cls
    return RemoteError


class Remote:
    """The grader's end of one kernel: requests go in as JSON, answers come back as data only."""

    def __init__(self, kernel: Kernel, runner: str, timeout: float, deadline: float):
        self.kernel, self.runner, self.timeout, self.deadline = kernel, runner, timeout, deadline
        self.aborted: str | None = None
        self.too_large = False   # an answer was over MAX_ANSWER (noted in the CSV)

    def request(self, req: dict):
        if self.aborted:
            raise QuestionAborted(self.aborted)
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.aborted = "timeout"
            raise QuestionAborted("timeout")
        nonce = "@@RPC-" + secrets.token_hex(12) + "@@"
        r = self.kernel.execute(f"{self.runner}({nonce!r}, {json.dumps(req)!r})", min(self.timeout, left))
        if r.status in ("dead", "hung", "timeout"):
            self.aborted = r.status
            raise QuestionAborted(r.status)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(nonce)]
        if not lines:
            raise RemoteError("the notebook gave no answer" + (f" ({r.ename}: {_short(r.evalue)})" if r.ename else ""))
        out = json.loads(lines[-1][len(nonce):])
        if not isinstance(out, dict):
            raise RemoteError("malformed answer")
        if "exc" in out:
            name, msg = (list(out["exc"]) + ["", ""])[:2]
            self.too_large = self.too_large or name == "AnswerTooLarge"
            raise _exception_type(name)(str(msg))
        return out

    # -- data in both directions (the grader decodes; nothing is unpickled or evaluated)

    def encode(self, x, depth=0):
        import torch
        if depth > _MAX_DEPTH:
            raise ValueError("value nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, RemoteObject):
            return {"__h__": x._handle}
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            data = base64.b64encode(t.numpy().tobytes()).decode() if t.dtype != torch.bfloat16 else None
            if data is None:
                raise TypeError("bfloat16 tensors cannot be sent to the notebook")
            return {"__t__": [str(t.dtype).replace("torch.", ""), list(t.shape), data, bool(x.requires_grad)]}
        if isinstance(x, torch.dtype):
            return {"__dtype__": str(x).replace("torch.", "")}
        if isinstance(x, tuple):
            return {"__tuple__": [self.encode(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return [self.encode(v, depth + 1) for v in x]
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"__dict__": [[k, self.encode(v, depth + 1)] for k, v in x.items()]}
        try:
            import numpy as np
            if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
                a = np.ascontiguousarray(x)
                return {"__a__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode()]}
            if isinstance(x, np.generic):
                return x.item()
        except ImportError:
            pass
        raise TypeError(f"cannot send a {type(x).__name__} to the notebook")

    def decode(self, x, depth=0):
        import torch
        if depth > _MAX_DEPTH:
            raise ValueError("answer nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.decode(v, depth + 1) for v in x]
        if not isinstance(x, dict) or len(x) > 2 and "__dict__" not in x:
            raise RemoteError("malformed answer")
        if "__t__" in x:
            dtype, shape, data = x["__t__"][:3]
            if dtype not in _TORCH_DTYPES or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise RemoteError(f"unsupported tensor {dtype!r}")
            dt = getattr(torch, dtype)
            raw = bytearray(base64.b64decode(data, validate=True))
            n = 1
            for s in shape:
                n *= s
            if n * torch.empty(0, dtype=dt).element_size() != len(raw):
                raise RemoteError("tensor size does not match its shape")
            flat = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
            return flat.reshape(shape).clone()
        if "__a__" in x:
            import numpy as np
            dtype, shape, data = x["__a__"]
            dt = np.dtype(str(dtype))
            if dt.kind not in "biufc" or dt.hasobject:
                raise RemoteError("unsupported array")
            return np.frombuffer(base64.b64decode(data, validate=True), dtype=dt).reshape(shape).copy()
        if "__dtype__" in x:
            if x["__dtype__"] not in _TORCH_DTYPES:
                raise RemoteError("unsupported dtype")
            return getattr(torch, x["__dtype__"])
        if "__tuple__" in x:
            return tuple(self.decode(v, depth + 1) for v in x["__tuple__"])
        if "__dict__" in x:
            return {str(k): self.decode(v, depth + 1) for k, v in x["__dict__"]}
        if "__h__" in x:
            return RemoteObject(self, int(x["__h__"]), str(x.get("type", "object")))
        raise RemoteError("malformed answer")

    def get(self, name: str):
        out = self.request({"op": "get", "name": name})
        return None if out.get("missing") else self.decode(out.get("value"))

    def call(self, handle: int, args: tuple, kwargs: dict):
        import torch
        sent = _tensors([args, kwargs])
        ins = [t for t in sent if t.requires_grad]
        out = self.request({"op": "call", "h": handle, "args": self.encode(list(args)),
                            "kwargs": self.encode(dict(kwargs)), "grad": bool(ins)})
        value = self.decode(out.get("value"))
        # an in-place change the notebook made to a tensor argument is made to the test's tensor too
        # (arguments cross as copies; without this, "the input is unchanged" could never fail)
        for item in out.get("changed") or []:
            i, new = (list(item) + [None, None])[:2] if isinstance(item, list) else (None, None)
            new = self.decode(new)
            if not isinstance(i, int) or not 0 <= i < len(sent) or not isinstance(new, torch.Tensor):
                raise RemoteError("malformed answer")
            with torch.no_grad():
                if new.shape == sent[i].shape:
                    sent[i].copy_(new)
                else:
                    sent[i].data = new.to(sent[i].dtype)
        if not ins or "gid" not in out:
            return value
        # gradients: the outputs are tied to the inputs by a function whose backward asks the notebook
        # for the vector-Jacobian product (the graph stays in the notebook; only tensors cross)
        outs = [t for t in _tensors(value) if t.is_floating_point() or t.is_complex()]
        if not outs:
            return value
        gid = int(out["gid"])

        def vjp(grads):
            got = self.decode(self.request({"op": "vjp", "gid": gid, "grads": self.encode(list(grads))})["value"])
            if not isinstance(got, list) or len(got) != len(ins):
                raise RemoteError("malformed gradient")
            for g, t in zip(got, ins):
                if g is not None and (not isinstance(g, torch.Tensor) or g.shape != t.shape):
                    raise RemoteError("gradient with the wrong shape")
            return [None if g is None else g.to(t.dtype) for g, t in zip(got, ins)]

        tied = _Bridge.apply(vjp, len(ins), *ins, *outs)
        swap = {id(o): t for o, t in zip(outs, tied)}
        return _replace_tensors(value, swap)


def _tensors(x, out=None):
    import torch
    out = [] if out is None else out
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors(v, out)
    return out


def _replace_tensors(x, swap):
    import torch
    if isinstance(x, torch.Tensor):
        return swap.get(id(x), x)
    if isinstance(x, tuple):
        return tuple(_replace_tensors(v, swap) for v in x)
    if isinstance(x, list):
        return [_replace_tensors(v, swap) for v in x]
    if isinstance(x, dict):
        return {k: _replace_tensors(v, swap) for k, v in x.items()}
    return x


def _bridge_class():
    import torch

    class Bridge(torch.autograd.Function):
        @staticmethod
        def forward(ctx, vjp, n_in, *tensors):
            ctx.vjp, ctx.n_in, ctx.n_out = vjp, n_in, len(tensors) - n_in
            return tuple(t.clone() for t in tensors[n_in:])

        @staticmethod
        def backward(ctx, *grad_outs):
            grads = ctx.vjp(list(grad_outs))
            return (None, None, *grads, *([None] * ctx.n_out))

    return Bridge


class _LazyBridge:
    def apply(self, *a):
        global _Bridge
        _Bridge = _bridge_class()
        return _Bridge.apply(*a)


_Bridge = _LazyBridge()


class RemoteObject:
    """A submission object that is not plain data (a function, a class, a module...): calling it,
    reading its attributes or iterating over it asks the notebook; the answers are data."""

    def __init__(self, remote: Remote, handle: int, type_name: str):
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args, **kwargs):
        return self._remote.call(self._handle, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._remote.decode(self._remote.request({"op": "getattr", "h": self._handle, "name": name})["value"])

    def __getitem__(self, key):
        return self._remote.decode(self._remote.request(
            {"op": "getitem", "h": self._handle, "key": self._remote.encode(key)})["value"])

    def __iter__(self):
        return iter(self._remote.decode(self._remote.request({"op": "iter", "h": self._handle})["value"]))

    def __len__(self):
        n = self._remote.request({"op": "len", "h": self._handle})["value"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RemoteError("malformed length")
        return n

    def __repr__(self):
        return f"<submission {self._type}>"


class StudentNamespace(dict):
    """What otter's test runner sees as the notebook's globals: names are fetched from the notebook
    on first use (as data or RemoteObjects). ``notebook_cells`` (the submission's code cells, read
    by the grader from the file) is provided by the grader itself."""

    def __init__(self, remote: Remote, cells: list[str]):
        super().__init__()
        self._remote = remote
        dict.__setitem__(self, "notebook_cells", list(cells))

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        value = self._remote.get(key)
        dict.__setitem__(self, key, value)
        return default if value is None else value

    def __getitem__(self, key):
        return self.get(key)

    def __contains__(self, key):
        return True


def _short(s: str, n: int = 160) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"
