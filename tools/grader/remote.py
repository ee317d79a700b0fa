"""The grader's side of the boundary: requests to the kernel server, answers decoded as data or
proxies (the messages' format is wire.py's)."""
from __future__ import annotations

import time

from . import wire
from .kernel import Kernel


class QuestionAborted(BaseException):
    """The notebook timed out, hung or died while a question's tests ran: the question scores 0.
    A BaseException so that no ``except Exception`` in a test can swallow it."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


class RemoteError(RuntimeError):
    """An exception raised by the submission's code that has no built-in counterpart, or an answer
    that breaks the wire format."""


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
        self.too_large = False   # an answer was over wire.MAX_ANSWER (noted in the CSV)

    def request(self, op: str, **fields) -> dict:
        if self.aborted:
            raise QuestionAborted(self.aborted)
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.aborted = "timeout"
            raise QuestionAborted("timeout")
        nonce = wire.new_nonce()
        r = self.kernel.execute(wire.request_cell(self.runner, nonce, wire.request(op, **fields)),
                                min(self.timeout, left))
        if r.status in ("dead", "hung", "timeout"):
            self.aborted = r.status
            raise QuestionAborted(r.status)
        try:
            out = wire.read_reply(r.stdout, nonce)
        except wire.WireError as e:
            raise RemoteError(f"malformed answer: {e}") from None
        if out is None:
            raise RemoteError("the notebook gave no answer" + (f" ({r.ename}: {_short(r.evalue)})" if r.ename else ""))
        if "exc" in out:
            name, msg = out["exc"]
            self.too_large = self.too_large or name == wire.AnswerTooLarge.__name__
            raise _exception_type(name)(msg)
        return out

    # -- data in both directions (the grader decodes; nothing is unpickled or evaluated)

    def encode(self, x):
        return wire.encode(x, self._ref, grad=True)

    def _ref(self, x):
        if isinstance(x, RemoteObject) and x._remote is self:
            return wire.handle_ref(x._handle)
        raise TypeError(f"cannot send a {type(x).__name__} to the notebook")

    def decode(self, x):
        try:
            return wire.decode(x, lambda h, type_name: RemoteObject(self, h, type_name))
        except wire.WireError as e:
            raise RemoteError(f"malformed answer: {e}") from None

    def get(self, name: str):
        out = self.request("get", name=name)
        return None if out.get("missing") else self.decode(out["value"])

    def call(self, handle: int, args: tuple, kwargs: dict):
        import torch
        held = wire.mutables(args, kwargs)
        ins = [t for t in wire.tensors([args, kwargs]) if t.requires_grad]
        out = self.request("call", h=handle, args=self.encode(list(args)), kwargs=self.encode(dict(kwargs)),
                           grad=bool(ins))
        value = self.decode(out["value"])
        # an in-place change the notebook made to an argument is made to the test's object too
        # (arguments cross as copies; without this, "the input is unchanged" could never fail)
        for i, new in out.get("changed", ()):
            _change_in_place(held[i] if i < len(held) else None, self.decode(new))
        if not ins or "gid" not in out:
            return value
        # gradients: the outputs are tied to the inputs by a function whose backward asks the notebook
        # for the vector-Jacobian product (the graph stays in the notebook; only tensors cross)
        outs = [t for t in wire.tensors(value) if t.is_floating_point() or t.is_complex()]
        if not outs:
            return value
        gid = out["gid"]

        def vjp(grads):
            got = self.decode(self.request("vjp", gid=gid, grads=self.encode(list(grads)))["value"])
            if not isinstance(got, list) or len(got) != len(ins):
                raise RemoteError("malformed gradient")
            for g, t in zip(got, ins):
                if g is not None and (not isinstance(g, torch.Tensor) or g.shape != t.shape):
                    raise RemoteError("gradient with the wrong shape")
            return [None if g is None else g.to(t.dtype) for g, t in zip(got, ins)]

        tied = _Bridge.apply(vjp, len(ins), *ins, *outs)
        swap = {id(o): t for o, t in zip(outs, tied)}
        return _replace_tensors(value, swap)


def _change_in_place(target, new) -> None:
    """Make the test's argument ``target`` what the notebook's copy became (``new``)."""
    import torch
    if isinstance(target, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if new.shape == target.shape:
                target.copy_(new)
            else:
                target.data = new.to(target.dtype)
    elif isinstance(target, list) and isinstance(new, list):
        target[:] = new
    elif isinstance(target, dict) and isinstance(new, dict):
        target.clear()
        target.update(new)
    else:
        raise RemoteError("malformed answer: 'changed' names no argument of that kind")


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
        return self._remote.decode(self._remote.request("getattr", h=self._handle, name=name)["value"])

    def __getitem__(self, key):
        out = self._remote.request("getitem", h=self._handle, key=self._remote.encode(key))
        return self._remote.decode(out["value"])

    def __iter__(self):
        return iter(self._remote.decode(self._remote.request("iter", h=self._handle)["value"]))

    def __len__(self):
        n = self._remote.request("len", h=self._handle)["value"]
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
