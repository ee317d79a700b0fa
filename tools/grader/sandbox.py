"""The bubblewrap sandbox a kernel runs in, and the PID namespaces the grader reaps."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path


class SandboxUnavailable(RuntimeError):
    pass


def _python_paths() -> tuple[str, list[str]]:
    """(interpreter path to run in the sandbox, read-only folders it needs: base Python + venv)."""
    venv = Path(sys.prefix).resolve()
    exe = venv / "bin" / "python"
    if not exe.exists():
        exe = Path(sys.executable).resolve()
    dirs = {str(Path(sys.base_prefix).resolve()), str(venv)}
    return str(exe), sorted(dirs)


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


def sandbox_argv(box: Path, command: list[str], env: dict[str, str], memory_bytes: int | None = None,
                 python_dirs: list[str] | None = None) -> list[str]:
    """bubblewrap command line running ``command`` with no network, its own PID/IPC/UTS namespaces,
    a read-only view of the system and Python folders only, a private /tmp, and ``box`` (its own
    temporary folder) as the one writable place. The process tree dies with the grader.

    ``python_dirs`` (default: this interpreter's base Python and venv) may lie anywhere, /tmp
    included: bubblewrap applies mounts in order, so the private /tmp, /dev and /proc come first
    and the Python folders and the box are mounted on top of them (parents before children)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed; the grader runs every notebook in it "
                                 "(Debian: apt-get install bubblewrap)")
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for p in _SYSTEM_DIRS:
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.exists(p):
            argv += ["--ro-bind", p, p]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    dirs = _python_paths()[1] if python_dirs is None else [str(Path(d).resolve()) for d in python_dirs]
    for d in sorted(set(dirs), key=lambda d: (len(Path(d).parts), d)):
        if d == "/" or d in ("/dev", "/proc") or d.startswith(("/dev/", "/proc/")):
            raise SandboxUnavailable(f"cannot sandbox a Python installed in {d!r}")
        argv += ["--ro-bind", d, d]
    argv += ["--bind", str(box), str(box),
             # the sandbox's root is a tmpfs holding the mount points; read-only, so that a folder
             # made for one (e.g. the checkout when the venv lives in it) cannot be written either
             "--remount-ro", "/",
             "--chdir", str(box / "work")]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    argv += ["--"]
    if memory_bytes and shutil.which("prlimit"):
        argv += [shutil.which("prlimit"), f"--as={memory_bytes}", "--"]
    return argv + command


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(d))
    return out


def processes_in_ns(ns: str) -> list[int]:
    """Host PIDs of the live processes in the PID namespace ``ns`` (as read from /proc/PID/ns/pid).
    Never the grader's own namespace: these processes get killed."""
    if not ns or ns == _pid_ns(os.getpid()):
        raise RuntimeError(f"refusing to treat the grader's own PID namespace {ns!r} as a sandbox")
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and _pid_ns(int(d)) == ns]


# every sandbox PID namespace this process created; grade_dir waits for all of them to be empty.
# Each is held open (a file descriptor on /proc/PID/ns/pid) until it has been reaped: a namespace
# that is still referenced keeps its inode, so a sandbox started later (grading runs in parallel)
# can never get the same identity and be killed by the cleanup of an earlier one.
_SANDBOXES: set[str] = set()


_NS_FDS: dict[str, int] = {}


_SANDBOXES_LOCK = __import__("threading").Lock()


def _hold_ns(pid: int) -> str | None:
    """Open the PID namespace of ``pid`` and keep it open; its identity (``pid:[inode]``)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return None
    ns = os.readlink(f"/proc/self/fd/{fd}")
    with _SANDBOXES_LOCK:
        if ns == _pid_ns(os.getpid()) or ns in _NS_FDS:
            os.close(fd)
        else:
            _NS_FDS[ns] = fd
    return ns


def _release_ns(ns: str) -> None:
    """Forget an empty sandbox namespace and let it go (after which its identity may be reused)."""
    with _SANDBOXES_LOCK:
        _SANDBOXES.discard(ns)
        with contextlib.suppress(KeyError, OSError):
            os.close(_NS_FDS.pop(ns))


def reap_sandboxes(wait: float = 10.0) -> list[int]:
    """Wait until no process is left in any sandbox we started (SIGKILL stragglers); return survivors."""
    deadline = time.monotonic() + wait
    with _SANDBOXES_LOCK:
        spaces = set(_SANDBOXES)
    while True:
        alive = [p for ns in spaces for p in processes_in_ns(ns)]
        if not alive:
            for ns in spaces:
                _release_ns(ns)
            return []
        if time.monotonic() > deadline:
            return alive
        for p in alive:
            with contextlib.suppress(OSError):
                os.kill(p, 9)
        time.sleep(0.1)
