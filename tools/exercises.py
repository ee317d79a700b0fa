#!/usr/bin/env python
"""Build, prove and grade the course's otter-grader exercises (see exercises/README.md).

    python tools/exercises.py build [--out exercises/_dist] [--only CHAPTER/NAME]
    python tools/exercises.py prove [--no-build] [--only CHAPTER/NAME] [--timeout S] [--jobs N]
    python tools/exercises.py grade SUBMISSIONS_DIR --autograder ZIP [--timeout S] [--out grades.csv]

No Docker, no PDFs, no network. Grading drives a Jupyter kernel cell by cell (per-cell time limit,
interrupt then kill, replay without a cell that killed the kernel) and runs each question's
otter test file (``otter.test_files``) in its own execution, so one broken question costs only
its own points.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import csv
import dataclasses
import io
import json
import os
import queue
import re
import secrets
import shutil
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
    return MasterInfo(config, questions, sol_cells, hidden, secrets_out, problems)


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


# ============================================================================ the kernel


@dataclasses.dataclass
class ExecResult:
    status: str            # ok | error | timeout (interrupted) | hung (interrupt failed) | dead
    stdout: str = ""
    ename: str = ""
    evalue: str = ""


class Kernel:
    """A Python kernel (the interpreter running this script) driven one execution at a time."""

    MAX_STDOUT = 2_000_000   # characters of stdout kept per execution (a printing loop cannot eat memory)

    def __init__(self, cwd: Path, startup_timeout: float = 120):
        from jupyter_client.manager import KernelManager

        env = os.environ.copy()
        env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), MPLBACKEND="Agg",
                   PYDEVD_DISABLE_FILE_VALIDATION="1", PYTHONDONTWRITEBYTECODE="1")
        self._tmp = Path(tempfile.mkdtemp(prefix="kernel-"))
        self.km = KernelManager(kernel_name="python3", transport="ipc",
                                connection_file=str(self._tmp / "kernel.json"))
        self.km.ip = str(self._tmp / "ipc")
        argv = self.km.kernel_spec.argv
        if "ipykernel_launcher" in " ".join(argv):  # run the kernel with this interpreter (the venv)
            argv[0] = sys.executable
        self.km.start_kernel(cwd=str(cwd), env=env, extra_arguments=["--HistoryManager.enabled=False"])
        self.kc = self.km.client()
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
                out.append(c.get("text", "")[-self.MAX_STDOUT:])
                size += len(out[-1])
                while size > self.MAX_STDOUT and len(out) > 1:   # keep the tail only
                    size -= len(out.pop(0))
            elif t == "error":
                res.status, res.ename, res.evalue = "error", c.get("ename", ""), c.get("evalue", "")
            elif t == "status" and c.get("execution_state") == "idle":
                break
        if interrupted and res.status in ("ok", "error"):
            res.status = "timeout"
        res.stdout = "".join(out)
        return res

    def kill(self):
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        with contextlib.suppress(Exception):
            self.km.shutdown_kernel(now=True)
        shutil.rmtree(self._tmp, ignore_errors=True)


# Runs in the kernel before any submission code (so it is trusted): registers a test runner under a
# random name. Its globals are a private dict, not the notebook's, so names the submission defines
# (grader, test_case, json, dict, ...) cannot reach it; it snapshots builtins, torch, numpy and
# otter's test classes to detect monkeypatching.
_SETUP = r'''
def _setup(runner_name, ns, workdir):
    import builtins, importlib, importlib.util, json, os, sys, types
    os.chdir(workdir)
    if "otter" not in sys.modules:
        # import otter.test_files without otter/__init__ (which pulls in pandas, nbconvert, ...: 3 s);
        # the test-file code itself is otter's, unchanged
        spec = importlib.util.find_spec("otter")
        pkg = types.ModuleType("otter")
        pkg.__path__, pkg.__file__ = list(spec.submodule_search_locations), spec.origin
        sys.modules["otter"] = pkg
    write = sys.stdout.write
    flush = sys.stdout.flush
    names = ["math", "torch", "torch.nn", "torch.nn.functional", "torch.testing", "numpy",
             "otter.test_files", "otter.test_files.exception_test", "otter.test_files.abstract_test"]
    mods = {}
    for n in names:
        try:
            mods[n] = importlib.import_module(n)
        except Exception:
            pass
    from otter.test_files.exception_test import ExceptionTestFile, test_case
    from otter.test_files.abstract_test import TestFile
    watched = [("builtins", builtins)] + list(mods.items())
    classes = [("ExceptionTestFile", ExceptionTestFile), ("test_case", test_case), ("TestFile", TestFile)]
    if "torch" in mods:
        classes.append(("torch.Tensor", mods["torch"].Tensor))
    if "numpy" in mods:
        classes.append(("numpy.ndarray", mods["numpy"].ndarray))
    skip = {"_", "__", "___", "input", "raw_input", "getpass"}

    def snapshot():
        snap = {}
        for label, m in watched:
            snap["sys.modules[%r]" % label] = sys.modules.get(label)
            for k, v in list(vars(m).items()):
                if k not in skip:
                    snap[label + "." + k] = v
        for label, c in classes:
            for k, v in list(vars(c).items()):
                snap[label + "." + k] = v
        return snap

    base = snapshot()

    def run(qname, src, nonce):
        env = dict(ns)
        tf = ExceptionTestFile.from_string(src, path="tests/%s.py" % qname)
        tf.run(env)
        results = [[r.test_case.name, bool(r.passed), str(r.message)[:1500]] for r in tf.test_case_results]
        now = snapshot()
        tampered = sorted(k for k, v in base.items() if now.get(k, v) is not v)
        write("\n" + nonce + json.dumps({"results": results, "tampered": tampered[:20]}) + "\n")
        flush()

    ns[runner_name] = run

_setup(RUNNER_NAME, NS, WORKDIR)
'''


def _setup_cell(runner: str, workdir: Path) -> str:
    """The kernel code that installs the runner; executed in a private namespace."""
    src = _SETUP.replace("RUNNER_NAME", repr(runner)).replace("WORKDIR", repr(str(workdir)))
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


# ============================================================================ grading


@dataclasses.dataclass
class Grade:
    file: str
    scores: dict[str, float]
    possible: dict[str, float]
    notes: list[str]

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


def grade_notebook(nb_path: Path, tests: dict[str, str], timeout: float = 60.0,
                   label: str | None = None, pool: dict | None = None) -> Grade:
    """Grade one notebook; every question's score is isolated from the others' failures.

    ``pool``: a dict holding a kernel to reuse (``pool["kernel"]``) and to hand back afterwards.
    Only for trusted notebooks (``prove``): a reused kernel keeps imported modules.
    """
    from otter.test_files.abstract_test import TestCaseResult

    trusted = {q: test_file(q, src) for q, src in tests.items()}
    possible = {q: float(tf.possible) for q, tf in trusted.items()}
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

    with tempfile.TemporaryDirectory(prefix="grade-") as work:
        workdir = Path(work)
        shutil.copy(nb_path, workdir / nb_path.name)
        runner = "_grader_" + secrets.token_hex(8)
        skip: set[int] = set()
        setup_timeout = max(120.0, timeout)

        def boot() -> Kernel:
            for _ in range(len(cells) + 2):
                k = None
                if pool is not None and pool.get("kernel") is not None:
                    k = pool.pop("kernel")
                    if k.execute("get_ipython().reset(new_session=False)", 60).status != "ok":
                        k.kill()
                        k = None
                if k is None:
                    k = Kernel(workdir)
                r = k.execute(_setup_cell(runner, workdir), setup_timeout)
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
                nonce = "@@GRADE-" + secrets.token_hex(12) + "@@"
                r = kernel.execute(f"{runner}({q!r}, {src!r}, {nonce!r})", timeout)
                if r.status in ("dead", "hung"):
                    note(f"{q}: tests " + ("killed the kernel" if r.status == "dead" else "hung") + "; 0 points")
                    kernel.kill()
                    kernel = None
                    continue
                if r.status == "timeout":
                    note(f"{q}: tests timed out after {timeout:g} s; 0 points")
                    continue
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith(nonce)]
                if r.status != "ok" or not lines:
                    note(f"{q}: tests could not run ({r.ename}: {_short(r.evalue)}); 0 points")
                    continue
                payload = json.loads(lines[-1][len(nonce):])
                if payload["tampered"]:
                    note(f"{q}: grading environment modified ({', '.join(payload['tampered'][:5])}); 0 points")
                    continue
                tf = trusted[q]
                got = payload["results"]
                if [g[0] for g in got] != [tc.name for tc in tf.test_cases]:
                    note(f"{q}: unexpected test results; 0 points")
                    continue
                tf.test_case_results = [TestCaseResult(test_case=tc, message=g[2], passed=bool(g[1]))
                                        for tc, g in zip(tf.test_cases, got)]
                grade.scores[q] = float(tf.score)
                failed = [g[0] for g, tc in zip(got, tf.test_cases) if not g[1]]
                if failed:
                    nh = sum(1 for g, tc in zip(got, tf.test_cases) if not g[1] and tc.hidden)
                    note(f"{q}: {len(failed)} of {len(got)} tests failed ({nh} hidden)")
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
    with cf.ThreadPoolExecutor(max(1, jobs)) as ex:
        grades = list(ex.map(lambda p: grade_notebook(p, tests, timeout), files))
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
    for m in masters:
        fail = failures[m.key].append
        try:
            info = parse_master(m.path)
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
            if not any(tc.hidden for tc in test_file(q, src).test_cases):
                fail(f"question {q} has no hidden test in the autograder zip")
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
        for wid, spec in wrongs.items():
            rep = (spec or {}).get("replace") if isinstance(spec, dict) else None
            if not isinstance(rep, dict) or not rep:
                fail(f"wrong answer {wid}: needs a 'replace' mapping question -> code")
                continue
            unknown = set(rep) - set(info.questions)
            if unknown:
                fail(f"wrong answer {wid}: unknown question(s) {sorted(unknown)}")
                continue
            out = tmp / f"{m.chapter}__{m.name}__{wid}.ipynb"
            try:
                make_variant(m.solution_nb(dist), info, rep, out)
            except Exception as e:
                fail(f"wrong answer {wid}: {e}")
                continue
            jobs_list.append((m, f"wrong:{wid}", out, "between"))

    def run_chunk(chunk):
        # our own notebooks are trusted: one kernel per worker, reset between notebooks
        pool: dict = {}
        try:
            return [(job, grade_notebook(job[2], tests_by[job[0].key], timeout, label=job[1], pool=pool))
                    for job in chunk]
        finally:
            if pool.get("kernel") is not None:
                pool["kernel"].kill()

    n = max(1, min(jobs, len(jobs_list)))
    chunks = [jobs_list[i::n] for i in range(n)]
    results: dict[str, list] = {m.key: [] for m in masters}
    with cf.ThreadPoolExecutor(n) as ex:
        done = [r for chunk in ex.map(run_chunk, chunks) for r in chunk]
    order = {id(job): i for i, job in enumerate(jobs_list)}
    done.sort(key=lambda r: order[id(r[0])])
    for (m, label, path, expect), g in done:
        if True:
            results[m.key].append((label, g))
            pct = g.percent
            ok = {"full": abs(pct - 100.0) < 1e-9, "zero": g.total == 0,
                  "between": 0.0 < pct < 100.0}[expect]
            if not ok:
                want = {"full": "100 %", "zero": "0", "between": "strictly between 0 and 100 %"}[expect]
                failures[m.key].append(f"{label} scored {g.total:g}/{g.total_possible:g} ({pct:.1f} %), "
                                       f"expected {want}; notes: {' | '.join(g.notes) or '-'}")
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n{'exercise':40s} {'result':6s} details")
    for m in masters:
        parts = [f"{label}={g.percent:.0f}%" for label, g in results[m.key]]
        status = "FAIL" if failures[m.key] else "ok"
        print(f"{m.key:40s} {status:6s} {' '.join(parts)}")
        for f in failures[m.key]:
            print(f"    - {f}")
    nfail = sum(1 for v in failures.values() if v)
    print(f"\n{len(masters)} exercise set(s), {nfail} failing, {time.time() - t0:.0f} s")
    return 1 if nfail else 0


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
