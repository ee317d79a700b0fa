"""A Jupyter kernel in the sandbox, driven one execution at a time, and the cell that installs
the kernel server (kernel_server.py) in it."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import subprocess
import time
from pathlib import Path

from .sandbox import (
    SandboxUnavailable, _SANDBOXES, _SANDBOXES_LOCK, _children, _hold_ns, _pid_ns, _python_paths,
    _release_ns, processes_in_ns, sandbox_argv,
)
from .wire import MAX_MESSAGE


@dataclasses.dataclass
class ExecResult:
    status: str            # ok | error | timeout (interrupted) | hung (interrupt failed) | dead
    stdout: str = ""
    ename: str = ""
    evalue: str = ""


class Kernel:
    """A Python kernel (this interpreter's venv) inside the sandbox, driven one execution at a time.

    ``box``: the kernel's own temporary folder (``box/work`` is its working directory, ``box/kernel``
    holds the connection file and sockets); nothing else is writable or even visible to it except
    the system and Python folders (read-only).
    """

    MAX_STDOUT = 64_000_000   # characters of stdout kept per execution (a printing loop cannot eat memory)
    MEMORY = 6 * 2**30        # address-space limit of the kernel process (bytes)

    def __init__(self, box: Path, startup_timeout: float = 120):
        from jupyter_client.manager import KernelManager

        self.box = box
        (box / "kernel").mkdir(parents=True, exist_ok=True)
        (box / "work").mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(box / "work"), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "MPLBACKEND": "Agg",
               "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "IPYTHONDIR": str(box / "work" / ".ipython"), "MPLCONFIGDIR": str(box / "work" / ".mpl"),
               "JUPYTER_RUNTIME_DIR": str(box / "kernel"), "TMPDIR": "/tmp"}
        self.km = KernelManager(kernel_name="python3", transport="ipc",
                                connection_file=str(box / "kernel" / "kernel.json"))
        self.km.ip = str(box / "kernel" / "ipc")
        exe, _ = _python_paths()
        spec = self.km.kernel_spec
        spec.argv = sandbox_argv(box, [exe, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                       "--HistoryManager.enabled=False"], env, self.MEMORY)
        spec.interrupt_mode = "message"   # a signal to bwrap would not reach the kernel
        spec.env = {}
        self.ns = None
        self.km.start_kernel(cwd=str(box / "work"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with contextlib.suppress(Exception):
            outer = self.km.provisioner.process.pid
            # bwrap may take a while to fork its child on a loaded machine: wait for it (up to
            # 30 s, as long as bwrap lives) rather than calling a slow start a failed sandbox
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.km.provisioner.process.poll() is None:
                ns = next((_hold_ns(k) for k in _children(outer)), None)
                # a sandbox has its own PID namespace; anything else is never recorded (kill()
                # SIGKILLs every process of a recorded namespace)
                if ns and ns != _pid_ns(os.getpid()):
                    self.ns = ns
                    break
                time.sleep(0.02)
        if not self.ns:
            with contextlib.suppress(Exception):
                self.km.shutdown_kernel(now=True)
            raise SandboxUnavailable("the kernel did not start in a PID namespace of its own (bwrap failed?)")
        with _SANDBOXES_LOCK:
            _SANDBOXES.add(self.ns)
        # the grader's own sockets refuse (drop) any message over MAX_MESSAGE (see wire.py)
        import zmq
        self.ctx = zmq.Context()
        self.ctx.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.kc = self.km.client(context=self.ctx)
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=startup_timeout)
        except Exception:
            self.kill()
            raise

    def execute(self, code: str, timeout: float, grace: float = 5.0) -> ExecResult:
        msg_id = self.kc.execute(code, store_history=False, allow_stdin=False, stop_on_error=False)
        deadline = time.monotonic() + timeout
        interrupted = False
        res = ExecResult("ok")
        out: list[str] = []
        size = 0
        last_alive_check = 0.0
        while True:
            now = time.monotonic()
            if now > deadline:
                if interrupted:
                    res.status = "hung"
                    break
                with contextlib.suppress(Exception):
                    self.km.interrupt_kernel()
                interrupted, deadline = True, now + grace
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                if now - last_alive_check > 0.25:
                    last_alive_check = now
                    if not self.km.is_alive():
                        res.status = "dead"
                        break
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream" and c.get("name") == "stdout":
                out.append(str(c.get("text", ""))[-self.MAX_STDOUT:])
                size += len(out[-1])
                while size > self.MAX_STDOUT and len(out) > 1:   # keep the tail only
                    size -= len(out.pop(0))
            elif t == "error":
                res.status, res.ename, res.evalue = "error", str(c.get("ename", "")), str(c.get("evalue", ""))
            elif t == "status" and c.get("execution_state") == "idle":
                break
        if interrupted and res.status in ("ok", "error"):
            res.status = "timeout"
        res.stdout = "".join(out)
        return res

    def kill(self):
        """Kill the sandbox (the whole process tree dies with its PID namespace) and wait for it."""
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        with contextlib.suppress(Exception):
            self.ctx.destroy(linger=0)
        with contextlib.suppress(Exception):
            self.km.shutdown_kernel(now=True)
        if self.ns:
            deadline = time.monotonic() + 10
            while processes_in_ns(self.ns) and time.monotonic() < deadline:
                for p in processes_in_ns(self.ns):
                    with contextlib.suppress(OSError):
                        os.kill(p, 9)
                time.sleep(0.05)
            if not processes_in_ns(self.ns):
                _release_ns(self.ns)   # empty: nothing of it is left to reap


def _setup_cell(runner: str) -> str:
    """The kernel code that installs the RPC server under a random name (in a private namespace):
    wire.py's text becomes a module there, and kernel_server.py's ``_setup`` gets it."""
    here = Path(__file__).parent
    wire_src, server_src = ((here / f).read_text(encoding="utf-8") for f in ("wire.py", "kernel_server.py"))
    boot = ("import types\n"
            "wire = types.ModuleType('grader_wire')\n"
            f"exec(compile({wire_src!r}, '<grader wire>', 'exec'), wire.__dict__)\n"
            f"exec(compile({server_src!r}, '<grader kernel_server>', 'exec'))\n"
            f"_setup({runner!r}, NS, wire)\n")
    return (f"exec(compile({boot!r}, '<grader>', 'exec'), "
            "{'__builtins__': __import__('builtins'), 'NS': globals()})")


_OTTER_LINES = [
    re.compile(r"^(\s*)import\s+otter\s*$"),
    re.compile(r"^(\s*)grader\s*=\s*otter\.Notebook\(.*\)\s*$"),
    re.compile(r"^(\s*)grader\.(check|check_all|export|to_pdf)\(.*\)\s*$"),
]


def _sanitize(src: str) -> str:
    lines = []
    for line in src.splitlines():
        for rx in _OTTER_LINES:
            m = rx.match(line)
            if m:
                line = m.group(1) + "pass  # otter call removed by the grader"
                break
        lines.append(line)
    return "\n".join(lines)
