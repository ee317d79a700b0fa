#!/usr/bin/env python
"""Build, prove and grade the course's otter-grader exercises (see exercises/README.md).

    python tools/exercises.py build [--out exercises/_dist] [--only CHAPTER/NAME]
    python tools/exercises.py prove [--no-build] [--only CHAPTER/NAME] [--timeout S] [--jobs N]
    python tools/exercises.py grade SUBMISSIONS_DIR --autograder ZIP [--timeout S] [--out grades.csv]

No Docker, no PDFs, no network. Grading drives a Jupyter kernel cell by cell (per-cell time limit,
interrupt then kill, replay without a cell that killed the kernel). The kernel runs in a bubblewrap
sandbox (no network, read-only system + Python only, its own temporary folder, its own PID
namespace killed when its grading ends). Each question's otter test file (``otter.test_files``)
runs in the grader, with the notebook's names fetched as data or proxies, so tests, expected values
and verdicts never enter the student's process; one broken question costs only its own points.
"""
from __future__ import annotations

import argparse
import ast
import base64
import concurrent.futures as cf
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import os
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "exercises"
DIST = EXERCISES / "_dist"

# ============================================================================ discovery


@dataclasses.dataclass
class Master:
    chapter: str          # folder name, e.g. 03_transformer
    name: str             # file stem, e.g. sdpa_padding
    path: Path

    @property
    def key(self) -> str:
        return f"{self.chapter}/{self.name}"

    @property
    def wrong_path(self) -> Path:
        return self.path.with_name(self.name + ".wrong.yaml")

    def out_dir(self, dist: Path) -> Path:
        return dist / self.chapter / self.name

    def student_nb(self, dist: Path) -> Path:
        return self.out_dir(dist) / "student" / f"{self.name}.ipynb"

    def solution_nb(self, dist: Path) -> Path:
        return self.out_dir(dist) / "autograder" / f"{self.name}.ipynb"

    def zip_path(self, dist: Path) -> Path:
        return self.out_dir(dist) / "autograder" / f"{self.name}-autograder.zip"


def discover(root: Path = EXERCISES, only: list[str] | None = None) -> list[Master]:
    masters = []
    for chapter in sorted(p for p in root.iterdir() if p.is_dir()):
        if chapter.name.startswith(("_", ".")):
            continue
        for nb in sorted(chapter.glob("*.ipynb")):
            if nb.name.startswith(("_", ".")) or "." in nb.stem:
                continue
            masters.append(Master(chapter.name, nb.stem, nb))
    if only:
        wanted = set(only)
        unknown = wanted - {m.key for m in masters}
        if unknown:
            raise SystemExit(f"unknown exercise(s): {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(m.key for m in masters) or 'none'}")
        masters = [m for m in masters if m.key in wanted]
    return masters


# ============================================================================ build


def build(dist: Path = DIST, only: list[str] | None = None, quiet: bool = True,
          root: Path = EXERCISES) -> list[Master]:
    """otter assign every master into dist/<chapter>/<name>/{student,autograder}; prune stale sets."""
    from otter.assign import main as assign_main

    masters = discover(root, only=only)
    marker = dist / ".exercises-dist"
    if dist.exists() and any(dist.iterdir()) and not marker.exists():
        raise SystemExit(f"{dist} is not empty and was not made by this tool; refusing to write or prune it")
    dist.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by tools/exercises.py build; stale sets here are deleted\n")
    (dist / ".gitignore").write_text("*\n")
    for m in masters:
        final = m.out_dir(dist)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{m.name}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                assign_main(str(m.path), str(tmp), no_pdfs=True, no_run_tests=True)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"otter assign failed for {m.key}: {type(e).__name__}: {e}\n{out.getvalue()}")
        zips = sorted((tmp / "autograder").glob(f"{m.name}-autograder_*.zip"))
        if len(zips) != 1:
            raise SystemExit(f"{m.key}: expected one autograder zip, found {[z.name for z in zips]}")
        zips[0].rename(tmp / "autograder" / f"{m.name}-autograder.zip")
        for nb_file in (tmp / "student" / f"{m.name}.ipynb", tmp / "autograder" / f"{m.name}.ipynb"):
            stable_cell_ids(nb_file, m.path, m.key)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if not quiet:
            print(f"built {m.key} -> {final.relative_to(ROOT) if final.is_relative_to(ROOT) else final}")
    if not only:  # prune outputs whose master is gone
        keep = {(m.chapter, m.name) for m in masters}
        for chapter in dist.iterdir():
            if not chapter.is_dir():
                continue
            for d in chapter.iterdir():
                if (chapter.name, d.name) not in keep:
                    shutil.rmtree(d) if d.is_dir() else d.unlink()
            if not any(chapter.iterdir()):
                chapter.rmdir()
    return masters


def stable_cell_ids(nb_file: Path, master: Path, salt: str) -> None:
    """Give the cells otter assign adds (random ids) ids derived from their place and text.

    Cells copied from the master keep the master's ids (the grader finds solution cells by
    them); only ids that change from build to build are replaced, so that building twice
    publishes byte-identical notebooks.
    """
    nb = nbformat.read(str(nb_file), as_version=4)
    master_ids = {c.get("id") for c in nbformat.read(str(master), as_version=4).cells}
    taken = {c.get("id") for c in nb.cells if c.get("id") in master_ids}
    for i, cell in enumerate(nb.cells):
        if cell.get("id") in master_ids:
            continue
        digest = hashlib.sha256(f"{salt}|{i}|{cell.cell_type}|{cell.source}".encode()).hexdigest()
        new_id = next(digest[k:k + 8] for k in range(0, 57) if digest[k:k + 8] not in taken)
        cell["id"] = new_id
        taken.add(new_id)
    nbformat.write(nb, str(nb_file))


# ============================================================================ master parsing

_MARK_BEGIN = re.compile(r"^\s*#\s*BEGIN\s+SOLUTION\b", re.I)
_MARK_END = re.compile(r"^\s*#\s*END\s+SOLUTION\b", re.I)
_MARK_LINE = re.compile(r"^(.*?)\s*#\s*SOLUTION(\s+NO\s+PROMPT)?\s*$")
_PROMPT_BEGIN = re.compile(r"^\s*#\s*BEGIN\s+PROMPT\b", re.I)
_PROMPT_END = re.compile(r"^\s*#\s*END\s+PROMPT\b", re.I)
_TEST_CFG_BEGIN = re.compile(r'(?:.\s*=\s*)?""?"?\s*#\s*BEGIN\s*TEST\s*CONFIG', re.I)
_TEST_CFG_END = re.compile(r'""?"?\s*#\s*END\s*TEST\s*CONFIG', re.I)


def _raw_kind(cell) -> str | None:
    if cell.cell_type != "raw":
        return None
    first = (cell.source.strip().splitlines() or [""])[0]
    m = re.match(r"#\s*(begin|end)\s+(question|solution|tests|prompt)\b", first, re.I)
    if m:
        return f"{m.group(1).lower()} {m.group(2).lower()}"
    if re.match(r"#\s*assignment\s+config", first, re.I):
        return "config"
    return None


@dataclasses.dataclass
class MasterInfo:
    config: dict
    questions: list[str]
    solution_cells: dict[str, list[str]]     # question -> ids of the code cells of its SOLUTION block
    hidden_tests: dict[str, int]             # question -> number of hidden test cells
    secrets: list[tuple[str, str]]           # (kind, line) that must not appear in the student notebook
    problems: list[str]
    choices: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)   # MC q -> (name, right letter)
    options: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)    # MC q -> letter -> option text
    functions: dict[str, list[str]] = dataclasses.field(default_factory=dict)       # q -> functions its solution defines


_CHOICE = re.compile(r"""^\s*(\w+)\s*=\s*["']([a-z])["']\s*#\s*SOLUTION\s*$""", re.M)
_OPTION = re.compile(r"^\s*(?:[*-]\s+)?\(([a-h])\)\s+(.*)$")


def _options(markdown: str) -> dict[str, str]:
    """The options ``(a) ...``, ``* (b) ...`` of a multiple-choice prompt (an option runs on until the
    next option or a blank line), letter -> text without markup breaks."""
    out: dict[str, str] = {}
    letter = None
    for line in markdown.splitlines():
        m = _OPTION.match(line)
        if m:
            letter = m.group(1)
            out[letter] = m.group(2)
        elif letter and line.strip():
            out[letter] += " " + line.strip()
        else:
            letter = None
    return {k: " ".join(v.replace("<br>", " ").split()) for k, v in out.items()}


def _functions(source: str) -> list[str]:
    """Names of the top-level functions a solution cell defines (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def _solution_lines(source: str) -> tuple[list[str], list[str]]:
    """Split a code cell into (secret solution lines, public lines) following otter's markers."""
    secret, public = [], []
    in_sol = in_prompt = False
    for line in source.splitlines():
        if _MARK_END.match(line):
            in_sol = False
            continue
        if _MARK_BEGIN.match(line):
            in_sol = True
            continue
        if _PROMPT_BEGIN.match(line) or _PROMPT_END.match(line):
            in_prompt = _PROMPT_BEGIN.match(line) is not None
            continue
        if in_sol:
            secret.append(line)
            continue
        m = _MARK_LINE.match(line)
        if m and not in_prompt:
            secret.append(m.group(1))
        else:
            public.append(line)
    return secret, public


def parse_master(path: Path) -> MasterInfo:
    nb = nbformat.read(str(path), as_version=4)
    config: dict = {}
    questions: list[str] = []
    sol_cells: dict[str, list[str]] = {}
    hidden: dict[str, int] = {}
    secret_lines: list[tuple[str, str]] = []
    public_text: list[str] = []
    problems: list[str] = []
    choices: dict[str, tuple[str, str]] = {}
    options: dict[str, dict[str, str]] = {}
    functions: dict[str, list[str]] = {}
    question = None
    in_solution = in_tests = False
    for i, cell in enumerate(nb.cells):
        kind = _raw_kind(cell)
        if kind == "config":
            config = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            continue
        if kind == "begin question":
            q = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            question = str(q.get("name"))
            questions.append(question)
            sol_cells.setdefault(question, [])
            hidden.setdefault(question, 0)
            continue
        if kind == "end question":
            question = None
            continue
        if kind in ("begin solution", "end solution"):
            in_solution = kind == "begin solution"
            continue
        if kind in ("begin tests", "end tests"):
            in_tests = kind == "begin tests"
            continue
        if cell.cell_type == "raw":
            continue
        if cell.cell_type == "markdown":
            public_text.append(cell.source)
            if question is not None and _options(cell.source):
                options[question] = _options(cell.source)
            continue
        # code cell
        if in_tests:
            lines = cell.source.splitlines()
            is_hidden, start = False, 0
            if lines and _TEST_CFG_BEGIN.match(lines[0]):
                for j, line in enumerate(lines):
                    if _TEST_CFG_END.match(line):
                        break
                cfg = yaml.safe_load("\n".join(lines[1:j])) or {}
                is_hidden, start = bool(cfg.get("hidden", False)), j + 1
            elif lines and lines[0].lstrip().startswith("#") and re.search(r"\bhidden\b", lines[0], re.I):
                is_hidden, start = True, 1
            if is_hidden and question is not None:
                hidden[question] += 1
                secret_lines += [("hidden test", line) for line in lines[start:]]
            else:
                public_text.append(cell.source)
            continue
        if in_solution and question is not None:
            if not cell.get("id"):
                problems.append(f"cell {i + 1} has no id (save the master with nbformat >= 4.5)")
            sol_cells[question].append(cell.get("id"))
            m = _CHOICE.search(cell.source)
            if m:
                choices[question] = (m.group(1), m.group(2))
            functions.setdefault(question, []).extend(_functions(cell.source))
        secret, public = _solution_lines(cell.source)
        secret_lines += [("solution", line) for line in secret]
        public_text.append("\n".join(public))
    public_blob = "\n".join(public_text)
    secrets_out, seen = [], set()
    for kind, line in secret_lines:
        s = line.strip()
        if len(s) < 8 or not re.search(r"\w", s) or s in seen or s in public_blob:
            continue
        seen.add(s)
        secrets_out.append((kind, s))
    for q in choices:
        if q not in options:
            problems.append(f"multiple-choice question {q}: no options (a), (b), ... found in its prompt")
        elif choices[q][1] not in options[q]:
            problems.append(f"multiple-choice question {q}: its answer {choices[q][1]!r} is not an option")
    options = {q: o for q, o in options.items() if q in choices}
    return MasterInfo(config, questions, sol_cells, hidden, secrets_out, problems, choices, options, functions)


def _all_strings(obj) -> list[str]:
    out = []
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, list):
        for x in obj:
            out += _all_strings(x)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.append(str(k))
            out += _all_strings(v)
    return out


def find_leaks(student_nb: Path, info: MasterInfo) -> list[str]:
    raw = student_nb.read_text(encoding="utf-8")
    decoded = "\n".join(_all_strings(json.loads(raw)))
    leaks = []
    for kind, s in info.secrets:
        if s in decoded or s in raw or json.dumps(s)[1:-1] in raw:
            leaks.append(f"{kind} line leaked into the student notebook: {s!r}")
    return leaks


# ============================================================================ tests from the zip


def load_tests(zip_path: Path) -> dict[str, str]:
    """question name -> test file source (hidden tests included), in natural question order."""
    from otter.test_files import ExceptionTestFile

    tests = {}
    with zipfile.ZipFile(zip_path) as z:
        for n in z.namelist():
            m = re.fullmatch(r"tests/([^/]+)\.py", n)
            if m and not m.group(1).startswith("__"):
                tests[m.group(1)] = z.read(n).decode("utf-8")
    if not tests:
        raise SystemExit(f"{zip_path}: no tests/*.py in the autograder zip")
    for q, src in tests.items():
        if re.search(r"^OK_FORMAT\s*=\s*True", src, re.M):
            raise SystemExit(f"{zip_path}: test {q} is OK-format; the grader needs exception-based "
                             "tests (tests: ok_format: false in the assignment config)")
        ExceptionTestFile.from_string(src, path=f"tests/{q}.py")  # fail early on a broken file

    def natural(s):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
    return {q: tests[q] for q in sorted(tests, key=natural)}


def test_file(q: str, src: str):
    from otter.test_files import ExceptionTestFile
    return ExceptionTestFile.from_string(src, path=f"tests/{q}.py")


# ============================================================================ the sandbox


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


# ============================================================================ the kernel


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
        # the grader's own sockets refuse (drop) any message over MAX_MESSAGE: see MAX_ANSWER
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


# Runs in the kernel before the submission's code: a small RPC server. It answers requests from
# the grader (fetch a name, call a function, read an attribute, back-propagate) with DATA only:
# numbers, strings, tensors as raw bytes, containers of those, or handles for other objects.
# The submission may replace or break it at will: all it can change is its own answers. The test
# code, the expected values and the verdicts never enter this process.
_SETUP = r'''
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

_setup(RUNNER_NAME, NS, MAX_ANSWER)
'''

# What may cross the boundary: one answer of the notebook holds at most MAX_ANSWER bytes of data
# (tensors, arrays, strings; the kernel refuses larger ones and the grader notes it), and the
# grader's sockets drop any message over MAX_MESSAGE (a submission that bypasses the kernel-side
# check only loses its own answer), so that no submission can push the grader's memory up.
MAX_ANSWER = 16 * 2**20
MAX_MESSAGE = 4 * MAX_ANSWER


def _setup_cell(runner: str) -> str:
    """The kernel code that installs the RPC server under a random name (in a private namespace)."""
    src = _SETUP.replace("RUNNER_NAME", repr(runner)).replace("MAX_ANSWER", repr(MAX_ANSWER))
    return (f"exec(compile({src!r}, '<grader>', 'exec'), "
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


# ============================================================================ the grader side of the boundary


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


# ============================================================================ grading


@dataclasses.dataclass
class Grade:
    file: str
    scores: dict[str, float]
    possible: dict[str, float]
    notes: list[str]
    results: dict[str, list] = dataclasses.field(default_factory=dict)   # q -> [(test name, hidden, passed)]

    @property
    def total(self) -> float:
        return sum(self.scores.values())

    @property
    def total_possible(self) -> float:
        return sum(self.possible.values())

    @property
    def percent(self) -> float:
        return 100.0 * self.total / self.total_possible if self.total_possible else 0.0


def _short(s: str, n: int = 160) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def points_list(src: str) -> list | None:
    """The per-test points of a test file when its master gives a list (``points: [0, 2, 2, 1]``,
    one number per test, public tests first), else None (one number, shared by the hidden tests)."""
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "points" for t in node.targets):
            with contextlib.suppress(ValueError, SyntaxError):
                value = ast.literal_eval(node.value)
                return list(value) if isinstance(value, list) else None
    return None


def question_score(tf, src: str) -> float:
    """Points of one question (``tf``: its test file, run; ``src``: that file's source), all of them
    on the hidden tests; public tests are feedback and carry none. If the master gives a list of
    per-test points, each passed hidden test earns its own; otherwise the question's points are
    shared equally among its hidden tests.
    (Without hidden tests, all tests count: prove forbids that.)"""
    results = tf.test_case_results
    counted = [r for r in results if r.test_case.hidden] or results
    if not counted:
        return 0.0
    if points_list(src) is not None:
        return float(sum(r.test_case.points or 0 for r in counted if r.passed))
    return float(tf.possible) * sum(1 for r in counted if r.passed) / len(counted)


# Test files run one at a time: they share this process's global state (torch's default dtype,
# transformers' patched initialisers, otter's output capture), and two test files of a BERT set
# run at once in two threads made a correct solution fail (prove --jobs 2).
_TESTS_LOCK = __import__("threading").Lock()


def grade_notebook(nb_path: Path, tests: dict[str, str], timeout: float = 60.0,
                   label: str | None = None, pool: dict | None = None) -> Grade:
    """Grade one notebook; every question's score is isolated from the others' failures.

    The notebook runs in a sandboxed kernel; each question's test file runs HERE, in the grader,
    with the notebook's names as RemoteObjects / data (see StudentNamespace), so the tests, the
    expected values and the verdicts never enter the submission's process.

    ``pool``: a dict holding a kernel to reuse (``pool["kernel"]``) and to hand back afterwards.
    Only for trusted notebooks (``prove``): a reused kernel keeps imported modules.
    """
    possible = {q: float(test_file(q, src).possible) for q, src in tests.items()}
    grade = Grade(label or nb_path.name, {q: 0.0 for q in tests}, possible, [])
    notes = grade.notes

    def note(s):
        if s not in notes:
            notes.append(s)

    try:
        nb = nbformat.read(str(nb_path), as_version=4)
        cells = [_sanitize(c.source) for c in nb.cells if c.cell_type == "code"]
    except Exception as e:
        note(f"unreadable notebook: {type(e).__name__}: {_short(e)}")
        return grade

    if pool is None:
        box_ctx = tempfile.TemporaryDirectory(prefix="grade-")
    else:   # trusted notebooks: the pooled kernel keeps its box
        box_ctx = contextlib.nullcontext(str(pool.setdefault("box", tempfile.mkdtemp(prefix="grade-pool-"))))
    with box_ctx as work:
        box = Path(work)
        (box / "work").mkdir(exist_ok=True)
        shutil.copy(nb_path, box / "work" / "submission.ipynb")
        runner = "_grader_" + secrets.token_hex(8)
        skip: set[int] = set()
        setup_timeout = max(120.0, timeout)

        def boot() -> Kernel:
            for _ in range(len(cells) + 2):
                k = None
                if pool is not None and pool.get("kernel") is not None:
                    k = pool.pop("kernel")
                    if k.box != box or k.execute("get_ipython().reset(new_session=False)", 60).status != "ok":
                        k.kill()
                        k = None
                if k is None:
                    k = Kernel(box)
                r = k.execute(_setup_cell(runner), setup_timeout)
                if r.status != "ok":
                    k.kill()
                    raise RuntimeError(f"grader setup failed in the kernel: {r.status} {r.ename}: {r.evalue}")
                restart = False
                for i, src in enumerate(cells):
                    if i in skip or not src.strip():
                        continue
                    r = k.execute(src, timeout)
                    where = f"cell {i + 1}"
                    if r.status == "error":
                        note(f"{where}: {r.ename}: {_short(r.evalue)}")
                    elif r.status == "timeout":
                        note(f"{where}: timed out after {timeout:g} s (interrupted)")
                        skip.add(i)
                    elif r.status in ("hung", "dead"):
                        note(f"{where}: " + ("killed the kernel" if r.status == "dead" else
                                             f"timed out after {timeout:g} s and ignored the interrupt")
                             + "; re-ran the notebook without it")
                        skip.add(i)
                        k.kill()
                        restart = True
                        break
                if not restart:
                    return k
            raise RuntimeError("could not execute the notebook")

        kernel = None
        try:
            for q, src in tests.items():
                if kernel is None:
                    kernel = boot()
                tf = test_file(q, src)     # a fresh parse: the test code runs here, in the grader
                remote = Remote(kernel, runner, timeout, time.monotonic() + timeout)
                try:
                    with _TESTS_LOCK:   # see _TESTS_LOCK
                        tf.run(StudentNamespace(remote, cells))
                except QuestionAborted:
                    pass
                if remote.too_large:
                    note(f"{q}: an answer was larger than the limit of {MAX_ANSWER // 2**20} MB and was refused")
                if remote.aborted:
                    what = {"timeout": f"timed out after {timeout:g} s", "hung": "hung",
                            "dead": "killed the kernel"}[remote.aborted]
                    note(f"{q}: tests {what}; 0 points")
                    if remote.aborted in ("dead", "hung"):
                        kernel.kill()
                        kernel = None
                    continue
                grade.scores[q] = question_score(tf, src)
                grade.results[q] = [(r.test_case.name, r.test_case.hidden, r.passed) for r in tf.test_case_results]
                failed = [r for r in tf.test_case_results if not r.passed]
                if failed:
                    nh = sum(1 for r in failed if r.test_case.hidden)
                    note(f"{q}: {len(failed)} of {len(tf.test_case_results)} tests failed ({nh} hidden)")
        except Exception as e:  # infrastructure failure: report, never crash the whole run
            note(f"grader error: {type(e).__name__}: {_short(e)}")
        finally:
            if kernel is not None:
                if pool is not None and kernel.km.is_alive():
                    pool["kernel"] = kernel
                else:
                    kernel.kill()
    return grade


def write_csv(grades: list[Grade], questions: list[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["file", *questions, "total", "possible", "percent", "notes"])
        for g in grades:
            w.writerow([g.file, *[f"{g.scores.get(q, 0.0):g}" for q in questions], f"{g.total:g}",
                        f"{g.total_possible:g}", f"{g.percent:.1f}", " | ".join(g.notes)])
    tmp.replace(out)


def grade_dir(submissions: Path, zip_path: Path, timeout: float, out: Path, jobs: int = 1) -> list[Grade]:
    tests = load_tests(zip_path)
    files = sorted(p for p in submissions.glob("*.ipynb") if not p.name.startswith("."))
    if not files:
        raise SystemExit(f"no *.ipynb in {submissions}")
    sandbox_argv(Path("/nonexistent"), ["true"], {})   # fail early when bwrap is missing
    with cf.ThreadPoolExecutor(max(1, jobs)) as ex:
        grades = list(ex.map(lambda p: grade_notebook(p, tests, timeout), files))
    survivors = reap_sandboxes()
    if survivors:
        raise SystemExit(f"submission processes {survivors} are still alive; not writing {out}")
    write_csv(grades, list(tests), out)
    return grades


# ============================================================================ prove


def wrong_answers(m: Master) -> dict[str, dict]:
    if not m.wrong_path.exists():
        return {}
    data = yaml.safe_load(m.wrong_path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{m.wrong_path.name}: expected a mapping of wrong-answer ids")
    return data


def make_variant(solution_nb: Path, info: MasterInfo, replace: dict[str, str], out: Path) -> None:
    nb = nbformat.read(str(solution_nb), as_version=4)
    for q, code in replace.items():
        ids = info.solution_cells.get(q)
        if not ids:
            raise ValueError(f"question {q!r} has no solution block in the master")
        positions = [i for i, c in enumerate(nb.cells) if c.get("id") in ids]
        if not positions:
            raise ValueError(f"cannot find the solution cell(s) of {q!r} in {solution_nb.name}")
        nb.cells[positions[0]].source = code.rstrip("\n")
        for i in reversed(positions[1:]):
            del nb.cells[i]
    nbformat.write(nb, str(out))


STUB = "stub"   # the reserved wrong-answer id of the stub (constants of the right shape, a wrong letter)
STUB_CONSTANTS = (0, 1, 0.5, -1)   # the values of STUB_CONSTANT in the stubs prove grades


def stub_variants(info: MasterInfo, stub: dict[str, str]) -> list[tuple[str, dict[str, str], object]]:
    """(label, replacements, expectation) of the stubs prove grades, each of which must score 0:

    - the set's ``stub`` entry once per value in STUB_CONSTANTS, with ``STUB_CONSTANT`` set to it
      (the stub's code builds its constant answers from it: zeros, ones, 0.5, -1), and each time
      another wrong letter for every multiple-choice question (all wrong letters get tried);
    - ``stub[input]``: every function a solution defines returns its first argument unchanged.
    """
    out = []
    for i, c in enumerate(STUB_CONSTANTS):
        rep = {}
        for q, code in stub.items():
            if q in info.choices:
                name, right = info.choices[q]
                wrong = [x for x in sorted(info.options.get(q) or "abcd") if x != right]
                rep[q] = f"{name} = {wrong[i % len(wrong)]!r}"
            else:
                rep[q] = f"STUB_CONSTANT = {c!r}\n{code}"
        out.append((f"stub[{c:g}]", rep, "stub"))
    echo = {q: "\n\n".join(f"def {f}(*args, **kwargs):\n    return args[0] if args else next(iter(kwargs.values()), None)"
                           for f in fns)
            for q, fns in info.functions.items() if fns and q not in info.choices}
    if echo:
        out.append(("stub[input]", echo, ("zero on", sorted(echo))))
    return out


def check_expectation(g: Grade, expect) -> list[str]:
    """Why grade ``g`` does not meet ``expect`` ('full', 'zero', 'stub' or ('between', questions))."""
    if expect == "full":
        return [] if abs(g.percent - 100.0) < 1e-9 else ["expected 100 %"]
    if expect == "zero":
        return [] if g.total == 0 else ["expected 0"]
    if expect == "stub":   # its public tests are checked over all constants (stub_public_failures)
        return [] if g.total == 0 else ["a stub must score 0"]
    if expect[0] == "zero on":
        scored = [q for q in expect[1] if g.scores.get(q, 0.0) != 0]
        return [f"scored on {', '.join(scored)}; expected 0 there"] if scored else []
    _, questions, zero = expect
    out = [] if 0.0 < g.percent < 100.0 else ["expected strictly between 0 and 100 %"]
    full = [q for q in questions if g.scores.get(q, 0.0) >= g.possible.get(q, 0.0)]
    if full:
        out.append(f"full marks on the question(s) it answers wrongly: {', '.join(full)}")
    scored = [q for q in questions if g.scores.get(q, 0.0) != 0]
    if zero and scored:
        out.append(f"expect: zero, but it scored on {', '.join(scored)}")
    return out


MAX_LETTER_SHARE = 0.4     # no letter may be the right one in more of the book's multiple-choice questions
MAX_LONGEST_SHARE = 0.4    # nor may the right option be the longest in more of them
MAX_LENGTH_RATIO = 1.25    # the right option is at most this much longer than the longest distractor


def choice_problems(infos: dict[str, MasterInfo], whole_book: bool) -> tuple[dict[str, list[str]], list[str], str]:
    """Multiple choice that cannot be guessed: per set, each letter is right at most ceil(n/4) times
    (n: the set's questions) and no right option is much longer than every distractor; over the whole
    book, no letter is right in more than MAX_LETTER_SHARE of the questions and the right option is the
    longest in at most MAX_LONGEST_SHARE. -> (problems per set, book problems, summary line)."""
    per_set: dict[str, list[str]] = {}
    letters: dict[str, int] = {}
    n = longest = 0
    for key, info in infos.items():
        out = per_set.setdefault(key, [])
        counts: dict[str, int] = {}
        for q, (_, right) in info.choices.items():
            opts = info.options.get(q) or {}
            others = [len(t) for letter, t in opts.items() if letter != right]
            if right not in opts or not others:
                continue
            n += 1
            letters[right] = letters.get(right, 0) + 1
            counts[right] = counts.get(right, 0) + 1
            longest += len(opts[right]) > max(others)
            if len(opts[right]) > MAX_LENGTH_RATIO * max(others):
                out.append(f"multiple choice {q}: the right option ({len(opts[right])} characters) is much longer "
                           f"than every other (at most {max(others)}); write distractors as long and as precise")
        cap = -(-len(info.choices) // 4)
        for letter, c in sorted(counts.items()):
            if c > cap:
                out.append(f"multiple choice: {letter!r} is the right letter of {c} of the set's "
                           f"{len(info.choices)} questions; spread the right letters")
    book = []
    if whole_book and n:
        for letter, c in sorted(letters.items()):
            if c > MAX_LETTER_SHARE * n:
                book.append(f"multiple choice: {letter!r} is right in {c} of the book's {n} questions "
                            f"(more than {MAX_LETTER_SHARE:.0%})")
        if longest > MAX_LONGEST_SHARE * n:
            book.append(f"multiple choice: the right option is the longest in {longest} of {n} questions "
                        f"(more than {MAX_LONGEST_SHARE:.0%})")
    summary = (f"multiple choice: {n} question(s), right letters "
               + " ".join(f"{k}={v}" for k, v in sorted(letters.items()))
               + f", the right option the longest in {longest}")
    return per_set, book, summary


def stub_public_failures(grades: list[Grade]) -> list[str]:
    """The public tests that no stub passes (each must pass for at least one STUB_CONSTANT: a stub
    that passes them and scores 0 shows they carry no points)."""
    failing = None
    for g in grades:
        failed = {f"{q}:{name}" for q, res in g.results.items() for name, hidden, passed in res
                  if not hidden and not passed} | {f"{q} (not run)" for q in set(g.scores) - set(g.results)}
        failing = failed if failing is None else failing & failed
    return sorted(failing or ())


def prove(dist: Path = DIST, only: list[str] | None = None, timeout: float = 60.0, jobs: int = 2,
          do_build: bool = True, root: Path = EXERCISES) -> int:
    t0 = time.time()
    masters = build(dist, only, root=root) if do_build else discover(root, only=only)
    if not masters:
        print("no exercise masters found")
        return 0
    failures: dict[str, list[str]] = {m.key: [] for m in masters}
    jobs_list = []   # (master, variant label, notebook path, expectation)
    tmp = Path(tempfile.mkdtemp(prefix="prove-"))
    tests_by = {}
    infos: dict[str, MasterInfo] = {}
    for m in masters:
        fail = failures[m.key].append
        try:
            info = infos[m.key] = parse_master(m.path)
        except Exception as e:
            fail(f"cannot parse the master: {type(e).__name__}: {e}")
            continue
        for p in info.problems:
            fail(p)
        tests_cfg = (info.config or {}).get("tests") or {}
        if tests_cfg.get("ok_format", True) is not False:
            fail("assignment config must set tests: ok_format: false (exception-based tests)")
        if not info.questions:
            fail("no questions")
        for q in info.questions:
            if info.hidden_tests.get(q, 0) < 1:
                fail(f"question {q} has no hidden test")
            if not info.solution_cells.get(q):
                fail(f"question {q} has no raw '# BEGIN SOLUTION' block")
        if not m.student_nb(dist).exists() or not m.zip_path(dist).exists():
            fail("build outputs missing (run build)")
            continue
        for leak in find_leaks(m.student_nb(dist), info):
            fail(leak)
        try:
            tests = load_tests(m.zip_path(dist))
        except SystemExit as e:
            fail(str(e))
            continue
        tests_by[m.key] = tests
        for q, src in tests.items():
            cases = test_file(q, src).test_cases
            if not any(tc.hidden for tc in cases):
                fail(f"question {q} has no hidden test in the autograder zip")
            if points_list(src) is not None and any(tc.points for tc in cases if not tc.hidden):
                fail(f"question {q}: its points list gives points to a public test (public tests carry none)")
        missing = set(info.questions) - set(tests)
        if missing:
            fail(f"questions without tests in the autograder zip: {sorted(missing)}")
        jobs_list.append((m, "solution", m.solution_nb(dist), "full"))
        jobs_list.append((m, "blank", m.student_nb(dist), "zero"))
        try:
            wrongs = wrong_answers(m)
        except Exception as e:
            fail(f"{m.wrong_path.name}: {e}")
            wrongs = {}
        if not wrongs:
            fail(f"no wrong answers: add {m.wrong_path.name}")
        elif STUB not in wrongs:
            fail(f"{m.wrong_path.name}: no '{STUB}' entry (a stub answer for every question that passes the "
                 "public tests and must score 0)")
        else:
            stub_qs = set(((wrongs[STUB] or {}).get("replace") or {}))
            if stub_qs != set(info.questions):
                fail(f"{STUB}: must replace every question; missing {sorted(set(info.questions) - stub_qs)}")
        covered = {q for wid, spec in wrongs.items()
                   if wid != STUB and isinstance(spec, dict) and spec.get("expect") != "full"
                   for q in (spec.get("replace") or {})}
        for q in info.questions:
            if wrongs and q not in covered:
                fail(f"question {q} has no recorded wrong answer in {m.wrong_path.name}")
        for wid, spec in wrongs.items():
            rep = (spec or {}).get("replace") if isinstance(spec, dict) else None
            if not isinstance(rep, dict) or not rep:
                fail(f"wrong answer {wid}: needs a 'replace' mapping question -> code")
                continue
            unknown = set(rep) - set(info.questions)
            if unknown:
                fail(f"wrong answer {wid}: unknown question(s) {sorted(unknown)}")
                continue
            if wid == STUB:
                variants = stub_variants(info, rep)
            elif spec.get("expect") == "full":   # a correct answer written differently
                variants = [(f"right:{wid}", rep, "full")]
            else:
                variants = [(f"wrong:{wid}", rep, ("between", sorted(rep), spec.get("expect") == "zero"))]
            for n, (label, replace, expect) in enumerate(variants):
                out = tmp / f"{m.chapter}__{m.name}__{wid}__{n}.ipynb"
                try:
                    make_variant(m.solution_nb(dist), info, replace, out)
                except Exception as e:
                    fail(f"{label}: {e}")
                    continue
                jobs_list.append((m, label, out, expect))

    def run_chunk(chunk):
        # our own notebooks are trusted: one kernel per worker, reset between notebooks
        pool: dict = {}
        try:
            return [(job, grade_notebook(job[2], tests_by[job[0].key], timeout, label=job[1], pool=pool))
                    for job in chunk]
        finally:
            if pool.get("kernel") is not None:
                pool["kernel"].kill()
            if pool.get("box"):
                shutil.rmtree(pool["box"], ignore_errors=True)

    n = max(1, min(jobs, len(jobs_list)))
    chunks = [jobs_list[i::n] for i in range(n)]
    results: dict[str, list] = {m.key: [] for m in masters}
    with cf.ThreadPoolExecutor(n) as ex:
        done = [r for chunk in ex.map(run_chunk, chunks) for r in chunk]
    order = {id(job): i for i, job in enumerate(jobs_list)}
    done.sort(key=lambda r: order[id(r[0])])
    for (m, label, path, expect), g in done:
        results[m.key].append((label, g))
        for problem in check_expectation(g, expect):
            failures[m.key].append(f"{label}: {problem}; scored {g.total:g}/{g.total_possible:g} "
                                   f"({g.percent:.1f} %); notes: {' | '.join(g.notes) or '-'}")
    for m in masters:
        stubs = [g for (mm, label, _, expect), g in done if mm is m and expect == "stub"]
        never = stub_public_failures(stubs) if stubs else []
        if never:
            failures[m.key].append("the stub must pass every public test for some STUB_CONSTANT (it shows they "
                                   "carry no points); no constant passes: " + ", ".join(never))
    shutil.rmtree(tmp, ignore_errors=True)
    per_set, book, choice_summary = choice_problems(infos, whole_book=only is None)
    for key, problems in per_set.items():
        failures[key] += problems

    print(f"\n{'exercise':40s} {'result':6s} details")
    for m in masters:
        parts = [f"{label}={g.percent:.0f}%" for label, g in results[m.key]]
        status = "FAIL" if failures[m.key] else "ok"
        print(f"{m.key:40s} {status:6s} {' '.join(parts)}")
        for f in failures[m.key]:
            print(f"    - {f}")
    nfail = sum(1 for v in failures.values() if v)
    print(f"\n{choice_summary}" + ("" if only is None else " (the book's balance is checked when proving all sets)"))
    for problem in book:
        print(f"    - {problem}")
    print(f"{len(masters)} exercise set(s), {nfail} failing, {time.time() - t0:.0f} s")
    return 1 if nfail or book else 0


# ============================================================================ CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="otter assign every master into the dist folder")
    b.add_argument("--out", type=Path, default=DIST)
    b.add_argument("--only", action="append", help="CHAPTER/NAME (repeatable)")
    p = sub.add_parser("prove", help="check every exercise set (the CI proof)")
    p.add_argument("--out", type=Path, default=DIST)
    p.add_argument("--only", action="append", help="CHAPTER/NAME (repeatable)")
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0, help="per cell / per question, seconds")
    p.add_argument("--jobs", type=int, default=2, help="notebooks graded in parallel")
    g = sub.add_parser("grade", help="grade a folder of submissions (no Docker)")
    g.add_argument("submissions", type=Path)
    g.add_argument("--autograder", type=Path, required=True, help="the <name>-autograder.zip")
    g.add_argument("--timeout", type=float, default=60.0, help="per cell / per question, seconds")
    g.add_argument("--out", type=Path, default=Path("grades.csv"))
    g.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        masters = build(a.out, a.only, quiet=False)
        print(f"{len(masters)} exercise set(s) built")
        return 0
    if a.cmd == "prove":
        return prove(a.out, a.only, a.timeout, a.jobs, do_build=not a.no_build)
    grades = grade_dir(a.submissions, a.autograder, a.timeout, a.out, a.jobs)
    for gr in grades:
        print(f"{gr.file:40s} {gr.total:g}/{gr.total_possible:g} ({gr.percent:.1f} %)"
              + (f"  [{' | '.join(gr.notes)}]" if gr.notes else ""))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
