"""Runs in the sandboxed kernel before the submission's code: a small RPC server. It answers requests from
the grader (fetch a name, call a function, read an attribute, back-propagate) with DATA only:
numbers, strings, tensors as raw bytes, containers of those, or handles for other objects.
The submission may replace or break it at will: all it can change is its own answers. The test
code, the expected values and the verdicts never enter this process.

The grader sends this file's text to the kernel and calls ``_setup``; it must need nothing
but the standard library (and torch / numpy when the notebook has imported them)."""


def _setup(runner_name, ns, max_answer):
    import base64, json, sys
    handles = {}

    class AnswerTooLarge(ValueError):
        pass

    def check_size(nbytes, budget):
        budget[0] += int(nbytes)
        if budget[0] > max_answer:
            raise AnswerTooLarge(f"the answer is larger than the grader's limit of {max_answer // 2**20} MB")

    def keep(obj):
        handles[len(handles) + 1] = obj
        return len(handles)

    def tensor_bytes(t):
        import torch
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return str(t.dtype).replace("torch.", ""), list(t.shape), base64.b64encode(t.numpy().tobytes()).decode()

    def enc(x, depth=0, budget=None):
        budget = [0] if budget is None else budget
        if depth > 50:
            raise ValueError("value nested too deeply")
        if x is None or isinstance(x, bool):
            return x if x is None else bool(x)
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return float(x)
        if isinstance(x, str):
            check_size(len(x), budget)
            return str.__str__(x)
        torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None and isinstance(x, torch.Tensor):
            check_size(x.numel() * x.element_size(), budget)
            return {"__t__": tensor_bytes(x)}
        if torch is not None and isinstance(x, torch.dtype):
            return {"__dtype__": str(x).replace("torch.", "")}
        if np is not None and isinstance(x, np.generic) and x.dtype.kind in "biuf":
            return enc(x.item())
        if np is not None and isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
            check_size(x.nbytes, budget)
            a = np.ascontiguousarray(x)
            return {"__a__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode()]}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, depth + 1, budget) for v in x]}
        if isinstance(x, list):
            return [enc(v, depth + 1, budget) for v in x]
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"__dict__": [[str(k), enc(v, depth + 1, budget)] for k, v in x.items()]}
        return {"__h__": keep(x), "type": type(x).__name__}

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "__t__" in x:
                import torch
                dtype, shape, data, grad = x["__t__"]
                raw = bytearray(base64.b64decode(data))
                dt = getattr(torch, dtype)
                t = (torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)).reshape(shape).clone()
                return t.requires_grad_(True) if grad else t
            if "__a__" in x:
                import numpy as np
                dtype, shape, data = x["__a__"]
                return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype)).reshape(shape).copy()
            if "__dtype__" in x:
                import torch
                return getattr(torch, x["__dtype__"])
            if "__tuple__" in x:
                return tuple(dec(v) for v in x["__tuple__"])
            if "__dict__" in x:
                return {k: dec(v) for k, v in x["__dict__"]}
            if "__h__" in x:
                return handles[x["__h__"]]
        return x

    def tensors(x, out):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for v in x:
                tensors(v, out)
        elif isinstance(x, dict):
            for v in x.values():
                tensors(v, out)
        return out

    def answer(req):
        op = req["op"]
        if op == "get":
            return {"missing": True} if req["name"] not in ns else {"value": enc(ns[req["name"]])}
        obj = handles[req["h"]] if "h" in req else None
        if op == "call":
            args, kwargs = dec(req["args"]), dec(req["kwargs"])
            sent = tensors([args, kwargs], [])
            before = [t.detach().clone() for t in sent]
            res = obj(*args, **kwargs)
            out = {"value": enc(res)}
            # tensor arguments the call changed in place go back, so that the test sees the change
            changed = [[i, enc(t)] for i, (t, b) in enumerate(zip(sent, before))
                       if t.shape != b.shape or t.dtype != b.dtype or not bool((t.detach() == b).all())]
            if changed:
                out["changed"] = changed
            if req.get("grad"):
                ins = [t for t in tensors([args, kwargs], []) if t.requires_grad]
                outs = [t for t in tensors(res, []) if t.is_floating_point() or t.is_complex()]
                out["gid"] = keep((ins, outs))
            return out
        if op == "getattr":
            return {"value": enc(getattr(obj, req["name"]))}
        if op == "getitem":
            return {"value": enc(obj[dec(req["key"])])}
        if op == "iter":
            return {"value": enc(list(obj))}
        if op == "len":
            return {"value": len(obj)}
        if op == "vjp":
            import torch
            ins, outs = handles[req["gid"]]
            grads = dec(req["grads"])
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            if not pairs or not ins:
                return {"value": [None] * len(ins)}
            res = torch.autograd.grad([o for o, _ in pairs], ins, [g for _, g in pairs], allow_unused=True)
            return {"value": enc(list(res))}
        raise ValueError("unknown request")

    def run(nonce, payload):
        try:
            out = json.dumps(answer(json.loads(payload)))
            if len(out) > 2 * max_answer:   # containers of many small items
                check_size(len(out), [max_answer])
        except Exception as e:
            out = json.dumps({"exc": [type(e).__name__, str(e)[:500]]})
        sys.stdout.write("\n" + nonce + out + "\n")
        sys.stdout.flush()

    ns[runner_name] = run
