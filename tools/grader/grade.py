"""Grading notebooks: every question's otter test file runs in the grader, against the notebook
in its sandbox."""
from __future__ import annotations

import ast
import concurrent.futures as cf
import contextlib
import csv
import dataclasses
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import nbformat

from .masters import load_tests, test_file
from .sandbox import reap_sandboxes, sandbox_argv
from .kernel import Kernel, _sanitize, _setup_cell
from .remote import QuestionAborted, Remote, StudentNamespace, _short
from .wire import MAX_ANSWER


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


# Test files are read, run and scored one at a time: they share this process's global state (torch's
# default dtype, transformers' patched initialisers, otter's output capture), and two test files of a
# BERT set run at once in two threads made a correct solution fail (prove --jobs 2). Reading a points
# list (ast.parse) while a test parsed a notebook cell in another thread failed with CPython 3.11's
# "SystemError: AST constructor recursion depth mismatch": ast.parse is not thread-safe there.
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
    with _TESTS_LOCK:   # see _TESTS_LOCK
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
    else:   # trusted notebooks: the pooled kernel keeps its box (one per pool; its owner removes it)
        if "box" not in pool:
            pool["box"] = tempfile.mkdtemp(prefix="grade-pool-")
        box_ctx = contextlib.nullcontext(str(pool["box"]))
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
                remote = Remote(kernel, runner, timeout, time.monotonic() + timeout)
                with _TESTS_LOCK:   # see _TESTS_LOCK
                    tf = test_file(q, src)     # a fresh parse: the test code runs here, in the grader
                    try:
                        tf.run(StudentNamespace(remote, cells))
                    except QuestionAborted:
                        pass
                    score = question_score(tf, src)
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
                grade.scores[q] = score
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


#: what makes a spreadsheet read a cell as a formula (OWASP's list for CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that would start a formula (a submission named
    ``=1+1,forged.ipynb``, a note quoting a learner's error) gets a leading apostrophe."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_csv(grades: list[Grade], questions: list[str], out: Path) -> None:
    """The grades, one row per submission; every text cell (file names, question names, notes) is
    kept from reading as a formula (:func:`spreadsheet_text`), the numbers are written as numbers."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["file", *map(spreadsheet_text, questions), "total", "possible", "percent", "notes"])
        for g in grades:
            w.writerow([spreadsheet_text(g.file), *[f"{g.scores.get(q, 0.0):g}" for q in questions], f"{g.total:g}",
                        f"{g.total_possible:g}", f"{g.percent:.1f}", spreadsheet_text(" | ".join(g.notes))])
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
