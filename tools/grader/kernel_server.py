"""Runs in the sandboxed kernel before the submission's code: a small RPC server. It answers requests from
the grader (fetch a name, call a function, read an attribute, back-propagate) with DATA only:
numbers, strings, tensors as raw bytes, containers of those, or handles for other objects, in the
wire format of wire.py. The submission may replace or break it at will: all it can change is its own
answers. The test code, the expected values and the verdicts never enter this process.

The grader sends this file's text and wire.py's to the kernel (kernel._setup_cell), makes a module of
wire.py there and calls ``_setup`` with it; so this file needs nothing but the standard library and
that module (and torch / numpy when the notebook has imported them)."""


def _setup(runner_name, ns, wire, max_answer=None):
    """Install the runner under ``runner_name`` in the notebook's namespace ``ns``: called with a nonce
    and a request's text, it prints the framed reply. ``wire``: the wire-format module;
    ``max_answer``: the size cap of one reply (wire.MAX_ANSWER by default)."""
    import sys
    limit = wire.MAX_ANSWER if max_answer is None else max_answer
    handles = {}

    def keep(obj):
        handles[len(handles) + 1] = obj
        return len(handles)

    def ref(obj):
        return wire.handle_ref(keep(obj), type(obj).__name__)

    def resolve(h, _type_name):
        if h not in handles:
            raise wire.WireError(f"no object with handle {h}")
        return handles[h]

    def answer(req):
        op, budget = req["op"], wire.Budget(limit)

        def enc(x):
            return wire.encode(x, ref, budget)

        if op == "get":
            return {"missing": True} if req["name"] not in ns else {"value": enc(ns[req["name"]])}
        if op == "vjp":
            return {"value": enc(vjp(*resolve(req["gid"], "grad"), wire.decode(req["grads"], resolve)))}
        obj = resolve(req["h"], "object")
        if op == "call":
            args, kwargs = wire.decode(req["args"], resolve), wire.decode(req["kwargs"], resolve)
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise wire.WireError("a call needs a list of arguments and a dict of keyword arguments")
            held = wire.mutables(args, kwargs)
            before = [snapshot(x) for x in held]
            res = obj(*args, **kwargs)
            out = {"value": enc(res)}
            # arguments the call changed in place go back, so that the test sees the change
            changed = [[i, enc(x)] for i, (x, b) in enumerate(zip(held, before)) if differs(x, b)]
            if changed:
                out["changed"] = changed
            if req["grad"]:
                ins = [t for t in wire.tensors([args, kwargs]) if t.requires_grad]
                outs = [t for t in wire.tensors(res) if t.is_floating_point() or t.is_complex()]
                out["gid"] = keep((ins, outs))
            return out
        if op == "getattr":
            return {"value": enc(getattr(obj, req["name"]))}
        if op == "getitem":
            return {"value": enc(obj[wire.decode(req["key"], resolve)])}
        if op == "iter":
            return {"value": enc(list(obj))}
        if op == "len":
            return {"value": len(obj)}
        raise wire.WireError(f"request kind {op!r} has no answer here")

    def snapshot(x):
        return list(x) if isinstance(x, list) else dict(x) if isinstance(x, dict) else x.detach().clone()

    def differs(x, before):
        if isinstance(x, list):
            return len(x) != len(before) or any(a is not b for a, b in zip(x, before))
        if isinstance(x, dict):
            return list(x) != list(before) or any(x[k] is not before[k] for k in x)
        return x.shape != before.shape or x.dtype != before.dtype or not bool((x.detach() == before).all())

    def vjp(ins, outs, grads):
        import torch
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
        if not pairs or not ins:
            return [None] * len(ins)
        return list(torch.autograd.grad([o for o, _ in pairs], ins, [g for _, g in pairs], allow_unused=True))

    def run(nonce, payload):
        try:
            out = wire.dump_reply(answer(wire.parse_request(payload)), limit)
        except Exception as e:
            out = wire.dump_reply(wire.error_reply(e), limit)
        sys.stdout.write(wire.frame(nonce, out))
        sys.stdout.flush()

    ns[runner_name] = run
